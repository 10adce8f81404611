//===- ObjectivesTest.cpp - Training objectives and their Philox draws ----===//
//
// Philox4x32-10 against Random123's known-answer vectors; causal and
// autoencoding examples by hand; the masked objective's rules (non-special
// positions only, at least one, at most max_masks, mask/bert replacement) and
// its statistics over many sentences; determinism in (seed, step, sentence)
// only; errors.
//
//===----------------------------------------------------------------------===//
#include "runtime/train/Objectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

using namespace lmcc;
using namespace lmcc::train;

namespace {

ModelSpec spec(Family family) {
  ModelSpec s;
  s.name = "objectives";
  s.family = family;
  s.dims = {50, 64, 8, 2, 16, 1};
  applyFamilyDefaults(s);
  return s; // tokens: pad 0, eos 1, unk 2, bos 3, mask 4
}

/// bos, n - 2 ordinary tokens (ids 5 .. 49 cycling with an offset), eos.
std::vector<int32_t> sentence(int n, int offset = 0) {
  std::vector<int32_t> x(n);
  for (int i = 0; i < n; ++i)
    x[i] = 5 + (i * 7 + offset) % 45;
  x.front() = 3;
  x.back() = 1;
  return x;
}

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors, "philox4x32 10": counter[4] key[2] -> output[4].
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, UniformIsAPureFunctionInRange) {
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double u = uniform(7, 3, i, i % 13, Purpose::Choose);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, uniform(7, 3, i, i % 13, Purpose::Choose));
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  // Every counter and key word matters.
  const double u = uniform(7, 3, 11, 5, Purpose::Choose);
  EXPECT_NE(u, uniform(8, 3, 11, 5, Purpose::Choose));
  EXPECT_NE(u, uniform(7 + (1ull << 32), 3, 11, 5, Purpose::Choose));
  EXPECT_NE(u, uniform(7, 4, 11, 5, Purpose::Choose));
  EXPECT_NE(u, uniform(7, 3, 12, 5, Purpose::Choose));
  EXPECT_NE(u, uniform(7, 3, 11, 6, Purpose::Choose));
  EXPECT_NE(u, uniform(7, 3, 11, 5, Purpose::Subset));
}

TEST(Objectives, CausalAndAutoencodingByHand) {
  const std::vector<int32_t> x = {3, 10, 11, 12, 1};
  Example c = makeExample(spec(Family::UniLM), x, 0, 0);
  EXPECT_EQ(c.inputs, x);
  EXPECT_EQ(c.targets, (std::vector<int32_t>{10, 11, 12, 1, -1}));
  Example a = makeExample(spec(Family::TTA), x, 0, 0);
  EXPECT_EQ(a.inputs, x);
  EXPECT_EQ(a.targets, (std::vector<int32_t>{-1, 10, 11, 12, -1}));
  // Explicit objectives override the family's.
  ModelSpec s = spec(Family::TTA);
  s.train.objective = Objective::Causal;
  EXPECT_EQ(makeExample(s, x, 0, 0).targets, c.targets);
  // A single token.
  EXPECT_EQ(causalExample({7}).targets, (std::vector<int32_t>{-1}));
}

