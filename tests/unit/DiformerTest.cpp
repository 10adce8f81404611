//===- DiformerTest.cpp - Reference Diformer vs PyTorch, structure, decoding -===//
//
// * Golden: every tests/golden/diformer_fixtures/<case> (tests/golden/make_golden_diformer.py,
//   an independent PyTorch implementation of issue 19's contract in float64): token log-probs,
//   length log-probs and scores of SRC ||| TGT ||| DIRS [||| HIDE] lines, the directional loss of
//   a {src, tgt, dirs, hide} batch and its gradient for every tensor (1e-4 of the tensor's scale).
// * Structure: a row's log-prob is bit-identical when keys it cannot see change.
// * Decoding: the one-pass l2r score equals the incremental (one row, cached keys/values) steps.
//
//===----------------------------------------------------------------------===//
#include "frontend/Spec.h"
#include "runtime/reference/Diformer.h"
#include "runtime/reference/DiformerDecode.h"
#include "runtime/weights/ModelWeights.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>


using namespace lmcc;
namespace df = lmcc::reference::diformer;
namespace fs = std::filesystem;

namespace {

fs::path fixtureRoot() { return fs::path(test::kSourceDir) / "tests" / "golden" / "diformer_fixtures"; }

std::vector<std::string> readLines(const fs::path &p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty())
      out.push_back(line);
  return out;
}

std::vector<int32_t> ints(const std::string &s) {
  std::istringstream in(s);
  std::vector<int32_t> out;
  int32_t v;
  while (in >> v)
    out.push_back(v);
  return out;
}

/// SRC ||| TGT ||| DIRS [||| HIDE] (the CLI's format; HIDE applies to every S row but itself).
df::Example parse(const ModelSpec &spec, const std::string &line) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (;;) {
    size_t bar = line.find("|||", pos);
    parts.push_back(line.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos));
    if (bar == std::string::npos)
      break;
    pos = bar + 3;
  }
  df::Example e;
  e.src = ints(parts[0]);
  e.tgt = ints(parts[1]);
  std::string dirs = parts[2];
  dirs.erase(std::remove(dirs.begin(), dirs.end(), ' '), dirs.end());
  e.dirs = df::parseDirections(dirs, int64_t(e.tgt.size()));
  e.hidden.assign(e.tgt.size(), {});
  std::vector<int32_t> hide = parts.size() > 3 ? ints(parts[3]) : std::vector<int32_t>();
  for (size_t i = 0; i < e.tgt.size(); ++i)
    if (e.dirs[i] == df::Dir::S)
      for (int32_t h : hide)
        if (h != int32_t(i))
          e.hidden[i].push_back(h);
  df::validateExample(spec, e, "line");
  return e;
}

class DiformerGolden : public ::testing::TestWithParam<std::string> {};

TEST(DiformerFixtures, Present) {
  ASSERT_TRUE(fs::is_directory(fixtureRoot())) << fixtureRoot();
  EXPECT_GE(std::distance(fs::directory_iterator(fixtureRoot()), fs::directory_iterator()), 3);
}

