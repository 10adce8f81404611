//===- LmOps.cpp - lm op verifiers ------------------------------------------===//
//
// Every verifier says what is wrong in terms a spec author or pass writer can act
// on: which operand, which dimension, what was expected.
//
//===----------------------------------------------------------------------===//
#include "dialect/LmDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace lmcc::lm;

namespace {

RankedTensorType tensorOf(Value v) { return llvm::cast<RankedTensorType>(v.getType()); }

/// Two dimensions agree when equal or when either is dynamic.
bool compatible(int64_t a, int64_t b) { return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) || a == b; }

std::string dimStr(int64_t d) { return ShapedType::isDynamic(d) ? "?" : std::to_string(d); }

LogicalResult expectRank(Operation *op, StringRef what, Value v, int64_t rank) {
  if (tensorOf(v).getRank() != rank)
    return op->emitOpError() << what << " must have rank " << rank << ", got " << v.getType();
  return success();
}

LogicalResult expectDim(Operation *op, StringRef what, int64_t got, int64_t expected) {
  if (!compatible(got, expected))
    return op->emitOpError() << what << ": expected " << dimStr(expected) << ", got " << dimStr(got);
  return success();
}

} // namespace

#define GET_OP_CLASSES
#include "dialect/LmOps.cpp.inc"

LogicalResult WeightOp::verify() {
  if (getName().empty())
    return emitOpError("needs a non-empty canonical weight name, e.g. \"embed.token\"");
  if (!getResult().getType().hasStaticShape())
    return emitOpError("weights have static shapes (model dimensions are compile-time constants), got ")
           << getResult().getType();
  return success();
}

LogicalResult EmbedOp::verify() {
  if (failed(expectRank(*this, "table", getTable(), 2)) || failed(expectRank(*this, "ids", getIds(), 2)) ||
      failed(expectRank(*this, "result", getResult(), 3)))
    return failure();
  auto ids = getIds().getType(), res = getResult().getType();
  if (failed(expectDim(*this, "result dim 0 (batch)", res.getDimSize(0), ids.getDimSize(0))) ||
      failed(expectDim(*this, "result dim 1 (sequence)", res.getDimSize(1), ids.getDimSize(1))) ||
      failed(expectDim(*this, "result dim 2 (embedding width)", res.getDimSize(2), getTable().getType().getDimSize(1))))
    return failure();
  return success();
}

LogicalResult PositionsOp::verify() {
  if (failed(expectRank(*this, "ids", getIds(), 2)) || failed(expectRank(*this, "result", getResult(), 3)))
    return failure();
  auto ids = getIds().getType(), res = getResult().getType();
  if (failed(expectDim(*this, "result dim 0 (batch)", res.getDimSize(0), ids.getDimSize(0))) ||
      failed(expectDim(*this, "result dim 1 (sequence)", res.getDimSize(1), ids.getDimSize(1))))
    return failure();
  if (ShapedType::isDynamic(res.getDimSize(2)))
    return emitOpError("the embedding width (result dim 2) must be static");
  if (Value table = getTable()) {
    if (failed(expectRank(*this, "table", table, 2)) ||
        failed(expectDim(*this, "table dim 1 (embedding width)", tensorOf(table).getDimSize(1), res.getDimSize(2))))
      return failure();
  } else if (res.getDimSize(2) % 2) {
    return emitOpError("sinusoidal positions need an even embedding width, got ") << res.getDimSize(2);
  }
  return success();
}

LogicalResult LinearOp::verify() {
  auto in = getInput().getType(), w = getWeight().getType(), res = getResult().getType();
  if (failed(expectRank(*this, "weight ([out, in])", getWeight(), 2)))
    return failure();
  if (in.getRank() < 1 || in.getRank() != res.getRank())
    return emitOpError("input and result must have the same rank >= 1, got ") << in << " and " << res;
  if (failed(expectDim(*this, "input features vs weight dim 1 (in)", in.getShape().back(), w.getDimSize(1))) ||
      failed(expectDim(*this, "result features vs weight dim 0 (out)", res.getShape().back(), w.getDimSize(0))))
    return failure();
  for (int64_t i = 0; i + 1 < in.getRank(); ++i)
    if (failed(expectDim(*this, "leading dim " + std::to_string(i), res.getDimSize(i), in.getDimSize(i))))
      return failure();
  if (Value b = getBias())
    if (failed(expectRank(*this, "bias", b, 1)) ||
        failed(expectDim(*this, "bias size vs weight dim 0 (out)", tensorOf(b).getDimSize(0), w.getDimSize(0))))
      return failure();
  if (auto act = getActivation(); act && *act != "gelu" && *act != "gelu_tanh" && *act != "relu")
    return emitOpError("activation must be \"gelu\", \"gelu_tanh\" or \"relu\", got \"") << *act << "\"";
  return success();
}

