// RUN: lmcc-opt %s --lm-fuse-logprob | FileCheck %s
// RUN: lmcc emit-mlir %models/bilm_base.toml | lmcc-opt --lm-fuse-logprob | FileCheck %s --check-prefix=MODEL
// RUN: lmcc emit-mlir %models/unilm_base.toml | lmcc-opt --lm-fuse-logprob | FileCheck %s --check-prefix=CAUSAL
// lm-fuse-logprob: gather(log_softmax(linear(h, W, b)), ids, shift)  ==>
// token_logprob(h, W, b, ids, shift), when the [B, N, V] logits and log-probs feed
// nothing else. d_model 8, vocab 11.

// CHECK-LABEL: func.func @causal_head
// CHECK-SAME: ([[H:%[^:]+]]: tensor<?x?x8xf32>, [[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK-DAG: [[E:%.+]] = lm.weight "embed.token" : tensor<11x8xf32>
// CHECK-DAG: [[BIAS:%.+]] = lm.weight "head.bias" : tensor<11xf32>
// CHECK-NOT: lm.linear
// CHECK: [[T:%.+]] = lm.token_logprob [[H]], [[E]], [[BIAS]], [[IDS]], [[LEN]] {shift = 1 : i64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
// CHECK-NOT: lm.linear
// CHECK-NOT: lm.log_softmax
// CHECK-NOT: lm.gather
// CHECK: return [[T]]
func.func @causal_head(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %bias = lm.weight "head.bias" : tensor<11xf32>
  %logits = lm.linear %h, %E, %bias : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %g = lm.gather %lp, %ids, %len {shift = 1 : i64} : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %g : tensor<?x?xf32>
}

// No bias, shift 0 (the default, not printed).
// CHECK-LABEL: func.func @no_bias
// CHECK-SAME: ([[H:%[^:]+]]: tensor<?x?x8xf32>, [[IDS:%[^:]+]]: tensor<?x?xi32>, [[LEN:%[^:]+]]: tensor<?xi32>)
// CHECK: [[W:%.+]] = lm.weight "head.output.weight" : tensor<11x8xf32>
// CHECK-NEXT: [[T:%.+]] = lm.token_logprob [[H]], [[W]], [[IDS]], [[LEN]] : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
// CHECK-NEXT: return [[T]]
func.func @no_bias(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %W = lm.weight "head.output.weight" : tensor<11x8xf32>
  %logits = lm.linear %h, %W : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %g : tensor<?x?xf32>
}

// Inside lm.mask_and_predict (the PLL body): fused there, targets from outside.
// CHECK-LABEL: func.func @pll
// CHECK: lm.mask_and_predict
// CHECK-NEXT: ^bb0([[M:%.+]]: tensor<?x?xi32>):
// CHECK: [[X:%.+]] = lm.embed {{.*}}[[[M]]]
// CHECK-NEXT: [[T:%.+]] = lm.token_logprob [[X]], {{.*}}, %arg0, %{{.+}} :
// CHECK-NEXT: lm.yield [[T]]
func.func @pll(%ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %r = lm.mask_and_predict %ids, %len {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
  ^bb0(%masked: tensor<?x?xi32>):
    %x = lm.embed %E[%masked] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %logits = lm.linear %x, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
    %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
    %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    lm.yield %g : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// The log-probabilities have a second use (returned): the [B, N, V] tensor is
// needed anyway, nothing is fused.
// CHECK-LABEL: func.func @logprobs_escape
// CHECK-NOT: lm.token_logprob
// CHECK: [[L:%.+]] = lm.linear
// CHECK: [[LP:%.+]] = lm.log_softmax [[L]]
// CHECK: [[G:%.+]] = lm.gather [[LP]], %{{.+}}, %{{.+}} {shift = 1 : i64}
// CHECK-NOT: lm.token_logprob
// CHECK: return [[G]], [[LP]]
func.func @logprobs_escape(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?x11xf32>) {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %logits = lm.linear %h, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %g = lm.gather %lp, %ids, %len {shift = 1 : i64} : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %g, %lp : tensor<?x?xf32>, tensor<?x?x11xf32>
}

// Two gathers of the same log-probabilities (two target sequences): the log_softmax
// has two uses, so neither gather is fused.
// CHECK-LABEL: func.func @two_gathers
// CHECK-NOT: lm.token_logprob
// CHECK: [[LP:%.+]] = lm.log_softmax
// CHECK: lm.gather [[LP]]
// CHECK: lm.gather [[LP]]
// CHECK-NOT: lm.token_logprob
// CHECK: return
func.func @two_gathers(%h: tensor<?x?x8xf32>, %a: tensor<?x?xi32>, %b: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>) {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %logits = lm.linear %h, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %ga = lm.gather %lp, %a, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  %gb = lm.gather %lp, %b, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %ga, %gb : tensor<?x?xf32>, tensor<?x?xf32>
}

// The logits have a second use (returned): not fused.
// CHECK-LABEL: func.func @logits_escape
// CHECK-NOT: lm.token_logprob
// CHECK: [[L:%.+]] = lm.linear
// CHECK: lm.log_softmax [[L]]
// CHECK: lm.gather
// CHECK-NOT: lm.token_logprob
// CHECK: return
func.func @logits_escape(%h: tensor<?x?x8xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?x11xf32>) {
  %E = lm.weight "embed.token" : tensor<11x8xf32>
  %logits = lm.linear %h, %E : (tensor<?x?x8xf32>, tensor<11x8xf32>) -> tensor<?x?x11xf32>
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %g, %logits : tensor<?x?xf32>, tensor<?x?x11xf32>
}

// Not a vocabulary projection: the log_softmax reads a function argument.
// CHECK-LABEL: func.func @no_linear
// CHECK-NOT: lm.token_logprob
// CHECK: lm.log_softmax
// CHECK: lm.gather
// CHECK-NOT: lm.token_logprob
// CHECK: return
func.func @no_linear(%logits: tensor<?x?x11xf32>, %ids: tensor<?x?xi32>, %len: tensor<?xi32>) -> tensor<?x?xf32> {
  %lp = lm.log_softmax %logits : tensor<?x?x11xf32>
  %g = lm.gather %lp, %ids, %len : (tensor<?x?x11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
  return %g : tensor<?x?xf32>
}

// biLM: the head inside lm.mask_and_predict becomes one token_logprob against the
// original ids (shift 0); @logits keeps its [B, N, V] projection.
// MODEL-LABEL: func.func @score
// MODEL: lm.mask_and_predict %arg0, %arg1
// MODEL-NOT: lm.log_softmax
// MODEL-NOT: lm.gather
// MODEL: [[T:%.+]] = lm.token_logprob {{.*}}, %arg0, %arg1 : (tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
// MODEL-NEXT: lm.yield [[T]]
// MODEL-NOT: lm.log_softmax
// MODEL: lm.sentence_score
// MODEL-LABEL: func.func @logits
// MODEL-NOT: lm.token_logprob
// MODEL: [[L:%.+]] = lm.linear {{.*}} -> tensor<?x?x30522xf32>
// MODEL: return [[L]]

// uniLM: the causal head keeps its shift.
// CAUSAL-LABEL: func.func @score
// CAUSAL-NOT: lm.log_softmax
// CAUSAL: [[T:%.+]] = lm.token_logprob {{.*}}, %arg0, %arg1 {shift = 1 : i64}
// CAUSAL-NEXT: lm.sentence_score [[T]], %arg0, %arg1 {first = 1 : i64
// CAUSAL-LABEL: func.func @embed
