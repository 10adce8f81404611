// Compiled libraries (lmcc's codegen + liblmrt) against the reference executor:
// every family and variant on odd sizes, lengths 1..max_len, mixed batches, and
// independence from thread count and batch composition.
#include "codegen/Emit/Object.h"
#include "driver/Compile.h"
#include "passes/Passes.h"
#include "runtime/lib/lmrt.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/ModelWeights.h"

#include "tests/unit/Bf16.h"
#include "tests/unit/OptimizedIR.h"
#include "tests/unit/RandomWeights.h"
#include "tests/unit/TestPaths.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <regex>
#include <new>
#include <set>

namespace fs = std::filesystem;
using namespace lmcc;

// Counting replacements of the global operator new (every C++ allocation of this process, liblmrt's included, goes
// through them): a steady-state call must not allocate (issue 4), counted while g_countNew is set.
namespace {
std::atomic<bool> g_countNew{false};
std::atomic<int64_t> g_news{0};
} // namespace

void *operator new(std::size_t n) {
  if (g_countNew.load(std::memory_order_relaxed))
    g_news.fetch_add(1, std::memory_order_relaxed);
  if (void *p = std::malloc(n ? n : 1))
    return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }

namespace {

struct Case {
  const char *name;
  ModelSpec spec;
};

ModelSpec base(const char *name, Family family) {
  ModelSpec s;
  s.name = name;
  s.family = family;
  s.dims = Dims{41, 19, 30, 3, 46, 2};
  applyFamilyDefaults(s);
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"unilm_post_tied", base("unilm_post_tied", Family::UniLM)});
  {
    ModelSpec s = base("unilm_pre_untied", Family::UniLM);
    s.norm = NormPlacement::Pre, s.tied = false, s.activation = Activation::GeluTanh;
    s.position = PositionKind::Sinusoidal, s.dims.layers = 3, s.eps = 1e-5;
    out.push_back({"unilm_pre_untied", s});
  }
  {
    // Five 512-column vocabulary chunks of the fused log-probability head (the last one 52 columns: a partial GEMM
    // panel and a tail past the 16-lane vectors), the rows' maxima in the last one (the weights below), and more
    // rows than one 128-row item (13 x 19): the chunks' sums rescaled to the row's max when they are combined.
    ModelSpec s = base("unilm_vocab2100", Family::UniLM);
    s.dims.vocab = 2100;
    out.push_back({"unilm_vocab2100", s});
  }
  {
    ModelSpec s = base("bilm_mp", Family::BiLM);
    out.push_back({"bilm_mp", s});
  }
  {
    ModelSpec s = base("bilm_pre_untied", Family::BiLM);
    s.norm = NormPlacement::Pre, s.tied = false, s.dims.layers = 3, s.firstQuery = FirstQuery::MaskPosition;
    out.push_back({"bilm_pre_untied", s});
  }
  {
    ModelSpec s = base("bilm_relu_relpos", Family::BiLM);
    s.activation = Activation::Relu, s.headTransform = false, s.relativePositions = 3, s.mask = MaskKind::Anticausal;
    s.headBias = false, s.skipSpecial = false;
    out.push_back({"bilm_relu_relpos", s});
  }
  out.push_back({"tta_position", base("tta_position", Family::TTA)});
  {
    ModelSpec s = base("tta_maskpos_pre", Family::TTA);
    s.firstQuery = FirstQuery::MaskPosition, s.norm = NormPlacement::Pre, s.embeddingNorm = false;
    s.relativePositions = 2;
    out.push_back({"tta_maskpos_pre", s});
  }
  // Head sizes that are multiples of 16 take the vector attention (16, 32 and 80 here; lengths up
  // to 19 span two 16-key blocks and three tiles of 8 query rows).
  {
    ModelSpec s = base("unilm_vec16", Family::UniLM);
    s.dims.dModel = 48;
    out.push_back({"unilm_vec16", s});
  }
  {
    ModelSpec s = base("bilm_vec32_anticausal", Family::BiLM);
    s.dims.dModel = 64, s.dims.heads = 2, s.mask = MaskKind::Anticausal;
    out.push_back({"bilm_vec32_anticausal", s});
  }
  {
    ModelSpec s = base("tta_vec16", Family::TTA);
    s.dims.dModel = 48;
    out.push_back({"tta_vec16", s});
  }
  {
    // One head of 80 features: the p.v tiles split the features into 4 + 1 vectors of 16.
    ModelSpec s = base("bilm_vec80", Family::BiLM);
    s.dims.dModel = 80, s.dims.heads = 1;
    out.push_back({"bilm_vec80", s});
  }
  return out;
}

// Relative positions in the vector attention (the relative products per row, the probabilities summed per table
// row): every mask, single-query rows (the biLM's pruned PLL rows; all rows without lm-prune-rows), clips below and
// above the length. Only the pipelines whose attention is the fused op (the others are the families' cases above).
std::vector<Case> relativeCases() {
  std::vector<Case> out;
  {
    ModelSpec s = base("unilm_vec16_relpos", Family::UniLM);
    s.dims.dModel = 48, s.relativePositions = 3;
    out.push_back({"unilm_vec16_relpos", s});
  }
  {
    ModelSpec s = base("bilm_vec16_relpos", Family::BiLM);
    s.dims.dModel = 48, s.relativePositions = 4;
    out.push_back({"bilm_vec16_relpos", s});
  }
  {
    ModelSpec s = base("bilm_vec32_anticausal_relpos", Family::BiLM);
    s.dims.dModel = 64, s.dims.heads = 2, s.mask = MaskKind::Anticausal, s.relativePositions = 20;
    out.push_back({"bilm_vec32_anticausal_relpos", s});
  }
  {
    ModelSpec s = base("tta_vec16_relpos", Family::TTA);
    s.dims.dModel = 48, s.relativePositions = 1;
    out.push_back({"tta_vec16_relpos", s});
  }
  return out;
}

using lmcc::test::randomWeights;

