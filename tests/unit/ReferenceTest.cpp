//===- ReferenceTest.cpp - Reference executor: ops and model invariants ---===//
//
// Per-op tests against hand-computed values, a whole-model comparison with an
// independent naive double-precision implementation of runtime/SEMANTICS.md, and
// model-level invariants: batch and thread invariance (bit for bit), causality,
// the self-unknown property of T-TA and of mask-and-predict, tiny and odd sizes,
// and input validation. Specs and weights are built in code.
//
//===----------------------------------------------------------------------===//
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "runtime/reference/Ops.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/NaiveModel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace lmcc;
using namespace lmcc::reference;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

//===----------------------------------------------------------------------===//
// Helpers: specs, weights, sentences
//===----------------------------------------------------------------------===//

/// A small spec of the given family with the family's defaults (SEMANTICS.md / torch_ref.py).
ModelSpec makeSpec(Family family) {
  ModelSpec s;
  s.name = "test";
  s.family = family;
  s.dims.vocab = 23;
  s.dims.maxLen = 16;
  s.dims.dModel = 16;
  s.dims.heads = 2;
  s.dims.dFF = 24;
  s.dims.layers = 2;
  s.eps = 1e-6;
  switch (family) {
  case Family::UniLM:
    s.mask = MaskKind::Causal;
    s.keysValues = KeyValueSource::Hidden;
    s.firstQuery = FirstQuery::Embedding;
    s.method = ScoreMethod::Causal;
    break;
  case Family::BiLM:
    s.mask = MaskKind::None;
    s.keysValues = KeyValueSource::Hidden;
    s.firstQuery = FirstQuery::Embedding;
    s.method = ScoreMethod::MaskAndPredict;
    break;
  default: // T-TA
    s.mask = MaskKind::Diagonal;
    s.keysValues = KeyValueSource::Embedding;
    s.firstQuery = FirstQuery::Position;
    s.method = ScoreMethod::SinglePass;
    break;
  }
  return s;
}

/// The canonical tensors of a spec (written here from SEMANTICS.md, independent of Weights).
std::vector<std::pair<std::string, std::vector<int64_t>>> tensorList(const ModelSpec &s) {
  const int64_t V = s.dims.vocab, L = s.dims.maxLen, D = s.dims.dModel, F = s.dims.dFF, dh = s.dims.headDim();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"embed.token", {V, D}}};
  if (s.position == PositionKind::Learned)
    out.push_back({"embed.position", {L, D}});
  auto norm = [&](const std::string &p) {
    out.push_back({p + ".weight", {D}});
    out.push_back({p + ".bias", {D}});
  };
  if (s.embeddingNorm)
    norm("embed.norm");
  for (int64_t i = 0; i < s.dims.layers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    for (const char *m : {"q", "k", "v", "o"}) {
      out.push_back({p + "attn." + m + ".weight", {D, D}});
      out.push_back({p + "attn." + m + ".bias", {D}});
    }
    if (s.relativePositions > 0) {
      out.push_back({p + "attn.rel_k", {2 * s.relativePositions + 1, dh}});
      out.push_back({p + "attn.rel_v", {2 * s.relativePositions + 1, dh}});
    }
    norm(p + "attn_norm");
    out.push_back({p + "ffn.in.weight", {F, D}});
    out.push_back({p + "ffn.in.bias", {F}});
    out.push_back({p + "ffn.out.weight", {D, F}});
    out.push_back({p + "ffn.out.bias", {D}});
    norm(p + "ffn_norm");
  }
  if (s.norm == NormPlacement::Pre)
    norm("final_norm");
  if (s.headTransform) {
    out.push_back({"head.transform.weight", {D, D}});
    out.push_back({"head.transform.bias", {D}});
    norm("head.norm");
  }
  if (!s.tied)
    out.push_back({"head.output.weight", {V, D}});
  if (s.headBias)
    out.push_back({"head.bias", {V}});
  return out;
}

/// Random weights with scales that keep outputs far from uniform.
WeightSet randomWeights(const ModelSpec &s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  WeightSet w;
  for (const auto &[name, shape] : tensorList(s)) {
    Tensor t;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    bool isNorm = name.find("norm.") != std::string::npos;
    bool isWeight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    float mean = 0, stdev;
    if (isNorm && isWeight) {
      mean = 1.0f;
      stdev = 0.1f;
    } else if (name.find("bias") != std::string::npos) {
      stdev = 0.1f;
    } else if (name == "embed.token" || name == "embed.position" || name == "head.output.weight" ||
               name.find("rel_") != std::string::npos) {
      stdev = 0.5f;
    } else { // linear [out, in]
      stdev = 1.0f / std::sqrt(static_cast<float>(shape[1]));
    }
    for (int64_t k = 0; k < n; ++k)
      t.data.push_back(mean + stdev * normal(rng));
    w.tensors[name] = std::move(t);
  }
  return w;
}

/// bos, n - 2 random ordinary tokens, eos (n >= 2); n == 1 gives one ordinary token.
std::vector<int32_t> randomSentence(const ModelSpec &s, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(5, static_cast<int32_t>(s.dims.vocab) - 1);
  std::vector<int32_t> ids;
  for (int t = 0; t < n; ++t)
    ids.push_back(token(rng));
  if (n >= 2) {
    ids.front() = static_cast<int32_t>(s.tokens.bos);
    ids.back() = static_cast<int32_t>(s.tokens.eos);
  }
  return ids;
}

