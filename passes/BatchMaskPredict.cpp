//===- BatchMaskPredict.cpp - lm-batch-mask-predict -------------------------===//
//
// lm.mask_and_predict (a loop of n forward passes per sentence) ==> lm.masked_batch
// (one forward pass over all sum(lengths) masked copies). The body is moved as is;
// the values it captured from outside with the sentence batch as their leading
// dimension (the ids, used as targets, and the lengths) are replaced by the
// per-copy versions the batched op provides. Exact: every copy computes what the
// corresponding loop iteration computed.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/IRMapping.h"

namespace lmcc {
#define GEN_PASS_DEF_LMBATCHMASKPREDICT
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// The body may capture only the op's own ids and lengths and batch-free values
/// (weights, constants); anything else would not line up with the copies.
bool capturesOnlyBatchFreeValues(lm::MaskAndPredictOp op) {
  bool ok = true;
  op.getBody().walk([&](Operation *inner) {
    for (Value operand : inner->getOperands()) {
      if (op.getBody().isAncestor(operand.getParentRegion()))
        continue;
      if (operand == op.getIds() || operand == op.getLengths())
        continue;
      if (operand.getDefiningOp<lm::WeightOp>())
        continue;
      ok = false;
    }
  });
  return ok;
}

struct LmBatchMaskPredict : lmcc::impl::LmBatchMaskPredictBase<LmBatchMaskPredict> {
  void runOnOperation() override {
    SmallVector<lm::MaskAndPredictOp> ops;
    getOperation().walk([&](lm::MaskAndPredictOp op) { ops.push_back(op); });
    for (lm::MaskAndPredictOp op : ops) {
      if (!capturesOnlyBatchFreeValues(op)) {
        op.emitRemark("lm-batch-mask-predict: the body captures batch-shaped values; left as n passes");
        continue;
      }
      OpBuilder builder(op);
      auto batched = builder.create<lm::MaskedBatchOp>(op.getLoc(), op.getType(), op.getIds(), op.getLengths(),
                                                       op.getSpans(), op.getMaskTokenAttr());
      Type idsType = op.getIds().getType(), lengthsType = op.getLengths().getType();
      Location loc = op.getLoc();
      Block *body = builder.createBlock(&batched.getBody(), {},
                                        {idsType, lengthsType, idsType, lengthsType, lengthsType, lengthsType},
                                        {loc, loc, loc, loc, loc, loc});
      IRMapping mapping;
      mapping.map(op.getBody().front().getArgument(0), body->getArgument(0));
      mapping.map(op.getLengths(), body->getArgument(1));
      mapping.map(op.getIds(), body->getArgument(2));
      builder.setInsertionPointToStart(body);
      for (Operation &inner : op.getBody().front())
        builder.clone(inner, mapping);
      op.replaceAllUsesWith(batched.getResult());
      op.erase();
    }
  }
};

} // namespace
