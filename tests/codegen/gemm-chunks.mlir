// RUN: lmcc-opt --lm-to-loops="vector-bits=512" %s | FileCheck %s
// An fp32 depth over 768 runs in chunks of 128 k rows, so that a chunk of a column slice (128 x 32 floats) stays in
// L1 while the block's tiles pass over it: the first chunk of a tile starts from zero, the others from the partial
// sums the previous chunk left in a [block rows, 32] buffer; the last chunk writes C (bias, masked stores), the others
// store their sums back. A depth of 768 or less (the 8 x 600 below) runs in one pass without the buffer; over 512,
// in blocks of 256 KB of A (108 rows of 600), or one block when all of A fits in 512 KB (216 rows: a select on
// M x 600 <= 131072 floats).

// CHECK-LABEL: func.func private @lm_gemm_600x900_bias_12x32
// CHECK: %[[PARTIAL:.+]] = memref.alloca() : memref<{{[0-9]+}}x32xf32>
// CHECK: scf.for %[[K:arg[0-9]+]] = %{{.*}} to %{{.*}} step %c128
// CHECK: %[[END:.+]] = arith.minsi %{{.*}}, %c900
// CHECK: %[[LAST:.+]] = arith.cmpi eq, %[[END]], %c900
// CHECK: %[[FIRST:.+]] = arith.cmpi eq, %[[K]], %c0
// CHECK: scf.if %[[FIRST]] -> (vector<16xf32>
// CHECK: } else {
// CHECK: vector.load %[[PARTIAL]]
// CHECK: scf.for %{{.*}} = %[[K]] to %[[END]] step
// CHECK: vector.fma
// CHECK: scf.if %[[LAST]] {
// CHECK: vector.maskedstore
// CHECK: } else {
// CHECK: vector.store %{{.*}}, %[[PARTIAL]]
// CHECK-LABEL: func.func private @lm_gemm_8x600_12x32
// CHECK-NOT: memref.alloca
// CHECK: %[[AF:.+]] = arith.muli %dim{{.*}}, %c600
// CHECK: %[[FITS:.+]] = arith.cmpi ule, %[[AF]], %c131072
// CHECK: arith.select %[[FITS]], %c216, %c108
// CHECK-NOT: step %c128
// CHECK: return
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 900, heads = 2, d_ff = 600,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x900xf32>
    %x = lm.embed %E[%ids] : (tensor<11x900xf32>, tensor<?x?xi32>) -> tensor<?x?x900xf32>
    %W = lm.weight "layers.0.ffn.in.weight" : tensor<600x900xf32>
    %b = lm.weight "layers.0.ffn.in.bias" : tensor<600xf32>
    %y = lm.linear %x, %W, %b : (tensor<?x?x900xf32>, tensor<600x900xf32>, tensor<600xf32>) -> tensor<?x?x600xf32>
    %V = lm.weight "layers.0.ffn.out.weight" : tensor<8x600xf32>
    %z = lm.linear %y, %V : (tensor<?x?x600xf32>, tensor<8x600xf32>) -> tensor<?x?x8xf32>
    %e = lm.mean_pool %z, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
    return %e : tensor<?x8xf32>
  }
}
