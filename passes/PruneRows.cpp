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
#include "passes/Utils.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace lmcc {
#define GEN_PASS_DEF_LMPRUNEROWS
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

class RowPruner {
public:
  RowPruner(lm::MaskedBatchOp batch, OpBuilder &builder)
      : builder(builder), positions(batch.getBody().front().getArgument(3)) {
    findRowOnlyValues(batch.getBody().front());
  }

  /// The [C, 1, ...] version of `value` (row positions[c] of every copy c).
  Value row(Value value) {
    if (Value known = rows.lookup(value))
      return known;
    Value result = build(value);
    rows[value] = result;
    return result;
  }

private:
  static RankedTensorType oneRow(Type type) {
    auto t = llvm::cast<RankedTensorType>(type);
    SmallVector<int64_t> shape(t.getShape());
    shape[1] = 1;
    return RankedTensorType::get(shape, t.getElementType());
  }

  Value takeRow(Value value) {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfterValue(value);
    if (auto arg = llvm::dyn_cast<BlockArgument>(value))
      builder.setInsertionPointToStart(arg.getOwner());
    // positions is a block argument: it dominates every op of the body.
    return builder.create<lm::TakeRowOp>(value.getLoc(), oneRow(value.getType()), value, positions);
  }

  /// Clones `op` right after itself with operands mapped by `operands` and result type `type`.
  Value cloneWith(Operation *op, ArrayRef<Value> operands, Type type) {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfter(op);
    Operation *clone = builder.clone(*op);
    clone->setOperands(operands);
    clone->getResult(0).setType(type);
    return clone->getResult(0);
  }

  /// Whether `op` computes each output row from the same row of its sequence operands.
  static bool isRowLocal(Operation *op) {
    if (auto g = dyn_cast<lm::GatherOp>(op))
      return g.getShift() == 0;
    if (auto g = dyn_cast<lm::TokenLogprobOp>(op))
      return g.getShift() == 0;
    return isa<lm::AddOp, lm::ScaleOp, lm::GeluOp, lm::ReluOp, lm::LayerNormOp, lm::LinearOp, lm::LogSoftmaxOp>(op);
  }
  static bool isPrunableAttention(Operation *op) {
    auto attn = dyn_cast<lm::AttentionOp>(op);
    return attn && !attn.getQueryPositions() && !attn.getMaskData();
  }

  /// A value is row-only when every use needs just row positions[c]: the yield, a
  /// row-local op whose result is row-only, or the query of a prunable attention whose
  /// result is row-only. Users come after producers, so one backward sweep decides.
  void findRowOnlyValues(Block &block) {
    rowOnly.insert(block.getTerminator()->getOperand(0));
    for (Operation &op : llvm::reverse(block.without_terminator())) {
      if (op.getNumResults() != 1)
        continue;
      Value result = op.getResult(0);
      if (result == block.getTerminator()->getOperand(0))
        continue;
      bool onlyRows = !result.use_empty();
      for (OpOperand &use : result.getUses()) {
        Operation *user = use.getOwner();
        bool userPruned = user->getNumResults() == 1 && rowOnly.count(user->getResult(0));
        bool ok = userPruned && (isRowLocal(user) || (isPrunableAttention(user) && use.getOperandNumber() == 0));
        onlyRows = onlyRows && ok;
      }
      if (onlyRows)
        rowOnly.insert(result);
    }
  }

  bool isSequence(Value v) {
    auto t = llvm::dyn_cast<RankedTensorType>(v.getType());
    return t && t.getRank() >= 2 && !v.getDefiningOp<lm::WeightOp>();
  }

  Value build(Value value) {
    Operation *op = value.getDefiningOp();
    auto t = llvm::dyn_cast<RankedTensorType>(value.getType());
    if (!op || !t || t.getRank() < 2 || t.getDimSize(1) == 1)
      return t && t.getRank() >= 2 && t.getDimSize(1) == 1 ? value : takeRow(value);
    // Values needed in full anyway (e.g. a layer's output feeding the next layer's
    // keys/values) are computed in full once; their row is read from them.
    if (!rowOnly.count(value))
      return takeRow(value);
    // Row-local ops: every sequence-shaped operand is replaced by its row.
    if (isRowLocal(op) && op->getNumResults() == 1) {
      SmallVector<Value> operands;
      for (Value operand : op->getOperands())
        operands.push_back(isSequence(operand) ? row(operand) : operand);
      return cloneWith(op, operands, oneRow(value.getType()));
    }
    if (auto attn = dyn_cast<lm::AttentionOp>(op); attn && isPrunableAttention(op)) {
      SmallVector<Value> operands(op->getOperands());
      operands[0] = row(attn.getQuery());
      OpBuilder::InsertionGuard guard(builder);
      builder.setInsertionPointAfter(op);
      auto pruned = builder.create<lm::AttentionOp>(
          attn.getLoc(), oneRow(attn.getType()), operands[0], attn.getKey(), attn.getValue(), attn.getLengths(),
          Value(), attn.getRelKey(), attn.getRelValue(), positions, attn.getHeadsAttr(), attn.getMaskAttr(),
          attn.getScaleAttr(), attn.getClipAttr());
      return pruned.getResult();
    }
    return takeRow(value);
  }

  OpBuilder &builder;
  Value positions;
  llvm::DenseMap<Value, Value> rows;
  llvm::DenseSet<Value> rowOnly;
};

struct LmPruneRows : lmcc::impl::LmPruneRowsBase<LmPruneRows> {
  void runOnOperation() override {
    getOperation().walk([&](lm::MaskedBatchOp batch) {
      auto yield = cast<lm::YieldOp>(batch.getBody().front().getTerminator());
      auto type = llvm::cast<RankedTensorType>(yield.getValue().getType());
      if (type.getDimSize(1) == 1)
        return; // already pruned
      OpBuilder builder(batch.getContext());
      RowPruner pruner(batch, builder);
      Value pruned = pruner.row(yield.getValue());
      yield->setOperand(0, pruned);
      eraseDeadOps(batch.getBody().front());
    });
  }
};

} // namespace
