//===- NGramTest.cpp - The ngram family (issue 18) ---------------------------===//
//
// Scores and gradients of the ngram family (n = 2, 3, 4, with and without WDR, label smoothing, tied and
// untied, pre/post norm, d_hidden != d_model) on odd sizes: the reference executor and the compiled
// library (optimized and naive pipelines) against the PyTorch fixtures of tests/golden/ngram_ref.py (which
// also checks its own gradients against float64 finite differences holding the conjugate's copy of W
// fixed); lambda = 0 is exactly the uniLM score of the same trunk; the conjugate is a stop-gradient; the
// spec's contract (no head transform, d_hidden, objective ngram) and bad batches.
//
//===----------------------------------------------------------------------===//
#include "driver/Compile.h"
#include "frontend/MLIRGen.h"
#include "frontend/Spec.h"
#include "runtime/lib/lmrt.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/ModelWeights.h"
#include "runtime/weights/Safetensors.h"
#include "tests/unit/TestPaths.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include "tests/unit/RandomWeights.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace lmcc;

namespace {

fs::path fixtureDir(const std::string &name) { return fs::path(test::kSourceDir) / "tests/golden/ngram_fixtures" / name; }

std::vector<std::vector<int32_t>> readIds(const fs::path &path) {
  std::vector<std::vector<int32_t>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::vector<int32_t> s;
    for (int32_t id; ss >> id;)
      s.push_back(id);
    if (!s.empty())
      out.push_back(s);
  }
  return out;
}

std::vector<nlohmann::json> readJsonLines(const fs::path &path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      out.push_back(nlohmann::json::parse(line));
  return out;
}

/// A compiled library (scoring, or with `train` also the loss entries) with loaded weights.
struct Library {
  void *handle = nullptr;
  const lm_model_desc *desc = nullptr;
  lm_model *model = nullptr;
  fs::path dir;

  Library(const ModelSpec &spec, driver::LibraryOptions options, const std::string &tag, const std::string &weights) {
    dir = fs::temp_directory_path() / ("lmcc-ngram-test-" + spec.name + "-" + tag + "-" + std::to_string(::getpid()));
    options.outputDir = dir.string();
    options.runtimeDir = test::kRuntimeDir;
    EXPECT_EQ(driver::compileLibrary(spec, options), "");
    handle = dlopen((dir / ("lib" + spec.name + ".so")).c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle, nullptr) << dlerror();
    if (!handle)
      return;
    desc = reinterpret_cast<const lm_model_desc *(*)()>(dlsym(handle, (spec.name + "_descriptor").c_str()))();
    EXPECT_EQ(lm_rt_load(desc, weights.c_str(), &model), LM_OK) << lm_last_error();
  }
  ~Library() {
    if (model)
      lm_rt_free(model);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  /// Token log-probs, scores and counts of `sentences` (padded past the longest, garbage in the padding).
  std::vector<reference::ScoreResult> score(const std::vector<std::vector<int32_t>> &sentences) {
    int32_t batch = int32_t(sentences.size()), stride = 1;
    for (const auto &s : sentences)
      stride = std::max(stride, int32_t(s.size()) + 2);
    std::vector<int32_t> ids(size_t(batch) * stride, 7), lengths;
    for (int32_t b = 0; b < batch; ++b) {
      std::copy(sentences[b].begin(), sentences[b].end(), ids.begin() + size_t(b) * stride);
      lengths.push_back(int32_t(sentences[b].size()));
    }
    std::vector<float> lp(ids.size()), scores(batch);
    std::vector<int32_t> n(batch);
    EXPECT_EQ(lm_rt_score_ex(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data(), n.data()),
              LM_OK)
        << lm_last_error();
    std::vector<reference::ScoreResult> out(batch);
    for (int32_t b = 0; b < batch; ++b) {
      out[b].tokenLogprobs.assign(lp.begin() + size_t(b) * stride, lp.begin() + size_t(b) * stride + lengths[b]);
      out[b].score = scores[b];
      out[b].nScored = n[b];
    }
    return out;
  }

  /// The loss and gradient of causal batches (targets the shift of the inputs), as canonical tensors.
  std::pair<float, WeightSet> lossAndGrad(const std::vector<std::vector<int32_t>> &sentences) {
    int32_t batch = int32_t(sentences.size()), stride = 1;
    for (const auto &s : sentences)
      stride = std::max(stride, int32_t(s.size()) + 1);
    std::vector<int32_t> inputs(size_t(batch) * stride, 5), targets(size_t(batch) * stride, 9), lengths;
    for (int32_t b = 0; b < batch; ++b) {
      const auto &x = sentences[b];
      for (size_t i = 0; i < x.size(); ++i) {
        inputs[size_t(b) * stride + i] = x[i];
        targets[size_t(b) * stride + i] = i + 1 < x.size() ? x[i + 1] : -1;
      }
      lengths.push_back(int32_t(x.size()));
    }
    float loss = 0;
    std::vector<float> g(size_t(lm_rt_num_params(desc)));
    EXPECT_EQ(lm_rt_loss_and_grad(model, inputs.data(), targets.data(), lengths.data(), batch, stride, &loss, g.data()),
              LM_OK)
        << lm_last_error();
    WeightSet out;
    for (int32_t i = 0; i < desc->num_tensors; ++i) {
      const char *name = nullptr;
      int64_t offset = 0, count = 0;
      lm_rt_param_info(desc, i, &name, &offset, &count);
      Tensor t;
      t.shape.assign(desc->tensors[i].shape, desc->tensors[i].shape + desc->tensors[i].rank);
      t.data.assign(g.begin() + offset, g.begin() + offset + count);
      out.tensors[name] = std::move(t);
    }
    return {loss, out};
  }
};

/// |got - want| <= tol * max(1, |want|) for every token log-prob and score; equal counts.
void expectScoresNear(const std::vector<reference::ScoreResult> &got, const std::vector<nlohmann::json> &want,
                      double tol, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t b = 0; b < got.size(); ++b) {
    auto lp = want[b]["token_logprobs"].get<std::vector<double>>();
    ASSERT_EQ(got[b].tokenLogprobs.size(), lp.size()) << what << " sentence " << b;
    for (size_t t = 0; t < lp.size(); ++t)
      EXPECT_NEAR(got[b].tokenLogprobs[t], lp[t], tol * std::max(1.0, std::fabs(lp[t])))
          << what << " sentence " << b << " position " << t;
    const double score = want[b]["score"].get<double>();
    EXPECT_NEAR(got[b].score, score, tol * std::max(1.0, std::fabs(score))) << what << " sentence " << b;
    EXPECT_EQ(got[b].nScored, want[b]["n_scored"].get<int64_t>()) << what << " sentence " << b;
  }
}

