//===- MLIRGen.cpp - Build naive `lm` IR from a model spec ------------------===//
//
// The one bridge from specs to IR. Emits the naive, decomposed form that the
// reference executor mirrors op for op: attention as split_heads / matmul /
// scale / mask_fill / softmax / matmul / merge_heads, BERT's PLL as
// lm.mask_and_predict, and T-TA's isolated keys/values as projections of the
// embedding value X in every layer (input isolation is visible as use-def).
//
//===----------------------------------------------------------------------===//
#include "frontend/MLIRGen.h"

#include "dialect/LmDialect.h"
#include "runtime/train/Philox.h"
#include "runtime/weights/WeightNames.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

using namespace mlir;

namespace lmcc {
namespace {

constexpr int64_t kDyn = ShapedType::kDynamic;

/// Words of hidden-key bits per Diformer row (LM_HIDDEN_WORDS in runtime/lib/lmrt.h).
constexpr int64_t hiddenWords(int64_t maxLen) { return (maxLen + 31) / 32; }

class Generator {
public:
  Generator(MLIRContext &ctx, const ModelSpec &spec, bool train)
      : spec(spec), train(train), b(&ctx), loc(b.getUnknownLoc()), f32(b.getF32Type()), i32(b.getI32Type()) {}

  OwningOpRef<ModuleOp> run() {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc, spec.name);
    auto *dialect = b.getContext()->getLoadedDialect<lm::LmDialect>();
    const Dims &d = spec.dims;
    const TokenIds &tok = spec.tokens;
    dialect->getModelAttrHelper().setAttr(*module, lm::ModelAttr::get(b.getContext(), spec.name, d.vocab, d.maxLen,
                                                                      d.dModel, d.heads, d.dFF, d.layers, tok.pad,
                                                                      tok.eos, tok.unk, tok.bos, tok.mask));
    dialect->getFamilyAttrHelper().setAttr(*module, b.getStringAttr(toString(spec.family)));
    dialect->getSpecHashAttrHelper().setAttr(*module, b.getStringAttr(specHash(spec)));
    b.setInsertionPointToEnd(module->getBody());
    if (spec.family == Family::Diformer) {
      diformerScore();
      diformerEncode();
      diformerTokenKV();
      diformerDecode();
      diformerStep();
      if (train)
        diformerLoss();
    } else if (!spec.mlm) { // encoder only: no output head, so no score or logits entry
      embedEntry();
    } else {
      scoreEntry();
      embedEntry();
      logitsEntry();
      if (train)
        lossEntry();
    }
    return module;
  }

private:
  // --- types -----------------------------------------------------------------
  RankedTensorType t(ArrayRef<int64_t> shape, Type elem) { return RankedTensorType::get(shape, elem); }
  RankedTensorType idsType() { return t({kDyn, kDyn}, i32); }
  RankedTensorType lengthsType() { return t({kDyn}, i32); }
  RankedTensorType seqType(int64_t width) { return t({kDyn, kDyn, width}, f32); }
  int64_t D() const { return spec.dims.dModel; }
  /// The Diformer's rows operand [B, N, 1 + W] (direction, hidden-key bits) and its cached keys/values' width.
  RankedTensorType rowsType() { return t({kDyn, kDyn, 1 + hiddenWords(spec.dims.maxLen)}, i32); }
  int64_t kvWidth() const { return 2 * spec.diformer->decoder.layers * D(); }
  /// Marks an entry point with its lm.method (the runtime kernel signature it lowers to).
  void method(func::FuncOp fn, StringRef name) {
    b.getContext()->getLoadedDialect<lm::LmDialect>()->getMethodAttrHelper().setAttr(fn, b.getStringAttr(name));
  }

  // --- parameters and layers ---------------------------------------------------
  Value weight(const std::string &name, ArrayRef<int64_t> shape) {
    return b.create<lm::WeightOp>(loc, t(shape, f32), b.getStringAttr(name));
  }

  /// y = x W^T + b with W = `prefix`.weight [out, in], b = `prefix`.bias.
  Value linear(Value x, const std::string &prefix, int64_t in, int64_t out, bool bias = true) {
    Value w = weight(names::weight(prefix), {out, in}); // stored [out, in]
    Value bv = bias ? weight(names::bias(prefix), {out}) : Value();
    auto xt = llvm::cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> shape(xt.getShape());
    shape.back() = out;
    return b.create<lm::LinearOp>(loc, t(shape, f32), x, w, bv);
  }

  Value layerNorm(Value x, const std::string &prefix) {
    Value g = weight(names::weight(prefix), {D()}), bb = weight(names::bias(prefix), {D()});
    return b.create<lm::LayerNormOp>(loc, x.getType(), x, g, bb, b.getF64FloatAttr(spec.eps));
  }