bool bitEqual(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool bitEqual(const ScoreResult &a, const ScoreResult &b) {
  return bitEqual(a.tokenLogprobs, b.tokenLogprobs) && std::memcmp(&a.score, &b.score, sizeof(double)) == 0 &&
         a.nScored == b.nScored;
}

bool allFinite(const std::vector<float> &v) {
  for (float x : v)
    if (!std::isfinite(x))
      return false;
  return true;
}

/// A batch [B, 1, N, C] from per-sentence rows.
Batch batchOf(const std::vector<std::vector<std::vector<float>>> &sentences, int64_t N, int64_t C) {
  std::vector<int64_t> lengths;
  for (const auto &s : sentences)
    lengths.push_back(static_cast<int64_t>(s.size()));
  Batch b = Batch::zeros(lengths, 1, N, C);
  for (size_t i = 0; i < sentences.size(); ++i)
    for (size_t t = 0; t < sentences[i].size(); ++t)
      for (int64_t c = 0; c < C; ++c)
        b.at(i, 0, t, c) = sentences[i][t][c];
  return b;
}

/// Every spec variant the executor supports, for sweeps.
std::vector<ModelSpec> specVariants() {
  std::vector<ModelSpec> out;
  for (Family f : {Family::UniLM, Family::BiLM, Family::TTA})
    out.push_back(makeSpec(f));
  ModelSpec s = makeSpec(Family::TTA);
  s.norm = NormPlacement::Pre;
  s.relativePositions = 2;
  out.push_back(s);
  s = makeSpec(Family::TTA);
  s.firstQuery = FirstQuery::MaskPosition;
  s.position = PositionKind::Sinusoidal;
  s.activation = Activation::GeluTanh;
  out.push_back(s);
  s = makeSpec(Family::TTA);
  s.firstQuery = FirstQuery::Embedding;
  s.embeddingNorm = false;
  s.headBias = false;
  s.headTransform = false;
  out.push_back(s);
  s = makeSpec(Family::BiLM);
  s.mask = MaskKind::Anticausal;
  s.method = ScoreMethod::SinglePass;
  s.activation = Activation::Relu;
  s.tied = false;
  s.relativePositions = 3;
  out.push_back(s);
  s = makeSpec(Family::UniLM);
  s.norm = NormPlacement::Pre;
  s.keysValues = KeyValueSource::Embedding;
  s.position = PositionKind::None;
  s.tied = false;
  out.push_back(s);
  s = makeSpec(Family::BiLM);
  s.norm = NormPlacement::Pre;
  s.position = PositionKind::Sinusoidal;
  s.skipSpecial = false;
  out.push_back(s);
  return out;
}

std::string describe(const ModelSpec &s) {
  return std::string(toString(s.family)) + " mask=" + toString(s.mask) + " kv=" + toString(s.keysValues) +
         " fq=" + toString(s.firstQuery) + " norm=" + toString(s.norm) + " pos=" + toString(s.position) +
         " act=" + toString(s.activation) + " rel=" + std::to_string(s.relativePositions) +
         " method=" + toString(s.method);
}

//===----------------------------------------------------------------------===//
// An independent naive implementation (double precision, plain loops: tests/unit/NaiveModel.h)
//===----------------------------------------------------------------------===//

using naive::NaiveModel;
using naive::Rows;

/// Naive scores per SEMANTICS.md.
ScoreResult naiveScore(const ModelSpec &s, const WeightSet &w, const std::vector<int32_t> &x) {
  const auto weights = naive::naiveWeights(w);
  const NaiveModel model(s, weights);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> lp(n, 0.0);
  if (s.method == ScoreMethod::MaskAndPredict) {
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int32_t> copy = x;
      copy[i] = static_cast<int32_t>(s.tokens.mask);
      lp[i] = model.logprobs(model.hidden(copy))[i][x[i]];
    }
  } else {
    Rows all = model.logprobs(model.hidden(x));
    for (int64_t t = 0; t < n; ++t)
      lp[t] = s.method == ScoreMethod::Causal ? (t == 0 ? 0.0 : all[t - 1][x[t]]) : all[t][x[t]];
  }
  ScoreResult r;
  for (int64_t t = 0; t < n; ++t) {
    bool special = x[t] == s.tokens.bos || x[t] == s.tokens.eos;
    bool scored = !(s.method == ScoreMethod::Causal && t == 0) && !(s.skipSpecial && special);
    r.tokenLogprobs.push_back(scored ? static_cast<float>(lp[t]) : 0.0f);
    r.score += scored ? lp[t] : 0.0;
    r.nScored += scored;
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

TEST(Ops, SoftmaxHandValues) {
  Batch x = batchOf({{{0.0f, std::log(3.0f), -kInf}}}, 1, 3);
  Batch p = softmax(x);
  EXPECT_NEAR(p.at(0, 0, 0, 0), 0.25f, 1e-7);
  EXPECT_NEAR(p.at(0, 0, 0, 1), 0.75f, 1e-7);
  EXPECT_EQ(p.at(0, 0, 0, 2), 0.0f);
  // Large inputs do not overflow.
  Batch big = softmax(batchOf({{{1000.0f, 1000.0f}}}, 1, 2));
  EXPECT_FLOAT_EQ(big.at(0, 0, 0, 0), 0.5f);
}

TEST(Ops, SoftmaxFullyMaskedRowIsZero) {
  Batch x = batchOf({{{-kInf, -kInf, -kInf}, {1.0f, -kInf, 2.0f}}}, 2, 3);
  Batch p = softmax(x);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(p.at(0, 0, 0, c), 0.0f) << c;
    EXPECT_FALSE(std::isnan(p.at(0, 0, 0, c)));
  }
  EXPECT_NEAR(p.at(0, 0, 1, 0) + p.at(0, 0, 1, 2), 1.0f, 1e-6);
  EXPECT_EQ(p.at(0, 0, 1, 1), 0.0f);
}

TEST(Ops, LayerNormHandComputed) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  Batch x = batchOf({{{1, 2, 3, 4}}}, 1, 4);
  RowVector gamma(4), beta(4);
  gamma << 1, 2, 1, 1;
  beta << 0, 0, 0.5f, 0;
  Batch y = layerNorm(x, gamma, beta, 0.0);
  const double sd = std::sqrt(1.25);
  EXPECT_NEAR(y.at(0, 0, 0, 0), -1.5 / sd, 1e-6);
  EXPECT_NEAR(y.at(0, 0, 0, 1), 2 * (-0.5 / sd), 1e-6);
  EXPECT_NEAR(y.at(0, 0, 0, 2), 0.5 / sd + 0.5, 1e-6);
  EXPECT_NEAR(y.at(0, 0, 0, 3), 1.5 / sd, 1e-6);
  // eps enters under the square root; a constant row maps to beta.
  Batch c = layerNorm(batchOf({{{7, 7, 7, 7}}}, 1, 4), gamma, beta, 1e-5);
  EXPECT_FLOAT_EQ(c.at(0, 0, 0, 2), 0.5f);
  EXPECT_FLOAT_EQ(c.at(0, 0, 0, 0), 0.0f);
}

