//===- GradTest.cpp - reference::lossAndGrad vs finite differences --------===//
//
// The whole-model gradient of the reference executor against central finite
// differences of an independent double-precision implementation of the loss
// (plain loops over runtime/SEMANTICS.md and issue 14's contract: tests/unit/NaiveModel.h),
// for unilm, bilm and T-TA on tiny odd sizes (d_model 12, 3 heads, d_ff 20,
// vocab 23, max_len 9, 2 layers), with and without label smoothing, tied and
// untied, pre and post norm, every supported option; a batch of 3 ragged
// sentences with rows (and a sentence) without target. Plus: the loss equals the
// scoring forward's, thread-count bit-identity, batch invariance, tied = untied
// with equal tables, and input errors.
//
// FD: the gradient of the double loss at the (float) weights, step 1e-5:
// truncation ~h^2 = 1e-10 and rounding ~1e-16 / 1e-5 = 1e-11, relative to O(1)
// gradients; the float gradient is compared with it per tensor (see kTolerance).
//
//===----------------------------------------------------------------------===//
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/ModelWeights.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/NaiveModel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace lmcc;
using namespace lmcc::reference;

namespace {

using naive::naiveWeights;
using naive::NaiveModel;
using naive::Rows;
using naive::Vec;
using Ids = std::vector<std::vector<int32_t>>;

/// Per tensor: max |float grad - FD| over the checked entries, relative to the tensor's largest
/// gradient (or 1e-2 of the largest gradient overall when the tensor's is smaller, as for the
/// attention key biases whose true gradient is 0). Float forward and backward through 2 layers,
/// LayerNorms and a 23-way softmax: measured worst 5.4e-6 (see the printed table); 2e-5 leaves
/// a margin and is far below what any wrong or missing term gives (O(1)).
constexpr double kTolerance = 2e-5;

//===----------------------------------------------------------------------===//
// Specs, weights, batches
//===----------------------------------------------------------------------===//

ModelSpec tinySpec(Family family) {
  ModelSpec s;
  s.name = "grad";
  s.family = family;
  s.dims = {23, 9, 12, 3, 20, 2}; // vocab, max_len, d_model, heads, d_ff, layers
  s.eps = 1e-5;
  applyFamilyDefaults(s);
  return s;
}

/// Random weights with non-trivial scales (outputs far from uniform), deterministic in seed.
WeightSet randomWeights(const ModelSpec &s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  WeightSet w;
  for (const TensorInfo &info : expectedTensors(s)) {
    const std::string &name = info.name;
    Tensor t;
    t.shape = info.shape;
    const bool isNorm = name.find("norm.") != std::string::npos;
    const bool isBias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    float mean = 0, stdev;
    if (isNorm && !isBias) {
      mean = 1.0f;
      stdev = 0.2f;
    } else if (isBias) {
      stdev = 0.2f;
    } else if (name == "embed.token" || name == "embed.position" || name == "head.output.weight" ||
               name.find("rel_") != std::string::npos) {
      stdev = 0.7f;
    } else {
      stdev = 1.2f / std::sqrt(static_cast<float>(t.shape[1]));
    }
    for (int64_t k = 0; k < t.numel(); ++k)
      t.data.push_back(mean + stdev * normal(rng));
    w.tensors[name] = std::move(t);
  }
  return w;
}

struct TrainBatch {
  Ids inputs, targets;
};

/// 3 ragged sentences (max_len, 4, 6 tokens) of ids >= 5 between bos and eos; targets random
/// with about a third of the rows -1; sentence 2 has no target at all when `emptySentence`.
/// bilm inputs carry [MASK] at a few positions, as the masked objective leaves them.
TrainBatch randomBatch(const ModelSpec &s, uint32_t seed, bool emptySentence) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(5, static_cast<int32_t>(s.dims.vocab) - 1);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(s.dims.vocab) - 1);
  std::uniform_real_distribution<double> u(0, 1);
  TrainBatch batch;
  for (int n : {static_cast<int>(s.dims.maxLen), 4, 6}) {
    std::vector<int32_t> x(n), y(n);
    for (int t = 0; t < n; ++t) {
      x[t] = token(rng);
      y[t] = u(rng) < 0.35 ? -1 : any(rng);
    }
    x.front() = static_cast<int32_t>(s.tokens.bos);
    x.back() = static_cast<int32_t>(s.tokens.eos);
    if (s.family == Family::BiLM)
      x[1 + n / 3] = static_cast<int32_t>(s.tokens.mask);
    batch.inputs.push_back(x);
    batch.targets.push_back(y);
  }
  if (emptySentence)
    std::fill(batch.targets[2].begin(), batch.targets[2].end(), -1);
  return batch;
}

