//===- Autodiff.cpp - lm-autodiff -------------------------------------------===//
//
// Reverse-mode differentiation of the training loss on the lm dialect. The loss function
// `loss(inputs, targets, lengths) -> ce [B, N]` (or the Diformer's pair loss `loss(src, src_len, tgt,
// tgt_len, rows) -> (ce, length_logprob)`, whose length term is seeded with -lm.length_loss / B) is copied
// to `loss_grad`; in the copy, the ops
// are visited from the last to the first, and every op with a result that has a gradient
// ("adjoint") emits its vector-Jacobian product as lm ops before the return. The seed is
// implicit: the loss op's VJP (lm.token_loss_grad / lm.cross_entropy_grad) is d ce = 1/T on
// every row with a target, T counted by the op itself. The gradient of each canonical weight is
// the sum over its lm.weight ops (tied tables) and is written by one lm.param_grad; an embedding's scatter
// adds into the dense gradient its tied table already has (lm.embed_grad into).
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Utils.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace lmcc {
#define GEN_PASS_DEF_LMAUTODIFF
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

class Differentiator {
public:
  /// `pairs`: a source/target loss (src, src_len, tgt, tgt_len, rows) -> (ce, length_logprob), the Diformer's.
  Differentiator(func::FuncOp fn, bool pairs) : fn(fn), pairs(pairs), b(fn.getContext()), loc(fn.getLoc()) {}

  LogicalResult run() {
    Block &block = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    if (ret.getNumOperands() != (pairs ? 2u : 1u))
      return fn.emitOpError(pairs ? "lm-autodiff: a pair loss returns the per-row losses and the length log-probs"
                                  : "lm-autodiff: a loss function returns exactly the per-row losses");
    Value ce = ret.getOperand(0);
    // lm-prune-loss-rows: the loss of the rows with a target, put back in place (no VJP needed: the seed is the
    // loss op's).
    if (auto placed = ce.getDefiningOp<lm::ScatterRowsOp>(); placed && ce.hasOneUse())
      ce = placed.getInput();
    if (!ce.hasOneUse() || !isa_and_nonnull<lm::TokenLossOp, lm::CrossEntropyOp, lm::NgramLossOp>(ce.getDefiningOp()))
      return fn.emitOpError("lm-autodiff: the returned per-row losses must come straight from lm.token_loss, "
                            "lm.cross_entropy or lm.ngram_loss (their VJP seeds d ce = 1/T), or through "
                            "lm.scatter_rows");
    Operation *lengthLoss = nullptr;
    if (pairs) {
      Value l = ret.getOperand(1);
      auto weight = lm::LmDialect::LengthLossAttrHelper(fn.getContext()).getAttr(fn);
      if (!l.hasOneUse() || !isa_and_nonnull<lm::LengthLogprobOp>(l.getDefiningOp()) || !weight)
        return fn.emitOpError("lm-autodiff: a pair loss returns lm.length_logprob's result second, and carries its "
                              "weight as lm.length_loss");
      lengthLoss = l.getDefiningOp();
      lengthWeight = weight.getValueAsDouble();
    } else {
      lengths = fn.getArgument(2);
    }
    if (pairs)
      findSequenceLengths(block);
    b.setInsertionPoint(ret);
    SmallVector<Operation *> ops;
    for (Operation &op : block.without_terminator())
      ops.push_back(&op);
    for (Operation *op : llvm::reverse(ops))
      if (failed(visit(op, op == ce.getDefiningOp() || op == lengthLoss)))
        return failure();
    for (auto &[name, grad] : weightGrads)
      b.create<lm::ParamGradOp>(loc, grad, b.getStringAttr(name));
    return success();
  }

private:
  /// Adds `g` to the adjoint of `v`.
  void accumulate(Value v, Value g) {
    if (!g)
      return;
    auto it = adjoint.find(v);
    if (it == adjoint.end())
      adjoint[v] = g;
    else
      it->second = b.create<lm::AddOp>(loc, it->second, g);
  }
  Value grad(Value v) const { return adjoint.lookup(v); }

  /// A pair loss's attention whose queries are another sequence than its keys (the Diformer's cross-attention):
  /// the queries' lengths, else null (the keys' lengths pad the queries too).
  Value queryLengths(lm::AttentionOp att) {
    Value q = sequenceLengths.lookup(att.getQuery());
    return q && q != att.getLengths() ? q : Value();
  }

  /// Which lengths pad each value of a pair loss, forward from the src/tgt embeddings and the decoder
  /// queries: a result is padded like the op's first operand (every op here keeps its first operand's rows).
  void findSequenceLengths(Block &block) {
    for (Operation &op : block.without_terminator()) {
      Value len;
      if (auto e = dyn_cast<lm::EmbedOp>(op))
        len = lengthsOf(e.getIds());
      else if (auto p = dyn_cast<lm::PositionsOp>(op))
        len = lengthsOf(p.getIds());
      else if (auto q = dyn_cast<lm::DecoderQueriesOp>(op))
        len = q.getLengths();
      else if (op.getNumOperands() > 0)
        len = sequenceLengths.lookup(op.getOperand(0));
      if (len)
        for (Value r : op.getResults())
          sequenceLengths[r] = len;
    }
  }

  /// The lengths of the sequence `ids` holds: the loss's lengths, or for a pair loss the lengths argument
  /// after the ids argument (src_len for src, tgt_len for tgt).
  Value lengthsOf(Value ids) {
    if (!pairs)
      return lengths;
    for (unsigned i = 0; i + 1 < fn.getNumArguments(); ++i)
      if (fn.getArgument(i) == ids)
        return fn.getArgument(i + 1);
    return Value();
  }

  LogicalResult visit(Operation *op, bool isLoss) {
    if (auto loss = dyn_cast<lm::TokenLossOp>(op)) {
      if (!isLoss)
        return success();
      auto g = b.create<lm::TokenLossGradOp>(
          loc, TypeRange{loss.getHidden().getType(), loss.getWeight().getType(),
                         RankedTensorType::get({loss.getWeight().getType().getDimSize(0)}, b.getF32Type())},
          loss.getHidden(), loss.getWeight(), loss.getBias(), loss.getTargets(), loss.getLengths(), loss.getLse(),
          loss.getSmoothingAttr(), loss.getPerLengthAttr());
      accumulate(loss.getHidden(), g.getDHidden());
      accumulate(loss.getWeight(), g.getDWeight());
      if (loss.getBias())
        accumulate(loss.getBias(), g.getDBias());
      return success();
    }
    if (auto ce = dyn_cast<lm::CrossEntropyOp>(op)) {
      if (!isLoss)
        return success();
      accumulate(ce.getLogprobs(), b.create<lm::CrossEntropyGradOp>(loc, ce.getLogprobs().getType(), ce.getTargets(),
                                                                    ce.getLengths(), ce.getSmoothingAttr(),
                                                                    ce.getPerLengthAttr()));
      return success();
    }
    if (auto len = dyn_cast<lm::LengthLogprobOp>(op)) {
      if (!isLoss)
        return len.emitOpError("lm-autodiff: the length log-probs have a VJP only as the pair loss's second result");
      auto g = b.create<lm::LengthLossGradOp>(loc, TypeRange{len.getHidden().getType(), len.getWeight().getType()},
                                              len.getHidden(), len.getLengths(), len.getWeight(),
                                              len.getTargetLengths(), b.getF64FloatAttr(lengthWeight));
      accumulate(len.getHidden(), g.getDHidden());
      accumulate(len.getWeight(), g.getDWeight());
      return success();
    }
    if (auto w = dyn_cast<lm::WeightOp>(op)) {
      if (Value g = grad(w)) {
        auto it = llvm::find_if(weightGrads, [&](auto &entry) { return entry.first == w.getName(); });
        if (it == weightGrads.end())
          weightGrads.push_back({w.getName().str(), g});
        else
          it->second = b.create<lm::AddOp>(loc, it->second, g);
      }
      return success();
    }
    if (auto loss = dyn_cast<lm::NgramLossOp>(op)) {
      if (!isLoss)
        return success();
      SmallVector<Type> types;
      for (Value h : loss.getHeads())
        types.push_back(h.getType());
      types.push_back(loss.getWeight().getType());
      types.push_back(RankedTensorType::get({loss.getWeight().getType().getDimSize(0)}, b.getF32Type()));
      auto g = b.create<lm::NgramLossGradOp>(loc, types, loss.getHeads(), loss.getWeight(), loss.getBias(),
                                             loss.getTargets(), loss.getLengths(), loss.getLse(),
                                             loss.getSmoothingAttr());
      for (auto [h, dh] : llvm::zip(loss.getHeads(), g.getDHeads()))
        accumulate(h, dh);
      accumulate(loss.getWeight(), g.getDWeight());
      if (loss.getBias())
        accumulate(loss.getBias(), g.getDBias());
      return success();
    }
    // lm.wdr_conjugate is the paper's stop-gradient: no VJP, so its copy of W gets nothing from it.
    if (isa<lm::FillIdsOp, lm::WdrConjugateOp, lm::DirectionalTargetsOp, lm::TargetRowsOp>(op))
      return success();
    // Every other op: nothing to do unless one of its results has a gradient.
    if (llvm::none_of(op->getResults(), [&](Value r) { return bool(grad(r)); }))
      return success();
    Value dy = grad(op->getResult(0));

    if (auto l = dyn_cast<lm::LinearOp>(op)) {
      auto w = l.getWeight().getType();
      auto g = b.create<lm::LinearGradOp>(
          loc, TypeRange{l.getInput().getType(), w, RankedTensorType::get({w.getDimSize(0)}, w.getElementType())}, dy,
          l.getInput(), l.getWeight());
      accumulate(l.getInput(), g.getDInput());
      accumulate(l.getWeight(), g.getDWeight());
      if (l.getBias())
        accumulate(l.getBias(), g.getDBias());
      return success();
    }
    if (auto n = dyn_cast<lm::LayerNormOp>(op)) {
      auto g = b.create<lm::LayerNormGradOp>(
          loc, TypeRange{n.getInput().getType(), n.getGamma().getType(), n.getBeta().getType()}, dy, n.getInput(),
          n.getGamma(), n.getEpsilonAttr());
      accumulate(n.getInput(), g.getDInput());
      accumulate(n.getGamma(), g.getDGamma());
      accumulate(n.getBeta(), g.getDBeta());
      return success();
    }
    if (auto gelu = dyn_cast<lm::GeluOp>(op)) {
      accumulate(gelu.getInput(), b.create<lm::ActivationGradOp>(
                                      loc, dy, gelu.getInput(), gelu.getApproximate() ? "gelu_tanh" : "gelu"));
      return success();
    }
    if (auto relu = dyn_cast<lm::ReluOp>(op)) {
      accumulate(relu.getInput(), b.create<lm::ActivationGradOp>(loc, dy, relu.getInput(), "relu"));
      return success();
    }
    if (auto add = dyn_cast<lm::AddOp>(op)) {
      accumulate(add.getLhs(), dy);
      accumulate(add.getRhs(), dy);
      return success();
    }
    if (auto d = dyn_cast<lm::DropoutOp>(op)) {
      accumulate(d.getInput(), b.create<lm::DropoutGradOp>(loc, dy.getType(), dy, d.getRows(), d.getRateAttr(),
                                                           d.getSiteAttr()));
      return success();
    }
    if (auto scale = dyn_cast<lm::ScaleOp>(op)) {
      accumulate(scale.getInput(), b.create<lm::ScaleOp>(loc, dy, scale.getFactorAttr()));
      return success();
    }
    if (auto split = dyn_cast<lm::SplitHeadsOp>(op)) {
      accumulate(split.getInput(), b.create<lm::MergeHeadsOp>(loc, split.getInput().getType(), dy));
      return success();
    }
    if (auto merge = dyn_cast<lm::MergeHeadsOp>(op)) {
      accumulate(merge.getInput(), b.create<lm::SplitHeadsOp>(loc, merge.getInput().getType(), dy));
      return success();
    }
    if (auto m = dyn_cast<lm::MatmulOp>(op)) {
      if (m.getTransposeLhs())
        return m.emitOpError("lm-autodiff: no VJP for a transpose_lhs matmul (only backward passes make them)");
      Value a = m.getLhs(), c = m.getRhs();
      if (m.getTransposeRhs()) { // C = A B^T: dA = dC B, dB = dC^T A
        accumulate(a, b.create<lm::MatmulOp>(loc, a.getType(), dy, c, UnitAttr(), UnitAttr()));
        accumulate(c, b.create<lm::MatmulOp>(loc, c.getType(), dy, a, UnitAttr(), b.getUnitAttr()));
      } else { // C = A B: dA = dC B^T, dB = A^T dC
        accumulate(a, b.create<lm::MatmulOp>(loc, a.getType(), dy, c, b.getUnitAttr(), UnitAttr()));
        accumulate(c, b.create<lm::MatmulOp>(loc, c.getType(), a, dy, UnitAttr(), b.getUnitAttr()));
      }
      return success();
    }
    if (auto fill = dyn_cast<lm::MaskFillOp>(op)) {
      // The filled scores feed a softmax whose VJP is p (dy - sum dy p): zero wherever p = 0, so
      // hidden keys already get a zero gradient. Anything else reading -inf scores has no VJP here.
      for (Operation *user : fill->getUsers())
        if (!isa<lm::SoftmaxOp>(user))
          return fill.emitOpError("lm-autodiff: masked scores must feed lm.softmax only");
      accumulate(fill.getScores(), dy);
      return success();
    }
    if (auto softmax = dyn_cast<lm::SoftmaxOp>(op)) {
      accumulate(softmax.getInput(), b.create<lm::SoftmaxGradOp>(loc, dy, softmax.getResult()));
      return success();
    }
    if (auto ls = dyn_cast<lm::LogSoftmaxOp>(op)) {
      accumulate(ls.getInput(), b.create<lm::LogSoftmaxGradOp>(loc, dy, ls.getResult()));
      return success();
    }
    // Row placements move rows, each at most once: their VJPs move the gradient's rows back, summing nothing.
    if (auto g = dyn_cast<lm::GatherRowsOp>(op)) {
      accumulate(g.getInput(),
                 b.create<lm::ScatterRowsOp>(loc, g.getInput().getType(), dy, g.getRows(), g.getInput()));
      return success();
    }
    if (auto sc = dyn_cast<lm::ScatterRowsOp>(op)) {
      accumulate(sc.getInput(), b.create<lm::GatherRowsOp>(loc, sc.getInput().getType(), dy, sc.getRows()));
      return success();
    }
    if (auto att = dyn_cast<lm::AttentionOp>(op)) {
      if (att.getQueryPositions())
        return att.emitOpError("lm-autodiff: attention with query positions has no VJP yet");
      SmallVector<Type> types{att.getQuery().getType(), att.getKey().getType(), att.getValue().getType()};
      if (att.getRelKey())
        types.append({att.getRelKey().getType(), att.getRelValue().getType()});
      auto g = b.create<lm::AttentionGradOp>(loc, types, dy, att.getQuery(), att.getKey(), att.getValue(),
                                             att.getLengths(), att.getMaskData(), queryLengths(att),
                                             att.getRelKey(), att.getRelValue(),
                                             att.getHeadsAttr(), att.getMaskAttr(), att.getScaleAttr(),
                                             att.getClipAttr());
      accumulate(att.getQuery(), g.getDQuery());
      accumulate(att.getKey(), g.getDKey());
      accumulate(att.getValue(), g.getDValue());
      if (att.getRelKey()) {
        accumulate(att.getRelKey(), g.getDRelative()[0]);
        accumulate(att.getRelValue(), g.getDRelative()[1]);
      }
      return success();
    }
    if (auto rs = dyn_cast<lm::RelativeScoresOp>(op)) {
      auto g = b.create<lm::RelativeScoresGradOp>(loc, TypeRange{rs.getQuery().getType(), rs.getRel().getType()}, dy,
                                                  rs.getQuery(), rs.getRel(), rs.getClipAttr());
      accumulate(rs.getQuery(), g.getDQuery());
      accumulate(rs.getRel(), g.getDRel());
      return success();
    }
    if (auto rv = dyn_cast<lm::RelativeValuesOp>(op)) {
      auto g = b.create<lm::RelativeValuesGradOp>(loc, TypeRange{rv.getProbs().getType(), rv.getRel().getType()}, dy,
                                                  rv.getProbs(), rv.getRel(), rv.getClipAttr());
      accumulate(rv.getProbs(), g.getDProbs());
      accumulate(rv.getRel(), g.getDRel());
      return success();
    }
    if (auto embed = dyn_cast<lm::EmbedOp>(op)) {
      Value len = lengthsOf(embed.getIds());
      if (!len)
        return embed.emitOpError("lm-autodiff: the ids of an embedding in a pair loss must be src or tgt");
      // A tied table already has a dense gradient (the output head's, which comes later in the forward): the
      // scatter adds into it (lm.embed_grad into) rather than into a zeroed table that an lm.add then sums.
      Value table = embed.getTable();
      Value *pending = nullptr;
      if (adjoint.count(table))
        pending = &adjoint[table];
      else if (auto w = table.getDefiningOp<lm::WeightOp>()) {
        auto it = llvm::find_if(weightGrads, [&](auto &entry) { return entry.first == w.getName(); });
        if (it != weightGrads.end())
          pending = &it->second;
      }
      auto g = b.create<lm::EmbedGradOp>(loc, table.getType(), dy, embed.getIds(), len, pending ? *pending : Value());
      if (pending)
        *pending = g;
      else
        adjoint[table] = g;
      return success();
    }
    if (auto pos = dyn_cast<lm::PositionsOp>(op)) {
      Value len = lengthsOf(pos.getIds());
      if (!len)
        return pos.emitOpError("lm-autodiff: the ids of positions in a pair loss must be src or tgt");
      if (Value table = pos.getTable())
        accumulate(table, b.create<lm::PositionsGradOp>(loc, table.getType(), dy, len));
      return success();
    }
    if (auto q = dyn_cast<lm::DecoderQueriesOp>(op)) {
      auto g = b.create<lm::DecoderQueriesGradOp>(
          loc, TypeRange{q.getDirection().getType(), q.getL2r().getType(), q.getR2l().getType()}, dy, q.getRows(),
          q.getLengths());
      accumulate(q.getDirection(), g.getDDirection());
      accumulate(q.getL2r(), g.getDL2r());
      accumulate(q.getR2l(), g.getDR2l());
      return success();
    }
    return op->emitOpError("lm-autodiff: no VJP for this op yet (training supports the ops of the unilm, bilm and "
                           "tta families)");
  }

  func::FuncOp fn;
  bool pairs;
  OpBuilder b;
  Location loc;
  Value lengths;             ///< the loss's lengths (not for a pair loss: lengthsOf)
  double lengthWeight = 0;   ///< a pair loss's length-loss weight
  llvm::DenseMap<Value, Value> adjoint;
  llvm::DenseMap<Value, Value> sequenceLengths; ///< a pair loss's values -> the lengths padding their rows
  std::vector<std::pair<std::string, Value>> weightGrads; // in first-seen order (from the last op)
};

struct LmAutodiff : lmcc::impl::LmAutodiffBase<LmAutodiff> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto method = lm::LmDialect::MethodAttrHelper(&getContext());
    SmallVector<func::FuncOp> losses;
    for (auto fn : module.getOps<func::FuncOp>())
      if (auto m = method.getAttr(fn); m && (m.getValue() == "loss" || m.getValue() == "pair_loss"))
        losses.push_back(fn);
    for (func::FuncOp loss : losses) {
      const bool pairs = method.getAttr(loss).getValue() == "pair_loss";
      if (loss.getNumArguments() != (pairs ? 5u : 3u) || !loss.getBody().hasOneBlock()) {
        loss.emitOpError(pairs ? "lm-autodiff: a pair loss takes (src, src_len, tgt, tgt_len, rows) and has one block"
                               : "lm-autodiff: a loss function takes (inputs, targets, lengths) and has one block");
        return signalPassFailure();
      }
      OpBuilder b(module.getBodyRegion());
      b.setInsertionPointAfter(loss);
      auto copy = cast<func::FuncOp>(b.clone(*loss));
      copy.setSymName((loss.getSymName() + "_grad").str());
      method.setAttr(copy, b.getStringAttr(pairs ? "pair_loss_grad" : "loss_grad"));
      copy.walk([&](lm::DropoutOp d) { d.setTraining(true); }); // the gradient entry trains; `loss` evaluates
      // lm-fuse-activation's lm.linear {activation} split back: the activation's VJP reads the pre-activation.
      copy.walk([](lm::LinearOp l) {
        std::optional<StringRef> kind = l.getActivation();
        if (!kind)
          return;
        OpBuilder ob(l->getContext());
        ob.setInsertionPointAfter(l);
        l.removeActivationAttr();
        Value y = l.getResult(), act = lm::createActivation(ob, l.getLoc(), *kind, y);
        y.replaceAllUsesExcept(act, act.getDefiningOp());
      });
      if (failed(Differentiator(copy, pairs).run()))
        return signalPassFailure();
      eraseDeadOps(copy.getBody().front());
      // `loss` evaluates (validation): its dropouts are identities. Removed, nothing stands between a softmax and
      // its value product there any more (lmcc compile re-fuses that attention after this pass).
      loss.walk([](lm::DropoutOp d) {
        d.getResult().replaceAllUsesWith(d.getInput());
        d.erase();
      });
    }
  }
};

} // namespace
