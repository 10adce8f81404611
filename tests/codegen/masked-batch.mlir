// RUN: lmcc emit-mlir %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-batch-mask-predict --lm-share-first-layer --lm-prune-rows --lm-to-loops="vector-bits=256" | FileCheck %s
// RUN: lmcc emit-mlir %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-to-loops="vector-bits=256" | FileCheck %s --check-prefix=NAIVE
// lm.masked_batch: the C copies of the spans (ids, lengths, targets, positions, owners, span ends), the body once at
// batch C (lm.splice_copies reads each copy's owner, lm.take_row its position), then the scatter of row 0 of
// each pruned copy into result[owner, position]. lm.mask_and_predict (no batching): the body inlined in a loop
// over positions, its buffers freed inside the loop, each right after its last use (the masked ids before the
// layers' GEMMs run).

// CHECK-LABEL: func.func @tiny_bilm_score_kernel
// CHECK: arith.addi
// CHECK-COUNT-2: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?xi32>
// CHECK-COUNT-4: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?xi32>
// lm.take_row of the targets
// CHECK: memref<?x1xi32>
// CHECK: call @lm_rt_parallel_for
// CHECK-NOT: lm.
// CHECK: return

// NAIVE-LABEL: func.func @tiny_bilm_score_kernel
// NAIVE: scf.for %[[I:.+]] = %{{.+}} to %{{.+}} step
// NAIVE: %[[MASKED:.+]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?xi32>
// NAIVE: memref.dealloc %[[MASKED]]
// NAIVE: call @lm_rt_parallel_for
// NAIVE: {{^    }}}
// NAIVE-NOT: lm.
