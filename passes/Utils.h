//===- Utils.h - Small helpers shared by the passes --------------------------===//
#pragma once

#include "mlir/IR/Block.h"
#include "mlir/IR/Operation.h"

namespace lmcc {

/// Erases the block's unused ops (all lm ops are pure). One backward sweep suffices:
/// an op's users come after it, so they are gone first.
inline void eraseDeadOps(mlir::Block &block) {
  for (mlir::Operation *op = block.getTerminator()->getPrevNode(); op;) {
    mlir::Operation *previous = op->getPrevNode();
    if (op->use_empty())
      op->erase();
    op = previous;
  }
}

} // namespace lmcc
