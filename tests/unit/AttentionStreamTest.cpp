// The vector attention kernels (codegen/LmToLoops/Attention.cpp, AttentionGrad.cpp) on operands larger than the
// threads' L2, where they prefetch the next item (the backward also the next entry) and store their outputs (dq, dk
// and dv in the backward) nontemporally: every mask kind, odd lengths, against a direct softmax(q k^T) v, and
// bit-identical to the same entries computed one at a time (operands in cache: no prefetch, plain stores; the
// backward with an empty entry and every output element written). An output argument that is not 64-byte aligned
// takes plain stores and gives the same bits. Sharp scores take the softmax's exponential over its whole range.
// Relative positions and the Diformer's directional rows (per-row directions and hidden keys) the same way, their
// backwards also against the runtime's C++ kernel. The register tiles of 256- and 512-bit targets give the same bits.
#include "codegen/LmToLoops/KernelAbi.h"
#include "codegen/LmToLoops/Lowering.h"
#include "runtime/lib/TrainKernels.h"
#include "runtime/lib/lmrt.h"
#include "tests/unit/KernelLibrary.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/SymbolTable.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

namespace {

namespace lm = lmcc::lm;

using namespace lmcc::codegen::abi;

constexpr int64_t kHeads = 8, kModel = 512, kRows = 37, kBatch = 64;
/// Relative-position clips: rows near either end and rows far from both (5), no clamping within a length (40).
constexpr int64_t kClips[] = {5, 40};
/// Entries of the relative and directional backwards compared with the runtime's C++ kernel.
constexpr int64_t kCompared = 12;
/// Directional rows: direction, then words of hidden-key bits for kRows keys.
constexpr int64_t kRowWords = 1 + (kRows + 31) / 32;
/// The relative-position clip of the directional kernels' second set.
constexpr int64_t kDirectionalClip = 5;
/// The register tiles (AttentionVector.h's Geometry) AttentionStreamWidthTest compares: 256-bit, and 512-bit with
/// the score groups over whole blocks and with half blocks on steps of their own (Geometry::halfBlocks).
struct Width {
  int64_t bits;
  bool halfBlocks;
  const char *suffix;
};
constexpr Width kWidths[] = {{256, false, "_w256"}, {512, false, "_w512"}, {512, true, "_w512h"}};
/// Row patterns of the directional tests (DirectionalRows), and the entries of their backward compared with the
/// runtime's C++ kernel: every pattern twice.
constexpr int64_t kPatterns = 7, kDirectionalCompared = 2 * kPatterns;
const std::pair<lm::MaskKind, const char *> kMasks[] = {{lm::MaskKind::none, "none"},
                                                        {lm::MaskKind::causal, "causal"},
                                                        {lm::MaskKind::anticausal, "anticausal"},
                                                        {lm::MaskKind::diagonal, "diagonal"}};

struct FreeDeleter {
  void operator()(float *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

/// `floats` (+ 16 of slack for the misaligned view) 64-byte aligned, random in [-1, 1) or zero.
Buffer buffer(int64_t floats, std::mt19937 *rng) {
  const size_t bytes = ((floats + 16) * sizeof(float) + 63) / 64 * 64;
  Buffer p(static_cast<float *>(std::aligned_alloc(64, bytes)));
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < floats + 16; ++i)
    p[i] = rng ? u(*rng) : 0.0f;
  return p;
}

MemRef<3> view(float *p, int64_t batch) { return {p, p, 0, {batch, kRows, kModel}, {kRows * kModel, kModel, 1}}; }
MemRef<1> lengthsView(int32_t *p, int64_t batch) {
  return {reinterpret_cast<float *>(p), reinterpret_cast<float *>(p), 0, {batch}, {1}};
}

bool sees(lm::MaskKind mask, int64_t i, int64_t j) {
  return mask == lm::MaskKind::causal ? j <= i : mask == lm::MaskKind::anticausal ? j >= i
         : mask == lm::MaskKind::diagonal   ? j != i
                                            : true;
}

/// The Diformer's directional rows [entries, kRows, kRowWords] (lm.mask_fill: direction 0 R j <= i, 1 L j >= i,
/// 2 S j != i and bit j clear, 3 skip), made per entry by pattern b mod kPatterns:
///   0 tiles of 8 rows alternating R (its last row skip) and L: a tile's keys start past every key the tiles
///     before it saw (the backward's touched-keys prefix has a gap);
///   1 S rows hiding a random third of the keys; 2 every direction at random, random bits on every row (only S
///   rows' count); 3 l2r (all R); 4 r2l (all L); 5 S rows hiding every key but a few, some rows all of them (a
///   row that sees no key gives zeros); 6 S rows hiding nothing (blocks with a row's own key alone tested).
struct DirectionalRows {
  std::vector<int32_t> data;
  explicit DirectionalRows(int64_t entries, std::mt19937 &rng) : data(entries * kRows * kRowWords, 0) {
    std::uniform_int_distribution<int> coin(0, 99);
    for (int64_t b = 0; b < entries; ++b)
      for (int64_t i = 0; i < kRows; ++i) {
        int32_t *row = &data[(b * kRows + i) * kRowWords];
        const int64_t pattern = b % kPatterns, tile = i / 8;
        row[0] = pattern == 0   ? (tile % 2 ? 1 : i % 8 == 7 ? 3 : 0)
                 : pattern == 2 ? coin(rng) % 4
                 : pattern == 3 ? 0
                 : pattern == 4 ? 1
                                : 2;
        const int hide = pattern == 1 ? 33 : pattern == 2 ? 50 : pattern == 5 ? (i % 5 == 0 ? 100 : 90) : 0;
        for (int64_t j = 0; j < kRows; ++j)
          if (coin(rng) < hide)
            row[1 + j / 32] |= int32_t(1u << (j % 32));
      }
  }
  bool visible(int64_t b, int64_t i, int64_t j) const {
    const int32_t *row = &data[(b * kRows + i) * kRowWords];
    switch (row[0]) {
    case 0: return j <= i;
    case 1: return j >= i;
    case 2: return j != i && !((uint32_t(row[1 + j / 32]) >> (j % 32)) & 1);
    default: return false;
    }
  }
  MemRef<3> view(int64_t from, int64_t entries) {
    float *p = reinterpret_cast<float *>(&data[from * kRows * kRowWords]);
    return {p, p, 0, {entries, kRows, kRowWords}, {kRows * kRowWords, kRowWords, 1}};
  }
};

/// Shaw relative position tables [2 clip + 1, dh] (key, value) of a test, or none (clip 0).
struct Relative {
  int64_t clip = 0;
  const float *key = nullptr, *value = nullptr;
  /// Table row of query i and key j.
  int64_t row(int64_t i, int64_t j) const { return std::clamp<int64_t>(j - i, -clip, clip) + clip; }
};

/// out of entry b against a direct softmax(q (k + rel_k)^T / sqrt(dh)) (v + rel_v) in double over the keys the
/// mask shows (every row, head and feature of the entry's length; no relative terms when rel.clip is 0; the
/// directional mask's visibility from `rows`); `lowest` (if given) lowered to the least score - row max seen.
void expectDirectSoftmax(lm::MaskKind mask, const char *name, int64_t b, const float *out, const float *q,
                         const float *k, const float *v, int64_t len, double *lowest = nullptr,
                         const Relative &rel = {}, const DirectionalRows *rows = nullptr) {
  const int64_t entry = kRows * kModel, dh = kModel / kHeads;
  auto sees = [&](lm::MaskKind mask, int64_t i, int64_t j) {
    return rows ? rows->visible(b, i, j) : ::sees(mask, i, j);
  };
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t i = 0; i < len; ++i) {
      std::vector<double> p(len, 0);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < len; ++j)
        if (sees(mask, i, j)) {
          double d = 0;
          for (int64_t e = 0; e < dh; ++e)
            d += double(q[b * entry + i * kModel + h * dh + e]) *
                 (double(k[b * entry + j * kModel + h * dh + e]) + (rel.clip ? rel.key[rel.row(i, j) * dh + e] : 0.0));
          p[j] = d / std::sqrt(double(dh));
          mx = std::max(mx, p[j]);
        }
      for (int64_t j = 0; j < len; ++j) {
        if (lowest && sees(mask, i, j))
          *lowest = std::min(*lowest, p[j] - mx);
        sum += sees(mask, i, j) ? (p[j] = std::exp(p[j] - mx)) : (p[j] = 0);
      }
      for (int64_t e = 0; e < dh; ++e) {
        double ref = 0;
        for (int64_t j = 0; j < len; ++j)
          ref += p[j] * (double(v[b * entry + j * kModel + h * dh + e]) +
                         (rel.clip ? rel.value[rel.row(i, j) * dh + e] : 0.0));
        ref = sum > 0 ? ref / sum : 0;
        ASSERT_NEAR(out[b * entry + i * kModel + h * dh + e], ref, 1e-4 * (1 + std::fabs(ref)))
            << name << " entry " << b << " head " << h << " row " << i << " feature " << e;
      }
    }
}

