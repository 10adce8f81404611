//===- RuntimeTest.cpp - liblmrt, the generated header/glue, the examples -===//
//
// The runtime is tested through a hand-built model descriptor whose kernels are
// fakes written here (simple functions of the ids and the weights that also check
// every memref they receive), so that loading, validation, chunking, threading and
// copying are tested independently of the compiler. Then the generated header and
// glue are compiled with the system C/C++ compiler, and an end-to-end library (glue
// + fake C kernels + liblmrt) runs examples/score.c and examples/score.cpp.
//
//===----------------------------------------------------------------------===//

#include "codegen/Emit/Header.h"
#include "runtime/lib/lmrt.h"
#include "runtime/weights/ModelWeights.h"
#include "tests/unit/TestPaths.h"

#include <gtest/gtest.h>

#if defined(__linux__)
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <tuple>
#include <thread>

namespace fs = std::filesystem;
using namespace lmcc;

namespace {

const std::string kSource = test::kSourceDir, kRuntime = test::kRuntimeDir;

// --- A fake model -------------------------------------------------------------------

constexpr int64_t kVocab = 50, kMaxLen = 16, kDModel = 4;
constexpr int32_t kPad = 7;

std::vector<codegen::LayoutTensor> toLayout(const std::vector<TensorInfo> &tensors) {
  std::vector<codegen::LayoutTensor> out;
  for (const TensorInfo &t : tensors)
    out.push_back({t.name, t.shape});
  return out;
}

/// The tensors of the fake model and their layout (the codegen's layoutOffsets).
const std::vector<TensorInfo> &fakeTensors() {
  static const std::vector<TensorInfo> tensors = {
      {"emb", {kVocab, kDModel}}, {"bias", {kDModel}}, {"scale", {3}}};
  return tensors;
}

struct Layout {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  Layout() { offsets = codegen::layoutOffsets(toLayout(fakeTensors()), &total); }
};
const Layout &layout() {
  static const Layout l;
  return l;
}

/// What the fake kernels observed that they should not have (checked by every test).
std::atomic<int> g_violations{0};
std::mutex g_violationMutex;
std::string g_firstViolation;
std::atomic<int64_t> g_maxRows{0}, g_kernelCalls{0};

void violation(const std::string &what) {
  std::lock_guard<std::mutex> lock(g_violationMutex);
  if (g_violations++ == 0)
    g_firstViolation = what;
}

const float *tensorAt(const lm_memref1f *w, int i) { return w->aligned + w->offset + layout().offsets[i]; }

/// Checks the memrefs every kernel receives: dense row-major, consistent sizes, padding.
void checkCommon(const lm_memref1f *w, const lm_memref2i *ids, const lm_memref1i *lengths) {
  if (w->sizes[0] != layout().total || w->strides[0] != 1 || reinterpret_cast<uintptr_t>(w->aligned) % 64 != 0)
    violation("weights memref");
  // The gaps between tensors and after the last one are zero.
  const float *buffer = w->aligned;
  int64_t cursor = 0;
  for (size_t t = 0; t < fakeTensors().size(); ++t) {
    for (int64_t i = cursor; i < layout().offsets[t]; ++i)
      if (buffer[i] != 0.0f)
        violation("gap not zeroed at " + std::to_string(i));
    int64_t numel = 1;
    for (int64_t d : fakeTensors()[t].shape)
      numel *= d;
    cursor = layout().offsets[t] + numel;
  }
  for (int64_t i = cursor; i < layout().total; ++i)
    if (buffer[i] != 0.0f)
      violation("tail not zeroed");
  const int64_t rows = ids->sizes[0], n = ids->sizes[1];
  if (rows < 1 || rows > 32 || n < 1 || ids->strides[0] != n || ids->strides[1] != 1 || ids->offset != 0)
    violation("ids memref");
  if (lengths->sizes[0] != rows || lengths->strides[0] != 1)
    violation("lengths memref");
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t len = lengths->aligned[r];
    longest = std::max<int64_t>(longest, len);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = ids->aligned[r * n + i];
      if (i >= len && id != kPad)
        violation("padding is not the pad id");
      if (i < len && (id < 0 || id >= kVocab))
        violation("id out of range reached the kernel");
    }
  }
  if (longest != n)
    violation("n is not the longest length of the chunk");
  int64_t seen = g_maxRows.load();
  while (rows > seen && !g_maxRows.compare_exchange_weak(seen, rows)) {
  }
  ++g_kernelCalls;
}

/// token_logprob = -(id + 1) * scale[0]; score = their sum; n_scored = ids >= 5; garbage past lengths.
void fakeScore(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2f *lp, lm_memref1f *scores,
               lm_memref1i *nScored) {
  checkCommon(w, ids, lengths);
  const int64_t rows = ids->sizes[0], n = ids->sizes[1];
  if (lp->sizes[0] != rows || lp->sizes[1] != n || lp->strides[0] != n || lp->strides[1] != 1 ||
      scores->sizes[0] != rows || scores->strides[0] != 1 || nScored->sizes[0] != rows)
    violation("score output memrefs");
  const float scale = tensorAt(w, 2)[0];
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    int32_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = ids->aligned[r * n + i];
      if (i < lengths->aligned[r]) {
        const float v = -(id + 1) * scale;
        lp->aligned[r * n + i] = v;
        sum += v;
        count += id >= 5;
      } else {
        lp->aligned[r * n + i] = 999.0f; // must never reach the caller
      }
    }
    scores->aligned[scores->offset + r] = sum;
    nScored->aligned[r] = count;
  }
}

/// out[r, j] = mean_i emb[id_i, j] + bias[j].
void fakeEmbed(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2f *out) {
  checkCommon(w, ids, lengths);
  const int64_t rows = ids->sizes[0], n = ids->sizes[1];
  if (out->sizes[0] != rows || out->sizes[1] != kDModel || out->strides[0] != kDModel || out->strides[1] != 1)
    violation("embed output memref");
  const float *emb = tensorAt(w, 0), *bias = tensorAt(w, 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kDModel; ++j) {
      float sum = 0;
      for (int32_t i = 0; i < lengths->aligned[r]; ++i)
        sum += emb[ids->aligned[r * n + i] * kDModel + j];
      out->aligned[r * kDModel + j] = sum / lengths->aligned[r] + bias[j];
    }
}

std::vector<lm_tensor_desc> tensorTable() {
  std::vector<lm_tensor_desc> table;
  for (size_t i = 0; i < fakeTensors().size(); ++i) {
    const TensorInfo &t = fakeTensors()[i];
    lm_tensor_desc d{};
    d.name = t.name.c_str();
    d.rank = static_cast<int32_t>(t.shape.size());
    d.shape[0] = t.shape[0];
    d.shape[1] = t.shape.size() > 1 ? t.shape[1] : 0;
    d.offset = layout().offsets[i];
    table.push_back(d);
  }
  return table;
}

const std::vector<lm_tensor_desc> &fakeTable() {
  static const std::vector<lm_tensor_desc> table = tensorTable();
  return table;
}

lm_model_desc fakeDesc() {
  lm_model_desc d{};
  d.name = "fake";
  d.spec_hash = "0";
  d.vocab = kVocab, d.max_len = kMaxLen, d.d_model = kDModel, d.heads = 1, d.d_ff = 8, d.layers = 1;
  d.pad_id = kPad;
  d.tensors = fakeTable().data();
  d.num_tensors = static_cast<int32_t>(fakeTable().size());
  d.total_floats = layout().total;
  d.score = fakeScore;
  d.embed = fakeEmbed;
  d.embedded_weights = nullptr;
  return d;
}

const lm_model_desc &theDesc() {
  static const lm_model_desc d = fakeDesc();
  return d;
}

WeightSet fakeWeights() {
  WeightSet w;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  Tensor emb{{kVocab, kDModel}, {}}, bias{{kDModel}, {}}, scale{{3}, {0.5f, 2.0f, 3.0f}};
  for (int i = 0; i < kVocab * kDModel; ++i)
    emb.data.push_back(u(rng));
  for (int i = 0; i < kDModel; ++i)
    bias.data.push_back(u(rng));
  w.tensors["emb"] = emb;
  w.tensors["bias"] = bias;
  w.tensors["scale"] = scale;
  return w;
}

/// The flat buffer the runtime should build from fakeWeights().
std::vector<float> flatWeights(const WeightSet &w) {
  std::vector<float> flat(static_cast<size_t>(layout().total), 0.0f);
  for (size_t i = 0; i < fakeTensors().size(); ++i) {
    const Tensor &t = w.get(fakeTensors()[i].name);
    std::copy(t.data.begin(), t.data.end(), flat.begin() + layout().offsets[i]);
  }
  return flat;
}

// --- Batches ----------------------------------------------------------------------

struct Batch {
  int32_t batch = 0, stride = 0;
  std::vector<int32_t> ids, lengths;
};

Batch randomBatch(int32_t batch, int32_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.batch = batch, b.stride = stride;
  b.ids.assign(static_cast<size_t>(batch) * stride, -12345); // garbage past lengths must be ignored
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t len = 1 + static_cast<int32_t>(rng() % std::min<int64_t>(stride, kMaxLen));
    b.lengths.push_back(len);
    for (int32_t i = 0; i < len; ++i)
      b.ids[static_cast<size_t>(s) * stride + i] = static_cast<int32_t>(rng() % kVocab);
  }
  return b;
}

