//===- PruneLossRows.cpp - lm-prune-loss-rows --------------------------------===//
//
// Dead-row elimination in a training loss: the loss head (lm.token_loss or lm.cross_entropy) reads only the rows
// with a target, about 15% of them under the masked objective, so walking back from its hidden states (RowPruner.h)
// the last layer's query projection, attention rows, output projection, feed-forward and norms run on those rows
// only, packed per sentence into [B, T, D] (T the largest count of a batch, known at run time); keys and values
// stay [B, N, D]:
//   %rows, %row_targets = lm.target_rows %targets, %lengths
//   row(x) = op(row(operands))                       for row-local ops,
//   row(attention(q, k, v)) = attention(row(q), k, v)   (mask none: a query row's keys do not depend on its
//                                                      position, so the packed rows are the cross-attention form),
//   row(x) = lm.gather_rows x, %rows                 for anything else,
//   ce = lm.scatter_rows (loss(row(h), %row_targets)), %rows, %targets   (0 at the other rows, as before).
// A dropout on the packed rows takes `rows` (lm.dropout rows(...)): its masks are those of the rows in the full
// activation. Exact: the dropped rows contributed nothing to the loss and zeros to every gradient (lm-autodiff's
// VJPs of the new ops move rows, never sum them). Applied where the last attention can be pruned: the biLM (masked
// LM) objective; causal and diagonal masks would need the rows' positions (the T-TA and uniLM objectives predict
// every row anyway), and attention dropout keeps the attention decomposed.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/RowPruner.h"
#include "passes/Utils.h"

namespace lmcc {
#define GEN_PASS_DEF_LMPRUNELOSSROWS
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// The rows with a target of each sentence: [B, N, ...] -> [B, T, ...].
class LossRowPruner : public RowPruner {
public:
  LossRowPruner(OpBuilder &builder, Block &block, Value root, Value rows) : RowPruner(builder), rows(rows) {
    findRowOnlyValues(block, {root});
    for (Operation &op : block)
      if (auto attn = dyn_cast<lm::AttentionOp>(op))
        prunesAttention |= isPrunableAttention(attn) && rowOnlyValue(attn.getResult());
  }

  /// Whether some attention's query rows are pruned (else the pass leaves the loss as it is).
  bool prunesAttention = false;

private:
  Type rowType(Type type) override {
    auto t = llvm::cast<RankedTensorType>(type);
    SmallVector<int64_t> shape(t.getShape());
    shape[1] = ShapedType::kDynamic;
    return RankedTensorType::get(shape, t.getElementType());
  }

  Value take(Value value) override {
    return builder.create<lm::GatherRowsOp>(value.getLoc(), rowType(value.getType()), value, rows);
  }

  /// A dropout of an activation: its packed rows keep the masks of their rows in the full activation.
  bool isRowLocal(Operation *op) override {
    if (auto d = dyn_cast<lm::DropoutOp>(op))
      return !d.getRows() && llvm::cast<RankedTensorType>(d.getType()).getRank() == 3;
    return RowPruner::isRowLocal(op);
  }

  void completeClone(Operation *clone) override {
    if (auto d = dyn_cast<lm::DropoutOp>(clone))
      d.getRowsMutable().assign(rows);
  }

  bool isPrunableAttention(lm::AttentionOp attn) override {
    return attn.getMask() == lm::MaskKind::none && !attn.getQueryPositions() && !attn.getMaskData() &&
           !attn.getRelKey();
  }

  Value pruneAttention(lm::AttentionOp attn, Value query) override {
    return builder
        .create<lm::AttentionOp>(attn.getLoc(), rowType(attn.getType()), query, attn.getKey(), attn.getValue(),
                                 attn.getLengths(), Value(), Value(), Value(), Value(), attn.getHeadsAttr(),
                                 attn.getMaskAttr(), attn.getScaleAttr(), attn.getClipAttr())
        .getResult();
  }

  Value rows;
};

/// The loss op a training function returns (`loss(inputs, targets, lengths) -> ce`), with its hidden input and
/// targets; null where the function is not such a loss or counts every position (per_length).
struct Loss {
  Operation *op = nullptr;
  Value hidden, targets, lengths;
};

Loss lossOf(func::FuncOp fn) {
  auto method = lm::LmDialect::MethodAttrHelper(fn.getContext()).getAttr(fn);
  if (!method || method.getValue() != "loss" || fn.getBody().getBlocks().size() != 1)
    return {};
  auto ret = dyn_cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  if (!ret || ret.getNumOperands() != 1 || !ret.getOperand(0).hasOneUse())
    return {};
  Operation *op = ret.getOperand(0).getDefiningOp();
  if (auto t = dyn_cast_or_null<lm::TokenLossOp>(op); t && !t.getPerLength())
    return {op, t.getHidden(), t.getTargets(), t.getLengths()};
  if (auto c = dyn_cast_or_null<lm::CrossEntropyOp>(op); c && !c.getPerLength())
    return {op, c.getLogprobs(), c.getTargets(), c.getLengths()};
  return {};
}

struct LmPruneLossRows : lmcc::impl::LmPruneLossRowsBase<LmPruneLossRows> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      Loss loss = lossOf(fn);
      if (!loss.op)
        return;
      Block &block = fn.getBody().front();
      // lm.target_rows goes first in the block: its operands must be the entry's arguments (as MLIRGen makes them).
      auto isArgument = [&](Value v) { return llvm::isa<BlockArgument>(v) && v.getParentBlock() == &block; };
      if (!isArgument(loss.targets) || !isArgument(loss.lengths))
        return;
      OpBuilder builder(fn.getContext());
      builder.setInsertionPointToStart(&block);
      auto i32Rows = RankedTensorType::get({ShapedType::kDynamic, ShapedType::kDynamic}, builder.getI32Type());
      auto targetRows = builder.create<lm::TargetRowsOp>(loss.op->getLoc(), TypeRange{i32Rows, i32Rows},
                                                         loss.targets, loss.lengths);
      LossRowPruner pruner(builder, block, loss.hidden, targetRows.getRows());
      if (!pruner.prunesAttention) {
        targetRows->erase();
        return;
      }
      Value hidden = pruner.row(loss.hidden);
      builder.setInsertionPoint(loss.op);
      Operation *packed = builder.clone(*loss.op);
      packed->setOperand(0, hidden);
      if (auto t = dyn_cast<lm::TokenLossOp>(packed))
        t.getTargetsMutable().assign(targetRows.getRowTargets());
      else
        cast<lm::CrossEntropyOp>(packed).getTargetsMutable().assign(targetRows.getRowTargets());
      for (Value r : packed->getResults())
        r.setType(i32Rows.clone(builder.getF32Type()));
      Value ce = loss.op->getResult(0);
      Value placed = builder.create<lm::ScatterRowsOp>(loss.op->getLoc(), ce.getType(), packed->getResult(0),
                                                        targetRows.getRows(), loss.targets);
      ce.replaceAllUsesWith(placed);
      eraseDeadOps(block);
    });
  }
};

} // namespace