class AttentionStreamTest : public ::testing::Test {
protected:
  /// Which kernels a test calls: the plain forward and backward, or with relative positions at each of kClips
  /// the forward or the backward. Each set is a library of its own (compiling it is most of a test's time, and
  /// each test runs in its own process).
  enum Kernels { Plain, RelativeForward, RelativeBackward, Directional, Widths };
  static void build(Kernels kernels) {
    lmcc::test::KernelLibrary &into = libraries[kernels];
    if (into.handle)
      return;
    mlir::MLIRContext context;
    mlir::OwningOpRef<mlir::ModuleOp> module;
    // `tag` (if any) is appended to the names of the kernels' task functions: kernels lowered for another width
    // have task functions of their own (one module holds a model's tasks for one target; here both widths').
    auto absorb = [&](mlir::OwningOpRef<mlir::ModuleOp> kernels, const std::string &kernel, const std::string &as,
                      const std::string &tag = "") {
      ASSERT_TRUE(kernels) << as;
      kernels->lookupSymbol<mlir::func::FuncOp>(kernel).setSymName(as);
      if (!tag.empty()) {
        mlir::SymbolTable symbols(*kernels);
        for (auto fn : llvm::to_vector(kernels->getOps<mlir::func::FuncOp>()))
          if (!fn.isExternal() && fn.getSymName() != as)
            ASSERT_TRUE(mlir::succeeded(symbols.rename(fn, (fn.getSymName() + tag).str()))) << as;
      }
      if (!module) {
        module = std::move(kernels);
        return;
      }
      for (auto fn : llvm::make_early_inc_range(kernels->getOps<mlir::func::FuncOp>()))
        if (!module->lookupSymbol(fn.getSymName()))
          fn->moveBefore(module->getBody(), module->getBody()->end());
    };
    if (kernels == Widths) {
      for (const Width &w : kWidths) {
        const std::string suffix = w.suffix;
        const lmcc::codegen::KernelTarget target{w.bits, w.halfBlocks};
        for (auto [mask, name] : kMasks) {
          absorb(lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel, 0, 0, target),
                 "attention_kernel", std::string("attention_") + name + suffix, suffix);
          absorb(lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel, 0, 0, target),
                 "attention_grad_kernel", std::string("attention_grad_") + name + suffix, suffix);
        }
        const lm::MaskKind mask = lm::MaskKind::directional;
        absorb(lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel, kDirectionalClip, kRowWords, target),
               "attention_kernel", "attention_directional" + suffix, suffix);
        absorb(lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel, kDirectionalClip, kRowWords,
                                                       target),
               "attention_grad_kernel", "attention_grad_directional" + suffix, suffix);
      }
    }
    if (kernels == Directional) {
      const lm::MaskKind mask = lm::MaskKind::directional;
      for (int64_t clip : {int64_t(0), kDirectionalClip}) {
        const std::string suffix = clip ? "_rel" + std::to_string(clip) : "";
        absorb(lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel, clip, kRowWords),
               "attention_kernel", "attention_directional" + suffix);
        absorb(lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel, clip, kRowWords),
               "attention_grad_kernel", "attention_grad_directional" + suffix);
      }
    }
    for (auto [mask, name] : kMasks) {
      if (kernels == Directional || kernels == Widths)
        break;
      if (kernels == Plain) {
        absorb(lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel), "attention_kernel",
               std::string("attention_") + name);
        absorb(lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel), "attention_grad_kernel",
               std::string("attention_grad_") + name);
        continue;
      }
      for (int64_t clip : kClips) {
        const std::string suffix = std::to_string(clip) + "_" + name;
        if (kernels == RelativeForward)
          absorb(lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel, clip), "attention_kernel",
                 "attention_rel" + suffix);
        else
          absorb(lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel, clip),
                 "attention_grad_kernel", "attention_grad_rel" + suffix);
      }
    }
    const char *names[] = {"attention-stream", "attention-stream-relative", "attention-stream-relative-grad",
                           "attention-stream-directional", "attention-stream-widths"};
    ASSERT_NO_FATAL_FAILURE(into.build(*module, names[kernels]));
  }
  static void TearDownTestSuite() {
    for (auto &library : libraries)
      library.close();
  }
  template <typename Fn> Fn symbol(const std::string &name) { return libraries[kernels()].template symbol<Fn>(name); }
  virtual Kernels kernels() const { return Plain; }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(build(kernels()));
    // The premise: the batch's operands exceed the threads' L2 (the streaming path), one entry's do not.
    const int64_t entryBytes = 4 * kRows * kModel * int64_t(sizeof(float));
    ASSERT_LT(lm_rt_private_cache_bytes(), kBatch * entryBytes);
    ASSERT_GT(lm_rt_private_cache_bytes(), entryBytes);
    // Lengths 1..kRows, the longest first and last.
    for (int64_t b = 0; b < kBatch; ++b)
      lengths[b] = b == 0 || b == kBatch - 1 ? int32_t(kRows) : int32_t(1 + (b * 7) % kRows);
  }
  static inline lmcc::test::KernelLibrary libraries[5];
  int32_t lengths[kBatch];
};