  Value activation(Value x) {
    switch (spec.activation) {
    case Activation::Relu: return b.create<lm::ReluOp>(loc, x);
    case Activation::GeluTanh: return b.create<lm::GeluOp>(loc, x, b.getUnitAttr());
    case Activation::Gelu: break;
    }
    return b.create<lm::GeluOp>(loc, x, UnitAttr());
  }

  Value add(Value x, Value y) { return b.create<lm::AddOp>(loc, x, y); }

  /// Dropout at `site` (runtime/train/Philox.h numbers them) while building the training loss.
  Value drop(Value x, int64_t site) {
    if (dropoutRate <= 0)
      return x;
    return b.create<lm::DropoutOp>(loc, x.getType(), x, Value(), b.getF64FloatAttr(dropoutRate),
                                   b.getI64IntegerAttr(site), UnitAttr());
  }

  Value ffn(Value x, const std::string &prefix, int64_t dFF) { // also an n-gram head (dFF = d_hidden)
    return linear(activation(linear(x, names::ffnIn(prefix), D(), dFF)), names::ffnOut(prefix), dFF, D());
  }

  /// Decomposed multi-head attention of `query` over `keyValue` (the attn.{q,k,v,o}
  /// projections of layer `prefix`): softmax(mask(Q K^T [+ rel] / sqrt(dh))) V [+ rel] W_o.
  Value attention(Value query, Value keyValue, Value lengths, const std::string &prefix, int64_t heads,
                  lm::MaskKind mask, Value maskData, int64_t clip, int64_t probabilitySite = -1) {
    Value q = linear(query, names::q(prefix), D(), D());
    Value k = linear(keyValue, names::k(prefix), D(), D());
    Value v = linear(keyValue, names::v(prefix), D(), D());
    return attendProjected(q, k, v, lengths, prefix, heads, mask, maskData, clip, Value(), false, probabilitySite);
  }

  /// Attention over projected queries, keys and values, then the output projection of layer `prefix`:
  /// decomposed, or `fused` as one lm.attention (lm-fuse-attention's rewrite: the same numbers), which
  /// single-query rows at `queryPositions` need (lm.mask_fill knows no query positions). While the training
  /// loss is built, [train] attention_dropout drops the probabilities at `probabilitySite` (both the value
  /// product and the relative values see the dropped ones; lm-fuse-attention then leaves the chain decomposed).
  Value attendProjected(Value q, Value k, Value v, Value lengths, const std::string &prefix, int64_t heads,
                        lm::MaskKind mask, Value maskData, int64_t clip, Value queryPositions, bool fused,
                        int64_t probabilitySite = -1) {
    const bool dropProbabilities = attentionDropoutRate > 0 && probabilitySite >= 0;
    assert(!(dropProbabilities && (fused || queryPositions)) && "attention dropout on the decomposed chain only");
    int64_t dh = D() / heads;
    Value relK = clip > 0 ? weight(names::relK(prefix), {2 * clip + 1, dh}) : Value();
    Value relV = clip > 0 ? weight(names::relV(prefix), {2 * clip + 1, dh}) : Value();
    const float scale = 1.0f / std::sqrt(float(dh));
    if (fused || queryPositions) {
      Value context = b.create<lm::AttentionOp>(loc, q.getType(), q, k, v, lengths, maskData, relK, relV,
                                                queryPositions, b.getI64IntegerAttr(heads),
                                                lm::MaskKindAttr::get(b.getContext(), mask), b.getF32FloatAttr(scale),
                                                b.getI64IntegerAttr(clip));
      return linear(context, names::o(prefix), D(), D());
    }
    auto headsType = t({kDyn, heads, kDyn, dh}, f32);
    auto scoresType = t({kDyn, heads, kDyn, kDyn}, f32);
    Value qh = b.create<lm::SplitHeadsOp>(loc, headsType, q);
    Value kh = b.create<lm::SplitHeadsOp>(loc, headsType, k);
    Value vh = b.create<lm::SplitHeadsOp>(loc, headsType, v);
    Value scores = b.create<lm::MatmulOp>(loc, scoresType, qh, kh, b.getUnitAttr());
    if (clip > 0)
      scores = add(scores, b.create<lm::RelativeScoresOp>(loc, scoresType, qh, kh, relK, b.getI64IntegerAttr(clip)));
    scores = b.create<lm::ScaleOp>(loc, scores, b.getF32FloatAttr(scale));
    scores = b.create<lm::MaskFillOp>(loc, scoresType, scores, lengths, maskData,
                                      lm::MaskKindAttr::get(b.getContext(), mask));
    Value probs = b.create<lm::SoftmaxOp>(loc, scores);
    if (dropProbabilities)
      probs = b.create<lm::DropoutOp>(loc, probs.getType(), probs, Value(), b.getF64FloatAttr(attentionDropoutRate),
                                      b.getI64IntegerAttr(probabilitySite), UnitAttr());
    Value context = b.create<lm::MatmulOp>(loc, headsType, probs, vh, UnitAttr());
    if (clip > 0)
      context = add(context, b.create<lm::RelativeValuesOp>(loc, headsType, probs, relV, b.getI64IntegerAttr(clip)));
    Value merged = b.create<lm::MergeHeadsOp>(loc, seqType(D()), context);
    return linear(merged, names::o(prefix), D(), D());
  }