TEST_P(DiformerGolden, ScoresMatchTorch) {
  const fs::path dir = fixtureRoot() / GetParam();
  ModelSpec spec = loadSpec((dir / "spec.toml").string());
  WeightSet w = loadModelWeights((dir / "weights.safetensors").string(), spec);
  std::vector<df::Example> examples;
  for (const std::string &line : readLines(dir / "lines.txt"))
    examples.push_back(parse(spec, line));
  std::vector<df::Score> got = df::score(spec, w, examples, 2);
  std::vector<std::string> expected = readLines(dir / "score.jsonl");
  ASSERT_EQ(got.size(), expected.size());
  for (size_t s = 0; s < got.size(); ++s) {
    nlohmann::json j = nlohmann::json::parse(expected[s]);
    ASSERT_EQ(got[s].tokenLogprobs.size(), j["token_logprobs"].size()) << "line " << s + 1;
    for (size_t i = 0; i < got[s].tokenLogprobs.size(); ++i) {
      const double want = j["token_logprobs"][i].get<double>();
      EXPECT_NEAR(got[s].tokenLogprobs[i], want, 1e-4 * std::max(1.0, std::fabs(want)))
          << "line " << s + 1 << " row " << i;
    }
    const double wantLen = j["length_logprob"].get<double>(), wantScore = j["score"].get<double>();
    EXPECT_NEAR(got[s].lengthLogprob, wantLen, 1e-4 * std::max(1.0, std::fabs(wantLen))) << "line " << s + 1;
    EXPECT_NEAR(got[s].score, wantScore, 1e-4 * std::max(1.0, std::fabs(wantScore))) << "line " << s + 1;
    EXPECT_EQ(got[s].nScored, j["n_scored"].get<int64_t>());
  }
}

TEST_P(DiformerGolden, GradientsMatchTorch) {
  const fs::path dir = fixtureRoot() / GetParam();
  ModelSpec spec = loadSpec((dir / "spec.toml").string());
  WeightSet w = loadModelWeights((dir / "weights.safetensors").string(), spec);
  std::ifstream in(dir / "batch.json");
  nlohmann::json b = nlohmann::json::parse(in);
  std::vector<df::Example> examples;
  for (size_t s = 0; s < b["src"].size(); ++s) {
    df::Example e;
    e.src = b["src"][s].get<std::vector<int32_t>>();
    e.tgt = b["tgt"][s].get<std::vector<int32_t>>();
    e.dirs = df::parseDirections(b["dirs"][s].get<std::string>(), int64_t(e.tgt.size()));
    e.hidden = b["hide"][s].get<std::vector<std::vector<int32_t>>>();
    df::validateExample(spec, e, "batch");
    examples.push_back(std::move(e));
  }
  df::Model model(spec, w);
  df::LossAndGrad r = df::lossAndGrad(spec, model, examples);
  std::ifstream gj(dir / "grad.json");
  nlohmann::json want = nlohmann::json::parse(gj);
  EXPECT_NEAR(r.loss, want["loss"].get<double>(), 1e-5 * std::fabs(want["loss"].get<double>()));
  EXPECT_EQ(r.tokens, want["tokens"].get<int64_t>());
  WeightSet ref = readSafetensors((dir / "grads.safetensors").string());
  ASSERT_EQ(r.grads.tensors.size(), ref.tensors.size());
  for (const auto &[name, t] : ref.tensors) {
    ASSERT_TRUE(r.grads.has(name)) << name;
    const auto &g = r.grads.get(name).data;
    ASSERT_EQ(g.size(), t.data.size()) << name;
    double scale = 0, err = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      scale = std::max(scale, std::fabs(double(t.data[i])));
      err = std::max(err, std::fabs(double(g[i]) - double(t.data[i])));
    }
    // 1e-4 of the tensor's largest entry; key biases have an exact gradient of 0 (softmax is
    // shift-invariant), where float rounding leaves ~1e-9: those are held to 1e-7 absolute.
    EXPECT_LE(err, 1e-4 * std::max(scale, 1e-3)) << name << " (scale " << scale << ")";
  }
}

std::vector<std::string> fixtureNames() {
  std::vector<std::string> out;
  if (fs::is_directory(fixtureRoot()))
    for (const auto &e : fs::directory_iterator(fixtureRoot()))
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiformerGolden, ::testing::ValuesIn(fixtureNames()),
                         [](const auto &info) { return info.param; });

/// A small random Diformer with odd sizes.
ModelSpec smallSpec(int64_t k = 3) {
  std::string text = "name = \"dif_small\"\nfamily = \"diformer\"\n[dims]\nvocab = 31\nmax_len = 24\nd_model = 15\n"
                     "heads = 3\nd_ff = 21\nlayers = 2\n[decoder]\nheads = 5\nlayers = 2\n[attention]\n"
                     "relative_positions = " + std::to_string(k) + "\n";
  return parseSpec(text, "small.toml");
}

