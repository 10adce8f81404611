// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s
// RUN: lmcc-opt --lm-to-loops="vector-bits=256" %s | FileCheck %s --check-prefix=STREAM
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 half-blocks=no" %s | FileCheck %s --check-prefix=WIDE
// RUN: lmcc-opt --lm-to-loops="vector-bits=512 half-blocks=yes" %s | FileCheck %s --check-prefix=HALF
// RUN: not lmcc-opt --lm-to-loops="half-blocks=maybe" %s 2>&1 | FileCheck %s --check-prefix=BAD
// lm.attention: head size 16 takes the vector form, register-tiled (per (entry, head) item the head's keys transposed
// in 16 x 16 register blocks into 16-key blocks, its values packed per feature vector, query rows in tiles of 8
// sharing each key vector load, their score accumulators in registers 4 rows at a time at 256 bits (two ymm a
// vector<16xf32>) and all 8 at 512, the next item's q, k, v
// prefetched and its output rows stored nontemporally when the call's operands exceed the threads' L2, scores masked
// by lane only in blocks not fully visible, vector exp), in a task function that lm_rt_parallel_for splits by items
// over the runtime's threads (called directly below 2^16 multiply-adds); head size 8 the scalar key-tiled online
// softmax (32-key tiles, running max and sum rescaled by e^(m - m')). The causal mask shrinks the key range instead
// of testing every key; the diagonal mask knocks out key i by a select.