  static lm::MaskKind maskOf(MaskKind kind) {
    switch (kind) {
    case MaskKind::None: return lm::MaskKind::none;
    case MaskKind::Causal: return lm::MaskKind::causal;
    case MaskKind::Anticausal: return lm::MaskKind::anticausal;
    case MaskKind::Diagonal: return lm::MaskKind::diagonal;
    case MaskKind::Directional: return lm::MaskKind::directional;
    }
    return lm::MaskKind::none;
  }

  Value optionalEmbedNorm(Value x) { return spec.embeddingNorm ? layerNorm(x, names::embedNorm()) : x; }

  Value positions(Value ids) {
    if (spec.position == PositionKind::Learned)
      return b.create<lm::PositionsOp>(loc, seqType(D()), ids, weight(names::embedPosition(), {spec.dims.maxLen, D()}));
    return b.create<lm::PositionsOp>(loc, seqType(D()), ids, Value());
  }

  /// The transformer stack over `ids`: returns the last layer's hidden states
  /// (after final_norm for pre-norm blocks).
  Value encode(Value ids, Value lengths) {
    Value tokenTable = weight(names::embedToken(), {spec.dims.vocab, D()});
    Value tokens = b.create<lm::EmbedOp>(loc, seqType(D()), tokenTable, ids);
    Value pos = spec.position == PositionKind::None ? Value() : positions(ids);
    // X = norm(E[x] + P): the embedding stream (fixed for all layers under input isolation).
    Value X = drop(optionalEmbedNorm(pos ? add(tokens, pos) : tokens), 0);
    Value h = X;
    if (spec.firstQuery == FirstQuery::Position) {
      h = drop(optionalEmbedNorm(pos), 1);
    } else if (spec.firstQuery == FirstQuery::MaskPosition) {
      Value maskIds = b.create<lm::FillIdsOp>(loc, ids, b.getI64IntegerAttr(spec.tokens.mask));
      Value maskTokens = b.create<lm::EmbedOp>(loc, seqType(D()), tokenTable, maskIds);
      h = drop(optionalEmbedNorm(pos ? add(maskTokens, pos) : maskTokens), 1);
    }
    bool isolated = spec.keysValues == KeyValueSource::Embedding;
    for (int64_t i = 0; i < spec.dims.layers; ++i) {
      std::string p = names::layer(i);
      if (spec.norm == NormPlacement::Post) {
        Value attn = attention(h, isolated ? X : h, lengths, names::attn(p), spec.dims.heads, maskOf(spec.mask),
                               Value(), spec.relativePositions, train::attentionDropoutSite(i));
        Value a = layerNorm(add(h, drop(attn, 2 + 2 * i)), names::attnNorm(p));
        h = layerNorm(add(a, drop(ffn(a, names::ffn(p), spec.dims.dFF), 3 + 2 * i)), names::ffnNorm(p));
      } else {
        Value qIn = layerNorm(h, names::attnNorm(p));
        Value attn = attention(qIn, isolated ? X : qIn, lengths, names::attn(p), spec.dims.heads, maskOf(spec.mask),
                               Value(), spec.relativePositions, train::attentionDropoutSite(i));
        Value a = add(h, drop(attn, 2 + 2 * i));
        h = add(a, drop(ffn(layerNorm(a, names::ffnNorm(p)), names::ffn(p), spec.dims.dFF), 3 + 2 * i));
      }
    }
    if (spec.norm == NormPlacement::Pre)
      h = layerNorm(h, names::finalNorm());
    return h;
  }

  /// The output head: logits = T(h) W^T + bias, T the optional dense+act+norm transform.
  Value logits(Value h) {
    if (spec.headTransform)
      h = layerNorm(activation(linear(h, names::headTransform(), D(), D())), names::headNorm());
    Value w = outputWeight();
    Value bias = spec.headBias ? weight(names::headBias(), {spec.dims.vocab}) : Value();
    SmallVector<int64_t> shape(llvm::cast<RankedTensorType>(h.getType()).getShape());
    shape.back() = spec.dims.vocab;
    return b.create<lm::LinearOp>(loc, t(shape, f32), h, w, bias);
  }

