// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=12" %s | FileCheck %s
// A packed weight over 1 MB (1024 x 512 floats) streams from memory: every k step of a tile prefetches into L2
// (locality 2, prefetcht1) the next 32-wide column slice (depth 512: one chunk; the region starts kEnd = 512 rows of
// 32 floats past the slice). A block of more than one tile spreads the region's span x 2 lines evenly over its T x span
// k steps: step kv of tile t takes line ((t * span - kBegin + kv) * ((2 << 16) / T)) >> 16. A block of one tile
// (T <= 1) takes both lines of row kv (from line 2t mod 2). The two ways have loops of their own, chosen per block
// (gemm-chunks.mlir: deeper weights prefetch the next chunk).
// Weights of 1 MB or less (the 8 x 1024 below) are not prefetched.

// CHECK-LABEL: func.func private @lm_gemm_1024x512_bias_12x32
// CHECK: %[[SLICEFLOATS:.+]] = arith.muli %c512, %c32
// CHECK: %[[LAST:.+]] = arith.subi %{{.*}}, %c1
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step
// CHECK: %[[T:.+]] = arith.divui %{{.*}}, %c12{{.*}}
// CHECK: %[[FEW:.+]] = arith.cmpi ule, %[[T]], %c1
// CHECK: %[[SLICE:.+]] = arith.muli %{{.*}}, %[[SLICEFLOATS]]
// CHECK: %[[SPAN:.+]] = arith.subi %c512, %[[KBEGIN:c0[_0-9]*]]
// CHECK: %[[ENDFLOATS:.+]] = arith.muli %c512, %c32
// CHECK: %[[REGION:.+]] = arith.addi %[[SLICE]], %[[ENDFLOATS]]
// CHECK: %[[SCALE:.+]] = arith.divui %c131072, %[[T]]
// CHECK: scf.for %[[TILE:arg[0-9]+]] = %{{.*}} to %[[T]]
// CHECK: %[[TWOT:.+]] = arith.muli %[[TILE]], %c2
// CHECK: %[[FEWLINE:.+]] = arith.remui %[[TWOT]], %c2
// CHECK: %[[FEWOFF:.+]] = arith.muli %[[FEWLINE]], %c16
// CHECK: %[[BEGINFLOATS:.+]] = arith.muli %[[KBEGIN]], %c32
// CHECK: %[[FEWBASE:.+]] = arith.subi %[[REGION]], %[[BEGINFLOATS]]
// CHECK: %[[FEWSTART:.+]] = arith.addi %[[FEWBASE]], %[[FEWOFF]]
// CHECK: %[[TSPAN:.+]] = arith.muli %[[TILE]], %[[SPAN]]
// CHECK: %[[ROW:.+]] = arith.subi %[[TSPAN]], %[[KBEGIN]]
// CHECK: scf.if %[[FEW]] {
// CHECK: scf.for %[[KV:arg[0-9]+]] =
// CHECK: %[[KW:.+]] = arith.muli %[[KV]], %c32
// CHECK: %[[AT:.+]] = arith.addi %[[FEWSTART]], %[[KW]]
// CHECK: %[[CLAMPED0:.+]] = arith.minsi %[[AT]], %[[LAST]]
// CHECK: memref.prefetch %{{.*}}[%[[CLAMPED0]]], read, locality<2>, data
// CHECK: %[[AT1:.+]] = arith.addi %[[AT]], %c16
// CHECK: %[[CLAMPED1:.+]] = arith.minsi %[[AT1]], %[[LAST]]
// CHECK: memref.prefetch %{{.*}}[%[[CLAMPED1]]], read, locality<2>, data
// CHECK-NOT: memref.prefetch
// CHECK: vector.fma
// CHECK: %[[X:.+]] = arith.addi %{{arg[0-9]+}}, %[[ROW]]
// CHECK: %[[FIXED:.+]] = arith.muli %[[X]], %[[SCALE]]
// CHECK: %[[LINE:.+]] = arith.shrui %[[FIXED]], %c16
// CHECK: %[[OFF:.+]] = arith.muli %[[LINE]], %c16
// CHECK: %[[SPREAD:.+]] = arith.addi %[[REGION]], %[[OFF]]
// CHECK: %[[CLAMPED2:.+]] = arith.minsi %[[SPREAD]], %[[LAST]]
// CHECK: memref.prefetch %{{.*}}[%[[CLAMPED2]]], read, locality<2>, data
// CHECK-NOT: memref.prefetch
// CHECK: vector.fma
// CHECK-LABEL: func.func private @lm_gemm_8x1024_12x32
// CHECK-NOT: memref.prefetch
// CHECK: return
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 512, heads = 2, d_ff = 1024,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x512xf32>
    %x = lm.embed %E[%ids] : (tensor<11x512xf32>, tensor<?x?xi32>) -> tensor<?x?x512xf32>
    %W = lm.weight "layers.0.ffn.in.weight" : tensor<1024x512xf32>
    %b = lm.weight "layers.0.ffn.in.bias" : tensor<1024xf32>
    %y = lm.linear %x, %W, %b : (tensor<?x?x512xf32>, tensor<1024x512xf32>, tensor<1024xf32>) -> tensor<?x?x1024xf32>
    %V = lm.weight "layers.0.ffn.out.weight" : tensor<8x1024xf32>
    %z = lm.linear %y, %V : (tensor<?x?x1024xf32>, tensor<8x1024xf32>) -> tensor<?x?x8xf32>
    %e = lm.mean_pool %z, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
    return %e : tensor<?x8xf32>
  }
}
