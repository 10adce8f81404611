// RUN: lmcc-opt %s --lm-fuse-activation | FileCheck %s
// RUN: lmcc emit-mlir %models/tta_base.toml | lmcc-opt --lm-fuse-activation | FileCheck %s --check-prefix=MODEL
// RUN: lmcc emit-mlir %models/tta_base.toml | lmcc-opt --lm-fuse-activation --lm-to-loops=vector-bits=256 \
// RUN:   | FileCheck %s --check-prefix=LOOPS --implicit-check-not=lm_rows_gelu
// RUN: lmcc emit-mlir %models/tta_base.toml | lmcc-opt --lm-fuse-activation --lm-to-loops=gemm=eigen \
// RUN:   | FileCheck %s --check-prefix=EIGEN
// lm-fuse-activation: gelu / gelu {approximate} / relu of a single-use lm.linear becomes
// lm.linear {activation = "gelu" | "gelu_tanh" | "relu"}. d_model 8, d_ff 12.

// CHECK-LABEL: func.func @ffn
// CHECK-SAME: ([[X:%[^:]+]]: tensor<?x?x8xf32>)
// CHECK: [[U:%.+]] = lm.linear [[X]], {{%.+}}, {{%.+}} {activation = "gelu"} : (tensor<?x?x8xf32>, tensor<12x8xf32>, tensor<12xf32>) -> tensor<?x?x12xf32>
// CHECK-NOT: lm.gelu
// CHECK: lm.linear [[U]], {{%.+}}, {{%.+}} : (tensor<?x?x12xf32>, tensor<8x12xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
func.func @ffn(%x: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %w1 = lm.weight "ffn.in.weight" : tensor<12x8xf32>
  %b1 = lm.weight "ffn.in.bias" : tensor<12xf32>
  %w2 = lm.weight "ffn.out.weight" : tensor<8x12xf32>
  %b2 = lm.weight "ffn.out.bias" : tensor<8xf32>
  %h = lm.linear %x, %w1, %b1 : (tensor<?x?x8xf32>, tensor<12x8xf32>, tensor<12xf32>) -> tensor<?x?x12xf32>
  %a = lm.gelu %h : tensor<?x?x12xf32>
  %y = lm.linear %a, %w2, %b2 : (tensor<?x?x12xf32>, tensor<8x12xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return %y : tensor<?x?x8xf32>
}

// The tanh form and relu, without a bias.
// CHECK-LABEL: func.func @kinds
// CHECK: {activation = "gelu_tanh"}
// CHECK: {activation = "relu"}
// CHECK-NOT: lm.gelu
// CHECK-NOT: lm.relu
func.func @kinds(%x: tensor<?x?x8xf32>) -> (tensor<?x?x12xf32>, tensor<?x?x12xf32>) {
  %w = lm.weight "ffn.in.weight" : tensor<12x8xf32>
  %h = lm.linear %x, %w : (tensor<?x?x8xf32>, tensor<12x8xf32>) -> tensor<?x?x12xf32>
  %t = lm.gelu %h {approximate} : tensor<?x?x12xf32>
  %g = lm.linear %x, %w : (tensor<?x?x8xf32>, tensor<12x8xf32>) -> tensor<?x?x12xf32>
  %r = lm.relu %g : tensor<?x?x12xf32>
  return %t, %r : tensor<?x?x12xf32>, tensor<?x?x12xf32>
}

// The pre-activation has another use: nothing fuses.
// CHECK-LABEL: func.func @shared
// CHECK: [[H:%.+]] = lm.linear
// CHECK-NOT: activation
// CHECK: lm.gelu [[H]]
// CHECK: lm.add
func.func @shared(%x: tensor<?x?x8xf32>) -> tensor<?x?x12xf32> {
  %w = lm.weight "ffn.in.weight" : tensor<12x8xf32>
  %h = lm.linear %x, %w : (tensor<?x?x8xf32>, tensor<12x8xf32>) -> tensor<?x?x12xf32>
  %a = lm.gelu %h : tensor<?x?x12xf32>
  %s = lm.add %a, %h : tensor<?x?x12xf32>
  return %s : tensor<?x?x12xf32>
}

// The paper-size T-TA: each layer's FFN input projection carries its gelu; no lm.gelu is left.
// MODEL-COUNT-3: lm.linear {{.*}} {activation = "gelu"} : (tensor<?x?x512xf32>, tensor<2048x512xf32>, tensor<2048xf32>) -> tensor<?x?x2048xf32>
// MODEL-NOT: lm.gelu


// Lowered: the FFN input and head transform GEMMs carry the gelu as their epilogue (no activation row pass); with
// the Eigen product, a row pass in place over its output.
// LOOPS: func.func private @lm_gemm_2048x512_bias_6x16_gelu(
// LOOPS: math.absf {{.*}} : vector<8xf32>
// LOOPS: math.fma {{.*}} : vector<8xf32>
// LOOPS: vector.maskedstore
// LOOPS: func.func private @lm_gemm_task_2048x512_bias_6x16_gelu(
// EIGEN: call @lm_rt_sgemm_nt
// EIGEN: func.func private @lm_rows_inplace_gelu_c2048(
