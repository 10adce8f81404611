//===- PruneRows.cpp - lm-prune-rows ----------------------------------------===//
//
// Dead-row elimination inside lm.masked_batch: copy c keeps only row positions[c]
// of what its body yields, so every op whose output rows depend only on the same
// input row (linear, norms, activations, residual adds, log-softmax, gathers) is
// recomputed on that one row, and an attention whose query side is needed for one
// row computes one query row per copy against all keys and values
// (query_positions). Walking back from the yield:
//   row(x) = op(row(operands))                      for row-local ops,
//   row(attention(q, k, v)) = attention(row(q), k, v, query_positions),
//   row(x) = take_row(x, positions)                 for anything else.
// In a BERT-style stack this leaves the last layer with one query row per copy
// (keys/values still for all rows) and the head on n rows instead of n^2.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RowPruner.h"
#include "passes/Utils.h"

namespace lmcc {
#define GEN_PASS_DEF_LMPRUNEROWS
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// Copy c keeps row positions[c]: [C, N, ...] -> [C, 1, ...].
class CopyRowPruner : public RowPruner {
public:
  CopyRowPruner(lm::MaskedBatchOp batch, OpBuilder &builder)
      : RowPruner(builder), positions(batch.getBody().front().getArgument(3)) {
    Block &body = batch.getBody().front();
    findRowOnlyValues(body, {body.getTerminator()->getOperand(0)});
  }

private:
  Type rowType(Type type) override {
    auto t = llvm::cast<RankedTensorType>(type);
    SmallVector<int64_t> shape(t.getShape());
    shape[1] = 1;
    return RankedTensorType::get(shape, t.getElementType());
  }

  // positions is a block argument: it dominates every op of the body.
  Value take(Value value) override {
    return builder.create<lm::TakeRowOp>(value.getLoc(), rowType(value.getType()), value, positions);
  }

  bool isKept(Value value) override {
    auto t = llvm::dyn_cast<RankedTensorType>(value.getType());
    return t && t.getRank() >= 2 && t.getDimSize(1) == 1;
  }

  bool isRowLocal(Operation *op) override {
    if (auto g = dyn_cast<lm::GatherOp>(op))
      return g.getShift() == 0;
    if (auto g = dyn_cast<lm::TokenLogprobOp>(op))
      return g.getShift() == 0;
    return RowPruner::isRowLocal(op);
  }

  bool isPrunableAttention(lm::AttentionOp attn) override { return !attn.getQueryPositions() && !attn.getMaskData(); }

  Value pruneAttention(lm::AttentionOp attn, Value query) override {
    return builder
        .create<lm::AttentionOp>(attn.getLoc(), rowType(attn.getType()), query, attn.getKey(), attn.getValue(),
                                 attn.getLengths(), Value(), attn.getRelKey(), attn.getRelValue(), positions,
                                 attn.getHeadsAttr(), attn.getMaskAttr(), attn.getScaleAttr(), attn.getClipAttr())
        .getResult();
  }

  Value positions;
};

struct LmPruneRows : lmcc::impl::LmPruneRowsBase<LmPruneRows> {
  void runOnOperation() override {
    getOperation().walk([&](lm::MaskedBatchOp batch) {
      auto yield = cast<lm::YieldOp>(batch.getBody().front().getTerminator());
      auto type = llvm::cast<RankedTensorType>(yield.getValue().getType());
      if (type.getDimSize(1) == 1)
        return; // already pruned
      OpBuilder builder(batch.getContext());
      CopyRowPruner pruner(batch, builder);
      Value pruned = pruner.row(yield.getValue());
      yield->setOperand(0, pruned);
      eraseDeadOps(batch.getBody().front());
    });
  }
};

} // namespace
