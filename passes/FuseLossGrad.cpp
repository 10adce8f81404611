//===- FuseLossGrad.cpp - lm-fuse-loss-grad ---------------------------------===//
//
// %ce, %lse = token_loss(h, W, b, y, len); ...; %dh, %dW, %db = token_loss_grad(h, W, b, y, len, %lse)
//   ==>  %ce, %lse, %dh, %dW, %db = token_loss_and_grad(h, W, b, y, len)   (at the token_loss)
// when the grad's operands and attributes are the token_loss's and it reads that lse; likewise ngram_loss and the
// ngram_loss_grad of its lse results -> ngram_loss_and_grad. Runs after lm-autodiff
// (the loss_grad entry has both ops); the fused op's lowering keeps the forward's logits for the backward
// instead of computing them twice (runtime/lib/TrainKernels.cpp), the same bits either way.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFUSELOSSGRAD
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// The one GradOp that reads any of `lse` (null when none does); failure when two different ones do.
template <typename GradOp> FailureOr<GradOp> gradReading(ValueRange lse) {
  GradOp grad;
  for (Value l : lse)
    for (Operation *user : l.getUsers())
      if (auto g = dyn_cast<GradOp>(user)) {
        if (grad && g != grad)
          return failure();
        grad = g;
      }
  return grad;
}

struct FuseLossGradPattern : OpRewritePattern<lm::TokenLossOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::TokenLossOp loss, PatternRewriter &rewriter) const override {
    FailureOr<lm::TokenLossGradOp> reading = gradReading<lm::TokenLossGradOp>(loss.getLse());
    if (failed(reading))
      return rewriter.notifyMatchFailure(loss, "two token_loss_grad read its lse");
    lm::TokenLossGradOp grad = *reading;
    if (!grad)
      return rewriter.notifyMatchFailure(loss, "no token_loss_grad reads its lse");
    // The same operands (SSA values: they dominate the token_loss, where the fused op goes) and attributes.
    if (grad.getHidden() != loss.getHidden() || grad.getWeight() != loss.getWeight() ||
        grad.getBias() != loss.getBias() || grad.getTargets() != loss.getTargets() ||
        grad.getLengths() != loss.getLengths() || grad.getLse() != loss.getLse() ||
        grad.getSmoothing() != loss.getSmoothing() || grad.getPerLength() != loss.getPerLength())
      return rewriter.notifyMatchFailure(loss, "the token_loss_grad differs in an operand or attribute");
    SmallVector<Type> types{loss.getLoss().getType(), loss.getLse().getType()};
    llvm::append_range(types, grad->getResultTypes());
    auto fused = rewriter.create<lm::TokenLossAndGradOp>(loss.getLoc(), types, loss.getHidden(), loss.getWeight(),
                                                         loss.getBias(), loss.getTargets(), loss.getLengths(),
                                                         loss.getSmoothingAttr(), loss.getPerLengthAttr());
    rewriter.replaceOp(grad, fused->getResults().drop_front(2));
    rewriter.replaceOp(loss, fused->getResults().take_front(2));
    return success();
  }
};

/// The same for the n-gram heads: lm.ngram_loss and the lm.ngram_loss_grad of all its lse results.
struct FuseNgramLossGradPattern : OpRewritePattern<lm::NgramLossOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::NgramLossOp loss, PatternRewriter &rewriter) const override {
    FailureOr<lm::NgramLossGradOp> reading = gradReading<lm::NgramLossGradOp>(loss.getLse());
    if (failed(reading))
      return rewriter.notifyMatchFailure(loss, "two ngram_loss_grad read its lse");
    lm::NgramLossGradOp grad = *reading;
    if (!grad)
      return rewriter.notifyMatchFailure(loss, "no ngram_loss_grad reads its lse");
    if (grad.getHeads() != loss.getHeads() || grad.getWeight() != loss.getWeight() ||
        grad.getBias() != loss.getBias() || grad.getTargets() != loss.getTargets() ||
        grad.getLengths() != loss.getLengths() || grad.getLse() != loss.getLse() ||
        grad.getSmoothing() != loss.getSmoothing())
      return rewriter.notifyMatchFailure(loss, "the ngram_loss_grad differs in an operand or attribute");
    const int64_t n = int64_t(loss.getHeads().size());
    auto fused = rewriter.create<lm::NgramLossAndGradOp>(
        loss.getLoc(), loss.getLoss().getType(), loss.getLse().getTypes(), grad.getDHeads().getTypes(),
        grad.getDWeight().getType(), grad.getDBias().getType(), loss.getHeads(), loss.getWeight(), loss.getBias(),
        loss.getTargets(), loss.getLengths(), loss.getSmoothingAttr());
    rewriter.replaceOp(grad, fused->getResults().drop_front(1 + n));
    rewriter.replaceOp(loss, fused->getResults().take_front(1 + n));
    return success();
  }
};

struct LmFuseLossGrad : lmcc::impl::LmFuseLossGradBase<LmFuseLossGrad> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseLossGradPattern, FuseNgramLossGradPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
