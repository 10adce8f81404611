//===- Utils.h - Small helpers shared by the passes --------------------------===//
#pragma once

#include "dialect/LmDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Block.h"
#include "mlir/IR/Operation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace lmcc {

/// Erases the block's unused side-effect-free ops. One backward sweep suffices:
/// an op's users come after it, so they are gone first.
inline void eraseDeadOps(mlir::Block &block) {
  for (mlir::Operation *op = block.getTerminator()->getPrevNode(); op;) {
    mlir::Operation *previous = op->getPrevNode();
    if (mlir::isOpTriviallyDead(op))
      op->erase();
    op = previous;
  }
}

} // namespace lmcc

namespace lmcc {

/// Whether `op` sits in a training entry point (lm.method "loss", or "loss_grad" after lm-autodiff).
/// Passes that move values out of the computation (lm-fold-constants, lm-hoist-isolated-kv) leave
/// these alone: lm-autodiff differentiates the ops as they stand.
inline bool inTrainingFunction(mlir::Operation *op) {
  auto fn = llvm::isa<mlir::func::FuncOp>(op) ? llvm::cast<mlir::func::FuncOp>(op)
                                              : op->getParentOfType<mlir::func::FuncOp>();
  if (!fn)
    return false;
  auto method = lm::LmDialect::MethodAttrHelper(op->getContext()).getAttr(fn);
  return method && (method.getValue() == "loss" || method.getValue() == "loss_grad" ||
                    method.getValue() == "pair_loss" || method.getValue() == "pair_loss_grad");
}

} // namespace lmcc