/// The case named `name` of cases() (an empty spec when there is none).
ModelSpec caseSpec(const std::string &name) {
  for (const Case &k : cases())
    if (name == k.name)
      return k.spec;
  return {};
}

/// randomWeights with the vocabulary rows past the first 2048 4x larger (vocabularies above 2048): the rows' maxima
/// fall in the head's last chunks, so its per-chunk sums must be rescaled to them when they are combined.
WeightSet headHeavyWeights(const ModelSpec &spec, uint64_t seed) {
  WeightSet weights = randomWeights(spec, seed);
  for (auto &[name, tensor] : weights.tensors)
    if (tensor.shape.size() == 2 && tensor.shape[0] == spec.dims.vocab && spec.dims.vocab > 2048)
      for (size_t i = size_t(2048) * tensor.shape[1]; i < tensor.data.size(); ++i)
        tensor.data[i] *= 4.0f;
  return weights;
}

std::vector<std::vector<int32_t>> randomSentences(const ModelSpec &spec, uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    int64_t len = i == 0 ? 1 : i == 1 ? spec.dims.maxLen : 1 + int64_t(rng() % spec.dims.maxLen);
    std::vector<int32_t> s(len);
    for (auto &id : s)
      id = int32_t(5 + rng() % (spec.dims.vocab - 5));
    if (len >= 3 && i % 2 == 0)
      s.front() = int32_t(spec.tokens.bos), s.back() = int32_t(spec.tokens.eos);
    out.push_back(s);
  }
  return out;
}

/// The sentences as the C API takes them: rows of `stride` ids (0 past a sentence) and the lengths.
struct Packed {
  std::vector<int32_t> ids, lengths;
};
Packed pack(const std::vector<std::vector<int32_t>> &sentences, int32_t stride) {
  Packed p;
  p.ids.assign(sentences.size() * size_t(stride), 0);
  for (size_t b = 0; b < sentences.size(); ++b) {
    std::copy(sentences[b].begin(), sentences[b].end(), p.ids.begin() + b * stride);
    p.lengths.push_back(int32_t(sentences[b].size()));
  }
  return p;
}

fs::path runtimeDir() { return fs::path(test::kRuntimeDir); }

struct Pipeline {
  const char *name;
  bool naive;
  std::set<std::string> disabled;
};

// Short parameter names in test listings (ctest shows them).
void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }
void PrintTo(const Pipeline &p, std::ostream *os) { *os << p.name; }

class Compiled : public ::testing::TestWithParam<std::tuple<Case, Pipeline>> {};