std::vector<nlohmann::json> asJson(const std::vector<reference::ScoreResult> &r) {
  std::vector<nlohmann::json> out;
  for (const auto &s : r)
    out.push_back({{"token_logprobs", s.tokenLogprobs}, {"score", s.score}, {"n_scored", s.nScored}});
  return out;
}

/// Issue 14's gradient tolerance: per tensor, relative to max(its largest entry, 1e-2 of the largest overall).
void expectGradsNear(const WeightSet &got, const WeightSet &want, double tol, const std::string &what) {
  double overall = 0;
  for (const auto &[name, t] : want.tensors)
    for (float v : t.data)
      overall = std::max(overall, double(std::fabs(v)));
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (const auto &[name, t] : want.tensors) {
    ASSERT_TRUE(got.has(name)) << what << ": no gradient for " << name;
    const Tensor &g = got.get(name);
    ASSERT_EQ(g.shape, t.shape) << what << ": " << name;
    double scale = 1e-2 * overall, worst = 0;
    for (float v : t.data)
      scale = std::max(scale, double(std::fabs(v)));
    size_t at = 0;
    for (size_t k = 0; k < t.data.size(); ++k)
      if (double e = std::fabs(double(g.data[k]) - t.data[k]); e > worst)
        worst = e, at = k;
    EXPECT_LE(worst, tol * scale) << what << ": " << name << " at " << at << ": got " << g.data[at] << ", want "
                                  << t.data[at];
  }
}

class NGramGolden : public ::testing::TestWithParam<std::string> {};

