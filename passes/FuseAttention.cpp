//===- FuseAttention.cpp - lm-fuse-attention --------------------------------===//
//
// merge_heads(softmax(mask_fill(scale(QhKh^T [+ rel_scores]))) Vh [+ rel_values])
//   with Qh/Kh/Vh = split_heads(Q/K/V)   ==>   lm.attention(Q, K, V, lengths)
// The fused op means exactly the same (runtime/reference/Ops.cpp `attention`).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace lmcc {
#define GEN_PASS_DEF_LMFUSEATTENTION
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

/// `value` = x + y where one side is produced by OpA and the other by OpB (either order).
template <typename OpA, typename OpB> bool matchSum(Value value, OpA &a, OpB &b) {
  auto add = value.getDefiningOp<lm::AddOp>();
  if (!add)
    return false;
  for (auto [x, y] : {std::pair{add.getLhs(), add.getRhs()}, std::pair{add.getRhs(), add.getLhs()}}) {
    a = x.template getDefiningOp<OpA>();
    b = y.template getDefiningOp<OpB>();
    if (a && b)
      return true;
  }
  return false;
}

struct FuseAttentionPattern : OpRewritePattern<lm::MergeHeadsOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(lm::MergeHeadsOp merge, PatternRewriter &rewriter) const override {
    // context = probs @ Vh  [+ relative_values(probs, rel_v)]
    lm::MatmulOp pv;
    lm::RelativeValuesOp relValues;
    if (!(pv = merge.getInput().getDefiningOp<lm::MatmulOp>()) && !matchSum(merge.getInput(), pv, relValues))
      return rewriter.notifyMatchFailure(merge, "input is not probs @ V");
    if (pv.getTransposeRhs())
      return failure();
    auto softmax = pv.getLhs().getDefiningOp<lm::SoftmaxOp>();
    auto vh = pv.getRhs().getDefiningOp<lm::SplitHeadsOp>();
    if (!softmax || !vh || (relValues && relValues.getProbs() != softmax.getResult()))
      return rewriter.notifyMatchFailure(merge, "not softmax @ split_heads(V)");
    auto maskFill = softmax.getInput().getDefiningOp<lm::MaskFillOp>();
    if (!maskFill)
      return failure();
    auto scale = maskFill.getScores().getDefiningOp<lm::ScaleOp>();
    if (!scale)
      return failure();
    // scores = Qh Kh^T  [+ relative_scores(Qh, Kh, rel_k)]
    lm::MatmulOp qk;
    lm::RelativeScoresOp relScores;
    if (!(qk = scale.getInput().getDefiningOp<lm::MatmulOp>()) && !matchSum(scale.getInput(), qk, relScores))
      return failure();
    if (!qk.getTransposeRhs() || bool(relScores) != bool(relValues))
      return failure();
    auto qh = qk.getLhs().getDefiningOp<lm::SplitHeadsOp>();
    auto kh = qk.getRhs().getDefiningOp<lm::SplitHeadsOp>();
    if (!qh || !kh)
      return failure();
    if (relScores && (relScores.getQuery() != qh.getResult() || relScores.getKeys() != kh.getResult() ||
                      relScores.getClip() != relValues.getClip()))
      return failure();
    int64_t heads = qh.getType().getDimSize(1);
    if (vh.getType().getDimSize(1) != heads || kh.getType().getDimSize(1) != heads)
      return failure();

    Value relK = relScores ? relScores.getRel() : Value();
    Value relV = relValues ? relValues.getRel() : Value();
    int64_t clip = relScores ? int64_t(relScores.getClip()) : 0;
    rewriter.replaceOpWithNewOp<lm::AttentionOp>(
        merge, merge.getType(), qh.getInput(), kh.getInput(), vh.getInput(), maskFill.getLengths(),
        maskFill.getMaskData(), relK, relV, /*query_positions=*/Value(), rewriter.getI64IntegerAttr(heads), maskFill.getMaskAttr(),
        scale.getFactorAttr(), rewriter.getI64IntegerAttr(clip));
    return success();
  }
};

struct LmFuseAttention : lmcc::impl::LmFuseAttentionBase<LmFuseAttention> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseAttentionPattern>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