TEST_P(Compiled, MatchesReference) {
  const ModelSpec &spec = std::get<0>(GetParam()).spec;
  const Pipeline &pipeline = std::get<1>(GetParam());
  // A pass that changes nothing on this model leaves the IR of the full pipeline, so its library is the one
  // <case>_optimized compiles and checks below, bit for bit: the sameness is what this instance checks then
  // (as TrainCompiled compiles only the pipelines whose training IR differs). Compiling it again took a third of
  // this suite's time.
  if (!pipeline.disabled.empty()) {
    driver::LibraryOptions without;
    without.disabledPasses = pipeline.disabled;
    if (test::optimizedIR(spec, without) == test::optimizedIR(spec, {})) {
      std::printf("%s: the IR is the optimized pipeline's (the pass does nothing here): checked by %s_optimized\n",
                  pipeline.name, std::get<0>(GetParam()).name);
      return;
    }
  }
  fs::path dir = fs::temp_directory_path() /
                 ("lmcc-compiled-test-" + spec.name + "-" + pipeline.name + "-" + std::to_string(::getpid()));
  driver::LibraryOptions options;
  options.naive = pipeline.naive;
  options.disabledPasses = pipeline.disabled;
  options.outputDir = dir.string();
  options.runtimeDir = runtimeDir().string();
  ASSERT_EQ(driver::compileLibrary(spec, options), "");
  ASSERT_TRUE(fs::exists(dir / ("lib" + spec.name + ".so")));
  ASSERT_TRUE(fs::exists(dir / (spec.name + ".h")));

  WeightSet weights = headHeavyWeights(spec, 7);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, weights);

  void *handle = dlopen((dir / ("lib" + spec.name + ".so")).c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto descriptor = reinterpret_cast<const lm_model_desc *(*)()>(dlsym(handle, (spec.name + "_descriptor").c_str()));
  ASSERT_NE(descriptor, nullptr);
  lm_model *model = nullptr;
  ASSERT_EQ(lm_rt_load(descriptor(), weightsPath.c_str(), &model), LM_OK) << lm_last_error();

  auto sentences = randomSentences(spec, 11, 13);
  int32_t batch = int32_t(sentences.size()), stride = int32_t(spec.dims.maxLen) + 3;
  Packed packed = pack(sentences, stride);
  std::vector<int32_t> &ids = packed.ids, &lengths = packed.lengths;
  const float sentinel = 12345.0f;
  std::vector<float> lp(ids.size(), sentinel), scores(batch);
  std::vector<int32_t> nScored(batch);
  ASSERT_EQ(lm_rt_score_ex(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data(), nScored.data()),
            LM_OK)
      << lm_last_error();
  auto expected = reference::score(spec, weights, sentences, 2);
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t t = 0; t < lengths[b]; ++t)
      EXPECT_NEAR(lp[size_t(b) * stride + t], expected[b].tokenLogprobs[t], 1e-4)
          << spec.name << " sentence " << b << " position " << t;
    for (int32_t t = lengths[b]; t < stride; ++t)
      EXPECT_EQ(lp[size_t(b) * stride + t], sentinel) << "written past the length";
    EXPECT_NEAR(scores[b], expected[b].score, 1e-3 * std::max(1.0, std::fabs(expected[b].score)));
    EXPECT_EQ(nScored[b], expected[b].nScored);
  }

  std::vector<float> emb(size_t(batch) * spec.dims.dModel);
  lm_rt_workspace_peak_bytes(/*reset=*/1);
  ASSERT_EQ(lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, emb.data()), LM_OK) << lm_last_error();
  {
    // The whole batch at 1 thread: at most B * embed_sentence_bytes[n] + C * embed_copy_bytes[n] (n the longest
    // sentence, C the positions) of kernel temporaries.
    const lm_model_desc *d = descriptor();
    const int32_t n = *std::max_element(lengths.begin(), lengths.end());
    const int64_t copies = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
    const int64_t bound =
        batch * d->embed_sentence_bytes[n] + (d->embed_copy_bytes ? copies * d->embed_copy_bytes[n] : 0);
    EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), bound) << "embed, the whole batch at 1 thread";
  }
  auto expectedEmb = reference::embed(spec, weights, sentences, 2);
  for (int32_t b = 0; b < batch; ++b)
    for (int64_t c = 0; c < spec.dims.dModel; ++c)
      EXPECT_NEAR(emb[size_t(b) * spec.dims.dModel + c], expectedEmb[b][c], 1e-4) << spec.name << " sentence " << b;

  // Thread count and batch composition: each sentence alone, 1 and 2 threads. Alone at 2 threads (a
  // mask-and-predict sentence's copies then run in one window per thread) is bit-identical to 1 thread, and so
  // is the whole batch at 2 threads (its calls have work enough for the vector attention's task to split the
  // (entry, head) items over the threads).
  std::vector<std::vector<float>> aloneAtOneThread;
  for (int threads : {1, 2}) {
    ASSERT_EQ(lm_set_num_threads(threads), LM_OK);
    if (threads == 2) {
      std::vector<float> lp2(ids.size(), sentinel), scores2(batch);
      lm_rt_workspace_peak_bytes(/*reset=*/1);
      ASSERT_EQ(lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp2.data(), scores2.data()), LM_OK);
      EXPECT_EQ(lp2, lp) << "2 threads changed a token log-probability of the batch";
      EXPECT_EQ(scores2, scores) << "2 threads changed a score of the batch";
      // One piece (the whole batch; mask-and-predict models instead score each sentence's copies in windows side
      // by side, bounded by the workspace limit below) whose kernels run on 2 threads: at most the one-thread
      // bound plus one thread_bytes[n] (the second thread's work item), n the longest sentence.
      const lm_model_desc *d = descriptor();
      const int32_t n = *std::max_element(lengths.begin(), lengths.end());
      ASSERT_NE(d->score_thread_bytes, nullptr);
      ASSERT_NE(d->embed_thread_bytes, nullptr);
      if (!d->span_score) {
        const int64_t oneThread = batch * d->score_sentence_bytes[n];
        EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), oneThread + d->score_thread_bytes[n])
            << "score, the whole batch at 2 threads (the one-thread bound " << oneThread << ")";
      }
      std::vector<float> emb2(emb.size());
      lm_rt_workspace_peak_bytes(/*reset=*/1);
      ASSERT_EQ(lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, emb2.data()), LM_OK);
      EXPECT_EQ(emb2, emb) << "2 threads changed an embedding";
      const int64_t copies = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
      const int64_t oneThread =
          batch * d->embed_sentence_bytes[n] + (d->embed_copy_bytes ? copies * d->embed_copy_bytes[n] : 0);
      EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), oneThread + d->embed_thread_bytes[n])
          << "embed, the whole batch at 2 threads (the one-thread bound " << oneThread << ")";
    }
    for (int32_t b = 0; b < batch; b += 3) {
      float alone[64];
      float score = 0;
      lm_rt_workspace_peak_bytes(/*reset=*/1);
      ASSERT_EQ(lm_rt_score(model, ids.data() + size_t(b) * stride, &lengths[b], 1, stride, alone, &score), LM_OK);
      {
        // The memory model (lmrt.h: a call on B sentences of n tokens with C masked copies needs at most
        // B * sentence_bytes[n] + C * copy_bytes[n] on one thread, and (T - 1) * thread_bytes[n] more on T) bounds
        // what the kernel allocated; a mask-and-predict sentence scores a copy per position, at 2 threads in two
        // windows side by side (each piece its sentence term, and then no thread is left for the other's items;
        // the thread term still counted: one window may end first).
        const lm_model_desc *d = descriptor();
        const int32_t len = lengths[b];
        const int64_t copies = d->score_copy_bytes ? len * d->score_copy_bytes[len] : 0;
        const int64_t windows = threads == 2 && d->span_score ? 2 : 1;
        const int64_t bound =
            windows * d->score_sentence_bytes[len] + copies + (threads - 1) * d->score_thread_bytes[len];
        EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), bound)
            << "sentence " << b << " (" << len << " tokens) at " << threads << " threads";
      }
      std::vector<float> got(alone, alone + lengths[b]);
      got.push_back(score);
      if (threads == 1)
        aloneAtOneThread.push_back(got);
      else
        EXPECT_EQ(got, aloneAtOneThread[size_t(b / 3)]) << "2 threads changed sentence " << b;
      for (int32_t t = 0; t < lengths[b]; ++t)
        EXPECT_NEAR(alone[t], lp[size_t(b) * stride + t], 1e-6 * std::max(1.0f, std::fabs(alone[t])))
            << "threads " << threads << " sentence " << b << " position " << t;
      EXPECT_NEAR(score, scores[b], 1e-6 * std::max(1.0f, std::fabs(score)));
    }
  }
  // Mask-and-predict with spans (word-l2r PLL): random words of 1-3 pieces, each piece masking the rest of
  // its word; the compiled copies (batched, or one pass per position in the naive pipeline) equal the
  // reference executor's one copy at a time.
  const bool maskAndPredict = descriptor()->span_score != nullptr;
  EXPECT_EQ(maskAndPredict, spec.method == ScoreMethod::MaskAndPredict);
  std::vector<int32_t> spans(ids.size(), 0);
  std::vector<std::vector<int32_t>> spanLists;
  {
    std::mt19937_64 rng(5);
    for (int32_t b = 0; b < batch; ++b) {
      std::vector<int32_t> list(size_t(lengths[b]));
      for (int32_t i = 0; i < lengths[b];) {
        int32_t end = std::min<int32_t>(lengths[b], i + 1 + int32_t(rng() % 3));
        for (int32_t j = i; j < end; ++j)
          list[size_t(j)] = end;
        i = end;
      }
      std::copy(list.begin(), list.end(), spans.begin() + size_t(b) * stride);
      spanLists.push_back(list);
    }
  }
  std::vector<float> spanLp(ids.size(), sentinel), spanScores(batch);
  int spanStatus = lm_rt_score_spans(model, ids.data(), lengths.data(), batch, stride, spans.data(), spanLp.data(),
                                     spanScores.data(), nullptr);
  if (maskAndPredict) {
    ASSERT_EQ(spanStatus, LM_OK) << lm_last_error();
    auto expectedSpans = reference::score(spec, weights, sentences, 2, &spanLists);
    for (int32_t b = 0; b < batch; ++b) {
      for (int32_t t = 0; t < lengths[b]; ++t)
        EXPECT_NEAR(spanLp[size_t(b) * stride + t], expectedSpans[b].tokenLogprobs[t], 1e-4)
            << spec.name << " word-l2r sentence " << b << " position " << t;
      EXPECT_NEAR(spanScores[b], expectedSpans[b].score, 1e-3 * std::max(1.0, std::fabs(expectedSpans[b].score)));
    }
    // A span outside (i, length] is refused before anything is written.
    std::vector<int32_t> bad = spans;
    bad[0] = 0;
    EXPECT_EQ(lm_rt_score_spans(model, ids.data(), lengths.data(), batch, stride, bad.data(), spanLp.data(),
                                spanScores.data(), nullptr),
              LM_ERR_ARGUMENT);
  } else {
    EXPECT_EQ(spanStatus, LM_ERR_ARGUMENT) << "spans apply to mask-and-predict models only";
    // Also without spans (NULL: the original PLL): lm_rt_score_spans takes mask-and-predict models only.
    EXPECT_EQ(lm_rt_score_spans(model, ids.data(), lengths.data(), batch, stride, nullptr, spanLp.data(),
                                spanScores.data(), nullptr),
              LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find("does not score by mask-and-predict"), std::string::npos)
        << lm_last_error();
  }

  // Under a workspace limit the call is cut into pieces (one sentence at a time; a sentence's masked
  // copies in windows of two): the numbers are bit-identical, at 1 and 2 threads. A limit below one
  // piece is an LM_ERR_MEMORY naming what the sentence needs.
  {
    const lm_model_desc *d = descriptor();
    ASSERT_NE(d->score_sentence_bytes, nullptr);
    const int64_t n = spec.dims.maxLen;
    const int64_t perCopy = d->score_copy_bytes ? d->score_copy_bytes[n] : 0;
    EXPECT_EQ(perCopy > 0, maskAndPredict && !pipeline.naive && !pipeline.disabled.count("lm-batch-mask-predict"))
        << "copies cost memory in a masked batch only";
    for (int threads : {1, 2}) {
      lm_set_num_threads(threads);
      // Pieces of one sentence or two masked copies side by side, and the other thread's work item.
      const int64_t scoreLimit = threads * (d->score_sentence_bytes[n] + 2 * perCopy) +
                                 (threads - 1) * d->score_thread_bytes[n];
      ASSERT_GE(lm_set_workspace_limit(scoreLimit), 0);
      lm_rt_workspace_peak_bytes(/*reset=*/1);
      std::vector<float> cutLp(ids.size(), sentinel), cutScores(batch);
      std::vector<int32_t> cutScored(batch);
      ASSERT_EQ(lm_rt_score_ex(model, ids.data(), lengths.data(), batch, stride, cutLp.data(), cutScores.data(),
                               cutScored.data()),
                LM_OK)
          << lm_last_error();
      EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), scoreLimit) << "score under a limit at " << threads << " threads";
      for (int32_t b = 0; b < batch; ++b) {
        for (int32_t t = 0; t < lengths[b]; ++t)
          ASSERT_EQ(cutLp[size_t(b) * stride + t], lp[size_t(b) * stride + t])
              << "pieces changed a number: threads " << threads << " sentence " << b << " position " << t;
        ASSERT_EQ(cutScores[b], scores[b]) << "sentence " << b;
        ASSERT_EQ(cutScored[b], nScored[b]);
      }
      if (maskAndPredict) {
        std::vector<float> cutSpanLp(ids.size(), sentinel), cutSpanScores(batch);
        ASSERT_EQ(lm_rt_score_spans(model, ids.data(), lengths.data(), batch, stride, spans.data(), cutSpanLp.data(),
                                    cutSpanScores.data(), nullptr),
                  LM_OK);
        for (int32_t b = 0; b < batch; ++b)
          ASSERT_EQ(cutSpanScores[b], spanScores[b]) << "word-l2r in pieces, sentence " << b;
      }
      std::vector<float> cutEmb(emb.size());
      const int64_t embedLimit =
          threads * std::max(d->embed_sentence_bytes[n] + n * (d->embed_copy_bytes ? d->embed_copy_bytes[n] : 0),
                             int64_t(1)) +
          (threads - 1) * d->embed_thread_bytes[n];
      ASSERT_GE(lm_set_workspace_limit(embedLimit), 0);
      lm_rt_workspace_peak_bytes(/*reset=*/1);
      ASSERT_EQ(lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, cutEmb.data()), LM_OK) << lm_last_error();
      EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), embedLimit) << "embed under a limit at " << threads << " threads";
      EXPECT_EQ(cutEmb, emb) << "embed one sentence at a time";
      const int64_t embedCopy = d->embed_copy_bytes ? d->embed_copy_bytes[n] : 0;
      if (maskAndPredict && spec.mlm && embedCopy > 0) { // a mask-and-predict embedding in windows of two copies
        const int64_t windowLimit = threads * (d->embed_sentence_bytes[n] + 2 * embedCopy) +
                                    (threads - 1) * d->embed_thread_bytes[n];
        ASSERT_GE(lm_set_workspace_limit(windowLimit), 0);
        lm_rt_workspace_peak_bytes(/*reset=*/1);
        std::vector<float> windowEmb(emb.size());
        ASSERT_EQ(lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, windowEmb.data()), LM_OK)
            << lm_last_error();
        EXPECT_LE(int64_t(lm_rt_workspace_peak_bytes(0)), windowLimit) << "embed in windows at " << threads << " threads";
        EXPECT_EQ(windowEmb, emb) << "embed in windows of masked copies";
      }
    }
    ASSERT_GE(lm_set_workspace_limit(std::max<int64_t>(1, d->score_sentence_bytes[n] / 2)), 0);
    lm_set_num_threads(1);
    int32_t longest = 1; // sentence 1 has max_len tokens
    EXPECT_EQ(lm_rt_score(model, ids.data() + size_t(longest) * stride, &lengths[longest], 1, stride, lp.data(),
                          scores.data()),
              LM_ERR_MEMORY);
    EXPECT_NE(std::string(lm_last_error()).find("over the workspace limit"), std::string::npos) << lm_last_error();
    lm_set_workspace_limit(0);
    ASSERT_EQ(lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data()), LM_OK);
  }

  // Steady state: a second identical call takes nothing from the system allocator. The calling thread's cache
  // starts empty: blocks the two-thread calls above left in it depend on which thread freed what (a leftover
  // block taken by a smaller request can leave a larger one without a fit on the first call only).
  lm_set_num_threads(1);
  lm_rt_workspace_release();
  ASSERT_EQ(lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data()), LM_OK);
  uint64_t before = lm_rt_workspace_system_allocations();
  EXPECT_GT(before, 0u) << "the kernel should run on the calling thread at 1 thread";
  ASSERT_EQ(lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data()), LM_OK);
  EXPECT_EQ(lm_rt_workspace_system_allocations(), before) << "kernel temporaries were allocated again";
  // Nor any bookkeeping: no operator new in a steady-state score or embed call (the cache's block list, the
  // call's plan of pieces and the chunk buffers are all reused).
  std::vector<float> steadyEmb(size_t(batch) * size_t(spec.dims.dModel));
  ASSERT_EQ(lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, steadyEmb.data()), LM_OK);
  g_news = 0;
  g_countNew = true;
  const int scoreStatus = lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data());
  const int64_t scoreNews = g_news.exchange(0);
  const int embedStatus = lm_rt_embed(model, ids.data(), lengths.data(), batch, stride, steadyEmb.data());
  g_countNew = false;
  ASSERT_EQ(scoreStatus, LM_OK);
  ASSERT_EQ(embedStatus, LM_OK);
  EXPECT_EQ(scoreNews, 0) << "a steady-state score call allocated";
  EXPECT_EQ(g_news.load(), 0) << "a steady-state embed call allocated";
  lm_rt_free(model);
  fs::remove_all(dir);
}