constexpr float kSentinel = -777.25f;

class RuntimeTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "lmcc-runtime-XXXXXX").string();
    ASSERT_NE(mkdtemp(&pattern[0]), nullptr) << std::strerror(errno);
    dir_ = pattern;
    weights_ = fakeWeights();
    writeSafetensors(path("w.safetensors"), weights_);
    g_violations = 0;
    g_maxRows = 0;
    lm_set_num_threads(1);
  }
  void TearDown() override {
    lm_rt_free(model_);
    lm_set_num_threads(1);
    EXPECT_EQ(g_violations.load(), 0) << "first violation seen by a fake kernel: " << g_firstViolation;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string &name) const { return (dir_ / name).string(); }

  void load() {
    ASSERT_EQ(lm_rt_load(&theDesc(), path("w.safetensors").c_str(), &model_), LM_OK) << lm_last_error();
    ASSERT_NE(model_, nullptr);
  }

  /// Writes `w` to a file and tries to load it; returns the status.
  int loadWeights(const WeightSet &w, const std::string &file = "bad.safetensors") {
    writeSafetensors(path(file), w);
    lm_model *m = nullptr;
    const int status = lm_rt_load(&theDesc(), path(file).c_str(), &m);
    lm_rt_free(m);
    return status;
  }

  /// What the fake kernels should produce.
  void expected(const Batch &b, std::vector<float> &lp, std::vector<float> &scores, std::vector<int32_t> &nScored,
                std::vector<float> &embed) const {
    const float scale = weights_.get("scale").data[0];
    const Tensor &emb = weights_.get("emb"), &bias = weights_.get("bias");
    lp.assign(b.ids.size(), kSentinel);
    scores.assign(static_cast<size_t>(b.batch), 0.0f);
    nScored.assign(static_cast<size_t>(b.batch), 0);
    embed.assign(static_cast<size_t>(b.batch) * kDModel, 0.0f);
    for (int32_t s = 0; s < b.batch; ++s) {
      float sum = 0;
      for (int32_t i = 0; i < b.lengths[s]; ++i) {
        const int32_t id = b.ids[static_cast<size_t>(s) * b.stride + i];
        const float v = -(id + 1) * scale;
        lp[static_cast<size_t>(s) * b.stride + i] = v;
        sum += v;
        nScored[s] += id >= 5;
      }
      scores[s] = sum;
      for (int64_t j = 0; j < kDModel; ++j) {
        float e = 0;
        for (int32_t i = 0; i < b.lengths[s]; ++i)
          e += emb.data[b.ids[static_cast<size_t>(s) * b.stride + i] * kDModel + j];
        embed[s * kDModel + j] = e / b.lengths[s] + bias.data[j];
      }
    }
  }

  fs::path dir_;
  WeightSet weights_;
  lm_model *model_ = nullptr;
};

// --- Loading ------------------------------------------------------------------------

TEST_F(RuntimeTest, WeightOffsetsAreAlignedAndDisjoint) {
  const std::vector<int64_t> &off = layout().offsets;
  ASSERT_EQ(off.size(), 3u);
  EXPECT_EQ(off[0], 0);
  EXPECT_EQ(off[1], 208); // 200 floats rounded up to 16
  EXPECT_EQ(off[2], 224); // 208 + 4 -> 224
  EXPECT_EQ(layout().total, 240); // 227 rounded up
  int64_t total = -1;
  EXPECT_TRUE(codegen::layoutOffsets({}, &total).empty());
  EXPECT_EQ(total, 0);
  EXPECT_THROW(codegen::layoutOffsets({{"x", {-1, 2}}}, nullptr), std::invalid_argument);
}

TEST_F(RuntimeTest, LoadsAndRuns) {
  load();
  Batch b = randomBatch(5, 9, 1);
  std::vector<float> lp(b.ids.size(), kSentinel), scores(5, kSentinel), emb(5 * kDModel, kSentinel);
  std::vector<int32_t> nScored(5, -1);
  ASSERT_EQ(lm_rt_score_ex(model_, b.ids.data(), b.lengths.data(), b.batch, b.stride, lp.data(), scores.data(),
                           nScored.data()),
            LM_OK)
      << lm_last_error();
  ASSERT_EQ(lm_rt_embed(model_, b.ids.data(), b.lengths.data(), b.batch, b.stride, emb.data()), LM_OK)
      << lm_last_error();
  std::vector<float> eLp, eScores, eEmb;
  std::vector<int32_t> eN;
  expected(b, eLp, eScores, eN, eEmb);
  EXPECT_EQ(lp, eLp); // entries past each length keep the sentinel
  EXPECT_EQ(scores, eScores);
  EXPECT_EQ(nScored, eN);
  EXPECT_EQ(emb, eEmb);
}

/// A score kernel whose work runs in a kernel parallel loop of 64 items (lm_rt_parallel_for), counting the
/// loop's calls of its task: 1 when the loop runs on the calling thread alone.
std::atomic<int> g_taskCalls{0};
void fakeScoreInParallel(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2f *lp, lm_memref1f *scores,
                         lm_memref1i *nScored) {
  lm_rt_parallel_for(64, [](void *, int64_t, int64_t) { ++g_taskCalls; }, nullptr);
  fakeScore(w, ids, lengths, lp, scores, nScored);
}

// The memory model's thread term (ABI 8): a call on T threads plans for (T - 1) * thread_bytes[n] of the other
// threads' work items. A call that fits only without them runs one piece at a time with its kernels' parallel loops
// on the calling thread (same numbers); one that does not fit even so is an LM_ERR_MEMORY.
TEST_F(RuntimeTest, WorkspaceLimitCountsTheOtherThreadsWorkItems) {
  static const std::vector<int64_t> sentence(kMaxLen + 1, 1000), thread(kMaxLen + 1, 600);
  lm_model_desc d = fakeDesc();
  d.score = fakeScoreInParallel;
  d.score_sentence_bytes = sentence.data();
  d.score_thread_bytes = thread.data();
  ASSERT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &model_), LM_OK) << lm_last_error();
  Batch b = randomBatch(1, 9, 2);
  std::vector<float> eLp, eScores, eEmb;
  std::vector<int32_t> eN;
  expected(b, eLp, eScores, eN, eEmb);
  if (std::thread::hardware_concurrency() < 2)
    GTEST_SKIP() << "needs 2 hardware threads (the runtime uses at most what the machine offers)";
  lm_set_num_threads(2);
  const int64_t previous = lm_set_workspace_limit(1 << 20);
  struct Case {
    int64_t limit;
    int status, taskCalls; // taskCalls: 1 = the kernel's loop on one thread, 0 = split (more than one call)
  };
  // 1000 + 600 fit 1 MB and 1600 bytes (the loop on both threads); 1599 and 1000 only with the loop on one
  // thread; 999 not at all.
  for (Case c : {Case{1 << 20, LM_OK, 0}, Case{1600, LM_OK, 0}, Case{1599, LM_OK, 1}, Case{1000, LM_OK, 1},
                 Case{999, LM_ERR_MEMORY, -1}}) {
    lm_set_workspace_limit(c.limit);
    g_taskCalls = 0;
    std::vector<float> lp(b.ids.size(), kSentinel), scores(1, kSentinel);
    ASSERT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), 1, b.stride, lp.data(), scores.data()), c.status)
        << "limit " << c.limit << ": " << lm_last_error();
    if (c.status != LM_OK) {
      EXPECT_NE(std::string(lm_last_error()).find("over the workspace limit"), std::string::npos) << lm_last_error();
      continue;
    }
    EXPECT_EQ(lp, eLp) << "limit " << c.limit;
    EXPECT_EQ(scores, eScores) << "limit " << c.limit;
    if (c.taskCalls == 1)
      EXPECT_EQ(g_taskCalls.load(), 1) << "limit " << c.limit << ": the kernel's loop should stay on one thread";
    else
      EXPECT_GT(g_taskCalls.load(), 1) << "limit " << c.limit << ": the kernel's loop should be split";
  }
  // The cap is the call's: the next call (no limit) splits its loop again.
  lm_set_workspace_limit(0);
  g_taskCalls = 0;
  std::vector<float> lp(b.ids.size(), kSentinel), scores(1, kSentinel);
  ASSERT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), 1, b.stride, lp.data(), scores.data()), LM_OK);
  EXPECT_GT(g_taskCalls.load(), 1);
  lm_set_workspace_limit(previous);
}

TEST_F(RuntimeTest, MissingTensorIsNamed) {
  WeightSet w = weights_;
  w.tensors.erase("bias");
  EXPECT_EQ(loadWeights(w), LM_ERR_WEIGHTS);
  const std::string msg = lm_last_error();
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
}

TEST_F(RuntimeTest, WrongShapeIsNamedWithBothShapes) {
  WeightSet w = weights_;
  w.tensors["emb"] = Tensor{{kDModel, kVocab}, w.tensors["emb"].data};
  EXPECT_EQ(loadWeights(w), LM_ERR_WEIGHTS);
  const std::string msg = lm_last_error();
  EXPECT_NE(msg.find("'emb'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [50, 4], got [4, 50]"), std::string::npos) << msg;
}

