// Compiled training (lmcc compile --train, liblmrt's trainer) against the reference executor's
// lossAndGrad and the PyTorch fixtures of tests/golden/train_fixtures: gradients of every family on
// odd sizes through every pipeline, optimizer steps, resume, thread-count independence, bad input.
#include "driver/Compile.h"
#include "passes/Passes.h"
#include "runtime/lib/Internal.h"
#include "runtime/lib/lmrt.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/ModelWeights.h"
#include "tests/unit/OptimizedIR.h"
#include "tests/unit/RandomWeights.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

namespace fs = std::filesystem;
using namespace lmcc;

namespace {

fs::path runtimeDir() { return fs::path(test::kRuntimeDir); }

/// A library compiled with --train, loaded with `weights`.
struct Trained {
  void *handle = nullptr;
  const lm_model_desc *desc = nullptr;
  lm_model *model = nullptr;
  fs::path dir;

  Trained(const ModelSpec &spec, const driver::LibraryOptions &base, const std::string &tag) {
    dir = fs::temp_directory_path() / ("lmcc-train-test-" + spec.name + "-" + tag + "-" + std::to_string(::getpid()));
    driver::LibraryOptions options = base;
    options.train = true;
    options.outputDir = dir.string();
    options.runtimeDir = runtimeDir().string();
    std::string err = driver::compileLibrary(spec, options);
    EXPECT_EQ(err, "");
    handle = dlopen((dir / ("lib" + spec.name + ".so")).c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle, nullptr) << dlerror();
    if (handle)
      desc = reinterpret_cast<const lm_model_desc *(*)()>(dlsym(handle, (spec.name + "_descriptor").c_str()))();
  }
  bool load(const std::string &weightsPath) {
    if (model)
      lm_rt_free(model);
    model = nullptr;
    return desc && lm_rt_load(desc, weightsPath.c_str(), &model) == LM_OK;
  }
  ~Trained() {
    if (model)
      lm_rt_free(model);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

/// A batch padded to [batch, stride].
struct Batch {
  std::vector<int32_t> inputs, targets, lengths;
  int32_t batch = 0, stride = 0;
  std::vector<std::vector<int32_t>> raggedInputs, raggedTargets;

  static Batch of(const std::vector<std::vector<int32_t>> &in, const std::vector<std::vector<int32_t>> &tg) {
    Batch b;
    b.raggedInputs = in, b.raggedTargets = tg;
    b.batch = int32_t(in.size());
    for (const auto &s : in)
      b.stride = std::max<int32_t>(b.stride, int32_t(s.size()) + 2); // a stride past the longest
    b.inputs.assign(size_t(b.batch) * b.stride, 7);
    b.targets.assign(size_t(b.batch) * b.stride, 9); // garbage past the lengths must not matter
    for (int32_t s = 0; s < b.batch; ++s) {
      std::copy(in[s].begin(), in[s].end(), b.inputs.begin() + size_t(s) * b.stride);
      std::copy(tg[s].begin(), tg[s].end(), b.targets.begin() + size_t(s) * b.stride);
      b.lengths.push_back(int32_t(in[s].size()));
    }
    return b;
  }
};

/// The gradient of the packed layout as canonical tensors.
WeightSet gradsOf(const lm_model_desc *d, const std::vector<float> &packed) {
  WeightSet out;
  for (int32_t i = 0; i < d->num_tensors; ++i) {
    const char *name = nullptr;
    int64_t offset = 0, count = 0;
    EXPECT_EQ(lm_rt_param_info(d, i, &name, &offset, &count), LM_OK);
    Tensor t;
    t.shape.assign(d->tensors[i].shape, d->tensors[i].shape + d->tensors[i].rank);
    t.data.assign(packed.begin() + offset, packed.begin() + offset + count);
    out.tensors[name] = std::move(t);
  }
  return out;
}

/// The loss_grad kernel of `lib` called directly on batch `b` (packed as the trainer does) with a gradient buffer
/// whose every float is `fill` beforehand; the gradient in the packed layout. The kernel writes every tensor's slot
/// (lmrt.h), which the trainer relies on: it does not zero the buffer between steps.
std::vector<float> kernelGradient(const Trained &lib, const Batch &b, float fill) {
  const lm_model_desc &d = *lib.desc;
  int32_t n = 0;
  for (int32_t len : b.lengths)
    n = std::max(n, len);
  std::vector<int32_t> inputs(size_t(b.batch) * n, d.pad_id), targets(size_t(b.batch) * n, -1), lengths = b.lengths;
  for (int32_t s = 0; s < b.batch; ++s)
    for (int32_t i = 0; i < b.lengths[s]; ++i) {
      inputs[size_t(s) * n + i] = b.inputs[size_t(s) * b.stride + i];
      targets[size_t(s) * n + i] = b.targets[size_t(s) * b.stride + i];
    }
  std::vector<float> ce(inputs.size()), grads(size_t(d.total_floats), fill);
  using lmrt::detail::memref1, lmrt::detail::memref2;
  lm_memref1f w = memref1(lib.model->weights, d.total_floats), g = memref1(grads.data(), d.total_floats);
  lm_memref2i in = memref2(inputs.data(), b.batch, n), tg = memref2(targets.data(), b.batch, n);
  lm_memref1i len = memref1(lengths.data(), b.batch);
  lm_memref2f ceRef = memref2(ce.data(), b.batch, n);
  d.loss_grad(&w, &in, &tg, &len, &ceRef, &g);
  std::vector<float> packed;
  for (int32_t i = 0; i < d.num_tensors; ++i) {
    auto slot = grads.begin() + d.tensors[i].offset;
    packed.insert(packed.end(), slot, slot + lmrt::detail::descNumel(d.tensors[i]));
  }
  return packed;
}

/// Issue 14's tolerance: |got - want| <= tol * max(max |want| of the tensor, 1e-2 * max |want| overall).
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
    double scale = 0;
    for (float v : t.data)
      scale = std::max(scale, double(std::fabs(v)));
    scale = std::max(scale, 1e-2 * overall);
    double worst = 0;
    size_t at = 0;
    for (size_t k = 0; k < t.data.size(); ++k)
      if (double e = std::fabs(double(g.data[k]) - t.data[k]); e > worst)
        worst = e, at = k;
    EXPECT_LE(worst, tol * scale) << what << ": " << name << " at flat index " << at << ": got " << g.data[at]
                                  << ", want " << t.data[at];
  }
}

using lmcc::test::randomWeights;

/// Ragged sentences with every objective's kind of targets: next token, own token, a few masked rows,
/// -1 elsewhere; one sentence without any target, lengths 1 and max_len.
Batch randomBatch(const ModelSpec &spec, uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> in, tg;
  for (int i = 0; i < count; ++i) {
    int64_t len = i == 0 ? 1 : i == 1 ? spec.dims.maxLen : 2 + int64_t(rng() % (spec.dims.maxLen - 1));
    std::vector<int32_t> x(len), y(len, -1);
    for (auto &id : x)
      id = int32_t(rng() % spec.dims.vocab);
    for (int64_t t = 0; t < len; ++t)
      if (i != 2 && rng() % 3 != 0)
        y[t] = int32_t(rng() % spec.dims.vocab);
    if (i == 0)
      y[0] = 3;
    in.push_back(x), tg.push_back(y);
  }
  return Batch::of(in, tg);
}

ModelSpec tiny(const char *name, Family family) {
  ModelSpec s;
  s.name = name;
  s.family = family;
  s.dims = Dims{37, 13, 30, 3, 22, 2};
  applyFamilyDefaults(s);
  return s;
}

struct Case {
  const char *name;
  ModelSpec spec;
};
void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"unilm_post_tied", tiny("unilm_post_tied", Family::UniLM)});
  {
    ModelSpec s = tiny("unilm_pre_untied_sin", Family::UniLM);
    s.norm = NormPlacement::Pre, s.tied = false, s.position = PositionKind::Sinusoidal, s.activation = Activation::Relu;
    s.train.labelSmoothing = 0.1, s.trainGiven = true;
    out.push_back({"unilm_pre_untied_sin", s});
  }
  // lm-prune-loss-rows: the last layer's query side on the rows with a target only (mask none, no relative
  // positions, no attention dropout): the runtime's attention backward (head size 10) and the vector one (16), post- and
  // pre-norm; the batch has a sentence without targets and a sentence of length 1.
  out.push_back({"bilm_post_tied", tiny("bilm_post_tied", Family::BiLM)});
  {
    ModelSpec s = tiny("bilm_pre_untied_vector", Family::BiLM);
    s.norm = NormPlacement::Pre, s.tied = false, s.dims.dModel = 32, s.dims.heads = 2, s.dims.maxLen = 37;
    s.train.labelSmoothing = 0.1, s.trainGiven = true;
    out.push_back({"bilm_pre_untied_vector", s});
  }
  {
    // The last layer's dropouts on the packed rows (lm.dropout rows(...)): the masks of those rows.
    ModelSpec s = tiny("bilm_dropout", Family::BiLM);
    s.trainGiven = true, s.train.dropout = 0.2, s.train.seed = 3;
    out.push_back({"bilm_dropout", s});
  }
  {
    ModelSpec s = tiny("bilm_relpos_nohead", Family::BiLM);
    s.relativePositions = 3, s.headTransform = false, s.headBias = false, s.activation = Activation::GeluTanh;
    out.push_back({"bilm_relpos_nohead", s});
  }
  {
    ModelSpec s = tiny("tta_position_ls", Family::TTA);
    s.train.labelSmoothing = 0.2, s.trainGiven = true;
    out.push_back({"tta_position_ls", s});
  }
  {
    ModelSpec s = tiny("unilm_dropout", Family::UniLM);
    s.trainGiven = true, s.train.dropout = 0.25, s.train.seed = 77;
    out.push_back({"unilm_dropout", s});
  }
  {
    ModelSpec s = tiny("tta_maskpos_dropout_pre", Family::TTA);
    s.firstQuery = FirstQuery::MaskPosition, s.norm = NormPlacement::Pre;
    s.trainGiven = true, s.train.dropout = 0.1;
    out.push_back({"tta_maskpos_dropout_pre", s});
  }
  // [train] attention_dropout: the probabilities dropped in the decomposed chain (relative values see the
  // dropped ones), with and without hidden dropout; T-TA's keys and values are the embedding stream.
  {
    ModelSpec s = tiny("bilm_relpos_attention_dropout", Family::BiLM);
    s.relativePositions = 3, s.dims.dModel = 32, s.dims.heads = 2;
    s.trainGiven = true, s.train.attentionDropout = 0.2, s.train.dropout = 0.1, s.train.seed = 5;
    out.push_back({"bilm_relpos_attention_dropout", s});
  }
  {
    ModelSpec s = tiny("tta_attention_dropout", Family::TTA);
    s.trainGiven = true, s.train.attentionDropout = 0.3;
    out.push_back({"tta_attention_dropout", s});
  }
  {
    ModelSpec s = tiny("tta_maskpos_pre_rel", Family::TTA);
    s.firstQuery = FirstQuery::MaskPosition, s.norm = NormPlacement::Pre, s.embeddingNorm = false;
    s.relativePositions = 2, s.dims.dModel = 32, s.dims.heads = 2;
    out.push_back({"tta_maskpos_pre_rel", s});
  }
  // Head sizes 16 and 32 take the generated vector backward of lm.attention (the sizes above the runtime's C++
  // kernel); max_len 37 gives full 16-key blocks, a ragged tail and several 8-row tiles.
  {
    ModelSpec s = tiny("unilm_vector_attention", Family::UniLM);
    s.dims.dModel = 32, s.dims.heads = 2, s.dims.maxLen = 37;
    out.push_back({"unilm_vector_attention", s});
  }
  {
    ModelSpec s = tiny("unilm_vector_anticausal", Family::UniLM);
    s.mask = MaskKind::Anticausal, s.dims.dModel = 48, s.dims.heads = 3, s.dims.maxLen = 21;
    out.push_back({"unilm_vector_anticausal", s});
  }
  {
    ModelSpec s = tiny("bilm_vector_attention", Family::BiLM);
    s.dims.dModel = 64, s.dims.heads = 2, s.dims.maxLen = 37;
    out.push_back({"bilm_vector_attention", s});
  }
  {
    ModelSpec s = tiny("tta_vector_attention", Family::TTA);
    s.dims.dModel = 32, s.dims.heads = 2, s.dims.maxLen = 29;
    out.push_back({"tta_vector_attention", s});
  }
  // Relative positions in the vector backward (and tta_maskpos_pre_rel above): clips below and above the length.
  {
    ModelSpec s = tiny("unilm_vector_relpos", Family::UniLM);
    s.dims.dModel = 32, s.dims.heads = 2, s.dims.maxLen = 37, s.relativePositions = 5;
    out.push_back({"unilm_vector_relpos", s});
  }
  {
    ModelSpec s = tiny("bilm_vector_anticausal_relpos", Family::BiLM);
    s.mask = MaskKind::Anticausal, s.dims.dModel = 48, s.dims.heads = 3, s.dims.maxLen = 21;
    s.relativePositions = 30;
    out.push_back({"bilm_vector_anticausal_relpos", s});
  }
  return out;
}