  /// Per-position log p(ids[t] | head output at t - shift).
  Value tokenLogprobs(Value h, Value ids, Value lengths, int64_t shift) {
    Value lp = b.create<lm::LogSoftmaxOp>(loc, logits(h));
    return b.create<lm::GatherOp>(loc, t({kDyn, kDyn}, f32), lp, ids, lengths, b.getI64IntegerAttr(shift));
  }

  SmallVector<int32_t> specialTokens() {
    return {int32_t(spec.tokens.bos), int32_t(spec.tokens.eos)};
  }

  func::FuncOp entry(StringRef name, ArrayRef<Type> inputs, ArrayRef<Type> results) {
    auto fn = b.create<func::FuncOp>(loc, name, b.getFunctionType(inputs, results));
    b.setInsertionPointToStart(fn.addEntryBlock());
    return fn;
  }

  void finish(func::FuncOp fn, ValueRange results) {
    b.create<func::ReturnOp>(loc, results);
    b.setInsertionPointAfter(fn);
  }

  /// The logit layer's weight W [V, D] (the tied token table, or head.output.weight).
  Value outputWeight() {
    return spec.tied ? weight(names::embedToken(), {spec.dims.vocab, D()})
                     : weight(names::headOutputWeight(), {spec.dims.vocab, D()});
  }

  /// The n-gram heads (issue 18): u_1 = h, u_j = out_j(act(in_j(h))) [+ the WDR conjugate, built from
  /// its own lm.weight of W, which lm-autodiff never differentiates: the stop-gradient], j = 2..n.
  SmallVector<Value> ngramHeads(Value h, Value ids, Value lengths) {
    SmallVector<Value> heads{h};
    const int64_t dHidden = spec.ngram->hiddenWidth(D());
    for (int64_t j = 2; j <= spec.ngram->n; ++j) {
      Value u = ffn(h, names::ngramHead(j), dHidden);
      if (spec.ngram->wdr)
        u = add(u, b.create<lm::WdrConjugateOp>(loc, u.getType(), outputWeight(), ids, lengths,
                                                b.getI64IntegerAttr(j)));
      heads.push_back(u);
    }
    return heads;
  }

  void scoreEntry() {
    auto tokenLp = t({kDyn, kDyn}, f32);
    // Mask-and-predict scoring takes a third argument, spans [B, N] (lm.mask_and_predict): the pieces each
    // prediction masks (word-l2r PLL) and which positions a call predicts (the runtime's copy chunks).
    SmallVector<Type> inputs = {idsType(), lengthsType()};
    if (spec.method == ScoreMethod::MaskAndPredict)
      inputs.push_back(idsType());
    auto fn = entry("score", inputs, {tokenLp, t({kDyn}, f32), t({kDyn}, i32)});
    method(fn, toString(spec.method));
    Value ids = fn.getArgument(0), lengths = fn.getArgument(1);
    Value lp;
    int64_t first = 0;
    switch (spec.method) {
    case ScoreMethod::Causal: {
      Value h = encode(ids, lengths);
      if (spec.ngram) { // row p of the ensemble predicts x_p: z(p) = W m(p) + b
        Value mixed = b.create<lm::NgramEnsembleOp>(loc, h.getType(), ngramHeads(h, ids, lengths), lengths,
                                                    b.getF64FloatAttr(spec.ngram->ensembleLambda));
        lp = tokenLogprobs(mixed, ids, lengths, 0);
      } else {
        lp = tokenLogprobs(h, ids, lengths, 1);
      }
      first = 1;
      break;
    }
    case ScoreMethod::SinglePass:
      lp = tokenLogprobs(encode(ids, lengths), ids, lengths, 0);
      break;
    case ScoreMethod::MaskAndPredict: {
      auto mp = b.create<lm::MaskAndPredictOp>(loc, tokenLp, ids, lengths, fn.getArgument(2),
                                               b.getI64IntegerAttr(spec.tokens.mask));
      OpBuilder::InsertionGuard guard(b);
      Block *body = b.createBlock(&mp.getBody(), {}, {idsType()}, {loc});
      // Targets are the original ids; the stack sees the masked copy.
      Value g = tokenLogprobs(encode(body->getArgument(0), lengths), ids, lengths, 0);
      b.create<lm::YieldOp>(loc, g);
      lp = mp;
      break;
    }
    }
    SmallVector<int32_t> skip;
    if (spec.skipSpecial)
      skip = specialTokens();
    auto score = b.create<lm::SentenceScoreOp>(loc, TypeRange{tokenLp, t({kDyn}, f32), t({kDyn}, i32)}, lp, ids,
                                               lengths, b.getDenseI32ArrayAttr(skip), b.getI64IntegerAttr(first));
    finish(fn, score.getResults());
  }