LogicalResult LayerNormOp::verify() {
  if (getInput().getType() != getResult().getType())
    return emitOpError("result type must equal the input type ") << getInput().getType();
  int64_t width = getInput().getType().getShape().back();
  for (auto [name, v] : {std::pair<const char *, Value>{"gamma", getGamma()}, {"beta", getBeta()}})
    if (failed(expectRank(*this, name, v, 1)) ||
        failed(expectDim(*this, std::string(name) + " size vs the normalized axis", tensorOf(v).getDimSize(0), width)))
      return failure();
  if (!(getEpsilon().convertToDouble() > 0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult InterpolateOp::verify() {
  double lambda = getLambda().convertToDouble();
  if (!(lambda >= 0 && lambda <= 1))
    return emitOpError("lambda must be in [0, 1], got ") << lambda;
  if (int64_t(getFrom()) < 0)
    return emitOpError("from must be >= 0");
  return success();
}

LogicalResult SplitHeadsOp::verify() {
  if (failed(expectRank(*this, "input [B, N, D]", getInput(), 3)) ||
      failed(expectRank(*this, "result [B, H, N, dh]", getResult(), 4)))
    return failure();
  auto in = getInput().getType(), res = getResult().getType();
  int64_t d = in.getDimSize(2), h = res.getDimSize(1), dh = res.getDimSize(3);
  if (ShapedType::isDynamic(d) || ShapedType::isDynamic(h) || ShapedType::isDynamic(dh))
    return emitOpError("heads and head size must be static");
  if (h * dh != d)
    return emitOpError("heads (") << h << ") x head size (" << dh << ") must equal d_model (" << d << ")";
  if (failed(expectDim(*this, "batch", res.getDimSize(0), in.getDimSize(0))) ||
      failed(expectDim(*this, "sequence", res.getDimSize(2), in.getDimSize(1))))
    return failure();
  return success();
}

LogicalResult MergeHeadsOp::verify() {
  if (failed(expectRank(*this, "input [B, H, N, dh]", getInput(), 4)) ||
      failed(expectRank(*this, "result [B, N, D]", getResult(), 3)))
    return failure();
  auto in = getInput().getType(), res = getResult().getType();
  int64_t h = in.getDimSize(1), dh = in.getDimSize(3), d = res.getDimSize(2);
  if (ShapedType::isDynamic(d) || ShapedType::isDynamic(h) || ShapedType::isDynamic(dh) || h * dh != d)
    return emitOpError("heads x head size must equal the static d_model: ") << dimStr(h) << " x " << dimStr(dh)
                                                                            << " vs " << dimStr(d);
  if (failed(expectDim(*this, "batch", res.getDimSize(0), in.getDimSize(0))) ||
      failed(expectDim(*this, "sequence", res.getDimSize(1), in.getDimSize(2))))
    return failure();
  return success();
}

LogicalResult MatmulOp::verify() {
  auto a = getLhs().getType(), b = getRhs().getType(), c = getResult().getType();
  int64_t rank = a.getRank();
  if (rank < 2 || b.getRank() != rank || c.getRank() != rank)
    return emitOpError("operands and result must share a rank >= 2, got ") << a << ", " << b << ", " << c;
  for (int64_t i = 0; i + 2 < rank; ++i)
    if (failed(expectDim(*this, "batch dim " + std::to_string(i) + " of rhs", b.getDimSize(i), a.getDimSize(i))) ||
        failed(expectDim(*this, "batch dim " + std::to_string(i) + " of result", c.getDimSize(i), a.getDimSize(i))))
      return failure();
  bool t = getTransposeRhs(), tl = getTransposeLhs();
  if (t && tl)
    return emitOpError("transpose_lhs and transpose_rhs together are not supported");
  int64_t m = a.getDimSize(tl ? rank - 1 : rank - 2), k = a.getDimSize(tl ? rank - 2 : rank - 1);
  int64_t kb = b.getDimSize(t ? rank - 1 : rank - 2), n = b.getDimSize(t ? rank - 2 : rank - 1);
  if (failed(expectDim(*this, "contraction size of rhs", kb, k)) ||
      failed(expectDim(*this, "result rows", c.getDimSize(rank - 2), m)) ||
      failed(expectDim(*this, "result columns", c.getDimSize(rank - 1), n)))
    return failure();
  return success();
}

/// Checks the optional per-row mask operand against the mask kind.
static LogicalResult verifyMaskData(Operation *op, MaskKind kind, Value data, int64_t batch) {
  bool needs = kind == MaskKind::directional || kind == MaskKind::Explicit;
  if (needs && !data)
    return op->emitOpError() << "#lm.mask<" << stringifyMaskKind(kind)
                             << "> needs a data(...) operand: per-row directions [B, N, 1 + W] (directional) or a "
                                "[B, N, M] i1 visibility tensor (explicit)";
  if (!needs && data)
    return op->emitOpError() << "#lm.mask<" << stringifyMaskKind(kind)
                             << "> is fully described by its kind; remove the data(...) operand";
  if (!data)
    return success();
  auto t = tensorOf(data);
  if (kind == MaskKind::directional &&
      (t.getRank() != 3 || !t.getElementType().isInteger(32) || ShapedType::isDynamic(t.getDimSize(2)) ||
       t.getDimSize(2) < 1))
    return op->emitOpError("directional mask data must be [B, N, 1 + W] i32 rows (direction 0 R: j <= i, 1 L: j >= i, "
                           "2 S: j != i and j not hidden, 3 skip; then W words of hidden-key bits), got ")
           << t;
  if (kind == MaskKind::Explicit && (t.getRank() != 3 || !t.getElementType().isInteger(1)))
    return op->emitOpError("explicit mask data must be a [B, N, M] i1 tensor, got ") << t;
  return expectDim(op, "mask data batch", t.getDimSize(0), batch);
}

LogicalResult MaskFillOp::verify() {
  if (failed(expectRank(*this, "scores [B, H, N, M]", getScores(), 4)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  if (getScores().getType() != getResult().getType())
    return emitOpError("result type must equal the scores type");
  int64_t batch = getScores().getType().getDimSize(0);
  if (failed(expectDim(*this, "lengths size vs batch", getLengths().getType().getDimSize(0), batch)))
    return failure();
  return verifyMaskData(*this, getMask(), getMaskData(), batch);
}

LogicalResult RelativeScoresOp::verify() {
  if (failed(expectRank(*this, "query", getQuery(), 4)) || failed(expectRank(*this, "keys", getKeys(), 4)) ||
      failed(expectRank(*this, "rel", getRel(), 2)) || failed(expectRank(*this, "result", getResult(), 4)))
    return failure();
  if (int64_t(getClip()) < 1)
    return emitOpError("clip distance must be >= 1");
  auto rel = getRel().getType();
  if (failed(expectDim(*this, "rel rows (2 clip + 1)", rel.getDimSize(0), 2 * getClip() + 1)) ||
      failed(expectDim(*this, "rel width vs head size", rel.getDimSize(1), getQuery().getType().getDimSize(3))))
    return failure();
  return success();
}

LogicalResult RelativeValuesOp::verify() {
  if (failed(expectRank(*this, "probs", getProbs(), 4)) || failed(expectRank(*this, "rel", getRel(), 2)) ||
      failed(expectRank(*this, "result", getResult(), 4)))
    return failure();
  if (int64_t(getClip()) < 1)
    return emitOpError("clip distance must be >= 1");
  auto rel = getRel().getType();
  if (failed(expectDim(*this, "rel rows (2 clip + 1)", rel.getDimSize(0), 2 * getClip() + 1)) ||
      failed(expectDim(*this, "rel width vs head size", rel.getDimSize(1), getResult().getType().getDimSize(3))))
    return failure();
  return success();
}

LogicalResult AttentionOp::verify() {
  for (auto [name, v] : {std::pair<const char *, Value>{"query", getQuery()}, {"key", getKey()}, {"value", getValue()}})
    if (failed(expectRank(*this, std::string(name) + " [B, N, D]", v, 3)))
      return failure();
  auto q = getQuery().getType(), k = getKey().getType(), v = getValue().getType(), r = getResult().getType();
  if (q != r)
    return emitOpError("result type must equal the query type ") << q;
  int64_t d = q.getDimSize(2);
  if (ShapedType::isDynamic(d))
    return emitOpError("d_model must be static");
  if (int64_t(getHeads()) < 1 || d % int64_t(getHeads()))
    return emitOpError("heads (") << int64_t(getHeads()) << ") must divide d_model (" << d << ")";
  if (failed(expectDim(*this, "key width", k.getDimSize(2), d)) ||
      failed(expectDim(*this, "value width", v.getDimSize(2), d)) ||
      failed(expectDim(*this, "key/value sequence", v.getDimSize(1), k.getDimSize(1))) ||
      failed(expectDim(*this, "key batch", k.getDimSize(0), q.getDimSize(0))) ||
      failed(expectDim(*this, "value batch", v.getDimSize(0), q.getDimSize(0))) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectDim(*this, "lengths size vs batch", getLengths().getType().getDimSize(0), q.getDimSize(0))))
    return failure();
  if (bool(getRelKey()) != bool(getRelValue()))
    return emitOpError("relative positions need both rel_key and rel_value");
  if (getRelKey()) {
    if (int64_t(getClip()) < 1)
      return emitOpError("relative positions need clip >= 1");
    for (Value t : {getRelKey(), getRelValue()})
      if (tensorOf(t) != RankedTensorType::get({2 * int64_t(getClip()) + 1, d / int64_t(getHeads())}, q.getElementType()))
        return emitOpError("relative tables must be [2 clip + 1, d_model / heads] = [")
               << 2 * getClip() + 1 << ", " << d / int64_t(getHeads()) << "], got " << t.getType();
  }
  if (Value positions = getQueryPositions()) {
    if (q.getDimSize(1) != 1)
      return emitOpError("query_positions apply to single-query rows: the query must be [B, 1, D], got ") << q;
    if (failed(expectRank(*this, "query_positions [B]", positions, 1)))
      return failure();
  }
  return verifyMaskData(*this, getMask(), getMaskData(), q.getDimSize(0));
}

LogicalResult GatherOp::verify() {
  if (failed(expectRank(*this, "logprobs [B, N, V]", getLogprobs(), 3)) ||
      failed(expectRank(*this, "targets [B, N]", getTargets(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "result [B, N]", getResult(), 2)))
    return failure();
  if (int64_t(getShift()) < 0)
    return emitOpError("shift must be >= 0");
  auto lp = getLogprobs().getType(), t = getTargets().getType();
  if (failed(expectDim(*this, "target batch", t.getDimSize(0), lp.getDimSize(0))) ||
      failed(expectDim(*this, "target sequence", t.getDimSize(1), lp.getDimSize(1))))
    return failure();
  return success();
}

LogicalResult TokenLogprobOp::verify() {
  if (failed(expectRank(*this, "hidden [B, N, D]", getHidden(), 3)) ||
      failed(expectRank(*this, "weight [V, D]", getWeight(), 2)) ||
      failed(expectRank(*this, "targets [B, N]", getTargets(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "result [B, N]", getResult(), 2)))
    return failure();
  if (int64_t(getShift()) < 0)
    return emitOpError("shift must be >= 0");
  auto h = getHidden().getType(), w = getWeight().getType();
  if (failed(expectDim(*this, "hidden width vs weight dim 1", h.getDimSize(2), w.getDimSize(1))))
    return failure();
  if (Value b = getBias())
    if (failed(expectRank(*this, "bias [V]", b, 1)) ||
        failed(expectDim(*this, "bias size vs vocabulary", tensorOf(b).getDimSize(0), w.getDimSize(0))))
      return failure();
  return success();
}

/// The Diformer rows operand [B, N, 1 + W] i32.
static LogicalResult verifyRows(Operation *op, Value rows) {
  auto t = tensorOf(rows);
  if (t.getRank() != 3 || ShapedType::isDynamic(t.getDimSize(2)) || t.getDimSize(2) < 1)
    return op->emitOpError("rows must be [B, N, 1 + W] i32 (direction, hidden-key bits), got ") << t;
  return success();
}

LogicalResult DecoderQueriesOp::verify() {
  if (failed(verifyRows(*this, getRows())) || failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "direction [3, D]", getDirection(), 2)) ||
      failed(expectRank(*this, "l2r [max_len, D]", getL2r(), 2)) ||
      failed(expectRank(*this, "r2l [max_len, D]", getR2l(), 2)) ||
      failed(expectRank(*this, "result [B, N, D]", getResult(), 3)))
    return failure();
  auto dir = tensorOf(getDirection()), l2r = tensorOf(getL2r());
  int64_t d = getResult().getType().getDimSize(2);
  if (failed(expectDim(*this, "direction rows", dir.getDimSize(0), 3)) ||
      failed(expectDim(*this, "direction width", dir.getDimSize(1), d)) ||
      failed(expectDim(*this, "l2r width", l2r.getDimSize(1), d)) ||
      failed(expectDim(*this, "r2l rows", tensorOf(getR2l()).getDimSize(0), l2r.getDimSize(0))) ||
      failed(expectDim(*this, "r2l width", tensorOf(getR2l()).getDimSize(1), d)))
    return failure();
  return success();
}

LogicalResult DirectionalTargetsOp::verify() {
  if (failed(expectRank(*this, "targets [B, N]", getTargets(), 2)) || failed(verifyRows(*this, getRows())) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  if (getResult().getType() != getTargets().getType())
    return emitOpError("result type must equal the targets type");
  return success();
}

LogicalResult LengthLogprobOp::verify() {
  if (failed(expectRank(*this, "hidden [B, M, D]", getHidden(), 3)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "weight [max_len, D]", getWeight(), 2)))
    return failure();
  if (getTargetLengths()) {
    if (failed(expectRank(*this, "target_lengths [B]", getTargetLengths(), 1)) ||
        failed(expectRank(*this, "result [B]", getResult(), 1)))
      return failure();
  } else if (failed(expectRank(*this, "result [B, max_len] (no target_lengths)", getResult(), 2))) {
    return failure();
  } else if (const int64_t width = tensorOf(getResult()).getDimSize(1), rows = tensorOf(getWeight()).getDimSize(0);
             width != rows) { // static: max_len is a model dim (a ? here crashed the lowering)
    return emitOpError() << "result width vs weight rows: expected " << rows << ", got " << dimStr(width);
  }
  if (failed(expectDim(*this, "weight width vs hidden width", tensorOf(getWeight()).getDimSize(1),
                       getHidden().getType().getDimSize(2))))
    return failure();
  return success();
}

LogicalResult SentenceScoreOp::verify() {
  if (failed(expectRank(*this, "logprobs [B, N]", getLogprobs(), 2)) ||
      failed(expectRank(*this, "ids [B, N]", getIds(), 2)) || failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  if (int64_t(getFirst()) < 0)
    return emitOpError("first must be >= 0");
  return success();
}

LogicalResult MeanPoolOp::verify() {
  if (failed(expectRank(*this, "hidden [B, N, D]", getHidden(), 3)) ||
      failed(expectRank(*this, "ids [B, N]", getIds(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "result [B, D]", getResult(), 2)))
    return failure();
  if (getCls() && !getExclude().empty())
    return emitOpError("cls pooling takes row 0: exclude must be empty");
  return expectDim(*this, "result width", getResult().getType().getDimSize(1), getHidden().getType().getDimSize(2));
}

LogicalResult MaskAndPredictOp::verify() {
  if (failed(expectRank(*this, "ids [B, N]", getIds(), 2)) || failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  if (int64_t(getMaskToken()) < 0)
    return emitOpError("mask_token must be a token id >= 0");
  if (getSpans() && getSpans().getType() != getIds().getType())
    return emitOpError("spans must have the ids type ") << getIds().getType();
  Region &body = getBody();
  if (!body.hasOneBlock())
    return emitOpError("the body must be one block");
  Block &block = body.front();
  if (block.getNumArguments() != 1 || block.getArgument(0).getType() != getIds().getType())
    return emitOpError("the body takes one argument, the masked ids, of the ids type ") << getIds().getType();
  auto yield = llvm::dyn_cast<YieldOp>(block.getTerminator());
  if (!yield)
    return emitOpError("the body must end with lm.yield");
  auto y = yield.getValue().getType(), r = getResult().getType();
  if (y != r)
    return emitOpError("the result type ") << r << " must equal the yielded type " << y;
  if (r.getRank() < 2)
    return emitOpError("the yielded value must be per position: [B, N, ...]");
  return success();
}

LogicalResult MaskedBatchOp::verify() {
  if (failed(expectRank(*this, "ids [B, N]", getIds(), 2)) || failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  if (int64_t(getMaskToken()) < 0)
    return emitOpError("mask_token must be a token id >= 0");
  if (getSpans() && getSpans().getType() != getIds().getType())
    return emitOpError("spans must have the ids type ") << getIds().getType();
  Block &block = getBody().front();
  auto ids = getIds().getType(), lengths = getLengths().getType();
  if (block.getNumArguments() != 6 || block.getArgument(0).getType() != ids ||
      block.getArgument(1).getType() != lengths || block.getArgument(2).getType() != ids ||
      block.getArgument(3).getType() != lengths || block.getArgument(4).getType() != lengths ||
      block.getArgument(5).getType() != lengths)
    return emitOpError("the body takes (copies ") << ids << ", copy lengths " << lengths << ", targets " << ids
                                                  << ", positions " << lengths << ", owners " << lengths << ", ends "
                                                  << lengths << ")";
  auto yield = llvm::dyn_cast<YieldOp>(block.getTerminator());
  if (!yield)
    return emitOpError("the body must end with lm.yield");
  auto y = yield.getValue().getType(), r = getResult().getType();
  if (y.getRank() != r.getRank() || y.getRank() < 2)
    return emitOpError("the yielded value ") << y << " must be [C, N or 1, ...] like the result " << r;
  for (int64_t i = 2; i < r.getRank(); ++i)
    if (y.getDimSize(i) != r.getDimSize(i))
      return emitOpError("the yielded value ") << y << " and the result " << r << " differ in dim " << i;
  return success();
}

LogicalResult TakeRowOp::verify() {
  auto in = llvm::cast<RankedTensorType>(getInput().getType()), out = llvm::cast<RankedTensorType>(getResult().getType());
  if (in.getRank() < 2 || out.getRank() != in.getRank() || out.getDimSize(1) != 1)
    return emitOpError("takes [C, N, ...] to [C, 1, ...], got ") << in << " -> " << out;
  if (in.getElementType() != out.getElementType())
    return emitOpError("keeps the element type");
  for (int64_t i = 2; i < in.getRank(); ++i)
    if (!compatible(in.getDimSize(i), out.getDimSize(i)))
      return emitOpError("dim ") << i << " differs: " << in << " -> " << out;
  return expectRank(*this, "positions [C]", getPositions(), 1);
}

LogicalResult TargetRowsOp::verify() {
  if (failed(expectRank(*this, "targets [B, N]", getTargets(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) || failed(expectRank(*this, "rows [B, T]", getRows(), 2)))
    return failure();
  if (getRows().getType() != getRowTargets().getType())
    return emitOpError("rows and row_targets share one [B, T] type, got ") << getRows().getType() << " and "
                                                                           << getRowTargets().getType();
  if (!ShapedType::isDynamic(tensorOf(getRows()).getDimSize(1)))
    return emitOpError("T (rows dim 1) is known only at run time: it must be ?, got ") << getRows().getType();
  int64_t B = tensorOf(getTargets()).getDimSize(0);
  if (failed(expectDim(*this, "lengths dim 0 (B)", tensorOf(getLengths()).getDimSize(0), B)))
    return failure();
  return expectDim(*this, "rows dim 0 (B)", tensorOf(getRows()).getDimSize(0), B);
}

/// The shared shape rules of lm.gather_rows and lm.scatter_rows: [B, from, ...] -> [B, to, ...] with rows [B, T].
static LogicalResult verifyRowPlacement(Operation *op, Value input, Value rows, Value result, int64_t inputRows,
                                        int64_t resultRows) {
  auto in = tensorOf(input), out = tensorOf(result);
  if (in.getRank() < 2 || out.getRank() != in.getRank())
    return op->emitOpError("takes [B, rows, ...] to [B, rows', ...] of the same rank, got ") << in << " -> " << out;
  if (failed(expectRank(op, "rows [B, T]", rows, 2)))
    return failure();
  int64_t B = in.getDimSize(0);
  if (failed(expectDim(op, "rows dim 0 (B)", tensorOf(rows).getDimSize(0), B)) ||
      failed(expectDim(op, "result dim 0 (B)", out.getDimSize(0), B)) ||
      failed(expectDim(op, "input dim 1", in.getDimSize(1), inputRows)) ||
      failed(expectDim(op, "result dim 1", out.getDimSize(1), resultRows)))
    return failure();
  for (int64_t i = 2; i < in.getRank(); ++i)
    if (!compatible(in.getDimSize(i), out.getDimSize(i)))
      return op->emitOpError("dim ") << i << " differs: " << in << " -> " << out;
  return success();
}

LogicalResult GatherRowsOp::verify() {
  int64_t T = tensorOf(getRows()).getRank() == 2 ? tensorOf(getRows()).getDimSize(1) : ShapedType::kDynamic;
  return verifyRowPlacement(*this, getInput(), getRows(), getResult(), ShapedType::kDynamic, T);
}

LogicalResult ScatterRowsOp::verify() {
  auto like = tensorOf(getLike());
  if (like.getRank() < 2)
    return emitOpError("like must be [B, N, ...], got ") << like;
  if (failed(expectDim(*this, "like dim 0 (B)", like.getDimSize(0), tensorOf(getInput()).getDimSize(0))))
    return failure();
  int64_t T = tensorOf(getRows()).getRank() == 2 ? tensorOf(getRows()).getDimSize(1) : ShapedType::kDynamic;
  return verifyRowPlacement(*this, getInput(), getRows(), getResult(), T, like.getDimSize(1));
}

LogicalResult SpliceCopiesOp::verify() {
  auto sentence = getSentence().getType(), masked = getMasked().getType(), result = getResult().getType();
  if (sentence != masked || sentence.getRank() < 2)
    return emitOpError("sentence and masked rows must share one [B, N, ...] type, got ") << sentence << " and " << masked;
  if (result.getRank() != sentence.getRank())
    return emitOpError("the result must be [C, N, ...] like the shared rows");
  for (int64_t i = 1; i < result.getRank(); ++i)
    if (!compatible(result.getDimSize(i), sentence.getDimSize(i)))
      return emitOpError("dim ") << i << " differs between the shared rows and the result";
  if (failed(expectRank(*this, "owners [C]", getOwners(), 1)) || failed(expectRank(*this, "ends [C]", getEnds(), 1)))
    return failure();
  return expectRank(*this, "positions [C]", getPositions(), 1);
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("needs at least one operand");
  auto first = llvm::cast<RankedTensorType>(getInputs()[0].getType());
  int64_t rows = 0;
  for (Value v : getInputs()) {
    auto t = tensorOf(v);
    if (t.getRank() != first.getRank() || !t.hasStaticShape())
      return emitOpError("operands must be static tensors of one rank, got ") << t;
    for (int64_t i = 1; i < t.getRank(); ++i)
      if (t.getDimSize(i) != first.getDimSize(i))
        return emitOpError("operands differ in dim ") << i << ": " << first << " vs " << t;
    rows += t.getDimSize(0);
  }
  if (getResult().getType().getDimSize(0) != rows)
    return emitOpError("the result has ") << getResult().getType().getDimSize(0) << " rows, the operands " << rows;
  return success();
}

LogicalResult SliceFeaturesOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  int64_t offset = getOffset(), size = getSize(), width = in.getShape().back();
  if (offset < 0 || size < 1 || offset + size > width)
    return emitOpError("slice [") << offset << ", " << offset + size << ") is outside the " << width << " features";
  if (out.getRank() != in.getRank() || out.getShape().back() != size)
    return emitOpError("the result must keep the leading dims and have ") << size << " features";
  return success();
}

//===----------------------------------------------------------------------===//
// Training ops
//===----------------------------------------------------------------------===//

namespace {

/// targets [B, N] and lengths [B] of a loss op.
LogicalResult verifyTargets(Operation *op, Value targets, Value lengths, int64_t batch, int64_t rows) {
  if (failed(expectRank(op, "targets [B, N]", targets, 2)) || failed(expectRank(op, "lengths [B]", lengths, 1)))
    return failure();
  auto t = tensorOf(targets);
  return success(succeeded(expectDim(op, "targets batch", t.getDimSize(0), batch)) &&
                 succeeded(expectDim(op, "targets sequence", t.getDimSize(1), rows)) &&
                 succeeded(expectDim(op, "lengths size vs batch", tensorOf(lengths).getDimSize(0), batch)));
}

LogicalResult verifySmoothing(Operation *op, APFloat smoothing) {
  double e = smoothing.convertToDouble();
  if (!(e >= 0 && e <= 1))
    return op->emitOpError("smoothing must be in [0, 1], got ") << e;
  return success();
}

/// A projection weight [V, D] over hidden [B, N, D] with an optional bias [V].
LogicalResult verifyHead(Operation *op, Value hidden, Value weight, Value bias) {
  if (failed(expectRank(op, "hidden [B, N, D]", hidden, 3)) || failed(expectRank(op, "weight [V, D]", weight, 2)))
    return failure();
  auto h = tensorOf(hidden), w = tensorOf(weight);
  if (failed(expectDim(op, "hidden width vs weight dim 1", h.getDimSize(2), w.getDimSize(1))))
    return failure();
  if (bias && (failed(expectRank(op, "bias [V]", bias, 1)) ||
               failed(expectDim(op, "bias size vs vocabulary", tensorOf(bias).getDimSize(0), w.getDimSize(0)))))
    return failure();
  return success();
}

LogicalResult expectType(Operation *op, StringRef what, Value v, Type expected) {
  if (v.getType() != expected)
    return op->emitOpError() << what << " must be " << expected << ", got " << v.getType();
  return success();
}

} // namespace

LogicalResult CrossEntropyOp::verify() {
  if (failed(expectRank(*this, "logprobs [B, N, V]", getLogprobs(), 3)) ||
      failed(expectRank(*this, "result [B, N]", getResult(), 2)))
    return failure();
  auto lp = getLogprobs().getType();
  if (failed(verifyTargets(*this, getTargets(), getLengths(), lp.getDimSize(0), lp.getDimSize(1))))
    return failure();
  return verifySmoothing(*this, getSmoothing());
}

namespace {
/// lm.token_loss's operands and its (ce, lse) results, shared by lm.token_loss_and_grad.
template <typename Op> LogicalResult verifyTokenLoss(Op op) {
  if (failed(verifyHead(op, op.getHidden(), op.getWeight(), op.getBias())))
    return failure();
  auto h = op.getHidden().getType();
  if (failed(verifyTargets(op, op.getTargets(), op.getLengths(), h.getDimSize(0), h.getDimSize(1))))
    return failure();
  for (Value r : {op.getLoss(), op.getLse()})
    if (failed(expectType(op, "results", r, op.getTargets().getType().clone(h.getElementType()))))
      return failure();
  return verifySmoothing(op, op.getSmoothing());
}

/// The (d_hidden, d_weight, d_bias) results of lm.token_loss_grad and lm.token_loss_and_grad.
template <typename Op> LogicalResult verifyTokenLossGrads(Op op) {
  auto h = op.getHidden().getType();
  if (failed(expectType(op, "d_hidden", op.getDHidden(), h)) ||
      failed(expectType(op, "d_weight", op.getDWeight(), op.getWeight().getType())) ||
      failed(expectType(op, "d_bias", op.getDBias(),
                        RankedTensorType::get({op.getWeight().getType().getDimSize(0)}, h.getElementType()))))
    return failure();
  return success();
}
} // namespace

LogicalResult TokenLossOp::verify() { return verifyTokenLoss(*this); }

LogicalResult CrossEntropyGradOp::verify() {
  if (failed(expectRank(*this, "result [B, N, V]", getResult(), 3)))
    return failure();
  auto r = getResult().getType();
  if (ShapedType::isDynamic(r.getDimSize(2)))
    return emitOpError("the vocabulary size (result dim 2) must be static");
  if (failed(verifyTargets(*this, getTargets(), getLengths(), r.getDimSize(0), r.getDimSize(1))))
    return failure();
  return verifySmoothing(*this, getSmoothing());
}

LogicalResult TokenLossGradOp::verify() {
  if (failed(verifyHead(*this, getHidden(), getWeight(), getBias())))
    return failure();
  auto h = getHidden().getType();
  if (failed(verifyTargets(*this, getTargets(), getLengths(), h.getDimSize(0), h.getDimSize(1))) ||
      failed(expectType(*this, "lse", getLse(), getTargets().getType().clone(h.getElementType()))) ||
      failed(verifyTokenLossGrads(*this)))
    return failure();
  return verifySmoothing(*this, getSmoothing());
}

LogicalResult TokenLossAndGradOp::verify() {
  if (failed(verifyTokenLoss(*this)))
    return failure();
  return verifyTokenLossGrads(*this);
}

// --- N-gram heads (issue 18) ---

LogicalResult WdrConjugateOp::verify() {
  if (failed(expectRank(*this, "table [V, D]", getTable(), 2)) || failed(expectRank(*this, "ids [B, N]", getIds(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)) ||
      failed(expectRank(*this, "result [B, N, D]", getResult(), 3)))
    return failure();
  if (getHead() < 2)
    return emitOpError("head must be >= 2 (head 1 has no conjugate), got ") << getHead();
  if (getHead() > 26) // the spec's bound on [ngram] n with wdr (frontend/Spec.cpp: C(j-1, i) exact in fp32)
    return emitOpError("head must be <= 26 (the binomial coefficients C(head-1, i) stay exact in fp32), got ")
           << getHead();
  return expectDim(*this, "result width vs table dim 1", tensorOf(getResult()).getDimSize(2),
                   tensorOf(getTable()).getDimSize(1));
}

LogicalResult NgramEnsembleOp::verify() {
  if (getHeads().size() < 2)
    return emitOpError("needs the main head and at least one n-gram head, got ") << getHeads().size() << " operand(s)";
  for (Value h : getHeads())
    if (failed(expectType(*this, "every head", h, getResult().getType())))
      return failure();
  if (failed(expectRank(*this, "result [B, N, D]", getResult(), 3)))
    return failure();
  double lambda = getLambda().convertToDouble();
  if (!(lambda >= 0 && lambda <= 1))
    return emitOpError("lambda must be in [0, 1], got ") << lambda;
  return success();
}

LogicalResult NgramLossOp::verify() {
  if (getHeads().size() < 2)
    return emitOpError("needs the main head and at least one n-gram head, got ") << getHeads().size();
  if (getLse().size() != getHeads().size())
    return emitOpError("one lse result per head: ") << getHeads().size() << " heads, " << getLse().size() << " lse";
  for (Value h : getHeads())
    if (failed(verifyHead(*this, h, getWeight(), getBias())) ||
        failed(expectType(*this, "every head", h, getHeads()[0].getType())))
      return failure();
  auto h = tensorOf(getHeads()[0]);
  if (failed(verifyTargets(*this, getTargets(), getLengths(), h.getDimSize(0), h.getDimSize(1))))
    return failure();
  Type rowType = getTargets().getType().clone(h.getElementType());
  if (failed(expectType(*this, "loss", getLoss(), rowType)))
    return failure();
  for (Value r : getLse())
    if (failed(expectType(*this, "lse", r, rowType)))
      return failure();
  return verifySmoothing(*this, getSmoothing());
}

namespace {
/// The heads and their d_heads, the targets, d_weight and d_bias of lm.ngram_loss_grad and lm.ngram_loss_and_grad
/// (the caller checks the counts).
template <typename Op> LogicalResult verifyNgramGrads(Op op) {
  auto h = tensorOf(op.getHeads()[0]);
  for (auto [u, du] : llvm::zip(op.getHeads(), op.getDHeads()))
    if (failed(verifyHead(op, u, op.getWeight(), op.getBias())) || failed(expectType(op, "every head", u, h)) ||
        failed(expectType(op, "d_heads", du, h)))
      return failure();
  if (failed(verifyTargets(op, op.getTargets(), op.getLengths(), h.getDimSize(0), h.getDimSize(1))))
    return failure();
  for (Value l : op.getLse())
    if (failed(expectType(op, "lse", l, op.getTargets().getType().clone(h.getElementType()))))
      return failure();
  if (failed(expectType(op, "d_weight", op.getDWeight(), op.getWeight().getType())) ||
      failed(expectType(op, "d_bias", op.getDBias(),
                        RankedTensorType::get({op.getWeight().getType().getDimSize(0)}, h.getElementType()))))
    return failure();
  return verifySmoothing(op, op.getSmoothing());
}
} // namespace

LogicalResult NgramLossAndGradOp::verify() {
  if (getHeads().size() < 2 || getLse().size() != getHeads().size() || getDHeads().size() != getHeads().size())
    return emitOpError("needs n >= 2 heads and as many lse and d_heads results");
  Type rowType = getTargets().getType().clone(tensorOf(getHeads()[0]).getElementType());
  if (failed(expectType(*this, "loss", getLoss(), rowType)))
    return failure();
  return verifyNgramGrads(*this);
}

LogicalResult NgramLossGradOp::verify() {
  if (getHeads().size() < 2 || getLse().size() != getHeads().size() || getDHeads().size() != getHeads().size())
    return emitOpError("needs n >= 2 heads and as many lse operands and d_heads results");
  return verifyNgramGrads(*this);
}

LogicalResult LinearGradOp::verify() {
  auto w = getWeight().getType();
  if (failed(expectRank(*this, "weight [out, in]", getWeight(), 2)))
    return failure();
  auto dy = getGrad().getType(), x = getInput().getType();
  if (dy.getRank() != x.getRank() || dy.getRank() < 2)
    return emitOpError("grad and input must share a rank >= 2");
  if (failed(expectDim(*this, "grad features vs weight dim 0", dy.getShape().back(), w.getDimSize(0))) ||
      failed(expectDim(*this, "input features vs weight dim 1", x.getShape().back(), w.getDimSize(1))) ||
      failed(expectType(*this, "d_input", getDInput(), x)) || failed(expectType(*this, "d_weight", getDWeight(), w)) ||
      failed(expectType(*this, "d_bias", getDBias(), RankedTensorType::get({w.getDimSize(0)}, w.getElementType()))))
    return failure();
  return success();
}

LogicalResult LayerNormGradOp::verify() {
  if (getGrad().getType() != getInput().getType())
    return emitOpError("grad and input must have the same type");
  int64_t width = getInput().getType().getShape().back();
  auto vec = RankedTensorType::get({width}, getInput().getType().getElementType());
  if (failed(expectType(*this, "gamma", getGamma(), vec)) ||
      failed(expectType(*this, "d_input", getDInput(), getInput().getType())) ||
      failed(expectType(*this, "d_gamma", getDGamma(), vec)) || failed(expectType(*this, "d_beta", getDBeta(), vec)))
    return failure();
  if (!(getEpsilon().convertToDouble() > 0))
    return emitOpError("epsilon must be positive");
  return success();
}

LogicalResult ActivationGradOp::verify() {
  if (getKind() != "gelu" && getKind() != "gelu_tanh" && getKind() != "relu")
    return emitOpError("kind must be gelu, gelu_tanh or relu, got ") << getKind();
  return success();
}

LogicalResult AttentionGradOp::verify() {
  for (auto [name, v] : {std::pair<const char *, Value>{"grad", getGrad()}, {"query", getQuery()}, {"key", getKey()},
                         {"value", getValue()}})
    if (failed(expectRank(*this, std::string(name) + " [B, N, D]", v, 3)))
      return failure();
  auto q = getQuery().getType();
  int64_t d = q.getDimSize(2);
  if (ShapedType::isDynamic(d) || int64_t(getHeads()) < 1 || d % int64_t(getHeads()))
    return emitOpError("heads must divide a static d_model");
  if (getMask() == MaskKind::Explicit)
    return emitOpError("explicit masks have no backward yet");
  if (failed(verifyMaskData(*this, getMask(), getMaskData(), q.getDimSize(0))))
    return failure();
  if (bool(getRelKey()) != bool(getRelValue()))
    return emitOpError("relative positions need both rel_key and rel_value");
  if (getDRelative().size() != (getRelKey() ? 2u : 0u))
    return emitOpError("has one table gradient per relative table (d_relative: rel_key, rel_value)");
  if (getRelKey()) {
    auto table = RankedTensorType::get({2 * int64_t(getClip()) + 1, d / int64_t(getHeads())}, q.getElementType());
    if (getClip() < 1 || failed(expectType(*this, "rel_key", getRelKey(), table)) ||
        failed(expectType(*this, "rel_value", getRelValue(), table)) ||
        failed(expectType(*this, "d_relative #0", getDRelative()[0], table)) ||
        failed(expectType(*this, "d_relative #1", getDRelative()[1], table)))
      return failure();
  }
  if (failed(expectType(*this, "grad", getGrad(), q)) || failed(expectType(*this, "d_query", getDQuery(), q)) ||
      failed(expectType(*this, "d_key", getDKey(), getKey().getType())) ||
      failed(expectType(*this, "d_value", getDValue(), getValue().getType())) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  return success();
}

LogicalResult EmbedGradOp::verify() {
  if (failed(expectRank(*this, "grad [B, N, D]", getGrad(), 3)) || failed(expectRank(*this, "result [V, D]", getResult(), 2)) ||
      failed(expectRank(*this, "ids [B, N]", getIds(), 2)) || failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  auto r = getResult().getType();
  if (!r.hasStaticShape())
    return emitOpError("the table gradient must have a static shape");
  if (getInto() && getInto().getType() != r)
    return emitOpError("into (the gradient added to) must have the result's type ") << r << ", got "
                                                                                    << getInto().getType();
  return expectDim(*this, "grad width vs table width", getGrad().getType().getDimSize(2), r.getDimSize(1));
}

LogicalResult PositionsGradOp::verify() {
  if (failed(expectRank(*this, "grad [B, N, D]", getGrad(), 3)) || failed(expectRank(*this, "result [L, D]", getResult(), 2)) ||
      failed(expectRank(*this, "lengths [B]", getLengths(), 1)))
    return failure();
  auto r = getResult().getType();
  if (!r.hasStaticShape())
    return emitOpError("the table gradient must have a static shape");
  return expectDim(*this, "grad width vs table width", getGrad().getType().getDimSize(2), r.getDimSize(1));
}

LogicalResult ParamGradOp::verify() {
  if (getName().empty())
    return emitOpError("needs the canonical weight name");
  if (!getGrad().getType().hasStaticShape())
    return emitOpError("a weight gradient has the weight's static shape, got ") << getGrad().getType();
  return success();
}

LogicalResult RelativeScoresGradOp::verify() {
  if (failed(expectRank(*this, "grad [B, H, N, M]", getGrad(), 4)) ||
      failed(expectRank(*this, "query [B, H, N, dh]", getQuery(), 4)) ||
      failed(expectType(*this, "d_query", getDQuery(), getQuery().getType())) ||
      failed(expectType(*this, "d_rel", getDRel(), getRel().getType())))
    return failure();
  return success();
}

LogicalResult RelativeValuesGradOp::verify() {
  if (failed(expectRank(*this, "grad [B, H, N, dh]", getGrad(), 4)) ||
      failed(expectRank(*this, "probs [B, H, N, M]", getProbs(), 4)) ||
      failed(expectType(*this, "d_probs", getDProbs(), getProbs().getType())) ||
      failed(expectType(*this, "d_rel", getDRel(), getRel().getType())))
    return failure();
  return success();
}

static LogicalResult verifyDropout(Operation *op, Value x, Value rows, double rate, int64_t site) {
  if (!(rate >= 0 && rate < 1))
    return op->emitOpError("rate must be in [0, 1), got ") << rate;
  if (site < 0 || site >= (int64_t(1) << 24))
    return op->emitOpError("site must be in [0, 2^24), got ") << site;
  int64_t rank = tensorOf(x).getRank();
  if (rank != 3 && rank != 4)
    return op->emitOpError("input must be a [B, N, C] activation or [B, H, N, M] attention probabilities, got ")
           << x.getType();
  if (!rows)
    return success();
  if (rank != 3)
    return op->emitOpError("rows (packed rows) apply to a [B, T, C] activation, got ") << x.getType();
  if (failed(expectRank(op, "rows [B, T]", rows, 2)) ||
      failed(expectDim(op, "rows dim 0 (B)", tensorOf(rows).getDimSize(0), tensorOf(x).getDimSize(0))))
    return failure();
  return expectDim(op, "rows dim 1 (T)", tensorOf(rows).getDimSize(1), tensorOf(x).getDimSize(1));
}

LogicalResult DropoutOp::verify() {
  return verifyDropout(*this, getInput(), getRows(), getRate().convertToDouble(), getSite());
}

LogicalResult DropoutGradOp::verify() {
  return verifyDropout(*this, getGrad(), getRows(), getRate().convertToDouble(), getSite());
}

StringRef lmcc::lm::activationKind(Operation *op) {
  if (auto gelu = dyn_cast<GeluOp>(op))
    return gelu.getApproximate() ? "gelu_tanh" : "gelu";
  return isa<ReluOp>(op) ? "relu" : "";
}

Value lmcc::lm::createActivation(OpBuilder &b, Location loc, StringRef kind, Value x) {
  if (kind == "relu")
    return b.create<ReluOp>(loc, x);
  assert((kind == "gelu" || kind == "gelu_tanh") && "an activation kind");
  return b.create<GeluOp>(loc, x, kind == "gelu_tanh" ? b.getUnitAttr() : UnitAttr());
}