class TrainCompiled : public ::testing::TestWithParam<Case> {};

/// Gradients of the optimized pipeline with both GEMMs and 1 or 2 threads against the reference; the
/// pipelines that leave out one pass are compiled too where the training IR differs.
TEST_P(TrainCompiled, GradientsMatchReference) {
  const ModelSpec &spec = GetParam().spec;
  WeightSet weights = randomWeights(spec, 5);
  Batch b = randomBatch(spec, 17, 6);
  reference::LossAndGrad want =
      reference::lossAndGrad(spec, weights, b.raggedInputs, b.raggedTargets, spec.train.labelSmoothing, 2);

  // Which pipelines give a different training function than the full one (the others compile the same IR).
  auto trainingIR = [&](const driver::LibraryOptions &options) { return test::optimizedIR(spec, options, "loss_grad"); };
  driver::LibraryOptions full;
  full.train = true;
  const std::string fullIR = trainingIR(full);
  std::vector<std::pair<std::string, driver::LibraryOptions>> pipelines{{"opt", {}}, {"eigen", {}}};
  pipelines[1].second.gemm = "eigen";
  std::vector<std::string> flags = defaultPipeline();
  flags.insert(flags.end(), trainingPipeline().begin(), trainingPipeline().end());
  for (const std::string &flag : flags) {
    driver::LibraryOptions o;
    o.train = true;
    o.disabledPasses = {flag};
    if (trainingIR(o) != fullIR)
      pipelines.push_back({"no-" + flag.substr(3), o});
  }
  EXPECT_GE(pipelines.size(), 3u) << "dropping lm-fuse-logprob must change the training IR";
  // The loss head's forward and backward are one lm.token_loss_and_grad (lm-fuse-loss-grad): without it, the pair.
  EXPECT_EQ(std::count_if(pipelines.begin(), pipelines.end(),
                          [](const auto &p) { return p.first == "no-fuse-loss-grad"; }),
            1);
  // Attention dropout keeps the training entry's attention decomposed (lm-fuse-attention finds dropout between
  // softmax and the value product); without it, dropping the pass must change the training IR.
  const bool attentionDropout = spec.train.attentionDropout > 0;
  EXPECT_EQ(std::count_if(pipelines.begin(), pipelines.end(), [](const auto &p) { return p.first == "no-fuse-attention"; }),
            attentionDropout ? 0 : 1);

  // lm-prune-loss-rows changes the training IR exactly where the last attention has no mask, no relative positions
  // and no attention dropout (the biLM's masked objective).
  const bool prunesLossRows = spec.mask == MaskKind::None && spec.relativePositions == 0 && !attentionDropout;
  EXPECT_EQ(std::count_if(pipelines.begin(), pipelines.end(),
                          [](const auto &p) { return p.first == "no-prune-loss-rows"; }),
            prunesLossRows ? 1 : 0);

  std::string weightsPath = (fs::temp_directory_path() / ("lmcc-train-w-" + spec.name + "-" +
                                                          std::to_string(::getpid()) + ".safetensors"))
                                .string();
  writeSafetensors(weightsPath, weights);
  for (auto &[tag, options] : pipelines) {
    Trained lib(spec, options, tag);
    ASSERT_TRUE(lib.load(weightsPath)) << lm_last_error();
    std::vector<float> grads[2];
    for (int threads : {1, 2}) {
      lm_set_num_threads(threads);
      float loss = 0;
      std::vector<float> &g = grads[threads - 1];
      g.assign(size_t(lm_rt_num_params(lib.desc)), 0.0f);
      ASSERT_EQ(lm_rt_loss_and_grad(lib.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride,
                                    &loss, g.data()),
                LM_OK)
          << lm_last_error();
      EXPECT_NEAR(loss, want.loss, 1e-5 * std::max(1.0, std::fabs(want.loss))) << tag;
    }
    lm_set_num_threads(1);
    EXPECT_EQ(grads[0], grads[1]) << tag << ": gradients depend on the thread count";
    if (tag == "opt") // (the same dropout masks: lm_rt_loss_and_grad left step 0's context)
      EXPECT_EQ(kernelGradient(lib, b, std::nanf("")), grads[0]) << "a tensor's slot was not written by the kernel";
    expectGradsNear(gradsOf(lib.desc, grads[0]), want.grads, 1e-4, spec.name + " " + tag);

    float loss = 0;
    int64_t targets = 0;
    ASSERT_EQ(lm_rt_loss(lib.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride, &loss,
                         &targets),
              LM_OK);
    EXPECT_EQ(targets, want.targets);
    // The forward-only loss (validation) evaluates without dropout.
    ModelSpec eval = spec;
    eval.train.dropout = 0, eval.train.attentionDropout = 0;
    const bool dropout = spec.train.dropout > 0 || spec.train.attentionDropout > 0;
    const double evalLoss =
        dropout ? reference::lossAndGrad(eval, weights, b.raggedInputs, b.raggedTargets, spec.train.labelSmoothing, 1)
                      .loss
                : want.loss;
    EXPECT_NEAR(loss, evalLoss, 1e-5 * std::max(1.0, std::fabs(evalLoss))) << tag << " (forward-only loss)";
    if (dropout)
      EXPECT_GT(std::fabs(evalLoss - want.loss), 1e-3) << "dropout changed nothing";
  }
  fs::remove(weightsPath);
}

