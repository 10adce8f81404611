// The corpus pipeline of lmcc train --data (runtime/train/Corpus.h): reading, hold-out and batching.
#include "runtime/train/Corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace {

using namespace lmcc::train;

CorpusLimits limits(int64_t maxLen = 6, bool dropLong = false) {
  CorpusLimits l;
  l.maxLen = maxLen, l.vocab = 50, l.bos = 3, l.eos = 1, l.dropLong = dropLong;
  return l;
}

LineEncoder ids(int64_t vocab = 50) {
  return [vocab](std::string_view line, const std::string &where) { return parseIdLine(line, where, vocab); };
}

TEST(Corpus, SkipsEmptyAndContentlessLinesAndCutsLongOnes) {
  const std::string text = "3 7 8 1\n\n  \t\r\n3 1\n3 9 9 9 9 9 9 1\r\n3 10 11 12 13 14 15\n3 5 1";
  Corpus c = readCorpus(text, "c.txt", ids(), limits());
  ASSERT_EQ(c.sentences.size(), 4u);
  EXPECT_EQ(c.sentences[0], (std::vector<int32_t>{3, 7, 8, 1}));
  EXPECT_EQ(c.sentences[1], (std::vector<int32_t>{3, 9, 9, 9, 9, 1})); // cut, eos kept
  EXPECT_EQ(c.sentences[2], (std::vector<int32_t>{3, 10, 11, 12, 13, 14})); // no eos to keep
  EXPECT_EQ(c.sentences[3], (std::vector<int32_t>{3, 5, 1}));               // no final newline
  EXPECT_EQ(c.lines, (std::vector<int64_t>{1, 5, 6, 7}));
  EXPECT_EQ(c.emptyLines, 2);
  EXPECT_EQ(c.noContent, 1);
  EXPECT_EQ(c.truncated, 2);

  Corpus d = readCorpus(text, "c.txt", ids(), limits(6, /*dropLong=*/true));
  EXPECT_EQ(d.sentences.size(), 2u);
  EXPECT_EQ(d.droppedLong, 2);
  EXPECT_EQ(d.truncated, 0);
}

TEST(Corpus, ErrorsNameFileLineAndToken) {
  auto message = [](const std::string &text, LineEncoder e = ids()) {
    try {
      readCorpus(text, "c.txt", e, limits());
    } catch (const CorpusError &err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("3 1 1\n\n3 x 1\n"), "c.txt:3: token 2 'x' is not an integer token id");
  EXPECT_EQ(message("3 50 1\n"), "c.txt:1: token 2 (id 50) is outside the vocabulary [0, 50)");
  EXPECT_EQ(message("3 -1 1\n"), "c.txt:1: token 2 (id -1) is outside the vocabulary [0, 50)");
  EXPECT_EQ(message(std::string("3 4\0" "5 1\n", 8)), "c.txt:1: token 2 '4\\x005' is not an integer token id");
  // Decimal digits only: no sign but a '-' (negative ids are outside the vocabulary, "-0" as well), no leading \v.
  EXPECT_EQ(message("3 +4 1\n"), "c.txt:1: token 2 '+4' is not an integer token id");
  EXPECT_EQ(message("3 -0 1\n"), "c.txt:1: token 2 (id -0) is outside the vocabulary [0, 50)");
  EXPECT_EQ(message("3 \v4 1\n"), "c.txt:1: token 2 '\\x0b4' is not an integer token id");
  EXPECT_EQ(message("3 - 1\n"), "c.txt:1: token 2 '-' is not an integer token id");
  EXPECT_EQ(message("3 99999999999999999999 1\n"),
            "c.txt:1: token 2 '99999999999999999999' is not an integer token id");
  // An encoder's ids are checked too.
  LineEncoder bad = [](std::string_view, const std::string &) { return std::vector<int32_t>{3, 70, 1}; };
  EXPECT_EQ(message("anything\n", bad), "c.txt:1: token 2 (id 70) is outside the vocabulary [0, 50)");
}

Corpus numbered(int n) {
  Corpus c;
  for (int i = 0; i < n; ++i) {
    c.sentences.push_back(std::vector<int32_t>(size_t(2 + i % 7), int32_t(i % 40)));
    c.lines.push_back(i + 1);
  }
  return c;
}

TEST(Corpus, HoldOutIsDeterministicOnePercentAtLeastHundred) {
  for (int n : {101, 200, 1000, 25000}) { // 101: 100 held out, one sentence to train on
    Corpus a = numbered(n), b = numbered(n);
    Corpus va = holdOut(a, 7, "c.txt"), vb = holdOut(b, 7, "c.txt");
    const size_t k = std::max<size_t>(100, (n + 99) / 100);
    EXPECT_EQ(va.sentences.size(), k);
    EXPECT_EQ(a.sentences.size() + va.sentences.size(), size_t(n));
    EXPECT_EQ(va.lines, vb.lines);
    EXPECT_TRUE(std::is_sorted(va.lines.begin(), va.lines.end()));
    EXPECT_TRUE(std::is_sorted(a.lines.begin(), a.lines.end()));
    std::set<int64_t> all(a.lines.begin(), a.lines.end());
    all.insert(va.lines.begin(), va.lines.end());
    EXPECT_EQ(all.size(), size_t(n));
    Corpus c = numbered(n);
    EXPECT_NE(holdOut(c, 8, "c.txt").lines, va.lines); // another seed, another part
  }
  Corpus small = numbered(100); // nothing left to train on
  EXPECT_THROW(holdOut(small, 7, "c.txt"), CorpusError);
}

TEST(Corpus, EpochBatchesCoverEverySentenceOnceWithinTheBudget) {
  Corpus c = numbered(1000);
  for (int64_t budget : {5, 64, 500}) {
    std::vector<Batch> e0 = epochBatches(c.sentences, budget, 1, 0);
    EXPECT_EQ(e0, epochBatches(c.sentences, budget, 1, 0));
    EXPECT_NE(e0, epochBatches(c.sentences, budget, 1, 1));
    EXPECT_NE(e0, epochBatches(c.sentences, budget, 2, 0));
    std::vector<int> seen(1000, 0);
    for (const Batch &b : e0) {
      size_t longest = 0, shortest = 100;
      for (int64_t i : b) {
        ++seen[i];
        longest = std::max(longest, c.sentences[i].size());
        shortest = std::min(shortest, c.sentences[i].size());
      }
      EXPECT_TRUE(b.size() == 1 || int64_t(b.size() * longest) <= budget);
      EXPECT_LE(longest - shortest, 1u); // grouped by length: at most one length step inside a batch
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  }
}

TEST(Corpus, FixedBatchesAreSortedAndStable) {
  Corpus c = numbered(50);
  std::vector<Batch> b = fixedBatches(c.sentences, 30);
  std::vector<int64_t> order;
  for (const Batch &x : b)
    order.insert(order.end(), x.begin(), x.end());
  ASSERT_EQ(order.size(), 50u);
  for (size_t i = 1; i < order.size(); ++i) {
    const size_t a = c.sentences[order[i - 1]].size(), d = c.sentences[order[i]].size();
    EXPECT_TRUE(a < d || (a == d && order[i - 1] < order[i]));
  }
}

TEST(Corpus, HashSeesIdsAndBoundaries) {
  std::vector<std::vector<int32_t>> a = {{3, 4, 1}, {3, 1}}, b = {{3, 4}, {1, 3, 1}}, c = {{3, 4, 1}, {3, 1}};
  EXPECT_EQ(corpusHash(a), corpusHash(c));
  EXPECT_NE(corpusHash(a), corpusHash(b));
}

} // namespace