// The naive pipeline, the full default pipeline, and each pass alone dropped: every
// configuration matches the reference executor, so pass-on == pass-off.
std::vector<Pipeline> pipelines() {
  std::vector<Pipeline> out = {{"naive", true, {}}, {"optimized", false, {}}};
  static std::vector<std::string> names;
  names.clear();
  for (const std::string &flag : defaultPipeline())
    names.push_back("no_" + flag.substr(3));
  for (size_t i = 0; i < defaultPipeline().size(); ++i) {
    std::string n = names[i];
    for (char &c : n)
      if (c == '-')
        c = '_';
    names[i] = n;
    out.push_back({names[i].c_str(), false, {defaultPipeline()[i]}});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, Compiled, ::testing::Combine(::testing::ValuesIn(cases()), ::testing::ValuesIn(pipelines())),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Pipeline>> &info) {
                           return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
                         });
INSTANTIATE_TEST_SUITE_P(Relative, Compiled,
                         ::testing::Combine(::testing::ValuesIn(relativeCases()),
                                            ::testing::Values(Pipeline{"optimized", false, {}},
                                                              Pipeline{"no_prune_rows", false, {"lm-prune-rows"}})),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Pipeline>> &info) {
                           return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
                         });

// --weights-dtype bf16: the GEMM weights packed as bf16 pairs, multiplied by AVX512_BF16 dot products (this host,
// when it has them) or widened to f32 in the kernel (a 512-bit target without AVX512_BF16, and AVX2). On weights
// that are bf16 numbers already, packing loses nothing: the widening kernel runs the fp32 kernel's FMA chain and
// must give the fp32 library's numbers bit for bit; the dot-product kernel also rounds the activations to bf16, so
// it is compared with the fp32 library within 0.1 per token (its measured error on these models is 0.02-0.06: their
// random weights give logits of a few tens; the contract's 2e-2 on the bundled models is tests/cli/bf16.test).
// The thread count changes no number.
struct Bf16Target {
  const char *name, *cpu;
};

