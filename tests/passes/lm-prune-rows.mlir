// RUN: lmcc-opt %s --lm-prune-rows | FileCheck %s
// RUN: lmcc emit-mlir %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-batch-mask-predict --lm-prune-rows | FileCheck %s --check-prefix=BILM
// lm-prune-rows: copy c of an lm.masked_batch keeps only row positions[c] of what the
// body yields, so walking back from the yield
//   row(op(x))            = op(row(x))                       (row-local ops),
//   row(attention(q,k,v)) = attention(row(q), k, v) query_positions(positions),
//   row(x)                = lm.take_row x, positions          (anything else, and
//                                                              values needed in full),
// and the yield becomes [C, 1, ...]. d_model 8, 2 heads, vocab 11.

// A chain of row-local ops after a non-row-local one (the embedding):
// row(token_logprob(gelu(linear(x)))) = token_logprob(gelu(linear(take_row(x))),
// take_row(targets)). The full-size linear and gelu are gone.
// CHECK-LABEL: func.func @chain
// CHECK: lm.masked_batch
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// CHECK-DAG: [[TR:%.+]] = lm.take_row [[T]], [[P]] : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x1xi32>
// CHECK-DAG: [[E:%.+]] = lm.weight "embed.token"
// CHECK-DAG: [[W:%.+]] = lm.weight "w"
// CHECK: [[X:%.+]] = lm.embed [[E]][[[C]]] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
// CHECK-NEXT: [[XR:%.+]] = lm.take_row [[X]], [[P]] : (tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x1x8xf32>
// CHECK-NOT: tensor<?x?x8xf32>
// CHECK: [[H:%.+]] = lm.linear [[XR]], [[W]] : (tensor<?x1x8xf32>, tensor<8x8xf32>) -> tensor<?x1x8xf32>
// CHECK-NEXT: [[G:%.+]] = lm.gelu [[H]] : tensor<?x1x8xf32>
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[G]], [[E]], [[TR]], [[CL]] : (tensor<?x1x8xf32>, tensor<11x8xf32>, tensor<?x1xi32>, tensor<?xi32>) -> tensor<?x1xf32>
// CHECK-NEXT: lm.yield [[TL]] : tensor<?x1xf32>
func.func @chain(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %x = lm.embed %E[%copies] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %h = lm.linear %x, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %g = lm.gelu %h : tensor<?x?x8xf32>
    %t = lm.token_logprob %g, %E, %targets, %clen : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// One attention layer: the query projection and the residual need only the kept
// row, the keys and values every row. x is needed in full (by the key and value
// projections), so it is computed once in full and its row is read with one
// take_row, shared by the query projection and the residual add. The attention
// computes one query row per copy (query_positions); K and V stay [C, N, 8].
// CHECK-LABEL: func.func @attention_layer
// CHECK: lm.masked_batch
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// CHECK-DAG: [[TR:%.+]] = lm.take_row [[T]], [[P]]
// CHECK-DAG: [[WQ:%.+]] = lm.weight "q"
// CHECK-DAG: [[WK:%.+]] = lm.weight "k"
// CHECK-DAG: [[WV:%.+]] = lm.weight "v"
// CHECK-DAG: [[X:%.+]] = lm.embed %{{.+}}[[[C]]] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
// CHECK-DAG: [[XR:%.+]] = lm.take_row [[X]], [[P]] : (tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x1x8xf32>
// CHECK-DAG: [[Q:%.+]] = lm.linear [[XR]], [[WQ]] : (tensor<?x1x8xf32>, tensor<8x8xf32>) -> tensor<?x1x8xf32>
// CHECK-DAG: [[K:%.+]] = lm.linear [[X]], [[WK]] : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
// CHECK-DAG: [[V:%.+]] = lm.linear [[X]], [[WV]] : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
// CHECK: [[A:%.+]] = lm.attention [[Q]], [[K]], [[V]], [[CL]] query_positions([[P]] : tensor<?xi32>) {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x1x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x1x8xf32>
// CHECK-NEXT: [[H:%.+]] = lm.add [[XR]], [[A]] : tensor<?x1x8xf32>
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[H]], %{{.+}}, [[TR]], [[CL]] : (tensor<?x1x8xf32>, tensor<11x8xf32>, tensor<?x1xi32>, tensor<?xi32>) -> tensor<?x1xf32>
// CHECK-NEXT: lm.yield [[TL]] : tensor<?x1xf32>
// CHECK-NOT: lm.linear [[X]], [[WQ]]
// CHECK: return
func.func @attention_layer(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %Wq = lm.weight "q" : tensor<8x8xf32>
    %Wk = lm.weight "k" : tensor<8x8xf32>
    %Wv = lm.weight "v" : tensor<8x8xf32>
    %x = lm.embed %E[%copies] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %q = lm.linear %x, %Wq : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %k = lm.linear %x, %Wk : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %v = lm.linear %x, %Wv : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %a = lm.attention %q, %k, %v, %clen {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %h = lm.add %x, %a : tensor<?x?x8xf32>
    %t = lm.token_logprob %h, %E, %targets, %clen : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Not row-local: a causal head (shift 1) reads row t - 1 for row t, and an
// attention with per-row mask data has no one-query form. Both are computed in full
// and their row is taken; what lies before them stays full.
// CHECK-LABEL: func.func @not_prunable
// CHECK: lm.masked_batch
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// CHECK: [[A:%.+]] = lm.attention %{{.+}}, %{{.+}}, %{{.+}}, [[CL]] data(%{{.+}} : tensor<?x?x2xi32>) {heads = 2 : i64, mask = #lm.mask<directional>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[A]], %{{.+}}, [[T]], [[CL]] {shift = 1 : i64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
// CHECK-NEXT: [[TLR:%.+]] = lm.take_row [[TL]], [[P]] : (tensor<?x?xf32>, tensor<?xi32>) -> tensor<?x1xf32>
// CHECK-NEXT: lm.yield [[TLR]] : tensor<?x1xf32>
func.func @not_prunable(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %rows: tensor<?x?x2xi32>) -> tensor<?x?xf32> {
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%copies] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %a = lm.attention %x, %x, %x, %clen data(%rows : tensor<?x?x2xi32>) {heads = 2 : i64, mask = #lm.mask<directional>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %t = lm.token_logprob %a, %E, %targets, %clen {shift = 1 : i64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Already pruned (the yield is [C, 1]): left alone.
// CHECK-LABEL: func.func @already_pruned
// CHECK: ^bb0(
// CHECK-NEXT: lm.weight
// CHECK-NEXT: lm.token_logprob
// CHECK-NEXT: lm.yield %{{.+}} : tensor<?x1xf32>
func.func @already_pruned(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %h: tensor<?x1x8xf32>) -> tensor<?x?xf32> {
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %t = lm.token_logprob %h, %E, %targets, %clen : (tensor<?x1x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x1xf32>
    lm.yield %t : tensor<?x1xf32>
  }
  return %r : tensor<?x?xf32>
}

// tiny_bilm (d 30, 3 heads, vocab 67, 2 layers) after fuse-attention, fuse-logprob
// and batch-mask-predict: the first layer runs on whole copies, the last layer's
// query side and the head on one row per copy.
// BILM-LABEL: func.func @score
// BILM: [[R:%.+]] = lm.masked_batch
// BILM-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// BILM-NEXT: [[TR:%.+]] = lm.take_row [[T]], [[P]] : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x1xi32>
// First layer: unpruned (whole copies, no query_positions).
// BILM: [[WQ0:%.+]] = lm.weight "layers.0.attn.q.weight"
// BILM: [[Q0:%.+]] = lm.linear %{{.+}}, [[WQ0]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM: lm.attention [[Q0]], %{{.+}}, %{{.+}}, [[CL]] {heads = 3 : i64, mask = #lm.mask<none>, scale = {{.+}} : f32} : tensor<?x?x30xf32>, tensor<?x?x30xf32>, tensor<?x?x30xf32>, tensor<?xi32> -> tensor<?x?x30xf32>
// The first layer's output is needed in full (keys and values of the last layer).
// BILM: [[G0:%.+]] = lm.weight "layers.0.ffn_norm.weight"
// BILM: [[H:%.+]] = lm.layer_norm %{{.+}}, [[G0]], %{{.+}} -> tensor<?x?x30xf32>
// BILM-NEXT: [[HR:%.+]] = lm.take_row [[H]], [[P]] : (tensor<?x?x30xf32>, tensor<?xi32>) -> tensor<?x1x30xf32>
// Last layer: one query row per copy, keys and values of every row.
// BILM-DAG: [[WQ1:%.+]] = lm.weight "layers.1.attn.q.weight"
// BILM-DAG: [[WK1:%.+]] = lm.weight "layers.1.attn.k.weight"
// BILM-DAG: [[WV1:%.+]] = lm.weight "layers.1.attn.v.weight"
// BILM-DAG: [[Q1:%.+]] = lm.linear [[HR]], [[WQ1]], %{{.+}} : (tensor<?x1x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x1x30xf32>
// BILM-DAG: [[K1:%.+]] = lm.linear [[H]], [[WK1]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM-DAG: [[V1:%.+]] = lm.linear [[H]], [[WV1]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM: [[A1:%.+]] = lm.attention [[Q1]], [[K1]], [[V1]], [[CL]] query_positions([[P]] : tensor<?xi32>) {heads = 3 : i64, mask = #lm.mask<none>, scale = {{.+}} : f32} : tensor<?x1x30xf32>, tensor<?x?x30xf32>, tensor<?x?x30xf32>, tensor<?xi32> -> tensor<?x1x30xf32>
// Nothing after it is full-size: the residual reads the taken row, the head runs on [C, 1, 30].
// BILM-NOT: -> tensor<?x?x
// BILM: lm.add [[HR]], %{{.+}} : tensor<?x1x30xf32>
// BILM-NOT: -> tensor<?x?x
// BILM: [[TL:%.+]] = lm.token_logprob %{{.+}}, %{{.+}}, %{{.+}}, [[TR]], [[CL]] : (tensor<?x1x30xf32>, tensor<67x30xf32>, tensor<67xf32>, tensor<?x1xi32>, tensor<?xi32>) -> tensor<?x1xf32>
// BILM-NEXT: lm.yield [[TL]] : tensor<?x1xf32>
// BILM-NEXT: }
// The batch's result keeps its [B, N] type; scoring reads it as before.
// BILM-NEXT: lm.sentence_score [[R]], %{{.+}} : (tensor<?x?xf32>,
// @embed (mean-pooled mask-and-predict hidden states) yields [C, 1, 30].
// BILM-LABEL: func.func @embed
// BILM: lm.attention {{.*}} query_positions
// BILM: lm.yield %{{.+}} : tensor<?x1x30xf32>
// BILM-LABEL: func.func @logits
// BILM-NOT: lm.take_row
// BILM-NOT: query_positions
// BILM: return
