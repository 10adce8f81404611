//===- Stats.h - FLOP and temporary-memory counts read off lm IR ------------===//
//
// Static cost of scoring ONE sentence of n tokens (batch 1) with each entry point
// of an `lm` module, counted from the IR as it stands (naive or optimized), so the
// effect of a pass shows up as a change in the numbers.
//
// Dynamic dims follow the rule used everywhere in lmcc: in each tensor type the
// first `?` is the batch (B = 1 here) and every further `?` is the sequence
// length (N = M = n). Inside an lm.masked_batch body the batch is its copies:
// C = sum(lengths) = n.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir {
class Operation;
class Type;
} // namespace mlir

namespace lmcc::codegen {

struct EntryStats {
  std::string entry; ///< the func.func's name
  int64_t flops;     ///< 2 per multiply-add of every matrix product
  int64_t tempBytes; ///< peak bytes of live temporaries
};

/// One EntryStats per func.func of `lmModule` (in module order), for one sentence
/// of `n` tokens at batch 1.
///
/// flops: matrix products only (lm.linear, lm.matmul, lm.relative_scores,
/// lm.relative_values, lm.attention, lm.token_logprob); elementwise work, norms
/// and softmaxes are not counted. lm.attention counts its full Q K^T and P V
/// products (4*B*N*M*D, twice that with relative positions), masks not discounted,
/// so the count is invariant under lm-fuse-attention. lm.mask_and_predict runs its
/// body once per position: body flops * n; lm.masked_batch runs it once at batch n.
///
/// tempBytes: the program order of each function is simulated; every tensor
/// result is allocated when its op runs and freed after its last use in the
/// block. lm.weight results (inputs), function arguments and the values the
/// function returns (outputs) are not temporaries. A lm.mask_and_predict body's
/// temporaries (its masked-ids argument included) live for one iteration: at
/// that op the peak is what is live outside + the op's own result + the body's
/// peak (an lm.masked_batch body: all n copies at once).
/// Throws std::overflow_error when a count exceeds 2^63 - 1 (counted in 128 bits, never wrapped).
std::vector<EntryStats> countStats(mlir::ModuleOp lmModule, int64_t n);

/// Upper bounds on the temporaries of one call of an entry point, per sentence length n (index 0..maxLen):
/// B sentences padded to n with C masked copies (lm.masked_batch) need at most B * perSentence[n] +
/// C * perCopy[n] bytes (perCopy is 0 without a masked batch). The runtime cuts calls to fit a workspace
/// limit with these tables; unlike tempBytes they count what the kernels allocate: each tensor with the 64 bytes
/// its aligned allocation adds, and the ops' own scratch while they run (LmToLoops/Scratch.h: lm.token_logprob's partials and logits,
/// lm.attention's keys, values and scores). Empty when the module has no such entry. `amxCopies`: the library's
/// GEMMs are the AMX kernel's (bf16 weights on an AMX target), which round each product's input to a bf16 copy
/// (rows padded to 32) that lives while the product runs; counted for every lm.linear and lm.token_logprob.
/// These two terms bound a call on one thread. With T threads a kernel runs up to T of its work items at once, each
/// with its own scratch: perThread[n] bounds what one more thread's item holds for sentences of at most n tokens
/// (an lm.attention task's keys, values and scores; with `generatedGemm` an lm.token_logprob item's logits), so a
/// call on T threads needs at most B * perSentence[n] + C * perCopy[n] + (T - 1) * perThread[n].
struct MemoryModel {
  std::vector<int64_t> perSentence, perCopy, perThread;
};
MemoryModel memoryModel(mlir::ModuleOp lmModule, llvm::StringRef entry, int64_t maxLen, bool amxCopies = false,
                        bool generatedGemm = true);

/// Bytes of a tensor type with B = 1 and every further dynamic dim = n (0 for a
/// non-tensor type).
int64_t tensorBytes(mlir::Type type, int64_t n);

/// FLOPs of one op (its nested regions included, lm.mask_and_predict's body n times).
int64_t opFlops(mlir::Operation *op, int64_t n);

} // namespace lmcc::codegen