INSTANTIATE_TEST_SUITE_P(Families, TrainCompiled, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &info) { return std::string(info.param.name); });

/// The naive pipeline (decomposed attention, unfused head) gives the reference's gradients too. One
/// case: every decomposed op's VJP (relative positions, mask+position query) on a small T-TA; compiling
/// naive code takes about a minute here.
TEST(TrainNaive, GradientsMatchReference) {
  ModelSpec spec = cases().back().spec;
  spec.name = "tta_naive";
  spec.dims.maxLen = 9, spec.dims.vocab = 23;
  WeightSet weights = randomWeights(spec, 3);
  Batch b = randomBatch(spec, 23, 4);
  reference::LossAndGrad want = reference::lossAndGrad(spec, weights, b.raggedInputs, b.raggedTargets, 0.0, 1);
  std::string weightsPath = (fs::temp_directory_path() / ("lmcc-train-naive-" + std::to_string(::getpid()) +
                                                          ".safetensors"))
                                .string();
  writeSafetensors(weightsPath, weights);
  driver::LibraryOptions naive;
  naive.naive = true;
  Trained lib(spec, naive, "naive");
  ASSERT_TRUE(lib.load(weightsPath)) << lm_last_error();
  float loss = 0;
  std::vector<float> g(size_t(lm_rt_num_params(lib.desc)));
  ASSERT_EQ(lm_rt_loss_and_grad(lib.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride,
                                &loss, g.data()),
            LM_OK)
      << lm_last_error();
  EXPECT_NEAR(loss, want.loss, 1e-5 * std::max(1.0, std::fabs(want.loss)));
  expectGradsNear(gradsOf(lib.desc, g), want.grads, 1e-4, "naive");
  fs::remove(weightsPath);
}

