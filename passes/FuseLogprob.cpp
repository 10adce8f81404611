//===- FuseLogprob.cpp - lm-fuse-logprob ------------------------------------===//
//
// gather(log_softmax(linear(h, W, b)), ids, shift)  ==>  token_logprob(h, W, b, ids, shift)
// when the log-probabilities feed only the gather (so the [n, V] tensor is dead), and likewise
// cross_entropy(log_softmax(linear(h, W, b)), targets)  ==>  token_loss(h, W, b, targets) (training).
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
    if (!linear || !linear->hasOneUse() || linear.getType().getRank() != 3 || linear.getActivation())
      return rewriter.notifyMatchFailure(gather, "logits are not a single-use [B, N, V] linear without an activation");
    rewriter.replaceOpWithNewOp<lm::TokenLogprobOp>(gather, gather.getType(), linear.getInput(), linear.getWeight(),
                                                    linear.getBias(), gather.getTargets(), gather.getLengths(),
                                                    gather.getShiftAttr());
    return success();
  }
};

/// cross_entropy(log_softmax(linear(h, W, b)), targets)  ==>  token_loss(h, W, b, targets).
struct FuseLossPattern : OpRewritePattern<lm::CrossEntropyOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::CrossEntropyOp ce, PatternRewriter &rewriter) const override {
    auto logSoftmax = ce.getLogprobs().getDefiningOp<lm::LogSoftmaxOp>();
    if (!logSoftmax || !logSoftmax->hasOneUse())
      return rewriter.notifyMatchFailure(ce, "log-probabilities are not a single-use log_softmax");
    auto linear = logSoftmax.getInput().getDefiningOp<lm::LinearOp>();
    if (!linear || !linear->hasOneUse() || linear.getType().getRank() != 3 || linear.getActivation())
      return rewriter.notifyMatchFailure(ce, "logits are not a single-use [B, N, V] linear without an activation");
    auto loss = rewriter.create<lm::TokenLossOp>(ce.getLoc(), TypeRange{ce.getType(), ce.getType()}, linear.getInput(),
                                                 linear.getWeight(), linear.getBias(), ce.getTargets(),
                                                 ce.getLengths(), ce.getSmoothingAttr(), ce.getPerLengthAttr());
    rewriter.replaceOp(ce, loss.getLoss());
    return success();
  }
};

struct LmFuseLogprob : lmcc::impl::LmFuseLogprobBase<LmFuseLogprob> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseLogprobPattern, FuseLossPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