//===----------------------------------------------------------------------===//
// The loss in double, independently of Ops.cpp / Executor.cpp
//===----------------------------------------------------------------------===//

/// (1/T) sum CE over rows with target >= 0, label smoothing e.
double naiveLoss(const ModelSpec &s, const NaiveModel &model, const TrainBatch &batch, double e) {
  double sum = 0;
  int64_t T = 0;
  for (size_t b = 0; b < batch.inputs.size(); ++b) {
    Rows lp = model.logprobs(model.hidden(batch.inputs[b], static_cast<int64_t>(b)));
    for (size_t t = 0; t < lp.size(); ++t) {
      const int32_t y = batch.targets[b][t];
      if (y < 0)
        continue;
      double all = 0;
      for (double v : lp[t])
        all += v;
      sum += -(1 - e) * lp[t][y] - e / s.dims.vocab * all;
      ++T;
    }
  }
  return sum / T;
}

//===----------------------------------------------------------------------===//
// The FD comparison
//===----------------------------------------------------------------------===//

double worstSeen = 0;
std::string worstWhat;

/// Checks lossAndGrad against FD of naiveLoss: every entry of tensors of <= 32 entries, 32 sampled
/// entries of larger ones, and one random directional derivative over each whole tensor.
void checkAgainstFiniteDifferences(const ModelSpec &s, uint32_t seed, double e, bool emptySentence) {
  SCOPED_TRACE(std::string(toString(s.family)) + " seed " + std::to_string(seed) + " e " + std::to_string(e));
  const WeightSet weights = randomWeights(s, seed);
  const TrainBatch batch = randomBatch(s, seed + 1000, emptySentence);
  const LossAndGrad lg = lossAndGrad(s, weights, batch.inputs, batch.targets, e);

  // Names and shapes: exactly the model's tensors.
  const std::vector<TensorInfo> expected = expectedTensors(s);
  ASSERT_EQ(lg.grads.tensors.size(), expected.size());
  for (const TensorInfo &info : expected) {
    ASSERT_TRUE(lg.grads.has(info.name)) << info.name;
    ASSERT_EQ(lg.grads.get(info.name).shape, info.shape) << info.name;
  }

  std::map<std::string, Vec> w = naiveWeights(weights);
  const NaiveModel naive(s, w);
  const double loss0 = naiveLoss(s, naive, batch, e);
  EXPECT_NEAR(lg.loss, loss0, 2e-6 * loss0) << "loss";
  int64_t T = 0;
  for (const auto &y : batch.targets)
    for (int32_t v : y)
      T += v >= 0;
  EXPECT_EQ(lg.targets, T);

  double globalMax = 0;
  for (const auto &[name, t] : lg.grads.tensors)
    for (float g : t.data)
      globalMax = std::max(globalMax, static_cast<double>(std::fabs(g)));
  ASSERT_GT(globalMax, 1e-3);

  const double h = 1e-5;
  std::mt19937 rng(seed);
  double worstHere = 0;
  std::string worstTensor;
  for (const auto &[name, grad] : lg.grads.tensors) {
    Vec &theta = w.at(name);
    const std::vector<float> &g = grad.data;
    double tensorMax = 0;
    for (float v : g)
      tensorMax = std::max(tensorMax, static_cast<double>(std::fabs(v)));
    const double scale = std::max(tensorMax, 1e-2 * globalMax);
    std::vector<size_t> entries;
    if (theta.size() <= 32) {
      for (size_t i = 0; i < theta.size(); ++i)
        entries.push_back(i);
    } else {
      std::uniform_int_distribution<size_t> pick(0, theta.size() - 1);
      for (int i = 0; i < 32; ++i)
        entries.push_back(pick(rng));
    }
    double err = 0;
    for (size_t i : entries) {
      const double saved = theta[i];
      theta[i] = saved + h;
      const double plus = naiveLoss(s, naive, batch, e);
      theta[i] = saved - h;
      const double minus = naiveLoss(s, naive, batch, e);
      theta[i] = saved;
      err = std::max(err, std::fabs(g[i] - (plus - minus) / (2 * h)));
    }
    // Directional derivative along a random direction over the whole tensor.
    std::normal_distribution<double> normal(0, 1);
    Vec dir(theta.size());
    double analytic = 0, magnitude = 0;
    for (size_t i = 0; i < dir.size(); ++i) {
      dir[i] = normal(rng);
      analytic += g[i] * dir[i];
      magnitude += std::fabs(g[i] * dir[i]);
    }
    const Vec saved = theta;
    for (size_t i = 0; i < dir.size(); ++i)
      theta[i] = saved[i] + h * dir[i];
    const double plus = naiveLoss(s, naive, batch, e);
    for (size_t i = 0; i < dir.size(); ++i)
      theta[i] = saved[i] - h * dir[i];
    const double minus = naiveLoss(s, naive, batch, e);
    theta = saved;
    const double dirErr = std::fabs(analytic - (plus - minus) / (2 * h)) /
                          std::max(magnitude, 1e-2 * globalMax * std::sqrt(static_cast<double>(dir.size())));
    const double rel = std::max(err / scale, dirErr);
    EXPECT_LE(rel, kTolerance) << name << ": max |grad| " << tensorMax << ", entry error " << err
                               << ", directional error " << dirErr;
    if (rel > worstHere) {
      worstHere = rel;
      worstTensor = name;
    }
  }
  std::printf("  FD %-6s %-5s %-4s %-6s e=%.1f kv=%-9s fq=%-13s pos=%-10s rel=%lld: worst %.2e (%s)\n",
              toString(s.family), toString(s.norm), s.tied ? "tied" : "untd", toString(s.mask), e,
              toString(s.keysValues), toString(s.firstQuery), toString(s.position),
              static_cast<long long>(s.relativePositions), worstHere, worstTensor.c_str());
  if (worstHere > worstSeen) {
    worstSeen = worstHere;
    worstWhat = std::string(toString(s.family)) + " " + worstTensor;
  }
}

