// RUN: lmcc-opt --lm-to-loops %s | FileCheck %s
// The decomposed attention (the naive pipeline, --no-fuse-attention): split_heads, matmul, mask_fill, softmax,
// merge_heads and the Shaw relative terms each call one private function per signature (the op, its attributes and
// its operand types: `lm_<op>_<hash>`), defined once and marked no_inline, instead of a copy of the loop nest at
// every use: a naive BERT-base library compiled 239 -> 27 s with them. Two layers here: the second calls the first
// one's functions where the signatures agree (split_heads, the two matmuls, softmax, merge_heads).

// CHECK-LABEL: func.func @m_embed_kernel(
// CHECK-SAME: %{{[^:]+}}: memref<?xf32>, %[[X:[^:]+]]: memref<?x?x8xf32>, %[[LEN:[^:]+]]: memref<?xi32>, %[[DIRS:[^:]+]]: memref<?x?x2xi32>
// CHECK: call @[[SPLIT:lm_split_heads_[0-9A-F]+]](%[[X]], %[[QH:[^)]+]]) : (memref<?x?x8xf32>, memref<?x2x?x4xf32>) -> ()
// CHECK: call @[[SCORES:lm_matmul_t_[0-9A-F]+]](%[[QH]], %[[QH]], %[[S:[^)]+]]) : (memref<?x2x?x4xf32>, memref<?x2x?x4xf32>, memref<?x2x?x?xf32>) -> ()
// CHECK: call @[[CAUSAL:lm_mask_fill_causal_[0-9A-F]+]](%[[S]], %[[LEN]], %{{[^)]+}}) : (memref<?x2x?x?xf32>, memref<?xi32>, memref<?x2x?x?xf32>) -> ()
// CHECK: call @[[SOFTMAX:lm_softmax_[0-9A-F]+]](
// CHECK: call @[[CONTEXT:lm_matmul_[0-9A-F]+]](
// CHECK: call @[[MERGE:lm_merge_heads_[0-9A-F]+]](
// CHECK: call @[[SPLIT]](
// CHECK: call @[[SCORES]](
// CHECK: call @[[RELS:lm_relative_scores_k2_[0-9A-F]+]](%{{[^,]+}}, %{{[^,]+}}, %{{[^)]+}}) : (memref<?x2x?x4xf32>, memref<5x4xf32, strided<[4, 1], offset: ?>>, memref<?x2x?x?xf32>) -> ()
// The directional mask's rows are an argument of its function.
// CHECK: call @[[DIRECTIONAL:lm_mask_fill_directional_[0-9A-F]+]](%{{[^,]+}}, %[[LEN]], %{{[^,]+}}, %[[DIRS]])
// CHECK: call @[[SOFTMAX]](
// CHECK: call @[[CONTEXT]](
// CHECK: call @[[RELV:lm_relative_values_k2_[0-9A-F]+]](
// CHECK: call @[[MERGE]](
// CHECK: return
// The functions, each once: s[b, h, i, j] = sum_e q[b, h, i, e] k[b, h, j, e] over the parameters' own sizes.
// CHECK: func.func private @[[SPLIT]](%{{[^:]+}}: memref<?x?x8xf32>, %{{[^:]+}}: memref<?x2x?x4xf32>) attributes {no_inline}
// CHECK: func.func private @[[SCORES]](%[[A:[^:]+]]: memref<?x2x?x4xf32>, %[[B:[^:]+]]: memref<?x2x?x4xf32>, %[[OUT:[^:]+]]: memref<?x2x?x?xf32>) attributes {no_inline}
// CHECK: memref.dim %[[OUT]]
// CHECK: memref.load %[[A]]
// CHECK: memref.load %[[B]]
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK: memref.store {{.*}}, %[[OUT]]
// CHECK: return
// CHECK: func.func private @[[CAUSAL]](%{{[^:]+}}: memref<?x2x?x?xf32>, %[[FLEN:[^:]+]]: memref<?xi32>, %{{[^:]+}}: memref<?x2x?x?xf32>) attributes {no_inline}
// CHECK: memref.load %[[FLEN]]
// CHECK: arith.select
// CHECK: func.func private @[[SOFTMAX]](
// CHECK: math.exp {{.*}} : f64
// CHECK: func.func private @[[CONTEXT]](
// CHECK: func.func private @[[MERGE]](
// CHECK: func.func private @[[RELS]](
// CHECK: func.func private @[[DIRECTIONAL]](
// CHECK: func.func private @[[RELV]](
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @embed(%x: tensor<?x?x8xf32>, %len: tensor<?xi32>, %dirs: tensor<?x?x2xi32>) -> tensor<?x?x8xf32> {
    %qh = lm.split_heads %x : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
    %s = lm.matmul %qh, %qh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
    %m = lm.mask_fill %s, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
    %p = lm.softmax %m : tensor<?x2x?x?xf32>
    %c = lm.matmul %p, %qh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
    %h = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
    %RK = lm.weight "layers.1.attn.rel_k" : tensor<5x4xf32>
    %RV = lm.weight "layers.1.attn.rel_v" : tensor<5x4xf32>
    %qh1 = lm.split_heads %h : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
    %s1 = lm.matmul %qh1, %qh1 {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
    %rs = lm.relative_scores %qh1, %qh1, %RK {clip = 2 : i64} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>, tensor<5x4xf32>) -> tensor<?x2x?x?xf32>
    %s2 = lm.add %s1, %rs : tensor<?x2x?x?xf32>
    %m1 = lm.mask_fill %s2, %len data(%dirs : tensor<?x?x2xi32>) {mask = #lm.mask<directional>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
    %p1 = lm.softmax %m1 : tensor<?x2x?x?xf32>
    %c1 = lm.matmul %p1, %qh1 : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
    %rv = lm.relative_values %p1, %RV {clip = 2 : i64} : (tensor<?x2x?x?xf32>, tensor<5x4xf32>) -> tensor<?x2x?x4xf32>
    %c2 = lm.add %rv, %c1 : tensor<?x2x?x4xf32>
    %r = lm.merge_heads %c2 : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
    return %r : tensor<?x?x8xf32>
  }
}
