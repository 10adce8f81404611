//===- Executor.cpp - Reference executor: whole-model scoring and embedding -===//
//
// The forward pass of runtime/SEMANTICS.md composed from the ops of Ops.h, one op
// at a time. Sentences are processed in padded chunks, chunks in parallel on a
// oneTBB arena; every op reads only valid rows, so the results are bit-identical
// for any chunking and thread count.
//
//===----------------------------------------------------------------------===//
#include "runtime/reference/Executor.h"

#include "runtime/reference/Ops.h"
#include "runtime/weights/Format.h"
#include "runtime/weights/WeightNames.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
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
  return m;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

void checkSpec(const ModelSpec &spec) {
  if (spec.family != Family::UniLM && spec.family != Family::BiLM && spec.family != Family::TTA)
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

  /// Final hidden states per SEMANTICS.md: one pass, or position i from the copy with
  /// x_i masked under mask-and-predict.
  Batch states(const TokenBatch &ids) const {
    if (spec.method == ScoreMethod::MaskAndPredict && spec.mlm)
      return maskAndPredict(ids, static_cast<int32_t>(spec.tokens.mask),
                            [this](const TokenBatch &masked) { return encode(masked); });
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

std::vector<int32_t> specialTokens(const ModelSpec &spec) {
  return {static_cast<int32_t>(spec.tokens.bos), static_cast<int32_t>(spec.tokens.eos)};
}

} // namespace

std::vector<ScoreResult> score(const ModelSpec &spec, const WeightSet &weights,
                               const std::vector<std::vector<int32_t>> &sentences, int threads) {
  checkSpec(spec);
  checkSentences(spec, sentences);
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
    Batch lp = forward.headLogprobs(forward.states(ids));
    Batch targets = gather(lp, ids, /*shift=*/causal ? 1 : 0);
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