/// Init weights scaled up so that attention is far from uniform.
WeightSet sharpWeights(const ModelSpec &spec, uint64_t seed) {
  WeightSet w = initWeights(spec, seed);
  for (auto &[name, t] : w.tensors)
    if (t.shape.size() == 2)
      for (float &v : t.data)
        v *= 25.0f;
  return w;
}

df::Example randomExample(const ModelSpec &spec, std::mt19937 &rng, int64_t n) {
  df::Example e;
  std::uniform_int_distribution<int32_t> id(5, int32_t(spec.dims.vocab) - 1);
  for (int i = 0; i < 7; ++i)
    e.src.push_back(id(rng));
  e.tgt.push_back(int32_t(spec.tokens.bos));
  for (int64_t i = 1; i + 1 < n; ++i)
    e.tgt.push_back(id(rng));
  e.tgt.push_back(int32_t(spec.tokens.eos));
  e.dirs.assign(size_t(n), df::Dir::R);
  e.dirs.back() = df::Dir::L;
  e.hidden.assign(size_t(n), {});
  for (int64_t i = 1; i + 1 < n; ++i) {
    e.dirs[size_t(i)] = df::Dir(rng() % 3);
    if (e.dirs[size_t(i)] == df::Dir::S)
      for (int64_t j = 1; j + 1 < n; ++j)
        if (j != i && rng() % 2)
          e.hidden[size_t(i)].push_back(int32_t(j));
  }
  return e;
}

TEST(DiformerStructure, RowUnchangedWhenInvisibleKeysChange) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 7);
  df::Model model(spec, w);
  std::mt19937 rng(42);
  int checked = 0;
  for (int trial = 0; trial < 20; ++trial) {
    df::Example e = randomExample(spec, rng, 11);
    df::Score base = model.score(e);
    const int64_t n = int64_t(e.tgt.size());
    for (int64_t i = 0; i < n; ++i) {
      // Keys row i cannot see, excluding its own target position.
      std::vector<int64_t> invisible;
      for (int64_t j = 1; j + 1 < n; ++j) {
        const df::Dir d = e.dirs[size_t(i)];
        const bool target = (d == df::Dir::R && j == i + 1) || (d == df::Dir::L && j == i - 1) ||
                            (d == df::Dir::S && j == i);
        bool hidden = d == df::Dir::R ? j > i : d == df::Dir::L ? j < i : false;
        if (d == df::Dir::S)
          hidden = std::find(e.hidden[size_t(i)].begin(), e.hidden[size_t(i)].end(), j) != e.hidden[size_t(i)].end();
        if (hidden && !target)
          invisible.push_back(j);
      }
      if (invisible.empty())
        continue;
      df::Example changed = e;
      for (int64_t j : invisible)
        changed.tgt[size_t(j)] = int32_t(5 + (changed.tgt[size_t(j)] - 5 + 1 + int32_t(rng() % 20)) % 26);
      df::Score after = model.score(changed);
      EXPECT_EQ(after.tokenLogprobs[size_t(i)], base.tokenLogprobs[size_t(i)]) << "trial " << trial << " row " << i;
      // A visible key (bos for R/S rows, eos for L rows is fixed; use a visible content key) does change it.
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(DiformerStructure, VisibleKeyChangesRow) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 8);
  df::Model model(spec, w);
  std::mt19937 rng(3);
  df::Example e = randomExample(spec, rng, 9);
  e.dirs = df::parseDirections("l2r", 9);
  e.hidden.assign(9, {});
  df::Score base = model.score(e);
  df::Example changed = e;
  changed.tgt[2] = changed.tgt[2] == 6 ? 7 : 6; // visible to rows 2.. (and the target of row 1)
  df::Score after = model.score(changed);
  EXPECT_NE(after.tokenLogprobs[4], base.tokenLogprobs[4]);
  EXPECT_EQ(after.tokenLogprobs[0], base.tokenLogprobs[0]);
}

