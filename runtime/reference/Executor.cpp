//===- Executor.cpp - Reference executor: whole-model scoring and embedding -===//
//
// The forward pass of runtime/SEMANTICS.md composed from the ops of Ops.h, one op
// at a time. Sentences are processed in padded chunks, chunks in parallel on a
// oneTBB arena; every op reads only valid rows, so the results are bit-identical
// for any chunking and thread count.
//
//===----------------------------------------------------------------------===//
#include "runtime/reference/Executor.h"

#include "runtime/reference/NGram.h"
#include "runtime/reference/Ops.h"
#include "runtime/train/Philox.h"
#include "runtime/weights/Format.h"
#include "runtime/weights/WeightNames.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

namespace lmcc::reference {

namespace {

/// Padded rows (sentences x longest sentence) per forward batch: bounds the memory of
/// the [rows, V] logits. Results do not depend on it.
constexpr int64_t kMaxBatchRows = 512;

//===----------------------------------------------------------------------===//
// Weights as Eigen matrices
//===----------------------------------------------------------------------===//

struct Linear {
  Matrix weight; ///< [out, in]
  RowVector bias; ///< [out]
};

struct Norm {
  RowVector weight, bias;
};

struct Layer {
  Linear q, k, v, o;
  Matrix relK, relV; ///< [2k+1, dh], relative positions only
  Norm attnNorm;
  Linear ffnIn, ffnOut;
  Norm ffnNorm;
};

struct Model {
  Matrix token;    ///< embed.token [V, D]
  Matrix position; ///< embed.position [L, D], learned positions only
  Norm embedNorm;  ///< embedding norm only
  std::vector<Layer> layers;
  Norm finalNorm;       ///< pre-norm only
  Linear headTransform; ///< head transform only
  Norm headNorm;        ///< head transform only
  Matrix headOutput;    ///< head.output.weight [V, D], untied only
  RowVector headBias;   ///< head.bias [V], head bias only
  std::vector<Linear> ngramIn, ngramOut; ///< ngram.heads.{j}.in / .out, j = 2..n at [j - 2] (family ngram)
};

const Tensor &tensor(const WeightSet &weights, const std::string &name, const std::vector<int64_t> &shape) {
  const Tensor &t = weights.get(name);
  if (t.shape != shape || static_cast<int64_t>(t.data.size()) != t.numel())
    throw WeightError("tensor " + quoted(name) + ": shape " + shapeString(t.shape) + ", expected " +
                      shapeString(shape));
  return t;
}

Matrix loadMatrix(const WeightSet &weights, const std::string &name, int64_t rows, int64_t cols) {
  return Eigen::Map<const Matrix>(tensor(weights, name, {rows, cols}).data.data(), rows, cols);
}

RowVector loadVector(const WeightSet &weights, const std::string &name, int64_t size) {
  return Eigen::Map<const RowVector>(tensor(weights, name, {size}).data.data(), size);
}

Linear loadLinear(const WeightSet &weights, const std::string &prefix, int64_t out, int64_t in) {
  return {loadMatrix(weights, names::weight(prefix), out, in), loadVector(weights, names::bias(prefix), out)};
}

Norm loadNorm(const WeightSet &weights, const std::string &prefix, int64_t size) {
  return {loadVector(weights, names::weight(prefix), size), loadVector(weights, names::bias(prefix), size)};
}

Model loadModel(const ModelSpec &spec, const WeightSet &weights) {
  const Dims &d = spec.dims;
  const int64_t D = d.dModel, dh = d.headDim(), k = spec.relativePositions;
  Model m;
  m.token = loadMatrix(weights, names::embedToken(), d.vocab, D);
  if (spec.position == PositionKind::Learned)
    m.position = loadMatrix(weights, names::embedPosition(), d.maxLen, D);
  if (spec.embeddingNorm)
    m.embedNorm = loadNorm(weights, names::embedNorm(), D);
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string layer = names::layer(i), attn = names::attn(layer), ffn = names::ffn(layer);
    Layer l;
    l.q = loadLinear(weights, names::q(attn), D, D);
    l.k = loadLinear(weights, names::k(attn), D, D);
    l.v = loadLinear(weights, names::v(attn), D, D);
    l.o = loadLinear(weights, names::o(attn), D, D);
    if (k > 0) {
      l.relK = loadMatrix(weights, names::relK(attn), 2 * k + 1, dh);
      l.relV = loadMatrix(weights, names::relV(attn), 2 * k + 1, dh);
    }
    l.attnNorm = loadNorm(weights, names::attnNorm(layer), D);
    l.ffnIn = loadLinear(weights, names::ffnIn(ffn), d.dFF, D);
    l.ffnOut = loadLinear(weights, names::ffnOut(ffn), D, d.dFF);
    l.ffnNorm = loadNorm(weights, names::ffnNorm(layer), D);
    m.layers.push_back(std::move(l));
  }
  if (spec.norm == NormPlacement::Pre)
    m.finalNorm = loadNorm(weights, names::finalNorm(), D);
  if (!spec.mlm) // encoder only: no output head
    return m;
  if (spec.headTransform) {
    m.headTransform = loadLinear(weights, names::headTransform(), D, D);
    m.headNorm = loadNorm(weights, names::headNorm(), D);
  }
  if (!spec.tied)
    m.headOutput = loadMatrix(weights, names::headOutputWeight(), d.vocab, D);
  if (spec.headBias)
    m.headBias = loadVector(weights, names::headBias(), d.vocab);
  if (spec.ngram)
    for (int64_t j = 2; j <= spec.ngram->n; ++j) {
      const int64_t dHidden = spec.ngram->hiddenWidth(D);
      m.ngramIn.push_back(loadLinear(weights, names::ffnIn(names::ngramHead(j)), dHidden, D));
      m.ngramOut.push_back(loadLinear(weights, names::ffnOut(names::ngramHead(j)), D, dHidden));
    }
  return m;
}

/// Zeros shaped like every tensor of m (the gradient accumulators of lossAndGrad).
Model zerosLike(const Model &m) {
  auto zm = [](const Matrix &x) { return Matrix::Zero(x.rows(), x.cols()).eval(); };
  auto zv = [](const RowVector &x) { return RowVector::Zero(x.size()).eval(); };
  auto zl = [&](const Linear &l) { return Linear{zm(l.weight), zv(l.bias)}; };
  auto zn = [&](const Norm &n) { return Norm{zv(n.weight), zv(n.bias)}; };
  Model g;
  g.token = zm(m.token);
  g.position = zm(m.position);
  g.embedNorm = zn(m.embedNorm);
  for (const Layer &l : m.layers)
    g.layers.push_back(Layer{zl(l.q), zl(l.k), zl(l.v), zl(l.o), zm(l.relK), zm(l.relV), zn(l.attnNorm),
                             zl(l.ffnIn), zl(l.ffnOut), zn(l.ffnNorm)});
  g.finalNorm = zn(m.finalNorm);
  g.headTransform = zl(m.headTransform);
  g.headNorm = zn(m.headNorm);
  g.headOutput = zm(m.headOutput);
  g.headBias = zv(m.headBias);
  for (size_t j = 0; j < m.ngramIn.size(); ++j) {
    g.ngramIn.push_back(zl(m.ngramIn[j]));
    g.ngramOut.push_back(zl(m.ngramOut[j]));
  }
  return g;
}

/// The inverse of loadModel: every tensor the spec has, under its canonical name.
WeightSet storeModel(const ModelSpec &spec, const Model &m) {
  WeightSet out;
  auto matrix = [&](const std::string &name, const Matrix &x) {
    out.tensors[name] = Tensor{{x.rows(), x.cols()}, std::vector<float>(x.data(), x.data() + x.size())};
  };
  auto vector = [&](const std::string &name, const RowVector &x) {
    out.tensors[name] = Tensor{{x.size()}, std::vector<float>(x.data(), x.data() + x.size())};
  };
  auto linear = [&](const std::string &prefix, const Linear &l) {
    matrix(names::weight(prefix), l.weight);
    vector(names::bias(prefix), l.bias);
  };
  auto norm = [&](const std::string &prefix, const Norm &n) {
    vector(names::weight(prefix), n.weight);
    vector(names::bias(prefix), n.bias);
  };
  matrix(names::embedToken(), m.token);
  if (spec.position == PositionKind::Learned)
    matrix(names::embedPosition(), m.position);
  if (spec.embeddingNorm)
    norm(names::embedNorm(), m.embedNorm);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const Layer &l = m.layers[i];
    const std::string layer = names::layer(static_cast<int64_t>(i)), attn = names::attn(layer),
                      ffn = names::ffn(layer);
    linear(names::q(attn), l.q);
    linear(names::k(attn), l.k);
    linear(names::v(attn), l.v);
    linear(names::o(attn), l.o);
    if (spec.relativePositions > 0) {
      matrix(names::relK(attn), l.relK);
      matrix(names::relV(attn), l.relV);
    }
    norm(names::attnNorm(layer), l.attnNorm);
    linear(names::ffnIn(ffn), l.ffnIn);
    linear(names::ffnOut(ffn), l.ffnOut);
    norm(names::ffnNorm(layer), l.ffnNorm);
  }
  if (spec.norm == NormPlacement::Pre)
    norm(names::finalNorm(), m.finalNorm);
  if (spec.headTransform) {
    linear(names::headTransform(), m.headTransform);
    norm(names::headNorm(), m.headNorm);
  }
  if (!spec.tied)
    matrix(names::headOutputWeight(), m.headOutput);
  if (spec.headBias)
    vector(names::headBias(), m.headBias);
  for (size_t j = 0; j < m.ngramIn.size(); ++j) {
    linear(names::ffnIn(names::ngramHead(int64_t(j) + 2)), m.ngramIn[j]);
    linear(names::ffnOut(names::ngramHead(int64_t(j) + 2)), m.ngramOut[j]);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

void checkSpec(const ModelSpec &spec) {
  if (spec.family == Family::Diformer)
    throw std::invalid_argument(std::string("reference executor: family '") + toString(spec.family) +
                                "' executes in a later release");
  if (spec.mask == MaskKind::Directional)
    throw std::invalid_argument("reference executor: mask 'directional' executes in a later release");
  const Dims &d = spec.dims;
  if (d.vocab <= 0 || d.maxLen <= 0 || d.dModel <= 0 || d.heads <= 0 || d.dFF <= 0 || d.layers < 0 ||
      d.dModel % d.heads != 0)
    throw std::invalid_argument("reference executor: invalid dims (d_model must be a positive multiple of heads)");
  if (spec.relativePositions < 0)
    throw std::invalid_argument("reference executor: negative relative_positions");
  if (spec.tokens.mask < 0 || spec.tokens.mask >= d.vocab)
    throw std::invalid_argument("reference executor: mask token id " + std::to_string(spec.tokens.mask) +
                                " outside [0, " + std::to_string(d.vocab) + ")");
}

void checkSentences(const ModelSpec &spec, const std::vector<std::vector<int32_t>> &sentences) {
  for (size_t b = 0; b < sentences.size(); ++b) {
    const auto &s = sentences[b];
    if (s.empty() || static_cast<int64_t>(s.size()) > spec.dims.maxLen)
      throw std::invalid_argument("sentence " + std::to_string(b) + ": length " + std::to_string(s.size()) +
                                  " outside [1, " + std::to_string(spec.dims.maxLen) + "]");
    for (size_t t = 0; t < s.size(); ++t)
      if (s[t] < 0 || s[t] >= spec.dims.vocab)
        throw std::invalid_argument("sentence " + std::to_string(b) + ", position " + std::to_string(t) +
                                    ": token id " + std::to_string(s[t]) + " outside [0, " +
                                    std::to_string(spec.dims.vocab) + ")");
  }
}

//===----------------------------------------------------------------------===//
// Forward pass
//===----------------------------------------------------------------------===//

class Forward {
public:
  Forward(const ModelSpec &spec, const Model &model) : spec(spec), m(model) {}

  /// The last layer's hidden states [B, 1, N, D] (after final_norm when pre-norm).
  Batch encode(const TokenBatch &ids) const {
    const int64_t D = spec.dims.dModel;
    Batch P = positions(ids, spec.position, spec.position == PositionKind::Learned ? &m.position : nullptr, D);
    Batch X = embeddingNorm(add(embed(m.token, ids), P));
    Batch h = firstQuery(ids, X, P);
    for (const Layer &layer : m.layers) {
      bool hiddenKV = spec.keysValues == KeyValueSource::Hidden;
      if (spec.norm == NormPlacement::Post) {
        Batch attn = selfAttention(layer, h, hiddenKV ? h : X);
        Batch a = norm(add(h, attn), layer.attnNorm);
        h = norm(add(a, ffn(layer, a)), layer.ffnNorm);
      } else {
        Batch q = norm(h, layer.attnNorm);
        Batch attn = selfAttention(layer, q, hiddenKV ? q : X);
        Batch a = add(h, attn);
        h = add(a, ffn(layer, norm(a, layer.ffnNorm)));
      }
    }
    if (spec.norm == NormPlacement::Pre)
      h = norm(h, m.finalNorm);
    return h;
  }

  /// Log-probabilities [B, 1, N, V] of the head applied to hidden states h.
  Batch headLogprobs(const Batch &h) const {
    Batch t = spec.headTransform
                  ? norm(activation(apply(h, m.headTransform), spec.activation), m.headNorm)
                  : h;
    const Matrix &output = spec.tied ? m.token : m.headOutput;
    Batch logits = linear(t, output, spec.headBias ? &m.headBias : nullptr);
    return logSoftmax(logits);
  }

  /// The n-gram heads' vectors u_1 = h, u_j = out_j(act(in_j(h))) [+ wdrConjugate] (issue 18).
  std::vector<Batch> ngramHeads(const Batch &h, const TokenBatch &ids) const {
    std::vector<Batch> u{h};
    for (int64_t j = 2; j <= spec.ngram->n; ++j) {
      Batch x = apply(activation(apply(h, m.ngramIn[j - 2]), spec.activation), m.ngramOut[j - 2]);
      u.push_back(spec.ngram->wdr ? add(x, wdrConjugate(spec.tied ? m.token : m.headOutput, ids, j)) : x);
    }
    return u;
  }

  /// The contract's ensemble score: log_softmax of the logit-space mix, row p predicting x_p.
  Batch ngramLogprobs(const TokenBatch &ids) const {
    const Matrix &output = spec.tied ? m.token : m.headOutput;
    std::vector<Batch> z;
    for (const Batch &u : ngramHeads(encode(ids), ids))
      z.push_back(linear(u, output, spec.headBias ? &m.headBias : nullptr));
    return logSoftmax(ngramEnsembleLogits(z, spec.ngram->ensembleLambda));
  }

  /// Final hidden states per SEMANTICS.md: one pass, or position i from the copy with
  /// x_i masked under mask-and-predict.
  /// `spans` (mask-and-predict only): the positions each prediction masks (lm.mask_and_predict).
  Batch states(const TokenBatch &ids, const TokenBatch *spans = nullptr) const {
    if (spec.method == ScoreMethod::MaskAndPredict && spec.mlm)
      return maskAndPredict(
          ids, static_cast<int32_t>(spec.tokens.mask), [this](const TokenBatch &masked) { return encode(masked); },
          spans);
    return encode(ids);
  }

private:
  Batch norm(const Batch &x, const Norm &n) const { return layerNorm(x, n.weight, n.bias, spec.eps); }
  Batch apply(const Batch &x, const Linear &l) const { return linear(x, l.weight, &l.bias); }
  Batch embeddingNorm(const Batch &x) const { return spec.embeddingNorm ? norm(x, m.embedNorm) : x; }

  /// h0: X, norm_e(P) or norm_e(E[MASK] + P).
  Batch firstQuery(const TokenBatch &ids, const Batch &X, const Batch &P) const {
    switch (spec.firstQuery) {
    case FirstQuery::Embedding:
      return X;
    case FirstQuery::Position:
      return embeddingNorm(P);
    case FirstQuery::MaskPosition: {
      TokenBatch masks = ids;
      std::fill(masks.ids.begin(), masks.ids.end(), static_cast<int32_t>(spec.tokens.mask));
      return embeddingNorm(add(embed(m.token, masks), P));
    }
    }
    throw std::invalid_argument("reference executor: unknown first_query");
  }

  Batch selfAttention(const Layer &layer, const Batch &qIn, const Batch &kvIn) const {
    Batch Q = apply(qIn, layer.q), K = apply(kvIn, layer.k), V = apply(kvIn, layer.v);
    const int64_t dh = spec.dims.headDim();
    const float scaleFactor = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
    RelativePositions rel{&layer.relK, &layer.relV, spec.relativePositions};
    Batch context = attention(Q, K, V, spec.dims.heads, spec.mask, scaleFactor,
                              spec.relativePositions > 0 ? &rel : nullptr);
    return apply(context, layer.o);
  }

  Batch ffn(const Layer &layer, const Batch &x) const {
    return apply(activation(apply(x, layer.ffnIn), spec.activation), layer.ffnOut);
  }

  const ModelSpec &spec;
  const Model &m;
};

//===----------------------------------------------------------------------===//
// Loss and gradient: the forward of Forward::encode + headLogprobs with every
// intermediate kept, then each op's backward in reverse order
//===----------------------------------------------------------------------===//

void addTo(Matrix &acc, const Matrix &g) { acc += g; }
void addTo(RowVector &acc, const RowVector &g) { acc += g; }
void addTo(Linear &acc, const LinearGrad &g) {
  acc.weight += g.dWeight;
  if (g.dBias.size() > 0)
    acc.bias += g.dBias;
}
void addTo(Norm &acc, const LayerNormGrad &g) {
  acc.weight += g.dGamma;
  acc.bias += g.dBeta;
}

class Backprop {
public:
  Backprop(const ModelSpec &spec, const Model &model, Model &grads, uint64_t step)
      : spec(spec), m(model), g(grads), step(step) {}

  /// Forward over `ids`, CE against `targets`, backward; accumulates d(loss)/d(weights) into the
  /// gradients given at construction. Returns the loss sum and the number of targets T (dLogits
  /// are scaled by 1/T before the backward, so the gradients are those of the mean loss).
  CrossEntropy run(const TokenBatch &ids, const TokenBatch &targets, double labelSmoothing, int64_t T) {
    const int64_t D = spec.dims.dModel;
    const bool learned = spec.position == PositionKind::Learned;

    // Embedding stream (Forward::encode).
    Batch P = positions(ids, spec.position, learned ? &m.position : nullptr, D);
    Batch e0 = add(embed(m.token, ids), P);
    Batch X = drop(embeddingNorm(e0), 0);
    TokenBatch masks = ids;
    std::fill(masks.ids.begin(), masks.ids.end(), static_cast<int32_t>(spec.tokens.mask));
    Batch maskIn; // E[MASK] + P, mask+position only
    Batch h;
    switch (spec.firstQuery) {
    case FirstQuery::Embedding:
      h = X;
      break;
    case FirstQuery::Position:
      h = drop(embeddingNorm(P), 1);
      break;
    case FirstQuery::MaskPosition:
      maskIn = add(embed(m.token, masks), P);
      h = drop(embeddingNorm(maskIn), 1);
      break;
    }
    std::vector<LayerTape> tapes;
    for (const Layer &layer : m.layers) {
      tapes.push_back(layerForward(layer, h, X, int64_t(tapes.size())));
      h = tapes.back().out;
    }
    Batch last = h;
    if (spec.norm == NormPlacement::Pre)
      h = norm(last, m.finalNorm);

    if (spec.ngram) { // the n-gram objective's heads (issue 18); then the trunk's backward below
      CrossEntropy ce;
      Batch dh = ngramHeadsBackward(h, ids, targets, labelSmoothing, T, ce);
      trunkBackward(dh, last, tapes, X, P, e0, maskIn, ids, masks);
      return ce;
    }

    // Head (Forward::headLogprobs up to the logits).
    Batch ht, at, t = h;
    if (spec.headTransform) {
      ht = linear(h, m.headTransform.weight, &m.headTransform.bias);
      at = activation(ht, spec.activation);
      t = norm(at, m.headNorm);
    }
    const Matrix &output = spec.tied ? m.token : m.headOutput;
    Batch logits = linear(t, output, spec.headBias ? &m.headBias : nullptr);
    CrossEntropy ce = crossEntropy(logits, targets, labelSmoothing, 1.0 / static_cast<double>(T));

    // Head backward. The tied table's gradient sums, in this order: head, embedding, mask query.
    LinearGrad out = linearBackward(ce.dLogits, t, output, spec.headBias);
    addTo(spec.tied ? g.token : g.headOutput, out.dWeight);
    if (spec.headBias)
      addTo(g.headBias, out.dBias);
    Batch dh = out.dx;
    if (spec.headTransform) {
      LayerNormGrad n = layerNormBackward(dh, at, m.headNorm.weight, spec.eps);
      addTo(g.headNorm, n);
      LinearGrad l = linearBackward(activationBackward(n.dx, ht, spec.activation), h, m.headTransform.weight, true);
      addTo(g.headTransform, l);
      dh = l.dx;
    }
    trunkBackward(dh, last, tapes, X, P, e0, maskIn, ids, masks);
    return ce;
  }

private:
  struct LayerTape;

  /// The trunk's backward from d(final hidden states): final_norm, the layers, the embedding stream.
  void trunkBackward(Batch dh, const Batch &last, const std::vector<LayerTape> &tapes, const Batch &X,
                     const Batch &P, const Batch &e0, const Batch &maskIn, const TokenBatch &ids,
                     const TokenBatch &masks) {
    const int64_t D = spec.dims.dModel;
    if (spec.norm == NormPlacement::Pre) {
      LayerNormGrad n = layerNormBackward(dh, last, m.finalNorm.weight, spec.eps);
      addTo(g.finalNorm, n);
      dh = n.dx;
    }

    // Layers backward; dX collects the key/value stream's gradient (keys_values = embedding).
    Batch dX = Batch::zerosLike(X, D);
    for (int64_t i = static_cast<int64_t>(m.layers.size()) - 1; i >= 0; --i)
      dh = layerBackward(m.layers[i], g.layers[i], tapes[i], dh, dX, i);

    // Embedding stream backward.
    Batch dP = Batch::zerosLike(P, D);
    switch (spec.firstQuery) {
    case FirstQuery::Embedding:
      dX = add(dX, dh);
      break;
    case FirstQuery::Position:
      dP = embeddingNormBackward(drop(dh, 1), P);
      break;
    case FirstQuery::MaskPosition:
      dh = embeddingNormBackward(drop(dh, 1), maskIn); // d(E[MASK] + P)
      dP = dh;
      break;
    }
    Batch de0 = embeddingNormBackward(drop(dX, 0), e0);
    addTo(g.token, embedBackward(de0, ids, spec.dims.vocab));
    if (spec.firstQuery == FirstQuery::MaskPosition)
      addTo(g.token, embedBackward(dh, masks, spec.dims.vocab));
    dP = add(dP, de0);
    if (spec.position == PositionKind::Learned)
      addTo(g.position, positionsBackward(dP, spec.dims.maxLen));
  }

  /// The n-gram objective (issue 18) on the final hidden states h: head j's CE against the targets
  /// shifted by j-1, weighted 1/2 (j = 1) or 1/(2(n-1)), dLogits scaled by weight / T. The WDR conjugate's
  /// copy of W gets no gradient (stop-gradient). Returns d(loss)/dh; ce gets the weighted loss sum.
  Batch ngramHeadsBackward(const Batch &h, const TokenBatch &ids, const TokenBatch &targets, double labelSmoothing,
                           int64_t T, CrossEntropy &ce) {
    const int64_t n = spec.ngram->n;
    const Matrix &output = spec.tied ? m.token : m.headOutput;
    Batch dh = Batch::zerosLike(h, h.C);
    for (int64_t j = 1; j <= n; ++j) {
      Batch a, f, u = h;
      if (j >= 2) {
        a = linear(h, m.ngramIn[j - 2].weight, &m.ngramIn[j - 2].bias);
        f = activation(a, spec.activation);
        u = linear(f, m.ngramOut[j - 2].weight, &m.ngramOut[j - 2].bias);
        if (spec.ngram->wdr)
          u = add(u, wdrConjugate(output, ids, j));
      }
      const double w = ngramHeadWeight(j, n);
      Batch logits = linear(u, output, spec.headBias ? &m.headBias : nullptr);
      CrossEntropy cj = crossEntropy(logits, shiftTargets(targets, j - 1), labelSmoothing, w / double(T));
      ce.lossSum += w * cj.lossSum;
      if (j == 1)
        ce.targets = cj.targets;
      LinearGrad out = linearBackward(cj.dLogits, u, output, spec.headBias);
      addTo(spec.tied ? g.token : g.headOutput, out.dWeight);
      if (spec.headBias)
        addTo(g.headBias, out.dBias);
      if (j == 1) {
        dh = add(dh, out.dx);
        continue;
      }
      LinearGrad o = linearBackward(out.dx, f, m.ngramOut[j - 2].weight, true);
      addTo(g.ngramOut[j - 2], o);
      LinearGrad i = linearBackward(activationBackward(o.dx, a, spec.activation), h, m.ngramIn[j - 2].weight, true);
      addTo(g.ngramIn[j - 2], i);
      dh = add(dh, i.dx);
    }
    return dh;
  }

  /// What a layer's backward needs of its forward.
  struct LayerTape {
    Batch in;           ///< h, the layer's input
    Batch qIn, kvIn;    ///< attention inputs (pre-norm: attn_norm(h))
    Batch Q, K, V;      ///< projections
    Batch context;      ///< attention output before the o projection
    Batch sum1;         ///< post-norm: h + attn (attn_norm's input); pre-norm: a = h + attn
    Batch ffnIn;        ///< post-norm: a = attn_norm(sum1); pre-norm: ffn_norm(a)
    Batch f1, f2;       ///< ffn.in output, its activation
    Batch sum2;         ///< post-norm: a + ffn (ffn_norm's input)
    Batch out;          ///< h'
  };

  Batch norm(const Batch &x, const Norm &n) const { return layerNorm(x, n.weight, n.bias, spec.eps); }
  Batch apply(const Batch &x, const Linear &l) const { return linear(x, l.weight, &l.bias); }
  Batch embeddingNorm(const Batch &x) const { return spec.embeddingNorm ? norm(x, m.embedNorm) : x; }
  /// [train] dropout at `site` (runtime/train/Philox.h): x * keep / (1 - rate); the same mask scales the
  /// gradient in the backward, so this one function is both.
  Batch drop(const Batch &x, int64_t site) const {
    if (spec.train.dropout <= 0)
      return x;
    return applyDropout(x, {spec.train.dropout, uint64_t(spec.train.seed), step, uint32_t(site)});
  }
  Batch embeddingNormBackward(const Batch &dy, const Batch &x) {
    if (!spec.embeddingNorm)
      return dy;
    LayerNormGrad n = layerNormBackward(dy, x, m.embedNorm.weight, spec.eps);
    addTo(g.embedNorm, n);
    return n.dx;
  }
  float attentionScale() const {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.dims.headDim())));
  }
  /// [train] attention_dropout on layer i's probabilities (runtime/train/Philox.h).
  DropoutMask probabilityDropout(int64_t i) const {
    return {spec.train.attentionDropout, uint64_t(spec.train.seed), step, train::attentionDropoutSite(i)};
  }

  /// One layer of Forward::encode, same ops in the same order.
  LayerTape layerForward(const Layer &layer, const Batch &h, const Batch &X, int64_t i) const {
    const bool hiddenKV = spec.keysValues == KeyValueSource::Hidden;
    LayerTape tp;
    tp.in = h;
    tp.qIn = spec.norm == NormPlacement::Post ? h : norm(h, layer.attnNorm);
    tp.kvIn = hiddenKV ? tp.qIn : X;
    tp.Q = apply(tp.qIn, layer.q);
    tp.K = apply(tp.kvIn, layer.k);
    tp.V = apply(tp.kvIn, layer.v);
    RelativePositions rel{&layer.relK, &layer.relV, spec.relativePositions};
    const DropoutMask drops = probabilityDropout(i);
    tp.context = attention(tp.Q, tp.K, tp.V, spec.dims.heads, spec.mask, attentionScale(),
                           spec.relativePositions > 0 ? &rel : nullptr, drops.rate > 0 ? &drops : nullptr);
    tp.sum1 = add(h, drop(apply(tp.context, layer.o), 2 + 2 * i));
    if (spec.norm == NormPlacement::Post) {
      tp.ffnIn = norm(tp.sum1, layer.attnNorm);
      tp.f1 = apply(tp.ffnIn, layer.ffnIn);
      tp.f2 = activation(tp.f1, spec.activation);
      tp.sum2 = add(tp.ffnIn, drop(apply(tp.f2, layer.ffnOut), 3 + 2 * i));
      tp.out = norm(tp.sum2, layer.ffnNorm);
    } else {
      tp.ffnIn = norm(tp.sum1, layer.ffnNorm);
      tp.f1 = apply(tp.ffnIn, layer.ffnIn);
      tp.f2 = activation(tp.f1, spec.activation);
      tp.out = add(tp.sum1, drop(apply(tp.f2, layer.ffnOut), 3 + 2 * i));
    }
    return tp;
  }

  /// d(FFN input) from d(FFN output); accumulates ffn.in and ffn.out.
  Batch ffnBackward(const Layer &layer, Layer &lg, const LayerTape &tp, const Batch &dy) {
    LinearGrad o = linearBackward(dy, tp.f2, layer.ffnOut.weight, true);
    addTo(lg.ffnOut, o);
    LinearGrad i = linearBackward(activationBackward(o.dx, tp.f1, spec.activation), tp.ffnIn, layer.ffnIn.weight,
                                  true);
    addTo(lg.ffnIn, i);
    return i.dx;
  }

  /// d(query input) and d(key/value input) from d(attention output); accumulates q, k, v, o, rel.
  std::pair<Batch, Batch> attentionBackward(const Layer &layer, Layer &lg, const LayerTape &tp, const Batch &dy,
                                            int64_t i) {
    LinearGrad o = linearBackward(dy, tp.context, layer.o.weight, true);
    addTo(lg.o, o);
    RelativePositions rel{&layer.relK, &layer.relV, spec.relativePositions};
    const DropoutMask drops = probabilityDropout(i);
    AttentionGrad a = reference::attentionBackward(o.dx, tp.Q, tp.K, tp.V, spec.dims.heads, spec.mask,
                                                   attentionScale(), spec.relativePositions > 0 ? &rel : nullptr,
                                                   drops.rate > 0 ? &drops : nullptr);
    if (spec.relativePositions > 0) {
      addTo(lg.relK, a.dRelKeys);
      addTo(lg.relV, a.dRelValues);
    }
    LinearGrad q = linearBackward(a.dQuery, tp.qIn, layer.q.weight, true);
    LinearGrad k = linearBackward(a.dKey, tp.kvIn, layer.k.weight, true);
    LinearGrad v = linearBackward(a.dValue, tp.kvIn, layer.v.weight, true);
    addTo(lg.q, q);
    addTo(lg.k, k);
    addTo(lg.v, v);
    return {q.dx, add(k.dx, v.dx)};
  }

  /// d(layer input) from d(layer output); adds the key/value stream's gradient to dX when
  /// keys_values = embedding.
  Batch layerBackward(const Layer &layer, Layer &lg, const LayerTape &tp, const Batch &dOut, Batch &dX, int64_t i) {
    const bool hiddenKV = spec.keysValues == KeyValueSource::Hidden;
    if (spec.norm == NormPlacement::Post) {
      LayerNormGrad n2 = layerNormBackward(dOut, tp.sum2, layer.ffnNorm.weight, spec.eps);
      addTo(lg.ffnNorm, n2);
      Batch da = add(n2.dx, ffnBackward(layer, lg, tp, drop(n2.dx, 3 + 2 * i)));
      LayerNormGrad n1 = layerNormBackward(da, tp.sum1, layer.attnNorm.weight, spec.eps);
      addTo(lg.attnNorm, n1);
      auto [dq, dkv] = attentionBackward(layer, lg, tp, drop(n1.dx, 2 + 2 * i), i);
      Batch dh = add(n1.dx, dq);
      if (hiddenKV)
        return add(dh, dkv);
      dX = add(dX, dkv);
      return dh;
    }
    LayerNormGrad n2 =
        layerNormBackward(ffnBackward(layer, lg, tp, drop(dOut, 3 + 2 * i)), tp.sum1, layer.ffnNorm.weight, spec.eps);
    addTo(lg.ffnNorm, n2);
    Batch da = add(dOut, n2.dx);
    auto [dq, dkv] = attentionBackward(layer, lg, tp, drop(da, 2 + 2 * i), i);
    if (hiddenKV)
      dq = add(dq, dkv);
    else
      dX = add(dX, dkv);
    LayerNormGrad n1 = layerNormBackward(dq, tp.in, layer.attnNorm.weight, spec.eps);
    addTo(lg.attnNorm, n1);
    return add(da, n1.dx);
  }

  const ModelSpec &spec;
  const Model &m;
  Model &g;
  uint64_t step; ///< the training step of the dropout masks
};

