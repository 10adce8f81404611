//===- FuseLogprob.cpp - lm-fuse-logprob ------------------------------------===//
//
// gather(log_softmax(linear(h, W, b)), ids, shift)  ==>  token_logprob(h, W, b, ids, shift)
// when the log-probabilities feed only the gather (so the [n, V] tensor is dead).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFUSELOGPROB
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

struct FuseLogprobPattern : OpRewritePattern<lm::GatherOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::GatherOp gather, PatternRewriter &rewriter) const override {
    auto logSoftmax = gather.getLogprobs().getDefiningOp<lm::LogSoftmaxOp>();
    if (!logSoftmax || !logSoftmax->hasOneUse())
      return rewriter.notifyMatchFailure(gather, "log-probabilities are not a single-use log_softmax");
    auto linear = logSoftmax.getInput().getDefiningOp<lm::LinearOp>();
    if (!linear || !linear->hasOneUse() || linear.getType().getRank() != 3)
      return rewriter.notifyMatchFailure(gather, "logits are not a single-use [B, N, V] linear");
    rewriter.replaceOpWithNewOp<lm::TokenLogprobOp>(gather, gather.getType(), linear.getInput(), linear.getWeight(),
                                                    linear.getBias(), gather.getTargets(), gather.getLengths(),
                                                    gather.getShiftAttr());
    return success();
  }
};

struct LmFuseLogprob : lmcc::impl::LmFuseLogprobBase<LmFuseLogprob> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseLogprobPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