TEST(Objectives, MaskedFollowsTheRules) {
  ModelSpec s = spec(Family::BiLM);
  s.train.maxMasks = 4;
  for (uint64_t sent = 0; sent < 300; ++sent) {
    const std::vector<int32_t> x = sentence(3 + static_cast<int>(sent % 40), static_cast<int>(sent));
    Example e = makeExample(s, x, 5, sent);
    ASSERT_EQ(e.inputs.size(), x.size());
    int chosen = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (e.targets[i] >= 0) {
        ++chosen;
        EXPECT_EQ(e.targets[i], x[i]);
        EXPECT_EQ(e.inputs[i], 4) << "mask_replace = mask";
        EXPECT_TRUE(i != 0 && i + 1 != x.size()) << "bos/eos never chosen";
      } else {
        EXPECT_EQ(e.inputs[i], x[i]);
      }
    }
    EXPECT_GE(chosen, 1);
    EXPECT_LE(chosen, 4);
  }
  // Only special tokens: nothing to predict.
  Example none = makeExample(s, {3, 1}, 0, 0);
  EXPECT_EQ(none.targets, (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(none.inputs, (std::vector<int32_t>{3, 1}));
}

TEST(Objectives, MaskedStatistics) {
  ModelSpec s = spec(Family::BiLM);
  s.train.maxMasks = 1000;
  // Bernoulli(mask_prob) per non-special position: 62 candidates, 2000 sentences.
  int64_t chosen = 0, candidates = 0;
  for (uint64_t sent = 0; sent < 2000; ++sent) {
    Example e = makeExample(s, sentence(64, static_cast<int>(sent)), 0, sent);
    for (int32_t t : e.targets)
      chosen += t >= 0;
    candidates += 62;
  }
  EXPECT_NEAR(static_cast<double>(chosen) / candidates, 0.15, 0.005);

  // Fallback: none drawn -> exactly one, uniform over the candidates.
  s.train.maskProb = 1e-12;
  std::vector<int> hits(10, 0);
  for (uint64_t sent = 0; sent < 5000; ++sent) {
    Example e = makeExample(s, sentence(10), 0, sent);
    int count = 0;
    for (size_t i = 0; i < e.targets.size(); ++i)
      if (e.targets[i] >= 0) {
        ++count;
        ++hits[i];
      }
    ASSERT_EQ(count, 1);
  }
  EXPECT_EQ(hits[0] + hits[9], 0);
  for (int i = 1; i < 9; ++i)
    EXPECT_NEAR(hits[i] / 5000.0, 1.0 / 8, 0.02) << i;

  // Cap: all chosen, then a uniform max_masks-subset.
  s.train.maskProb = 1.0;
  s.train.maxMasks = 3;
  std::fill(hits.begin(), hits.end(), 0);
  for (uint64_t sent = 0; sent < 5000; ++sent) {
    Example e = makeExample(s, sentence(10), 0, sent);
    int count = 0;
    for (size_t i = 0; i < e.targets.size(); ++i)
      if (e.targets[i] >= 0) {
        ++count;
        ++hits[i];
      }
    ASSERT_EQ(count, 3);
  }
  for (int i = 1; i < 9; ++i)
    EXPECT_NEAR(hits[i] / 5000.0, 3.0 / 8, 0.03) << i;
}

TEST(Objectives, BertReplacement) {
  ModelSpec s = spec(Family::BiLM);
  s.train.maskReplace = MaskReplace::Bert;
  s.train.maskProb = 0.5;
  s.train.maxMasks = 1000;
  int64_t chosen = 0, masked = 0, unchanged = 0, other = 0;
  std::set<int32_t> randomIds;
  for (uint64_t sent = 0; sent < 2000; ++sent) {
    const std::vector<int32_t> x = sentence(30, static_cast<int>(sent));
    Example e = makeExample(s, x, 1, sent);
    for (size_t i = 0; i < x.size(); ++i) {
      if (e.targets[i] < 0) {
        ASSERT_EQ(e.inputs[i], x[i]);
        continue;
      }
      ++chosen;
      ASSERT_GE(e.inputs[i], 0);
      ASSERT_LT(e.inputs[i], 50);
      if (e.inputs[i] == 4)
        ++masked;
      else if (e.inputs[i] == x[i])
        ++unchanged;
      else {
        ++other;
        randomIds.insert(e.inputs[i]);
      }
    }
  }
  // 80% [MASK]; 10% a random id (which is [MASK] or x_i with probability 1/V each); 10% kept.
  const double n = static_cast<double>(chosen);
  EXPECT_NEAR(masked / n, 0.8 + 0.1 / 50, 0.01);
  EXPECT_NEAR(unchanged / n, 0.1 + 0.1 / 50, 0.01);
  EXPECT_NEAR(other / n, 0.1 * 48 / 50, 0.01);
  EXPECT_GE(randomIds.size(), 45u) << "random ids cover the vocabulary, specials included";
  EXPECT_TRUE(randomIds.count(0) && randomIds.count(3)) << "any id in [0, V)";
}

TEST(Objectives, DependOnlyOnSeedStepAndSentenceIndex) {
  ModelSpec s = spec(Family::BiLM);
  s.train.maskReplace = MaskReplace::Bert;
  std::vector<std::vector<int32_t>> sentences;
  for (int i = 0; i < 12; ++i)
    sentences.push_back(sentence(8 + i, i));
  Examples all = makeExamples(s, sentences, 9, 100);
  // In reverse order, one at a time: the same examples.
  for (int i = 11; i >= 0; --i) {
    Example e = makeExample(s, sentences[i], 9, 100 + i);
    EXPECT_EQ(e.inputs, all.inputs[i]);
    EXPECT_EQ(e.targets, all.targets[i]);
  }
  // Another step, sentence index or seed: other masks (somewhere in the batch).
  auto differs = [&](const Examples &other) { return other.targets != all.targets || other.inputs != all.inputs; };
  EXPECT_TRUE(differs(makeExamples(s, sentences, 10, 100)));
  EXPECT_TRUE(differs(makeExamples(s, sentences, 9, 101)));
  s.train.seed = 2;
  EXPECT_TRUE(differs(makeExamples(s, sentences, 9, 100)));
}

TEST(Objectives, ErrorsNameSentenceAndPosition) {
  ModelSpec s = spec(Family::BiLM);
  try {
    makeExamples(s, {sentence(5), {3, 7, 50, 1}}, 0, 10);
    FAIL() << "id 50 accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("sentence 11, position 2: token id 50"), std::string::npos) << e.what();
  }
  EXPECT_THROW(makeExample(s, {}, 0, 0), std::invalid_argument);
  EXPECT_THROW(makeExample(spec(Family::UniLM), {3, -1}, 0, 0), std::invalid_argument);
}

} // namespace