  void embedEntry() {
    // [embed] pool: mean excludes the special tokens, mean_all averages every valid row, cls takes row 0.
    SmallVector<int32_t> exclude;
    if (spec.pool == Pooling::Mean)
      exclude = specialTokens();
    if (spec.method == ScoreMethod::MaskAndPredict && spec.mlm) {
      // H^M_i: position i's state comes from the copy with position i masked. The entry returns those states
      // [B, N, D] and takes spans as the score entry does (the copies a call computes: i + 1 for a copy, i for
      // none), so that the runtime can cut a long sentence's copies into windows under a memory limit; it pools
      // the states itself, as lm.mean_pool would, by the attributes below (ModelFacts, lm_model_desc ABI 10).
      auto fn = entry("embed", {idsType(), lengthsType(), idsType()}, {seqType(D())});
      fn->setAttr("lmcc.pool", b.getStringAttr(toString(spec.pool)));
      fn->setAttr("lmcc.pool_exclude", b.getDenseI32ArrayAttr(exclude));
      fn->setAttr("lmcc.pool_normalize", b.getBoolAttr(spec.normalize));
      Value ids = fn.getArgument(0), lengths = fn.getArgument(1);
      auto mp = b.create<lm::MaskAndPredictOp>(loc, seqType(D()), ids, lengths, fn.getArgument(2),
                                               b.getI64IntegerAttr(spec.tokens.mask));
      {
        OpBuilder::InsertionGuard guard(b);
        Block *body = b.createBlock(&mp.getBody(), {}, {idsType()}, {loc});
        b.create<lm::YieldOp>(loc, encode(body->getArgument(0), lengths));
      }
      finish(fn, mp.getResult());
      return;
    }
    auto fn = entry("embed", {idsType(), lengthsType()}, {t({kDyn, D()}, f32)});
    Value ids = fn.getArgument(0), lengths = fn.getArgument(1);
    Value pooled = b.create<lm::MeanPoolOp>(loc, t({kDyn, D()}, f32), encode(ids, lengths), ids, lengths,
                                            b.getDenseI32ArrayAttr(exclude), spec.pool == Pooling::Cls,
                                            spec.normalize);
    finish(fn, pooled);
  }

  void logitsEntry() {
    auto fn = entry("logits", {idsType(), lengthsType()}, {seqType(spec.dims.vocab)});
    finish(fn, logits(encode(fn.getArgument(0), fn.getArgument(1))));
  }

  /// The training loss: one forward pass over `inputs`; row i predicts targets[i].
  void lossEntry() {
    auto fn = entry("loss", {idsType(), idsType(), lengthsType()}, {t({kDyn, kDyn}, f32)});
    method(fn, "loss");
    Value inputs = fn.getArgument(0), targets = fn.getArgument(1), lengths = fn.getArgument(2);
    dropoutRate = spec.train.dropout, attentionDropoutRate = spec.train.attentionDropout;
    Value h = encode(inputs, lengths);
    dropoutRate = 0, attentionDropoutRate = 0;
    if (spec.ngram) { // objective ngram: every head's CE through the shared logit layer, one op
      SmallVector<Value> heads = ngramHeads(h, inputs, lengths);
      Value bias = spec.headBias ? weight(names::headBias(), {spec.dims.vocab}) : Value();
      SmallVector<Type> types(heads.size() + 1, t({kDyn, kDyn}, f32));
      auto loss = b.create<lm::NgramLossOp>(loc, types, heads, outputWeight(), bias, targets, lengths,
                                            b.getF64FloatAttr(spec.train.labelSmoothing));
      finish(fn, loss.getLoss());
      return;
    }
    Value lp = b.create<lm::LogSoftmaxOp>(loc, logits(h));
    Value ce = b.create<lm::CrossEntropyOp>(loc, t({kDyn, kDyn}, f32), lp, targets, lengths,
                                            b.getF64FloatAttr(spec.train.labelSmoothing), UnitAttr());
    finish(fn, ce);
  }

  /// A Diformer sublayer's input: x (post-norm) or norm(x) (pre-norm).
  Value sublayerInput(Value x, const std::string &norm) {
    return spec.norm == NormPlacement::Pre ? layerNorm(x, norm) : x;
  }
  /// A Diformer sublayer's residual: norm(x + out) (post-norm) or x + out (pre-norm).
  Value residual(Value x, Value out, const std::string &norm) {
    return spec.norm == NormPlacement::Pre ? add(x, out) : layerNorm(add(x, out), norm);
  }

