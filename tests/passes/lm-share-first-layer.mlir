// RUN: lmcc-opt %s --lm-share-first-layer | FileCheck %s
// RUN: lmcc emit-mlir %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-batch-mask-predict --lm-share-first-layer | FileCheck %s --check-prefix=BILM
// RUN: lmcc emit-mlir %inputs/specs/tiny_bilm.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-batch-mask-predict --lm-share-first-layer --lm-prune-rows | FileCheck %s --check-prefix=PRUNED
// lm-share-first-layer: inside lm.masked_batch, copy c = (b, i) equals sentence b
// except at row i ([MASK]). The values computed from the copies' ids by row-local
// ops and weights only (embeddings, positions, embedding norm, first-layer
// projections) are computed twice before the batch, on the sentence ids and on
// all-[MASK] ids (lm.fill_ids with the batch's mask token), and each one the rest of
// the body reads becomes lm.splice_copies(sentence, masked, positions).
// d_model 8, 2 heads, vocab 11, max_len 16.

// CHECK-LABEL: func.func @shared
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK: [[E:%.+]] = lm.weight "embed.token"
// CHECK-NEXT: [[MIDS:%.+]] = lm.fill_ids [[IDS]] {value = 7 : i64} : tensor<?x?xi32>
// CHECK-DAG: [[PT:%.+]] = lm.weight "embed.position"
// CHECK-DAG: [[W:%.+]] = lm.weight "w"
// CHECK-DAG: [[XS:%.+]] = lm.embed [[E]][[[IDS]]]
// CHECK-DAG: [[XM:%.+]] = lm.embed [[E]][[[MIDS]]]
// CHECK-DAG: [[PS:%.+]] = lm.positions [[IDS]] table([[PT]] : tensor<16x8xf32>)
// CHECK-DAG: [[PM:%.+]] = lm.positions [[MIDS]] table([[PT]] : tensor<16x8xf32>)
// CHECK-DAG: [[SS:%.+]] = lm.add [[XS]], [[PS]] : tensor<?x?x8xf32>
// CHECK-DAG: [[SM:%.+]] = lm.add [[XM]], [[PM]] : tensor<?x?x8xf32>
// CHECK-DAG: [[QS:%.+]] = lm.linear [[SS]], [[W]] :
// CHECK-DAG: [[QM:%.+]] = lm.linear [[SM]], [[W]] :
// CHECK: [[R:%.+]] = lm.masked_batch [[IDS]], [[LEN]] {mask_token = 7 : i64}
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// Only the frontier is spliced (s and q, read by the attention); x and p, read only
// inside the shared chain, are not.
// CHECK-NEXT: [[SC:%.+]] = lm.splice_copies [[SS]], [[SM]], [[P]], [[O]], [[EN]] : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
// CHECK-NEXT: [[QC:%.+]] = lm.splice_copies [[QS]], [[QM]], [[P]], [[O]], [[EN]] : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
// CHECK-NOT: lm.embed
// CHECK-NOT: lm.positions
// CHECK-DAG: [[A:%.+]] = lm.attention [[QC]], [[SC]], [[SC]], [[CL]]
// After the attention nothing is shared: the output projection stays in the batch
// (its weight too).
// CHECK-DAG: [[WI:%.+]] = lm.weight "w"
// CHECK: [[H:%.+]] = lm.linear [[A]], [[WI]] :
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[H]], [[E]], [[T]], [[CL]] :
// CHECK-NEXT: lm.yield [[TL]]
func.func @shared(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %r = lm.masked_batch %ids, %len {mask_token = 7 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %P = lm.weight "embed.position" : tensor<16x8xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %x = lm.embed %E[%copies] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %p = lm.positions %copies table(%P : tensor<16x8xf32>) : (tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %s = lm.add %x, %p : tensor<?x?x8xf32>
    %q = lm.linear %s, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %a = lm.attention %q, %s, %s, %clen {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %h = lm.linear %a, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %t = lm.token_logprob %h, %E, %targets, %clen : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Nothing derives from the copies' ids by row-local ops (the body embeds the
// targets, the original ids): nothing to share, no fill_ids, no splice.
// CHECK-LABEL: func.func @nothing_to_share
// CHECK-NOT: lm.fill_ids
// CHECK: lm.masked_batch
// CHECK-NEXT: ^bb0(
// CHECK-NEXT: lm.weight "embed.token"
// CHECK-NEXT: lm.embed
// CHECK-NOT: lm.splice_copies
// CHECK: lm.yield
func.func @nothing_to_share(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %r = lm.masked_batch %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%copies: tensor<?x?xi32>, %clen: tensor<?xi32>, %targets: tensor<?x?xi32>, %pos: tensor<?xi32>, %own: tensor<?xi32>, %ends: tensor<?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%targets] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %a = lm.attention %x, %x, %x, %clen {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %t = lm.token_logprob %a, %E, %targets, %clen : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// tiny_bilm (d 30, 3 heads, 2 layers, [MASK] = 4) after fuse-attention, fuse-logprob
// and batch-mask-predict.
// BILM-LABEL: func.func @score
// BILM-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>, [[SP:%[^:]+]]: tensor<?x?xi32>)
// BILM-NEXT: [[MIDS:%.+]] = lm.fill_ids [[IDS]] {value = 4 : i64} : tensor<?x?xi32>
// Embeddings and embedding norm, once on the sentence, once on [MASK]:
// BILM: [[E:%.+]] = lm.weight "embed.token" : tensor<67x30xf32>
// BILM-NEXT: [[XS:%.+]] = lm.embed [[E]][[[IDS]]]
// BILM-NEXT: [[XM:%.+]] = lm.embed [[E]][[[MIDS]]]
// BILM: [[HS:%.+]] = lm.layer_norm
// BILM-NEXT: [[HM:%.+]] = lm.layer_norm
// First-layer Q, K, V projections: twice each, outside the batch.
// BILM: [[WQ:%.+]] = lm.weight "layers.0.attn.q.weight"
// BILM: [[QS:%.+]] = lm.linear [[HS]], [[WQ]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM-NEXT: [[QM:%.+]] = lm.linear [[HM]], [[WQ]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM: [[WK:%.+]] = lm.weight "layers.0.attn.k.weight"
// BILM: [[KS:%.+]] = lm.linear [[HS]], [[WK]], %{{.+}} :
// BILM-NEXT: [[KM:%.+]] = lm.linear [[HM]], [[WK]], %{{.+}} :
// BILM: [[WV:%.+]] = lm.weight "layers.0.attn.v.weight"
// BILM: [[VS:%.+]] = lm.linear [[HS]], [[WV]], %{{.+}} :
// BILM-NEXT: [[VM:%.+]] = lm.linear [[HM]], [[WV]], %{{.+}} :
// No other projection is hoisted (the output projection reads the attention).
// BILM-NOT: lm.linear
// BILM: [[R:%.+]] = lm.masked_batch [[IDS]], [[LEN]] spans([[SP]]) {mask_token = 4 : i64}
// BILM-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// The embedding norm output (the first residual) and Q, K, V are spliced and feed
// the first attention.
// BILM-NEXT: [[HC:%.+]] = lm.splice_copies [[HS]], [[HM]], [[P]], [[O]], [[EN]] : (tensor<?x?x30xf32>, tensor<?x?x30xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>) -> tensor<?x?x30xf32>
// BILM-NEXT: [[QC:%.+]] = lm.splice_copies [[QS]], [[QM]], [[P]], [[O]], [[EN]] :
// BILM-NEXT: [[KC:%.+]] = lm.splice_copies [[KS]], [[KM]], [[P]], [[O]], [[EN]] :
// BILM-NEXT: [[VC:%.+]] = lm.splice_copies [[VS]], [[VM]], [[P]], [[O]], [[EN]] :
// BILM-NEXT: lm.attention [[QC]], [[KC]], [[VC]], [[CL]] {heads = 3 : i64, mask = #lm.mask<none>
// BILM-NOT: layers.0.attn.q.weight
// BILM-NOT: lm.embed
// BILM: lm.add [[HC]], %{{.+}} : tensor<?x?x30xf32>
// The second layer's projections stay inside the batch, on whole copies.
// BILM: [[WQ1:%.+]] = lm.weight "layers.1.attn.q.weight"
// BILM: lm.linear %{{.+}}, [[WQ1]], %{{.+}} : (tensor<?x?x30xf32>, tensor<30x30xf32>, tensor<30xf32>) -> tensor<?x?x30xf32>
// BILM: [[WK1:%.+]] = lm.weight "layers.1.attn.k.weight"
// BILM: lm.linear %{{.+}}, [[WK1]], %{{.+}} :
// BILM: [[WV1:%.+]] = lm.weight "layers.1.attn.v.weight"
// BILM: lm.linear %{{.+}}, [[WV1]], %{{.+}} :
// BILM: lm.attention {{.*}}, [[CL]] {heads = 3 : i64
// BILM-NOT: lm.splice_copies
// BILM: lm.token_logprob {{.*}}, [[T]], [[CL]] :
// BILM-NEXT: lm.yield
// @embed has the same mask-and-predict body: shared too.
// BILM-LABEL: func.func @embed
// BILM-NEXT: lm.fill_ids %{{.+}} {value = 4 : i64}
// BILM: lm.masked_batch
// BILM-NEXT: ^bb0(
// BILM-NEXT: lm.splice_copies
// BILM-LABEL: func.func @logits
// BILM-NOT: lm.fill_ids
// BILM-NOT: lm.splice_copies
// BILM: return

// With lm-prune-rows after it: the spliced first layer stays whole, the last layer
// and the head run on one row per copy.
// PRUNED-LABEL: func.func @score
// PRUNED: lm.fill_ids
// PRUNED: lm.masked_batch
// PRUNED-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// PRUNED: lm.splice_copies
// PRUNED-NEXT: [[QC:%.+]] = lm.splice_copies
// PRUNED-NEXT: [[KC:%.+]] = lm.splice_copies
// PRUNED-NEXT: [[VC:%.+]] = lm.splice_copies
// PRUNED-NEXT: lm.attention [[QC]], [[KC]], [[VC]], [[CL]] {heads = 3 : i64, {{.*}} -> tensor<?x?x30xf32>
// PRUNED: lm.attention {{.*}}, [[CL]] query_positions([[P]] : tensor<?xi32>) {{.*}} -> tensor<?x1x30xf32>
// PRUNED: lm.token_logprob {{.*}} -> tensor<?x1xf32>
// PRUNED-NEXT: lm.yield %{{.+}} : tensor<?x1xf32>