class CompiledBf16 : public ::testing::TestWithParam<std::tuple<Case, Bf16Target>> {};

/// The library of `spec` for `cpu` with `dtype` weights, loaded with the weights at `weightsPath`.
struct Loaded {
  void *handle = nullptr;
  lm_model *model = nullptr;
  ~Loaded() {
    if (model)
      lm_rt_free(model);
    if (handle)
      dlclose(handle);
  }
};

/// Compiles `spec` with `options` (its outputDir and runtimeDir set here; compiled once per outputDir) and loads it.
void loadLibrary(const ModelSpec &spec, driver::LibraryOptions options, const fs::path &outputDir,
                 const std::string &weightsPath, Loaded &out) {
  options.outputDir = outputDir.string();
  options.runtimeDir = runtimeDir().string();
  const fs::path library = outputDir / ("lib" + spec.name + ".so");
  if (!fs::exists(library))
    ASSERT_EQ(driver::compileLibrary(spec, options), "");
  out.handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(out.handle, nullptr) << dlerror();
  auto descriptor =
      reinterpret_cast<const lm_model_desc *(*)()>(dlsym(out.handle, (spec.name + "_descriptor").c_str()));
  ASSERT_NE(descriptor, nullptr);
  ASSERT_EQ(lm_rt_load(descriptor(), weightsPath.c_str(), &out.model), LM_OK) << lm_last_error();
}