/// The relative-position kernels' tests (libraries of their own).
class AttentionStreamRelativeTest : public AttentionStreamTest {
protected:
  Kernels kernels() const override { return RelativeForward; }
};
class AttentionStreamRelativeGradTest : public AttentionStreamTest {
protected:
  Kernels kernels() const override { return RelativeBackward; }
};
class AttentionStreamDirectionalTest : public AttentionStreamTest {
protected:
  Kernels kernels() const override { return Directional; }
};
class AttentionStreamWidthTest : public AttentionStreamTest {
protected:
  Kernels kernels() const override { return Widths; }
};

TEST_F(AttentionStreamTest, ForwardMatchesDirectSoftmaxAndCachedPathBitForBit) {
  const int64_t size = kBatch * kRows * kModel, entry = kRows * kModel, dh = kModel / kHeads;
  std::mt19937 rng(3);
  Buffer q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  for (auto [mask, name] : kMasks) {
    auto attention = symbol<AttentionFn>(std::string("attention_") + name);
    ASSERT_TRUE(attention) << name;
    Buffer out = buffer(size, nullptr), one = buffer(entry, nullptr), shifted = buffer(size, nullptr);
    MemRef<3> qm = view(q.get(), kBatch), km = view(k.get(), kBatch), vm = view(v.get(), kBatch),
              om = view(out.get(), kBatch), sm = view(shifted.get() + 4, kBatch); // 16 bytes off 64
    MemRef<1> lm = lengthsView(lengths, kBatch);
    attention(&qm, &km, &vm, &lm, &om);
    attention(&qm, &km, &vm, &lm, &sm);
    ASSERT_EQ(0, std::memcmp(out.get(), shifted.get() + 4, size * sizeof(float)))
        << name << ": a misaligned output argument changed the result";
    for (int64_t b = 0; b < kBatch; ++b) {
      // Entry b alone: its operands fit in cache (plain stores, no prefetch).
      MemRef<3> q1 = view(q.get() + b * entry, 1), k1 = view(k.get() + b * entry, 1),
                v1 = view(v.get() + b * entry, 1), o1 = view(one.get(), 1);
      MemRef<1> l1 = lengthsView(&lengths[b], 1);
      attention(&q1, &k1, &v1, &l1, &o1);
      ASSERT_EQ(0, std::memcmp(out.get() + b * entry, one.get(), entry * sizeof(float)))
          << name << " entry " << b << ": the streaming path differs from the cached one";
      // Against a direct softmax(q k^T / sqrt(dh)) v over the keys the mask shows (every row, head, feature).
      ASSERT_NO_FATAL_FAILURE(expectDirectSoftmax(mask, name, b, out.get(), q.get(), k.get(), v.get(), lengths[b]));
    }
  }
}

