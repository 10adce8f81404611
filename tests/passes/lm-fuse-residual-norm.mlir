// RUN: lmcc-opt %s --lm-fuse-residual-norm | FileCheck %s
// RUN: lmcc emit-mlir %models/bilm_base.toml | lmcc-opt --lm-fuse-residual-norm | FileCheck %s --check-prefix=MODEL
// lm-fuse-residual-norm: layer_norm(add(x, r)) ==> add_layer_norm(x, r) when the sum has no other use (post-norm);
// a sum that something else reads (pre-norm's residual stream) and training entry points stay as they are.

// CHECK-LABEL: func.func @post_norm
// CHECK-SAME: ([[X:%[^:]+]]: tensor<?x?x8xf32>, [[R:%[^:]+]]: tensor<?x?x8xf32>)
// CHECK-DAG: [[G:%.+]] = lm.weight "layers.0.attn_norm.weight" : tensor<8xf32>
// CHECK-DAG: [[B:%.+]] = lm.weight "layers.0.attn_norm.bias" : tensor<8xf32>
// CHECK-NOT: lm.add
// CHECK: [[Y:%.+]] = lm.add_layer_norm [[X]], [[R]], [[G]], [[B]] {epsilon = 1.000000e-05 : f64} : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
// CHECK-NOT: lm.layer_norm
// CHECK: return [[Y]]
func.func @post_norm(%x: tensor<?x?x8xf32>, %r: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %g = lm.weight "layers.0.attn_norm.weight" : tensor<8xf32>
  %b = lm.weight "layers.0.attn_norm.bias" : tensor<8xf32>
  %s = lm.add %x, %r : tensor<?x?x8xf32>
  %y = lm.layer_norm %s, %g, %b {epsilon = 1.0e-5 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return %y : tensor<?x?x8xf32>
}

// The sum is read again (pre-norm: the next residual): not fused.
// CHECK-LABEL: func.func @sum_used_twice
// CHECK: [[S:%.+]] = lm.add
// CHECK: lm.layer_norm [[S]]
// CHECK-NOT: lm.add_layer_norm
// CHECK: lm.add [[S]]
func.func @sum_used_twice(%x: tensor<?x?x8xf32>, %r: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %g = lm.weight "final_norm.weight" : tensor<8xf32>
  %b = lm.weight "final_norm.bias" : tensor<8xf32>
  %s = lm.add %x, %r : tensor<?x?x8xf32>
  %y = lm.layer_norm %s, %g, %b {epsilon = 1.0e-5 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  %z = lm.add %s, %y : tensor<?x?x8xf32>
  return %z : tensor<?x?x8xf32>
}

// A norm of something else than a sum: unchanged.
// CHECK-LABEL: func.func @plain_norm
// CHECK: lm.layer_norm
// CHECK-NOT: lm.add_layer_norm
func.func @plain_norm(%x: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %g = lm.weight "embed.norm.weight" : tensor<8xf32>
  %b = lm.weight "embed.norm.bias" : tensor<8xf32>
  %y = lm.layer_norm %x, %g, %b {epsilon = 1.0e-5 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return %y : tensor<?x?x8xf32>
}

// A training entry point (lm.method "loss"): left for lm-autodiff, whose LayerNorm backward reads the sum.
// CHECK-LABEL: func.func @loss
// CHECK: lm.add
// CHECK: lm.layer_norm
// CHECK-NOT: lm.add_layer_norm
func.func @loss(%x: tensor<?x?x8xf32>, %r: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> attributes {lm.method = "loss"} {
  %g = lm.weight "layers.0.ffn_norm.weight" : tensor<8xf32>
  %b = lm.weight "layers.0.ffn_norm.bias" : tensor<8xf32>
  %s = lm.add %x, %r : tensor<?x?x8xf32>
  %y = lm.layer_norm %s, %g, %b {epsilon = 1.0e-5 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  return %y : tensor<?x?x8xf32>
}

// The bundled biLM (post-norm): every sum feeds a norm alone (token + position into the embedding norm, both
// residuals of every layer), so no lm.add is left.
// MODEL-LABEL: func.func @score
// MODEL-NOT: = lm.add %
// MODEL: lm.add_layer_norm
// MODEL-NOT: = lm.add %
// MODEL: lm.add_layer_norm
// MODEL-NOT: = lm.add %
// MODEL: return
