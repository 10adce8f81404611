// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops, NGram.cpp (issue 18): the WDR conjugate and the ensemble become loop nests over [B, N, D];
// lm.ngram_loss and its VJP one call of the runtime's n-gram head kernels per head, the targets shifted by
// j-1 (the i64 after the smoothing), weighted 1/2 and 1/(2(n-1)), the first call writing, the others adding.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 9, d_model = 8, heads = 2, d_ff = 12,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @score(%ids: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?x8xf32> attributes {lm.method = "causal"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %h = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %c = lm.wdr_conjugate %E, %ids, %lengths {head = 3 : i64} : (tensor<11x8xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x8xf32>
    %m = lm.ngram_ensemble %h, %c, %lengths {lambda = 4.000000e-01 : f64} : (tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<?xi32>) -> tensor<?x?x8xf32>
    return %m : tensor<?x?x8xf32>
  }
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %h = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<?x?xi32>) -> tensor<?x?x8xf32>
    %ce, %l1, %l2 = lm.ngram_loss heads(%h, %h : tensor<?x?x8xf32>, tensor<?x?x8xf32>) weight(%E : tensor<11x8xf32>)
        targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.000000e-01 : f64}
        -> tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
    %d1, %d2, %dE, %db = lm.ngram_loss_grad heads(%h, %h : tensor<?x?x8xf32>, tensor<?x?x8xf32>)
        weight(%E : tensor<11x8xf32>) targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>)
        lse(%l1, %l2 : tensor<?x?xf32>, tensor<?x?xf32>) {smoothing = 1.000000e-01 : f64}
        -> tensor<?x?x8xf32>, tensor<?x?x8xf32>, tensor<11x8xf32>, tensor<11xf32>
    lm.param_grad %dE {name = "embed.token"} : tensor<11x8xf32>
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_score_kernel(
// Conjugate of head 3: +2 W[x_{s+2}] - 1 W[x_{s+1}], rows past the sentence skipped.
// CHECK: scf.for
// CHECK: arith.constant 2.000000e+00 : f32
// CHECK: arith.constant -1.000000e+00 : f32
// Ensemble: (1 - 0.4) u_1[p-1] + 0.4 u_2[p-2] (or u_1[p-1] while p < 2).
// CHECK: arith.constant 6.000000e-01 : f32
// CHECK: arith.constant 4.000000e-01 : f32

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// CHECK: %[[S0:.+]] = arith.constant 0 : i64
// CHECK: %[[HALF:.+]] = arith.constant 5.000000e-01 : f64
// CHECK: %[[FIRST:.+]] = arith.constant 1 : i32
// CHECK: call @lm_rt_ngram_head_loss({{.*}}, %[[S0]], %[[HALF]], %[[FIRST]],
// CHECK: %[[S1:.+]] = arith.constant 1 : i64
// CHECK: %[[ADD:.+]] = arith.constant 0 : i32
// CHECK: call @lm_rt_ngram_head_loss({{.*}}, %[[S1]], %{{.+}}, %[[ADD]],
// CHECK: call @lm_rt_ngram_head_grad(
// CHECK: call @lm_rt_ngram_head_grad(
