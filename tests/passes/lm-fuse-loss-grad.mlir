// RUN: lmcc-opt %s --lm-fuse-loss-grad | FileCheck %s
// RUN: lmcc emit-mlir --train %models/unilm_base.toml | lmcc-opt --lm-fuse-attention --lm-fuse-logprob --lm-autodiff --lm-fuse-loss-grad | FileCheck %s --check-prefix=MODEL
// lm-fuse-loss-grad: a token_loss whose lse feeds a token_loss_grad of the same operands and attributes becomes one
// lm.token_loss_and_grad at the token_loss (the logits computed once); anything else stays as it was.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %b = lm.weight "head.bias" : tensor<11xf32>
    %W = lm.weight "w" : tensor<8x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %h = lm.linear %x, %W : (tensor<?x?x8xf32>, tensor<8x8xf32>) -> tensor<?x?x8xf32>
    %ce, %lse = lm.token_loss %h, %E, %b, %targets, %lengths {smoothing = 1.0e-01 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %b, %targets, %lengths, %lse {smoothing = 1.0e-01 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
    %dx, %dW, %dbW = lm.linear_grad %dh, %x, %W : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<8x8xf32>) -> (tensor<?x?x8xf32>, tensor<8x8xf32>, tensor<8xf32>)
    %sum = lm.embed_grad %dx, %ids, %lengths into(%dE) : (tensor<?x?x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<11x8xf32>) -> tensor<11x8xf32>
    lm.param_grad %sum {name = "embed.token"} : tensor<11x8xf32>
    lm.param_grad %db {name = "head.bias"} : tensor<11xf32>
    lm.param_grad %dW {name = "w"} : tensor<8x8xf32>
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @loss_grad(
// CHECK: [[H:%.+]] = lm.linear
// CHECK-NOT: lm.token_loss %
// CHECK: [[CE:%.+]], %{{.+}}, [[DH:%.+]], [[DE:%.+]], [[DB:%.+]] = lm.token_loss_and_grad [[H]], %{{.+}}, %{{.+}}, %arg1, %arg2 {smoothing = 1.000000e-01 : f64}
// CHECK-NOT: lm.token_loss_grad
// CHECK: lm.linear_grad [[DH]]
// CHECK: lm.embed_grad %{{.+}}, %arg0, %arg2 into([[DE]])
// CHECK: lm.param_grad [[DB]] {name = "head.bias"}
// CHECK: return [[CE]]

// Its lowering: tests/codegen/backward.mlir (FUSED).

// Not fused: the grad's smoothing differs; the grad reads another lse; no grad reads the lse.
// CHECK-LABEL: func.func @other_smoothing(
// CHECK: lm.token_loss %
// CHECK: lm.token_loss_grad
// CHECK-NOT: lm.token_loss_and_grad
func.func @other_smoothing(%h: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?x8xf32>) {
  %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 1.0e-01 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
  return %ce, %dh : tensor<?x?xf32>, tensor<?x?x8xf32>
}

// CHECK-LABEL: func.func @other_hidden(
// CHECK: lm.token_loss %
// CHECK: lm.token_loss_grad
// CHECK-NOT: lm.token_loss_and_grad
func.func @other_hidden(%h: tensor<?x?x8xf32>, %h2: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?x8xf32>) {
  %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  %dh, %dE, %db = lm.token_loss_grad %h2, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>)
  return %ce, %dh : tensor<?x?xf32>, tensor<?x?x8xf32>
}

// CHECK-LABEL: func.func @forward_only(
// CHECK: lm.token_loss %
// CHECK-NOT: lm.token_loss_and_grad
func.func @forward_only(%h: tensor<?x?x8xf32>, %E: tensor<11x8xf32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> {
  %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
  return %ce : tensor<?x?xf32>
}

// The n-gram heads: lm.ngram_loss and the ngram_loss_grad of its lse results -> lm.ngram_loss_and_grad.
// CHECK-LABEL: func.func @ngram(
// CHECK-NOT: lm.ngram_loss heads
// CHECK: [[CE:%.+]], %{{.+}}:2, [[DU:%.+]]:2, [[DW:%.+]], %{{.+}} = lm.ngram_loss_and_grad heads(%arg0, %arg1 : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%arg2 : tensor<11x8xf32>) targets(%arg3, %arg4 : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.000000e-01 : f64} -> tensor<?x?xf32> lse(tensor<?x?xf32>, tensor<?x?xf32>) d_heads(tensor<?x?x8xf32>, tensor<?x?x8xf32>) tensor<11x8xf32>, tensor<11xf32>
// CHECK-NOT: lm.ngram_loss_grad
// CHECK: return [[CE]], [[DU]]#1, [[DW]]
func.func @ngram(%h: tensor<?x?x8xf32>, %u: tensor<?x?x8xf32>, %W: tensor<11x8xf32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>) {
  %ce, %l1, %l2 = lm.ngram_loss heads(%h, %u : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%W : tensor<11x8xf32>) targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.0e-01 : f64} -> tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
  %d1, %d2, %dW, %db = lm.ngram_loss_grad heads(%h, %u : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%W : tensor<11x8xf32>) targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) lse(%l1, %l2 : tensor<?x?xf32>, tensor<?x?xf32>) {smoothing = 1.0e-01 : f64} -> tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>
  return %ce, %d2, %dW : tensor<?x?xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>
}

// Not fused: the grad reads the lse of another ngram_loss (here: a different smoothing).
// CHECK-LABEL: func.func @ngram_other_smoothing(
// CHECK: lm.ngram_loss heads
// CHECK: lm.ngram_loss_grad
// CHECK-NOT: lm.ngram_loss_and_grad
func.func @ngram_other_smoothing(%h: tensor<?x?x8xf32>, %u: tensor<?x?x8xf32>, %W: tensor<11x8xf32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<11x8xf32>) {
  %ce, %l1, %l2 = lm.ngram_loss heads(%h, %u : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%W : tensor<11x8xf32>) targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 0.0 : f64} -> tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
  %d1, %d2, %dW, %db = lm.ngram_loss_grad heads(%h, %u : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%W : tensor<11x8xf32>) targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) lse(%l1, %l2 : tensor<?x?xf32>, tensor<?x?xf32>) {smoothing = 1.0e-01 : f64} -> tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>
  return %ce, %dW : tensor<?x?xf32>, tensor<11x8xf32>
}

// The uniLM's loss_grad entry gets the fused head; its evaluating `loss` entry keeps the plain token_loss.
// MODEL-LABEL: func.func @loss(
// MODEL: lm.token_loss %
// MODEL-LABEL: func.func @loss_grad(
// MODEL-NOT: lm.token_loss %
// MODEL: lm.token_loss_and_grad
// MODEL-NOT: lm.token_loss_grad
// MODEL: lm.attention_grad