/// A library's outputs on one batch: token log-probabilities, sentence scores and embeddings.
struct Outputs {
  std::vector<float> lp, scores, emb;
};

/// Compiles `spec` with `options` into outputDir (loadLibrary) and scores and embeds `packed` at `threads` threads.
void scoreAndEmbed(const ModelSpec &spec, const driver::LibraryOptions &options, const fs::path &outputDir,
                   const std::string &weightsPath, const Packed &packed, int threads, Outputs &out) {
  Loaded loaded;
  ASSERT_NO_FATAL_FAILURE(loadLibrary(spec, options, outputDir, weightsPath, loaded));
  ASSERT_EQ(lm_set_num_threads(threads), LM_OK);
  const int32_t batch = int32_t(packed.lengths.size()), stride = int32_t(spec.dims.maxLen);
  out.lp.assign(packed.ids.size(), 0.0f), out.scores.assign(batch, 0.0f);
  ASSERT_EQ(lm_rt_score(loaded.model, packed.ids.data(), packed.lengths.data(), batch, stride, out.lp.data(),
                        out.scores.data()),
            LM_OK)
      << lm_last_error();
  out.emb.assign(size_t(batch) * spec.dims.dModel, 0.0f);
  ASSERT_EQ(lm_rt_embed(loaded.model, packed.ids.data(), packed.lengths.data(), batch, stride, out.emb.data()), LM_OK)
      << lm_last_error();
}

/// a and b hold the same bits at every real token, in every score and in every embedding.
void expectSameBits(const Outputs &a, const Outputs &b, const Packed &packed, int32_t stride, const std::string &what) {
  for (size_t s = 0; s < packed.lengths.size(); ++s)
    for (int32_t t = 0; t < packed.lengths[s]; ++t)
      ASSERT_EQ(a.lp[s * stride + t], b.lp[s * stride + t]) << what << ": sentence " << s << " position " << t;
  EXPECT_EQ(a.scores, b.scores) << what;
  EXPECT_EQ(a.emb, b.emb) << what;
}

TEST_P(CompiledBf16, AgreesWithFp32) {
  const ModelSpec &spec = std::get<0>(GetParam()).spec;
  const Bf16Target target = std::get<1>(GetParam());
  const std::string cpu = target.cpu;
  if (cpu == "skylake-avx512" && codegen::targetVectorBits("") < 512)
    GTEST_SKIP() << "this host cannot run AVX-512 code";
  if (cpu == "cooperlake" && !codegen::targetHasBf16Dot(""))
    GTEST_SKIP() << "this host has no AVX512_BF16 to run the dot-product kernel";
  if (cpu == "sapphirerapids" && !codegen::targetHasAmx(""))
    GTEST_SKIP() << "this host has no AMX-BF16 to run the AMX kernel";
  // The dot-product and AMX kernels round the activations to bf16 too; the widening ones do not.
  const bool dot = codegen::targetBf16Kernel(cpu) != codegen::Bf16Kernel::Widen;
  fs::path dir = fs::temp_directory_path() /
                 ("lmcc-compiled-bf16-" + spec.name + "-" + target.name + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  WeightSet weights = randomWeights(spec, 7);
  for (auto &[name, tensor] : weights.tensors)
    for (float &x : tensor.data)
      x = test::roundToBf16(x);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, weights);
  Loaded fp32, bf16;
  driver::LibraryOptions options;
  options.cpu = target.cpu;
  ASSERT_NO_FATAL_FAILURE(loadLibrary(spec, options, dir / "f32", weightsPath, fp32));
  options.weightsDtype = "bf16";
  ASSERT_NO_FATAL_FAILURE(loadLibrary(spec, options, dir / "bf16", weightsPath, bf16));

  auto sentences = randomSentences(spec, 11, 9);
  int32_t batch = int32_t(sentences.size()), stride = int32_t(spec.dims.maxLen);
  Packed packed = pack(sentences, stride);
  std::vector<int32_t> &ids = packed.ids, &lengths = packed.lengths;
  auto score = [&](lm_model *model, std::vector<float> &lp) {
    std::vector<float> scores(batch);
    lp.assign(ids.size(), 0.0f);
    ASSERT_EQ(lm_rt_score(model, ids.data(), lengths.data(), batch, stride, lp.data(), scores.data()), LM_OK)
        << lm_last_error();
  };
  ASSERT_EQ(lm_set_num_threads(1), LM_OK);
  std::vector<float> want, got, got2;
  ASSERT_NO_FATAL_FAILURE(score(fp32.model, want));
  ASSERT_NO_FATAL_FAILURE(score(bf16.model, got));
  double worst = 0;
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t t = 0; t < lengths[b]; ++t) {
      size_t i = size_t(b) * stride + t;
      worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      if (dot)
        EXPECT_NEAR(got[i], want[i], 0.1) << spec.name << " sentence " << b << " position " << t;
      else
        EXPECT_EQ(got[i], want[i]) << spec.name << " sentence " << b << " position " << t;
    }
  if (dot)
    EXPECT_GT(worst, 0) << "the dot products gave the fp32 numbers exactly: were the activations rounded?";
  ASSERT_EQ(lm_set_num_threads(2), LM_OK);
  ASSERT_NO_FATAL_FAILURE(score(bf16.model, got2));
  EXPECT_EQ(got, got2) << "2 threads changed a number";
  std::printf("%s %s: max |bf16 - fp32| per token %.3g\n", spec.name.c_str(), target.name, worst);
  fs::remove_all(dir);
}