// Shaw relative positions in the vector form (the per-row table products, the probabilities summed per table row):
// every mask, two clips, against the direct softmax with the tables added to every key and value, and the streaming
// path bit-identical to the cached one.
TEST_F(AttentionStreamRelativeTest, RelativePositionsMatchDirectSoftmax) {
  const int64_t size = kBatch * kRows * kModel, entry = kRows * kModel, dh = kModel / kHeads;
  std::mt19937 rng(6);
  Buffer q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  for (int64_t clip : kClips) {
    const int64_t T = 2 * clip + 1;
    Buffer relK = buffer(T * dh, &rng), relV = buffer(T * dh, &rng);
    MemRef<2> rkm = {relK.get(), relK.get(), 0, {T, dh}, {dh, 1}}, rvm = {relV.get(), relV.get(), 0, {T, dh}, {dh, 1}};
    const Relative rel{clip, relK.get(), relV.get()};
    for (auto [mask, name] : kMasks) {
      auto attention = symbol<RelativeAttentionFn>("attention_rel" + std::to_string(clip) + "_" + name);
      ASSERT_TRUE(attention) << name;
      Buffer out = buffer(size, nullptr), one = buffer(entry, nullptr);
      MemRef<3> qm = view(q.get(), kBatch), km = view(k.get(), kBatch), vm = view(v.get(), kBatch),
                om = view(out.get(), kBatch);
      MemRef<1> lm = lengthsView(lengths, kBatch);
      attention(&qm, &km, &vm, &lm, &rkm, &rvm, &om);
      for (int64_t b = 0; b < kBatch; b += 3) {
        MemRef<3> q1 = view(q.get() + b * entry, 1), k1 = view(k.get() + b * entry, 1),
                  v1 = view(v.get() + b * entry, 1), o1 = view(one.get(), 1);
        MemRef<1> l1 = lengthsView(&lengths[b], 1);
        attention(&q1, &k1, &v1, &l1, &rkm, &rvm, &o1);
        ASSERT_EQ(0, std::memcmp(out.get() + b * entry, one.get(), entry * sizeof(float)))
            << name << " clip " << clip << " entry " << b << ": the streaming path differs from the cached one";
        ASSERT_NO_FATAL_FAILURE(expectDirectSoftmax(mask, name, b, out.get(), q.get(), k.get(), v.get(), lengths[b],
                                                    nullptr, rel))
            << "clip " << clip;
      }
    }
  }
}

// Sharp scores (q scaled up): the softmax's exponential over its whole range, including past -88 where it gives
// 0 (asserted: some score lies more than 88 below its row's max), still against the direct softmax.
TEST_F(AttentionStreamTest, SharpScoresMatchDirectSoftmax) {
  const int64_t size = kBatch * kRows * kModel;
  std::mt19937 rng(5);
  Buffer q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  for (float factor : {8.0f, 40.0f}) {
    Buffer sharp = buffer(size, nullptr);
    for (int64_t i = 0; i < size; ++i)
      sharp[i] = q[i] * factor;
    double lowest = 0; // the least score - row max the checks below see
    for (auto [mask, name] : kMasks) {
      auto attention = symbol<AttentionFn>(std::string("attention_") + name);
      ASSERT_TRUE(attention) << name;
      Buffer out = buffer(size, nullptr);
      MemRef<3> qm = view(sharp.get(), kBatch), km = view(k.get(), kBatch), vm = view(v.get(), kBatch),
                om = view(out.get(), kBatch);
      MemRef<1> lm = lengthsView(lengths, kBatch);
      attention(&qm, &km, &vm, &lm, &om);
      for (int64_t b = 0; b < kBatch; b += 7)
        ASSERT_NO_FATAL_FAILURE(
            expectDirectSoftmax(mask, name, b, out.get(), sharp.get(), k.get(), v.get(), lengths[b], &lowest))
            << "q scaled by " << factor;
    }
    if (factor == 40.0f)
      ASSERT_LT(lowest, -88.0) << "the scores do not reach the exponential's zero range";
  }
}