// CHECK-LABEL: func.func @m_score_kernel
// vector form, causal: the items (entries x 2 heads) split over threads unless the call is small
// CHECK: arith.muli %{{.*}}, %c2 : index
// CHECK: arith.cmpi slt, %{{.*}}, %c65536
// CHECK: memref.alloca() : memref<13xi64>
// CHECK: constant @lm_attention_task_causal_h2_d32_s0x3e800000
// CHECK: scf.if
// CHECK: func.call @lm_attention_task_causal_h2_d32_s0x3e800000(
// CHECK: } else {
// CHECK-NEXT: func.call @lm_rt_parallel_for(
// scalar form, diagonal
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<32xf32>
// CHECK: scf.for {{.*}} step %c32{{(_[0-9]+)?}} iter_args
// CHECK: arith.cmpi eq
// CHECK: arith.select {{.*}} : f32
// CHECK: math.exp
// CHECK-NOT: lm.attention
// the task: operands rebuilt from ctx, kt [M16 / 16 x head size, 16] (16-key blocks), scores of 8 rows, the values
// packed [M16 x head size / 16, 16]
// CHECK-LABEL: func.func private @lm_attention_task_causal_h2_d32_s0x3e800000(%arg0: !llvm.ptr, %arg1: i64, %arg2: i64)
// CHECK: llvm.load
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<8x?xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// prefetching only when the call's q, out, k, v bytes (rows x 2 + keys x 2, x 32 x 4) exceed the threads' L2
// CHECK: %[[BYTES:.*]] = arith.muli %{{.*}}, %c128 : index
// CHECK: %[[CACHE:.*]] = call @lm_rt_private_cache_bytes() : () -> i64
// CHECK: %[[CACHEI:.*]] = arith.index_cast %[[CACHE]] : i64 to index
// CHECK: %[[STREAMS:.*]] = arith.cmpi slt, %[[CACHEI]], %[[BYTES]] : index
// and the output rows stored nontemporally when streaming into a 64-byte aligned output
// CHECK: %[[LOW:.*]] = arith.andi %{{.*}}, %c63_i64 : i64
// CHECK: %[[ALIGNED:.*]] = arith.cmpi eq, %[[LOW]], %c0_i64 : i64
// CHECK: %[[NT:.*]] = arith.andi %[[STREAMS]], %[[ALIGNED]] : i1
// the keys' 16 x 16 blocks at 256 bits as four 8 x 8 blocks of single-instruction shuffles (unpcklps / unpckhps,
// shufps, 128-bit lane selects); at 512 bits four rounds of 16-lane interleaves
// CHECK: vector.shuffle {{.*}} [0, 8, 1, 9, 4, 12, 5, 13] : vector<8xf32>, vector<8xf32>
// CHECK: vector.shuffle {{.*}} [2, 10, 3, 11, 6, 14, 7, 15] : vector<8xf32>, vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 1, 8, 9, 4, 5, 12, 13] : vector<8xf32>, vector<8xf32>
// CHECK: vector.shuffle {{.*}} [2, 3, 10, 11, 6, 7, 14, 15] : vector<8xf32>, vector<8xf32>
// CHECK: vector.shuffle {{.*}} [0, 1, 2, 3, 8, 9, 10, 11] : vector<8xf32>, vector<8xf32>
// CHECK: vector.shuffle {{.*}} [4, 5, 6, 7, 12, 13, 14, 15] : vector<8xf32>, vector<8xf32>
// WIDE: vector.shuffle {{.*}} [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23] : vector<16xf32>, vector<16xf32>
// WIDE: vector.shuffle {{.*}} [8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31] : vector<16xf32>, vector<16xf32>
// CHECK: arith.andi %[[STREAMS]],
// CHECK: memref.prefetch {{.*}} read, locality<2>, data
// rows clamped to the last, the causal key range [0, min(len, i + 1))
// CHECK: arith.minsi
// CHECK: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){3}[)]}}
// CHECK-COUNT-4: vector.fma {{.*}} : vector<16xf32>
// at 512 bits every block of a tile's range is 16 keys wide (no 8-lane half blocks), two at a time (16
// accumulators of 8 rows), and an odd block left over in one step with the last pair (24) when there is one: 8
// chains alone ran at two thirds of the pairs' rate
// WIDE-NOT: vector.fma {{.*}} : vector<8xf32>
// WIDE: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){15}[)]}}
// WIDE-COUNT-16: vector.fma {{.*}} : vector<16xf32>
// WIDE: scf.index_switch
// WIDE-NEXT: case 1 {
// WIDE: scf.if
// WIDE: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){23}[)]}}
// WIDE-COUNT-24: vector.fma {{.*}} : vector<16xf32>
// WIDE: } else {
// WIDE: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){7}[)]}}
// WIDE-NOT: vector.fma {{.*}} : vector<8xf32>
// WIDE: arith.cmpf ogt, {{.*}} : vector<16xf32>
// half-blocks=yes (a target that splits 512-bit operations, where an 8-lane FMA costs half a 16-lane one): a tile's
// first block whose lower 8 keys no row sees and its last whose upper 8 none sees each on a step of its own at 8
// lanes (8 rows: 8 chains), then the full blocks between in the groups above
// HALF-LABEL: func.func private @lm_attention_task_causal
// HALF: scf.if
// HALF: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){7}[)]}} -> (vector<8xf32>
// HALF: vector.load {{.*}}[{{.*}}, %c8{{(_[0-9]+)?}}] : memref<?x16xf32>, vector<8xf32>
// HALF-COUNT-8: vector.fma {{.*}} : vector<8xf32>
// HALF: scf.if
// HALF: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){7}[)]}} -> (vector<8xf32>
// HALF: vector.load {{.*}}[{{.*}}, %c0{{(_[0-9]+)?}}] : memref<?x16xf32>, vector<8xf32>
// HALF-COUNT-8: vector.fma {{.*}} : vector<8xf32>
// HALF: scf.for {{.*}} step %c4{{(_[0-9]+)?}} iter_args(%arg{{[0-9]+}} = {{%[0-9]+(, %arg[0-9]+ = %[0-9]+){15}[)]}}
// HALF-COUNT-16: vector.fma {{.*}} : vector<16xf32>
// BAD: lm-to-loops: half-blocks must be yes, no or host, got maybe
// CHECK: scf.if
// CHECK: arith.select {{.*}} : vector<16xi1>, vector<16xf32>
// row maxima by the rows' butterflies of lane swaps side by side (acrossRows: two rows a vector from the first
// swap on, the last swap within one vector), each row's max then broadcast from its lane; e^(s - m) inline (2^n
// from n's bits); the row sums the same way, and one division for the tile's 8 rows
// CHECK: vector.shuffle %[[MX0:.*]], %[[MX1:.*]] [0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31]
// CHECK-NEXT: vector.shuffle %[[MX0]], %[[MX1]] [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK: vector.shuffle %[[MX:.*]], %[[MX]] [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14]
// CHECK: arith.cmpf ogt
// CHECK: vector.shuffle %[[M:.*]], %[[M]] [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]
// CHECK: arith.shli {{.*}} : vector<16xi32>
// CHECK: vector.shuffle %[[S0:.*]], %[[S1:.*]] [0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31]
// CHECK: arith.addf {{.*}} : vector<16xf32>
// CHECK: arith.divf {{.*}} : vector<16xf32>
// CHECK-NOT: arith.divf
// CHECK: vector.shuffle %[[INV:.*]], %[[INV]] [14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14]
// The output rows: nontemporal stores when streaming, plain ones otherwise; the streaming kernel never
// prefetches them for writing.
// CHECK: scf.if %[[NT]] {
// CHECK-NEXT: vector.store {{.*}} {nontemporal = true} : memref<?x?x32xf32>, vector<16xf32>
// CHECK: } else {
// CHECK-NEXT: vector.store {{%[0-9]+}}, {{%[0-9]+}}[{{.*}}] : memref<?x?x32xf32>, vector<16xf32>
// STREAM-COUNT-12: memref.prefetch {{.*}} read, locality<2>, data
// STREAM-NOT: memref.prefetch
// After the items, a fence where nontemporal stores ran.
// CHECK: memref.dealloc
// CHECK: scf.if %[[NT]] {
// CHECK-NEXT: llvm.fence seq_cst
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 32, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @score(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>) {
    %E = lm.weight "embed.token" : tensor<11x32xf32>
    %x = lm.embed %E[%ids] : (tensor<11x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
    %c = lm.attention %x, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<causal>, scale = 0.25 : f32}
         : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>
    %d = lm.attention %c, %x, %x, %len {heads = 4 : i64, mask = #lm.mask<diagonal>, scale = 0.25 : f32}
         : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>
    %t = lm.token_logprob %d, %E, %ids, %len : (tensor<?x?x32xf32>, tensor<11x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    %lp, %s, %n = lm.sentence_score %t, %ids, %len {first = 0 : i64, skip = array<i32: 3, 1>}
        : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>)
    return %lp, %s, %n : tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>
  }
}