TEST(Ops, ActivationValues) {
  EXPECT_EQ(geluExact(0.0f), 0.0f);
  EXPECT_NEAR(geluExact(1.0f), 0.8413447f, 1e-6);
  EXPECT_NEAR(geluExact(-1.0f), -0.1586553f, 1e-6);
  EXPECT_NEAR(geluExact(2.0f), 1.9544997f, 1e-6);
  EXPECT_NEAR(geluTanh(1.0f), 0.8411920f, 1e-6);
  EXPECT_NEAR(geluTanh(-1.0f), -0.1588080f, 1e-6);
  Batch x = batchOf({{{-2.0f, 0.0f, 3.0f}}}, 2, 3);
  Batch r = relu(x);
  EXPECT_EQ(r.at(0, 0, 0, 0), 0.0f);
  EXPECT_EQ(r.at(0, 0, 0, 2), 3.0f);
  EXPECT_EQ(r.at(0, 0, 1, 2), 0.0f); // padding stays zero
  Batch g = activation(x, Activation::GeluTanh);
  EXPECT_FLOAT_EQ(g.at(0, 0, 0, 2), geluTanh(3.0f));
}

TEST(Ops, MaskFillKinds) {
  // Sentence 0 has 3 tokens in a batch padded to 4; sentence 1 has 4.
  Batch scores = Batch::zeros({3, 4}, 1, 4, 4);
  for (float &v : scores.data)
    v = 1.0f;
  for (int64_t t = 3; t < 4; ++t) // restore the padding row of sentence 0
    for (int c = 0; c < 4; ++c)
      scores.at(0, 0, t, c) = 0.0f;
  struct Case {
    MaskKind kind;
    const char *pattern; // sentence 0, rows i < 3, keys j < 4: 'x' visible
  } cases[] = {
      {MaskKind::None, "xxx.xxx.xxx."},
      {MaskKind::Causal, "x...xx..xxx."},
      {MaskKind::Anticausal, "xxx..xx...x."},
      {MaskKind::Diagonal, ".xx.x.x.xx.."},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(toString(c.kind));
    Batch m = maskFill(scores, c.kind);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        bool visible = c.pattern[i * 4 + j] == 'x';
        EXPECT_EQ(m.at(0, 0, i, j), visible ? 1.0f : -kInf) << i << "," << j;
        EXPECT_EQ(keyVisible(c.kind, i, j, 3), visible);
      }
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(m.at(0, 0, 3, j), 0.0f); // padding row untouched
    EXPECT_EQ(m.at(1, 0, 3, 3), c.kind == MaskKind::Diagonal ? -kInf : 1.0f);
  }
  EXPECT_THROW(keyVisible(MaskKind::Directional, 0, 0, 1), std::invalid_argument);
}

TEST(Ops, LogSoftmaxNormalizedAndStable) {
  Batch x = batchOf({{{1.0f, 2.0f, 3.0f}, {1000.0f, 1001.0f, -1000.0f}}}, 2, 3);
  Batch lp = logSoftmax(x);
  for (int t = 0; t < 2; ++t) {
    double sum = 0;
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(std::isfinite(lp.at(0, 0, t, c)));
      sum += std::exp(static_cast<double>(lp.at(0, 0, t, c)));
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << t;
  }
  const double lse = 3.0 + std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0);
  EXPECT_NEAR(lp.at(0, 0, 0, 0), 1.0 - lse, 1e-6);
  EXPECT_NEAR(lp.at(0, 0, 1, 1), -std::log1p(std::exp(-1.0)), 1e-6);
}

TEST(Ops, GatherShift) {
  // lp[t][v] = 10 t + v
  Batch lp = Batch::zeros({3}, 1, 3, 5);
  for (int t = 0; t < 3; ++t)
    for (int v = 0; v < 5; ++v)
      lp.at(0, 0, t, v) = 10.0f * t + v;
  TokenBatch ids = TokenBatch::pack({{4, 2, 3}});
  Batch g0 = gather(lp, ids, 0), g1 = gather(lp, ids, 1);
  EXPECT_EQ(g0.at(0, 0, 0, 0), 4.0f);
  EXPECT_EQ(g0.at(0, 0, 1, 0), 12.0f);
  EXPECT_EQ(g0.at(0, 0, 2, 0), 23.0f);
  EXPECT_EQ(g1.at(0, 0, 0, 0), 0.0f);  // nothing predicts position 0
  EXPECT_EQ(g1.at(0, 0, 1, 0), 2.0f);  // lp[0][ids[1]]
  EXPECT_EQ(g1.at(0, 0, 2, 0), 13.0f); // lp[1][ids[2]]
}

TEST(Ops, SentenceScoreSkipAndFirst) {
  TokenBatch ids = TokenBatch::pack({{3, 7, 8, 1}, {9}});
  Batch g = Batch::zeros(ids.lengths, 1, 4, 1);
  for (int t = 0; t < 4; ++t)
    g.at(0, 0, t, 0) = -1.0f - t;
  g.at(1, 0, 0, 0) = -0.5f;
  auto r = sentenceScore(g, ids, {3, 1}, 0);
  EXPECT_EQ(r[0].tokenLogprobs, (std::vector<float>{0.0f, -2.0f, -3.0f, 0.0f}));
  EXPECT_DOUBLE_EQ(r[0].score, -5.0);
  EXPECT_EQ(r[0].nScored, 2);
  EXPECT_EQ(r[1].nScored, 1);
  auto causal = sentenceScore(g, ids, {}, 1);
  EXPECT_EQ(causal[0].tokenLogprobs, (std::vector<float>{0.0f, -2.0f, -3.0f, -4.0f}));
  EXPECT_EQ(causal[0].nScored, 3);
  EXPECT_EQ(causal[1].nScored, 0);
  EXPECT_EQ(causal[1].score, 0.0);
}

