//===- ShareFirstLayer.cpp - lm-share-first-layer ---------------------------===//
//
// Inside lm.masked_batch, copy c = (b, i) differs from sentence b only at row i,
// where it holds [MASK]. Every value computed from the copies' ids by row-local ops
// alone (token and position embeddings, the embedding norm, the first layer's
// projections of it) therefore equals, row by row, the same computation on the
// sentence, except at row i, where it equals the computation on [MASK] at position i.
// This pass computes those values once per sentence, for the sentence ids and for
// all-[MASK] ids, outside the batch, and replaces each one the rest of the body needs
// by lm.splice_copies(sentence, masked, positions). Exact by construction: the same
// ops on the same rows. At n tokens the first layer's projections run on 2n rows
// instead of n^2.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Utils.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

namespace lmcc {
#define GEN_PASS_DEF_LMSHAREFIRSTLAYER
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// Ops whose output row t depends only on input row t (and on weights).
bool isRowLocal(Operation *op) {
  return isa<lm::EmbedOp, lm::PositionsOp, lm::AddOp, lm::ScaleOp, lm::GeluOp, lm::ReluOp, lm::LayerNormOp,
             lm::LinearOp>(op);
}

struct LmShareFirstLayer : lmcc::impl::LmShareFirstLayerBase<LmShareFirstLayer> {
  void runOnOperation() override {
    getOperation().walk([&](lm::MaskedBatchOp batch) { share(batch); });
  }

  void share(lm::MaskedBatchOp batch) {
    Block &body = batch.getBody().front();
    Value copies = body.getArgument(0), positions = body.getArgument(3), owners = body.getArgument(4),
          ends = body.getArgument(5);
    // 1. Values computed from the copies' ids by row-local ops and weights only.
    llvm::DenseSet<Value> derived;
    derived.insert(copies);
    SmallVector<Operation *> chain;
    for (Operation &op : body.without_terminator()) {
      if (isa<lm::WeightOp>(op)) {
        chain.push_back(&op);
        continue;
      }
      if (!isRowLocal(&op) || op.getNumResults() != 1)
        continue;
      bool fromCopies = false, ok = true;
      for (Value operand : op.getOperands()) {
        if (derived.count(operand))
          fromCopies = true;
        else if (!operand.getDefiningOp<lm::WeightOp>())
          ok = false;
      }
      if (ok && fromCopies) {
        derived.insert(op.getResult(0));
        chain.push_back(&op);
      }
    }
    // 2. The frontier: derived f32 sequences that something outside the chain reads.
    SmallVector<Value> frontier;
    for (Operation *op : chain) {
      if (isa<lm::WeightOp>(op))
        continue;
      Value v = op->getResult(0);
      auto type = llvm::cast<RankedTensorType>(v.getType());
      if (!type.getElementType().isF32() || type.getRank() < 2)
        continue;
      for (Operation *user : v.getUsers())
        if (!derived.count(user->getNumResults() == 1 ? user->getResult(0) : Value())) {
          frontier.push_back(v);
          break;
        }
    }
    if (frontier.empty())
      return;
    // 3. The chain once on the sentences' ids and once on all-[MASK] ids, before the batch.
    OpBuilder builder(batch);
    Location loc = batch.getLoc();
    Value maskIds = builder.create<lm::FillIdsOp>(loc, batch.getIds(), batch.getMaskTokenAttr());
    IRMapping sentence, masked;
    sentence.map(copies, batch.getIds());
    masked.map(copies, maskIds);
    SmallVector<Operation *> clones;
    for (Operation *op : chain) {
      clones.push_back(builder.clone(*op, sentence));
      if (!isa<lm::WeightOp>(op))
        clones.push_back(builder.clone(*op, masked));
      else
        masked.map(op->getResult(0), sentence.lookup(op->getResult(0)));
    }
    // 4. Inside the batch, each frontier value becomes a splice of the shared rows.
    builder.setInsertionPointToStart(&body);
    for (Value v : frontier) {
      Value spliced = builder.create<lm::SpliceCopiesOp>(v.getLoc(), v.getType(), sentence.lookup(v),
                                                         masked.lookup(v), positions, owners, ends);
      v.replaceAllUsesWith(spliced);
    }
    eraseDeadOps(body);
    // Clones outside the batch that no frontier value needed (e.g. later layers' weights).
    for (Operation *op : llvm::reverse(clones))
      if (op->use_empty())
        op->erase();
    if (maskIds.use_empty())
      maskIds.getDefiningOp()->erase();
  }
};

} // namespace