TEST_F(RuntimeTest, NonFiniteValuesAreNamedWithTheirIndex) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    WeightSet w = weights_;
    w.tensors["emb"].data[37] = bad;
    EXPECT_EQ(loadWeights(w), LM_ERR_WEIGHTS);
    const std::string msg = lm_last_error();
    EXPECT_NE(msg.find("'emb'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 37"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::isnan(bad) ? "nan" : "inf"), std::string::npos) << msg;
  }
}

TEST_F(RuntimeTest, UnexpectedTensorIsRejected) {
  WeightSet w = weights_;
  w.tensors["head.output.weight"] = Tensor{{2}, {1, 2}};
  EXPECT_EQ(loadWeights(w), LM_ERR_WEIGHTS);
  const std::string msg = lm_last_error();
  EXPECT_NE(msg.find("'head.output.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected"), std::string::npos) << msg;
}

TEST_F(RuntimeTest, UnreadableFilesAreWeightErrors) {
  lm_model *m = reinterpret_cast<lm_model *>(0x1);
  EXPECT_EQ(lm_rt_load(&theDesc(), path("nope.safetensors").c_str(), &m), LM_ERR_WEIGHTS);
  EXPECT_NE(std::string(lm_last_error()).find("nope.safetensors"), std::string::npos);
  EXPECT_EQ(m, reinterpret_cast<lm_model *>(0x1)) << "*out is written only on success";
  std::ofstream(path("garbage")) << "not a safetensors file";
  EXPECT_EQ(lm_rt_load(&theDesc(), path("garbage").c_str(), &m), LM_ERR_WEIGHTS);
  EXPECT_EQ(lm_rt_load(&theDesc(), dir_.c_str(), &m), LM_ERR_WEIGHTS);
}

TEST_F(RuntimeTest, LoadArgumentErrors) {
  EXPECT_EQ(lm_rt_load(&theDesc(), path("w.safetensors").c_str(), nullptr), LM_ERR_ARGUMENT);
  EXPECT_NE(std::string(lm_last_error()).find("out is NULL"), std::string::npos);
  lm_model *m = nullptr;
  EXPECT_EQ(lm_rt_load(nullptr, path("w.safetensors").c_str(), &m), LM_ERR_ARGUMENT);
  EXPECT_EQ(lm_rt_load(&theDesc(), nullptr, &m), LM_ERR_ARGUMENT);
  EXPECT_NE(std::string(lm_last_error()).find("embedded"), std::string::npos) << lm_last_error();
  EXPECT_EQ(m, nullptr);
}

// The version handshake of a generated library with the one liblmrt.so of its process.
TEST_F(RuntimeTest, CheckAbiNamesBothVersions) {
  EXPECT_EQ(lm_rt_check_abi(LM_ABI_VERSION), LM_OK);
  for (int other : {LM_ABI_VERSION - 1, LM_ABI_VERSION + 1, 0}) {
    EXPECT_EQ(lm_rt_check_abi(other), LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find("generated for runtime ABI " + std::to_string(other) +
                                                ", but the liblmrt.so loaded in this process implements ABI " +
                                                std::to_string(LM_ABI_VERSION)),
              std::string::npos)
        << lm_last_error();
  }
}

TEST_F(RuntimeTest, BadDescriptorsAreInternalErrors) {
  std::vector<lm_tensor_desc> table = fakeTable();
  lm_model_desc d = fakeDesc();
  d.tensors = table.data();
  lm_model *m = nullptr;
  table[1].offset = -16; // before the buffer
  EXPECT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &m), LM_ERR_INTERNAL);
  table[1].offset = 16; // overlaps emb
  EXPECT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &m), LM_ERR_INTERNAL);
  table[1].offset = 208;
  d.total_floats = 220; // scale does not fit
  EXPECT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &m), LM_ERR_INTERNAL);
  d.total_floats = layout().total;
  d.pad_id = static_cast<int32_t>(kVocab);
  EXPECT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &m), LM_ERR_INTERNAL);
  EXPECT_NE(std::string(lm_last_error()).find("pad_id"), std::string::npos) << lm_last_error();
  EXPECT_EQ(m, nullptr);
}

bool cpuinfoHasFlag(const std::string &flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

#if defined(__linux__) && defined(__x86_64__)
/// In a death-test child: fails every arch_prctl with EPERM (seccomp), loads `d`, prints the result and exits 0 when
/// the load was refused with LM_ERR_ARGUMENT and no model.
[[noreturn]] void loadWithArchPrctlDenied(const lm_model_desc &d, const std::string &weights) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_arch_prctl, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    std::fprintf(stderr, "cannot install the seccomp filter: %s\n", std::strerror(errno));
    std::_Exit(2);
  }
  lm_model *m = nullptr;
  const int rc = lm_rt_load(&d, weights.c_str(), &m);
  std::fprintf(stderr, "rc %d: %s\n", rc, lm_last_error());
  std::_Exit(rc == LM_ERR_ARGUMENT && m == nullptr ? 0 : 1);
}
#endif

// A library with AMX kernels (desc.amx: bf16 weights compiled for a CPU with AMX-BF16) asks Linux for AMX tile state
// when it loads. Where the OS refuses, the load is an LM_ERR_ARGUMENT naming the reason, not a SIGILL at the first
// tile instruction: shown on this host as it is (granted where /proc/cpuinfo lists amx_tile, refused elsewhere) and
// in a child process whose seccomp filter fails arch_prctl with EPERM (a kernel that denies the permission).
TEST_F(RuntimeTest, AmxLibraryLoadsOnlyWhereTheOsGrantsTileState) {
#if !(defined(__linux__) && defined(__x86_64__))
  GTEST_SKIP() << "AMX tile state is requested with Linux's arch_prctl on x86-64";
#else
  lm_model_desc d = fakeDesc();
  d.amx = 1;
  const std::string weights = path("w.safetensors");
  lm_model *m = nullptr;
  if (cpuinfoHasFlag("amx_tile")) {
    ASSERT_EQ(lm_rt_load(&d, weights.c_str(), &m), LM_OK) << lm_last_error();
    lm_rt_free(m);
  } else {
    EXPECT_EQ(lm_rt_load(&d, weights.c_str(), &m), LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find("cannot have AMX tile state"), std::string::npos) << lm_last_error();
    EXPECT_EQ(m, nullptr);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe"); // the child re-runs this test alone: no runtime threads forked
  EXPECT_EXIT(loadWithArchPrctlDenied(d, weights), ::testing::ExitedWithCode(0),
              "rc -?[0-9]+: .*cannot have AMX tile state \\(Operation not permitted\\)");
#endif
}

TEST_F(RuntimeTest, EmbeddedWeightsAlignedAndUnaligned) {
  const std::vector<float> flat = flatWeights(weights_);
  // Aligned: used in place; unaligned (one float off): copied to an aligned buffer.
  float *storage = static_cast<float *>(std::aligned_alloc(64, (flat.size() + 16) * sizeof(float)));
  ASSERT_NE(storage, nullptr);
  for (int shift : {0, 1}) {
    std::copy(flat.begin(), flat.end(), storage + shift);
    lm_model_desc d = fakeDesc();
    d.embedded_weights = storage + shift;
    lm_model *m = nullptr;
    ASSERT_EQ(lm_rt_load(&d, nullptr, &m), LM_OK) << lm_last_error();
    Batch b = randomBatch(11, 16, 3 + shift);
    std::vector<float> out(11 * kDModel), scores(11), eLp, eScores, eEmb;
    std::vector<int32_t> eN;
    expected(b, eLp, eScores, eN, eEmb);
    ASSERT_EQ(lm_rt_embed(m, b.ids.data(), b.lengths.data(), b.batch, b.stride, out.data()), LM_OK);
    ASSERT_EQ(lm_rt_score(m, b.ids.data(), b.lengths.data(), b.batch, b.stride, nullptr, scores.data()), LM_OK);
    EXPECT_EQ(out, eEmb);
    EXPECT_EQ(scores, eScores);
    // A path still wins over the embedded weights.
    lm_model *fromFile = nullptr;
    EXPECT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &fromFile), LM_OK);
    lm_rt_free(fromFile);
    lm_rt_free(m);
  }
  std::free(storage);
  lm_rt_free(nullptr); // allowed
}

// --- Argument validation ------------------------------------------------------------

struct BadCall {
  const char *what;
  std::function<void(Batch &)> mutate;
  const char *message;
};