  /// The encoder's output (memory) of a Diformer over its sources, every valid position visible. Post-norm
  /// (the default) or pre-norm as the biLM's blocks, with encoder.final_norm after the last layer.
  Value diformerEncoder(Value src, Value srcLen) {
    const DiformerOptions &d = *spec.diformer;
    Value h = b.create<lm::EmbedOp>(loc, seqType(D()), weight(names::embedToken(), {spec.dims.vocab, D()}), src);
    h = optionalEmbedNorm(add(h, positions(src)));
    for (int64_t i = 0; i < d.encoder.layers; ++i) {
      std::string p = names::encoderLayer(i);
      Value in = sublayerInput(h, names::attnNorm(p));
      Value a = residual(h, attention(in, in, srcLen, names::attn(p), d.encoder.heads, lm::MaskKind::none, Value(), 0),
                         names::attnNorm(p));
      h = residual(a, ffn(sublayerInput(a, names::ffnNorm(p)), names::ffn(p), d.encoder.dFF), names::ffnNorm(p));
    }
    return spec.norm == NormPlacement::Pre ? layerNorm(h, names::encoderFinalNorm()) : h;
  }

  /// The decoder's keys and values, every layer's k then v side by side: [B, T, 2 L D] with layer l's keys at
  /// features [2lD, 2lD + D) and values at [2lD + D, 2(l+1)D); one GEMM of `input` with the stacked weights of
  /// `which` (attn: self-attention over the target's word embeddings; cross: over the encoder's output). The
  /// same stacking lm-hoist-isolated-kv makes of the score entry, so the layout holds one copy.
  Value decoderKeysValues(Value input, bool cross) {
    SmallVector<Value> weights, biases;
    for (int64_t l = 0; l < spec.diformer->decoder.layers; ++l) {
      std::string p = cross ? names::cross(names::decoderLayer(l)) : names::attn(names::decoderLayer(l));
      for (const std::string &proj : {names::k(p), names::v(p)}) {
        weights.push_back(weight(names::weight(proj), {D(), D()}));
        biases.push_back(weight(names::bias(proj), {D()}));
      }
    }
    const int64_t width = 2 * spec.diformer->decoder.layers * D();
    Value w = b.create<lm::ConcatOp>(loc, t({width, D()}, f32), weights);
    Value bias = b.create<lm::ConcatOp>(loc, t({width}, f32), biases);
    return b.create<lm::LinearOp>(loc, seqType(width), input, w, bias);
  }

  Value slice(Value x, int64_t offset, int64_t size) {
    return b.create<lm::SliceFeaturesOp>(loc, seqType(size), x, b.getI64IntegerAttr(offset), b.getI64IntegerAttr(size));
  }

  /// The decoder's last hidden states over rows [B, N, 1 + W] attending to `memory` (projected here) or, in the
  /// decoding entries, to cached keys/values (`selfKV`, `crossKV`: decoderKeysValues layouts; `tgt` unused): every
  /// row [B, N, D], or with `queryPositions` [B] the one row query_positions[b] of each target [B, 1, D] (a
  /// decoding step: the keys and values still cover every target token).
  Value diformerDecoder(Value memory, Value srcLen, Value tgt, Value tgtLen, Value rows, Value selfKV, Value crossKV,
                        Value queryPositions) {
    const DiformerOptions &d = *spec.diformer;
    Value wordEmbeddings =
        tgt ? b.create<lm::EmbedOp>(loc, seqType(D()), weight(names::embedToken(), {spec.dims.vocab, D()}), tgt)
            : Value();
    Value x = b.create<lm::DecoderQueriesOp>(loc, seqType(D()), rows, tgtLen,
                                             weight(names::decoderDirection(), {3, D()}),
                                             weight(names::decoderPositionL2R(), {spec.dims.maxLen, D()}),
                                             weight(names::decoderPositionR2L(), {spec.dims.maxLen, D()}));
    if (queryPositions)
      x = b.create<lm::TakeRowOp>(loc, t({kDyn, 1, D()}, f32), x, queryPositions);
    if (spec.embeddingNorm)
      x = layerNorm(x, names::decoderEmbedNorm());
    for (int64_t i = 0; i < d.decoder.layers; ++i) {
      std::string p = names::decoderLayer(i);
      // Layer i's keys and values in a cache (decoderKeysValues' layout).
      auto cached = [&](Value kv) {
        Value k = slice(kv, 2 * i * D(), D());
        return std::pair<Value, Value>(k, slice(kv, (2 * i + 1) * D(), D()));
      };
      Value in = sublayerInput(x, names::attnNorm(p)), self;
      if (selfKV) {
        Value q = linear(in, names::q(names::attn(p)), D(), D());
        auto [k, v] = cached(selfKV);
        self = attendProjected(q, k, v, tgtLen, names::attn(p), d.decoder.heads, lm::MaskKind::directional, rows,
                               spec.relativePositions, queryPositions, false);
      } else {
        self = attention(in, wordEmbeddings, tgtLen, names::attn(p), d.decoder.heads, lm::MaskKind::directional, rows,
                         spec.relativePositions);
      }
      Value a = residual(x, self, names::attnNorm(p));
      in = sublayerInput(a, names::crossNorm(p));
      Value cross;
      if (crossKV) {
        Value q = linear(in, names::q(names::cross(p)), D(), D());
        auto [k, v] = cached(crossKV);
        cross = attendProjected(q, k, v, srcLen, names::cross(p), d.decoder.heads, lm::MaskKind::none, Value(), 0,
                                Value(), bool(queryPositions));
      } else {
        cross = attention(in, memory, srcLen, names::cross(p), d.decoder.heads, lm::MaskKind::none, Value(), 0);
      }
      Value c = residual(a, cross, names::crossNorm(p));
      x = residual(c, ffn(sublayerInput(c, names::ffnNorm(p)), names::ffn(p), d.decoder.dFF), names::ffnNorm(p));
    }
    return spec.norm == NormPlacement::Pre ? layerNorm(x, names::decoderFinalNorm()) : x;
  }

