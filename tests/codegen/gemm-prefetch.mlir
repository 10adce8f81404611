// RUN: lmcc-opt --lm-to-loops="vector-bits=512 l1-ways=12" %s | FileCheck %s
// A packed weight over 1 MB (1024 x 512 floats) streams from memory: every k step of a tile prefetches into L2
// (locality 2, prefetcht1) a cache line of the next 32-wide column slice (depth 512: one chunk, 512 x 32 floats
// ahead), tile t the line t mod 2 of the slice's 32-float (2-line) rows, and when the block has one tile (T <= 1) also
// line t + 1, so that the tiles of a slice bring all of the next one (gemm-chunks.mlir: deeper weights prefetch the
// next chunk).
// Weights of 1 MB or less (the 8 x 1024 below) are not prefetched.

// CHECK-LABEL: func.func private @lm_gemm_1024x512_bias_12x32
// CHECK: %[[SLICE:.+]] = arith.muli %c512, %c32
// CHECK: %[[FEW:.+]] = arith.cmpi ule, %{{.*}}, %c1
// CHECK: %[[AHEAD:.+]] = arith.addi %{{.*}}, %[[SLICE]]
// CHECK: %[[LINE0:.+]] = arith.remui %[[T:arg[0-9]+]], %c2
// CHECK: %[[OFF0:.+]] = arith.muli %[[LINE0]], %c16
// CHECK: %[[AHEAD0:.+]] = arith.addi %[[AHEAD]], %[[OFF0]]
// CHECK: %[[T2:.+]] = arith.addi %[[T]], %c1
// CHECK: %[[LINE1:.+]] = arith.remui %[[T2]], %c2
// CHECK: %[[OFF1:.+]] = arith.muli %[[LINE1]], %c16
// CHECK: %[[AHEAD1:.+]] = arith.addi %[[AHEAD]], %[[OFF1]]
// CHECK: scf.for
// CHECK: %[[AT0:.+]] = arith.addi %[[AHEAD0]], %{{.*}}
// CHECK: %[[CLAMPED0:.+]] = arith.minsi %[[AT0]], %{{.*}}
// CHECK: memref.prefetch %{{.*}}[%[[CLAMPED0]]], read, locality<2>, data
// CHECK: scf.if %[[FEW]] {
// CHECK: %[[AT1:.+]] = arith.addi %[[AHEAD1]], %{{.*}}
// CHECK: %[[CLAMPED1:.+]] = arith.minsi %[[AT1]], %{{.*}}
// CHECK: memref.prefetch %{{.*}}[%[[CLAMPED1]]], read, locality<2>, data
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