TEST_F(RuntimeTest, EveryBadArgumentIsRefusedWithoutWriting) {
  load();
  const std::vector<BadCall> calls = {
      {"batch 0", [](Batch &b) { b.batch = 0; }, "batch = 0"},
      {"batch -3", [](Batch &b) { b.batch = -3; }, "batch = -3"},
      {"stride 0", [](Batch &b) { b.stride = 0; }, "stride = 0"},
      {"length 0", [](Batch &b) { b.lengths[3] = 0; }, "lengths[3] = 0 is outside [1, max_len=16]"},
      {"negative length", [](Batch &b) { b.lengths[0] = -1; }, "lengths[0] = -1 is outside [1, max_len=16]"},
      {"length > max_len",
       [](Batch &b) {
         b.stride = 20;
         b.ids.assign(b.ids.size() * 2, 1);
         b.lengths[4] = 17;
       },
       "lengths[4] = 17 is outside [1, max_len=16]"},
      {"length > stride", [](Batch &b) { b.lengths[5] = b.stride + 1; }, "lengths[5] = 11 is larger than stride = 10"},
      {"id = vocab", [](Batch &b) { b.ids[2 * b.stride + 0] = 50, b.lengths[2] = std::max(b.lengths[2], 1); },
       "ids[2*stride+0] = 50 is outside the vocabulary [0, 50)"},
      {"negative id in the last sentence",
       [](Batch &b) {
         b.lengths.back() = 6;
         for (int i = 0; i < 6; ++i)
           b.ids[static_cast<size_t>(b.batch - 1) * b.stride + i] = i == 5 ? -1 : 1;
       },
       "ids[19*stride+5] = -1 is outside the vocabulary [0, 50)"},
  };
  const int64_t callsBefore = g_kernelCalls.load();
  for (const BadCall &call : calls) {
    SCOPED_TRACE(call.what);
    Batch b = randomBatch(20, 10, 4);
    call.mutate(b);
    std::vector<float> lp(400, kSentinel), scores(20, kSentinel), out(20 * kDModel, kSentinel);
    std::vector<int32_t> nScored(20, -1);
    EXPECT_EQ(lm_rt_score_ex(model_, b.ids.data(), b.lengths.data(), b.batch, b.stride, lp.data(), scores.data(),
                             nScored.data()),
              LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find(call.message), std::string::npos) << lm_last_error();
    EXPECT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), b.batch, b.stride, nullptr, scores.data()),
              LM_ERR_ARGUMENT);
    EXPECT_EQ(lm_rt_embed(model_, b.ids.data(), b.lengths.data(), b.batch, b.stride, out.data()), LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find(call.message), std::string::npos) << lm_last_error();
    EXPECT_TRUE(std::all_of(lp.begin(), lp.end(), [](float v) { return v == kSentinel; }));
    EXPECT_TRUE(std::all_of(scores.begin(), scores.end(), [](float v) { return v == kSentinel; }));
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; }));
    EXPECT_TRUE(std::all_of(nScored.begin(), nScored.end(), [](int32_t v) { return v == -1; }));
  }
  EXPECT_EQ(g_kernelCalls.load(), callsBefore) << "no kernel runs on a refused call";
}

TEST_F(RuntimeTest, NullPointersAreRefused) {
  load();
  Batch b = randomBatch(3, 5, 5);
  std::vector<float> lp(15, kSentinel), scores(3, kSentinel), out(3 * kDModel, kSentinel);
  const int32_t *ids = b.ids.data(), *lens = b.lengths.data();
  auto expectError = [&](int status, const char *message) {
    EXPECT_EQ(status, LM_ERR_ARGUMENT);
    EXPECT_NE(std::string(lm_last_error()).find(message), std::string::npos) << lm_last_error();
  };
  expectError(lm_rt_score(nullptr, ids, lens, 3, 5, lp.data(), scores.data()), "model is NULL");
  expectError(lm_rt_score(model_, nullptr, lens, 3, 5, lp.data(), scores.data()), "ids is NULL");
  expectError(lm_rt_score(model_, ids, nullptr, 3, 5, lp.data(), scores.data()), "lengths is NULL");
  expectError(lm_rt_score(model_, ids, lens, 3, 5, lp.data(), nullptr), "scores is NULL");
  expectError(lm_rt_embed(nullptr, ids, lens, 3, 5, out.data()), "model is NULL");
  expectError(lm_rt_embed(model_, nullptr, lens, 3, 5, out.data()), "ids is NULL");
  expectError(lm_rt_embed(model_, ids, nullptr, 3, 5, out.data()), "lengths is NULL");
  expectError(lm_rt_embed(model_, ids, lens, 3, 5, nullptr), "out is NULL");
  EXPECT_TRUE(std::all_of(lp.begin(), lp.end(), [](float v) { return v == kSentinel; }));
  EXPECT_TRUE(std::all_of(scores.begin(), scores.end(), [](float v) { return v == kSentinel; }));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; }));
}

TEST_F(RuntimeTest, TokenLogprobsMayBeNullAndEntriesPastLengthsStayUntouched) {
  load();
  Batch b = randomBatch(9, 16, 6);
  b.lengths[0] = 1, b.lengths[1] = 16;
  for (int32_t i = 0; i < 16; ++i)
    b.ids[16 + i] = 10 + i;
  std::vector<float> scoresA(9), scoresB(9), lp(b.ids.size(), kSentinel), eLp, eScores, eEmb;
  std::vector<int32_t> eN;
  expected(b, eLp, eScores, eN, eEmb);
  ASSERT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), 9, 16, nullptr, scoresA.data()), LM_OK);
  ASSERT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), 9, 16, lp.data(), scoresB.data()), LM_OK);
  EXPECT_EQ(scoresA, eScores);
  EXPECT_EQ(scoresB, eScores);
  EXPECT_EQ(lp, eLp);
  for (int32_t s = 0; s < 9; ++s)
    for (int32_t i = b.lengths[s]; i < 16; ++i)
      EXPECT_EQ(lp[s * 16 + i], kSentinel);
}

TEST_F(RuntimeTest, ChunksAndThreadCountsGiveIdenticalResults) {
  load();
  Batch b = randomBatch(37, 13, 7);
  std::vector<float> eLp, eScores, eEmb;
  std::vector<int32_t> eN;
  expected(b, eLp, eScores, eN, eEmb);
  std::vector<float> firstLp;
  for (int threads : {1, 2, 3, 1}) {
    SCOPED_TRACE(threads);
    lm_set_num_threads(threads);
    std::vector<float> lp(b.ids.size(), kSentinel), scores(37), out(37 * kDModel);
    std::vector<int32_t> nScored(37);
    ASSERT_EQ(lm_rt_score_ex(model_, b.ids.data(), b.lengths.data(), 37, 13, lp.data(), scores.data(),
                             nScored.data()),
              LM_OK);
    ASSERT_EQ(lm_rt_embed(model_, b.ids.data(), b.lengths.data(), 37, 13, out.data()), LM_OK);
    EXPECT_EQ(lp, eLp);
    EXPECT_EQ(scores, eScores);
    EXPECT_EQ(nScored, eN);
    EXPECT_EQ(out, eEmb);
  }
  EXPECT_EQ(g_maxRows.load(), 32) << "37 sentences run as chunks of at most 32 (32 and 5)";
}

// Under a workspace limit a chunk of 32 sentences is cut in halves until they fit or have at most 8 sentences; a
// chunk that still does not fit runs a sentence at a time. 1000 bytes per sentence (the fake memory model): 37
// sentences are chunks of 32 and 5; 32 000 bytes fit them, 31 999 halves of 16, 15 999 quarters of 8 and 5 (the
// last chunk of 5 never cut), 7999 then runs the 8s one sentence at a time and 4999 every sentence alone.
TEST_F(RuntimeTest, ChunksAreHalvedUnderTheWorkspaceLimit) {
  static const std::vector<int64_t> sentence(kMaxLen + 1, 1000);
  lm_model_desc d = fakeDesc();
  d.score_sentence_bytes = sentence.data();
  ASSERT_EQ(lm_rt_load(&d, path("w.safetensors").c_str(), &model_), LM_OK) << lm_last_error();
  Batch b = randomBatch(37, 13, 5);
  std::vector<float> eLp, eScores, eEmb;
  std::vector<int32_t> eN;
  expected(b, eLp, eScores, eN, eEmb);
  const int64_t previous = lm_set_workspace_limit(0);
  for (auto [limit, rows] : {std::pair<int64_t, int64_t>{0, 32}, {32000, 32}, {31999, 16}, {16000, 16},
                             {15999, 8}, {8000, 8}, {7999, 5}, {4999, 1}}) {
    lm_set_workspace_limit(limit);
    g_maxRows = 0;
    std::vector<float> lp(b.ids.size(), kSentinel), scores(37);
    ASSERT_EQ(lm_rt_score(model_, b.ids.data(), b.lengths.data(), 37, 13, lp.data(), scores.data()), LM_OK)
        << "limit " << limit << ": " << lm_last_error();
    EXPECT_EQ(g_maxRows.load(), rows) << "limit " << limit;
    EXPECT_EQ(lp, eLp) << "limit " << limit;
    EXPECT_EQ(scores, eScores) << "limit " << limit;
  }
  lm_set_workspace_limit(previous);
}

/// Four application threads score on one model at once, each call using `threadsPerCall`.
void concurrentCalls(lm_model *model, int threadsPerCall, const std::function<void(const Batch &, std::vector<float> &,
                                                                                     std::vector<float> &)> &expected) {
  lm_set_num_threads(threadsPerCall);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int iter = 0; iter < 20; ++iter) {
        Batch b = randomBatch(1 + (t * 7 + iter) % 23, 16, static_cast<uint32_t>(100 * t + iter));
        std::vector<float> lp(b.ids.size(), kSentinel), scores(static_cast<size_t>(b.batch)), eLp, eScores;
        expected(b, eLp, eScores);
        if (lm_rt_score(model, b.ids.data(), b.lengths.data(), b.batch, b.stride, lp.data(), scores.data()) != 0 ||
            lp != eLp || scores != eScores)
          ++failures;
      }
    });
  for (std::thread &t : threads)
    t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(RuntimeTest, ConcurrentCallsOnOneModelSingleThreadedCalls) {
  load();
  concurrentCalls(model_, 1, [&](const Batch &b, std::vector<float> &lp, std::vector<float> &scores) {
    std::vector<float> embed;
    std::vector<int32_t> nScored;
    expected(b, lp, scores, nScored, embed);
  });
}