std::vector<Case> bf16Cases() {
  std::vector<Case> out;
  for (Case c : cases()) {
    if (std::string(c.name) == "tta_maskpos_pre")
      c.spec.dims.dFF = 47; // an odd K: the last bf16 pair of every FFN output row is half padding
    if (std::string(c.name) == "unilm_vec16" || std::string(c.name) == "bilm_vec80" ||
        std::string(c.name) == "tta_maskpos_pre")
      out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, CompiledBf16,
                         ::testing::Combine(::testing::ValuesIn(bf16Cases()),
                                            ::testing::Values(Bf16Target{"host", ""},
                                                              Bf16Target{"avx512_widen", "skylake-avx512"},
                                                              Bf16Target{"avx512_dot", "cooperlake"},
                                                              Bf16Target{"amx", "sapphirerapids"},
                                                              Bf16Target{"avx2_widen", "znver3"})),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Bf16Target>> &info) {
                           return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
                         });

// lm-fuse-activation: the FFN's activation applied by the generated GEMM to its register tile (or, with --gemm=eigen,
// in place after the product) gives the activation op's numbers bit for bit, for every kind (gelu, gelu_tanh, relu),
// in every entry (scoring, embedding), at 1 and 2 threads; --weights-dtype bf16 (the widening or dot kernel's epilogue).
struct FuseCase {
  const char *name, *family, *gemm, *dtype;
};

class FusedActivation : public ::testing::TestWithParam<FuseCase> {};

TEST_P(FusedActivation, BitIdenticalToTheActivationOp) {
  const FuseCase c = GetParam();
  ModelSpec spec = caseSpec(c.family);
  ASSERT_FALSE(spec.name.empty()) << c.family;
  spec.dims.dFF = 47; // an FFN width that is not a multiple of the tile's columns: masked stores past it
  fs::path dir = fs::temp_directory_path() / ("lmcc-fused-activation-" + std::string(c.name) + "-" +
                                              std::to_string(::getpid()));
  WeightSet weights = randomWeights(spec, 5);
  if (std::string(c.dtype) == "bf16")
    for (auto &[name, tensor] : weights.tensors)
      for (float &x : tensor.data)
        x = test::roundToBf16(x);
  fs::create_directories(dir);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, weights);
  auto sentences = randomSentences(spec, 3, 11);
  const int32_t stride = int32_t(spec.dims.maxLen);
  const Packed packed = pack(sentences, stride);
  auto run = [&](bool fused, int threads, Outputs &out) {
    driver::LibraryOptions options;
    options.gemm = c.gemm;
    options.weightsDtype = c.dtype;
    if (!fused)
      options.disabledPasses = {"lm-fuse-activation"};
    scoreAndEmbed(spec, options, dir / (fused ? "fused" : "unfused"), weightsPath, packed, threads, out);
  };
  for (int threads : {1, 2}) {
    Outputs fused, unfused;
    ASSERT_NO_FATAL_FAILURE(run(true, threads, fused));
    ASSERT_NO_FATAL_FAILURE(run(false, threads, unfused));
    const std::string what = std::string(c.name) + ", " + std::to_string(threads) + " threads";
    ASSERT_NO_FATAL_FAILURE(expectSameBits(fused, unfused, packed, stride, what));
  }
  // The fused library really has the epilogue: its IR has no activation op left.
  mlir::MLIRContext context;
  driver::LibraryOptions options;
  std::string error;
  auto module = driver::buildOptimizedModule(context, spec, options, &error);
  ASSERT_TRUE(module) << error;
  int64_t fusedLinears = 0, activations = 0;
  module->walk([&](mlir::Operation *op) {
    if (auto l = llvm::dyn_cast<lm::LinearOp>(op); l && l.getActivation())
      ++fusedLinears;
    if (llvm::isa<lm::GeluOp, lm::ReluOp>(op))
      ++activations;
  });
  EXPECT_GT(fusedLinears, 0);
  EXPECT_EQ(activations, 0);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Kinds, FusedActivation,
                         ::testing::Values(FuseCase{"gelu", "bilm_mp", "generated", "f32"},
                                           FuseCase{"gelu_tanh", "unilm_pre_untied", "generated", "f32"},
                                           FuseCase{"relu", "bilm_relu_relpos", "generated", "f32"},
                                           FuseCase{"gelu_tta", "tta_maskpos_pre", "generated", "f32"},
                                           FuseCase{"gelu_eigen", "tta_position", "eigen", "f32"},
                                           FuseCase{"gelu_bf16", "unilm_vec16", "generated", "bf16"}),
                         [](const ::testing::TestParamInfo<FuseCase> &info) { return std::string(info.param.name); });

// GemmTile::forDepth: on an L1 of 8 ways the FFN's output weight of depth 1024 takes the 5 x 64 tile (packed for it at
// load time), on one of 12 the target's 12 x 32; the two libraries give the same bits in every entry (scoring,
// embedding) at 1 and 2 threads, for each family.
class DeepWeightTile : public ::testing::TestWithParam<const char *> {};

