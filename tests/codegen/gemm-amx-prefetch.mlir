// RUN: lmcc-opt --lm-to-loops="vector-bits=512 weights-dtype=bf16 bf16-dot=amx" %s | FileCheck %s
// The AMX GEMM over a packed weight of over 1 MB (2048 x 512 as bf16 pairs: 2 MB) prefetches into L2 (locality 2,
// prefetcht1) the next 32-column slice while a block's tiles pass over this one: 256 pair-rows of 128 bytes, 512
// lines from float (slice + 256) x 32 on, spread over the block's T tiles x 16 steps x 2 slots: slot u takes line
// (u x scale) >> 16, scale = (512 << 16) / (T x 32), one addition of scale per slot; clamped to the last float.
// (Tile t's rows start at t x 32, its slots at t x 16 x 2 = t x 32.) Only blocks of 16 tiles or more prefetch (every
// line gets a slot); the others run a loop of tiles of their own without. Weights of 1 MB or less (the 8 x 2048
// below) are not prefetched (gemm-prefetch.mlir: the vector bodies).

// CHECK-LABEL: func.func private @lm_gemm_2048x512_bias_32x32_bf16amx
// CHECK: %[[FLAT:.+]] = memref.collapse_shape %arg1 {{\[\[}}0, 1]]
// CHECK: %[[FLOATS:.+]] = arith.muli %{{.*}}, %c32{{[_0-9]*}} : index
// CHECK: %[[LAST:.+]] = arith.subi %[[FLOATS]], %c1{{[_0-9]*}} : index
// CHECK: %[[T:.+]] = arith.divui %{{.*}}, %c32{{[_0-9]*}} : index
// CHECK: %[[SLOTS:.+]] = arith.muli %[[T]], %c32{{[_0-9]*}} : index
// CHECK: %[[SCALE:.+]] = arith.divui %c33554432, %[[SLOTS]] : index
// CHECK: %[[MANY:.+]] = arith.cmpi uge, %[[T]], %c16{{[_0-9]*}} : index
// CHECK: scf.if %[[MANY]] {
// CHECK: scf.for %[[TILE:arg[0-9]+]] = %{{.*}} to %[[T]]
// CHECK: %[[M0:.+]] = arith.muli %[[TILE]], %c32{{[_0-9]*}} : index
// CHECK: %[[TSLOT:.+]] = arith.muli %[[TILE]], %c32{{[_0-9]*}} : index
// CHECK: %[[TFIXED:.+]] = arith.muli %[[TSLOT]], %[[SCALE]] : index
// CHECK: %[[NEXT:.+]] = arith.addi %{{.*}}, %c256{{[_0-9]*}} : index
// CHECK: %[[NEXTF:.+]] = arith.muli %[[NEXT]], %c32{{[_0-9]*}} : index
// CHECK: %[[FIXED0:.+]] = arith.addi %[[TFIXED]], %{{.*}} : index
// CHECK: %[[LINE0:.+]] = arith.shrui %[[FIXED0]], %c16{{[_0-9]*}} : index
// CHECK: %[[OFF0:.+]] = arith.muli %[[LINE0]], %c16{{[_0-9]*}} : index
// CHECK: %[[AT0:.+]] = arith.addi %[[NEXTF]], %[[OFF0]] : index
// CHECK: %[[CL0:.+]] = arith.minsi %[[AT0]], %[[LAST]] : index
// CHECK: memref.prefetch %[[FLAT]][%[[CL0]]], read, locality<2>, data
// CHECK: %[[FIXED1:.+]] = arith.addi %[[FIXED0]], %[[SCALE]] : index
// CHECK: %[[LINE1:.+]] = arith.shrui %[[FIXED1]], %c16{{[_0-9]*}} : index
// CHECK: %[[OFF1:.+]] = arith.muli %[[LINE1]], %c16{{[_0-9]*}} : index
// CHECK: %[[AT1:.+]] = arith.addi %[[NEXTF]], %[[OFF1]] : index
// CHECK: %[[CL1:.+]] = arith.minsi %[[AT1]], %[[LAST]] : index
// CHECK: memref.prefetch %[[FLAT]][%[[CL1]]], read, locality<2>, data
// CHECK: %[[FIXED2:.+]] = arith.addi %[[FIXED1]], %[[SCALE]] : index
// CHECK-NOT: memref.prefetch
// CHECK-COUNT-4: amx.tile_mulf
// CHECK: %[[LINE2:.+]] = arith.shrui %[[FIXED2]], %c16{{[_0-9]*}} : index
// CHECK-COUNT-30: memref.prefetch %[[FLAT]]
// CHECK-NOT: memref.prefetch
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[T]]
// CHECK-NOT: memref.prefetch
// CHECK-LABEL: func.func private @lm_gemm_task_2048x512_bias_32x32_bf16amx
// CHECK-LABEL: func.func private @lm_gemm_8x2048_32x32_bf16amx
// CHECK-NOT: memref.prefetch
// CHECK: return
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 512, heads = 2, d_ff = 2048,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x512xf32>
    %x = lm.embed %E[%ids] : (tensor<11x512xf32>, tensor<?x?xi32>) -> tensor<?x?x512xf32>
    %W = lm.weight "layers.0.ffn.in.weight" : tensor<2048x512xf32>
    %b = lm.weight "layers.0.ffn.in.bias" : tensor<2048xf32>
    %y = lm.linear %x, %W, %b : (tensor<?x?x512xf32>, tensor<2048x512xf32>, tensor<2048xf32>) -> tensor<?x?x2048xf32>
    %V = lm.weight "layers.0.ffn.out.weight" : tensor<8x2048xf32>
    %z = lm.linear %y, %V : (tensor<?x?x2048xf32>, tensor<8x2048xf32>) -> tensor<?x?x8xf32>
    %e = lm.mean_pool %z, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
    return %e : tensor<?x8xf32>
  }
}
