// RUN: lmcc-opt %s --lm-batch-mask-predict -verify-diagnostics | FileCheck %s
// RUN: lmcc emit-mlir %models/bilm_base.toml | lmcc-opt --lm-fuse-attention --lm-batch-mask-predict | FileCheck %s --check-prefix=MODEL --implicit-check-not=lm.mask_and_predict
// lm-batch-mask-predict: lm.mask_and_predict (n forward passes, one per masked
// position) ==> lm.masked_batch (one pass over all sum(lengths) masked copies). The
// body moves as is; its block argument becomes the copies' ids, and the outer values
// it captured with the sentence batch as leading dimension become the batch's
// per-copy block arguments: outer lengths -> copy lengths, outer ids (gather
// targets) -> targets. Weights (batch-free) stay captured. d_model 8, 2 heads, vocab 11.

// The attention reads the outer lengths, the gather the outer ids.
// CHECK-LABEL: func.func @pll
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK: [[E:%.+]] = lm.weight "embed.token" : tensor<11x8xf32>
// CHECK-NOT: lm.mask_and_predict
// CHECK: [[R:%.+]] = lm.masked_batch [[IDS]], [[LEN]] {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// CHECK-NEXT: [[X:%.+]] = lm.embed [[E]][[[C]]] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
// CHECK-NEXT: [[A:%.+]] = lm.attention [[X]], [[X]], [[X]], [[CL]] {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32}
// CHECK-NEXT: [[L:%.+]] = lm.linear [[A]], [[E]] :
// CHECK-NEXT: [[LP:%.+]] = lm.log_softmax [[L]] : tensor<?x?x11xf32>
// CHECK-NEXT: [[G:%.+]] = lm.gather [[LP]], [[T]], [[CL]] : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
// CHECK-NEXT: lm.yield [[G]] : tensor<?x?xf32>
// CHECK-NEXT: }
// CHECK-NOT: lm.mask_and_predict
// CHECK-NEXT: return [[R]]
func.func @pll(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %a = lm.attention %x, %x, %x, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %logits = lm.linear %a, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
    %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
    %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %g : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// The decomposed form (weights inside the body, the outer lengths in lm.mask_fill,
// the outer ids as token_logprob targets, mask token 103).
// CHECK-LABEL: func.func @decomposed
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK-NOT: lm.mask_and_predict
// CHECK: [[R:%.+]] = lm.masked_batch [[IDS]], [[LEN]] {mask_token = 103 : i64}
// CHECK-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// CHECK-NEXT: [[E:%.+]] = lm.weight "embed.token" : tensor<11x8xf32>
// CHECK-NEXT: [[X:%.+]] = lm.embed [[E]][[[C]]]
// CHECK-NEXT: [[XH:%.+]] = lm.split_heads [[X]]
// CHECK-NEXT: [[S:%.+]] = lm.matmul [[XH]], [[XH]] {transpose_rhs}
// CHECK-NEXT: [[M:%.+]] = lm.mask_fill [[S]], [[CL]] {mask = #lm.mask<none>}
// CHECK-NEXT: [[PR:%.+]] = lm.softmax [[M]]
// CHECK-NEXT: [[CX:%.+]] = lm.matmul [[PR]], [[XH]]
// CHECK-NEXT: [[H:%.+]] = lm.merge_heads [[CX]]
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[H]], [[E]], [[T]], [[CL]] :
// CHECK-NEXT: lm.yield [[TL]]
// CHECK-NEXT: }
// CHECK-NEXT: return [[R]]
func.func @decomposed(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %r = lm.mask_and_predict %ids, %len {mask_token = 103 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %xh = lm.split_heads %x : (tensor<?x?x8xf32>) -> tensor<?x2x?x4xf32>
    %s = lm.matmul %xh, %xh {transpose_rhs} : (tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x?xf32>
    %m = lm.mask_fill %s, %len {mask = #lm.mask<none>} : tensor<?x2x?x?xf32>, tensor<?xi32> -> tensor<?x2x?x?xf32>
    %p = lm.softmax %m : tensor<?x2x?x?xf32>
    %c = lm.matmul %p, %xh : (tensor<?x2x?x?xf32>, tensor<?x2x?x4xf32>) -> tensor<?x2x?x4xf32>
    %h = lm.merge_heads %c : (tensor<?x2x?x4xf32>) -> tensor<?x?x8xf32>
    %t = lm.token_logprob %h, %E, %ids, %len : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Not batchable: the body adds an outer per-sentence [B, N, 8] tensor, which has no
// per-copy version. The op is left as n passes (with a remark) and unchanged.
// CHECK-LABEL: func.func @captures_hidden
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>, [[HID:%[^:]+]]: tensor<?x?x8xf32>)
// CHECK-NOT: lm.masked_batch
// CHECK: [[R:%.+]] = lm.mask_and_predict [[IDS]], [[LEN]] {mask_token = 4 : i64}
// CHECK-NEXT: ^bb0([[M:%[^:]+]]: tensor<?x?xi32>):
// CHECK-NEXT: [[X:%.+]] = lm.embed %{{.+}}[[[M]]]
// CHECK-NEXT: [[Y:%.+]] = lm.add [[X]], [[HID]] : tensor<?x?x8xf32>
// CHECK-NEXT: [[TL:%.+]] = lm.token_logprob [[Y]], %{{.+}}, [[IDS]], [[LEN]] :
// CHECK-NEXT: lm.yield [[TL]]
// CHECK-NOT: lm.masked_batch
// CHECK: return [[R]]
func.func @captures_hidden(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %hidden: tensor<?x?x8xf32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  // expected-remark @+1 {{lm-batch-mask-predict: the body captures batch-shaped values; left as n passes}}
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %y = lm.add %x, %hidden : tensor<?x?x8xf32>
    %t = lm.token_logprob %y, %E, %ids, %len : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Not batchable either: a value computed outside from the sentence ids (here the
// outer embedding) is batch-shaped even though the body only reads it.
// CHECK-LABEL: func.func @captures_outer_embedding
// CHECK-NOT: lm.masked_batch
// CHECK: lm.mask_and_predict
// CHECK-NOT: lm.masked_batch
// CHECK: return
func.func @captures_outer_embedding(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %outer = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
  // expected-remark @+1 {{the body captures batch-shaped values}}
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %a = lm.attention %x, %outer, %outer, %len {heads = 2 : i64, mask = #lm.mask<none>, scale = 5.000000e-01 : f32} : tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32> -> tensor<?x?x8xf32>
    %t = lm.token_logprob %a, %E, %ids, %len : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %t : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// biLM base: both mask-and-predict entries (@score and @embed) become masked
// batches; the attentions read the copy lengths, the gather the targets. No
// lm.mask_and_predict is left anywhere (--implicit-check-not).
// MODEL-LABEL: func.func @score
// MODEL-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>, [[SP:%[^:]+]]: tensor<?x?xi32>)
// MODEL: [[R:%.+]] = lm.masked_batch [[IDS]], [[LEN]] spans([[SP]]) {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32> {
// MODEL-NEXT: ^bb0([[C:%[^:]+]]: tensor<?x?xi32>, [[CL:%[^:]+]]: tensor<?xi32>, [[T:%[^:]+]]: tensor<?x?xi32>, [[P:%[^:]+]]: tensor<?xi32>, [[O:%[^:]+]]: tensor<?xi32>, [[EN:%[^:]+]]: tensor<?xi32>):
// MODEL: lm.embed %{{.+}}[[[C]]]
// MODEL: lm.attention {{.*}}, [[CL]] {heads = 8 : i64, mask = #lm.mask<none>, scale = 1.250000e-01 : f32}
// MODEL: lm.attention {{.*}}, [[CL]] {heads = 8 : i64
// MODEL: lm.attention {{.*}}, [[CL]] {heads = 8 : i64
// MODEL: [[LP:%.+]] = lm.log_softmax
// MODEL-NEXT: [[G:%.+]] = lm.gather [[LP]], [[T]], [[CL]] :
// MODEL-NEXT: lm.yield [[G]] : tensor<?x?xf32>
// MODEL: lm.sentence_score [[R]], [[IDS]], [[LEN]]
// MODEL-LABEL: func.func @embed
// MODEL: lm.masked_batch
// MODEL-LABEL: func.func @logits
// MODEL-NOT: lm.masked_batch
// MODEL: return

// Spans (word-l2r PLL, the runtime's windows of copies) are carried over: the batched copies mask [i, span).
// CHECK-LABEL: func.func @spans
// CHECK-SAME: ([[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>, [[SP:%[^:]+]]: tensor<?x?xi32>)
// CHECK: lm.masked_batch [[IDS]], [[LEN]] spans([[SP]]) {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32>
func.func @spans(%ids: tensor<?x?xi32>, %len: tensor<?xi32>, %spans: tensor<?x?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %r = lm.mask_and_predict %ids, %len spans(%spans) {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %logits = lm.linear %x, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
    %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
    %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %g : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}
