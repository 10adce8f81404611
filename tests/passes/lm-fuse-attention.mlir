// RUN: lmcc-opt %s --lm-fuse-attention | FileCheck %s
// RUN: lmcc emit-mlir %models/bilm_base.toml | lmcc-opt --lm-fuse-attention | FileCheck %s --check-prefix=MODEL
// lm-fuse-attention: split_heads x3 / matmul {transpose_rhs} / scale / mask_fill /
// softmax / matmul / merge_heads  ==>  one lm.attention over the unsplit Q, K, V,
// carrying heads, mask (and its data), scale and the Shaw relative tables + clip.
// d_model 8, 2 heads, dh 4.

// CHECK-LABEL: func.func @causal
// CHECK-SAME: ([[Q:%[^:]+]]: tensor<?x?x8xf32>, [[K:%[^:]+]]: tensor<?x?x8xf32>, [[V:%[^:]+]]: tensor<?x?x8xf32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK-NOT: lm.split_heads
// CHECK: [[A:%.+]] = lm.attention [[Q]], [[K]], [[V]], [[LEN]] {heads = 2 : i64, mask = #lm.mask<causal>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
// CHECK-NOT: lm.split_heads
// CHECK-NOT: lm.matmul
// CHECK-NOT: lm.scale
// CHECK-NOT: lm.mask_fill
// CHECK-NOT: lm.softmax
// CHECK-NOT: lm.merge_heads
// CHECK: return [[A]]
func.func @causal(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// The layer form MLIRGen emits: Q/K/V are projections of the same hidden states,
// the output projection reads the fused result.
// CHECK-LABEL: func.func @projected
// CHECK: [[H:%.+]] = lm.layer_norm
// CHECK: [[PQ:%.+]] = lm.linear [[H]]
// CHECK: [[PK:%.+]] = lm.linear [[H]]
// CHECK: [[PV:%.+]] = lm.linear [[H]]
// CHECK-NEXT: [[A:%.+]] = lm.attention [[PQ]], [[PK]], [[PV]], %{{.+}} {heads = 2 : i64, mask = #lm.mask<diagonal>, scale = 5.000000e-01 : f32}
// CHECK-NEXT: lm.linear [[A]]
// CHECK-NOT: lm.softmax
func.func @projected(%x: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %g = lm.weight "layers.0.attn_norm.weight" : tensor<8xf32>
  %b = lm.weight "layers.0.attn_norm.bias" : tensor<8xf32>
  %h = lm.layer_norm %x, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  %Wq = lm.weight "layers.0.attn.q.weight" : tensor<8x8xf32>
  %Wk = lm.weight "layers.0.attn.k.weight" : tensor<8x8xf32>
  %Wv = lm.weight "layers.0.attn.v.weight" : tensor<8x8xf32>
  %Wo = lm.weight "layers.0.attn.o.weight" : tensor<8x8xf32>
  %q = lm.linear %h, %Wq : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %k = lm.linear %h, %Wk : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %v = lm.linear %h, %Wv : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<diagonal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %mh = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  %o = lm.linear %mh, %Wo : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  return %o : tensor<?x?x8xf32>
}

// Shaw relative positions (scores + relative_scores, context + relative_values; the
// adds in either operand order) become relative(rel_k, rel_v) with the clip; the
// directional mask keeps its per-row data operand.
// CHECK-LABEL: func.func @relative
// CHECK-SAME: ([[Q:%[^:]+]]: tensor<?x?x8xf32>, [[K:%[^:]+]]: tensor<?x?x8xf32>, [[V:%[^:]+]]: tensor<?x?x8xf32>, [[LEN:%[^:]+]]: tensor<?xi32>, [[DIRS:%[^:]+]]: tensor<?x?x2xi32>)
// CHECK-DAG: [[RK:%.+]] = lm.weight "layers.0.attn.rel_k" : tensor<5x4xf32>
// CHECK-DAG: [[RV:%.+]] = lm.weight "layers.0.attn.rel_v" : tensor<5x4xf32>
// CHECK: [[A:%.+]] = lm.attention [[Q]], [[K]], [[V]], [[LEN]] data([[DIRS]] : tensor<?x?x2xi32>) relative([[RK]], [[RV]] : tensor<5x4xf32>, tensor<5x4xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<directional>, scale = 5.000000e-01 : f32}
// CHECK-NOT: lm.relative_scores
// CHECK-NOT: lm.relative_values
// CHECK-NOT: lm.add
// CHECK-NOT: lm.softmax
// CHECK: return [[A]]
func.func @relative(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>, %dirs: tensor<?x?x2xi32>) -> tensor<?x?x8xf32> {
  %RK = lm.weight "layers.0.attn.rel_k" : tensor<5x4xf32>
  %RV = lm.weight "layers.0.attn.rel_v" : tensor<5x4xf32>
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %rs = lm.relative_scores %qh, %kh, %RK {clip = 2 : i64} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>, tensor<5x4xf32>) -> tensor<?x2x?x?xf32>
  %s2 = lm.add %s, %rs : tensor<?x2x?x?xf32>
  %sc = lm.scale %s2 {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len data(%dirs : tensor<?x?x2xi32>) {mask = #lm.mask<directional>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %rv = lm.relative_values %p, %RV {clip = 2 : i64} : (tensor<?x2x?x?xf32>, tensor<5x4xf32>) -> tensor<?x2x?x4xf32>
  %c2 = lm.add %rv, %c : tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c2 : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// The probabilities have a second use: the attention is still fused (the pattern
// replaces merge_heads only) and the chain up to the softmax stays for the other use.
// CHECK-LABEL: func.func @probs_escape
// CHECK: lm.split_heads
// CHECK: lm.matmul {{.*}} {transpose_rhs}
// CHECK: [[P:%.+]] = lm.softmax
// CHECK: [[A:%.+]] = lm.attention {{.*}} {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32}
// CHECK-NOT: lm.merge_heads
// CHECK: return [[A]], [[P]]
func.func @probs_escape(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> (tensor<?x?x8xf32>, tensor<?x2x?x?xf32>) {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<none>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r, %p : tensor<?x?x8xf32>, tensor<?x2x?x?xf32>
}

// Not attention: the "scores" product does not transpose K (Q Kh, not Q Kh^T).
// CHECK-LABEL: func.func @scores_not_transposed
// CHECK-NOT: lm.attention
// CHECK: lm.split_heads
// CHECK: lm.matmul
// CHECK: lm.softmax
// CHECK: lm.matmul
// CHECK: lm.merge_heads
// CHECK-NOT: lm.attention
// CHECK: return
func.func @scores_not_transposed(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x4xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<causal>} : tensor<?x2x?x4xf32>, tensor<?xi32> -> tensor<?x2x?x4xf32>
  %p = lm.softmax %m : tensor<?x2x?x4xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// Not the chain: no scale between the scores and the mask.
// CHECK-LABEL: func.func @no_scale
// CHECK-NOT: lm.attention
// CHECK: lm.mask_fill
// CHECK: lm.softmax
// CHECK: lm.merge_heads
// CHECK-NOT: lm.attention
// CHECK: return
func.func @no_scale(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %m = lm.mask_fill %s, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// Not the chain: [train] attention_dropout between the softmax and the value product (the fused op has no
// dropout): the training entry keeps its attention decomposed.
// CHECK-LABEL: func.func @dropped_probs
// CHECK-NOT: lm.attention
// CHECK: lm.softmax
// CHECK-NEXT: lm.dropout
// CHECK: lm.merge_heads
// CHECK-NOT: lm.attention
// CHECK: return
func.func @dropped_probs(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %d = lm.dropout %p {rate = 1.000000e-01 : f64, site = 1048576 : i64} : tensor<?x2x?x?xf32>
  %c = lm.matmul %d, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// Not the chain: the keys are already split (a function argument), so there is no
// unsplit K for lm.attention to take.
// CHECK-LABEL: func.func @keys_not_split
// CHECK-NOT: lm.attention
// CHECK: lm.softmax
// CHECK: lm.merge_heads
// CHECK-NOT: lm.attention
// CHECK: return
func.func @keys_not_split(%q: tensor<?x?x8xf32>, %kh: tensor<?x2x?x4xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %sc = lm.scale %s {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// Not the chain: relative scores without relative values (both or neither).
// CHECK-LABEL: func.func @relative_scores_only
// CHECK-NOT: lm.attention
// CHECK: lm.relative_scores
// CHECK: lm.merge_heads
// CHECK-NOT: lm.attention
// CHECK: return
func.func @relative_scores_only(%q: tensor<?x?x8xf32>, %k: tensor<?x?x8xf32>, %v: tensor<?x?x8xf32>, %len: tensor<?xi32>) -> tensor<?x?x8xf32> {
  %RK = lm.weight "layers.0.attn.rel_k" : tensor<5x4xf32>
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %kh = lm.split_heads %k : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %vh = lm.split_heads %v : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %rs = lm.relative_scores %qh, %kh, %RK {clip = 2 : i64} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>, tensor<5x4xf32>) -> tensor<?x2x?x?xf32>
  %s2 = lm.add %s, %rs : tensor<?x2x?x?xf32>
  %sc = lm.scale %s2 {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  %m = lm.mask_fill %sc, %len {mask = #lm.mask<causal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %p = lm.softmax %m : tensor<?x2x?x?xf32>
  %c = lm.matmul %p, %vh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  %r = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  return %r : tensor<?x?x8xf32>
}

// A bundled model: biLM's three layers, inside lm.mask_and_predict, each become one
// lm.attention (mask none, 8 heads, 1/sqrt(64)).
// MODEL-LABEL: func.func @score
// MODEL: lm.mask_and_predict
// MODEL-NEXT: ^bb0([[M:%.+]]: tensor<?x?xi32>):
// MODEL-NOT: lm.softmax
// MODEL: lm.attention {{.*}} {heads = 8 : i64, mask = #lm.mask<none>, scale = 1.250000e-01 : f32} : {{.*}} -> tensor<?x?x512xf32>
// MODEL-NOT: lm.softmax
// MODEL: lm.attention {{.*}} {heads = 8 : i64, mask = #lm.mask<none>, scale = 1.250000e-01 : f32}
// MODEL-NOT: lm.softmax
// MODEL: lm.attention {{.*}} {heads = 8 : i64, mask = #lm.mask<none>, scale = 1.250000e-01 : f32}
// MODEL-NOT: lm.softmax
// MODEL-NOT: lm.attention
// MODEL-NOT: lm.split_heads
// MODEL-NOT: lm.merge_heads
// MODEL: lm.log_softmax
// MODEL: lm.yield
// MODEL: lm.sentence_score
// MODEL-LABEL: func.func @embed