TEST(DiformerDecode, OnePassL2REqualsIncrementalSteps) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 9);
  df::Model model(spec, w);
  std::mt19937 rng(5);
  for (int64_t n : {2, 3, 8, 13}) {
    df::Example e = randomExample(spec, rng, n);
    e.dirs = df::parseDirections("l2r", n);
    e.hidden.assign(size_t(n), {});
    df::Score one = model.score(e);
    df::Model::Memory mem = model.encode(e.src);
    double sum = 0;
    for (int64_t i = 0; i + 1 < n; ++i) {
      std::vector<int32_t> prefix(e.tgt.begin(), e.tgt.begin() + i + 1);
      std::vector<float> lp = df::incrementalL2R(model, mem, prefix);
      EXPECT_NEAR(lp[size_t(e.tgt[size_t(i + 1)])], one.tokenLogprobs[size_t(i)], 2e-6) << "n " << n << " row " << i;
      sum += lp[size_t(e.tgt[size_t(i + 1)])];
    }
    EXPECT_NEAR(sum, one.score, 1e-5 * std::max(1.0, std::fabs(one.score)));
    EXPECT_NEAR(df::teacherForced(model, e.src, e.tgt, df::Dir::R), one.score, 1e-9);
  }
}

TEST(DiformerDecode, AllModesProduceWellFormedTargets) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 10);
  df::Model model(spec, w);
  std::vector<int32_t> src = {5, 9, 12, 7};
  for (df::DecodeMode mode :
       {df::DecodeMode::L2R, df::DecodeMode::R2L, df::DecodeMode::MaskPredict, df::DecodeMode::EasyFirst})
    for (bool rerank : {false, true}) {
      df::DecodeOptions o;
      o.mode = mode, o.rerank = rerank, o.maxTarget = 12, o.beam = 3, o.lengthBeam = 3, o.iterations = 4;
      df::Translation t = df::translate(model, src, o);
      ASSERT_GE(t.tgt.size(), 2u);
      EXPECT_EQ(t.tgt.front(), spec.tokens.bos);
      EXPECT_EQ(t.tgt.back(), spec.tokens.eos);
      EXPECT_TRUE(std::isfinite(t.score));
      if (rerank) { // the rerank score is the mean of the two teacher-forced log-likelihoods (sums, not per token)
        const std::vector<int32_t> tgt(t.tgt.begin(), t.tgt.end());
        EXPECT_NEAR(t.score,
                    0.5 * (df::teacherForced(model, src, tgt, df::Dir::R) + df::teacherForced(model, src, tgt, df::Dir::L)),
                    1e-9);
      }
    }
}

// A length beam over every length includes n = 2 (bos, eos): no content, no token log-probability to rank it
// by. It must not win by default (its mean over no tokens would be 0, above every real candidate).
TEST(DiformerDecode, LengthBeamSkipsTheEmptyTarget) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 10);
  df::Model model(spec, w);
  for (df::DecodeMode mode : {df::DecodeMode::MaskPredict, df::DecodeMode::EasyFirst}) {
    df::DecodeOptions o;
    o.mode = mode, o.lengthBeam = int(spec.dims.maxLen), o.iterations = 3;
    df::Translation t = df::translate(model, {5, 9, 12, 7}, o);
    EXPECT_GE(t.tgt.size(), 3u);
    EXPECT_EQ(t.candidates, spec.dims.maxLen - 3); // lengths 3 .. max_len - 1
  }
}