TEST(Ops, MeanPoolExcludesSpecialTokens) {
  TokenBatch ids = TokenBatch::pack({{3, 7, 8, 1}, {3, 1}});
  Batch h = batchOf({{{100, 0}, {1, 2}, {3, 4}, {100, 0}}, {{1, 2}, {3, 6}}}, 4, 2);
  auto pooled = meanPool(h, ids, {3, 1});
  EXPECT_EQ(pooled[0], (std::vector<float>{2.0f, 3.0f}));
  EXPECT_EQ(pooled[1], (std::vector<float>{2.0f, 4.0f})); // only special tokens: all positions
}

TEST(Ops, LinearHandComputed) {
  Matrix W(2, 3);
  W << 1, 2, 3, -1, 0, 1;
  RowVector b(2);
  b << 0.5f, -0.5f;
  Batch x = batchOf({{{1, 1, 1}, {1, 0, -1}}, {{2, 0, 0}}}, 2, 3);
  Batch y = linear(x, W, &b);
  EXPECT_EQ(y.C, 2);
  EXPECT_EQ(y.at(0, 0, 0, 0), 6.5f);
  EXPECT_EQ(y.at(0, 0, 0, 1), -0.5f);
  EXPECT_EQ(y.at(0, 0, 1, 0), -1.5f);
  EXPECT_EQ(y.at(0, 0, 1, 1), -2.5f);
  EXPECT_EQ(y.at(1, 0, 0, 1), -2.5f);
  EXPECT_EQ(y.at(1, 0, 1, 0), 0.0f); // padding row stays zero (not the bias)
  Batch noBias = linear(x, W, nullptr);
  EXPECT_EQ(noBias.at(0, 0, 0, 0), 6.0f);
}

TEST(Ops, EmbedAndPositions) {
  Matrix table(3, 2);
  table << 0, 1, 10, 11, 20, 21;
  TokenBatch ids = TokenBatch::pack({{2, 0}, {1}});
  Batch e = embed(table, ids);
  EXPECT_EQ(e.at(0, 0, 0, 1), 21.0f);
  EXPECT_EQ(e.at(0, 0, 1, 0), 0.0f);
  EXPECT_EQ(e.at(1, 0, 0, 0), 10.0f);
  Batch learned = positions(ids, PositionKind::Learned, &table, 2);
  EXPECT_EQ(learned.at(0, 0, 1, 0), 10.0f);
  EXPECT_EQ(learned.at(1, 0, 1, 0), 0.0f); // padding
  Batch none = positions(ids, PositionKind::None, nullptr, 2);
  for (float v : none.data)
    EXPECT_EQ(v, 0.0f);
  Matrix P = sinusoidalTable(3, 4);
  EXPECT_FLOAT_EQ(P(0, 0), 0.0f);
  EXPECT_FLOAT_EQ(P(0, 1), 1.0f);
  EXPECT_FLOAT_EQ(P(1, 0), std::sin(1.0f));
  EXPECT_FLOAT_EQ(P(1, 1), std::cos(1.0f));
  EXPECT_FLOAT_EQ(P(2, 2), static_cast<float>(std::sin(2.0 / 100.0))); // 10000^(2/4) = 100
  EXPECT_FLOAT_EQ(P(2, 3), static_cast<float>(std::cos(2.0 / 100.0)));
  Batch sin = positions(ids, PositionKind::Sinusoidal, nullptr, 4);
  EXPECT_EQ(sin.at(0, 0, 1, 1), P(1, 1));
}

TEST(Ops, SplitAndMergeHeads) {
  Batch x = batchOf({{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}, {{12, 13, 14, 15, 16, 17}}}, 2, 6);
  Batch h = splitHeads(x, 3);
  EXPECT_EQ(h.H, 3);
  EXPECT_EQ(h.C, 2);
  EXPECT_EQ(h.at(0, 1, 0, 0), 2.0f); // head 1 = features [2, 4)
  EXPECT_EQ(h.at(0, 2, 1, 1), 11.0f);
  EXPECT_EQ(h.at(1, 0, 0, 1), 13.0f);
  Batch back = mergeHeads(h);
  EXPECT_EQ(back.data, x.data);
}

TEST(Ops, MatmulContractsOverValidKeysOnly) {
  // Sentence 0: 2 tokens padded to 3. q = k = v rows.
  Batch q = batchOf({{{1, 0}, {0, 2}}, {{1, 1}, {1, 2}, {3, 1}}}, 3, 2);
  Batch s = matmul(q, q, /*transposeRhs=*/true);
  EXPECT_EQ(s.C, 3);
  EXPECT_EQ(s.at(0, 0, 0, 0), 1.0f);
  EXPECT_EQ(s.at(0, 0, 1, 1), 4.0f);
  EXPECT_EQ(s.at(0, 0, 0, 2), 0.0f); // key padding column
  EXPECT_EQ(s.at(1, 0, 2, 1), 5.0f);
  // Garbage in the key-padding column of the left operand is never read.
  s.at(0, 0, 0, 2) = 1e30f;
  Batch c = matmul(s, q, /*transposeRhs=*/false);
  EXPECT_EQ(c.at(0, 0, 0, 0), 1.0f); // [1, 0] . rows -> 1*[1,0] + 0*[0,2]
  EXPECT_EQ(c.at(0, 0, 0, 1), 0.0f);
  EXPECT_EQ(c.at(0, 0, 1, 1), 8.0f); // [0, 4] -> 4*[0,2]
}

