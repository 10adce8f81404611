//===- LmOps.td - lm dialect operations ---------------------------------===//
//
// Shapes use B = batch, N = sequence (queries), M = keys, D = d_model, H = heads,
// dh = D / H, V = vocabulary. B, N and M are dynamic; model dims are static.
//
//===----------------------------------------------------------------------===//
#ifndef LM_OPS_TD
#define LM_OPS_TD

include "dialect/LmDialect.td"
include "dialect/LmAttrs.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/IR/OpBase.td"

// Every lm value has a rank >= 1 (a batch, a vector of weights or lengths): no op is defined on scalars, and the
// verifiers and lowerings index dimensions.
def Lm_NotScalar : CPred<"::llvm::cast<::mlir::ShapedType>($_self).getRank() >= 1">;
def Lm_F32Tensor : RankedTensorOf<[F32], [Lm_NotScalar], "ranked tensor of rank >= 1">;
def Lm_I32Tensor : RankedTensorOf<[I32], [Lm_NotScalar], "ranked tensor of rank >= 1">;

//===----------------------------------------------------------------------===//
// Parameters and embeddings
//===----------------------------------------------------------------------===//

def Lm_WeightOp : Lm_Op<"weight", [Pure]> {
  let summary = "a named model parameter (a runtime input, loaded from safetensors)";
  let description = [{
    Refers to the canonical weight `name` (DESIGN.md); the shape is static and is
    checked against the weights file when a model is loaded.
    ```mlir
    %E = lm.weight "embed.token" : tensor<30522x512xf32>
    ```
  }];
  let arguments = (ins StrAttr:$name);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Lm_EmbedOp : Lm_Op<"embed", [Pure]> {
  let summary = "gather rows of an embedding table: out[b, t] = table[ids[b, t]]";
  let description = [{
    ```mlir
    %x = lm.embed %E[%ids] : (tensor<30522x512xf32>, tensor<?x?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$table, Lm_I32Tensor:$ids);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$table `[` $ids `]` attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_PositionsOp : Lm_Op<"positions", [Pure]> {
  let summary = "position embeddings for every (sentence, position): out[b, t] = P[t]";
  let description = [{
    With a table operand, P is the learned table (rows 0..N-1); without one, P is
    the sinusoidal table P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(...).
    Only the shape of `ids` is read.
    ```mlir
    %p = lm.positions %ids table(%P : tensor<128x512xf32>) : (tensor<?x?xi32>) -> tensor<?x?x512xf32>
    %s = lm.positions %ids : (tensor<?x?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$ids, Optional<Lm_F32Tensor>:$table);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$ids (`table` `(` $table^ `:` type($table) `)`)? attr-dict `:` functional-type($ids, results)";
  let hasVerifier = 1;
}

def Lm_FillIdsOp : Lm_Op<"fill_ids", [Pure, SameOperandsAndResultType]> {
  let summary = "ids of the same shape as the input, every entry `value` (e.g. all [MASK])";
  let description = [{
    T-TA's `first_query = "mask+position"` embeds E[MASK] at every position.
    ```mlir
    %m = lm.fill_ids %ids {value = 4 : i64} : tensor<?x?xi32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$input, I64Attr:$value);
  let results = (outs Lm_I32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Dense layers, norms and elementwise ops
//===----------------------------------------------------------------------===//

def Lm_LinearOp : Lm_Op<"linear", [Pure]> {
  let summary = "affine map over the last axis: y = x W^T + b, W stored [out, in]; then an activation if named";
  let description = [{
    ```mlir
    %q = lm.linear %h, %Wq, %bq : (tensor<?x?x512xf32>, tensor<512x512xf32>, tensor<512xf32>) -> tensor<?x?x512xf32>
    %u = lm.linear %h, %W1, %b1 {activation = "gelu"} : (tensor<?x?x512xf32>, tensor<2048x512xf32>, tensor<2048xf32>) -> tensor<?x?x2048xf32>
    ```
    `activation` ("gelu", "gelu_tanh" or "relu": lm.gelu, lm.gelu {approximate}, lm.relu) is applied to every
    element of x W^T + b: the op equals that activation op over the plain linear, bit for bit (lm-fuse-activation
    makes it; the generated GEMM applies it to each panel it has just finished, while it is in cache).
  }];
  let arguments = (ins Lm_F32Tensor:$input, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias,
                       OptionalAttr<StrAttr>:$activation);
  let results = (outs Lm_F32Tensor:$result);
  let builders = [OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input, "::mlir::Value":$weight,
                                 "::mlir::Value":$bias), [{
    build($_builder, $_state, result, input, weight, bias, ::mlir::StringAttr());
  }]>];
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_LayerNormOp : Lm_Op<"layer_norm", [Pure]> {
  let summary = "LayerNorm over the last axis, biased variance: (x - mean) / sqrt(var + eps) * g + b";
  let description = [{
    ```mlir
    %y = lm.layer_norm %x, %g, %b {epsilon = 1.0e-12 : f64} : (tensor<?x?x512xf32>, tensor<512xf32>, tensor<512xf32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, Lm_F32Tensor:$gamma, Lm_F32Tensor:$beta, F64Attr:$epsilon);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_GeluOp : Lm_Op<"gelu", [Pure, SameOperandsAndResultType]> {
  let summary = "GELU: x * Phi(x) (exact erf), or the tanh approximation when `approximate`";
  let description = [{
    ```mlir
    %y = lm.gelu %x : tensor<?x?x2048xf32>
    %t = lm.gelu %x {approximate} : tensor<?x?x2048xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, UnitAttr:$approximate);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Lm_ReluOp : Lm_Op<"relu", [Pure, SameOperandsAndResultType]> {
  let summary = "max(x, 0)";
  let description = [{
    ```mlir
    %y = lm.relu %x : tensor<?x?x2048xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Lm_AddOp : Lm_Op<"add", [Pure, SameOperandsAndResultType, Commutative]> {
  let summary = "elementwise sum (residuals, token + position)";
  let description = [{
    ```mlir
    %y = lm.add %a, %b : tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$lhs, Lm_F32Tensor:$rhs);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Lm_ScaleOp : Lm_Op<"scale", [Pure, SameOperandsAndResultType]> {
  let summary = "multiply every element by a constant (attention's 1/sqrt(dh))";
  let description = [{
    ```mlir
    %s = lm.scale %scores {factor = 0.125 : f32} : tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, F32Attr:$factor);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Lm_InterpolateOp : Lm_Op<"interpolate", [Pure, SameOperandsAndResultType]> {
  let summary = "mix two per-position log-probabilities: log((1 - lambda) e^a + lambda e^b) from position `from` on";
  let description = [{
    out[b, t] = a[b, t] for t < from (no prediction from rhs there), else
    log((1 - lambda) exp(a[b, t]) + lambda exp(b[b, t])). The N-gram ensemble
    (ngram-wdr paper): the next-token model and the n-gram heads' predictions of
    the same token, mixed in probability space.
    ```mlir
    %lp = lm.interpolate %a, %b {lambda = 4.0e-01 : f64, from = 2 : i64} : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$lhs, Lm_F32Tensor:$rhs, F64Attr:$lambda, DefaultValuedAttr<I64Attr, "0">:$from);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention, decomposed
//===----------------------------------------------------------------------===//

def Lm_SplitHeadsOp : Lm_Op<"split_heads", [Pure]> {
  let summary = "[B, N, D] -> [B, H, N, dh]: head h holds features [h*dh, (h+1)*dh)";
  let description = [{
    ```mlir
    %qh = lm.split_heads %q : (tensor<?x?x512xf32>) -> tensor<?x8x?x64xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_MergeHeadsOp : Lm_Op<"merge_heads", [Pure]> {
  let summary = "[B, H, N, dh] -> [B, N, D], the inverse of lm.split_heads";
  let description = [{
    ```mlir
    %c = lm.merge_heads %ctx : (tensor<?x8x?x64xf32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_MatmulOp : Lm_Op<"matmul", [Pure]> {
  let summary = "batched matrix product over the two last axes, B optionally transposed";
  let description = [{
    [..., M, K] x [..., K, N] -> [..., M, N]; with `transpose_rhs`, rhs is [..., N, K]; with
    `transpose_lhs` (gradients), lhs is [..., K, M].
    ```mlir
    %s = lm.matmul %qh, %kh {transpose_rhs} : (tensor<?x8x?x64xf32>, tensor<?x8x?x64xf32>) -> tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$lhs, Lm_F32Tensor:$rhs, UnitAttr:$transpose_rhs, UnitAttr:$transpose_lhs);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_MaskFillOp : Lm_Op<"mask_fill", [Pure]> {
  let summary = "set attention scores of invisible keys to -inf";
  let description = [{
    scores [B, H, N, M]; key j of sentence b is visible to query i when
    j < lengths[b] and the mask allows it (`#lm.mask<...>`). `directional` reads a
    per-row operand [B, N, 1 + W] (i32): rows[b, i, 0] is row i's direction (0 R: j <= i,
    1 L: j >= i, 2 S: j != i and bit j of rows[b, i, 1 ..] clear, 3 skip: no key), the
    W words after it the keys hidden from an S row (bit j % 32 of word j / 32);
    `explicit` a [B, N, M] i1 operand.
    ```mlir
    %m = lm.mask_fill %s, %lengths {mask = #lm.mask<diagonal>} : tensor<?x8x?x?xf32>, tensor<?xi32> -> tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$scores, Lm_I32Tensor:$lengths, Optional<RankedTensorOf<[I32, I1]>>:$mask_data,
                       Lm_MaskAttr:$mask);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = [{
    $scores `,` $lengths (`data` `(` $mask_data^ `:` type($mask_data) `)`)? attr-dict `:`
    type($scores) `,` type($lengths) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Lm_SoftmaxOp : Lm_Op<"softmax", [Pure, SameOperandsAndResultType]> {
  let summary = "softmax over the last axis; a row of only -inf gives zeros (no visible key: zero context)";
  let description = [{
    ```mlir
    %p = lm.softmax %m : tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Lm_RelativeScoresOp : Lm_Op<"relative_scores", [Pure]> {
  let summary = "Shaw relative-position score terms: out[b,h,i,j] = q[b,h,i] . rel[clip(j - i, -k, k) + k]";
  let description = [{
    Added to Q K^T before scaling. `rel` is [2k+1, dh], shared by heads; `keys`
    supplies only the key count M.
    ```mlir
    %r = lm.relative_scores %qh, %kh, %relk {clip = 16 : i64} : (tensor<?x8x?x64xf32>, tensor<?x8x?x64xf32>, tensor<33x64xf32>) -> tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$query, Lm_F32Tensor:$keys, Lm_F32Tensor:$rel, I64Attr:$clip);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_RelativeValuesOp : Lm_Op<"relative_values", [Pure]> {
  let summary = "Shaw relative-position value terms: out[b,h,i] = sum_j p[b,h,i,j] rel[clip(j - i, -k, k) + k]";
  let description = [{
    ```mlir
    %c = lm.relative_values %p, %relv {clip = 16 : i64} : (tensor<?x8x?x?xf32>, tensor<33x64xf32>) -> tensor<?x8x?x64xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$probs, Lm_F32Tensor:$rel, I64Attr:$clip);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention, fused
//===----------------------------------------------------------------------===//

def Lm_AttentionOp : Lm_Op<"attention", [Pure, AttrSizedOperandSegments]> {
  let summary = "masked multi-head attention: softmax(mask(Q K^T * scale)) V over heads";
  let description = [{
    query [B, N, D], key/value [B, M, D] (heads split inside: head h uses
    features [h*dh, (h+1)*dh)); the mask is an attribute conjoined with key
    padding from `lengths`. Optional operands: per-row mask data (directional,
    explicit), Shaw relative-position tables (both or neither), and per-batch-entry
    query positions [B] for single-query rows (query [B, 1, D]: its row sits at
    position query_positions[b] for the mask and relative positions; lm-prune-rows
    makes these). Scores are (Q K^T [+ Q rel_k]) * scale. Equal to the
    decomposed split_heads / matmul / scale / mask_fill / softmax / matmul /
    merge_heads chain; a row that sees no key yields zeros.
    ```mlir
    %c = lm.attention %q, %k, %v, %lengths {heads = 8 : i64, mask = #lm.mask<causal>, scale = 0.125 : f32}
         : tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32> -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$query, Lm_F32Tensor:$key, Lm_F32Tensor:$value, Lm_I32Tensor:$lengths,
                       Optional<RankedTensorOf<[I32, I1]>>:$mask_data, Optional<Lm_F32Tensor>:$rel_key,
                       Optional<Lm_F32Tensor>:$rel_value, Optional<Lm_I32Tensor>:$query_positions,
                       I64Attr:$heads, Lm_MaskAttr:$mask, F32Attr:$scale,
                       DefaultValuedAttr<I64Attr, "0">:$clip);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $lengths (`data` `(` $mask_data^ `:` type($mask_data) `)`)?
    (`relative` `(` $rel_key^ `,` $rel_value `:` type($rel_key) `,` type($rel_value) `)`)?
    (`query_positions` `(` $query_positions^ `:` type($query_positions) `)`)? attr-dict `:`
    type($query) `,` type($key) `,` type($value) `,` type($lengths) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Output head and scores
//===----------------------------------------------------------------------===//

def Lm_LogSoftmaxOp : Lm_Op<"log_softmax", [Pure, SameOperandsAndResultType]> {
  let summary = "log-softmax over the last axis: x - max - log(sum(exp(x - max)))";
  let description = [{
    ```mlir
    %lp = lm.log_softmax %logits : tensor<?x?x30522xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Lm_GatherOp : Lm_Op<"gather", [Pure]> {
  let summary = "pick each position's target: out[b, t] = lp[b, t - shift, ids[b, t]] (0 where t < shift, t >= length or ids[b, t] < 0)";
  let description = [{
    `shift = 1` reads the causal prediction of x_t from position t-1. Positions at or
    past `lengths[b]` are 0 (their ids are padding and never read).
    ```mlir
    %g = lm.gather %lp, %ids, %lengths {shift = 1 : i64} : (tensor<?x?x30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$logprobs, Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths,
                       DefaultValuedAttr<I64Attr, "0">:$shift);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$logprobs `,` $targets `,` $lengths attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_TokenLogprobOp : Lm_Op<"token_logprob", [Pure]> {
  let summary = "fused vocabulary projection + log-softmax + gather: log p(target | h)";
  let description = [{
    out[b, t] = log_softmax(h[b, t - shift] W^T + bias)[ids[b, t]], 0 where t < shift,
    t >= lengths[b] or ids[b, t] < 0 (no target); never materializes the [B, N, V] logits.
    ```mlir
    %g = lm.token_logprob %t, %E, %bias, %ids, %lengths : (tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias, Lm_I32Tensor:$targets,
                       Lm_I32Tensor:$lengths, DefaultValuedAttr<I64Attr, "0">:$shift);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_SentenceScoreOp : Lm_Op<"sentence_score", [Pure]> {
  let summary = "per-token log-probs -> (masked token log-probs, score, n_scored)";
  let description = [{
    Zeroes positions t < `first`, positions t >= lengths[b] and positions holding
    a token in `skip`; score[b] = sum over the rest, n_scored[b] = their count.
    ```mlir
    %lp, %s, %n = lm.sentence_score %g, %ids, %lengths {first = 0 : i64, skip = array<i32: 3, 1>}
        : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?xf32>, tensor<?xi32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$logprobs, Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, DenseI32ArrayAttr:$skip,
                       DefaultValuedAttr<I64Attr, "0">:$first);
  let results = (outs Lm_F32Tensor:$token_logprobs, Lm_F32Tensor:$score, Lm_I32Tensor:$n_scored);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_MeanPoolOp : Lm_Op<"mean_pool", [Pure]> {
  let summary = "sentence embedding: mean of h over valid positions not holding a token in `exclude`";
  let description = [{
    All valid positions are averaged when every one holds an excluded token. With `cls` the result
    is row 0 of each sentence instead (BERT's [CLS] pooling; `exclude` is then empty); with `normalize`
    each result row is divided by max(||row||_2, 1e-12).
    ```mlir
    %e = lm.mean_pool %h, %ids, %lengths {exclude = array<i32: 3, 1>} : (tensor<?x?x512xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, DenseI32ArrayAttr:$exclude,
                       UnitAttr:$cls, UnitAttr:$normalize);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Diformer (diformer paper 2.2-2.3, issue 19's contract)
//===----------------------------------------------------------------------===//
// The decoder's rows carry a direction each (R, L, S or skip) in the [B, N, 1 + W] rows operand that
// also feeds the directional mask (see lm.mask_fill): the queries, the targets and the visibility of
// every row are functions of it.

def Lm_DecoderQueriesOp : Lm_Op<"decoder_queries", [Pure]> {
  let summary = "Diformer decoder input: direction[z_i] + (z_i == L ? r2l[n-1-i] : l2r[i])";
  let description = [{
    z_i = rows[b, i, 0] (a skip row, and a row at or past n = lengths[b], uses direction 0 and l2r[i]).
    ```mlir
    %q = lm.decoder_queries %rows, %lengths, %dir, %l2r, %r2l : (tensor<?x?x2xi32>, tensor<?xi32>, tensor<3x64xf32>, tensor<24x64xf32>, tensor<24x64xf32>) -> tensor<?x?x64xf32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$rows, Lm_I32Tensor:$lengths, Lm_F32Tensor:$direction, Lm_F32Tensor:$l2r,
                       Lm_F32Tensor:$r2l);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_DirectionalTargetsOp : Lm_Op<"directional_targets", [Pure]> {
  let summary = "the token each decoder row predicts: y_{i+1} (R), y_{i-1} (L), y_i (S), -1 (skip, padding)";
  let description = [{
    ```mlir
    %tau = lm.directional_targets %tgt, %rows, %lengths : (tensor<?x?xi32>, tensor<?x?x2xi32>, tensor<?xi32>) -> tensor<?x?xi32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$targets, Lm_I32Tensor:$rows, Lm_I32Tensor:$lengths);
  let results = (outs Lm_I32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_LengthLogprobOp : Lm_Op<"length_logprob", [Pure]> {
  let summary = "Diformer length head: log_softmax(W mean_{j < lengths[b]} h[b, j])[target_lengths[b]]";
  let description = [{
    W [max_len, D] has no bias; the mean runs over every valid source position. A target length
    outside [0, max_len) gives -inf (the runtime refuses such inputs first). Without target_lengths
    the result is the whole distribution [B, max_len] (the decoders' length beam).
    ```mlir
    %l = lm.length_logprob %h, %src_len, %W, %tgt_len : (tensor<?x?x64xf32>, tensor<?xi32>, tensor<24x64xf32>, tensor<?xi32>) -> tensor<?xf32>
    %all = lm.length_logprob %h, %src_len, %W : (tensor<?x?x64xf32>, tensor<?xi32>, tensor<24x64xf32>) -> tensor<?x24xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_I32Tensor:$lengths, Lm_F32Tensor:$weight,
                       Optional<Lm_I32Tensor>:$target_lengths);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// N-gram heads (ngram-wdr paper, issue 18's contract)
//===----------------------------------------------------------------------===//
// Head 1 is the trunk's H_s; head j (2..n) is u_j(s) = out_j(act(in_j(H_s))) [+ the WDR conjugate], and
// every head reaches the vocabulary through the shared logit layer z_j = W u_j + b.

def Lm_WdrConjugateOp : Lm_Op<"wdr_conjugate", [Pure]> {
  let summary = "the WDR conjugate of head j: sum_{i=1..j-1} (-1)^(i+1) C(j-1, i) W[x_{s+j-i}] (no gradient)";
  let description = [{
    out[b, s] = sum over i = 1..j-1 with s+j-i < lengths[b] of (-1)^(i+1) C(j-1, i) table[ids[b, s+j-i]]
    (paper Eq. 10), 0 on rows s >= lengths[b]. The table is the logit layer W read with the gradient
    stopped: lm-autodiff gives this op no VJP, so W learns only through the logits.
    ```mlir
    %c = lm.wdr_conjugate %W, %ids, %lengths {head = 3 : i64} : (tensor<30522x512xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$table, Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, I64Attr:$head);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_NgramEnsembleOp : Lm_Op<"ngram_ensemble", [Pure]> {
  let summary = "the lambda-ensemble of the heads' vectors that predict x_p: one row per predicted position";
  let description = [{
    With heads u_1..u_n ([B, N, D] each, n = the number of operands minus one) and c = lambda / (n-1):
    out[b, p] = (1-lambda) u_1[b, p-1] + c sum_{j=2..n} (p >= j ? u_j[b, p-j] : u_1[b, p-1]) for
    1 <= p < lengths[b]; 0 on row 0 and on padding. Because every head shares z = W u + b and the
    weights sum to 1, W out[b, p] + b is the contract's logit-space ensemble z(p): scoring then needs one
    vocabulary projection per row (lm.token_logprob after lm-fuse-logprob), not n.
    ```mlir
    %m = lm.ngram_ensemble %h, %u2, %u3, %lengths {lambda = 4.0e-01 : f64} : (tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Variadic<Lm_F32Tensor>:$heads, Lm_I32Tensor:$lengths, F64Attr:$lambda);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Mask-and-predict
//===----------------------------------------------------------------------===//

def Lm_MaskAndPredictOp : Lm_Op<"mask_and_predict", [RecursiveMemoryEffects]> {
  let summary = "for each position i, run the region on the ids with position i masked and keep row i";
  let description = [{
    result[b, i, ...] = region(ids with ids[b, i] := mask_token)[b, i, ...] for
    i < lengths[b]; rows past a sentence's length are zero. The naive lowering is a
    loop of n forward passes; `lm-batch-mask-predict` turns it into one batched
    computation over the n copies.

    With `spans` [B, N] (optional): position i of sentence b is predicted with positions
    [i, min(spans[b, i], lengths[b])) masked (Kauf & Ivanova's within-word l2r PLL masks a
    piece and the rest of its word), and only where spans[b, i] > i: rows with
    spans[b, i] <= i are not computed (zero), which lets a caller split one sentence's
    copies over several calls. Without spans every span is i + 1.
    ```mlir
    %lp = lm.mask_and_predict %ids, %lengths spans(%spans) {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32> {
    ^bb0(%masked: tensor<?x?xi32>):
      ...
      lm.yield %g : tensor<?x?xf32>
    }
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, Optional<Lm_I32Tensor>:$spans, I64Attr:$mask_token);
  let results = (outs Lm_F32Tensor:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$ids `,` $lengths (`spans` `(` $spans^ `)`)? attr-dict `:` functional-type(operands, results) $body";
  let hasVerifier = 1;
}

def Lm_MaskedBatchOp : Lm_Op<"masked_batch", [RecursiveMemoryEffects]> {
  let summary = "mask-and-predict as one batched computation over all masked copies";
  let description = [{
    Same result as lm.mask_and_predict, computed at once: the body runs on the C
    masked copies, copy c = (b, i) being sentence b with positions [i, e) replaced by
    `mask_token` (e = min(spans[b, i], lengths[b]), or i + 1 without spans; positions
    with spans[b, i] <= i have no copy; C = sum(lengths) without spans). Body
    arguments: the copies' ids [C, N], their lengths [C], the original ids of their
    sentences (targets) [C, N], each copy's position i [C], each copy's sentence b [C]
    and each copy's span end e [C]. The body yields [C, N, ...] (row i of copy c is kept) or, once
    lm-prune-rows has run, [C, 1, ...] (only the kept row was computed).
    result[b, i, ...] = yielded[c(b, i), i or 0, ...]; rows past a length or without a copy are zero.
    ```mlir
    %lp = lm.masked_batch %ids, %lengths {mask_token = 4 : i64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32> {
    ^bb0(%copies: tensor<?x?xi32>, %copy_lengths: tensor<?xi32>, %targets: tensor<?x?xi32>, %positions: tensor<?xi32>,
         %owners: tensor<?xi32>, %ends: tensor<?xi32>):
      ...
      lm.yield %g : tensor<?x?xf32>
    }
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, Optional<Lm_I32Tensor>:$spans, I64Attr:$mask_token);
  let results = (outs Lm_F32Tensor:$result);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$ids `,` $lengths (`spans` `(` $spans^ `)`)? attr-dict `:` functional-type(operands, results) $body";
  let hasVerifier = 1;
}

def Lm_TakeRowOp : Lm_Op<"take_row", [Pure]> {
  let summary = "one row per batch entry: out[c, 0, ...] = x[c, positions[c], ...]";
  let description = [{
    Inside lm.masked_batch, copy c only needs the row at its masked position.
    ```mlir
    %r = lm.take_row %h, %positions : (tensor<?x?x512xf32>, tensor<?xi32>) -> tensor<?x1x512xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, Lm_I32Tensor:$positions);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input `,` $positions attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_TargetRowsOp : Lm_Op<"target_rows", [Pure]> {
  let summary = "the rows a training loss predicts, per sentence: (rows [B, T], row_targets [B, T])";
  let description = [{
    rows[b, j] = the j-th position t (ascending) with t < min(lengths[b], N) and targets[b, t] >= 0 (the rows
    lm.token_loss / lm.cross_entropy count), -1 for j >= count_b; row_targets[b, j] = targets[b, rows[b, j]],
    -1 where rows[b, j] = -1. T = max(1, max_b count_b), known only at run time. lm-prune-loss-rows makes it.
    ```mlir
    %rows, %row_targets = lm.target_rows %targets, %lengths : (tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xi32>, tensor<?x?xi32>)
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths);
  let results = (outs Lm_I32Tensor:$rows, Lm_I32Tensor:$row_targets);
  let assemblyFormat = "$targets `,` $lengths attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_GatherRowsOp : Lm_Op<"gather_rows", [Pure]> {
  let summary = "rows of each sentence by position: out[b, j, ...] = x[b, rows[b, j], ...] (0 where rows[b, j] < 0)";
  let description = [{
    `rows` [B, T] as lm.target_rows makes them (each position at most once per sentence, -1 padding).
    VJP: lm.scatter_rows of the gradient.
    ```mlir
    %xr = lm.gather_rows %x, %rows : (tensor<?x?x512xf32>, tensor<?x?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, Lm_I32Tensor:$rows);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input `,` $rows attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_ScatterRowsOp : Lm_Op<"scatter_rows", [Pure]> {
  let summary = "the inverse placement: out[b, rows[b, j], ...] = x[b, j, ...], 0 at every other row of [B, N, ...]";
  let description = [{
    N is dim 1 of `like` (any tensor with the result's [B, N] leading dims); rows as lm.gather_rows's, each
    position at most once per sentence, so nothing is summed. VJP: lm.gather_rows of the gradient.
    ```mlir
    %ce = lm.scatter_rows %ce_rows, %rows, %targets : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xi32>) -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, Lm_I32Tensor:$rows, AnyRankedTensor:$like);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input `,` $rows `,` $like attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_ConcatOp : Lm_Op<"concat", [Pure]> {
  let summary = "concatenation along the first axis (stacked weights for one wide GEMM)";
  let description = [{
    lm-hoist-isolated-kv stacks the weights of projections that read the same value.
    When every operand is an lm.weight, lmcc lays the tensors out contiguously at load
    time, so the concatenation is a view and costs nothing.
    ```mlir
    %w = lm.concat %wk0, %wv0 : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<1024x512xf32>
    ```
  }];
  let arguments = (ins Variadic<Lm_F32Tensor>:$inputs);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` functional-type($inputs, results)";
  let hasVerifier = 1;
}

def Lm_SliceFeaturesOp : Lm_Op<"slice_features", [Pure]> {
  let summary = "features [offset, offset + size) of the last axis";
  let description = [{
    ```mlir
    %k = lm.slice_features %kv {offset = 0 : i64, size = 512 : i64} : (tensor<?x?x1024xf32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, I64Attr:$offset, I64Attr:$size);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type($input, results)";
  let hasVerifier = 1;
}

def Lm_FoldedRowsOp : Lm_Op<"folded_rows", [Pure]> {
  let summary = "rows of a table computed once at load time: out[b, t] = table[t]";
  let description = [{
    lm-fold-constants moves subgraphs that depend only on weights and positions
    into private functions marked `lm.fold`, evaluated once on positions
    0 .. max_len-1 when the weights are loaded; `table` names that function. Only
    the shape of `ids` is read.
    ```mlir
    %q = lm.folded_rows %ids {table = @fold_0} : (tensor<?x?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$ids, FlatSymbolRefAttr:$table);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$ids attr-dict `:` functional-type($ids, results)";
}

def Lm_SpliceCopiesOp : Lm_Op<"splice_copies", [Pure, HasParent<"MaskedBatchOp">]> {
  let summary = "per-copy rows from shared per-sentence rows: the sentence's row, or the [MASK] row inside the copy's span";
  let description = [{
    Inside lm.masked_batch, copy c = (b, i) differs from sentence b only at rows [i, e).
    `sentence` [B, N, ...] and `masked` [B, N, ...] are computed once per sentence
    outside the batch (lm-share-first-layer): out[c, t] = masked[b, t] for i <= t < e,
    sentence[b, t] otherwise, with i = positions[c], b = owners[c], e = ends[c].
    ```mlir
    %k = lm.splice_copies %k_sentence, %k_masked, %positions, %owners, %ends : (tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>) -> tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$sentence, Lm_F32Tensor:$masked, Lm_I32Tensor:$positions, Lm_I32Tensor:$owners,
                   Lm_I32Tensor:$ends);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_YieldOp : Lm_Op<"yield", [Pure, Terminator, ReturnLike,
                                 ParentOneOf<["MaskAndPredictOp", "MaskedBatchOp"]>]> {
  let summary = "yields the region's per-row value from lm.mask_and_predict or lm.masked_batch";
  let description = [{
    ```mlir
    lm.yield %g : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

//===----------------------------------------------------------------------===//
// Training: losses and the backward ops lm-autodiff emits
//===----------------------------------------------------------------------===//
// Every backward op is the vector-Jacobian product of the forward op named in its summary; its
// meaning is the reference executor's `<op>Backward` (runtime/reference/Ops.h). Rows past a
// sentence's length carry zero gradient.

def Lm_CrossEntropyOp : Lm_Op<"cross_entropy", [Pure]> {
  let summary = "per-row loss: ce[b, t] = -(1-e) lp[b, t, y] - (e/V) sum_v lp[b, t, v], y = targets[b, t]";
  let description = [{
    0 where t >= lengths[b] or y < 0 (no prediction at that row); e = `smoothing`.
    The training loss is (1/T) sum ce over the T rows with a target (the runtime sums); with
    `per_length`, T = sum_b lengths[b] (the Diformer's: every target position counts).
    ```mlir
    %ce = lm.cross_entropy %lp, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$logprobs, Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths, F64Attr:$smoothing,
                       UnitAttr:$per_length);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$logprobs `,` $targets `,` $lengths attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_TokenLossOp : Lm_Op<"token_loss", [Pure]> {
  let summary = "fused vocabulary projection + log-softmax + cross_entropy; also the rows' log-sum-exp";
  let description = [{
    ce[b, t] as lm.cross_entropy of log_softmax(h W^T + bias); lse[b, t] = log sum_v exp(logit_v),
    kept for the backward. Streams vocabulary tiles: the [B, N, V] logits never exist. The loss is
    (1/T) sum ce with T the rows that have a target, or with `per_length` T = sum_b lengths[b] (the
    Diformer's denominator, every target position counted).
    ```mlir
    %ce, %lse = lm.token_loss %h, %E, %bias, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias, Lm_I32Tensor:$targets,
                       Lm_I32Tensor:$lengths, F64Attr:$smoothing, UnitAttr:$per_length);
  let results = (outs Lm_F32Tensor:$loss, Lm_F32Tensor:$lse);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_NgramLossOp : Lm_Op<"ngram_loss", [Pure, AttrSizedOperandSegments]> {
  let summary = "the n-gram objective per row: ce[b, s] = 1/2 CE_1 + 1/(2(n-1)) sum_j CE_j, heads through W u + b";
  let description = [{
    Head j (1-based operand order) at row s predicts y_j = targets[b, s+j-1] (the causal targets shifted;
    -1 past the sentence: no term). CE_j = -(1-e) log p_j(y_j) - (e/V) sum_v log p_j(v) with
    p_j = softmax(W heads[j] + bias). The training loss is (1/T) sum ce, T = the rows with a causal
    target (sum_b (L_b - 1)). lse holds each head's log-sum-exp for the backward. Streams vocabulary
    tiles (lm.token_loss per head): no [B, N, V] tensor.
    ```mlir
    %ce, %lse1, %lse2 = lm.ngram_loss heads(%h, %u2 : tensor<?x?x512xf32>, tensor<?x?x512xf32>)
        weight(%W : tensor<30522x512xf32>) bias(%b : tensor<30522xf32>)
        targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.0e-01 : f64}
        -> tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Variadic<Lm_F32Tensor>:$heads, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias,
                       Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths, F64Attr:$smoothing);
  let results = (outs Lm_F32Tensor:$loss, Variadic<Lm_F32Tensor>:$lse);
  let assemblyFormat = [{
    `heads` `(` $heads `:` type($heads) `)` `weight` `(` $weight `:` type($weight) `)`
    (`bias` `(` $bias^ `:` type($bias) `)`)? `targets` `(` $targets `,` $lengths `:` type($targets) `,`
    type($lengths) `)` attr-dict `->` type(results)
  }];
  let hasVerifier = 1;
}

def Lm_NgramLossGradOp : Lm_Op<"ngram_loss_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "VJP of lm.ngram_loss seeded with d ce = 1/T: (d heads..., dW, dbias)";
  let description = [{
    Per head j, lm.token_loss_grad of its shifted targets with the gradient scale w_j / T (w_1 = 1/2,
    w_j = 1/(2(n-1))), T counted on the unshifted targets; dW and dbias are the heads' sums.
    Operands as lm.ngram_loss's plus its lse results (one per head); d_bias ([V]) is a result even without
    a bias operand (then unused).
    ```mlir
    %d1, %d2, %dW, %db = lm.ngram_loss_grad heads(%h, %u2 : tensor<?x?x512xf32>, tensor<?x?x512xf32>)
        weight(%W : tensor<30522x512xf32>) bias(%b : tensor<30522xf32>)
        targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>)
        lse(%lse1, %lse2 : tensor<?x?xf32>, tensor<?x?xf32>) {smoothing = 1.0e-01 : f64}
        -> tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>
    ```
  }];
  let arguments = (ins Variadic<Lm_F32Tensor>:$heads, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias,
                       Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths, Variadic<Lm_F32Tensor>:$lse, F64Attr:$smoothing);
  let results = (outs Variadic<Lm_F32Tensor>:$d_heads, Lm_F32Tensor:$d_weight, Lm_F32Tensor:$d_bias);
  let assemblyFormat = [{
    `heads` `(` $heads `:` type($heads) `)` `weight` `(` $weight `:` type($weight) `)`
    (`bias` `(` $bias^ `:` type($bias) `)`)? `targets` `(` $targets `,` $lengths `:` type($targets) `,`
    type($lengths) `)` `lse` `(` $lse `:` type($lse) `)` attr-dict `->` type(results)
  }];
  let hasVerifier = 1;
}

def Lm_NgramLossAndGradOp : Lm_Op<"ngram_loss_and_grad", [Pure, AttrSizedOperandSegments, AttrSizedResultSegments]> {
  let summary = "lm.ngram_loss and its lm.ngram_loss_grad in one, each head's logits computed once";
  let description = [{
    Results as lm.ngram_loss's (ce, one lse per head) followed by lm.ngram_loss_grad's (one d_head per head, d_weight,
    d_bias) of the same operands and smoothing, bit for bit: head by head, the forward's logits are kept for that
    head's backward as lm.token_loss_and_grad keeps them (the sums over heads run in head order either way).
    lm-fuse-loss-grad forms it.
    ```mlir
    %ce, %lse1, %lse2, %d1, %d2, %dW, %db = lm.ngram_loss_and_grad heads(%h, %u2 : tensor<?x?x512xf32>, tensor<?x?x512xf32>)
        weight(%W : tensor<30522x512xf32>) bias(%b : tensor<30522xf32>)
        targets(%targets, %lengths : tensor<?x?xi32>, tensor<?xi32>) {smoothing = 1.0e-01 : f64}
        -> tensor<?x?xf32> lse(tensor<?x?xf32>, tensor<?x?xf32>) d_heads(tensor<?x?x512xf32>, tensor<?x?x512xf32>)
           tensor<30522x512xf32>, tensor<30522xf32>
    ```
  }];
  let arguments = (ins Variadic<Lm_F32Tensor>:$heads, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias,
                       Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths, F64Attr:$smoothing);
  let results = (outs Lm_F32Tensor:$loss, Variadic<Lm_F32Tensor>:$lse, Variadic<Lm_F32Tensor>:$d_heads,
                      Lm_F32Tensor:$d_weight, Lm_F32Tensor:$d_bias);
  let assemblyFormat = [{
    `heads` `(` $heads `:` type($heads) `)` `weight` `(` $weight `:` type($weight) `)`
    (`bias` `(` $bias^ `:` type($bias) `)`)? `targets` `(` $targets `,` $lengths `:` type($targets) `,`
    type($lengths) `)` attr-dict `->` type($loss) `lse` `(` type($lse) `)` `d_heads` `(` type($d_heads) `)`
    type($d_weight) `,` type($d_bias)
  }];
  let hasVerifier = 1;
}

def Lm_CrossEntropyGradOp : Lm_Op<"cross_entropy_grad", [Pure]> {
  let summary = "VJP of lm.cross_entropy seeded with d ce = 1/T: dlp[b, t, v] = -((1-e)[v = y] + e/V) / T";
  let description = [{
    T = the number of rows (t < lengths[b]) with targets[b, t] >= 0 in the batch (`per_length`: sum_b lengths[b]).
    ```mlir
    %dlp = lm.cross_entropy_grad %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?xi32>, tensor<?xi32>) -> tensor<?x?x30522xf32>
    ```
  }];
  let arguments = (ins Lm_I32Tensor:$targets, Lm_I32Tensor:$lengths, F64Attr:$smoothing, UnitAttr:$per_length);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$targets `,` $lengths attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_TokenLossGradOp : Lm_Op<"token_loss_grad", [Pure]> {
  let summary = "VJP of lm.token_loss seeded with d ce = 1/T (T as the loss's): (dh, dW, dbias), streaming vocabulary tiles";
  let description = [{
    dlogit = (softmax - (1-e) onehot(y) - e/V) / T from the saved lse; dh = dlogit W, dW = dlogit^T h,
    dbias = column sums of dlogit. No [B, N, V] tensor exists.
    ```mlir
    %dh, %dW, %db = lm.token_loss_grad %h, %E, %bias, %targets, %lengths, %lse {smoothing = 0.0 : f64} : (...) -> (tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias, Lm_I32Tensor:$targets,
                       Lm_I32Tensor:$lengths, Lm_F32Tensor:$lse, F64Attr:$smoothing, UnitAttr:$per_length);
  let results = (outs Lm_F32Tensor:$d_hidden, Lm_F32Tensor:$d_weight, Lm_F32Tensor:$d_bias);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_TokenLossAndGradOp : Lm_Op<"token_loss_and_grad", [Pure]> {
  let summary = "lm.token_loss and its lm.token_loss_grad in one: (ce, lse, dh, dW, dbias), the logits computed once";
  let description = [{
    Results as lm.token_loss's (ce, lse) followed by lm.token_loss_grad's (d_hidden, d_weight, d_bias) of the
    same operands and attributes, bit for bit: the backward reuses the forward's logits (the live rows' logits
    with the bias added, kept while they take at most 512 MiB of the call's workspace) instead of computing
    them again, and recomputes them (the same GEMM, the same bits) beyond that. lm-fuse-loss-grad forms it from a
    token_loss whose lse feeds a token_loss_grad of the same operands.
    ```mlir
    %ce, %lse, %dh, %dW, %db = lm.token_loss_and_grad %h, %E, %bias, %targets, %lengths {smoothing = 0.0 : f64} : (tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>, tensor<?x?xi32>, tensor<?xi32>) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x512xf32>, tensor<30522x512xf32>, tensor<30522xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_F32Tensor:$weight, Optional<Lm_F32Tensor>:$bias, Lm_I32Tensor:$targets,
                       Lm_I32Tensor:$lengths, F64Attr:$smoothing, UnitAttr:$per_length);
  let results = (outs Lm_F32Tensor:$loss, Lm_F32Tensor:$lse, Lm_F32Tensor:$d_hidden, Lm_F32Tensor:$d_weight,
                      Lm_F32Tensor:$d_bias);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_LogSoftmaxGradOp : Lm_Op<"log_softmax_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "VJP of lm.log_softmax: dx = dy - exp(y) sum(dy) over the last axis (y its result)";
  let description = [{
    `grad` is dy, the gradient of lm.log_softmax's result; `output` is that result y (log-probabilities),
    not its input. Per row of the last axis, in double: dx_j = dy_j - exp(y_j) sum_k dy_k, rounded to float
    once. grad, output and result share one type (any rank; [B, N, V] after lm.cross_entropy_grad).
    ```mlir
    %dx = lm.log_softmax_grad %dlp, %lp : tensor<?x?x30522xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$output);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$grad `,` $output attr-dict `:` type($result)";
}

def Lm_SoftmaxGradOp : Lm_Op<"softmax_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "VJP of lm.softmax: dx = p (dy - sum(dy p)) over the last axis (p its result)";
  let description = [{
    `grad` is dy, the gradient of lm.softmax's result; `output` is that result p, not its input. Per row of
    the last axis: dx_j = p_j (dy_j - sum_k p_k dy_k), the sum in double. Entries with p = 0 (hidden and
    padding keys) and rows that see no key get 0, so lm.mask_fill's VJP just passes dx on. grad, output and
    result share one type: scores [B, H, N, M] (M != N in a cross-attention).
    ```mlir
    %ds = lm.softmax_grad %dp, %p : tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$output);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$grad `,` $output attr-dict `:` type($result)";
}

def Lm_LinearGradOp : Lm_Op<"linear_grad", [Pure]> {
  let summary = "VJP of lm.linear: dx = dy W, dW = dy^T x, dbias = column sums of dy (over all rows)";
  let description = [{
    ```mlir
    %dx, %dW, %db = lm.linear_grad %dy, %x, %W : (tensor<?x?x512xf32>, tensor<?x?x2048xf32>, tensor<512x2048xf32>) -> (tensor<?x?x2048xf32>, tensor<512x2048xf32>, tensor<512xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$input, Lm_F32Tensor:$weight);
  let results = (outs Lm_F32Tensor:$d_input, Lm_F32Tensor:$d_weight, Lm_F32Tensor:$d_bias);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_LayerNormGradOp : Lm_Op<"layer_norm_grad", [Pure]> {
  let summary = "VJP of lm.layer_norm: (dx, dgamma, dbeta), statistics recomputed in double from x";
  let description = [{
    grad dy and input x (the forward's input) share a type [..., D]; gamma [D]; `epsilon` is the forward's
    (beta is not needed). Per row, in double: mean, biased var, inv = 1 / sqrt(var + eps),
    xhat = (x - mean) inv, g = dy gamma; dx = inv (g - mean(g) - xhat mean(g xhat)) (x's type);
    dgamma = sum over rows of dy xhat, dbeta = sum over rows of dy ([D] each), summed in double over every
    row and rounded once (padding rows have dy = 0: they add nothing and get dx = 0).
    ```mlir
    %dx, %dg, %db = lm.layer_norm_grad %dy, %x, %g {epsilon = 1.0e-12 : f64} : (tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<512xf32>) -> (tensor<?x?x512xf32>, tensor<512xf32>, tensor<512xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$input, Lm_F32Tensor:$gamma, F64Attr:$epsilon);
  let results = (outs Lm_F32Tensor:$d_input, Lm_F32Tensor:$d_gamma, Lm_F32Tensor:$d_beta);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_ActivationGradOp : Lm_Op<"activation_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "VJP of lm.gelu / lm.relu: dx = dy f'(x); `kind` is gelu, gelu_tanh or relu";
  let description = [{
    `input` is the forward's input x (the pre-activation: lm-autodiff splits an lm.linear {activation} back
    into lm.linear + the activation first). f' by `kind`: gelu (lm.gelu) Phi(x) + x phi(x); gelu_tanh
    (lm.gelu {approximate}) 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
    u = sqrt(2/pi) (x + 0.044715 x^3); relu (lm.relu) 1 where x > 0, else 0 (0 at x = 0, as torch).
    Elementwise; grad, input and result share one type. The compiled kernel evaluates f' in float, the
    reference (runtime/reference/Ops.cpp geluBackward) in double: equal up to float rounding, not bit for bit.
    ```mlir
    %dx = lm.activation_grad %dy, %x {kind = "gelu"} : tensor<?x?x2048xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$input, StrAttr:$kind);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$grad `,` $input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Lm_AttentionGradOp : Lm_Op<"attention_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "VJP of lm.attention (no query positions): (dq, dk, dv[, drel_k, drel_v])";
  let description = [{
    Per (sentence, head, query row) the probabilities are recomputed from q and k (max and sum of
    exponentials in double, as the forward); dp = dO (V [+ rel_v])^T, ds = p (dp - dO . O),
    dq = scale ds (K [+ rel_k]), dk += scale ds^T q, dv += p^T dO; with Shaw relative positions
    (both tables given) also the tables' gradients, summed over sentences and heads. Masked and
    padding keys get nothing; the directional mask reads its rows operand like the forward. Query rows
    i < query_lengths[b] are differentiated (default: `lengths`, the keys'; a cross-attention's queries
    are another sequence). No n x n tensor.
    ```mlir
    %dq, %dk, %dv = lm.attention_grad %dc, %q, %k, %v, %lengths {heads = 8 : i64, mask = #lm.mask<causal>, scale = 0.125 : f32}
         : tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32> -> tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>
    %dq2, %dk2, %dv2 = lm.attention_grad %dc2, %a, %m, %m, %src_len query_lengths(%tgt_len : tensor<?xi32>)
         {heads = 8 : i64, mask = #lm.mask<none>, scale = 0.125 : f32}
         : tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32> -> tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>
    %dq3, %dk3, %dv3, %drel:2 = lm.attention_grad %dc3, %q, %y, %y, %tgt_len data(%rows : tensor<?x?x2xi32>)
         relative(%relk, %relv : tensor<33x64xf32>, tensor<33x64xf32>) {clip = 16 : i64, heads = 8 : i64, mask = #lm.mask<directional>, scale = 0.125 : f32}
         : tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?xi32> -> tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<?x?x512xf32>, tensor<33x64xf32>, tensor<33x64xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$query, Lm_F32Tensor:$key, Lm_F32Tensor:$value,
                       Lm_I32Tensor:$lengths, Optional<Lm_I32Tensor>:$mask_data, Optional<Lm_I32Tensor>:$query_lengths,
                       Optional<Lm_F32Tensor>:$rel_key, Optional<Lm_F32Tensor>:$rel_value, I64Attr:$heads,
                       Lm_MaskAttr:$mask, F32Attr:$scale, DefaultValuedAttr<I64Attr, "0">:$clip);
  let results = (outs Lm_F32Tensor:$d_query, Lm_F32Tensor:$d_key, Lm_F32Tensor:$d_value,
                      Variadic<Lm_F32Tensor>:$d_relative);
  let assemblyFormat = [{
    $grad `,` $query `,` $key `,` $value `,` $lengths (`data` `(` $mask_data^ `:` type($mask_data) `)`)?
    (`query_lengths` `(` $query_lengths^ `:` type($query_lengths) `)`)?
    (`relative` `(` $rel_key^ `,` $rel_value `:` type($rel_key) `,` type($rel_value) `)`)? attr-dict `:`
    type($grad) `,` type($query) `,` type($key) `,` type($value) `,` type($lengths) `->` type(results)
  }];
  let hasVerifier = 1;
}

def Lm_RelativeScoresGradOp : Lm_Op<"relative_scores_grad", [Pure]> {
  let summary = "VJP of lm.relative_scores: dq[i] = sum_j dout[i, j] rel[c], drel[c] = sum dout[i, j] q[i]";
  let description = [{
    grad dout [B, H, N, M], query [B, H, N, dh] and rel [2k+1, dh] as the forward's, k = `clip`, and
    c = clip(j - i, -k, k) + k; the forward's keys are not needed (M is dout's last axis). dq (query's
    type) as in the summary; drel (rel's type) sums dout[b, h, i, j] q[b, h, i] over sentences, heads and
    (i, j), one partial sum per (sentence, head) added in that order (the same for any thread count).
    Entries where dout = 0 (hidden and padding keys, after lm.softmax_grad) add nothing.
    ```mlir
    %dq, %drel = lm.relative_scores_grad %ds, %qh, %relk {clip = 16 : i64} : (tensor<?x8x?x?xf32>, tensor<?x8x?x64xf32>, tensor<33x64xf32>) -> (tensor<?x8x?x64xf32>, tensor<33x64xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$query, Lm_F32Tensor:$rel, I64Attr:$clip);
  let results = (outs Lm_F32Tensor:$d_query, Lm_F32Tensor:$d_rel);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_RelativeValuesGradOp : Lm_Op<"relative_values_grad", [Pure]> {
  let summary = "VJP of lm.relative_values: dp[i, j] = dout[i] . rel[c], drel[c] = sum p[i, j] dout[i]";
  let description = [{
    grad dout [B, H, N, dh], probs p [B, H, N, M] (the forward's) and rel [2k+1, dh], k = `clip`,
    c = clip(j - i, -k, k) + k. dp (probs' type) as in the summary; drel (rel's type) sums
    p[b, h, i, j] dout[b, h, i] over sentences, heads and (i, j), one partial sum per (sentence, head)
    added in that order (the same for any thread count); keys with p = 0 add nothing.
    ```mlir
    %dp, %drel = lm.relative_values_grad %dc, %p, %relv {clip = 16 : i64} : (tensor<?x8x?x64xf32>, tensor<?x8x?x?xf32>, tensor<33x64xf32>) -> (tensor<?x8x?x?xf32>, tensor<33x64xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_F32Tensor:$probs, Lm_F32Tensor:$rel, I64Attr:$clip);
  let results = (outs Lm_F32Tensor:$d_probs, Lm_F32Tensor:$d_rel);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_EmbedGradOp : Lm_Op<"embed_grad", [Pure]> {
  let summary = "VJP of lm.embed: dtable[v] = acc[v] + the sum of dy[b, t] over valid (b, t) with ids[b, t] = v";
  let description = [{
    grad dy [B, N, D], the forward's ids [B, N] and the lengths [B] that pad them; the result is the
    table's gradient [V, D] (static: the table's type). A scatter-add in float, sentences and positions in
    order; rows t >= lengths[b] are never read, and the compiled kernel skips ids outside [0, V) (the
    reference refuses them). Without `into`, table rows no id reaches are 0. With `into(%acc)` (the dense
    gradient of a tied table's other uses: the output head's dW), row v is acc[v] + s_v, s_v the row's
    scatter sum (from 0, in order), and rows no id reaches are acc's: lm.add of acc and the plain form,
    without the zeroed table and the pass over two [V, D] tables (lm-autodiff emits this form for tied
    tables; the lowering writes into acc's buffer when this op is its only use).
    ```mlir
    %dE = lm.embed_grad %dx, %ids, %lengths : (tensor<?x?x512xf32>, tensor<?x?xi32>, tensor<?xi32>) -> tensor<30522x512xf32>
    %dT = lm.embed_grad %dx, %ids, %lengths into(%dW) : (tensor<?x?x512xf32>, tensor<?x?xi32>, tensor<?xi32>, tensor<30522x512xf32>) -> tensor<30522x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_I32Tensor:$ids, Lm_I32Tensor:$lengths, Optional<Lm_F32Tensor>:$into);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$grad `,` $ids `,` $lengths (`into` `(` $into^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_PositionsGradOp : Lm_Op<"positions_grad", [Pure]> {
  let summary = "VJP of lm.positions with a learned table: dP[t] = sum over sentences b with t < lengths[b] of dy[b, t]";
  let description = [{
    grad dy [B, N, D] and the lengths [B] that pad the forward's ids; the result is the learned table's
    gradient [L, D] (static: the table's type, N <= L). Float sums, sentences in order; table rows no
    sentence reaches are 0. Sinusoidal positions (no table operand) have no parameters and no VJP.
    ```mlir
    %dP = lm.positions_grad %dx, %lengths : (tensor<?x?x512xf32>, tensor<?xi32>) -> tensor<128x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_I32Tensor:$lengths);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Lm_DecoderQueriesGradOp : Lm_Op<"decoder_queries_grad", [Pure]> {
  let summary = "VJP of lm.decoder_queries: (d direction [3, D], d l2r, d r2l [max_len, D]) from rows i < n";
  let description = [{
    grad dy [B, N, D], the forward's rows [B, N, 1 + W] (only z_i = rows[b, i, 0] is read) and lengths [B].
    For each b and i < n = lengths[b], in that order (float sums): d direction[d] += dy[b, i] with d = 1 for
    an L row, 2 for S, 0 for R and skip; d r2l[n-1-i] += dy[b, i] for an L row, else d l2r[i] += dy[b, i].
    Rows at or past n (which the forward fills with direction[0] + l2r[i]) contribute nothing; table rows
    no row reaches are 0. The results have the tables' types: direction [3, D], l2r and r2l [max_len, D].
    ```mlir
    %ddir, %dl2r, %dr2l = lm.decoder_queries_grad %dq, %rows, %lengths : (tensor<?x?x64xf32>, tensor<?x?x2xi32>, tensor<?xi32>) -> (tensor<3x64xf32>, tensor<24x64xf32>, tensor<24x64xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Lm_I32Tensor:$rows, Lm_I32Tensor:$lengths);
  let results = (outs Lm_F32Tensor:$d_direction, Lm_F32Tensor:$d_l2r, Lm_F32Tensor:$d_r2l);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def Lm_LengthLossGradOp : Lm_Op<"length_loss_grad", [Pure]> {
  let summary = "VJP of weight * mean_b(-lm.length_logprob): (d hidden [B, M, D], d W [max_len, D])";
  let description = [{
    The Diformer's length loss, seeded with d length_logprob[b] = -weight / B: dlogit_b = seed (onehot(n_b) -
    softmax(W m_b)), dW = sum_b dlogit_b m_b^T, d hidden[b, j] = (W^T dlogit_b) / lengths[b] for j < lengths[b].
    Operands as lm.length_logprob's (target_lengths required); `loss_weight` is the pair loss's
    lm.length_loss. The forward is recomputed per sentence (float means, log-softmax in double); rows
    j >= lengths[b] of d hidden are 0.
    ```mlir
    %dh, %dW = lm.length_loss_grad %h, %src_len, %W, %tgt_len {loss_weight = 1.0e-01 : f64} : (tensor<?x?x64xf32>, tensor<?xi32>, tensor<24x64xf32>, tensor<?xi32>) -> (tensor<?x?x64xf32>, tensor<24x64xf32>)
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$hidden, Lm_I32Tensor:$lengths, Lm_F32Tensor:$weight,
                       Lm_I32Tensor:$target_lengths, F64Attr:$loss_weight);
  let results = (outs Lm_F32Tensor:$d_hidden, Lm_F32Tensor:$d_weight);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def Lm_DropoutOp : Lm_Op<"dropout", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "dropout of a [B, N, C] activation or [B, H, N, M] attention probabilities: x * keep / (1 - rate) when `training`, else x";
  let description = [{
    The mask is a pure function of ([train] seed, the training step, `site`, sentence, row, feature):
    dropoutKeep in runtime/train/Philox.h; the step is the trainer's (0 outside a trainer). On attention
    probabilities [B, H, N, M] element (b, h, i, j) is dropoutKeep's (sentence b H + h, row i, feature j).
    Rows past a sentence's length are 0. MLIRGen puts these in the `loss` entry; lm-autodiff marks the copy in
    `loss_grad` `training` and takes them out of `loss` (used for validation, it evaluates without dropout).
    With `rows` [B, T] (lm.target_rows's; lm-prune-loss-rows) the activation holds packed rows: its row j of
    sentence b is the sentence's row rows[b, j] for the mask (0 where that is -1), so the kept rows get the
    masks they have in the full [B, N, C] activation.
    ```mlir
    %y = lm.dropout %x {rate = 1.000000e-01 : f64, site = 0 : i64, training} : tensor<?x?x512xf32>
    %p = lm.dropout %probs {rate = 1.000000e-01 : f64, site = 1048576 : i64, training} : tensor<?x8x?x?xf32>
    %z = lm.dropout %packed rows(%rows : tensor<?x?xi32>) {rate = 1.000000e-01 : f64, site = 3 : i64} : tensor<?x?x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$input, Optional<Lm_I32Tensor>:$rows, F64Attr:$rate, I64Attr:$site,
                       UnitAttr:$training);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$input (`rows` `(` $rows^ `:` type($rows) `)`)? attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Lm_DropoutGradOp : Lm_Op<"dropout_grad", [Pure, AllTypesMatch<["grad", "result"]>]> {
  let summary = "VJP of a training lm.dropout: dy * keep / (1 - rate), the same mask";
  let description = [{
    `rate` and `site` are the forward lm.dropout's (lm-autodiff copies them): the keep mask is recomputed
    from ([train] seed, the training step, site, sentence (b H + h for probabilities), row, feature) by
    dropoutKeep (runtime/train/Philox.h), not stored, so it equals the forward's bit for bit. grad is a
    [B, N, C] activation gradient or a [B, H, N, M] probability gradient; the result has its type; rows past
    a sentence's length are 0. No `training` flag: lm-autodiff emits it only in `loss_grad`, where every
    lm.dropout trains. `rows`: the forward's (packed rows).
    ```mlir
    %dx = lm.dropout_grad %dy {rate = 1.000000e-01 : f64, site = 0 : i64} : tensor<?x?x512xf32>
    %dp = lm.dropout_grad %dpd {rate = 1.000000e-01 : f64, site = 1048576 : i64} : tensor<?x8x?x?xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, Optional<Lm_I32Tensor>:$rows, F64Attr:$rate, I64Attr:$site);
  let results = (outs Lm_F32Tensor:$result);
  let assemblyFormat = "$grad (`rows` `(` $rows^ `:` type($rows) `)`)? attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Lm_ParamGradOp : Lm_Op<"param_grad", [MemoryEffects<[MemWrite]>]> {
  let summary = "the gradient of the canonical weight `name`: written to its slot of the entry's gradient buffer";
  let description = [{
    ```mlir
    lm.param_grad %dE {name = "embed.token"} : tensor<30522x512xf32>
    ```
  }];
  let arguments = (ins Lm_F32Tensor:$grad, StrAttr:$name);
  let assemblyFormat = "$grad attr-dict `:` type($grad)";
  let hasVerifier = 1;
}

#endif // LM_OPS_TD
