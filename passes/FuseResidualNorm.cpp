//===- FuseResidualNorm.cpp - lm-fuse-residual-norm -------------------------===//
//
// layer_norm(add(x, r))  ==>  add_layer_norm(x, r)  when the sum has no other use: the post-norm residual
// LN(h + f(h)) of every layer. The lowering adds and normalizes each row in one pass (the row in cache between the
// two), so the [B, N, D] sum is never stored and read back, and a batch-1 call loses the add's separate pass (below
// the row-task threshold it ran on one thread). Exact: the sum is rounded to f32 as lm.add rounds it, then
// normalized as lm.layer_norm normalizes it. Training entry points are left as they are: lm-autodiff
// differentiates their add and layer_norm (whose backward reads the sum).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Utils.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFUSERESIDUALNORM
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

struct FuseResidualNormPattern : OpRewritePattern<lm::LayerNormOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::LayerNormOp norm, PatternRewriter &rewriter) const override {
    if (inTrainingFunction(norm))
      return rewriter.notifyMatchFailure(norm, "a training entry point (lm-autodiff differentiates it as is)");
    auto add = norm.getInput().getDefiningOp<lm::AddOp>();
    if (!add || !add->hasOneUse())
      return rewriter.notifyMatchFailure(norm, "the input is not a single-use lm.add");
    rewriter.replaceOpWithNewOp<lm::AddLayerNormOp>(norm, norm.getType(), add.getLhs(), add.getRhs(), norm.getGamma(),
                                                    norm.getBeta(), norm.getEpsilonAttr());
    rewriter.eraseOp(add);
    return success();
  }
};

struct LmFuseResidualNorm : lmcc::impl::LmFuseResidualNormBase<LmFuseResidualNorm> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseResidualNormPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