/// Reference and compiled scores (lambda 0 and the spec's) and gradients against PyTorch (1e-4 relative).
TEST_P(NGramGolden, MatchesTorch) {
  const fs::path dir = fixtureDir(GetParam());
  ModelSpec spec = loadSpec((dir / "spec.toml").string());
  const std::string weightsPath = (dir / "weights.safetensors").string();
  WeightSet weights = loadModelWeights(weightsPath, spec);
  auto sentences = readIds(dir / "ids.txt");
  for (double lambda : {0.0, spec.ngram->ensembleLambda}) {
    char name[64];
    std::snprintf(name, sizeof name, "score_l%.1f.jsonl", lambda);
    auto want = readJsonLines(dir / name);
    ASSERT_FALSE(want.empty()) << dir / name;
    ModelSpec s = spec;
    s.ngram->ensembleLambda = lambda;
    expectScoresNear(reference::score(s, weights, sentences, 2), want, 1e-4, std::string("reference ") + name);
    if (lambda == 0) // compiled lambda = 0: NGram.LambdaZeroIsTheUniLMScore (one compile less here)
      continue;
    Library lib(s, {}, "score", weightsPath);
    expectScoresNear(lib.score(sentences), want, 1e-4, std::string("compiled ") + name);
  }
  const nlohmann::json grad = nlohmann::json::parse(std::ifstream(dir / "grad.json"));
  const WeightSet wantGrads = readSafetensors((dir / "grad.safetensors").string());
  std::vector<std::vector<int32_t>> targets;
  for (const auto &x : sentences) {
    targets.emplace_back(x.begin() + 1, x.end());
    targets.back().push_back(-1);
  }
  reference::LossAndGrad ref =
      reference::lossAndGrad(spec, weights, sentences, targets, spec.train.labelSmoothing, 2);
  EXPECT_NEAR(ref.loss, grad["loss"].get<double>(), 1e-5 * grad["loss"].get<double>());
  EXPECT_EQ(ref.targets, grad["targets"].get<int64_t>());
  expectGradsNear(ref.grads, wantGrads, 1e-4, "reference " + GetParam());
  driver::LibraryOptions train;
  train.train = true;
  Library lib(spec, train, "train", weightsPath);
  auto [loss, grads] = lib.lossAndGrad(sentences);
  EXPECT_NEAR(loss, grad["loss"].get<double>(), 1e-5 * grad["loss"].get<double>());
  expectGradsNear(grads, wantGrads, 1e-4, "compiled " + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NGramGolden,
                         ::testing::Values("n2_wdr", "n3_wdr_pre_ls", "n3_sim_untied", "n4_wdr_ls_nobias",
                                           "n4_sim_pre"));

/// An odd-sized ngram spec built in code (vocab 31, d 10, 2 heads, d_ff 14, d_hidden 11, max_len 9).
ModelSpec oddSpec(int64_t n, bool wdr, double lambda) {
  ModelSpec s;
  s.name = "ngram_odd";
  s.family = Family::NGram;
  s.dims = Dims{31, 9, 10, 2, 14, 2};
  applyFamilyDefaults(s);
  s.headTransform = false;
  s.ngram = NGramOptions{};
  s.ngram->n = n, s.ngram->wdr = wdr, s.ngram->ensembleLambda = lambda, s.ngram->dHidden = 11;
  return s;
}

std::vector<std::vector<int32_t>> oddSentences() {
  return {{3, 7, 1}, {3, 9, 12, 30, 5, 8, 17, 22, 1}, {3, 1}, {3, 11, 11, 6, 1}, {5}, {3, 29, 14, 20, 1, 6}};
}

/// lambda = 0 is exactly the uniLM score of the same trunk, reference and compiled (optimized and naive).
TEST(NGram, LambdaZeroIsTheUniLMScore) {
  ModelSpec ngram = oddSpec(3, true, 0.0);
  ModelSpec unilm = ngram;
  unilm.family = Family::UniLM, unilm.ngram.reset(), unilm.name = "unilm_odd";
  WeightSet w = test::randomWeights(ngram, 4), trunk;
  for (const TensorInfo &t : expectedTensors(unilm))
    trunk.tensors[t.name] = w.get(t.name);
  auto sentences = oddSentences();
  auto want = reference::score(unilm, trunk, sentences, 1);
  auto got = reference::score(ngram, w, sentences, 1);
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].tokenLogprobs, want[b].tokenLogprobs) << "reference, sentence " << b;
    EXPECT_EQ(got[b].nScored, want[b].nScored);
  }
  const fs::path dir = fs::temp_directory_path() / ("lmcc-ngram-l0-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  writeSafetensors((dir / "ngram.safetensors").string(), w);
  writeSafetensors((dir / "unilm.safetensors").string(), trunk);
  Library u(unilm, {}, "uopt", (dir / "unilm.safetensors").string());
  auto us = u.score(sentences);
  for (bool naive : {false, true}) {
    driver::LibraryOptions o;
    o.naive = naive;
    Library g(ngram, o, naive ? "gnaive" : "gopt", (dir / "ngram.safetensors").string());
    auto gs = g.score(sentences);
    for (size_t b = 0; b < us.size(); ++b)
      for (size_t t = 0; t < us[b].tokenLogprobs.size(); ++t)
        EXPECT_NEAR(gs[b].tokenLogprobs[t], us[b].tokenLogprobs[t], 1e-6)
            << (naive ? "naive" : "optimized") << " sentence " << b << " position " << t;
  }
  fs::remove_all(dir);
}

