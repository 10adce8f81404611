//===- Stats.cpp - FLOP and temporary-memory counts read off lm IR ----------===//
#include "codegen/Stats.h"
#include "codegen/LmToLoops/Gemm.h"
#include "codegen/LmToLoops/Scratch.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// What the dynamic dims stand for: the first `?` of a type is the batch, every
/// further one the sequence length n. The batch is 1 (one sentence) except inside an
/// lm.masked_batch body, whose batch is the C = sum(lengths) = n masked copies.
/// The dynamic sizes: batch (the first `?` of a type), n (every further `?`) and, inside an lm.masked_batch
/// body, copies (the body's batch).
struct Sizes {
  int64_t batch, n, copies;
};

/// Counts are computed in 128 bits (a huge spec cannot wrap them) and narrowed with a check at the end.
using Wide = __int128;

int64_t narrow(Wide v, const char *what) {
  if (v < 0 || v > Wide(INT64_MAX))
    throw std::overflow_error(std::string(what) + " exceed 2^63 - 1: the spec is too large to count");
  return static_cast<int64_t>(v);
}

/// The shape of `type` with the first dynamic dim = the batch and every further one = n.
SmallVector<int64_t> resolvedShape(Type type, Sizes z) {
  SmallVector<int64_t> shape;
  auto ranked = llvm::dyn_cast<RankedTensorType>(type);
  if (!ranked)
    return shape;
  bool batchSeen = false;
  for (int64_t d : ranked.getShape()) {
    if (ShapedType::isDynamic(d)) {
      shape.push_back(batchSeen ? z.n : z.batch);
      batchSeen = true;
    } else {
      shape.push_back(d);
    }
  }
  return shape;
}

