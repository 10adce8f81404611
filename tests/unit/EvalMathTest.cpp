// lmcc sts / blimp / rerank arithmetic (tools/lmcc/EvalMath.*): word spans for word-level PLL, Pearson,
// Spearman with average ranks for ties, word edit distance.
#include "tools/lmcc/EvalMath.h"

#include "runtime/lib/Tokenizer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace lmcc;
using namespace lmcc::cli;

namespace {

Tokenizer tinyVocab() {
  const std::string vocab = "[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\nthe\ncat\nun\n##break\n##able\nis\n##s\n.\n";
  return Tokenizer::fromText(vocab, "vocab.txt", true, SpecialIds{});
}

} // namespace

TEST(WordSpans, PiecesOfAWordShareItsEnd) {
  Tokenizer tok = tinyVocab();
  const std::vector<int32_t> ids = tok.encodeSentence("The unbreakable cats.");
  // [SOS] the un ##break ##able cat ##s . [EOS]
  ASSERT_EQ(ids, (std::vector<int32_t>{3, 5, 7, 8, 9, 6, 11, 12, 1}));
  EXPECT_EQ(wordSpans(tok, ids), (std::vector<int32_t>{1, 2, 5, 5, 5, 7, 7, 8, 9}));
  EXPECT_FALSE(originalSpans(wordSpans(tok, ids)));
}

TEST(WordSpans, SingleSpansAreOriginalPll) {
  Tokenizer tok = tinyVocab();
  const std::vector<int32_t> ids = tok.encodeSentence("the cat is.");
  EXPECT_EQ(wordSpans(tok, ids), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(originalSpans(wordSpans(tok, ids)));
}

TEST(WordSpans, SpecialsAreWordsOfTheirOwn) {
  Tokenizer tok = tinyVocab();
  // A "##" piece right after bos, unk or mask starts a word; a special never continues one.
  const std::vector<int32_t> ids{3, 11, 9, 2, 8, 4, 1};
  EXPECT_EQ(wordSpans(tok, ids), (std::vector<int32_t>{1, 3, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(wordSpans(tok, {}).empty());
}

TEST(Correlation, PearsonAndSpearman) {
  const std::vector<double> x{1, 2, 3, 4, 5}, y{2, 4, 5, 4, 5};
  // By hand: mean x 3, mean y 4; sxy = 6, sxx = 10, syy = 6 -> 6 / sqrt(60).
  EXPECT_NEAR(pearson(x, y), 6 / std::sqrt(60.0), 1e-12);
  // Ranks of y with ties: 1, 2.5, 4.5, 2.5, 4.5.
  EXPECT_EQ(averageRanks(y), (std::vector<double>{1, 2.5, 4.5, 2.5, 4.5}));
  EXPECT_NEAR(spearman(x, y), pearson(x, {1, 2.5, 4.5, 2.5, 4.5}), 1e-12);
  EXPECT_NEAR(spearman(x, {10, 20, 30, 40, 50}), 1.0, 1e-12);
  EXPECT_NEAR(pearson(x, {5, 4, 3, 2, 1}), -1.0, 1e-12);
  EXPECT_TRUE(std::isnan(pearson(x, {1, 1, 1, 1, 1})));
  EXPECT_TRUE(std::isnan(pearson({1}, {2})));
}

TEST(Correlation, Cosine) {
  EXPECT_NEAR(cosine({1, 0}, {0, 1}), 0.0, 1e-12);
  EXPECT_NEAR(cosine({1, 2}, {2, 4}), 1.0, 1e-12);
  EXPECT_EQ(cosine({0, 0}, {1, 1}), 0.0);
}

TEST(WordErrors, EditDistance) {
  auto d = [](const char *ref, const char *hyp) { return wordEditDistance(splitWords(ref), splitWords(hyp)); };
  EXPECT_EQ(splitWords("  a\tb  c\n").size(), 3u);
  EXPECT_EQ(d("the cat sat", "the cat sat"), 0);
  EXPECT_EQ(d("the cat sat", "the bat sat"), 1);
  EXPECT_EQ(d("the cat sat", "cat sat down"), 2);
  EXPECT_EQ(d("the cat sat", ""), 3);
  EXPECT_EQ(d("", "a b"), 2);
}