TEST(Ops, AttentionHandComputedAndNoVisibleKey) {
  // One head, d = 2, two tokens, causal mask, scale 1: row 0 sees only key 0.
  Batch q = batchOf({{{1, 0}, {0, 1}}}, 2, 2);
  Batch k = batchOf({{{1, 0}, {0, 1}}}, 2, 2);
  Batch v = batchOf({{{1, 2}, {3, 4}}}, 2, 2);
  Batch out = attention(q, k, v, 1, MaskKind::Causal, 1.0f);
  EXPECT_FLOAT_EQ(out.at(0, 0, 0, 0), 1.0f);
  EXPECT_FLOAT_EQ(out.at(0, 0, 0, 1), 2.0f);
  // Row 1 scores [0, 1]: p = [1/(1+e), e/(1+e)].
  const float p1 = static_cast<float>(std::exp(1.0) / (1.0 + std::exp(1.0)));
  EXPECT_NEAR(out.at(0, 0, 1, 0), (1 - p1) * 1 + p1 * 3, 1e-6);
  EXPECT_NEAR(out.at(0, 0, 1, 1), (1 - p1) * 2 + p1 * 4, 1e-6);
  // A 1-token sentence under the diagonal mask sees nothing: zero context, no NaN.
  Batch one = batchOf({{{5, -3}}}, 1, 2);
  Batch z = attention(one, one, one, 2, MaskKind::Diagonal, 0.5f);
  EXPECT_EQ(z.at(0, 0, 0, 0), 0.0f);
  EXPECT_EQ(z.at(0, 0, 0, 1), 0.0f);
}

TEST(Ops, RelativePositionTerms) {
  EXPECT_EQ(relativeIndex(0, 0, 2), 2);
  EXPECT_EQ(relativeIndex(0, 5, 2), 4); // clipped at +k
  EXPECT_EQ(relativeIndex(5, 0, 2), 0); // clipped at -k
  EXPECT_EQ(relativeIndex(3, 2, 2), 1);
  Matrix rel(3, 2); // k = 1
  rel << 1, 0, 0, 1, 2, 2;
  Batch q = batchOf({{{1, 2}, {3, 4}, {5, 6}}}, 3, 2);
  Batch r = relativeScores(q, q, rel, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0), 2.0f);  // q0 . rel[1]
  EXPECT_EQ(r.at(0, 0, 0, 2), 6.0f);  // q0 . rel[2] (clipped)
  EXPECT_EQ(r.at(0, 0, 2, 0), 5.0f);  // q2 . rel[0]
  Batch p = batchOf({{{0.5f, 0.5f, 0}, {0, 0, 1}, {0.25f, 0.25f, 0.5f}}}, 3, 3);
  Batch v = relativeValues(p, rel, 1);
  EXPECT_EQ(v.at(0, 0, 0, 0), 0.5f * 0 + 0.5f * 2); // rel[1], rel[2]
  EXPECT_EQ(v.at(0, 0, 0, 1), 0.5f * 1 + 0.5f * 2);
  EXPECT_EQ(v.at(0, 0, 1, 0), 2.0f);                  // j - i = 1: rel[2]
  EXPECT_EQ(v.at(0, 0, 2, 0), 0.5f);                  // rel[0], rel[0], rel[1]
}

TEST(Ops, InterpolateAndScale) {
  Batch a = batchOf({{{std::log(0.2f), -kInf}}}, 1, 2);
  Batch b = batchOf({{{std::log(0.6f), std::log(0.5f)}}}, 1, 2);
  Batch m = interpolate(a, b, 0.25);
  EXPECT_NEAR(m.at(0, 0, 0, 0), std::log(0.75 * 0.2 + 0.25 * 0.6), 1e-6);
  EXPECT_NEAR(m.at(0, 0, 0, 1), std::log(0.25 * 0.5), 1e-6);
  EXPECT_EQ(scale(b, 2.0f).at(0, 0, 0, 1), 2.0f * std::log(0.5f));
}

TEST(Ops, MaskAndPredictKeepsRowOfEachCopy) {
  // Region: row t = [id at t, number of mask tokens in the sentence].
  auto region = [](const TokenBatch &ids) {
    Batch out = Batch::zeros(ids.lengths, 1, ids.N, 2);
    for (int64_t b = 0; b < ids.B; ++b) {
      int masks = 0;
      for (int64_t t = 0; t < ids.lengths[b]; ++t)
        masks += ids.at(b, t) == 4;
      for (int64_t t = 0; t < ids.lengths[b]; ++t) {
        out.at(b, 0, t, 0) = static_cast<float>(ids.at(b, t));
        out.at(b, 0, t, 1) = static_cast<float>(masks);
      }
    }
    return out;
  };
  TokenBatch ids = TokenBatch::pack({{7, 8, 9}, {5}});
  Batch r = maskAndPredict(ids, 4, region);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < ids.lengths[b]; ++t) {
      EXPECT_EQ(r.at(b, 0, t, 0), 4.0f); // row t comes from the copy with t masked
      EXPECT_EQ(r.at(b, 0, t, 1), 1.0f); // exactly one position masked per copy
    }
  EXPECT_EQ(r.at(1, 0, 1, 0), 0.0f); // padding
}

//===----------------------------------------------------------------------===//
// Whole model
//===----------------------------------------------------------------------===//