TEST_F(AttentionStreamTest, BackwardMatchesCachedPathBitForBit) {
  const int64_t size = kBatch * kRows * kModel, entry = kRows * kModel;
  std::mt19937 rng(4);
  Buffer dO = buffer(size, &rng), q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  // An empty entry too: its dq, dk, dv are all 0 (its items have no tiles: the item before's dk, dv are written
  // out at once, its own after it).
  lengths[5] = 0;
  // The outputs start as NaN (all entries) and -1 (one entry): an element either path leaves unwritten differs.
  auto filled = [](int64_t floats, float value) {
    Buffer p = buffer(floats, nullptr);
    std::fill(p.get(), p.get() + floats, value);
    return p;
  };
  for (auto [mask, name] : kMasks) {
    auto grad = symbol<AttentionGradFn>(std::string("attention_grad_") + name);
    ASSERT_TRUE(grad) << name;
    Buffer dq = filled(size, NAN), dk = filled(size, NAN), dv = filled(size, NAN);
    Buffer dq1 = filled(entry, -1), dk1 = filled(entry, -1), dv1 = filled(entry, -1);
    MemRef<3> dOm = view(dO.get(), kBatch), qm = view(q.get(), kBatch), km = view(k.get(), kBatch),
              vm = view(v.get(), kBatch), dqm = view(dq.get(), kBatch), dkm = view(dk.get(), kBatch),
              dvm = view(dv.get(), kBatch);
    MemRef<1> lm = lengthsView(lengths, kBatch);
    grad(&dOm, &qm, &km, &vm, &lm, &dqm, &dkm, &dvm);
    for (int64_t b = 0; b < kBatch; ++b) {
      MemRef<3> dO1 = view(dO.get() + b * entry, 1), q1 = view(q.get() + b * entry, 1),
                k1 = view(k.get() + b * entry, 1), v1 = view(v.get() + b * entry, 1), dqo = view(dq1.get(), 1),
                dko = view(dk1.get(), 1), dvo = view(dv1.get(), 1);
      MemRef<1> l1 = lengthsView(&lengths[b], 1);
      grad(&dO1, &q1, &k1, &v1, &l1, &dqo, &dko, &dvo);
      for (auto [all, single, what] : {std::tuple{dq.get(), dq1.get(), "dq"}, std::tuple{dk.get(), dk1.get(), "dk"},
                                       std::tuple{dv.get(), dv1.get(), "dv"}})
        ASSERT_EQ(0, std::memcmp(all + b * entry, single, entry * sizeof(float)))
            << name << " entry " << b << ": the streaming path's " << what << " differs from the cached one";
      if (lengths[b] == 0)
        for (const float *out : {dq1.get(), dk1.get(), dv1.get()})
          ASSERT_TRUE(std::all_of(out, out + entry, [](float x) { return x == 0; })) << name << " empty entry " << b;
    }
  }
}

// The relative-position backward (generated vector form): the same bits at 1 and 2 threads on the streaming batch
// (the items' table gradients are summed in item order), and against the runtime's C++ kernel
// (lm_rt_attention_grad, an independent implementation: per-pair table lookups, Eigen products; slow, so on the
// batch's first kCompared entries, an empty one among them): dq, dk, dv and both tables' gradients.
TEST_F(AttentionStreamRelativeGradTest, RelativeBackwardMatchesRuntimeKernel) {
  const int64_t size = kBatch * kRows * kModel, dh = kModel / kHeads;
  std::mt19937 rng(7);
  Buffer dO = buffer(size, &rng), q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  lengths[9] = 0;
  const float scale = 1.0f / std::sqrt(float(dh));
  for (int64_t clip : kClips) {
    const int64_t T = 2 * clip + 1;
    Buffer relK = buffer(T * dh, &rng), relV = buffer(T * dh, &rng);
    MemRef<2> rkm = {relK.get(), relK.get(), 0, {T, dh}, {dh, 1}}, rvm = {relV.get(), relV.get(), 0, {T, dh}, {dh, 1}};
    for (auto [mask, name] : kMasks) {
      const int32_t kind = mask == lm::MaskKind::causal       ? LMRT_MASK_CAUSAL
                           : mask == lm::MaskKind::anticausal ? LMRT_MASK_ANTICAUSAL
                           : mask == lm::MaskKind::diagonal   ? LMRT_MASK_DIAGONAL
                                                              : LMRT_MASK_NONE;
      auto grad = symbol<RelativeGradFn>("attention_grad_rel" + std::to_string(clip) + "_" + name);
      ASSERT_TRUE(grad) << name;
      // outputs[threads - 1]: dq, dk, dv, drel_k, drel_v of the generated kernel at 1 and 2 threads.
      std::vector<Buffer> outputs[2];
      for (int threads : {1, 2}) {
        lm_set_num_threads(threads);
        auto &o = outputs[threads - 1];
        for (int64_t floats : {size, size, size, T * dh, T * dh})
          o.push_back(buffer(floats, nullptr));
        MemRef<3> dOm = view(dO.get(), kBatch), qm = view(q.get(), kBatch), km = view(k.get(), kBatch),
                  vm = view(v.get(), kBatch), dqm = view(o[0].get(), kBatch), dkm = view(o[1].get(), kBatch),
                  dvm = view(o[2].get(), kBatch);
        MemRef<2> drk = {o[3].get(), o[3].get(), 0, {T, dh}, {dh, 1}},
                  drv = {o[4].get(), o[4].get(), 0, {T, dh}, {dh, 1}};
        MemRef<1> lm = lengthsView(lengths, kBatch);
        grad(&dOm, &qm, &km, &vm, &lm, &rkm, &rvm, &dqm, &dkm, &dvm, &drk, &drv);
      }
      lm_set_num_threads(1);
      for (int i = 0; i < 5; ++i)
        ASSERT_EQ(0, std::memcmp(outputs[0][i].get(), outputs[1][i].get(),
                                 (i < 3 ? size : T * dh) * sizeof(float)))
            << name << " clip " << clip << ": output " << i << " differs between 1 and 2 threads";
      // The first kCompared entries, both kernels.
      const int64_t part = kCompared * kRows * kModel;
      std::vector<Buffer> mine;
      for (int64_t floats : {part, part, part, T * dh, T * dh})
        mine.push_back(buffer(floats, nullptr));
      MemRef<3> dOm = view(dO.get(), kCompared), qm = view(q.get(), kCompared), km = view(k.get(), kCompared),
                vm = view(v.get(), kCompared), dqm = view(mine[0].get(), kCompared),
                dkm = view(mine[1].get(), kCompared), dvm = view(mine[2].get(), kCompared);
      MemRef<2> drk = {mine[3].get(), mine[3].get(), 0, {T, dh}, {dh, 1}},
                drv = {mine[4].get(), mine[4].get(), 0, {T, dh}, {dh, 1}};
      MemRef<1> lm = lengthsView(lengths, kCompared);
      grad(&dOm, &qm, &km, &vm, &lm, &rkm, &rvm, &dqm, &dkm, &dvm, &drk, &drv);
      for (int i = 0; i < 3; ++i) // an entry's dq, dk, dv do not depend on the others
        ASSERT_EQ(0, std::memcmp(mine[i].get(), outputs[0][i].get(), part * sizeof(float))) << name << " " << i;
      std::vector<float> dq(part), dk(part), dv(part), dRelK(T * dh), dRelV(T * dh);
      lm_rt_attention_grad(dO.get(), q.get(), k.get(), v.get(), lengths, nullptr, nullptr, 0, relK.get(), relV.get(),
                           clip, kCompared, kRows, kRows, kModel, kHeads, kind, scale, dq.data(), dk.data(),
                           dv.data(), dRelK.data(), dRelV.data());
      const std::vector<float> *want[] = {&dq, &dk, &dv, &dRelK, &dRelV};
      const char *what[] = {"dq", "dk", "dv", "drel_k", "drel_v"};
      for (int i = 0; i < 5; ++i) {
        double largest = 0;
        for (float x : *want[i])
          largest = std::max(largest, double(std::fabs(x)));
        for (size_t e = 0; e < want[i]->size(); ++e)
          ASSERT_NEAR(mine[i][e], (*want[i])[e], 1e-5 * (1 + largest))
              << name << " clip " << clip << " " << what[i] << " element " << e;
      }
    }
  }
}

} // namespace

