// RUN: lmcc emit-mlir %inputs/specs/tiny_unilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-to-loops="vector-bits=256" | FileCheck %s
// RUN: lmcc emit-mlir %inputs/specs/tiny_unilm.toml | lmcc-opt --lm-fuse-attention --lm-to-loops="vector-bits=256" | FileCheck %s --check-prefix=NAIVE
// lm.token_logprob streams vocabulary tiles: the tile's logits from the GEMM, a vector max and exp-sum per row
// (16 lanes; the rows in a row task), the running max and sum in double, the target's logit; no [rows, V] buffer. lm.sentence_score
// writes the score kernel's three outputs. Without lm-fuse-logprob the naive head is a log_softmax over a
// [B, N, V] buffer and a gather that reads only rows below the sentence length.

// CHECK-LABEL: func.func @tiny_unilm_score_kernel
// CHECK-SAME: %[[LP:[a-z0-9]+]]: memref<?x?xf32>, %[[SCORE:[a-z0-9]+]]: memref<?xf32>, %[[N:[a-z0-9]+]]: memref<?xi32>)
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x2048xf32>
// CHECK-COUNT-2: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?xf64>
// Each tile's rows in a row task (split over the threads when the tile is large enough):
// CHECK: func.call @lm_logprob_rows_shift1_v2048(%{{.*}}, %c0_i64, %{{.*}}) : (!llvm.ptr, i64, i64) -> ()
// CHECK: func.call @lm_rt_parallel_for
// CHECK: math.log {{.*}} : f64
// CHECK: memref.store {{.*}}, %[[LP]]
// CHECK: memref.store {{.*}}, %[[SCORE]]
// CHECK: memref.store {{.*}}, %[[N]]
// CHECK-NOT: memref<?x?x67xf32>
// CHECK-LABEL: func.func private @lm_logprob_rows_shift1_v2048
// CHECK: vector.reduction <maximumf>
// CHECK: math.exp {{.*}} : vector<16xf32>
// CHECK: vector.reduction <add>

// NAIVE-LABEL: func.func @tiny_unilm_score_kernel
// NAIVE: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x67xf32>
// NAIVE: math.log {{.*}} : f64
// NAIVE: scf.if