TEST(Model, MatchesNaiveDoublePrecisionImplementation) {
  uint32_t seed = 1;
  for (const ModelSpec &spec : specVariants()) {
    SCOPED_TRACE(describe(spec));
    WeightSet w = randomWeights(spec, seed++);
    std::vector<std::vector<int32_t>> sentences = {randomSentence(spec, 7, seed), randomSentence(spec, 3, seed + 1),
                                                   randomSentence(spec, 1, seed + 2)};
    auto results = score(spec, w, sentences, 2);
    auto embeddings = embed(spec, w, sentences, 2);
    for (size_t b = 0; b < sentences.size(); ++b) {
      ScoreResult want = naiveScore(spec, w, sentences[b]);
      ASSERT_EQ(results[b].tokenLogprobs.size(), want.tokenLogprobs.size());
      for (size_t t = 0; t < want.tokenLogprobs.size(); ++t)
        EXPECT_NEAR(results[b].tokenLogprobs[t], want.tokenLogprobs[t], 2e-4) << "sentence " << b << " pos " << t;
      EXPECT_NEAR(results[b].score, want.score, 1e-3);
      EXPECT_EQ(results[b].nScored, want.nScored);
      // Embedding: mean of the naive states over non-special positions (single pass only).
      if (spec.method != ScoreMethod::MaskAndPredict) {
        const auto weights = naive::naiveWeights(w);
        Rows h = NaiveModel(spec, weights).hidden(sentences[b]);
        std::vector<double> mean(spec.dims.dModel, 0.0);
        int count = 0;
        for (size_t t = 0; t < h.size(); ++t) {
          int32_t id = sentences[b][t];
          if (sentences[b].size() > 2 && (id == spec.tokens.bos || id == spec.tokens.eos))
            continue;
          for (size_t c = 0; c < mean.size(); ++c)
            mean[c] += h[t][c];
          ++count;
        }
        for (size_t c = 0; c < mean.size(); ++c)
          EXPECT_NEAR(embeddings[b][c], mean[c] / count, 2e-4) << "sentence " << b << " feature " << c;
      }
    }
  }
}

TEST(Model, MixedLengthBatchEqualsEachSentenceAlone) {
  uint32_t seed = 100;
  for (const ModelSpec &spec : specVariants()) {
    SCOPED_TRACE(describe(spec));
    WeightSet w = randomWeights(spec, seed++);
    std::vector<std::vector<int32_t>> batch = {randomSentence(spec, 9, seed), randomSentence(spec, 2, seed + 1),
                                               randomSentence(spec, 16, seed + 2), randomSentence(spec, 1, seed + 3),
                                               randomSentence(spec, 5, seed + 4)};
    auto together = score(spec, w, batch, 1);
    auto pooled = embed(spec, w, batch, 1);
    for (size_t b = 0; b < batch.size(); ++b) {
      auto alone = score(spec, w, {batch[b]}, 1);
      EXPECT_TRUE(bitEqual(together[b], alone[0])) << "sentence " << b;
      EXPECT_TRUE(bitEqual(pooled[b], embed(spec, w, {batch[b]}, 1)[0])) << "sentence " << b;
    }
    // The same sentence in a different batch and position.
    auto reordered = score(spec, w, {batch[4], batch[2], batch[0]}, 1);
    EXPECT_TRUE(bitEqual(reordered[0], together[4]));
    EXPECT_TRUE(bitEqual(reordered[2], together[0]));
  }
}

TEST(Model, ThreadCountDoesNotChangeResults) {
  for (Family f : {Family::UniLM, Family::BiLM, Family::TTA}) {
    ModelSpec spec = makeSpec(f);
    spec.dims.maxLen = 64; // many chunks of kMaxBatchRows rows
    WeightSet w = randomWeights(spec, 7);
    std::vector<std::vector<int32_t>> sentences;
    for (int i = 0; i < 40; ++i)
      sentences.push_back(randomSentence(spec, 1 + (i * 7) % (f == Family::BiLM ? 12 : 64), 1000 + i));
    auto one = score(spec, w, sentences, 1);
    auto two = score(spec, w, sentences, 2);
    auto all = score(spec, w, sentences, 0);
    auto e1 = embed(spec, w, sentences, 1), e2 = embed(spec, w, sentences, 2);
    for (size_t b = 0; b < sentences.size(); ++b) {
      EXPECT_TRUE(bitEqual(one[b], two[b])) << toString(f) << " sentence " << b;
      EXPECT_TRUE(bitEqual(one[b], all[b])) << toString(f) << " sentence " << b;
      EXPECT_TRUE(bitEqual(e1[b], e2[b])) << toString(f) << " sentence " << b;
    }
  }
}

TEST(Model, CausalPredictionIgnoresLaterTokens) {
  for (NormPlacement norm : {NormPlacement::Post, NormPlacement::Pre}) {
    ModelSpec spec = makeSpec(Family::UniLM);
    spec.norm = norm;
    spec.relativePositions = 2;
    WeightSet w = randomWeights(spec, 11);
    std::vector<int32_t> x = randomSentence(spec, 10, 12);
    const int changed = 6;
    std::vector<int32_t> y = x;
    y[changed] = x[changed] == 5 ? 6 : 5;
    auto lx = logprobs(spec, w, x), ly = logprobs(spec, w, y);
    for (int t = 0; t < changed; ++t)
      EXPECT_EQ(lx[t], ly[t]) << "row " << t << " saw a later token";
    EXPECT_NE(lx[changed], ly[changed]); // the test is sensitive
    // Scores: lp[t] for t <= changed condition only on x_{<t}; lp[changed] reads the new target.
    auto sx = score(spec, w, {x})[0], sy = score(spec, w, {y})[0];
    for (int t = 0; t < changed; ++t)
      EXPECT_EQ(sx.tokenLogprobs[t], sy.tokenLogprobs[t]) << t;
    EXPECT_EQ(sy.tokenLogprobs[changed], ly[changed - 1][y[changed]]);
  }
}

TEST(Model, TTASelfUnknown) {
  std::vector<ModelSpec> specs;
  specs.push_back(makeSpec(Family::TTA));
  ModelSpec pre = makeSpec(Family::TTA);
  pre.norm = NormPlacement::Pre;
  pre.relativePositions = 3;
  pre.dims.layers = 3;
  specs.push_back(pre);
  ModelSpec maskPos = makeSpec(Family::TTA);
  maskPos.firstQuery = FirstQuery::MaskPosition;
  maskPos.position = PositionKind::Sinusoidal;
  specs.push_back(maskPos);
  for (const ModelSpec &spec : specs) {
    SCOPED_TRACE(describe(spec));
    WeightSet w = randomWeights(spec, 21);
    std::vector<int32_t> x = randomSentence(spec, 8, 22);
    auto base = logprobs(spec, w, x);
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> y = x;
      y[i] = x[i] == 9 ? 10 : 9;
      auto changed = logprobs(spec, w, y);
      EXPECT_EQ(changed[i], base[i]) << "row " << i << " depends on x_" << i;
      EXPECT_NE(changed[(i + 1) % 8], base[(i + 1) % 8]); // other rows do see x_i
    }
  }
}

