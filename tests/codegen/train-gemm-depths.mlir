// RUN: lmcc-opt %s --lm-to-loops | FileCheck %s
// lm-to-loops (Gemm.h getOrCreateTrainGemm): each training kernel gets the training GEMM specialized for its call
// site's static depths (at least 64): a call whose depth and lda equal one of them runs a body of that static depth,
// any other call the run-time depth body. The linear backward's dx = dy W has depth `out` (128); the loss head's
// logits depth d (64) and, for a vocabulary wider than the runtime's tile of 512 columns, its dh products depth 512.

module @m attributes {lm.model = #lm.model<name = "m", vocab = 600, max_len = 9, d_model = 64, heads = 2, d_ff = 128,
    layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @loss_grad(%ids: tensor<?x?xi32>, %targets: tensor<?x?xi32>, %lengths: tensor<?xi32>) -> tensor<?x?xf32> attributes {lm.method = "loss_grad"} {
    %E = lm.weight "embed.token" : tensor<600x64xf32>
    %W = lm.weight "w" : tensor<128x64xf32>
    %V = lm.weight "v" : tensor<64x128xf32>
    %x = lm.embed %E[%ids] : (tensor<600x64xf32>, tensor<?x?xi32>) -> tensor<?x?x64xf32>
    %u = lm.linear %x, %W : (tensor<?x?x64xf32>, tensor<128x64xf32>) -> tensor<?x?x128xf32>
    %h = lm.linear %u, %V : (tensor<?x?x128xf32>, tensor<64x128xf32>) -> tensor<?x?x64xf32>
    %ce, %lse = lm.token_loss %h, %E, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    %dh, %dE, %db = lm.token_loss_grad %h, %E, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xf32>) -> (tensor<?x?x64xf32>, tensor<600x64xf32>, tensor<600xf32>)
    %du, %dV, %dbV = lm.linear_grad %dh, %u, %V : (tensor<?x?x64xf32>, tensor<?x?x128xf32>, tensor<64x128xf32>) -> (tensor<?x?x128xf32>, tensor<64x128xf32>, tensor<64xf32>)
    %dx, %dW, %dbW = lm.linear_grad %du, %x, %W : (tensor<?x?x128xf32>, tensor<?x?x64xf32>, tensor<128x64xf32>) -> (tensor<?x?x64xf32>, tensor<128x64xf32>, tensor<128xf32>)
    lm.param_grad %dE {name = "embed.token"} : tensor<600x64xf32>
    lm.param_grad %dV {name = "v"} : tensor<64x128xf32>
    lm.param_grad %dW {name = "w"} : tensor<128x64xf32>
    return %ce : tensor<?x?xf32>
  }
}

// CHECK-LABEL: func.func @m_loss_grad_kernel(
// The loss forward: the logits' depth 64 alone.
// CHECK: constant @[[LOSS:lm_train_gemm_[0-9]+x[0-9]+_for_k64]] :
// CHECK: call @lm_rt_token_loss(
// Its backward: depth 64 and the vocabulary tile's 512.
// CHECK: constant @[[HEAD:lm_train_gemm_[0-9]+x[0-9]+_for_k64_k512]] :
// CHECK: call @lm_rt_token_loss_grad(
// dx of v [64, 128] (out 64) and of w [128, 64] (out 128): no dx of w is used (x is the embedding of ids), so no
// depth for it.
// CHECK: constant @[[LIN:lm_train_gemm_[0-9]+x[0-9]+_for_k64]] :
// CHECK: call @lm_rt_linear_grad(
// CHECK: constant @[[ANY:lm_train_gemm_any_[0-9]+x[0-9]+]] :
// CHECK: call @lm_rt_linear_grad(
// CHECK: return

// The run-time depth body: A's row stride from the call.
// CHECK: func.func private @[[ANY]](
// CHECK: builtin.unrealized_conversion_cast %{{.+}} : !llvm.struct<{{.+}}> to memref<?x?xf32, strided<[?, 1]>>
// CHECK: vector.fma

// A dispatcher: depth and lda equal to 64 -> the static body, else the run-time one.
// CHECK: func.func private @[[LOSS]](%{{[^:]+}}: !llvm.ptr, %[[LDA:[^:]+]]: i64, %{{[^:]+}}: i64, %[[K:[^:]+]]: i64,
// CHECK: %[[C64:.+]] = llvm.mlir.constant(64 : i64) : i64
// CHECK-DAG: %[[EQK:.+]] = llvm.icmp "eq" %[[K]], %[[C64]] : i64
// CHECK-DAG: %[[EQL:.+]] = llvm.icmp "eq" %[[LDA]], %[[C64]] : i64
// CHECK: %[[BOTH:.+]] = llvm.and %[[EQK]], %[[EQL]] : i1
// CHECK: scf.if %[[BOTH]] {
// CHECK-NEXT: func.call @[[BODY:lm_train_gemm_[0-9]+x[0-9]+_k64]](
// CHECK-NEXT: } else {
// CHECK-NEXT: func.call @[[ANY]](
// The static body: A [M, 64] with its rows 64 floats apart (no run-time stride).
// CHECK: func.func private @[[BODY]](
// CHECK: builtin.unrealized_conversion_cast %{{.+}} : !llvm.struct<{{.+}}> to memref<?x64xf32>
// CHECK: vector.fma

// The head's backward: the two depths in order, then the run-time body.
// CHECK: func.func private @[[HEAD]](
// CHECK: llvm.mlir.constant(64 : i64)
// CHECK: func.call @[[BODY]](
// CHECK: llvm.mlir.constant(512 : i64)
// CHECK: func.call @lm_train_gemm_{{[0-9]+x[0-9]+}}_k512(
// CHECK: func.call @[[ANY]](