TEST_F(RuntimeTest, ConcurrentCallsOnOneModelParallelCalls) {
  load();
  concurrentCalls(model_, 2, [&](const Batch &b, std::vector<float> &lp, std::vector<float> &scores) {
    std::vector<float> embed;
    std::vector<int32_t> nScored;
    expected(b, lp, scores, nScored, embed);
  });
}

// lm_set_num_threads returns a status (issue 4's C ABI); lm_rt_set_num_threads the previous value.
TEST_F(RuntimeTest, NumThreads) {
  EXPECT_EQ(lm_set_num_threads(4), LM_OK);
  EXPECT_EQ(lm_rt_set_num_threads(2), 4);
  EXPECT_EQ(lm_set_num_threads(0), LM_ERR_ARGUMENT);
  EXPECT_NE(std::string(lm_last_error()).find("n = 0"), std::string::npos) << lm_last_error();
  EXPECT_EQ(lm_set_num_threads(-3), LM_ERR_ARGUMENT);
  EXPECT_EQ(lm_rt_set_num_threads(1), 2) << "a refused call keeps the previous value";
  EXPECT_EQ(lm_rt_set_num_threads(0), -1);
  EXPECT_EQ(lm_rt_set_num_threads(1), 1);
  EXPECT_STREQ(lm_rt_last_error(), lm_last_error());
}

TEST_F(RuntimeTest, LastErrorIsPerThread) {
  EXPECT_EQ(lm_set_num_threads(0), LM_ERR_ARGUMENT);
  std::string other = "unset";
  std::thread([&] { other = lm_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(lm_last_error()), "");
}

// --- GEMM ---------------------------------------------------------------------------

TEST(RuntimeGemm, MatchesANaiveLoop) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t n = 17, k = 13;
  for (int64_t m = 1; m <= 9; ++m)
    for (bool withBias : {false, true})
      for (int64_t pad : {0, 3}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " bias=" + std::to_string(withBias) + " pad=" + std::to_string(pad));
        const int64_t lda = k + pad, ldb = k + 2 * pad, ldc = n + pad;
        std::vector<float> a(m * lda), b(n * ldb), bias(n), c(m * ldc, kSentinel);
        for (float &v : a)
          v = u(rng);
        for (float &v : b)
          v = u(rng);
        for (float &v : bias)
          v = u(rng);
        lm_rt_sgemm_nt(m, n, k, a.data(), lda, b.data(), ldb, withBias ? bias.data() : nullptr, c.data(), ldc);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = withBias ? bias[j] : 0.0;
            for (int64_t p = 0; p < k; ++p)
              ref += double(a[i * lda + p]) * b[j * ldb + p];
            EXPECT_NEAR(c[i * ldc + j], ref, 1e-5);
          }
          for (int64_t j = n; j < ldc; ++j)
            EXPECT_EQ(c[i * ldc + j], kSentinel) << "the gap past n columns is not written";
        }
      }
}

TEST(RuntimeGemm, EmptyInnerDimensionGivesBias) {
  float bias[3] = {1, 2, 3}, c[6] = {9, 9, 9, 9, 9, 9};
  lm_rt_sgemm_nt(2, 3, 0, nullptr, 0, nullptr, 0, bias, c, 3);
  EXPECT_EQ(std::vector<float>(c, c + 6), (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

// --- Training kernels over the lm_rt_gemm_fn contract --------------------------------------

/// lmrt.h's lm_rt_gemm_fn written out (independently of the generated kernel): B packed in panels of 64
/// columns, each cut into K x C slices; every element the ordered FMA chain over k.
template <int64_t C>
void naiveGemm(const float *A, int64_t lda, int64_t M, int64_t K, const float *P, float *Cm, int64_t ldc, int64_t N,
               int64_t pBegin, int64_t pEnd, int64_t accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = pBegin; p < pEnd; ++p)
      for (int64_t j = 0; j < 64 && p * 64 + j < N; ++j) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          s = std::fma(A[m * lda + k], P[p * K * 64 + (j / C) * K * C + k * C + j % C], s);
        float &out = Cm[m * ldc + p * 64 + j];
        out = accumulate ? out + s : s;
      }
}

std::vector<float> randoms(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = u(rng);
  return v;
}

/// Close to a float64 reference: |a - ref| <= tol (1 + |ref|).
void expectClose(const std::vector<float> &a, const std::vector<double> &ref, double tol, const std::string &what) {
  ASSERT_EQ(a.size(), ref.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], ref[i], tol * (1 + std::fabs(ref[i]))) << what << " [" << i << "]";
}

// dX = dY W, dW = dY^T X, db = sum of dY's rows, for both packed slice widths (AVX-512's 64, AVX2's 16), on sizes
// that are not multiples of anything, and on 1024 rows (dY's transposed copy then takes a row stride a line past
// 4 KB: TrainKernels.cpp transposedStride).
TEST(TrainKernels, LinearGradOverTheGemmContract) {
  for (const int64_t rows : {37, 1024}) {
    const int64_t in = 70, out = 45;
    auto dy = randoms(rows * out, 1), x = randoms(rows * in, 2), W = randoms(out * in, 3);
    std::vector<double> dxRef(rows * in, 0.0), dWRef(out * in, 0.0), dbRef(out, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) {
        dbRef[o] += dy[r * out + o];
        for (int64_t i = 0; i < in; ++i) {
          dxRef[r * in + i] += double(dy[r * out + o]) * W[o * in + i];
          dWRef[o * in + i] += double(dy[r * out + o]) * x[r * in + i];
        }
      }
    for (auto [gemm, cols] : {std::pair<lm_rt_gemm_fn, int64_t>{naiveGemm<64>, 64}, {naiveGemm<16>, 16}}) {
      std::vector<float> dx(rows * in), dW(out * in), db(out);
      lm_rt_linear_grad(dy.data(), x.data(), W.data(), rows, in, out, dx.data(), dW.data(), db.data(), gemm, cols);
      const std::string at = " (" + std::to_string(rows) + " rows, slices of " + std::to_string(cols) + ")";
      expectClose(dx, dxRef, 1e-5, "dx" + at);
      expectClose(dW, dWRef, 1e-5, "dW" + at);
      expectClose(db, dbRef, 1e-5, "db" + at);
    }
  }
}

// The token loss and its gradient against float64 (three vocabulary tiles, the last partial; padded rows and rows
// without a target); then the same inputs at addresses one float off: bit-identical (the kernels' vectorized
// exponentials must not depend on where buffers start, or checkpoints vary from run to run), and the GELU backward
// likewise.
TEST(TrainKernels, TokenLossOverTheGemmContractAndAlignmentFree) {
  const int64_t B = 3, N = 5, D = 19, V = 1100;
  auto h = randoms(B * N * D, 4, 2.0f), W = randoms(V * D, 5), bias = randoms(V, 6);
  std::vector<int32_t> lengths = {5, 3, 4}, targets(B * N, -1);
  std::mt19937 rng(7);
  for (int64_t r = 0; r < B * N; ++r)
    if (r % N < lengths[r / N] && r % 3 != 1)
      targets[r] = int32_t(rng() % V);
  // Reference: z = h W^T + b; ce = lse - z[y]; dz = (softmax - onehot) / T; dh = dz W, dW = dz^T h, db = sum dz.
  int64_t T = 0;
  for (int32_t y : targets)
    T += y >= 0;
  std::vector<double> ceRef(B * N, 0.0), dhRef(B * N * D, 0.0), dWRef(V * D, 0.0), dbRef(V, 0.0);
  for (int64_t r = 0; r < B * N; ++r) {
    if (targets[r] < 0)
      continue;
    std::vector<double> z(V);
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      z[v] = bias[v];
      for (int64_t d = 0; d < D; ++d)
        z[v] += double(h[r * D + d]) * W[v * D + d];
      mx = std::max(mx, z[v]);
    }
    double sum = 0;
    for (double x : z)
      sum += std::exp(x - mx);
    const double lse = mx + std::log(sum);
    ceRef[r] = lse - z[targets[r]];
    for (int64_t v = 0; v < V; ++v) {
      const double dz = (std::exp(z[v] - lse) - (v == targets[r] ? 1.0 : 0.0)) / double(T);
      dbRef[v] += dz;
      for (int64_t d = 0; d < D; ++d) {
        dhRef[r * D + d] += dz * W[v * D + d];
        dWRef[v * D + d] += dz * h[r * D + d];
      }
    }
  }
  struct Out {
    std::vector<float> ce, lse, dh, dW, db, act;
  };
  // Every input copied to `offset` floats past an aligned start.
  auto run = [&](int64_t offset) {
    auto at = [&](const std::vector<float> &v) {
      auto *buf = new std::vector<float>(v.size() + 16);
      std::copy(v.begin(), v.end(), buf->begin() + offset);
      return std::unique_ptr<std::vector<float>>(buf);
    };
    auto hb = at(h), Wb = at(W), bb = at(bias);
    const float *hp = hb->data() + offset, *Wp = Wb->data() + offset, *bp = bb->data() + offset;
    Out o;
    o.ce.resize(B * N), o.lse.resize(B * N), o.dh.resize(B * N * D), o.dW.resize(V * D), o.db.resize(V);
    lm_rt_token_loss(hp, Wp, bp, targets.data(), lengths.data(), B, N, D, V, 0.0, o.ce.data(), o.lse.data(),
                     naiveGemm<64>, 64);
    lm_rt_token_loss_grad(hp, Wp, bp, targets.data(), lengths.data(), o.lse.data(), B, N, D, V, 0.0, 0,
                          o.dh.data(), o.dW.data(), o.db.data(), naiveGemm<64>, 64);
    auto xb = at(W), gb = at(bias); // any floats: the GELU backward of W's first 1100 values, seeded by bias
    std::vector<float> act(V + 16, 0.0f);
    lm_rt_activation_grad(gb->data() + offset, xb->data() + offset, V, 0, act.data() + offset);
    o.act.assign(act.begin() + offset, act.begin() + offset + V);
    return o;
  };
  Out aligned = run(0);
  expectClose(aligned.ce, ceRef, 2e-5, "ce");
  expectClose(aligned.dh, dhRef, 2e-5, "dh");
  expectClose(aligned.dW, dWRef, 2e-5, "dW");
  expectClose(aligned.db, dbRef, 2e-5, "db");
  for (int64_t offset : {1, 3, 7}) {
    Out shifted = run(offset);
    for (auto [a, b, name] : {std::tuple{&aligned.ce, &shifted.ce, "ce"}, {&aligned.dh, &shifted.dh, "dh"},
                              {&aligned.dW, &shifted.dW, "dW"}, {&aligned.db, &shifted.db, "db"},
                              {&aligned.act, &shifted.act, "activation_grad"}})
      EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->size() * sizeof(float)))
          << name << " differs with its inputs " << offset << " floats off alignment";
  }
}