TEST(Model, EmbeddingFirstQueryIsNotSelfUnknown) {
  // Control: with first_query = embedding, row i reads x_i through the query stream.
  ModelSpec spec = makeSpec(Family::TTA);
  spec.firstQuery = FirstQuery::Embedding;
  WeightSet w = randomWeights(spec, 23);
  std::vector<int32_t> x = randomSentence(spec, 6, 24), y = x;
  y[2] = x[2] == 9 ? 10 : 9;
  EXPECT_NE(logprobs(spec, w, x)[2], logprobs(spec, w, y)[2]);
}

TEST(Model, MaskAndPredictIsSelfUnknown) {
  for (NormPlacement norm : {NormPlacement::Post, NormPlacement::Pre}) {
    ModelSpec spec = makeSpec(Family::BiLM);
    spec.norm = norm;
    spec.skipSpecial = false;
    WeightSet w = randomWeights(spec, 31);
    std::vector<int32_t> x = randomSentence(spec, 7, 32);
    auto sx = score(spec, w, {x})[0];
    for (int i = 0; i < 7; ++i) {
      std::vector<int32_t> masked = x;
      masked[i] = static_cast<int32_t>(spec.tokens.mask);
      auto dist = logprobs(spec, w, masked); // copy i: independent of x_i by construction
      std::vector<int32_t> y = x;
      y[i] = x[i] == 9 ? 10 : 9;
      auto sy = score(spec, w, {y})[0];
      EXPECT_EQ(sx.tokenLogprobs[i], dist[i][x[i]]) << i;
      EXPECT_EQ(sy.tokenLogprobs[i], dist[i][y[i]]) << i;
    }
    // Control: single-pass scoring of the same unmasked biLM does read x_i.
    spec.method = ScoreMethod::SinglePass;
    std::vector<int32_t> y = x;
    y[3] = x[3] == 9 ? 10 : 9;
    EXPECT_NE(logprobs(spec, w, x)[3], logprobs(spec, w, y)[3]);
  }
}

TEST(Model, MaskAndPredictEmbeddingUsesEachCopy) {
  ModelSpec spec = makeSpec(Family::BiLM);
  WeightSet w = randomWeights(spec, 41);
  std::vector<int32_t> x = randomSentence(spec, 6, 42);
  std::vector<double> mean(spec.dims.dModel, 0.0);
  for (int i = 1; i < 5; ++i) { // bos at 0 and eos at 5 are excluded
    std::vector<int32_t> masked = x;
    masked[i] = static_cast<int32_t>(spec.tokens.mask);
    auto h = hiddenStates(spec, w, masked);
    for (int c = 0; c < spec.dims.dModel; ++c)
      mean[c] += h[i][c] / 4.0;
  }
  auto e = embed(spec, w, {x})[0];
  for (int c = 0; c < spec.dims.dModel; ++c)
    EXPECT_NEAR(e[c], mean[c], 1e-6) << c;
}

TEST(Model, OneTokenSentencesAreFinite) {
  for (ModelSpec spec : specVariants()) {
    SCOPED_TRACE(describe(spec));
    for (MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::Anticausal, MaskKind::Diagonal}) {
      spec.mask = mask;
      if (spec.method == ScoreMethod::Causal && mask != MaskKind::Causal)
        continue;
      WeightSet w = randomWeights(spec, 51);
      for (int32_t id : {3, 7}) { // a special token and an ordinary one
        auto r = score(spec, w, {{id}})[0];
        ASSERT_EQ(r.tokenLogprobs.size(), 1u);
        EXPECT_TRUE(allFinite(r.tokenLogprobs));
        EXPECT_TRUE(std::isfinite(r.score));
        EXPECT_TRUE(allFinite(embed(spec, w, {{id}})[0]));
        EXPECT_TRUE(allFinite(logprobs(spec, w, {id})[0]));
      }
    }
  }
}

TEST(Model, OddSizes) {
  for (int layers : {3, 5}) {
    for (ModelSpec spec : specVariants()) {
      spec.dims = {53, 20, 72, 6, 100, layers};
      SCOPED_TRACE(describe(spec) + " layers=" + std::to_string(layers));
      WeightSet w = randomWeights(spec, 60 + layers);
      std::vector<std::vector<int32_t>> sentences = {randomSentence(spec, 11, 61), randomSentence(spec, 20, 62),
                                                     randomSentence(spec, 1, 63)};
      auto results = score(spec, w, sentences, 2);
      for (size_t b = 0; b < sentences.size(); ++b) {
        EXPECT_TRUE(allFinite(results[b].tokenLogprobs));
        EXPECT_TRUE(bitEqual(results[b], score(spec, w, {sentences[b]}, 1)[0]));
      }
      // Spot-check against the naive implementation on the shortest multi-token sentence.
      ScoreResult want = naiveScore(spec, w, sentences[0]);
      for (size_t t = 0; t < want.tokenLogprobs.size(); ++t)
        EXPECT_NEAR(results[0].tokenLogprobs[t], want.tokenLogprobs[t], 5e-4) << t;
      for (const auto &row : logprobs(spec, w, sentences[1])) {
        double sum = 0;
        for (float v : row)
          sum += std::exp(static_cast<double>(v));
        EXPECT_NEAR(sum, 1.0, 1e-4);
      }
    }
  }
}

