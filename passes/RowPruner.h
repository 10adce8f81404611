//===- RowPruner.h - Dead-row elimination shared by two passes ---------------===//
//
// Walking back from values of which only some rows are needed, every op whose output rows depend only on the same
// input row is recomputed on those rows, and an attention whose query side is needed for those rows computes only
// them against all keys and values:
//   row(x) = op(row(operands))                    for row-local ops whose result is needed only row-wise,
//   row(attention(q, k, v)) = attention(row(q), k, v, ...)   where the subclass can prune that attention,
//   row(x) = take(x)                              for anything else (x computed in full, its rows read from it).
// lm-prune-rows (one row per mask-and-predict copy, lm.take_row) and lm-prune-loss-rows (the rows a training loss
// predicts, lm.gather_rows) differ only in the hooks below.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "dialect/LmDialect.h"

#include "mlir/IR/Block.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace lmcc {

class RowPruner {
public:
  virtual ~RowPruner() = default;

  /// The pruned version of `value` (its kept rows).
  mlir::Value row(mlir::Value value) {
    if (mlir::Value known = rows.lookup(value))
      return known;
    mlir::Value result = build(value);
    rows[value] = result;
    return result;
  }

protected:
  explicit RowPruner(mlir::OpBuilder &builder) : builder(builder) {}

  /// Decides which values of `block` are needed only row-wise: the `roots`, and every single-result op's result
  /// whose every use is a row-local op with a row-only result or the query of a prunable attention with a row-only
  /// result. Users come after producers, so one backward sweep decides. Call from the subclass's constructor.
  void findRowOnlyValues(mlir::Block &block, llvm::ArrayRef<mlir::Value> roots) {
    rowOnly.insert(roots.begin(), roots.end());
    for (mlir::Operation &op : llvm::reverse(block.without_terminator())) {
      if (op.getNumResults() != 1 || rowOnly.count(op.getResult(0)))
        continue;
      mlir::Value result = op.getResult(0);
      bool onlyRows = !result.use_empty();
      for (mlir::OpOperand &use : result.getUses()) {
        mlir::Operation *user = use.getOwner();
        bool userPruned = user->getNumResults() == 1 && rowOnly.count(user->getResult(0));
        auto attn = llvm::dyn_cast<lm::AttentionOp>(user);
        onlyRows = onlyRows && userPruned &&
                   (isRowLocal(user) || (attn && isPrunableAttention(attn) && use.getOperandNumber() == 0));
      }
      if (onlyRows)
        rowOnly.insert(result);
    }
  }

  /// Whether `value` is needed only row-wise (after findRowOnlyValues).
  bool rowOnlyValue(mlir::Value value) const { return rowOnly.count(value); }

  /// The type of `value`'s kept rows.
  virtual mlir::Type rowType(mlir::Type type) = 0;
  /// The kept rows of `value`, read from its full result (the builder is right after its definition).
  virtual mlir::Value take(mlir::Value value) = 0;
  /// Whether a row-only attention can compute just the kept query rows.
  virtual bool isPrunableAttention(lm::AttentionOp attn) = 0;
  /// That attention with `query` as its kept query rows (the builder is right after the original).
  virtual mlir::Value pruneAttention(lm::AttentionOp attn, mlir::Value query) = 0;
  /// Completes the clone of a row-local op on the kept rows (its operands already those rows).
  virtual void completeClone(mlir::Operation *clone) {}
  /// Whether `value` already holds only the kept rows (it is then its own row).
  virtual bool isKept(mlir::Value value) { return false; }

  /// Whether `op` computes each output row from the same row of its sequence operands.
  virtual bool isRowLocal(mlir::Operation *op) {
    return llvm::isa<lm::AddOp, lm::ScaleOp, lm::GeluOp, lm::ReluOp, lm::LayerNormOp, lm::LinearOp,
                     lm::LogSoftmaxOp>(op);
  }

  mlir::OpBuilder &builder;

private:
  static bool isSequence(mlir::Value v) {
    auto t = llvm::dyn_cast<mlir::RankedTensorType>(v.getType());
    return t && t.getRank() >= 2 && !v.getDefiningOp<lm::WeightOp>();
  }

  mlir::Value takeAfterDefinition(mlir::Value value) {
    mlir::OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointAfterValue(value);
    if (auto arg = llvm::dyn_cast<mlir::BlockArgument>(value))
      builder.setInsertionPointToStart(arg.getOwner());
    return take(value);
  }

  mlir::Value build(mlir::Value value) {
    if (isKept(value))
      return value;
    mlir::Operation *op = value.getDefiningOp();
    // Values needed in full anyway (e.g. a layer's output feeding the next layer's keys/values) are computed in
    // full once; their rows are read from them.
    if (!op || !rowOnly.count(value))
      return takeAfterDefinition(value);
    mlir::OpBuilder::InsertionGuard guard(builder);
    if (isRowLocal(op) && op->getNumResults() == 1) {
      llvm::SmallVector<mlir::Value> operands;
      for (mlir::Value operand : op->getOperands())
        operands.push_back(isSequence(operand) ? row(operand) : operand);
      builder.setInsertionPointAfter(op);
      mlir::Operation *clone = builder.clone(*op);
      clone->setOperands(operands);
      clone->getResult(0).setType(rowType(value.getType()));
      completeClone(clone);
      return clone->getResult(0);
    }
    if (auto attn = llvm::dyn_cast<lm::AttentionOp>(op); attn && isPrunableAttention(attn)) {
      mlir::Value query = row(attn.getQuery());
      builder.setInsertionPointAfter(op);
      return pruneAttention(attn, query);
    }
    return takeAfterDefinition(value);
  }

  llvm::DenseMap<mlir::Value, mlir::Value> rows;
  llvm::DenseSet<mlir::Value> rowOnly;
};

} // namespace lmcc