// --- The PyTorch fixtures -------------------------------------------------------------------

nlohmann::json readJson(const fs::path &path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

Batch batchOf(const nlohmann::json &j) {
  return Batch::of(j["inputs"].get<std::vector<std::vector<int32_t>>>(),
                   j["targets"].get<std::vector<std::vector<int32_t>>>());
}

class TrainGolden : public ::testing::TestWithParam<std::string> {};

/// lmcc's gradients and three optimizer steps (warm-up, clipping, the spec's optimizer and schedule)
/// against torch autograd + torch.optim (tests/golden/make_golden_train.py).
TEST_P(TrainGolden, MatchesTorch) {
  const fs::path dir = fs::path(test::kSourceDir) / "tests/golden/train_fixtures" / GetParam();
  ModelSpec spec = loadSpec((dir / "spec.toml").string());
  Trained lib(spec, {}, "golden");
  const std::string weightsPath = (dir / "weights.safetensors").string();
  ASSERT_TRUE(lib.load(weightsPath)) << lm_last_error();

  Batch b = batchOf(readJson(dir / "batch.json"));
  nlohmann::json expected = readJson(dir / "grad.json");
  float loss = 0;
  std::vector<float> g(size_t(lm_rt_num_params(lib.desc)));
  ASSERT_EQ(lm_rt_loss_and_grad(lib.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride,
                                &loss, g.data()),
            LM_OK)
      << lm_last_error();
  EXPECT_NEAR(loss, expected["loss"].get<double>(), 1e-5 * expected["loss"].get<double>());
  expectGradsNear(gradsOf(lib.desc, g), readSafetensors((dir / "grads.safetensors").string()), 1e-4, GetParam());

  lm_trainer *trainer = nullptr;
  ASSERT_EQ(lm_rt_trainer_new(lib.model, &trainer), LM_OK) << lm_last_error();
  std::vector<Batch> batches;
  std::ifstream lines(dir / "batches.jsonl");
  for (std::string line; std::getline(lines, line);)
    if (!line.empty())
      batches.push_back(batchOf(nlohmann::json::parse(line)));
  std::ifstream stepsFile(dir / "steps.jsonl");
  std::string line;
  for (size_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(std::getline(stepsFile, line));
    nlohmann::json want = nlohmann::json::parse(line);
    const Batch &sb = batches[s % batches.size()];
    double lr = 0, norm = 0;
    ASSERT_EQ(lm_rt_train_step_ex(trainer, sb.inputs.data(), sb.targets.data(), sb.lengths.data(), sb.batch, sb.stride,
                                  &loss, &lr, &norm),
              LM_OK)
        << lm_last_error();
    EXPECT_NEAR(loss, want["loss"].get<double>(), 1e-5 * want["loss"].get<double>()) << "step " << s + 1;
    EXPECT_NEAR(lr, want["lr"].get<double>(), 1e-12) << "step " << s + 1;
    EXPECT_NEAR(norm, want["grad_norm"].get<double>(), 1e-4 * want["grad_norm"].get<double>()) << "step " << s + 1;
  }
  const std::string out = (lib.dir / "after3.safetensors").string();
  ASSERT_EQ(lm_rt_save_weights(lib.model, out.c_str()), LM_OK);
  WeightSet got = readSafetensors(out), after = readSafetensors((dir / "after3.safetensors").string());
  for (const auto &[name, t] : after.tensors) {
    ASSERT_TRUE(got.has(name)) << name;
    for (size_t k = 0; k < t.data.size(); ++k)
      ASSERT_NEAR(got.get(name).data[k], t.data[k], 1e-5) << name << " at flat index " << k;
  }
  lm_rt_trainer_free(trainer);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainGolden,
                         ::testing::Values("unilm_post_tied", "bilm_pre_untied_ls", "tta_relpos_nohead_ls",
                                           "tta_pre_untied_relu"));

// --- Resume, determinism, errors -------------------------------------------------------------

/// K steps, save, a new model and trainer loaded from the files, K more steps: bit-identical to 2K
/// straight steps (weights and moments), and to the same run on 2 threads.
TEST(TrainResume, BitIdenticalToStraightRun) {
  ModelSpec spec = tiny("resume_tta", Family::TTA);
  spec.trainGiven = true, spec.train.warmupSteps = 2, spec.train.steps = 10, spec.train.lr = 1e-2;
  spec.train.dropout = 0.1, spec.train.attentionDropout = 0.1; // masks depend on the step: a resumed run
                                                                // must continue the count
  WeightSet weights = randomWeights(spec, 9);
  Trained lib(spec, {}, "resume");
  const std::string w0 = (lib.dir / "w0.safetensors").string();
  writeSafetensors(w0, weights);
  std::vector<Batch> batches{randomBatch(spec, 1, 5), randomBatch(spec, 2, 3), randomBatch(spec, 3, 7)};
  auto run = [&](int threads, int steps, const std::string &from, const std::string &trainerFrom) {
    lm_set_num_threads(threads);
    EXPECT_TRUE(lib.load(from)) << lm_last_error();
    lm_trainer *t = nullptr;
    EXPECT_EQ(lm_rt_trainer_new(lib.model, &t), LM_OK) << lm_last_error();
    if (!trainerFrom.empty())
      EXPECT_EQ(lm_rt_trainer_load(t, trainerFrom.c_str()), LM_OK) << lm_last_error();
    for (int k = 0; k < steps; ++k) {
      const Batch &b = batches[size_t(lm_rt_trainer_steps(t)) % batches.size()];
      float loss = 0;
      EXPECT_EQ(lm_rt_train_step(t, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride, &loss),
                LM_OK)
          << lm_last_error();
    }
    return t;
  };
  auto save = [&](lm_trainer *t, const std::string &name) {
    std::string path = (lib.dir / name).string();
    EXPECT_EQ(lm_rt_trainer_save(t, path.c_str()), LM_OK) << lm_last_error();
    lm_rt_trainer_free(t);
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string straight = save(run(1, 6, w0, ""), "straight.safetensors");
  lm_trainer *half = run(1, 3, w0, "");
  save(half, "half.safetensors");
  ASSERT_EQ(lm_rt_save_weights(lib.model, (lib.dir / "half_w.safetensors").c_str()), LM_OK);
  const std::string resumed =
      save(run(1, 3, (lib.dir / "half_w.safetensors").string(), (lib.dir / "half.safetensors").string()),
           "resumed.safetensors");
  EXPECT_TRUE(straight == resumed) << "resume after 3 steps differs from 6 straight steps";
  const std::string twoThreads = save(run(2, 6, w0, ""), "two.safetensors");
  lm_set_num_threads(1);
  EXPECT_TRUE(straight == twoThreads) << "the run depends on the thread count";
}

TEST(TrainErrors, BadBatchesAreReported) {
  ModelSpec spec = tiny("errors_unilm", Family::UniLM);
  Trained lib(spec, {}, "errors");
  const std::string w = (lib.dir / "w.safetensors").string();
  writeSafetensors(w, randomWeights(spec, 1));
  ASSERT_TRUE(lib.load(w));
  Batch none = Batch::of({{1, 2, 3}}, {{-1, -1, -1}});
  float loss = 0;
  EXPECT_EQ(lm_rt_loss_and_grad(lib.model, none.inputs.data(), none.targets.data(), none.lengths.data(), 1, none.stride,
                                &loss, nullptr),
            LM_ERR_ARGUMENT);
  EXPECT_NE(std::string(lm_last_error()).find("no target"), std::string::npos) << lm_last_error();
  Batch outside = Batch::of({{1, 2, 3}}, {{2, 37, -1}});
  EXPECT_EQ(lm_rt_loss_and_grad(lib.model, outside.inputs.data(), outside.targets.data(), outside.lengths.data(), 1,
                                outside.stride, &loss, nullptr),
            LM_ERR_ARGUMENT);
  EXPECT_NE(std::string(lm_last_error()).find("targets[0*stride+1] = 37"), std::string::npos) << lm_last_error();
  Batch badId = Batch::of({{1, -4, 3}}, {{2, 3, 4}});
  EXPECT_EQ(lm_rt_loss_and_grad(lib.model, badId.inputs.data(), badId.targets.data(), badId.lengths.data(), 1,
                                badId.stride, &loss, nullptr),
            LM_ERR_ARGUMENT);
  lm_trainer *t = nullptr;
  EXPECT_EQ(lm_rt_trainer_new(nullptr, &t), LM_ERR_ARGUMENT);
  ASSERT_EQ(lm_rt_trainer_new(lib.model, &t), LM_OK);
  EXPECT_EQ(lm_rt_trainer_load(t, (lib.dir / "missing.safetensors").c_str()), LM_ERR_WEIGHTS);
  // A trainer file of another model is refused naming the tensor.
  EXPECT_EQ(lm_rt_trainer_load(t, w.c_str()), LM_ERR_WEIGHTS) << "a weights file has no optimizer state";
  lm_rt_trainer_free(t);
}

} // namespace
