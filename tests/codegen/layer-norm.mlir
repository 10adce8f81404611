// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s
// lm.layer_norm over 40 features: the mean's and the variance's sums in 16 double lanes over features 0..31
// (16 independent chains), the lanes added in order, then features 32..39 one by one; normalized in double.

// CHECK-LABEL: func.func @m_embed_kernel
// CHECK: func.call @lm_rows_layernorm_3D719799812DEA11_c40
// The row task over memref<?x40xf32> rows:
// CHECK-LABEL: func.func private @lm_rows_layernorm_3D719799812DEA11_c40
// the mean
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c32{{.*}} step %c16{{.*}} iter_args(%{{.*}} = %cst{{.*}}) -> (vector<16xf64>)
// CHECK: vector.load {{.*}} : memref<?x40xf32>, vector<16xf32>
// CHECK: arith.extf {{.*}} : vector<16xf32> to vector<16xf64>
// CHECK: arith.addf {{.*}} : vector<16xf64>
// CHECK: vector.reduction <add>, {{.*}} : vector<16xf64> into f64
// CHECK: scf.for %{{.*}} = %c32{{.*}} to %c40{{.*}} step %c1{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (f64)
// CHECK: arith.divf
// the variance: (x - mean)^2 in the lanes, then the tail
// CHECK: vector.broadcast {{.*}} : f64 to vector<16xf64>
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c32{{.*}} step %c16{{.*}} iter_args(%{{.*}} = %cst{{.*}}) -> (vector<16xf64>)
// CHECK: arith.subf {{.*}} : vector<16xf64>
// CHECK: arith.mulf {{.*}} : vector<16xf64>
// CHECK: vector.reduction <add>, {{.*}} : vector<16xf64> into f64
// CHECK: scf.for %{{.*}} = %c32{{.*}} to %c40{{.*}} step %c1{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (f64)
// CHECK: math.sqrt {{.*}} : f64
// CHECK-NOT: lm.layer_norm
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 40, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x40xf32> {
    %E = lm.weight "embed.token" : tensor<11x40xf32>
    %g = lm.weight "embed.norm.weight" : tensor<40xf32>
    %b = lm.weight "embed.norm.bias" : tensor<40xf32>
    %x = lm.embed %E[%ids] : (tensor<11x40xf32>, tensor<?x?xi32>) -> tensor<?x?x40xf32>
    %n = lm.layer_norm %x, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x40xf32>, tensor<40xf32>, tensor<40xf32>) -> tensor<?x?x40xf32>
    %e = lm.mean_pool %n, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x40xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x40xf32>
    return %e : tensor<?x40xf32>
  }
}