  /// The encoder's output (memory) and the decoder's last hidden states of a Diformer over (src, tgt, rows).
  std::pair<Value, Value> diformerStacks(Value src, Value srcLen, Value tgt, Value tgtLen, Value rows) {
    Value memory = diformerEncoder(src, srcLen);
    return {memory, diformerDecoder(memory, srcLen, tgt, tgtLen, rows, Value(), Value(), Value())};
  }

  /// The Diformer entries' inputs: src, src_len, tgt, tgt_len, rows [B, N, 1 + W].
  SmallVector<Type> pairInputs() {
    return {idsType(), lengthsType(), idsType(), lengthsType(), rowsType()};
  }

  Value lengthLogprob(Value memory, Value srcLen, Value tgtLen) {
    return b.create<lm::LengthLogprobOp>(loc, t({kDyn}, f32), memory, srcLen,
                                         weight(names::lengthWeight(), {spec.dims.maxLen, D()}), tgtLen);
  }

  /// Diformer (issue 19's contract; diformer paper 2.2-2.3): a biLM encoder over the source with
  /// a length head on the mean of its output, and a directional decoder whose row i has the query
  /// direction[z_i] + (z_i == L ? r2l[n-1-i] : l2r[i]), self-attention keys/values from embed.token[y_j]
  /// alone (input isolation) with Shaw relative terms, the directional mask as structure (the rows operand
  /// [B, N, 1 + W]: direction, then the hidden-key bits of S rows), cross-attention to the encoder output
  /// and a head tied to embed.token. Row i predicts y_{i+1} (R), y_{i-1} (L), y_i (S).
  /// score(src, src_len, tgt, tgt_len, rows) -> (token_logprobs, score, n_scored, length_logprob).
  void diformerScore() {
    auto tokenLp = t({kDyn, kDyn}, f32);
    auto fn = entry("score", pairInputs(), {tokenLp, t({kDyn}, f32), t({kDyn}, i32), t({kDyn}, f32)});
    method(fn, "pairs");
    Value src = fn.getArgument(0), srcLen = fn.getArgument(1), tgt = fn.getArgument(2), tgtLen = fn.getArgument(3),
          rows = fn.getArgument(4);
    auto [memory, x] = diformerStacks(src, srcLen, tgt, tgtLen, rows);
    Value lengthLp = lengthLogprob(memory, srcLen, tgtLen);
    Value tau = b.create<lm::DirectionalTargetsOp>(loc, idsType(), tgt, rows, tgtLen);
    Value lp = tokenLogprobs(x, tau, tgtLen, 0);
    // Every row not skipped is scored, bos and eos targets included: the skip list holds only -1 (no target).
    auto score = b.create<lm::SentenceScoreOp>(loc, TypeRange{tokenLp, t({kDyn}, f32), t({kDyn}, i32)}, lp, tau,
                                               tgtLen, b.getDenseI32ArrayAttr({-1}), b.getI64IntegerAttr(0));
    SmallVector<Value> results(score.getResults());
    results.push_back(lengthLp);
    finish(fn, results);
  }

  /// The decoders' entries (lmcc translate, lm_rt_translate): the encoder once per source, keys and values once
  /// per token (they depend on the token alone: input isolation), then decoder passes over both caches, each
  /// [B, T, 2 L D] (decoderKeysValues).
  /// encode(src, src_len) -> (length_logprobs [B, max_len], cross_kv [B, M, 2 L D]).
  void diformerEncode() {
    auto fn = entry("encode", {idsType(), lengthsType()}, {t({kDyn, spec.dims.maxLen}, f32), seqType(kvWidth())});
    method(fn, "pair_encode");
    Value src = fn.getArgument(0), srcLen = fn.getArgument(1);
    Value memory = diformerEncoder(src, srcLen);
    Value lengths = b.create<lm::LengthLogprobOp>(loc, t({kDyn, spec.dims.maxLen}, f32), memory, srcLen,
                                                  weight(names::lengthWeight(), {spec.dims.maxLen, D()}), Value());
    finish(fn, {lengths, decoderKeysValues(memory, true)});
  }

