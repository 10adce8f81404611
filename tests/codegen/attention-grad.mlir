// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, AttentionGrad.cpp: lm.attention_grad with head size 16 (a multiple of 16; relative positions:
// attention-relative.mlir, directional rows: attention-directional.mlir) is generated in the vector form,
// in a task over (entry, head) items split by
// lm_rt_parallel_for (called directly below 2^16 multiply-adds): per item keys and values transposed in 16 x 16
// register blocks, then per tile of 8 query rows the probabilities recomputed, dP = dO v^T as the scores,
// D = sum P dP, dS = P (dP - D) scale, dq of the real rows only (rows past the length repeat the last one),
// dk (+)= dS^T q and dv (+)= P^T dO in tiles of 4 keys into a scratch, written out over the next item's tiles;
// past the threads' L2 the next item (and a share of the next entry) prefetched and dq, dk, dv stored
// nontemporally. Head size 8 calls the runtime's C++ kernel.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 32, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x32xf32>
    %x = lm.embed %E[%ids] : (tensor<11x32xf32>, tensor<?x?xi32>) -> tensor<?x?x32xf32>
    %dq, %dk, %dv = lm.attention_grad %x, %x, %x, %x, %lengths {heads = 2 : i64, mask = #lm.mask<causal>, scale = 0.25 : f32}
        : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>
    %dq4, %dk4, %dv4 = lm.attention_grad %x, %x, %x, %x, %lengths {heads = 4 : i64, mask = #lm.mask<diagonal>, scale = 0.25 : f32}
        : tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?xi32> -> tensor<?x?x32xf32>, tensor<?x?x32xf32>, tensor<?x?x32xf32>
    %s1 = lm.add %dq, %dk : tensor<?x?x32xf32>
    %s2 = lm.add %s1, %dv : tensor<?x?x32xf32>
    %s3 = lm.add %s2, %dq4 : tensor<?x?x32xf32>
    %s4 = lm.add %s3, %dk4 : tensor<?x?x32xf32>
    %s5 = lm.add %s4, %dv4 : tensor<?x?x32xf32>
    %de = lm.embed_grad %s5, %ids, %lengths : (tensor<?x?x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x32xf32>
    lm.param_grad %de {name = "embed.token"} : tensor<11x32xf32>
    %ce, %lse = lm.token_loss %x, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x32xf32>, tensor<11x32xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// the vector form: 2 heads x entries items, a task unless the call is small
// CHECK: arith.muli %{{.*}}, %c2 : index
// CHECK: arith.cmpi slt, %{{.*}}, %c65536
// CHECK: memref.alloca() : memref<17xi64>
// CHECK: constant @lm_attention_grad_task_causal_h2_d32_s0x3e800000
// CHECK: func.call @lm_attention_grad_task_causal_h2_d32_s0x3e800000(
// CHECK: func.call @lm_rt_parallel_for(
// head size 8: the runtime's kernel (4 heads, diagonal = 3)
// CHECK: call @lm_rt_attention_grad({{.*}}, %c4_i64, %c3_i32,
// CHECK-NOT: lm.attention_grad
// CHECK-LABEL: func.func private @lm_attention_grad_task_causal_h2_d32_s0x3e800000(
// kt, vt [M16 / 16 x head size, 16] (16-key blocks), the keys packed [M16 x head size / 16, 16] and the tile's P
// and dP / dS [8, M16]
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x16xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<8x?xf32>
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<8x?xf32>
// and dk, dv of two items: [2, M16, head size]
// CHECK: %[[DKS:.*]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<2x?x16xf32>
// CHECK: %[[DVS:.*]] = memref.alloc({{.*}}) {alignment = 64 : i64} : memref<2x?x16xf32>
// the next item prefetched only when q, dO, dq, k, v, dk, dv (rows x 3 + keys x 4, x 32 x 4 bytes) exceed the L2
// CHECK: %[[BYTES:.*]] = arith.muli %{{.*}}, %c128 : index
// CHECK: %[[CACHE:.*]] = call @lm_rt_private_cache_bytes() : () -> i64
// CHECK: %[[CACHEI:.*]] = arith.index_cast %[[CACHE]] : i64 to index
// CHECK: %[[STREAMS:.*]] = arith.cmpi slt, %[[CACHEI]], %[[BYTES]] : index
// and dq stored nontemporally then, when dq is 64-byte aligned
// CHECK: %[[LOW:.*]] = arith.andi %{{.*}}, %c63_i64 : i64
// CHECK: %[[ALIGNED:.*]] = arith.cmpi eq, %[[LOW]], %c0_i64 : i64
// CHECK: %[[NT:.*]] = arith.andi %[[STREAMS]], %[[ALIGNED]] : i1
// dk and dv nontemporally too when both are aligned
// CHECK: %[[NTDK:.*]] = arith.andi %[[STREAMS]], %{{.*}} : i1
// CHECK: %[[NTDV:.*]] = arith.andi %[[STREAMS]], %{{.*}} : i1
// CHECK: %[[NTK:.*]] = arith.andi %[[NTDK]], %[[NTDV]] : i1
// the items, carrying the keys the item before touched (it is item - 1 when item > begin); slot item mod 2
// CHECK: scf.for %[[ITEM:arg[0-9]+]] = %[[BEGIN:[0-9]+]] to %[[END:[0-9]+]] step %{{.*}} iter_args(%[[TOUCHEDBEFORE:arg[0-9]+]] = %c0{{(_[0-9]+)?}}) -> (index) {
// CHECK: %[[BEFOREITEM:.*]] = arith.subi %[[ITEM]], %c1{{(_[0-9]+)?}} : index
// CHECK: %[[HASBEFORE:.*]] = arith.cmpi slt, %[[BEGIN]], %[[ITEM]] : index
// CHECK: %[[SLOT:.*]] = arith.remui %[[ITEM]], %c2{{(_[0-9]+)?}} : index
// dq of rows past the query length zeroed; keys, then values transposed
// CHECK: vector.store {{.*}} : memref<?x?x32xf32>, vector<16xf32>
// (the host's width: 16-lane interleaves at 512 bits, 8 x 8 blocks at 256)
// CHECK: vector.shuffle {{.*}} {{\[0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23\]|\[0, 8, 1, 9, 4, 12, 5, 13\]}}
// CHECK: vector.shuffle {{.*}} {{\[0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23\]|\[0, 8, 1, 9, 4, 12, 5, 13\]}}
// per tile part, when streaming: the item's share of the next entry's (entry + 1) read lines, whole rows of
// 32 features (2 lines a row: line l at row l / 2, feature (l mod 2) x 16), then the next item's 16 features a row
// CHECK: %[[ROW:.*]] = arith.divui %[[LINE:arg[0-9]+]], %c2{{(_[0-9]+)?}} : index
// CHECK: %[[LANE:.*]] = arith.remui %[[LINE]], %c2{{(_[0-9]+)?}} : index
// CHECK: %[[FEATURE:.*]] = arith.muli %[[LANE]], %c16{{(_[0-9]+)?}} : index
// CHECK: memref.prefetch %{{.*}}[%[[NEXTENTRY:.*]], %[[ROW]], %[[FEATURE]]], read, locality<2>, data
// CHECK-COUNT-3: memref.prefetch %{{.*}}[%[[NEXTENTRY]], %{{.*}}, %{{.*}}], read, locality<2>, data
// CHECK: memref.prefetch {{.*}} read, locality<2>, data
// scores of 8 rows per key vector, masked only in blocks not fully visible, the softmax numerators
// CHECK-COUNT-8: vector.fma {{.*}} : vector<16xf32>
// CHECK: arith.select {{.*}} : vector<16xi1>, vector<16xf32>
// CHECK: vector.shuffle %[[MX0:.*]], %[[MX1:.*]] [0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31]
// CHECK: arith.shli {{.*}} : vector<16xi32>
// dP = dO v^T as the scores, then P = p / l with D = sum P dP, then dS = P (dP - D) scale
// CHECK-COUNT-8: vector.fma {{.*}} : vector<16xf32>
// CHECK: arith.mulf {{.*}} : vector<16xf32>
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: vector.shuffle %[[D0:.*]], %[[D1:.*]] [0, 1, 2, 3, 4, 5, 6, 7, 24, 25, 26, 27, 28, 29, 30, 31]
// CHECK: arith.subf {{.*}} : vector<16xf32>
// CHECK: arith.mulf {{.*}} : vector<16xf32>
// dq: rows past the length (repeats of the last) are not stored; nontemporal stores when streaming
// CHECK: scf.if %[[NT]] {
// CHECK: vector.store {{.*}} {nontemporal = true} : memref<?x?x32xf32>, vector<16xf32>
// CHECK: } else {
// CHECK: vector.store {{%[0-9]+#[0-9]+}}, {{%[0-9]+}}[{{.*}}] : memref<?x?x32xf32>, vector<16xf32>
// dk then dv of the item in tiles of 4 keys into its scratch slot (item mod 2): added to where an earlier tile
// wrote, stored where none did (no zeroing pass)
// CHECK: scf.for {{.*}} step %c4
// CHECK: vector.fma
// CHECK: vector.load %[[DKS]][%[[SLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: arith.addf {{.*}} : vector<16xf32>
// CHECK: vector.store %{{.*}}, %[[DKS]][%[[SLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: scf.for {{.*}} step %c4
// CHECK: vector.fma
// CHECK-NOT: arith.addf
// CHECK: vector.store %{{.*}}, %[[DKS]][%[[SLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: vector.store %{{.*}}, %[[DVS]][%[[SLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// then the item before's keys [t M / tiles, (t + 1) M / tiles) out of the other slot, touched ones from the
// scratch and the rest 0, nontemporal when streaming and dk, dv are 64-byte aligned
// CHECK: scf.if %[[HASBEFORE]] {
// CHECK: %[[PREVSLOT:.*]] = arith.remui %[[BEFOREITEM]], %c2{{(_[0-9]+)?}} : index
// CHECK: scf.if %[[NTK]] {
// CHECK: arith.cmpi slt, %{{.*}}, %[[TOUCHEDBEFORE]] : index
// CHECK: vector.load %[[DKS]][%[[PREVSLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: arith.select
// CHECK: vector.store {{.*}} {nontemporal = true} : memref<?x?x32xf32>, vector<16xf32>
// CHECK: vector.load %[[DVS]][%[[PREVSLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: } else {
// the keys the tiles carried past are the touched prefix; an empty entry writes the item before's keys at once
// CHECK: arith.maxsi
// CHECK: scf.yield
// CHECK: scf.if {{.*}} {
// CHECK: %[[EMPTYSLOT:.*]] = arith.remui %[[BEFOREITEM]], %c2{{(_[0-9]+)?}} : index
// CHECK: vector.load %[[DKS]][%[[EMPTYSLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// the keys this item touched carried to the next; after the items the last one's (end - 1) keys
// CHECK: scf.yield %{{.*}} : index
// CHECK: %[[ANY:.*]] = arith.cmpi slt, %[[BEGIN]], %[[END]] : index
// CHECK: scf.if %[[ANY]] {
// CHECK: %[[LASTITEM:.*]] = arith.subi %[[END]], %c1{{(_[0-9]+)?}} : index
// CHECK: %[[LASTSLOT:.*]] = arith.remui %[[LASTITEM]], %c2{{(_[0-9]+)?}} : index
// CHECK: vector.load %[[DKS]][%[[LASTSLOT]], %{{.*}}, %{{.*}}] : memref<2x?x16xf32>, vector<16xf32>
// CHECK: vector.store {{.*}} {nontemporal = true} : memref<?x?x32xf32>, vector<16xf32>
// the stores fenced when any were nontemporal
// CHECK: llvm.fence seq_cst
