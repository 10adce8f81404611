//===- FuseActivation.cpp - lm-fuse-activation ------------------------------===//
//
// gelu(linear(x, W, b))  ==>  linear(x, W, b) {activation = "gelu"}   (gelu {approximate}: "gelu_tanh"; relu: "relu")
// when the linear's result feeds only the activation. The generated GEMM applies it in its epilogue
// (codegen/LmToLoops/Gemm.cpp), bit for bit the activation op's numbers.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFUSEACTIVATION
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

struct FuseActivationPattern : RewritePattern {
  FuseActivationPattern(MLIRContext *ctx) : RewritePattern(MatchAnyOpTypeTag(), /*benefit=*/1, ctx) {}

  LogicalResult matchAndRewrite(Operation *op, PatternRewriter &rewriter) const override {
    StringRef kind = lm::activationKind(op);
    if (kind.empty())
      return failure();
    auto linear = op->getOperand(0).getDefiningOp<lm::LinearOp>();
    if (!linear || !linear->hasOneUse() || linear.getActivation())
      return rewriter.notifyMatchFailure(op, "input is not a single-use linear without an activation");
    auto fused = rewriter.create<lm::LinearOp>(linear.getLoc(), op->getResult(0).getType(), linear.getInput(),
                                               linear.getWeight(), linear.getBias());
    fused.setActivation(kind);
    rewriter.replaceOp(op, fused.getResult());
    rewriter.eraseOp(linear);
    return success();
  }
};

struct LmFuseActivation : lmcc::impl::LmFuseActivationBase<LmFuseActivation> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseActivationPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