namespace {

// The Diformer's directional mask in the vector forward (per-row key ranges, S rows' own and hidden keys tested
// lane by lane): every row of every entry against the direct softmax over the keys its direction and hidden set
// show, without and with relative positions, the streaming path bit-identical to the cached one.
TEST_F(AttentionStreamDirectionalTest, ForwardMatchesDirectSoftmax) {
  const int64_t size = kBatch * kRows * kModel, entry = kRows * kModel, dh = kModel / kHeads;
  std::mt19937 rng(8);
  Buffer q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  DirectionalRows rows(kBatch, rng);
  const int64_t T = 2 * kDirectionalClip + 1;
  Buffer relK = buffer(T * dh, &rng), relV = buffer(T * dh, &rng);
  MemRef<2> rkm = {relK.get(), relK.get(), 0, {T, dh}, {dh, 1}}, rvm = {relV.get(), relV.get(), 0, {T, dh}, {dh, 1}};
  for (int64_t clip : {int64_t(0), kDirectionalClip}) {
    auto plain = symbol<DirectionalFn>("attention_directional");
    auto relative = symbol<DirectionalRelativeFn>("attention_directional_rel" + std::to_string(kDirectionalClip));
    ASSERT_TRUE(plain && relative);
    auto attention = [&](MemRef<3> *q, MemRef<3> *k, MemRef<3> *v, MemRef<1> *l, MemRef<3> *r, MemRef<3> *o) {
      clip ? relative(q, k, v, l, r, &rkm, &rvm, o) : plain(q, k, v, l, r, o);
    };
    Buffer out = buffer(size, nullptr), one = buffer(entry, nullptr);
    MemRef<3> qm = view(q.get(), kBatch), km = view(k.get(), kBatch), vm = view(v.get(), kBatch),
              om = view(out.get(), kBatch), rm = rows.view(0, kBatch);
    MemRef<1> lm = lengthsView(lengths, kBatch);
    attention(&qm, &km, &vm, &lm, &rm, &om);
    const Relative rel{clip, relK.get(), relV.get()};
    for (int64_t b = 0; b < kBatch; ++b) {
      MemRef<3> q1 = view(q.get() + b * entry, 1), k1 = view(k.get() + b * entry, 1),
                v1 = view(v.get() + b * entry, 1), o1 = view(one.get(), 1), r1 = rows.view(b, 1);
      MemRef<1> l1 = lengthsView(&lengths[b], 1);
      attention(&q1, &k1, &v1, &l1, &r1, &o1);
      ASSERT_EQ(0, std::memcmp(out.get() + b * entry, one.get(), entry * sizeof(float)))
          << "clip " << clip << " entry " << b << ": the streaming path differs from the cached one";
      ASSERT_NO_FATAL_FAILURE(expectDirectSoftmax(lm::MaskKind::directional, "directional", b, out.get(), q.get(),
                                                  k.get(), v.get(), lengths[b], nullptr, rel, &rows))
          << "clip " << clip << " pattern " << b % kPatterns;
    }
    // A row's bits do not depend on the rows it shares a tile with (the kernel groups rows by direction): every
    // row of the first entries of each pattern alone (the entry's other rows skipped) gives the bits it gave
    // among them.
    for (int64_t b = 0; b < 2 * kPatterns; ++b)
      for (int64_t i = 0; i < lengths[b]; ++i) {
        std::vector<int32_t> alone(kRows * kRowWords, 0);
        for (int64_t r = 0; r < kRows; ++r)
          alone[r * kRowWords] = 3;
        std::copy_n(&rows.data[(b * kRows + i) * kRowWords], kRowWords, &alone[i * kRowWords]);
        float *ap = reinterpret_cast<float *>(alone.data());
        MemRef<3> q1 = view(q.get() + b * entry, 1), k1 = view(k.get() + b * entry, 1),
                  v1 = view(v.get() + b * entry, 1), o1 = view(one.get(), 1),
                  r1 = {ap, ap, 0, {1, kRows, kRowWords}, {kRows * kRowWords, kRowWords, 1}};
        MemRef<1> l1 = lengthsView(&lengths[b], 1);
        attention(&q1, &k1, &v1, &l1, &r1, &o1);
        ASSERT_EQ(0, std::memcmp(out.get() + b * entry + i * kModel, one.get() + i * kModel, kModel * sizeof(float)))
            << "clip " << clip << " entry " << b << " row " << i << ": alone it differs from among its entry's rows";
      }
  }
}

// The directional backward (vector form): the same bits at 1 and 2 threads, every output element written (the
// outputs start as NaN; an empty entry among them), and against the runtime's C++ kernel (lm_rt_attention_grad,
// an independent implementation) on the first kDirectionalCompared entries, every row pattern twice (one entry
// empty): dq, dk, dv and, with
// relative positions, both tables' gradients. Pattern 0's tiles start past the keys the tiles before them saw.
TEST_F(AttentionStreamDirectionalTest, BackwardMatchesRuntimeKernel) {
  const int64_t size = kBatch * kRows * kModel, dh = kModel / kHeads;
  std::mt19937 rng(9);
  Buffer dO = buffer(size, &rng), q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  DirectionalRows rows(kBatch, rng);
  lengths[kDirectionalCompared - 1] = 0;
  const float scale = 1.0f / std::sqrt(float(dh));
  const int64_t T = 2 * kDirectionalClip + 1;
  Buffer relK = buffer(T * dh, &rng), relV = buffer(T * dh, &rng);
  MemRef<2> rkm = {relK.get(), relK.get(), 0, {T, dh}, {dh, 1}}, rvm = {relV.get(), relV.get(), 0, {T, dh}, {dh, 1}};
  for (int64_t clip : {int64_t(0), kDirectionalClip}) {
    auto plain = symbol<DirectionalGradFn>("attention_grad_directional");
    auto relative =
        symbol<DirectionalRelativeGradFn>("attention_grad_directional_rel" + std::to_string(kDirectionalClip));
    ASSERT_TRUE(plain && relative);
    const int outputs = clip ? 5 : 3;
    // dq, dk, dv (and the tables' gradients) of `entries` entries, from NaN.
    auto run = [&](int64_t entries) {
      const int64_t part = entries * kRows * kModel;
      std::vector<Buffer> o;
      for (int i = 0; i < outputs; ++i) {
        const int64_t floats = i < 3 ? part : T * dh;
        o.push_back(buffer(floats, nullptr));
        std::fill(o.back().get(), o.back().get() + floats, NAN);
      }
      MemRef<3> dOm = view(dO.get(), entries), qm = view(q.get(), entries), km = view(k.get(), entries),
                vm = view(v.get(), entries), dqm = view(o[0].get(), entries), dkm = view(o[1].get(), entries),
                dvm = view(o[2].get(), entries), rm = rows.view(0, entries);
      MemRef<1> lm = lengthsView(lengths, entries);
      if (clip) {
        MemRef<2> drk = {o[3].get(), o[3].get(), 0, {T, dh}, {dh, 1}},
                  drv = {o[4].get(), o[4].get(), 0, {T, dh}, {dh, 1}};
        relative(&dOm, &qm, &km, &vm, &lm, &rm, &rkm, &rvm, &dqm, &dkm, &dvm, &drk, &drv);
      } else {
        plain(&dOm, &qm, &km, &vm, &lm, &rm, &dqm, &dkm, &dvm);
      }
      return o;
    };
    std::vector<Buffer> byThreads[2];
    for (int threads : {1, 2}) {
      lm_set_num_threads(threads);
      byThreads[threads - 1] = run(kBatch);
    }
    lm_set_num_threads(1);
    for (int i = 0; i < outputs; ++i) {
      const int64_t floats = i < 3 ? size : T * dh;
      ASSERT_EQ(0, std::memcmp(byThreads[0][i].get(), byThreads[1][i].get(), floats * sizeof(float)))
          << "clip " << clip << ": output " << i << " differs between 1 and 2 threads";
      ASSERT_TRUE(std::none_of(byThreads[0][i].get(), byThreads[0][i].get() + floats,
                               [](float x) { return std::isnan(x); }))
          << "clip " << clip << ": output " << i << " has elements the kernel did not write";
    }
    std::vector<Buffer> mine = run(kDirectionalCompared);
    const int64_t part = kDirectionalCompared * kRows * kModel;
    std::vector<float> want[5] = {std::vector<float>(part), std::vector<float>(part), std::vector<float>(part),
                                  std::vector<float>(T * dh), std::vector<float>(T * dh)};
    lm_rt_attention_grad(dO.get(), q.get(), k.get(), v.get(), lengths, nullptr, rows.data.data(), kRowWords,
                         clip ? relK.get() : nullptr, clip ? relV.get() : nullptr, clip, kDirectionalCompared, kRows,
                         kRows, kModel, kHeads, LMRT_MASK_DIRECTIONAL, scale, want[0].data(), want[1].data(),
                         want[2].data(), clip ? want[3].data() : nullptr, clip ? want[4].data() : nullptr);
    const char *what[] = {"dq", "dk", "dv", "drel_k", "drel_v"};
    for (int i = 0; i < outputs; ++i) {
      double largest = 0;
      for (float x : want[i])
        largest = std::max(largest, double(std::fabs(x)));
      for (size_t e = 0; e < want[i].size(); ++e)
        ASSERT_NEAR(mine[i][e], want[i][e], 1e-5 * (1 + largest))
            << "clip " << clip << " " << what[i] << " element " << e << " (entry " << e / (kRows * kModel)
            << ", pattern " << e / (kRows * kModel) % kPatterns << ")";
    }
  }
}

} // namespace