// lm_rt_token_loss_and_grad (lm.token_loss_and_grad, lm-fuse-loss-grad) against the pair it replaces: the same
// bits, with the logits kept (keep_bytes room for all three tiles) and recomputed (keep_bytes 0 or one float short),
// with and without a bias, label smoothing and per_length, and dbias NULL. A keep path that read a tile's logits
// from the wrong place, or before the bias, fails it.
TEST(TrainKernels, TokenLossAndGradIsThePairBitForBit) {
  const int64_t B = 3, N = 5, D = 19, V = 1100, tiles = 3;
  auto h = randoms(B * N * D, 11, 2.0f), W = randoms(V * D, 12), bias = randoms(V, 13);
  std::vector<int32_t> lengths = {5, 3, 4}, targets(B * N, -1);
  std::mt19937 rng(14);
  int64_t live = 0;
  for (int64_t r = 0; r < B * N; ++r)
    if (r % N < lengths[r / N] && r % 4 != 2)
      targets[r] = int32_t(rng() % V), ++live;
  const int64_t keepAll = tiles * live * 512 * int64_t(sizeof(float));
  for (const float *b : std::initializer_list<const float *>{bias.data(), nullptr})
    for (double smoothing : {0.0, 0.1})
      for (int32_t perLength : {0, 1}) {
        std::vector<float> ce(B * N), lse(B * N), dh(B * N * D), dW(V * D), db(V);
        lm_rt_token_loss(h.data(), W.data(), b, targets.data(), lengths.data(), B, N, D, V, smoothing, ce.data(),
                         lse.data(), naiveGemm<64>, 64);
        lm_rt_token_loss_grad(h.data(), W.data(), b, targets.data(), lengths.data(), lse.data(), B, N, D, V, smoothing,
                              perLength, dh.data(), dW.data(), db.data(), naiveGemm<64>, 64);
        for (int64_t keepBytes : {keepAll, keepAll - 4, int64_t(0)})
          for (bool withDbias : {true, false}) {
            // NaN-filled: every result element must be written.
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::vector<float> ce2(B * N, nan), lse2(B * N, nan), dh2(B * N * D, nan), dW2(V * D, nan), db2(V, nan);
            lm_rt_token_loss_and_grad(h.data(), W.data(), b, targets.data(), lengths.data(), B, N, D, V, smoothing,
                                      perLength, keepBytes, ce2.data(), lse2.data(), dh2.data(), dW2.data(),
                                      withDbias ? db2.data() : nullptr, naiveGemm<64>, 64);
            const std::string at = std::string(b ? "bias" : "no bias") + ", smoothing " + std::to_string(smoothing) +
                                   ", per_length " + std::to_string(perLength) + ", keep_bytes " +
                                   std::to_string(keepBytes);
            for (auto [x, y, name] : {std::tuple{&ce, &ce2, "ce"}, {&lse, &lse2, "lse"}, {&dh, &dh2, "dh"},
                                      {&dW, &dW2, "dW"}, {&db, &db2, "dbias"}}) {
              if (x == &db && !withDbias)
                continue;
              EXPECT_EQ(0, std::memcmp(x->data(), y->data(), x->size() * sizeof(float))) << name << " (" << at << ")";
            }
          }
      }
}

// lm_rt_ngram_head_loss_and_grad against lm_rt_ngram_head_loss then lm_rt_ngram_head_grad, head by head as the
// lowerings call them (three heads, shifts 0..2, the first overwriting and the others adding): the same bits with
// the logits kept and recomputed.
TEST(TrainKernels, NgramHeadLossAndGradIsThePairBitForBit) {
  const int64_t B = 3, N = 6, D = 19, V = 700, n = 3;
  std::vector<std::vector<float>> heads;
  for (int64_t j = 0; j < n; ++j)
    heads.push_back(randoms(B * N * D, 21 + j, 2.0f));
  auto W = randoms(V * D, 25), bias = randoms(V, 26);
  std::vector<int32_t> lengths = {6, 4, 5}, targets(B * N, -1);
  std::mt19937 rng(27);
  for (int64_t r = 0; r < B * N; ++r)
    if (r % N < lengths[r / N])
      targets[r] = int32_t(rng() % V);
  auto weight = [&](int64_t j) { return j == 0 ? 0.5 : 0.5 / double(n - 1); };
  const double smoothing = 0.1;
  std::vector<float> total(B * N), dW(V * D), db(V);
  std::vector<std::vector<float>> lse(n, std::vector<float>(B * N)), du(n, std::vector<float>(B * N * D));
  for (int64_t j = 0; j < n; ++j)
    lm_rt_ngram_head_loss(heads[j].data(), W.data(), bias.data(), targets.data(), lengths.data(), B, N, D, V,
                          smoothing, j, weight(j), j == 0, total.data(), lse[j].data(), naiveGemm<64>, 64);
  for (int64_t j = 0; j < n; ++j)
    lm_rt_ngram_head_grad(heads[j].data(), W.data(), bias.data(), targets.data(), lengths.data(), lse[j].data(), B, N,
                          D, V, smoothing, j, weight(j), j == 0, du[j].data(), dW.data(), db.data(), naiveGemm<64>,
                          64);
  for (int64_t keepBytes : {int64_t(1) << 30, int64_t(0)}) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> total2(B * N, nan), dW2(V * D, nan), db2(V, nan);
    std::vector<std::vector<float>> lse2(n, std::vector<float>(B * N, nan)), du2(n, std::vector<float>(B * N * D, nan));
    for (int64_t j = 0; j < n; ++j)
      lm_rt_ngram_head_loss_and_grad(heads[j].data(), W.data(), bias.data(), targets.data(), lengths.data(), B, N, D,
                                     V, smoothing, j, weight(j), j == 0, keepBytes, total2.data(), lse2[j].data(),
                                     du2[j].data(), dW2.data(), db2.data(), naiveGemm<64>, 64);
    const std::string at = "keep_bytes " + std::to_string(keepBytes);
    auto same = [&](const std::vector<float> &x, const std::vector<float> &y, const std::string &name) {
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << name << " (" << at << ")";
    };
    same(total, total2, "total");
    same(dW, dW2, "dW");
    same(db, db2, "dbias");
    for (int64_t j = 0; j < n; ++j) {
      same(lse[j], lse2[j], "lse of head " + std::to_string(j + 1));
      same(du[j], du2[j], "du of head " + std::to_string(j + 1));
    }
  }
}

// --- Generated header and glue ---------------------------------------------------------

/// What MLIRGen records in the lm.model / lm.family / lm.spec_hash attributes for `s`.
codegen::ModelFacts facts(const ModelSpec &s) {
  codegen::ModelFacts f;
  f.name = s.name, f.family = toString(s.family), f.specHash = specHash(s);
  f.vocab = s.dims.vocab, f.maxLen = s.dims.maxLen, f.dModel = s.dims.dModel, f.heads = s.dims.heads;
  f.dFF = s.dims.dFF, f.layers = s.dims.layers;
  f.pad = s.tokens.pad, f.unk = s.tokens.unk, f.bos = s.tokens.bos, f.eos = s.tokens.eos, f.mask = s.tokens.mask;
  return f;
}

ModelSpec tinySpec(const std::string &name, Family family) {
  ModelSpec s;
  s.name = name;
  s.family = family;
  s.dims = Dims{40, 12, 8, 2, 16, 1};
  if (family == Family::UniLM) {
    s.mask = MaskKind::Causal, s.keysValues = KeyValueSource::Hidden, s.firstQuery = FirstQuery::Embedding;
    s.method = ScoreMethod::Causal;
  }
  return s;
}