//===----------------------------------------------------------------------===//
// Batching and threads
//===----------------------------------------------------------------------===//

struct Chunk {
  size_t begin, end; ///< sentences [begin, end)
};

/// Consecutive sentences, as many per chunk as fit kMaxBatchRows padded rows (at least one).
std::vector<Chunk> makeChunks(const std::vector<std::vector<int32_t>> &sentences) {
  std::vector<Chunk> chunks;
  size_t begin = 0;
  while (begin < sentences.size()) {
    size_t end = begin + 1;
    int64_t longest = static_cast<int64_t>(sentences[begin].size());
    while (end < sentences.size()) {
      int64_t next = std::max<int64_t>(longest, static_cast<int64_t>(sentences[end].size()));
      if (static_cast<int64_t>(end + 1 - begin) * next > kMaxBatchRows)
        break;
      longest = next;
      ++end;
    }
    chunks.push_back({begin, end});
    begin = end;
  }
  return chunks;
}

TokenBatch packChunk(const std::vector<std::vector<int32_t>> &sentences, const Chunk &c) {
  return TokenBatch::pack({sentences.begin() + c.begin, sentences.begin() + c.end});
}

/// Runs f(chunk) for every chunk on an arena of `threads` threads (<= 0: all cores).
template <typename F> void forEachChunk(const std::vector<Chunk> &chunks, int threads, F f) {
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  arena.execute([&] { tbb::parallel_for(size_t(0), chunks.size(), [&](size_t i) { f(chunks[i]); }); });
}

