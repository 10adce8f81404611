// RUN: lmcc-opt %s | lmcc-opt | FileCheck %s
// Round trip of every lm op: print, re-parse, print again.

// CHECK-LABEL: func.func @layer
func.func @layer(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %rows: tensor<?x?x2xi32>) -> tensor<?x?x8xf32> {
  // CHECK: lm.weight "embed.token" : tensor<11x8xf32>
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %P = lm.weight "embed.position" : tensor<6x8xf32>
  // CHECK: [[X:%.+]] = lm.embed
  %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  // CHECK: lm.positions %{{.+}} table(%{{.+}} : tensor<6x8xf32>)
  %p = lm.positions %ids table(%P : tensor<6x8xf32>) : (tensor<?x?xi32>) -> tensor<?x?x8xf32>
  // CHECK: lm.positions %{{[^ ]+}} : (tensor<?x?xi32>)
  %s = lm.positions %ids : (tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %m = lm.fill_ids %ids {value = 4 : i64} : tensor<?x?xi32>
  %a = lm.add %x, %p : tensor<?x?x8xf32>
  %g = lm.weight "embed.norm.weight" : tensor<8xf32>
  %b = lm.weight "embed.norm.bias" : tensor<8xf32>
  // CHECK: lm.layer_norm {{.*}}epsilon = 9.9999999999999998E-13
  %n = lm.layer_norm %a, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  %W = lm.weight "layers.0.attn.q.weight" : tensor<8x8xf32>
  %q = lm.linear %n, %W, %b : (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  %q2 = lm.linear %n, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
  // CHECK: lm.linear {{.*}} {activation = "gelu_tanh"} : (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>)
  %q3 = lm.linear %n, %W, %b {activation = "gelu_tanh"} : (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<?x?x8xf32>
  // CHECK: lm.split_heads
  %qh = lm.split_heads %q : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
  // CHECK: lm.matmul {{.*}} {transpose_rhs}
  %sc = lm.matmul %qh, %qh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
  %R = lm.weight "layers.0.attn.rel_k" : tensor<5x4xf32>
  %rs = lm.relative_scores %qh, %qh, %R {clip = 2 : i64} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>, tensor<5x4xf32>) -> tensor<?x2x?x?xf32>
  %sc2 = lm.add %sc, %rs : tensor<?x2x?x?xf32>
  %sc3 = lm.scale %sc2 {factor = 5.000000e-01 : f32} : tensor<?x2x?x?xf32>
  // CHECK: lm.mask_fill {{.*}}#lm.mask<diagonal>
  %mf = lm.mask_fill %sc3, %len {mask = #lm.mask<diagonal>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  // CHECK: lm.mask_fill {{.*}} data({{.*}} : tensor<?x?x2xi32>) {mask = #lm.mask<directional>}
  %md = lm.mask_fill %sc3, %len data(%rows : tensor<?x?x2xi32>) {mask = #lm.mask<directional>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
  %pr = lm.softmax %mf : tensor<?x2x?x?xf32>
  // CHECK: lm.dropout {{.*}} {rate = 1.000000e-01 : f64, site = 1048576 : i64, training} : tensor<?x2x?x?xf32>
  %pd = lm.dropout %pr {rate = 0.1 : f64, site = 1048576 : i64, training} : tensor<?x2x?x?xf32>
  %rv = lm.relative_values %pr, %R {clip = 2 : i64} : (tensor<?x2x?x?xf32>, tensor<5x4xf32>) -> tensor<?x2x?x4xf32>
  %ctx = lm.matmul %pr, %qh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
  // CHECK: lm.merge_heads
  %mh = lm.merge_heads %ctx : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
  // CHECK: lm.attention {{.*}} {heads = 2 : i64, mask = #lm.mask<causal>, scale = 5.000000e-01 : f32}
  %at = lm.attention %q, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<causal>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  // CHECK: lm.attention {{.*}} relative({{.*}} : tensor<5x4xf32>, tensor<5x4xf32>)
  %ar = lm.attention %q, %x, %x, %len relative(%R, %R : tensor<5x4xf32>, tensor<5x4xf32>) {clip = 2 : i64, heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
  %ge = lm.gelu %at : tensor<?x?x8xf32>
  // CHECK: lm.gelu {{.*}} {approximate}
  %gt = lm.gelu %ge {approximate} : tensor<?x?x8xf32>
  %re = lm.relu %gt : tensor<?x?x8xf32>
  return %re : tensor<?x?x8xf32>
}

// CHECK-LABEL: func.func @head
func.func @head(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>, tensor<?x8xf32>) {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %bias = lm.weight "head.bias" : tensor<11xf32>
  %logits = lm.linear %h, %E, %bias : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  // CHECK: lm.gather {{.*}} {shift = 1 : i64}
  %g = lm.gather %lp, %ids, %len {shift = 1 : i64} : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  // CHECK: lm.token_logprob
  %t = lm.token_logprob %h, %E, %bias, %ids, %len : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  // CHECK: lm.interpolate {{.*}} {from = 2 : i64, lambda = 4.000000e-01 : f64}
  %mix = lm.interpolate %g, %t {lambda = 4.0e-01 : f64, from = 2 : i64} : tensor<?x?xf32>
  // CHECK: lm.sentence_score {{.*}} {first = 1 : i64, skip = array<i32: 3, 1>}
  %tl, %s, %n = lm.sentence_score %mix, %ids, %len {first = 1 : i64, skip = array<i32: 3, 1>} : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>)
  // CHECK: lm.mean_pool {{.*}} {exclude = array<i32: 3, 1>}
  %e = lm.mean_pool %h, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
  // CHECK: lm.mean_pool {{.*}} {cls, exclude = array<i32>, normalize}
  %c = lm.mean_pool %h, %ids, %len {cls, exclude = array<i32>, normalize} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x8xf32>
  return %tl, %s, %n, %e : tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>, tensor<?x8xf32>
}

// CHECK-LABEL: func.func @pll
func.func @pll(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  // CHECK: lm.mask_and_predict {{.*}} {mask_token = 4 : i64}
  // CHECK: ^bb0([[M:%.+]]: tensor<?x?xi32>):
  // CHECK: lm.embed {{.*}}[[[M]]]
  // CHECK: lm.yield
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %lp = lm.log_softmax %x : tensor<?x?x8xf32>
    %g = lm.gather %lp, %ids, %len : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %g : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// The Diformer's rows (issue 19): decoder queries, per-direction targets, the length head.
// CHECK-LABEL: func.func @diformer
func.func @diformer(%tgt: tensor<?x?xi32>, %rows: tensor<?x?x2xi32>, %len: tensor<?xi32>, %h: tensor<?x?x8xf32>) -> (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xf32>) {
  %D = lm.weight "decoder.direction" : tensor<3x8xf32>
  %P = lm.weight "decoder.position.l2r" : tensor<9x8xf32>
  %Q = lm.weight "decoder.position.r2l" : tensor<9x8xf32>
  %W = lm.weight "length.weight" : tensor<9x8xf32>
  // CHECK: lm.decoder_queries
  %q = lm.decoder_queries %rows, %len, %D, %P, %Q : (tensor<?x?x2xi32>, tensor<?xi32>, tensor<3x8xf32>, tensor<9x8xf32>, tensor<9x8xf32>) -> tensor<?x?x8xf32>
  // CHECK: lm.directional_targets
  %t = lm.directional_targets %tgt, %rows, %len : (tensor<?x?xi32>, tensor<?x?x2xi32>, tensor<?xi32>) -> tensor<?x?xi32>
  // CHECK: lm.length_logprob
  %l = lm.length_logprob %h, %len, %W, %len : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>, tensor<?xi32>) -> tensor<?xf32>
  // CHECK: lm.length_logprob {{.*}} -> tensor<?x9xf32>
  %all = lm.length_logprob %h, %len, %W : (tensor<?x?x8xf32>, tensor<?xi32>, tensor<9x8xf32>) -> tensor<?x9xf32>
  return %q, %t, %l : tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xf32>
}

// The n-gram heads (issue 18).
// CHECK-LABEL: func.func @ngram
func.func @ngram(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %h: tensor<?x?x8xf32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %b = lm.weight "head.bias" : tensor<11xf32>
  // CHECK: lm.wdr_conjugate %{{.+}}, %{{.+}}, %{{.+}} {head = 3 : i64}
  %c = lm.wdr_conjugate %E, %ids, %len {head = 3 : i64} : (tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  // CHECK: lm.ngram_ensemble {{.*}} {lambda = 4.000000e-01 : f64}
  %m = lm.ngram_ensemble %h, %c, %len {lambda = 4.000000e-01 : f64} : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x?x8xf32>
  // CHECK: lm.ngram_loss heads({{.*}}) weight({{.*}}) bias({{.*}}) targets({{.*}}) {smoothing = 1.000000e-01 : f64}
  %ce, %l1, %l2 = lm.ngram_loss heads(%h, %m : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%E : tensor<11x8xf32>)
      bias(%b : tensor<11xf32>) targets(%ids, %len : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.000000e-01 : f64}
      -> tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
  // CHECK: lm.ngram_loss_grad heads({{.*}}) weight({{.*}}) bias({{.*}}) targets({{.*}}) lse({{.*}})
  %d1, %d2, %dE, %db = lm.ngram_loss_grad heads(%h, %m : tensor<?x?x8xf32>, tensor<?x?x8xf32>)
      weight(%E : tensor<11x8xf32>) bias(%b : tensor<11xf32>) targets(%ids, %len : tensor<?x?xi32>, tensor<?xi32>)
      lse(%l1, %l2 : tensor<?x?xf32>, tensor<?x?xf32>) {smoothing = 1.000000e-01 : f64}
      -> tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>
  // CHECK: lm.ngram_loss_and_grad heads({{.*}}) weight({{.*}}) bias({{.*}}) targets({{.*}}) {smoothing = 1.000000e-01 : f64} -> tensor<?x?xf32> lse(tensor<?x?xf32>, tensor<?x?xf32>) d_heads(tensor<?x?x8xf32>, tensor<?x?x8xf32>) tensor<11x8xf32>, tensor<11xf32>
  %ce2, %m1, %m2, %e1, %e2, %eE, %eb = lm.ngram_loss_and_grad heads(%h, %m : tensor<?x?x8xf32>, tensor<?x?x8xf32>)
      weight(%E : tensor<11x8xf32>) bias(%b : tensor<11xf32>) targets(%ids, %len : tensor<?x?xi32>, tensor<?xi32>)
      {smoothing = 1.000000e-01 : f64} -> tensor<?x?xf32> lse(tensor<?x?xf32>, tensor<?x?xf32>)
      d_heads(tensor<?x?x8xf32>, tensor<?x?x8xf32>) tensor<11x8xf32>, tensor<11xf32>
  return %ce : tensor<?x?xf32>
}

// lm.token_loss_and_grad (lm-fuse-loss-grad's), with a bias and per_length.
// CHECK-LABEL: func.func @token_loss_and_grad
func.func @token_loss_and_grad(%h: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %b: tensor<11xf32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<11x8xf32> {
  // CHECK: lm.token_loss_and_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} {per_length, smoothing = 1.000000e-01 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
  %ce, %lse, %dh, %dE, %db = lm.token_loss_and_grad %h, %E, %b, %y, %len {per_length, smoothing = 1.0e-01 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
  return %dE : tensor<11x8xf32>
}

// lm.embed_grad, plain and added into a tied table's other gradient.
// CHECK-LABEL: func.func @embed_grad
func.func @embed_grad(%dy: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>, %dW: tensor<11x8xf32>) -> tensor<11x8xf32> {
  // CHECK: lm.embed_grad %{{.+}}, %{{.+}}, %{{.+}} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x8xf32>
  %a = lm.embed_grad %dy, %ids, %len : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<11x8xf32>
  // CHECK: lm.embed_grad %{{.+}}, %{{.+}}, %{{.+}} into(%{{.+}}) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<11x8xf32>) -> tensor<11x8xf32>
  %b = lm.embed_grad %dy, %ids, %len into(%a) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<11x8xf32>) -> tensor<11x8xf32>
  return %b : tensor<11x8xf32>
}

// The rows a training loss predicts (lm-prune-loss-rows): packed per sentence and put back.
// CHECK-LABEL: func.func @target_rows
func.func @target_rows(%h: tensor<?x?x8xf32>, %y: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?x8xf32>, tensor<?x?xf32>) {
  // CHECK: [[R:%.+]], [[T:%.+]] = lm.target_rows %{{.+}}, %{{.+}} : (tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xi32>, tensor<?x?xi32>)
  %rows, %row_targets = lm.target_rows %y, %len : (tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xi32>, tensor<?x?xi32>)
  // CHECK: [[G:%.+]] = lm.gather_rows %{{.+}}, [[R]] : (tensor<?x?x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %g = lm.gather_rows %h, %rows : (tensor<?x?x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  // CHECK: lm.dropout [[G]] rows([[R]] : tensor<?x?xi32>) {rate = 1.000000e-01 : f64, site = 3 : i64, training} : tensor<?x?x8xf32>
  %gd = lm.dropout %g rows(%rows : tensor<?x?xi32>) {rate = 0.1 : f64, site = 3 : i64, training} : tensor<?x?x8xf32>
  // CHECK: lm.dropout_grad %{{.+}} rows([[R]] : tensor<?x?xi32>) {rate = 1.000000e-01 : f64, site = 3 : i64} : tensor<?x?x8xf32>
  %gg = lm.dropout_grad %gd rows(%rows : tensor<?x?xi32>) {rate = 0.1 : f64, site = 3 : i64} : tensor<?x?x8xf32>
  // CHECK: lm.scatter_rows %{{.+}}, [[R]], %{{.+}} : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
  %s = lm.scatter_rows %gg, %rows, %h : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
  %ce = lm.gather_rows %s, %rows : (tensor<?x?x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  %c2 = arith.constant dense<0.0> : tensor<2x3xf32>
  %f = tensor.cast %c2 : tensor<2x3xf32> to tensor<?x?xf32>
  // CHECK: lm.scatter_rows %{{.+}}, [[R]], %{{.+}} : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32>
  %placed = lm.scatter_rows %f, %rows, %y : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32>
  return %ce, %placed : tensor<?x?x8xf32>, tensor<?x?xf32>
}