/// Collapses runs of whitespace so that prototypes can be compared whatever the line breaks.
std::string squeeze(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ')
        out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

bool haveTool(const char *tool) {
  return std::system((std::string(tool) + " --version > /dev/null 2>&1").c_str()) == 0;
}

class GeneratedTest : public RuntimeTest {
protected:
  int sh(const std::string &command) {
    const std::string log = path("log.txt");
    const int status = std::system((command + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    output_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return status;
  }
  void write(const std::string &name, const std::string &text) {
    std::ofstream out(path(name), std::ios::binary);
    out << text;
    ASSERT_TRUE(out.good());
  }
  std::string output_;
};

TEST_F(GeneratedTest, HeaderHasTheContractPrototypesAndMacros) {
  const ModelSpec spec = tinySpec("tiny_tta", Family::TTA);
  const std::string h = squeeze(codegen::generateHeader(facts(spec)));
  for (const std::string &needle : std::vector<std::string>{
           "#include <stdint.h>", "extern \"C\" {", "#define TINY_TTA_ABI_VERSION " + std::to_string(LM_ABI_VERSION),
           "#ifndef LM_ABI_VERSION #define LM_ABI_VERSION " + std::to_string(LM_ABI_VERSION) + " #endif",
           "#define TINY_TTA_VOCAB 40", "#define TINY_TTA_MAX_LEN 12", "#define TINY_TTA_D_MODEL 8",
           "#define TINY_TTA_LAYERS 1", "#define TINY_TTA_HEADS 2", "#define TINY_TTA_D_FF 16",
           "#define TINY_TTA_EMBEDDED_WEIGHTS 0", "typedef struct tiny_tta_model tiny_tta_model;",
           "int tiny_tta_load(const char *weights_path, tiny_tta_model **out);",
           "int tiny_tta_score(tiny_tta_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, "
           "int32_t stride, float *token_logprobs, float *scores);",
           "int tiny_tta_embed(tiny_tta_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, "
           "int32_t stride, float *out);",
           "void tiny_tta_free(tiny_tta_model *m);", "const char *lm_last_error(void);",
           "int lm_set_num_threads(int n);", "namespace tiny_tta {", "class Model {"})
    EXPECT_NE(h.find(needle), std::string::npos) << needle;
  EXPECT_NE(squeeze(codegen::generateHeader(facts(spec), true)).find("#define TINY_TTA_EMBEDDED_WEIGHTS 1"),
            std::string::npos);
  ModelSpec stdName = tinySpec("std", Family::TTA); // keywords are refused by lmcc check; std is a valid C name
  EXPECT_NE(codegen::generateHeader(facts(stdName)).find("namespace std_ {"), std::string::npos);
  ModelSpec clash = tinySpec("lm_rt", Family::TTA);
  EXPECT_THROW(codegen::generateHeader(facts(clash)), std::invalid_argument);
}

TEST_F(GeneratedTest, TwoHeadersCompileTogetherAsCAndCxx) {
  const bool cc = haveTool("cc"), cxx = haveTool("c++");
  if (!cc && !cxx)
    GTEST_SKIP() << "no C or C++ compiler (cc, c++) on PATH";
  write("alpha_lm.h", codegen::generateHeader(facts(tinySpec("alpha_lm", Family::TTA))));
  write("beta_lm.h", codegen::generateHeader(facts(tinySpec("beta_lm", Family::UniLM)), true));
  const std::string body = R"(#include "alpha_lm.h"
#include "beta_lm.h"
#include "alpha_lm.h" /* the include guard */
#include "lmrt.h"     /* the runtime's own header may come along */
int use(void);
int use(void) {
  alpha_lm_model *a = 0;
  beta_lm_model *b = 0;
  int32_t ids[2] = {1, 2}, len[1] = {2};
  float lp[2], sc[1], out[ALPHA_LM_D_MODEL];
  int r = alpha_lm_load("w", &a) + beta_lm_load(0, &b);
  r += alpha_lm_score(a, ids, len, 1, 2, lp, sc) + beta_lm_embed(b, ids, len, 1, 2, out);
  r += lm_set_num_threads(2) + (lm_last_error() != 0) + LM_ABI_VERSION + BETA_LM_VOCAB + BETA_LM_EMBEDDED_WEIGHTS;
  r += (lm_set_num_threads(1) != LM_OK) + LM_ERR_NONFINITE; /* the status codes come with the header */
  alpha_lm_free(a);
  beta_lm_free(b);
  return r;
}
)";
  write("both.c", body);
  const std::string inc = " -I " + dir_.string() + " -I " + kSource + "/runtime/lib ";
  if (cc) {
    EXPECT_EQ(sh("cc -std=c99 -Wall -Wextra -pedantic -Werror -fsyntax-only" + inc + path("both.c")), 0) << output_;
    EXPECT_EQ(sh("cc -std=c11 -Wall -Wextra -Werror -fsyntax-only" + inc + path("both.c")), 0) << output_;
  }
  if (cxx) {
    write("both.cpp", body + R"(
#include <cstdio>
void cxx(void);
void cxx(void) {
  try {
    alpha_lm::Model a("w.safetensors");
    beta_lm::Model b(nullptr);
    alpha_lm::Scores s = a.score({{1, 2, 3}, {4}});
    std::vector<std::vector<float>> e = b.embed({{1, 2}});
    alpha_lm::Model moved = std::move(a);
    beta_lm::ModelPtr raw;
    alpha_lm::set_num_threads(2);
    std::printf("%d %zu %zu %d\n", static_cast<bool>(moved), s.scores.size(), e.size(), raw == nullptr);
  } catch (const alpha_lm::Error &e) {
    std::printf("%s %d\n", e.what(), e.code());
  }
  static_assert(alpha_lm::d_model == 8, "constants");
}
)");
    EXPECT_EQ(sh("c++ -std=c++17 -Wall -Wextra -pedantic -Werror -fsyntax-only" + inc + path("both.cpp")), 0)
        << output_;
  }
}

TEST_F(GeneratedTest, GlueCompiles) {
  if (!haveTool("cc"))
    GTEST_SKIP() << "no C compiler (cc) on PATH";
  for (bool embed : {false, true}) {
    SCOPED_TRACE(embed);
    const ModelSpec spec = tinySpec("tiny_glue", Family::TTA);
    const std::vector<TensorInfo> tensors = expectedTensors(spec);
    int64_t total = 0;
    const std::vector<int64_t> offsets = codegen::layoutOffsets(toLayout(tensors), &total);
    const std::string glue = codegen::generateGlue(facts(spec), toLayout(tensors), offsets, total, embed);
    EXPECT_NE(glue.find("#include \"lmrt.h\""), std::string::npos);
    EXPECT_NE(glue.find("_mlir_ciface_tiny_glue_score_kernel"), std::string::npos);
    EXPECT_NE(glue.find("_mlir_ciface_tiny_glue_embed_kernel"), std::string::npos);
    EXPECT_EQ(glue.find("tiny_glue_embedded_weights") != std::string::npos, embed);
    write("glue.c", glue);
    EXPECT_EQ(sh("cc -std=c99 -O2 -fPIC -Wall -Wextra -pedantic -Werror -Wmissing-prototypes -c -I " + kSource +
                 "/runtime/lib " +
                 path("glue.c") + " -o " + path("glue.o")),
              0)
        << output_;
  }
  const ModelSpec spec = tinySpec("tiny_glue", Family::TTA);
  const std::vector<TensorInfo> tensors = expectedTensors(spec);
  int64_t total = 0;
  std::vector<int64_t> offsets = codegen::layoutOffsets(toLayout(tensors), &total);
  offsets.pop_back();
  EXPECT_THROW(codegen::generateGlue(facts(spec), toLayout(tensors), offsets, total, false), std::invalid_argument);
  offsets = codegen::layoutOffsets(toLayout(tensors), &total);
  EXPECT_THROW(codegen::generateGlue(facts(spec), toLayout(tensors), offsets, total - 16, false), std::invalid_argument);
}

/// C kernels for the end-to-end library: token_logprob = -(id + 1) / 8, score = sum, embed[j] = ids[0] + j.
const char *kFakeKernelsC = R"(#include "lmrt.h"
void _mlir_ciface_example_model_score_kernel(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths,
    lm_memref2f *lp, lm_memref1f *scores, lm_memref1i *n_scored);
void _mlir_ciface_example_model_embed_kernel(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths,
    lm_memref2f *out);
void _mlir_ciface_example_model_init_kernel(lm_memref1f *w);
void _mlir_ciface_example_model_init_kernel(lm_memref1f *w) { (void)w; }
void _mlir_ciface_example_model_score_kernel(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths,
    lm_memref2f *lp, lm_memref1f *scores, lm_memref1i *n_scored) {
  int64_t rows = ids->sizes[0], n = ids->sizes[1], r, i;
  (void)w;
  for (r = 0; r < rows; r++) {
    float sum = 0;
    for (i = 0; i < lengths->aligned[r]; i++) {
      lp->aligned[r * n + i] = -(ids->aligned[r * n + i] + 1) / 8.0f;
      sum += lp->aligned[r * n + i];
    }
    scores->aligned[r] = sum;
    n_scored->aligned[r] = lengths->aligned[r];
  }
}
void _mlir_ciface_example_model_embed_kernel(lm_memref1f *w, lm_memref2i *ids, lm_memref1i *lengths,
    lm_memref2f *out) {
  int64_t rows = ids->sizes[0], n = ids->sizes[1], d = out->sizes[1], r, j;
  (void)w, (void)lengths;
  for (r = 0; r < rows; r++)
    for (j = 0; j < d; j++)
      out->aligned[r * d + j] = (float)(ids->aligned[r * n] + j);
}
)";

TEST_F(GeneratedTest, EndToEndLibraryRunsTheExamples) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "programs built here would need the sanitizer runtime of liblmrt.so";
#endif
  if (!haveTool("cc"))
    GTEST_SKIP() << "no C compiler (cc) on PATH";
  // What `lmcc compile` produces: lib<name>.so (kernels + glue, RUNPATH $ORIGIN), <name>.h, liblmrt.so.
  const ModelSpec spec = tinySpec("example_model", Family::TTA);
  const std::vector<TensorInfo> tensors = expectedTensors(spec);
  int64_t total = 0;
  const std::vector<int64_t> offsets = codegen::layoutOffsets(toLayout(tensors), &total);
  write("example_model.h", codegen::generateHeader(facts(spec)));
  write("glue.c", codegen::generateGlue(facts(spec), toLayout(tensors), offsets, total, false));
  write("kernels.c", kFakeKernelsC);
  fs::copy_file(kRuntime + "/liblmrt.so", dir_ / "liblmrt.so");
  const std::string d = dir_.string();
  // The library from glue.c + kernels.c into `out` (beside its liblmrt.so), and examples/score.c linked to it.
  auto buildLibraryAndScoreC = [&](const std::string &out, const std::string &flags) {
    return sh("cc -std=c99 -O1 -fPIC -shared -fvisibility=hidden " + flags + " -I " + kSource + "/runtime/lib " +
              d + "/glue.c " + d + "/kernels.c -o " + out + "/libexample_model.so -L " + out +
              " -llmrt -Wl,-soname,libexample_model.so '-Wl,-rpath,$ORIGIN' -Wl,--no-undefined") == 0 &&
           sh("cc -std=c99 -Wall -Wextra -Werror " + kSource + "/examples/score.c -I " + d + " -L " + out +
              " -lexample_model -Wl,-rpath," + out + " -o " + out + "/score_c") == 0;
  };
  ASSERT_TRUE(buildLibraryAndScoreC(d, "")) << output_;
  WeightSet w = initWeights(spec, 1);
  writeSafetensors(path("weights.safetensors"), w);
  write("ids.txt", "3 7 9\n\n5 1\n39 0 2 4 6 8 10 12 14 16 18 20\n");
  const std::string expected = "{\"token_logprobs\":[-0.5,-1,-1.25],\"score\":-2.75}\n"
                               "{\"token_logprobs\":[-0.75,-0.25],\"score\":-1}\n";

  // C: score_c is linked with -lexample_model alone (lm_last_error comes from the model library).
  ASSERT_EQ(sh(d + "/score_c " + path("weights.safetensors") + " " + path("ids.txt")), 0) << output_;
  EXPECT_EQ(output_.substr(0, expected.size()), expected) << output_;
  EXPECT_EQ(std::count(output_.begin(), output_.end(), '\n'), 3) << output_;
  // Errors: a bad weights file and an id outside the vocabulary are reported, non-zero exit.
  EXPECT_NE(sh(d + "/score_c " + path("ids.txt") + " " + path("ids.txt")), 0);
  EXPECT_NE(output_.find("ids.txt"), std::string::npos) << output_;
  write("bad_ids.txt", "1 2 40\n");
  EXPECT_NE(sh(d + "/score_c " + path("weights.safetensors") + " " + path("bad_ids.txt")), 0);
  EXPECT_NE(output_.find("outside the vocabulary"), std::string::npos) << output_;

  // The same library as an lmcc of the previous ABI generated it (its glue built with that LM_ABI_VERSION), run
  // with this liblmrt.so, as when two lmcc versions' libraries share a process: refused at load, naming both.
  fs::create_directories(dir_ / "old");
  fs::copy_file(kRuntime + "/liblmrt.so", dir_ / "old" / "liblmrt.so");
  const std::string old = d + "/old";
  ASSERT_TRUE(buildLibraryAndScoreC(old, "-DLM_ABI_VERSION=" + std::to_string(LM_ABI_VERSION - 1))) << output_;
  EXPECT_NE(sh(old + "/score_c " + path("weights.safetensors") + " " + path("ids.txt")), 0);
  EXPECT_NE(output_.find("generated for runtime ABI " + std::to_string(LM_ABI_VERSION - 1) +
                         ", but the liblmrt.so loaded in this process implements ABI " +
                         std::to_string(LM_ABI_VERSION)),
            std::string::npos)
      << output_;

  // Text through the C API (examples/score_text.c): tokenizer functions come from the model library too.
  ASSERT_EQ(sh("cc -std=c99 -Wall -Wextra -Werror " + kSource + "/examples/score_text.c -I " + d + " -L " + d +
               " -lexample_model -Wl,-rpath," + d + " -o " + d + "/score_text"),
            0)
      << output_;
  write("vocab.txt", "[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\nthe\ncat\n##s\nsat\n.\n");
  write("text.txt", "The cats sat.\nthe\n");
  ASSERT_EQ(sh(d + "/score_text " + path("weights.safetensors") + " " + path("vocab.txt") + " " + path("text.txt")), 0)
      << output_;
  EXPECT_EQ(output_.rfind("{\"tokens\":[\"[SOS]\",\"the\",\"cat\",\"##s\",\"sat\",\".\",\"[EOS]\"],\"score\":", 0), 0u)
      << output_;
  EXPECT_NE(output_.find("\n{\"tokens\":[\"[SOS]\",\"the\",\"[EOS]\"],\"score\":"), std::string::npos) << output_;
  write("bad.txt", "the cat\nthe \xff\n");
  EXPECT_NE(sh(d + "/score_text " + path("weights.safetensors") + " " + path("vocab.txt") + " " + path("bad.txt")), 0);
  EXPECT_NE(output_.find("bad.txt:2: lm_tokenize: invalid UTF-8 at byte 4 (0xFF)"), std::string::npos) << output_;

  if (!haveTool("c++"))
    GTEST_SKIP() << "no C++ compiler (c++) on PATH";
  ASSERT_EQ(sh("c++ -std=c++17 -Wall -Wextra -Werror " + kSource + "/examples/score.cpp -I " + d + " -L " + d +
               " -lexample_model -Wl,-rpath," + d + " -o " + d + "/score_cpp"),
            0)
      << output_;
  ASSERT_EQ(sh(d + "/score_cpp " + path("weights.safetensors") + " " + path("ids.txt")), 0) << output_;
  EXPECT_EQ(output_.substr(0, expected.size()), expected) << output_;
  EXPECT_NE(sh(d + "/score_cpp " + path("weights.safetensors") + " " + path("bad_ids.txt")), 0);
  EXPECT_NE(output_.find("outside the vocabulary"), std::string::npos) << output_;
}

} // namespace