/// Naive and optimized pipelines agree with the reference on odd sizes for n = 2, 3, 4 with and without WDR
/// (score with lambda 0.3; gradients with label smoothing for n = 3); the naive pipeline for n = 3 with WDR.
TEST(NGram, PipelinesMatchReferenceOnOddSizes) {
  const fs::path dir = fs::temp_directory_path() / ("lmcc-ngram-odd-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto sentences = oddSentences();
  std::vector<std::vector<int32_t>> train = sentences, targets;
  train.erase(train.begin() + 4); // the length-1 sentence has no target: kept out of the loss batch
  for (const auto &x : train) {
    targets.emplace_back(x.begin() + 1, x.end());
    targets.back().push_back(-1);
  }
  for (int64_t n : {2, 3, 4})
    for (bool wdr : {false, true}) {
      ModelSpec spec = oddSpec(n, wdr, 0.3);
      spec.name = "ngram_odd_" + std::to_string(n) + (wdr ? "_wdr" : "_sim");
      if (n == 3)
        spec.trainGiven = true, spec.train.labelSmoothing = 0.1;
      WeightSet w = test::randomWeights(spec, uint64_t(n * 2 + wdr));
      const std::string path = (dir / (spec.name + ".safetensors")).string();
      writeSafetensors(path, w);
      auto want = asJson(reference::score(spec, w, sentences, 1));
      // The optimized pipeline (the heads' loss and gradient one lm.ngram_loss_and_grad), the naive one, and the
      // optimized one without lm-fuse-loss-grad (the pair); the last two for one case each (compile time).
      for (const char *pipeline : {"optimized", "naive", "no-fuse-loss-grad"}) {
        const bool naive = std::string(pipeline) == "naive";
        if (std::string(pipeline) != "optimized" && !(n == 3 && wdr))
          continue;
        driver::LibraryOptions o;
        o.naive = naive;
        o.train = true;
        if (std::string(pipeline) == "no-fuse-loss-grad")
          o.disabledPasses = {"lm-fuse-loss-grad"};
        Library lib(spec, o, pipeline, path);
        expectScoresNear(lib.score(sentences), want, 1e-5, spec.name + " " + pipeline);
        reference::LossAndGrad ref = reference::lossAndGrad(spec, w, train, targets, spec.train.labelSmoothing, 1);
        auto [loss, grads] = lib.lossAndGrad(train);
        EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss) << spec.name;
        expectGradsNear(grads, ref.grads, 1e-4, spec.name + " " + pipeline);
      }
    }
  fs::remove_all(dir);
}

/// The IR of the contract: the conjugate, the logit-layer ensemble and the n-gram loss (no probability-space
/// lm.interpolate). The stop-gradient itself is checked numerically by the fixtures (ngram_ref.py's finite
/// differences hold the conjugate's W fixed; the gradients above match them).
TEST(NGram, IRUsesTheContractOps) {
  ModelSpec spec = oddSpec(3, true, 0.4);
  spec.trainGiven = true;
  mlir::MLIRContext ctx;
  auto module = buildModule(ctx, spec, /*train=*/true);
  ASSERT_TRUE(module);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  EXPECT_NE(text.find("lm.wdr_conjugate"), std::string::npos);
  EXPECT_NE(text.find("lm.ngram_loss"), std::string::npos);
  EXPECT_NE(text.find("lm.ngram_ensemble"), std::string::npos);
  EXPECT_EQ(text.find("lm.interpolate"), std::string::npos) << "the ensemble mixes logits, not probabilities";
}

TEST(NGram, SpecContract) {
  const std::string base = "name = \"m\"\nfamily = \"ngram\"\n[dims]\nvocab = 50\nmax_len = 16\nd_model = 12\n"
                           "heads = 2\nd_ff = 20\nlayers = 1\n";
  ModelSpec s = parseSpec(base, "t.toml");
  EXPECT_FALSE(s.headTransform);
  EXPECT_EQ(s.ngram->dHidden, 12);
  EXPECT_EQ(resolvedObjective(s), Objective::NGram);
  ModelSpec h = parseSpec(base + "[ngram]\nd_hidden = 7\n", "t.toml");
  EXPECT_EQ(h.ngram->dHidden, 7);
  auto errorOf = [](const std::string &text) {
    try {
      parseSpec(text, "t.toml");
    } catch (const SpecError &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(errorOf(base + "[head]\ntransform = true\n").find("'head.transform': family \"ngram\" has no head transform"),
            std::string::npos);
  EXPECT_NE(errorOf(base + "[ngram]\nd_hidden = 0\n").find("'ngram.d_hidden'"), std::string::npos);
  EXPECT_NE(errorOf(base + "[train]\nobjective = \"causal\"\n").find("'train.objective'"), std::string::npos);
  const std::string unilm = "name = \"m\"\nfamily = \"unilm\"\n[dims]\nvocab = 50\nmax_len = 16\nd_model = 12\n"
                            "heads = 2\nd_ff = 20\nlayers = 1\n[train]\nobjective = \"ngram\"\n";
  EXPECT_NE(errorOf(unilm).find("\"ngram\" needs family \"ngram\""), std::string::npos);
  EXPECT_NE(errorOf(base + "[ngram]\nn = 1\n").find("'ngram.n'"), std::string::npos);
}

} // namespace