/// spans[s][i] in (i, length of sentence s]: every position is predicted, masking [i, spans[s][i]).
void checkSpans(const std::vector<std::vector<int32_t>> &sentences, const std::vector<std::vector<int32_t>> &spans) {
  if (spans.size() != sentences.size())
    throw std::invalid_argument("spans: " + std::to_string(spans.size()) + " sentences, the ids " +
                                std::to_string(sentences.size()));
  for (size_t s = 0; s < spans.size(); ++s) {
    if (spans[s].size() != sentences[s].size())
      throw std::invalid_argument("spans of sentence " + std::to_string(s) + ": " + std::to_string(spans[s].size()) +
                                  " entries for " + std::to_string(sentences[s].size()) + " tokens");
    for (size_t i = 0; i < spans[s].size(); ++i)
      if (spans[s][i] <= int64_t(i) || spans[s][i] > int64_t(spans[s].size()))
        throw std::invalid_argument("spans of sentence " + std::to_string(s) + ": position " + std::to_string(i) +
                                    " masks up to " + std::to_string(spans[s][i]) + ", outside (" +
                                    std::to_string(i) + ", " + std::to_string(spans[s].size()) + "]");
  }
}

std::vector<int32_t> specialTokens(const ModelSpec &spec) {
  return {static_cast<int32_t>(spec.tokens.bos), static_cast<int32_t>(spec.tokens.eos)};
}

} // namespace