bool bitEqual(const LossAndGrad &a, const LossAndGrad &b) {
  if (std::memcmp(&a.loss, &b.loss, sizeof(double)) != 0 || a.targets != b.targets ||
      a.grads.tensors.size() != b.grads.tensors.size())
    return false;
  for (const auto &[name, t] : a.grads.tensors) {
    const Tensor &u = b.grads.get(name);
    if (t.shape != u.shape || std::memcmp(t.data.data(), u.data.data(), t.data.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Finite differences, family by family
//===----------------------------------------------------------------------===//

TEST(Grad, UniLMMatchesFiniteDifferences) {
  ModelSpec s = tinySpec(Family::UniLM); // post-norm, tied, head transform, learned positions
  checkAgainstFiniteDifferences(s, 1, 0.0, false);
  s.norm = NormPlacement::Pre;
  s.tied = false;
  s.activation = Activation::Relu;
  s.keysValues = KeyValueSource::Embedding;
  s.position = PositionKind::None;
  checkAgainstFiniteDifferences(s, 2, 0.1, true);
  s = tinySpec(Family::UniLM);
  s.headTransform = false;
  s.headBias = false;
  s.embeddingNorm = false;
  s.relativePositions = 2;
  checkAgainstFiniteDifferences(s, 3, 0.1, false);
}

TEST(Grad, BiLMMatchesFiniteDifferences) {
  ModelSpec s = tinySpec(Family::BiLM); // no mask, hidden keys/values, [MASK] in the inputs
  checkAgainstFiniteDifferences(s, 4, 0.1, false);
  s.norm = NormPlacement::Pre;
  s.tied = false;
  s.position = PositionKind::Sinusoidal;
  s.activation = Activation::GeluTanh;
  s.mask = MaskKind::Anticausal;
  s.relativePositions = 3;
  checkAgainstFiniteDifferences(s, 5, 0.0, true);
}

TEST(Grad, TTAMatchesFiniteDifferences) {
  ModelSpec s = tinySpec(Family::TTA); // diagonal mask, embedding keys/values, position query
  checkAgainstFiniteDifferences(s, 6, 0.0, true);
  s.firstQuery = FirstQuery::MaskPosition; // E[MASK] reaches embed.token's gradient
  s.norm = NormPlacement::Pre;
  s.relativePositions = 2;
  s.tied = false;
  checkAgainstFiniteDifferences(s, 7, 0.1, false);
  s = tinySpec(Family::TTA);
  s.firstQuery = FirstQuery::Embedding;
  s.embeddingNorm = false;
  s.headTransform = false;
  s.position = PositionKind::Sinusoidal;
  s.keysValues = KeyValueSource::Hidden;
  checkAgainstFiniteDifferences(s, 8, 0.1, false);
  s = tinySpec(Family::TTA);
  s.firstQuery = FirstQuery::MaskPosition;
  s.embeddingNorm = false;
  checkAgainstFiniteDifferences(s, 9, 0.0, false);
}

/// [train] attention_dropout: the probabilities' masks (the contract's Philox keys, computed here) in the double
/// forward; the reference's backward through them.
TEST(Grad, AttentionDropoutMatchesFiniteDifferences) {
  ModelSpec s = tinySpec(Family::UniLM);
  s.train.attentionDropout = 0.3;
  s.relativePositions = 2; // relative values multiply the dropped probabilities too
  checkAgainstFiniteDifferences(s, 11, 0.0, false);
  s = tinySpec(Family::TTA);
  s.train.attentionDropout = 0.5, s.train.seed = 12345;
  checkAgainstFiniteDifferences(s, 12, 0.1, true);
  // The masks are not the identity: the loss moves.
  const WeightSet weights = randomWeights(s, 12);
  const TrainBatch batch = randomBatch(s, 1012, true);
  ModelSpec off = s;
  off.train.attentionDropout = 0;
  EXPECT_GT(std::fabs(lossAndGrad(s, weights, batch.inputs, batch.targets, 0.1).loss -
                      lossAndGrad(off, weights, batch.inputs, batch.targets, 0.1).loss),
            1e-3);
}

TEST(Grad, WorstErrorSummary) {
  std::printf("  worst FD error over the model tests run so far: %.2e (%s)\n", worstSeen, worstWhat.c_str());
  SUCCEED();
}

//===----------------------------------------------------------------------===//
// Consistency with scoring, determinism, batch invariance
//===----------------------------------------------------------------------===//

TEST(Grad, LossIsTheScoringForwardsCrossEntropy) {
  for (Family f : {Family::UniLM, Family::BiLM, Family::TTA}) {
    ModelSpec s = tinySpec(f);
    WeightSet w = randomWeights(s, 11);
    TrainBatch batch = randomBatch(s, 12, false);
    for (double e : {0.0, 0.2}) {
      LossAndGrad lg = lossAndGrad(s, w, batch.inputs, batch.targets, e);
      double sum = 0;
      int64_t T = 0;
      for (size_t b = 0; b < batch.inputs.size(); ++b) {
        std::vector<std::vector<float>> lp = reference::logprobs(s, w, batch.inputs[b]);
        for (size_t t = 0; t < lp.size(); ++t) {
          if (batch.targets[b][t] < 0)
            continue;
          double all = 0;
          for (float v : lp[t])
            all += v;
          sum += -(1 - e) * lp[t][batch.targets[b][t]] - e / s.dims.vocab * all;
          ++T;
        }
      }
      EXPECT_EQ(lg.targets, T);
      EXPECT_NEAR(lg.loss, sum / T, 1e-6 * lg.loss) << toString(f) << " e " << e;
    }
  }
}

TEST(Grad, ThreadCountDoesNotChangeAnyBit) {
  ModelSpec s = tinySpec(Family::TTA);
  s.relativePositions = 2;
  s.firstQuery = FirstQuery::MaskPosition;
  WeightSet w = randomWeights(s, 13);
  // 20 sentences: more than one block of parallel per-sentence contributions.
  Ids inputs, targets;
  for (int i = 0; i < 7; ++i) {
    TrainBatch b = randomBatch(s, 100 + i, i % 3 == 0);
    inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
    targets.insert(targets.end(), b.targets.begin(), b.targets.end());
  }
  inputs.pop_back();
  targets.pop_back();
  LossAndGrad one = lossAndGrad(s, w, inputs, targets, 0.1, 1);
  for (int threads : {2, 3, 0})
    EXPECT_TRUE(bitEqual(one, lossAndGrad(s, w, inputs, targets, 0.1, threads))) << threads << " threads";
}

TEST(Grad, SentencesWithoutTargetChangeNothingAndPaddingIsInvisible) {
  for (Family f : {Family::UniLM, Family::BiLM, Family::TTA}) {
    ModelSpec s = tinySpec(f);
    s.relativePositions = f == Family::BiLM ? 2 : 0;
    WeightSet w = randomWeights(s, 14);
    TrainBatch batch = randomBatch(s, 15, false);
    // Sentence 1 (4 tokens) alone, then padded among two longer sentences without targets.
    Ids alone = {batch.inputs[1]}, aloneTargets = {batch.targets[1]};
    Ids padded = {batch.inputs[0], batch.inputs[1], batch.inputs[2]};
    Ids paddedTargets = {std::vector<int32_t>(batch.inputs[0].size(), -1), batch.targets[1],
                         std::vector<int32_t>(batch.inputs[2].size(), -1)};
    EXPECT_TRUE(bitEqual(lossAndGrad(s, w, alone, aloneTargets, 0.1),
                         lossAndGrad(s, w, padded, paddedTargets, 0.1)))
        << toString(f);
  }
}

TEST(Grad, BatchGradientIsTheTargetWeightedMeanOfSentenceGradients) {
  ModelSpec s = tinySpec(Family::BiLM);
  WeightSet w = randomWeights(s, 16);
  TrainBatch batch = randomBatch(s, 17, false);
  LossAndGrad all = lossAndGrad(s, w, batch.inputs, batch.targets, 0.1);
  std::vector<LossAndGrad> each;
  for (size_t b = 0; b < 3; ++b)
    each.push_back(lossAndGrad(s, w, {batch.inputs[b]}, {batch.targets[b]}, 0.1));
  double loss = 0;
  for (const LossAndGrad &g : each)
    loss += g.loss * g.targets / all.targets;
  EXPECT_NEAR(all.loss, loss, 1e-12);
  for (const auto &[name, t] : all.grads.tensors)
    for (size_t i = 0; i < t.data.size(); ++i) {
      double expected = 0;
      for (const LossAndGrad &g : each)
        expected += g.grads.get(name).data[i] * static_cast<double>(g.targets) / all.targets;
      ASSERT_NEAR(t.data[i], expected, 1e-6) << name << "[" << i << "]";
    }
}

TEST(Grad, TiedGradientIsEmbeddingPlusHeadOfTheUntiedModel) {
  ModelSpec tied = tinySpec(Family::TTA);
  tied.firstQuery = FirstQuery::MaskPosition;
  ModelSpec untied = tied;
  untied.tied = false;
  WeightSet w = randomWeights(tied, 18), wu = w;
  wu.tensors["head.output.weight"] = w.get("embed.token");
  TrainBatch batch = randomBatch(tied, 19, false);
  LossAndGrad a = lossAndGrad(tied, w, batch.inputs, batch.targets, 0.0);
  LossAndGrad b = lossAndGrad(untied, wu, batch.inputs, batch.targets, 0.0);
  EXPECT_EQ(a.loss, b.loss);
  const auto &token = a.grads.get("embed.token").data;
  const auto &embedPart = b.grads.get("embed.token").data, &headPart = b.grads.get("head.output.weight").data;
  for (size_t i = 0; i < token.size(); ++i)
    ASSERT_NEAR(token[i], embedPart[i] + headPart[i], 1e-6) << i;
  EXPECT_FALSE(a.grads.has("head.output.weight"));
}

TEST(Grad, UnreachedTensorsGetZeroGradients) {
  // Post-norm T-TA: the first query is norm_e(P), keys/values the embeddings: every row of
  // embed.token not in the inputs and (untied) not the [MASK] row has gradient 0.
  ModelSpec s = tinySpec(Family::TTA);
  s.tied = false;
  WeightSet w = randomWeights(s, 20);
  Ids inputs = {{3, 7, 8, 1}}, targets = {{-1, 7, 8, -1}};
  LossAndGrad g = lossAndGrad(s, w, inputs, targets, 0.0);
  const Tensor &token = g.grads.get("embed.token");
  for (int64_t v = 0; v < s.dims.vocab; ++v) {
    bool used = v == 3 || v == 7 || v == 8 || v == 1;
    double norm = 0;
    for (int64_t c = 0; c < s.dims.dModel; ++c)
      norm += std::fabs(token.data[v * s.dims.dModel + c]);
    if (used)
      EXPECT_GT(norm, 0) << "row " << v;
    else
      EXPECT_EQ(norm, 0) << "row " << v;
  }
  const Tensor &pos = g.grads.get("embed.position");
  for (int64_t t = 4; t < s.dims.maxLen; ++t)
    for (int64_t c = 0; c < s.dims.dModel; ++c)
      ASSERT_EQ(pos.data[t * s.dims.dModel + c], 0.0f) << "position " << t;
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

void expectError(const ModelSpec &s, const WeightSet &w, const Ids &inputs, const Ids &targets,
                 const std::string &fragment) {
  try {
    lossAndGrad(s, w, inputs, targets, 0.0);
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Grad, InvalidBatchesNameSentenceAndPosition) {
  ModelSpec s = tinySpec(Family::UniLM);
  WeightSet w = randomWeights(s, 21);
  const Ids ok = {{3, 5, 6, 1}, {3, 7, 1}};
  const Ids okTargets = {{5, 6, 1, -1}, {7, 1, -1}};
  EXPECT_NO_THROW(lossAndGrad(s, w, ok, okTargets, 0.0));
  expectError(s, w, ok, {{5, 6, 1, -1}}, "2 input sentences but 1 target");
  expectError(s, w, ok, {{5, 6, 1, -1}, {7, 1}}, "sentence 1: 3 inputs but 2 targets");
  expectError(s, w, {{3, 5, 6, 1}, {3, 23, 1}}, okTargets, "sentence 1, position 1: token id 23");
  expectError(s, w, {{3, 5, -4, 1}, {3, 7, 1}}, okTargets, "sentence 0, position 2: token id -4");
  expectError(s, w, ok, {{5, 6, 1, -1}, {7, 23, -1}}, "sentence 1, position 1: target 23");
  expectError(s, w, ok, {{5, 6, -2, -1}, {7, 1, -1}}, "sentence 0, position 2: target -2");
  expectError(s, w, {{3, 5, 6, 1}, {}}, {{5, 6, 1, -1}, {}}, "sentence 1: length 0");
  expectError(s, w, {{3, 5, 6, 1}, std::vector<int32_t>(10, 5)}, {{5, 6, 1, -1}, std::vector<int32_t>(10, 5)},
              "sentence 1: length 10");
  expectError(s, w, ok, {{-1, -1, -1, -1}, {-1, -1, -1}}, "no target");
  expectError(s, w, {}, {}, "no target");
  try {
    lossAndGrad(s, w, ok, okTargets, 1.5);
    ADD_FAILURE() << "label smoothing 1.5 accepted";
  } catch (const std::invalid_argument &) {
  }
}

} // namespace