namespace {

// The register tiles of 256- and 512-bit targets (AttentionVector.h's Geometry: score accumulators of 4 or 8 rows,
// p.v and dK / dV tiles of 1 or 4 feature vectors; at 512 bits the half blocks of Geometry::halfBlocks or not)
// give the same bits, forward and backward, for every mask kind and for the directional mask with relative
// positions: the tiles group accumulators, never a sum's order. Every variant runs on this host (vector<16xf32> is two ymm or one zmm), on the streaming batch with an empty
// entry.
TEST_F(AttentionStreamWidthTest, RegisterTilesOfEveryWidthGiveTheSameBits) {
  const int64_t size = kBatch * kRows * kModel, dh = kModel / kHeads, T = 2 * kDirectionalClip + 1;
  std::mt19937 rng(10);
  Buffer dO = buffer(size, &rng), q = buffer(size, &rng), k = buffer(size, &rng), v = buffer(size, &rng);
  DirectionalRows rows(kBatch, rng);
  Buffer relK = buffer(T * dh, &rng), relV = buffer(T * dh, &rng);
  MemRef<2> rkm = {relK.get(), relK.get(), 0, {T, dh}, {dh, 1}}, rvm = {relV.get(), relV.get(), 0, {T, dh}, {dh, 1}};
  lengths[5] = 0;
  // out, dq, dk, dv (and drel_k, drel_v: directional) of the kernels `name` with the tiles `w`.
  auto outputs = [&](const std::string &name, const Width &w) {
    const bool directional = name == "directional";
    const std::string suffix = "_" + name + w.suffix;
    std::vector<Buffer> o;
    for (int i = 0; i < (directional ? 6 : 4); ++i) {
      const int64_t floats = i < 4 ? size : T * dh;
      o.push_back(buffer(floats, nullptr));
      std::fill(o.back().get(), o.back().get() + floats, NAN);
    }
    MemRef<3> dOm = view(dO.get(), kBatch), qm = view(q.get(), kBatch), km = view(k.get(), kBatch),
              vm = view(v.get(), kBatch), om = view(o[0].get(), kBatch), dqm = view(o[1].get(), kBatch),
              dkm = view(o[2].get(), kBatch), dvm = view(o[3].get(), kBatch), rm = rows.view(0, kBatch);
    MemRef<1> lm = lengthsView(lengths, kBatch);
    if (directional) {
      auto forward = symbol<DirectionalRelativeFn>("attention" + suffix);
      auto grad = symbol<DirectionalRelativeGradFn>("attention_grad" + suffix);
      EXPECT_TRUE(forward && grad) << suffix;
      MemRef<2> drk = {o[4].get(), o[4].get(), 0, {T, dh}, {dh, 1}},
                drv = {o[5].get(), o[5].get(), 0, {T, dh}, {dh, 1}};
      forward(&qm, &km, &vm, &lm, &rm, &rkm, &rvm, &om);
      grad(&dOm, &qm, &km, &vm, &lm, &rm, &rkm, &rvm, &dqm, &dkm, &dvm, &drk, &drv);
    } else {
      auto forward = symbol<AttentionFn>("attention" + suffix);
      auto grad = symbol<AttentionGradFn>("attention_grad" + suffix);
      EXPECT_TRUE(forward && grad) << suffix;
      forward(&qm, &km, &vm, &lm, &om);
      grad(&dOm, &qm, &km, &vm, &lm, &dqm, &dkm, &dvm);
    }
    return o;
  };
  std::vector<std::string> names{"directional"};
  for (auto [mask, name] : kMasks)
    names.push_back(name);
  const char *what[] = {"out", "dq", "dk", "dv", "drel_k", "drel_v"};
  for (const std::string &name : names) {
    std::vector<Buffer> narrow = outputs(name, kWidths[0]);
    ASSERT_FALSE(HasFailure());
    for (size_t i = 0; i < narrow.size(); ++i)
      ASSERT_TRUE(std::none_of(narrow[i].get(), narrow[i].get() + (i < 4 ? size : T * dh),
                               [](float x) { return std::isnan(x); }))
          << name << " " << what[i] << ": elements left unwritten (or NaN)";
    for (const Width &w : llvm::ArrayRef<Width>(kWidths).drop_front()) {
      std::vector<Buffer> wide = outputs(name, w);
      ASSERT_FALSE(HasFailure());
      for (size_t i = 0; i < narrow.size(); ++i)
        ASSERT_EQ(0, std::memcmp(narrow[i].get(), wide[i].get(), (i < 4 ? size : T * dh) * sizeof(float)))
            << name << " " << what[i] << ": the 256-bit tiles' bits differ from the " << w.suffix << " tiles'";
    }
  }
}

} // namespace