std::vector<ScoreResult> score(const ModelSpec &spec, const WeightSet &weights,
                               const std::vector<std::vector<int32_t>> &sentences, int threads,
                               const std::vector<std::vector<int32_t>> *spans) {
  checkSpec(spec);
  checkSentences(spec, sentences);
  if (spans) {
    if (spec.method != ScoreMethod::MaskAndPredict)
      throw std::invalid_argument("spans apply to mask-and-predict scoring only");
    checkSpans(sentences, *spans);
  }
  if (!spec.mlm)
    throw std::invalid_argument(spec.where("head.mlm") + ": 'head.mlm': the model is encoder only (mlm = false): "
                                "there is no output head to score with");
  const Model model = loadModel(spec, weights);
  const Forward forward(spec, model);
  const bool causal = spec.method == ScoreMethod::Causal;
  const std::vector<int32_t> skip = spec.skipSpecial ? specialTokens(spec) : std::vector<int32_t>{};

  std::vector<ScoreResult> results(sentences.size());
  const std::vector<Chunk> chunks = makeChunks(sentences);
  forEachChunk(chunks, threads, [&](const Chunk &c) {
    TokenBatch ids = packChunk(sentences, c);
    std::optional<TokenBatch> chunkSpans;
    if (spans)
      chunkSpans = packChunk(*spans, c);
    Batch lp = spec.ngram ? forward.ngramLogprobs(ids)
                          : forward.headLogprobs(forward.states(ids, chunkSpans ? &*chunkSpans : nullptr));
    Batch targets = gather(lp, ids, /*shift=*/causal && !spec.ngram ? 1 : 0);
    std::vector<ScoreResult> chunkResults = sentenceScore(targets, ids, skip, /*first=*/causal ? 1 : 0);
    std::move(chunkResults.begin(), chunkResults.end(), results.begin() + c.begin);
  });
  return results;
}

