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

#endif // LMCC_PASSES_TD