  /// token_kv(ids) -> self_kv [B, T, 2 L D]: every decoder layer's self-attention keys and values of each token.
  void diformerTokenKV() {
    auto fn = entry("token_kv", {idsType()}, {seqType(kvWidth())});
    method(fn, "pair_token_kv");
    Value e = b.create<lm::EmbedOp>(loc, seqType(D()), weight(names::embedToken(), {spec.dims.vocab, D()}),
                                    fn.getArgument(0));
    finish(fn, {decoderKeysValues(e, false)});
  }

  /// decode(self_kv [B, N, 2LD], cross_kv [B, M, 2LD], src_len, tgt_len, rows) -> log-probabilities [B, N, V] of
  /// every row (a parallel pass).
  void diformerDecode() {
    auto fn = entry("decode", {seqType(kvWidth()), seqType(kvWidth()), lengthsType(), lengthsType(), rowsType()},
                    {seqType(spec.dims.vocab)});
    method(fn, "pair_decode");
    Value x = diformerDecoder(Value(), fn.getArgument(2), Value(), fn.getArgument(3), fn.getArgument(4),
                              fn.getArgument(0), fn.getArgument(1), Value());
    finish(fn, {b.create<lm::LogSoftmaxOp>(loc, logits(x))});
  }

  /// step(self_kv, cross_kv, src_len, tgt_len, rows, positions [B]) -> log-probabilities [B, 1, V] of row
  /// positions[b] alone (an autoregressive step: only the new row is computed).
  void diformerStep() {
    auto fn = entry("step", {seqType(kvWidth()), seqType(kvWidth()), lengthsType(), lengthsType(), rowsType(),
                             lengthsType()},
                    {t({kDyn, 1, spec.dims.vocab}, f32)});
    method(fn, "pair_step");
    Value x = diformerDecoder(Value(), fn.getArgument(2), Value(), fn.getArgument(3), fn.getArgument(4),
                              fn.getArgument(0), fn.getArgument(1), fn.getArgument(5));
    finish(fn, {b.create<lm::LogSoftmaxOp>(loc, logits(x))});
  }

  /// The objective `directional` (issue 19): loss(src, src_len, tgt, tgt_len, rows) -> (ce [B, N], length_logprob
  /// [B]); the loss is sum ce / sum_b n_b (cross_entropy per_length) + length_loss * mean_b(-length_logprob).
  void diformerLoss() {
    auto fn = entry("loss", pairInputs(), {t({kDyn, kDyn}, f32), t({kDyn}, f32)});
    method(fn, "pair_loss");
    b.getContext()->getLoadedDialect<lm::LmDialect>()->getLengthLossAttrHelper().setAttr(
        fn, b.getF64FloatAttr(spec.diformer->lengthLoss));
    Value src = fn.getArgument(0), srcLen = fn.getArgument(1), tgt = fn.getArgument(2), tgtLen = fn.getArgument(3),
          rows = fn.getArgument(4);
    auto [memory, x] = diformerStacks(src, srcLen, tgt, tgtLen, rows);
    Value lengthLp = lengthLogprob(memory, srcLen, tgtLen);
    Value tau = b.create<lm::DirectionalTargetsOp>(loc, idsType(), tgt, rows, tgtLen);
    Value lp = b.create<lm::LogSoftmaxOp>(loc, logits(x));
    Value ce = b.create<lm::CrossEntropyOp>(loc, t({kDyn, kDyn}, f32), lp, tau, tgtLen, b.getF64FloatAttr(0.0),
                                            b.getUnitAttr());
    finish(fn, {ce, lengthLp});
  }

  const ModelSpec &spec;
  bool train;
  double dropoutRate = 0;          ///< [train] dropout while the loss entry is built, else 0
  double attentionDropoutRate = 0; ///< [train] attention_dropout while the loss entry is built, else 0
  OpBuilder b;
  Location loc;
  Type f32, i32;
};

} // namespace

void loadLmDialects(MLIRContext &context) {
  context.getOrLoadDialect<lm::LmDialect>();
  context.getOrLoadDialect<func::FuncDialect>();
}

OwningOpRef<ModuleOp> buildModule(MLIRContext &context, const ModelSpec &spec, bool train) {
  loadLmDialects(context);
  OwningOpRef<ModuleOp> module = Generator(context, spec, train).run();
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

std::string emitMLIR(const ModelSpec &spec, bool train) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = buildModule(context, spec, train);
  if (!module)
    return {};
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

} // namespace lmcc