std::vector<std::vector<float>> embed(const ModelSpec &spec, const WeightSet &weights,
                                      const std::vector<std::vector<int32_t>> &sentences, int threads) {
  checkSpec(spec);
  checkSentences(spec, sentences);
  const Model model = loadModel(spec, weights);
  const Forward forward(spec, model);

  std::vector<std::vector<float>> results(sentences.size());
  const std::vector<Chunk> chunks = makeChunks(sentences);
  forEachChunk(chunks, threads, [&](const Chunk &c) {
    TokenBatch ids = packChunk(sentences, c);
    std::vector<std::vector<float>> pooled =
        pool(forward.states(ids), ids, spec.pool, specialTokens(spec), spec.normalize);
    std::move(pooled.begin(), pooled.end(), results.begin() + c.begin);
  });
  return results;
}

LossAndGrad lossAndGrad(const ModelSpec &spec, const WeightSet &weights,
                        const std::vector<std::vector<int32_t>> &inputs,
                        const std::vector<std::vector<int32_t>> &targets, double labelSmoothing, int threads,
                        uint64_t step) {
  checkSpec(spec);
  if (inputs.size() != targets.size())
    throw std::invalid_argument("loss: " + std::to_string(inputs.size()) + " input sentences but " +
                                std::to_string(targets.size()) + " target sentences");
  if (!(labelSmoothing >= 0 && labelSmoothing <= 1))
    throw std::invalid_argument("loss: label smoothing " + std::to_string(labelSmoothing) + " outside [0, 1]");
  checkSentences(spec, inputs);
  int64_t T = 0;
  for (size_t b = 0; b < inputs.size(); ++b) {
    if (targets[b].size() != inputs[b].size())
      throw std::invalid_argument("sentence " + std::to_string(b) + ": " + std::to_string(inputs[b].size()) +
                                  " inputs but " + std::to_string(targets[b].size()) + " targets");
    for (size_t t = 0; t < targets[b].size(); ++t) {
      const int32_t y = targets[b][t];
      if (y < -1 || y >= spec.dims.vocab)
        throw std::invalid_argument("sentence " + std::to_string(b) + ", position " + std::to_string(t) +
                                    ": target " + std::to_string(y) + " outside [0, " +
                                    std::to_string(spec.dims.vocab) + ") (-1 for no target)");
      T += y >= 0;
    }
  }
  if (T == 0)
    throw std::invalid_argument("loss: no target in the batch (every target is -1)");

  const Model model = loadModel(spec, weights);
  Model grads = zerosLike(model);
  CrossEntropy ce;
  tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
  arena.execute([&] {
    ce = Backprop(spec, model, grads, step)
             .run(TokenBatch::pack(inputs), TokenBatch::pack(targets), labelSmoothing, T);
  });
  LossAndGrad result;
  result.loss = ce.lossSum / static_cast<double>(T);
  result.targets = ce.targets;
  result.grads = storeModel(spec, grads);
  return result;
}

std::vector<std::vector<float>> hiddenStates(const ModelSpec &spec, const WeightSet &weights,
                                             const std::vector<int32_t> &ids) {
  checkSpec(spec);
  checkSentences(spec, {ids});
  const Model model = loadModel(spec, weights);
  Batch h = Forward(spec, model).encode(TokenBatch::pack({ids}));
  std::vector<std::vector<float>> rows;
  for (int64_t t = 0; t < h.lengths[0]; ++t)
    rows.emplace_back(h.row(0, 0, t), h.row(0, 0, t) + h.C);
  return rows;
}

std::vector<std::vector<float>> logprobs(const ModelSpec &spec, const WeightSet &weights,
                                         const std::vector<int32_t> &ids) {
  checkSpec(spec);
  checkSentences(spec, {ids});
  const Model model = loadModel(spec, weights);
  const Forward forward(spec, model);
  Batch lp = forward.headLogprobs(forward.encode(TokenBatch::pack({ids})));
  std::vector<std::vector<float>> rows;
  for (int64_t t = 0; t < lp.lengths[0]; ++t)
    rows.emplace_back(lp.row(0, 0, t), lp.row(0, 0, t) + lp.C);
  return rows;
}

} // namespace lmcc::reference
