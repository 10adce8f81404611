//===- GoldenTest.cpp - Reference executor vs independent PyTorch fixtures -===//
//
// Every directory under tests/golden/fixtures holds spec.toml, weights.safetensors,
// ids.txt and the outputs of an independent PyTorch implementation of
// runtime/SEMANTICS.md (tests/golden/torch_ref.py): score.jsonl and embed.jsonl.
// One parameterized test per fixture and entry point runs lmcc::reference::score /
// embed on the fixture and compares: token log-probs and embedding values within
// 1e-4 absolute, the summed score within 1e-3, n_scored exactly.
// Regenerate the fixtures with `/usr/bin/python3 tests/golden/make_golden.py`.
//
//===----------------------------------------------------------------------===//
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/ModelWeights.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>


namespace fs = std::filesystem;

namespace {

constexpr double kValueTol = 1e-4; // per token log-prob and per embedding value
constexpr double kScoreTol = 1e-3; // summed score
constexpr int kThreads = 2;
constexpr int kMaxReported = 5;    // mismatching values reported per sentence

fs::path fixturesRoot() { return fs::path(lmcc::test::kSourceDir) / "tests" / "golden" / "fixtures"; }

/// Fixture directory names, sorted (stable test names and order).
std::vector<std::string> fixtureNames() {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(fixturesRoot(), ec))
    return names;
  for (const auto &entry : fs::directory_iterator(fixturesRoot(), ec))
    if (entry.is_directory() && fs::exists(entry.path() / "spec.toml"))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

enum class Entry { Score, Embed };

struct GoldenCase {
  std::string fixture;
  Entry entry;
};

// Readable parameter in test listings and failure messages.
void PrintTo(const GoldenCase &c, std::ostream *os) {
  *os << c.fixture << (c.entry == Entry::Score ? " score" : " embed");
}

std::vector<GoldenCase> allCases() {
  std::vector<GoldenCase> cases;
  for (const auto &name : fixtureNames()) {
    cases.push_back({name, Entry::Score});
    cases.push_back({name, Entry::Embed});
  }
  return cases;
}

std::string readFile(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot open " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> nonEmptyLines(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos)
      lines.push_back(line);
  }
  return lines;
}

std::vector<std::vector<int32_t>> readIds(const fs::path &path) {
  std::vector<std::vector<int32_t>> sentences;
  for (const auto &line : nonEmptyLines(readFile(path))) {
    std::istringstream in(line);
    std::vector<int32_t> ids;
    long long id;
    while (in >> id)
      ids.push_back(static_cast<int32_t>(id));
    if (!in.eof())
      throw std::runtime_error(path.string() + ": bad token id in line '" + line + "'");
    sentences.push_back(std::move(ids));
  }
  return sentences;
}

std::vector<nlohmann::json> readJsonl(const fs::path &path) {
  std::vector<nlohmann::json> rows;
  for (const auto &line : nonEmptyLines(readFile(path)))
    rows.push_back(nlohmann::json::parse(line));
  return rows;
}