TEST_P(DeepWeightTile, BitIdenticalToTheTargetsTile) {
  if (codegen::targetVectorBits("") < 512)
    GTEST_SKIP() << "this host cannot run AVX-512 code (the 5 x 64 tile is AVX-512's)";
  ModelSpec spec = caseSpec(GetParam());
  ASSERT_FALSE(spec.name.empty()) << GetParam();
  spec.dims.dFF = 1024; // the FFN output's depth: A's rows 4 KB apart
  fs::path dir = fs::temp_directory_path() / ("lmcc-deep-tile-" + std::string(GetParam()) + "-" +
                                              std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, randomWeights(spec, 9));
  auto sentences = randomSentences(spec, 5, 13);
  const int32_t stride = int32_t(spec.dims.maxLen);
  const Packed packed = pack(sentences, stride);
  auto run = [&](int64_t ways, int threads, Outputs &out) {
    driver::LibraryOptions options;
    options.l1Ways = ways;
    options.dumpDir = (dir / ("ir" + std::to_string(ways))).string();
    scoreAndEmbed(spec, options, dir / ("ways" + std::to_string(ways)), weightsPath, packed, threads, out);
  };
  for (int threads : {1, 2}) {
    Outputs narrow, wide;
    ASSERT_NO_FATAL_FAILURE(run(8, threads, narrow));
    ASSERT_NO_FATAL_FAILURE(run(12, threads, wide));
    const std::string what = std::string(GetParam()) + ", " + std::to_string(threads) + " threads";
    ASSERT_NO_FATAL_FAILURE(expectSameBits(narrow, wide, packed, stride, what));
  }
  // The libraries really differ in the tile: the lowered IR names each GEMM's.
  auto loops = [&](int64_t ways) {
    std::ifstream in(dir / ("ir" + std::to_string(ways)) / "90-loops.mlir");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string narrowIr = loops(8), wideIr = loops(12);
  EXPECT_TRUE(std::regex_search(narrowIr, std::regex("@lm_gemm_[0-9]+x1024(_bias)?_5x64")));
  EXPECT_EQ(wideIr.find("5x64"), std::string::npos);
  EXPECT_TRUE(std::regex_search(wideIr, std::regex("@lm_gemm_[0-9]+x1024(_bias)?_12x32")));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, DeepWeightTile, ::testing::Values("unilm_pre_untied", "bilm_mp", "tta_maskpos_pre"),
                         [](const ::testing::TestParamInfo<const char *> &info) { return std::string(info.param); });

// A batch with many more rows than any weight has columns (40 sentences of up to 19 tokens, 30 features): every
// GEMM splits its rows over the threads (Loops::parallelGemm, lm_gemm_rows_task_*) instead of its panels, in about
// 16 pieces. Two and three threads give the one-thread bits (Compiled.MatchesReference checks those against the
// reference executor, through the same row task).
class GemmRowSplit : public ::testing::TestWithParam<const char *> {};

TEST_P(GemmRowSplit, ThreadCountsGiveTheSameBits) {
  ModelSpec spec = caseSpec(GetParam());
  ASSERT_FALSE(spec.name.empty()) << GetParam();
  fs::path dir = fs::temp_directory_path() / ("lmcc-gemm-rows-" + std::string(GetParam()) + "-" +
                                              std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, randomWeights(spec, 21));
  auto sentences = randomSentences(spec, 17, 40);
  const int32_t stride = int32_t(spec.dims.maxLen);
  const Packed packed = pack(sentences, stride);
  driver::LibraryOptions options;
  options.dumpDir = (dir / "ir").string();
  Outputs one;
  ASSERT_NO_FATAL_FAILURE(scoreAndEmbed(spec, options, dir / "lib", weightsPath, packed, 1, one));
  for (int threads : {2, 3}) {
    Outputs many;
    ASSERT_NO_FATAL_FAILURE(scoreAndEmbed(spec, options, dir / "lib", weightsPath, packed, threads, many));
    ASSERT_NO_FATAL_FAILURE(
        expectSameBits(one, many, packed, stride, std::string(GetParam()) + ", " + std::to_string(threads) + " threads"));
  }
  std::ifstream in(dir / "ir" / "90-loops.mlir");
  const std::string ir((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(std::regex_search(ir, std::regex("func.constant @lm_gemm_rows_task_[0-9]+x30_bias_")))
      << "no GEMM is split by rows";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, GemmRowSplit, ::testing::Values("unilm_pre_untied", "bilm_mp", "tta_maskpos_pre"),
                         [](const ::testing::TestParamInfo<const char *> &info) { return std::string(info.param); });

// The log-probability head's scalar fallback (--gemm eigen: the runtime's GEMM per 512-column chunk, then the
// chunk's rows as a row task) over five chunks with the rows' maxima in the last one: the reference executor's
// numbers, and the same bits at 1 and 2 threads.
TEST(LogprobHead, EigenChunksMatchReference) {
  ModelSpec spec = caseSpec("unilm_vocab2100");
  ASSERT_FALSE(spec.name.empty());
  fs::path dir = fs::temp_directory_path() / ("lmcc-logprob-eigen-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  WeightSet weights = headHeavyWeights(spec, 9);
  std::string weightsPath = (dir / "w.safetensors").string();
  writeSafetensors(weightsPath, weights);
  driver::LibraryOptions options;
  options.gemm = "eigen";
  Loaded loaded;
  ASSERT_NO_FATAL_FAILURE(loadLibrary(spec, options, dir / "eigen", weightsPath, loaded));
  auto sentences = randomSentences(spec, 4, 13);
  int32_t batch = int32_t(sentences.size()), stride = int32_t(spec.dims.maxLen);
  Packed packed = pack(sentences, stride);
  auto expected = reference::score(spec, weights, sentences, 2);
  std::vector<float> first;
  for (int threads : {1, 2}) {
    ASSERT_EQ(lm_set_num_threads(threads), LM_OK);
    std::vector<float> lp(packed.ids.size(), 0.0f), scores(batch);
    ASSERT_EQ(lm_rt_score(loaded.model, packed.ids.data(), packed.lengths.data(), batch, stride, lp.data(),
                          scores.data()),
              LM_OK)
        << lm_last_error();
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t t = 0; t < packed.lengths[b]; ++t)
        EXPECT_NEAR(lp[size_t(b) * stride + t], expected[b].tokenLogprobs[t], 1e-4)
            << threads << " threads: sentence " << b << " position " << t;
    if (threads == 1)
      first = lp;
    else
      EXPECT_EQ(lp, first) << "2 threads changed a token log-probability";
  }
  lm_set_num_threads(1);
  fs::remove_all(dir);
}

} // namespace