Wide product(ArrayRef<int64_t> dims) {
  Wide p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

/// Product of every dim but the last (the rows of a map over the last axis).
Wide rows(Value v, Sizes z) {
  SmallVector<int64_t> s = resolvedShape(v.getType(), z);
  return s.empty() ? 0 : product(ArrayRef<int64_t>(s).drop_back());
}

Wide lastDim(Value v, Sizes z) {
  SmallVector<int64_t> s = resolvedShape(v.getType(), z);
  return s.empty() ? 0 : s.back();
}

Wide elements(Value v, Sizes z) { return product(resolvedShape(v.getType(), z)); }

/// lm.masked_batch (lm-batch-mask-predict's rewrite of lm.mask_and_predict), matched by
/// name: its body runs once, over n copies of the sentence.
bool isMaskedBatch(Operation *op) { return op->getName().getStringRef() == "lm.masked_batch"; }

/// The sizes inside the regions of `op`.
Sizes regionSizes(Operation *op, Sizes z) { return isMaskedBatch(op) ? Sizes{z.copies, z.n, z.copies} : z; }

/// FLOPs of `op` itself, not of its regions.
Wide ownFlops(Operation *op, Sizes z) {
  if (auto linear = llvm::dyn_cast<lm::LinearOp>(op)) {
    auto w = linear.getWeight().getType(); // [out, in]
    return 2 * rows(linear.getInput(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto matmul = llvm::dyn_cast<lm::MatmulOp>(op)) // [..., M, K] x [..., K, N]: 2 * (... M N) * K
    return 2 * elements(matmul.getResult(), z) * lastDim(matmul.getLhs(), z);
  if (auto rel = llvm::dyn_cast<lm::RelativeScoresOp>(op)) // each of [B, H, N, M] is a dh-long dot product
    return 2 * elements(rel.getResult(), z) * lastDim(rel.getQuery(), z);
  if (auto rel = llvm::dyn_cast<lm::RelativeValuesOp>(op)) // each of [B, H, N, dh] sums M products
    return 2 * elements(rel.getResult(), z) * lastDim(rel.getProbs(), z);
  if (auto attn = llvm::dyn_cast<lm::AttentionOp>(op)) {
    // Counted as the decomposed chain computes it: Q K^T and P V, 2*B*H*N*M*dh each
    // (= 4*B*N*M*D together), plus the same again for the Shaw relative terms. The
    // full products are counted even when the mask would let a lowering skip the
    // invisible keys (causal/diagonal): the count is of the op's meaning, not of a
    // particular lowering, so it is invariant under lm-fuse-attention.
    Wide bn = rows(attn.getQuery(), z);                      // B * N
    Wide m = resolvedShape(attn.getKey().getType(), z)[1]; // M
    Wide d = lastDim(attn.getQuery(), z);                    // D = H * dh
    Wide products = attn.getRelKey() ? 4 : 2;
    return products * 2 * bn * m * d;
  }
  if (auto tl = llvm::dyn_cast<lm::TokenLogprobOp>(op)) {
    auto w = tl.getWeight().getType(); // [V, D]
    return 2 * rows(tl.getHidden(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  // Training. The loss head as token_logprob; its backward recomputes the logits and computes dh and dW.
  if (auto tl = llvm::dyn_cast<lm::TokenLossOp>(op)) {
    auto w = tl.getWeight().getType();
    return 2 * rows(tl.getHidden(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto g = llvm::dyn_cast<lm::TokenLossGradOp>(op)) {
    auto w = g.getWeight().getType();
    return 3 * 2 * rows(g.getHidden(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  // Counted as the token_loss and token_loss_grad it replaces (invariant under lm-fuse-loss-grad), though its
  // lowering computes the logits once.
  if (auto f = llvm::dyn_cast<lm::TokenLossAndGradOp>(op)) {
    auto w = f.getWeight().getType();
    return 4 * 2 * rows(f.getHidden(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  // The n-gram heads: one vocabulary projection per head (and three in the backward), as token_loss.
  if (auto nl = llvm::dyn_cast<lm::NgramLossOp>(op)) {
    auto w = nl.getWeight().getType();
    return int64_t(nl.getHeads().size()) * 2 * rows(nl.getHeads()[0], z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto f = llvm::dyn_cast<lm::NgramLossAndGradOp>(op)) { // as the pair it replaces (lm-fuse-loss-grad)
    auto w = f.getWeight().getType();
    return int64_t(f.getHeads().size()) * 4 * 2 * rows(f.getHeads()[0], z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto g = llvm::dyn_cast<lm::NgramLossGradOp>(op)) {
    auto w = g.getWeight().getType();
    return int64_t(g.getHeads().size()) * 3 * 2 * rows(g.getHeads()[0], z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto g = llvm::dyn_cast<lm::LinearGradOp>(op)) { // dx = dy W and dW = dy^T x
    auto w = g.getWeight().getType();
    return 2 * 2 * rows(g.getInput(), z) * w.getDimSize(1) * w.getDimSize(0);
  }
  if (auto g = llvm::dyn_cast<lm::AttentionGradOp>(op)) {
    // Q K^T and P V recomputed, then dP = dO V^T, dQ = dS K, dK = dS^T Q, dV = P^T dO: three times the
    // forward's two products (the relative terms likewise).
    Wide bn = rows(g.getQuery(), z), m = resolvedShape(g.getKey().getType(), z)[1], d = lastDim(g.getQuery(), z);
    return (g.getRelKey() ? 4 : 2) * 3 * 2 * bn * m * d;
  }
  if (auto g = llvm::dyn_cast<lm::RelativeScoresGradOp>(op)) // dq and drel: two products per score
    return 2 * 2 * elements(g.getGrad(), z) * lastDim(g.getQuery(), z);
  if (auto g = llvm::dyn_cast<lm::RelativeValuesGradOp>(op)) // dp and drel
    return 2 * 2 * elements(g.getProbs(), z) * lastDim(g.getGrad(), z);
  return 0;
}

Wide byteSize(Type type, Sizes z) {
  auto ranked = llvm::dyn_cast<RankedTensorType>(type);
  if (!ranked)
    return 0;
  Type elem = ranked.getElementType();
  Wide bytes = elem.isIntOrFloat() ? (int64_t(elem.getIntOrFloatBitWidth()) + 7) / 8 : 8;
  return bytes * product(resolvedShape(type, z));
}

/// What blockPeak counts: the IR's tensors (`lmcc compile --stats`), or what the kernels allocate (the runtime's
/// memory model): each tensor as its allocation (allocationBytes), the ops' own scratch (Scratch.h) and,
/// with `amxCopies`, the AMX GEMM's copies of its inputs.
struct Counting {
  bool allocations = false, amxCopies = false;
};

/// Bytes the lowering of `op` allocates for itself while it runs, beyond its results (LmToLoops/Scratch.h):
/// lm.token_logprob's partials and logits, lm.attention's transposed keys, packed values and scores, and with
/// `amxCopies` the AMX GEMM's copy of its input rounded to bf16 pairs (Loops::gemmInput: rows padded to kAmxRows,
/// amxInputPairs(K) 4-byte words per row), counted for every lm.linear and lm.token_logprob (an upper bound: an
/// unpacked weight's product makes no copy).
Wide opScratch(Operation *op, Sizes z, Counting counting) {
  if (!counting.allocations)
    return 0;
  if (auto a = llvm::dyn_cast<lm::AttentionOp>(op)) {
    SmallVector<int64_t> q = resolvedShape(a.getQuery().getType(), z), k = resolvedShape(a.getKey().getType(), z);
    if (q[0] == 0) // no entries at these sizes (a sentence's attention in the per-copy term): nothing runs
      return 0;
    const int64_t dh = a.getType().getDimSize(2) / a.getHeads();
    return attention::scratchBytes(dh, k[1], q[1], bool(a.getQueryPositions()), a.getRelKey() ? a.getClip() : 0,
                                   a.getMask() == lm::MaskKind::directional);
  }
  Value input;
  int64_t k = 0, vocab = 0;
  if (auto linear = llvm::dyn_cast<lm::LinearOp>(op))
    input = linear.getInput(), k = linear.getWeight().getType().getDimSize(1);
  else if (auto tl = llvm::dyn_cast<lm::TokenLogprobOp>(op))
    input = tl.getHidden(), k = tl.getWeight().getType().getDimSize(1), vocab = tl.getWeight().getType().getDimSize(0);
  else
    return 0;
  const Wide r = rows(input, z);
  Wide bytes = vocab ? logprob::scratchBytes(vocab, narrow(r, "rows")) : 0;
  if (counting.amxCopies)
    bytes += allocationBytes(narrow((r + kAmxRows - 1) / kAmxRows * kAmxRows * amxInputPairs(k) * 4, "bytes"));
  return bytes;
}

/// The arguments of a block: given (a function's inputs), or allocated by the enclosing op (a mask_and_predict
/// body's masked ids, freed after their last use), or allocated by it and held until it ends (a masked_batch
/// body's copies: its lowering reads their positions and owners after the body, to scatter the rows).
enum class Args { Given, Temps, Held };

/// Peak bytes of the temporaries of `block`, simulated in program order.
Wide blockPeak(Block &block, Sizes z, Args args, Counting counting = {}) {
  llvm::DenseMap<Operation *, int64_t> index;
  int64_t count = 0;
  for (Operation &op : block)
    index[&op] = count++;

  // Values an op writes into the entry's output argument in place (lm.sentence_score, lm.mean_pool) are outputs,
  // not temporaries; any other returned value is computed into a buffer of its own, which the return copies out
  // (LmToLoops.cpp, ReturnLowering): a temporary until then.
  llvm::DenseSet<Value> outputs;
  if (!block.empty())
    if (auto ret = llvm::dyn_cast<func::ReturnOp>(block.back()))
      for (Value v : ret.getOperands())
        if (v.getDefiningOp<lm::SentenceScoreOp>() || v.getDefiningOp<lm::MeanPoolOp>())
          outputs.insert(v);

  // Index of the last op of `block` that uses `v` (directly or inside its regions); -1: none.
  auto lastUse = [&](Value v) {
    int64_t last = -1;
    for (OpOperand &use : v.getUses())
      if (Operation *ancestor = block.findAncestorOpInBlock(*use.getOwner()))
        last = std::max(last, index.lookup(ancestor));
    return last;
  };

  // A tensor's bytes, or its allocation's (Scratch.h's allocationBytes; none for a tensor that is empty at these
  // sizes: it belongs to the other term of the memory model).
  auto tensorAllocation = [&](Type type) {
    Wide bytes = byteSize(type, z);
    return counting.allocations && bytes > 0 ? bytes + kAllocationAlignment : bytes;
  };
  std::vector<Wide> freedAfter(count, 0);
  Wide live = 0, unusedArgs = 0;
  if (args != Args::Given)
    for (BlockArgument arg : block.getArguments()) {
      Wide bytes = tensorAllocation(arg.getType());
      int64_t last = args == Args::Held ? count - 1 : lastUse(arg);
      if (last >= 0)
        live += bytes, freedAfter[last] += bytes;
      else
        unusedArgs += bytes; // allocated, then dropped before the first op
    }
  Wide peak = live + unusedArgs;

  for (Operation &op : block) {
    int64_t i = index[&op];
    // Weights are inputs, and so are stacked weights (laid out back to back at load time).
    bool weightView = llvm::isa<lm::WeightOp>(op) ||
                      (llvm::isa<lm::ConcatOp>(op) && llvm::all_of(op.getOperands(), [](Value v) {
                         return v.getDefiningOp<lm::WeightOp>() != nullptr;
                       }));
    if (!weightView)
      for (Value result : op.getResults()) {
        if (outputs.contains(result))
          continue;
        Wide bytes = tensorAllocation(result.getType());
        live += bytes;
        freedAfter[std::max(lastUse(result), i)] += bytes; // unused results die at once
      }
    // A region's temporaries live while the op runs, on top of everything live now
    // (its own results included). A mask_and_predict body runs n times, one after the
    // other, so its peak is that of one iteration; a masked_batch body runs once on
    // all n copies.
    Wide nested = 0;
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        nested = std::max(nested, blockPeak(inner, regionSizes(&op, z),
                                            counting.allocations && isMaskedBatch(&op) ? Args::Held : Args::Temps,
                                            counting));
    peak = std::max(peak, live + nested + opScratch(&op, z, counting));
    live -= freedAfter[i];
  }
  return peak;
}

/// Bytes one more thread running `block`'s parallel work at once allocates beyond blockPeak's one-thread count:
/// the most any one work item holds (Scratch.h) -- an lm.attention task's scratch (each task of (entry, head)
/// items allocates its own), and with the generated GEMM an lm.token_logprob item's logits (at most kChunkRows rows;
/// with the runtime's GEMM the logits are one buffer of the op, counted by blockPeak, and its row tasks allocate
/// nothing). No other lowering allocates inside a task.
Wide threadPeak(Block &block, Sizes z, bool generatedGemm) {
  Wide peak = 0;
  for (Operation &op : block) {
    for (Region &region : op.getRegions())
      for (Block &inner : region)
        peak = std::max(peak, threadPeak(inner, regionSizes(&op, z), generatedGemm));
    if (llvm::isa<lm::AttentionOp>(op))
      peak = std::max(peak, opScratch(&op, z, Counting{/*allocations=*/true}));
    else if (auto tl = llvm::dyn_cast<lm::TokenLogprobOp>(op); tl && generatedGemm)
      peak = std::max<Wide>(peak, logprob::logitsBytes(tl.getWeight().getType().getDimSize(0), logprob::kChunkRows));
  }
  return peak;
}

Wide flopsIn(Operation *op, Sizes z) {
  Wide nested = 0;
  for (Region &region : op->getRegions())
    for (Block &block : region)
      for (Operation &inner : block)
        nested += flopsIn(&inner, regionSizes(op, z));
  // The naive semantics of mask_and_predict run the body once per position (at the
  // enclosing batch). lm.masked_batch runs it once, at batch n: its ops count the copies.
  if (llvm::isa<lm::MaskAndPredictOp>(op))
    nested *= z.n;
  return ownFlops(op, z) + nested;
}

} // namespace

int64_t tensorBytes(Type type, int64_t n) { return narrow(byteSize(type, Sizes{1, n, n}), "bytes"); }

int64_t opFlops(Operation *op, int64_t n) { return narrow(flopsIn(op, Sizes{1, n, n}), "FLOPs"); }

MemoryModel memoryModel(ModuleOp lmModule, llvm::StringRef entry, int64_t maxLen, bool amxCopies, bool generatedGemm) {
  MemoryModel model;
  auto fn = lmModule.lookupSymbol<func::FuncOp>(entry);
  if (!fn || fn.isExternal())
    return model;
  model.perSentence.assign(maxLen + 1, 0);
  model.perCopy.assign(maxLen + 1, 0);
  model.perThread.assign(maxLen + 1, 0);
  for (int64_t n = 1; n <= maxLen; ++n) {
    // Sentences of at most n tokens: the largest item of any length up to n (an attention task's scratch grows
    // with its keys; the runtime reads the entry of a call's longest sentence).
    model.perThread[n] = model.perThread[n - 1];
    for (Block &block : fn.getBody()) {
      model.perThread[n] =
          std::max(model.perThread[n], narrow(threadPeak(block, Sizes{1, n, 1}, generatedGemm), "bytes"));
      // Every temporary is batch- or copies-major, so its bytes are linear in one of them: the peak of a
      // call, a maximum over program points of such sums, is at most B * (peak at B = 1, C = 0) + C * (peak
      // at B = 0, C = 1). (Tensors of static shape, if any, are counted in both.)
      // (The AMX copies' rows padded to 32 are no more than the sum of the two terms' paddings, and an
      // allocation's alignment is counted in both; the attention's scratch, which does not grow with its entries, is
      // counted in the term of the entries it runs on.)
      const Counting counting{/*allocations=*/true, amxCopies};
      model.perSentence[n] = std::max(
          model.perSentence[n], narrow(blockPeak(block, Sizes{1, n, 0}, Args::Given, counting), "bytes"));
      model.perCopy[n] = std::max(
          model.perCopy[n], narrow(blockPeak(block, Sizes{0, n, 1}, Args::Given, counting), "bytes"));
    }
  }
  return model;
}

std::vector<EntryStats> countStats(ModuleOp lmModule, int64_t n) {
  std::vector<EntryStats> stats;
  for (auto fn : lmModule.getOps<func::FuncOp>()) {
    EntryStats s{fn.getName().str(), 0, 0};
    if (!fn.isExternal()) {
      s.flops = narrow(flopsIn(fn, Sizes{1, n, n}), "FLOPs");
      for (Block &block : fn.getBody())
        s.tempBytes =
            std::max(s.tempBytes, narrow(blockPeak(block, Sizes{1, n, n}, Args::Given), "bytes"));
    }
    stats.push_back(std::move(s));
  }
  return stats;
}

} // namespace lmcc::codegen
