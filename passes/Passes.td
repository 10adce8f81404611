//===- Passes.td - lmcc optimization passes --------------------------------===//
//
// Every pass is exact: the optimized and the naive pipeline give the same numbers
// (tests/unit/PassesTest.cpp proves it per family on odd sizes).
//
//===----------------------------------------------------------------------===//
#ifndef LMCC_PASSES_TD
#define LMCC_PASSES_TD

include "mlir/Pass/PassBase.td"

def LmFuseAttention : Pass<"lm-fuse-attention", "::mlir::ModuleOp"> {
  let summary = "Fuse split_heads/matmul/scale/mask_fill/softmax/matmul/merge_heads chains into lm.attention";
  let description = [{
    Matches the decomposed attention MLIRGen emits (optionally with Shaw
    relative-position terms) and replaces it with one `lm.attention` whose mask is
    an attribute. Its CPU lowering is a tiled online-softmax loop nest: tiles that
    the mask hides entirely are skipped, tiles it shows entirely run without a
    mask test, and no n x n score tensor exists beyond one tile.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmFuseLogprob : Pass<"lm-fuse-logprob", "::mlir::ModuleOp"> {
  let summary = "Fuse vocabulary projection + log_softmax + gather into lm.token_logprob";
  let description = [{
    `gather(log_softmax(linear(h, W, b)), ids)` where the log-probabilities have no
    other use becomes `lm.token_logprob(h, W, b, ids)`, lowered as a stream over
    vocabulary tiles with a running max and sum: the [n, V] logits are never stored.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmBatchMaskPredict : Pass<"lm-batch-mask-predict", "::mlir::ModuleOp"> {
  let summary = "Run lm.mask_and_predict as one batched computation over all masked copies (lm.masked_batch)";
  let description = [{
    The naive lm.mask_and_predict runs its body once per position. This pass moves
    the body into an lm.masked_batch, which runs it once over the sum(lengths)
    masked copies of all sentences; values the body captured with the sentence
    batch as leading dimension (ids as targets, lengths) become per-copy values.
    Batching alone saves no FLOPs; it makes lm-prune-rows possible and turns n
    small GEMMs into one large one.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmPruneRows : Pass<"lm-prune-rows", "::mlir::ModuleOp"> {
  let summary = "Dead-row elimination in lm.masked_batch: compute only the row each copy keeps";
  let description = [{
    Copy c of an lm.masked_batch keeps only row i (its masked position). Walking
    back from the yield, row-local ops (linear, norms, activations, residuals,
    log-softmax, gathers) are recomputed on that row only, and the last attention
    computes one query row per copy against all keys and values. With
    lm-fuse-attention and lm-fuse-logprob first, the head runs on n rows instead of n^2.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmPruneLossRows : Pass<"lm-prune-loss-rows", "::mlir::ModuleOp"> {
  let summary = "Dead-row elimination in a training loss: the last layer's query side only on the rows with a target";
  let description = [{
    A training loss (lm.token_loss or lm.cross_entropy returned by a `loss` function) reads only the rows with a
    target. Walking back from its hidden states, row-local ops run on those rows, packed per sentence by
    lm.target_rows / lm.gather_rows ([B, T, D], T known at run time), and an attention without a mask (the biLM's)
    computes only those query rows against every key and value; lm.scatter_rows puts the per-row losses back in
    place. Applied only where such an attention is pruned.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmShareFirstLayer : Pass<"lm-share-first-layer", "::mlir::ModuleOp"> {
  let summary = "Compute the first layer's inputs and projections once per sentence, not once per masked copy";
  let description = [{
    In lm.masked_batch every copy equals its sentence except at its masked row.
    Values computed from the copies' ids by row-local ops only (embeddings, the
    embedding norm, first-layer projections) are computed once on the sentence and
    once on all-[MASK] ids, outside the batch, and each copy takes lm.splice_copies
    of the two: the sentence's rows with the [MASK] row at its position. Exact.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmHoistIsolatedKV : Pass<"lm-hoist-isolated-kv", "::mlir::ModuleOp"> {
  let summary = "Stack projections that read the same value into one wide GEMM (T-TA's isolated keys/values)";
  let description = [{
    Under input isolation every layer's keys and values project the one embedding
    value X: the 2L projections become one linear with stacked weights
    (lm.concat, laid out contiguously at load time) before the layer stack, and
    each layer reads its lm.slice_features. Elsewhere the same rewrite joins each
    layer's Q/K/V projections of one input. Exact.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmFoldConstants : Pass<"lm-fold-constants", "::mlir::ModuleOp"> {
  let summary = "Compute subgraphs that depend only on weights and positions once, at load time";
  let description = [{
    Values computed from positions (and constant ids such as all-[MASK]) and weights
    by row-local ops are the same in every call: T-TA's first query norm(P) and its
    projection with first_query = position. Each one the program reads moves into
    a private function marked `lm.fold`, evaluated on positions 0..max_len-1 when
    the weights are loaded; the program reads rows [0, N) with lm.folded_rows.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect", "::mlir::func::FuncDialect"];
}

def LmFuseActivation : Pass<"lm-fuse-activation", "::mlir::ModuleOp"> {
  let summary = "Fold an activation into the linear that feeds it: lm.linear {activation}";
  let description = [{
    `gelu(linear(x, W, b))` (and `gelu {approximate}`, `relu`) where the linear's result has no other use becomes
    `linear(x, W, b) {activation = "gelu"}` ("gelu_tanh", "relu"). The generated GEMM applies the activation to
    each panel of a row block as soon as it has finished it (still in L1/L2), so the FFN's [rows, d_ff]
    pre-activation is neither read back from memory nor kept: one buffer and one pass over memory less per layer.
    Exact: the same operations on the same values, bit for bit. Runs last, so the passes before it see plain linears (lm-autodiff splits a fused one back).
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmFuseLossGrad : Pass<"lm-fuse-loss-grad", "::mlir::ModuleOp"> {
  let summary = "Fuse lm.token_loss and the lm.token_loss_grad of its lse into lm.token_loss_and_grad";
  let description = [{
    Runs after lm-autodiff: in the loss_grad entry the loss head's forward (lm.token_loss) and its VJP
    (lm.token_loss_grad, reading the forward's lse) project the same hidden rows onto the vocabulary. The fused
    op computes the logits once and keeps them for the backward (the live rows' [R, V] logits, while they take
    at most 512 MiB), where the pair computed them twice; the numbers are the pair's, bit for bit.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect"];
}

def LmAutodiff : Pass<"lm-autodiff", "::mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation of the training loss: a `loss_grad` entry with the VJP of every lm op";
  let description = [{
    For every function with lm.method "loss" (MLIRGen's `loss(inputs, targets, lengths) -> ce [B, N]`,
    after the optimization passes), adds a copy `loss_grad` (lm.method "loss_grad") that also computes
    the gradient of the batch loss (1/T) sum ce with respect to every weight: ops are visited in
    reverse, each op's vector-Jacobian product is emitted as lm backward ops (lm.linear_grad,
    lm.attention_grad, lm.token_loss_grad, ...), gradients of values used several times are summed,
    and the gradient of each canonical weight (summed over every lm.weight of that name: tied
    embeddings) is written by one lm.param_grad. Works on the naive and on the fused forms, so the
    gradients of every pipeline agree. Masks need no VJP of their own: a hidden key has probability 0,
    so lm.softmax_grad gives it a zero score gradient.
  }];
  let dependentDialects = ["::lmcc::lm::LmDialect", "::mlir::func::FuncDialect"];
}

#endif // LMCC_PASSES_TD
