// RUN: lmcc-opt --lm-to-loops --split-input-file --verify-diagnostics %s
// Kernels run over any batch and sequence length, which the lowering reads off the operands' `?` dimensions:
// hand-written IR with static sizes there gets an error, not a crash (it crashed in Loops::alloc before).

module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 8, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  // expected-error @+1 {{argument #0 of @embed has the type 'tensor<2x3xi32>', whose leading (batch) dimension is static}}
  func.func @embed(%ids: tensor<2x3xi32>, %len: tensor<2xi32>) -> tensor<2x8xf32> {
    %E = lm.weight "embed.token" : tensor<11x8xf32>
    %x = lm.embed %E[%ids] : (tensor<11x8xf32>, tensor<2x3xi32>) -> tensor<2x3x8xf32>
    %e = lm.mean_pool %x, %ids, %len {exclude = array<i32: 3, 1>} : (tensor<2x3x8xf32>, tensor<2x3xi32>, tensor<2xi32>) -> tensor<2x8xf32>
    return %e : tensor<2x8xf32>
  }
}

// -----

// A static sequence length where a lowering needs one at run time (the scores' [B, N] result).
module @m attributes {lm.model = #lm.model<name = "m", vocab = 11, max_len = 6, d_model = 32, heads = 2, d_ff = 16,
                                           layers = 1, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} {
  func.func @score(%ids: tensor<?x5xi32>, %len: tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>) {
    %E = lm.weight "embed.token" : tensor<11x32xf32>
    %x = lm.embed %E[%ids] : (tensor<11x32xf32>, tensor<?x5xi32>) -> tensor<?x5x32xf32>
    %t = lm.token_logprob %x, %E, %ids, %len : (tensor<?x5x32xf32>, tensor<11x32xf32>, tensor<?x5xi32>, tensor<?xi32>) -> tensor<?x5xf32>
    // expected-error @+1 {{lm-to-loops takes the sequence length from a dynamic (`?`) dimension of the op's operands, and they have none}}
    %lp, %s, %n = lm.sentence_score %t, %ids, %len {first = 0 : i64, skip = array<i32: 3, 1>}
        : (tensor<?x5xf32>, tensor<?x5xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>)
    return %lp, %s, %n : tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>
  }
}
