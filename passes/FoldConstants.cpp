//===- FoldConstants.cpp - lm-fold-constants --------------------------------===//
//
// Values that depend only on weights and on positions (rows 0..N-1, the same for
// every sentence) are the same in every call: T-TA's first query norm(P) and its
// first-layer projection, sinusoidal tables, norm(E[MASK] + P). Each such value that
// the rest of the program reads moves into a private function marked `lm.fold`,
// which the runtime evaluates once on positions 0..max_len-1 when the weights are
// loaded (the `<name>_init_kernel`); the program reads rows [0, N) of the result
// with lm.folded_rows. Exact: the same ops on the same rows, computed once.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Utils.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFOLDCONSTANTS
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

bool isRowLocal(Operation *op) {
  return isa<lm::AddOp, lm::ScaleOp, lm::GeluOp, lm::ReluOp, lm::LayerNormOp, lm::LinearOp>(op);
}

struct LmFoldConstants : lmcc::impl::LmFoldConstantsBase<LmFoldConstants> {
  int counter = 0;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> functions;
    for (auto fn : module.getOps<func::FuncOp>())
      if (!lm::LmDialect::FoldAttrHelper(&getContext()).isAttrPresent(fn) && !inTrainingFunction(fn))
        functions.push_back(fn);
    for (func::FuncOp fn : functions) {
      SmallVector<Block *> blocks;
      fn.walk([&](Block *block) { blocks.push_back(block); });
      for (Block *block : blocks)
        fold(module, *block);
    }
  }

  void fold(ModuleOp module, Block &block) {
    // Position-only values: positions, constant ids, and row-local ops over them and weights.
    llvm::DenseSet<Value> positionOnly;
    auto isWeight = [](Value v) { return v.getDefiningOp<lm::WeightOp>() != nullptr; };
    for (Operation &op : block) {
      bool po = false;
      if (isa<lm::PositionsOp, lm::FillIdsOp>(op)) {
        po = true;
      } else if (auto embed = dyn_cast<lm::EmbedOp>(op)) {
        po = positionOnly.count(embed.getIds()) && isWeight(embed.getTable());
      } else if (isRowLocal(&op)) {
        bool any = false, all = true;
        for (Value v : op.getOperands()) {
          any = any || positionOnly.count(v);
          all = all && (positionOnly.count(v) || isWeight(v));
        }
        po = any && all;
      }
      if (po)
        positionOnly.insert(op.getResult(0));
    }
    // Frontier: f32 position-only values read by something else; plain table lookups stay.
    SmallVector<Value> frontier;
    for (Operation &op : block) {
      if (op.getNumResults() != 1 || !positionOnly.count(op.getResult(0)))
        continue;
      Value v = op.getResult(0);
      if (!llvm::cast<RankedTensorType>(v.getType()).getElementType().isF32())
        continue;
      if (isa<lm::EmbedOp>(op) || (isa<lm::PositionsOp>(op) && cast<lm::PositionsOp>(op).getTable()))
        continue;
      for (Operation *user : v.getUsers())
        if (user->getNumResults() != 1 || !positionOnly.count(user->getResult(0))) {
          frontier.push_back(v);
          break;
        }
    }
    // Latest first: an earlier frontier value (T-TA's norm(P)) may feed a later one
    // (its projection), whose function then recomputes it rather than reading a fold.
    for (Value v : llvm::reverse(frontier))
      outline(module, v);
  }

  /// Moves the computation of `v` into a private @fold_K(ids) and reads it back.
  void outline(ModuleOp module, Value v) {
    // The backward slice of v inside its block (position-only ops and their weights).
    llvm::SetVector<Operation *> slice;
    SmallVector<Operation *> work = {v.getDefiningOp()};
    Value ids;
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (!slice.insert(op))
        continue;
      if (auto p = dyn_cast<lm::PositionsOp>(op))
        ids = p.getIds();
      if (auto f = dyn_cast<lm::FillIdsOp>(op))
        ids = f.getInput();
      if (isa<lm::PositionsOp, lm::FillIdsOp>(op)) {
        if (auto p = dyn_cast<lm::PositionsOp>(op); p && p.getTable())
          work.push_back(p.getTable().getDefiningOp());
        continue;
      }
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp())
          work.push_back(def);
    }
    auto ordered = slice.takeVector();
    llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });

    OpBuilder builder(module.getBodyRegion());
    builder.setInsertionPointToEnd(module.getBody());
    std::string name = "fold_" + std::to_string(counter++);
    auto fn = builder.create<func::FuncOp>(v.getLoc(), name,
                                           builder.getFunctionType({ids.getType()}, {v.getType()}));
    fn.setPrivate();
    lm::LmDialect::FoldAttrHelper(builder.getContext()).setAttr(fn, builder.getUnitAttr());
    Block *entry = fn.addEntryBlock();
    builder.setInsertionPointToStart(entry);
    IRMapping mapping;
    mapping.map(ids, entry->getArgument(0));
    for (Operation *op : ordered) {
      if (auto p = dyn_cast<lm::PositionsOp>(op))
        mapping.map(p.getIds(), entry->getArgument(0));
      if (auto f = dyn_cast<lm::FillIdsOp>(op))
        mapping.map(f.getInput(), entry->getArgument(0));
      builder.clone(*op, mapping);
    }
    builder.create<func::ReturnOp>(v.getLoc(), mapping.lookup(v));

    OpBuilder reader(v.getContext());
    reader.setInsertionPointAfterValue(v);
    Value rows = reader.create<lm::FoldedRowsOp>(v.getLoc(), v.getType(), ids,
                                                 FlatSymbolRefAttr::get(v.getContext(), name));
    v.replaceAllUsesWith(rows);
    // The originals are dead now unless something else in the block still reads them.
    for (Operation *op : llvm::reverse(ordered))
      if (op->use_empty())
        op->erase();
  }
};

} // namespace
