// RUN: lmcc emit-mlir %models/bilm_base.toml | lmcc-opt | FileCheck %s
// biLM: pseudo-log-likelihood by mask-and-predict; the stack reads the masked copy,
// the targets are the original ids; no attention mask beyond padding.

// CHECK-LABEL: func.func @score
// CHECK-SAME: lm.method = "mask-and-predict"
// CHECK: lm.mask_and_predict %arg0, %arg1 spans(%arg2) {mask_token = 4 : i64}
// CHECK-NEXT: ^bb0([[M:%.+]]: tensor<?x?xi32>):
// CHECK: lm.embed {{.*}}[[[M]]]
// CHECK: lm.split_heads
// CHECK: lm.matmul {{.*}} {transpose_rhs}
// CHECK: lm.scale {{.*}} {factor = 1.250000e-01 : f32}
// CHECK: lm.mask_fill {{.*}}#lm.mask<none>
// CHECK: lm.softmax
// CHECK: lm.gather %{{[0-9]+}}, %arg0, %arg1 : (tensor<?x?x30522xf32>
// CHECK: lm.yield
// CHECK: lm.sentence_score
// Embedding: each position's state from its masked copy, the copies chosen by spans as in score (the runtime
// cuts them into windows under a memory limit and pools the states by the function's lmcc.pool attributes).
// CHECK-LABEL: func.func @embed
// CHECK-SAME: (%arg0: tensor<?x?xi32>, %arg1: tensor<?xi32>, %arg2: tensor<?x?xi32>) -> tensor<?x?x512xf32>
// CHECK-SAME: lmcc.pool = "mean", lmcc.pool_exclude = array<i32: 3, 1>, lmcc.pool_normalize = false
// CHECK: lm.mask_and_predict %arg0, %arg1 spans(%arg2)
// CHECK: lm.yield {{.*}} : tensor<?x?x512xf32>
// CHECK-NOT: lm.mean_pool
// CHECK: return