TEST(Model, ScoreSumsAndCounts) {
  for (bool skip : {true, false}) {
    for (Family f : {Family::UniLM, Family::BiLM, Family::TTA}) {
      ModelSpec spec = makeSpec(f);
      spec.skipSpecial = skip;
      WeightSet w = randomWeights(spec, 71);
      std::vector<int32_t> x = randomSentence(spec, 8, 72);
      x[4] = static_cast<int32_t>(spec.tokens.eos); // a special token inside the sentence too
      auto r = score(spec, w, {x})[0];
      int64_t expected = 8;
      if (f == Family::UniLM)
        expected -= 1; // position 0
      if (skip)
        expected -= f == Family::UniLM ? 2 : 3; // bos (already unscored under causal), two eos
      EXPECT_EQ(r.nScored, expected) << toString(f) << " skip=" << skip;
      double sum = 0;
      for (float v : r.tokenLogprobs)
        sum += v;
      EXPECT_DOUBLE_EQ(r.score, sum);
      if (skip) {
        EXPECT_EQ(r.tokenLogprobs[0], 0.0f);
        EXPECT_EQ(r.tokenLogprobs[4], 0.0f);
        EXPECT_EQ(r.tokenLogprobs[7], 0.0f);
      } else if (f != Family::UniLM) {
        EXPECT_LT(r.tokenLogprobs[0], 0.0f);
      }
      EXPECT_EQ(r.tokenLogprobs.size(), 8u);
      if (f == Family::UniLM) {
        EXPECT_EQ(r.tokenLogprobs[0], 0.0f);
      }
    }
  }
}

TEST(Model, UntiedHeadWithEmbeddingMatrixEqualsTied) {
  ModelSpec tied = makeSpec(Family::TTA);
  WeightSet w = randomWeights(tied, 81);
  ModelSpec untied = tied;
  untied.tied = false;
  WeightSet wu = w;
  wu.tensors["head.output.weight"] = w.get("embed.token");
  std::vector<int32_t> x = randomSentence(tied, 9, 82);
  EXPECT_TRUE(bitEqual(score(tied, w, {x})[0], score(untied, wu, {x})[0]));
}

TEST(Model, EmbeddingIsMeanOfHiddenStates) {
  ModelSpec spec = makeSpec(Family::TTA);
  spec.norm = NormPlacement::Pre;
  WeightSet w = randomWeights(spec, 91);
  std::vector<int32_t> x = randomSentence(spec, 7, 92);
  auto h = hiddenStates(spec, w, x);
  auto e = embed(spec, w, {x, {3, 1}})[0];
  for (int c = 0; c < spec.dims.dModel; ++c) {
    double mean = 0;
    for (int t = 1; t < 6; ++t)
      mean += h[t][c] / 5.0;
    EXPECT_NEAR(e[c], mean, 1e-6);
  }
}

TEST(Model, InputValidationNamesSentenceAndPosition) {
  ModelSpec spec = makeSpec(Family::TTA);
  WeightSet w = randomWeights(spec, 1);
  auto message = [&](const std::vector<std::vector<int32_t>> &s) {
    try {
      score(spec, w, s);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message({{3, 5, 1}, {3, 5, 23, 1}});
  EXPECT_NE(m.find("sentence 1"), std::string::npos) << m;
  EXPECT_NE(m.find("position 2"), std::string::npos) << m;
  EXPECT_NE(m.find("23"), std::string::npos) << m;
  m = message({{3, 1}, {-1}});
  EXPECT_NE(m.find("sentence 1, position 0"), std::string::npos) << m;
  m = message({{3, 1}, {}});
  EXPECT_NE(m.find("sentence 1"), std::string::npos) << m;
  EXPECT_NE(m.find("length 0"), std::string::npos) << m;
  m = message({std::vector<int32_t>(17, 5)});
  EXPECT_NE(m.find("sentence 0"), std::string::npos) << m;
  EXPECT_NE(m.find("length 17"), std::string::npos) << m;
  EXPECT_THROW(embed(spec, w, {{99}}), std::invalid_argument);
  EXPECT_THROW(logprobs(spec, w, {}), std::invalid_argument);
  EXPECT_NO_THROW(score(spec, w, std::vector<std::vector<int32_t>>{}));
}

TEST(Model, UnsupportedFamiliesAndMasksThrow) {
  for (Family f : {Family::Diformer}) { // ngram executes since issue 18 (tests/unit/NGramTest.cpp)
    ModelSpec spec = makeSpec(Family::UniLM);
    WeightSet w = randomWeights(spec, 1);
    spec.family = f;
    try {
      score(spec, w, {{3, 5, 1}});
      ADD_FAILURE() << "no error for " << toString(f);
    } catch (const std::invalid_argument &e) {
      std::string m = e.what();
      EXPECT_NE(m.find(toString(f)), std::string::npos) << m;
      EXPECT_NE(m.find("executes in a later release"), std::string::npos) << m;
    }
    EXPECT_THROW(embed(spec, w, {{3, 5, 1}}), std::invalid_argument);
  }
  ModelSpec spec = makeSpec(Family::BiLM);
  WeightSet w = randomWeights(spec, 1);
  spec.mask = MaskKind::Directional;
  EXPECT_THROW(score(spec, w, {{3, 5, 1}}), std::invalid_argument);
}

TEST(Model, MissingOrMisshapenWeightNamesTheTensor) {
  ModelSpec spec = makeSpec(Family::TTA);
  spec.relativePositions = 2;
  WeightSet w = randomWeights(spec, 1);
  WeightSet missing = w;
  missing.tensors.erase("layers.1.attn.rel_v");
  try {
    score(spec, missing, {{3, 5, 1}});
    ADD_FAILURE() << "no error";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.attn.rel_v"), std::string::npos) << e.what();
  }
  WeightSet misshapen = w;
  misshapen.tensors["layers.0.ffn.in.weight"].shape = {16, 24};
  try {
    score(spec, misshapen, {{3, 5, 1}});
    ADD_FAILURE() << "no error";
  } catch (const WeightError &e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.ffn.in.weight"), std::string::npos) << e.what();
  }
}

} // namespace