// The kernels' temporaries cache: a request reuses a cached block up to twice its size, and a new block that
// would pass the thread's share of the workspace limit hands back the largest cached blocks only, as few as it
// must (dropping the whole cache there made a batched biLM PLL call map its pages again and again).
TEST(WorkspaceCache, ReusesAndTrimsLargestFirst) {
  lm_set_num_threads(1);
  lm_rt_workspace_release(); // blocks earlier tests' kernels left in this thread's cache
  const int64_t previous = lm_set_workspace_limit(int64_t(10) << 20); // 10 MB
  const uint64_t MB = uint64_t(1) << 20;
  auto allocations = [] { return lm_rt_workspace_system_allocations(); };
  void *a = _mlir_memref_to_llvm_aligned_alloc(64, 4 * MB);
  void *b = _mlir_memref_to_llvm_aligned_alloc(64, 3 * MB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  _mlir_memref_to_llvm_free(a);
  _mlir_memref_to_llvm_free(b); // cached: 4 MB and 3 MB
  uint64_t before = allocations();
  void *c = _mlir_memref_to_llvm_aligned_alloc(64, 2 * MB + MB / 2); // fits the 3 MB block (at most twice)
  EXPECT_EQ(allocations(), before) << "a cached block of up to twice the size should be reused";
  _mlir_memref_to_llvm_free(c);
  void *d = _mlir_memref_to_llvm_aligned_alloc(64, MB); // no cached block within twice its size
  EXPECT_EQ(allocations(), before + 1);
  _mlir_memref_to_llvm_free(d); // cached: 4, 3 and 1 MB
  void *e = _mlir_memref_to_llvm_aligned_alloc(64, 5 * MB); // 8 + 5 > 10: the 4 MB block goes, 3 and 1 stay
  EXPECT_EQ(allocations(), before + 2);
  void *f = _mlir_memref_to_llvm_aligned_alloc(64, 3 * MB);
  void *g = _mlir_memref_to_llvm_aligned_alloc(64, MB);
  EXPECT_EQ(allocations(), before + 2) << "only the largest cached block should have been handed back";
  for (void *p : {e, f, g})
    _mlir_memref_to_llvm_free(p); // cached: 5, 3 and 1 MB
  // Released: the cached bytes come back to the system, and the same requests allocate again.
  EXPECT_EQ(lm_rt_workspace_release(), 9 * MB);
  EXPECT_EQ(lm_rt_workspace_release(), 0u);
  before = allocations();
  void *h = _mlir_memref_to_llvm_aligned_alloc(64, 3 * MB);
  EXPECT_EQ(allocations(), before + 1);
  _mlir_memref_to_llvm_free(h);
  lm_set_workspace_limit(previous);
}