TEST(DiformerInput, DirectionRulesAreErrors) {
  EXPECT_THROW(df::parseDirections("LRL", 3), std::invalid_argument);
  EXPECT_THROW(df::parseDirections("RRR", 3), std::invalid_argument);
  EXPECT_THROW(df::parseDirections("RX L", 4), std::invalid_argument);
  EXPECT_THROW(df::parseDirections("RL", 3), std::invalid_argument);
  EXPECT_EQ(df::parseDirections("pll", 4).size(), 4u);
  try {
    df::parseDirections("SRL", 3);
    FAIL();
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("z_0"), std::string::npos) << e.what();
  }
  ModelSpec spec = smallSpec();
  df::Example e{{5}, {3, 6, 1}, df::parseDirections("RSL", 3), {{}, {0}, {}}}; // bos is never hidden
  EXPECT_THROW(df::validateExample(spec, e, "x"), std::invalid_argument);
}

} // namespace

namespace {

TEST(DiformerObjective, DrawsFollowTheContract) {
  const int64_t n = 10;
  std::vector<int64_t> dirCount(3, 0), sizeCount(size_t(n - 2), 0);
  std::vector<int64_t> positionCount(size_t(n), 0);
  int64_t sRows = 0;
  for (uint64_t step = 0; step < 3000; ++step) {
    df::Example e;
    e.src = {5};
    e.tgt.assign(size_t(n), 7);
    df::drawDirections(e, 11, step, uint32_t(step % 5));
    ASSERT_EQ(e.dirs.front(), df::Dir::R);
    ASSERT_EQ(e.dirs.back(), df::Dir::L);
    for (int64_t i = 1; i + 1 < n; ++i) {
      ++dirCount[size_t(e.dirs[size_t(i)])];
      const auto &h = e.hidden[size_t(i)];
      if (e.dirs[size_t(i)] != df::Dir::S) {
        EXPECT_TRUE(h.empty());
        continue;
      }
      ++sRows;
      ++sizeCount[h.size()];
      for (size_t k = 0; k < h.size(); ++k) {
        EXPECT_TRUE(h[k] >= 1 && h[k] <= n - 2 && h[k] != i) << h[k];
        if (k)
          EXPECT_LT(h[k - 1], h[k]);
        ++positionCount[size_t(h[k])];
      }
    }
    df::Example again = e;
    df::drawDirections(again, 11, step, uint32_t(step % 5));
    EXPECT_EQ(again.dirs, e.dirs);
    EXPECT_EQ(again.hidden, e.hidden);
  }
  const double rows = double(dirCount[0] + dirCount[1] + dirCount[2]);
  for (int64_t c : dirCount)
    EXPECT_NEAR(double(c) / rows, 1.0 / 3, 0.02);
  for (int64_t c : sizeCount) // c_i uniform over 0..n-3
    EXPECT_NEAR(double(c) / double(sRows), 1.0 / double(n - 2), 0.02);
  for (int64_t j = 1; j + 1 < n; ++j) // every content position equally likely to be hidden
    EXPECT_NEAR(double(positionCount[size_t(j)]) / double(positionCount[1]), 1.0, 0.08) << j;
}

} // namespace

namespace {

TEST(DiformerGrad, ThreadCountDoesNotChangeAnyBit) {
  ModelSpec spec = smallSpec();
  WeightSet w = sharpWeights(spec, 12);
  df::Model model(spec, w);
  std::mt19937 rng(8);
  std::vector<df::Example> batch;
  for (int64_t n : {3, 9, 5, 12, 7})
    batch.push_back(randomExample(spec, rng, n));
  df::LossAndGrad one = df::lossAndGrad(spec, model, batch, 1);
  for (int threads : {2, 3}) {
    df::LossAndGrad many = df::lossAndGrad(spec, model, batch, threads);
    EXPECT_EQ(one.loss, many.loss);
    for (const auto &[name, t] : one.grads.tensors)
      EXPECT_EQ(t.data, many.grads.get(name).data) << name << " with " << threads << " threads";
  }
}

} // namespace
