// RUN: lmcc emit-mlir %inputs/specs/tiny_unilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-to-loops="vector-bits=256" | FileCheck %s
// RUN: lmcc emit-mlir %inputs/specs/tiny_unilm.toml | lmcc-opt --lm-fuse-attention --lm-to-loops="vector-bits=256" | FileCheck %s --check-prefix=NAIVE
// lm.token_logprob over items of (128 rows, 512 vocabulary columns) in one task: each item's logits from the
// GEMM's task (called by address, not inlined) into a [rows, 512] scratch (narrower for a smaller vocabulary: 67
// words, 80 columns), then per row the chunk's max and the sum of its exponentials (16 lanes, the lanes combined in butterflies) and the target's
// logit; per row the chunks combined in double after the task; no [rows, V] buffer. lm.sentence_score writes the
// score kernel's three outputs. Without lm-fuse-logprob the naive head is a log_softmax over a [B, N, V] buffer and
// a gather that reads only rows below the sentence length.

// CHECK-LABEL: func.func @tiny_unilm_score_kernel
// CHECK-SAME: %[[LP:[a-z0-9]+]]: memref<?x?xf32>, %[[SCORE:[a-z0-9]+]]: memref<?xf32>, %[[N:[a-z0-9]+]]: memref<?xi32>)
// The per-(row, chunk) maxima and sums (V = 67: one chunk):
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x1xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x1xf64>
// CHECK: func.call @lm_logprob_items_67x30_bias_shift1_6x16(%{{.*}}, %c0_i64, %{{.*}}) : (!llvm.ptr, i64, i64) -> ()
// CHECK: func.call @lm_rt_parallel_for
// CHECK: math.exp {{.*}} : f64
// CHECK: math.log {{.*}} : f64
// CHECK: memref.store {{.*}}, %[[LP]]
// CHECK: memref.store {{.*}}, %[[SCORE]]
// CHECK: memref.store {{.*}}, %[[N]]
// CHECK-NOT: memref<?x?x67xf32>
// CHECK-LABEL: func.func private @lm_logprob_items_67x30_bias_shift1_6x16
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x80xf32>
// CHECK: llvm.call %{{.*}}(%{{.*}}, %c0_i64, %{{.*}}) : !llvm.ptr, (!llvm.ptr, i64, i64) -> ()
// The max in four vector chains (by column mod 64), their lanes in a butterfly; the exponentials by emitVectorExp
// (2^n from n's bits, not math.exp) summed in one vector chain, its lanes in a butterfly:
// CHECK: scf.for {{.*}} step %c64{{.*}} iter_args({{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// CHECK: arith.cmpf ogt, {{.*}} : vector<16xf32>
// CHECK: vector.shuffle {{.*}} [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]
// CHECK: arith.cmpf ogt, {{.*}} : vector<16xf32>
// CHECK-NOT: math.exp {{.*}} : vector<16xf32>
// CHECK: arith.shli {{.*}} : vector<16xi32>
// CHECK: vector.shuffle {{.*}} [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]
// CHECK: arith.addf {{.*}} : vector<16xf32>
// CHECK: math.exp {{.*}} : f64
// CHECK: memref.dealloc {{.*}} : memref<?x80xf32>

// NAIVE-LABEL: func.func @tiny_unilm_score_kernel
// NAIVE: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x67xf32>
// NAIVE: math.log {{.*}} : f64
// NAIVE: scf.if