/// Compares two equally long value lists within `tol`; returns "" or a description
/// of the first kMaxReported mismatches.
std::string compareValues(const std::vector<double> &expected, const std::vector<float> &actual, double tol,
                          const char *what) {
  std::ostringstream msg;
  msg.precision(9);
  if (expected.size() != actual.size()) {
    msg << what << ": " << actual.size() << " values, expected " << expected.size();
    return msg.str();
  }
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double diff = std::fabs(expected[i] - static_cast<double>(actual[i]));
    if (!(diff <= tol)) { // also catches NaN
      if (bad < kMaxReported)
        msg << "\n  " << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i]
            << " (diff " << diff << ")";
      ++bad;
      worst = std::isnan(diff) ? diff : std::max(worst, diff);
    }
  }
  if (bad == 0)
    return "";
  std::ostringstream head;
  head.precision(9);
  head << bad << " of " << expected.size() << " " << what << " values off by more than " << tol << " (worst "
       << worst << ")" << msg.str();
  return head.str();
}

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {
protected:
  void SetUp() override {
    dir = fixturesRoot() / GetParam().fixture;
    for (const char *f : {"spec.toml", "weights.safetensors", "ids.txt", "score.jsonl", "embed.jsonl"})
      ASSERT_TRUE(fs::exists(dir / f)) << "fixture file missing: " << (dir / f).string();
    ASSERT_NO_THROW(spec = lmcc::loadSpec((dir / "spec.toml").string()));
    ASSERT_NO_THROW(weights = lmcc::loadModelWeights((dir / "weights.safetensors").string(), spec));
    ASSERT_NO_THROW(sentences = readIds(dir / "ids.txt"));
    ASSERT_FALSE(sentences.empty());
  }

  fs::path dir;
  lmcc::ModelSpec spec;
  lmcc::WeightSet weights;
  std::vector<std::vector<int32_t>> sentences;
};

TEST_P(GoldenTest, MatchesTorch) {
  if (GetParam().entry == Entry::Score) {
    std::vector<nlohmann::json> expected;
    ASSERT_NO_THROW(expected = readJsonl(dir / "score.jsonl"));
    ASSERT_EQ(expected.size(), sentences.size()) << "score.jsonl vs ids.txt line count";
    std::vector<lmcc::reference::ScoreResult> results;
    ASSERT_NO_THROW(results = lmcc::reference::score(spec, weights, sentences, kThreads));
    ASSERT_EQ(results.size(), sentences.size());
    for (size_t b = 0; b < sentences.size(); ++b) {
      SCOPED_TRACE("sentence " + std::to_string(b) + " (" + std::to_string(sentences[b].size()) + " tokens)");
      const auto &want = expected[b];
      const auto &got = results[b];
      std::string diff = compareValues(want.at("token_logprobs").get<std::vector<double>>(), got.tokenLogprobs,
                                       kValueTol, "token_logprobs");
      EXPECT_TRUE(diff.empty()) << diff;
      double wantScore = want.at("score").get<double>();
      EXPECT_NEAR(got.score, wantScore, kScoreTol) << "score";
      EXPECT_EQ(got.nScored, want.at("n_scored").get<int64_t>()) << "n_scored";
    }
  } else {
    std::vector<nlohmann::json> expected;
    ASSERT_NO_THROW(expected = readJsonl(dir / "embed.jsonl"));
    ASSERT_EQ(expected.size(), sentences.size()) << "embed.jsonl vs ids.txt line count";
    std::vector<std::vector<float>> results;
    ASSERT_NO_THROW(results = lmcc::reference::embed(spec, weights, sentences, kThreads));
    ASSERT_EQ(results.size(), sentences.size());
    for (size_t b = 0; b < sentences.size(); ++b) {
      SCOPED_TRACE("sentence " + std::to_string(b) + " (" + std::to_string(sentences[b].size()) + " tokens)");
      std::vector<double> want = expected[b].at("embedding").get<std::vector<double>>();
      EXPECT_EQ(static_cast<int64_t>(want.size()), spec.dims.dModel);
      std::string diff = compareValues(want, results[b], kValueTol, "embedding");
      EXPECT_TRUE(diff.empty()) << diff;
    }
  }
}

std::string caseName(const ::testing::TestParamInfo<GoldenCase> &info) {
  std::string name = info.param.fixture;
  for (char &c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)))
      c = '_';
  return name + (info.param.entry == Entry::Score ? "_score" : "_embed");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(allCases()), caseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

// Guards against an empty or misplaced fixture directory silently running nothing.
TEST(GoldenFixtures, Present) {
  EXPECT_GE(fixtureNames().size(), 10u) << "no golden fixtures under " << fixturesRoot().string()
                                        << "; run /usr/bin/python3 tests/golden/make_golden.py";
}

} // namespace
