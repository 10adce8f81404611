// The vector attention kernels (codegen/LmToLoops/Attention.cpp, AttentionGrad.cpp) on operands larger than the
// threads' L2, where they prefetch the next item (the backward also the next entry) and store their outputs (dq, dk
// and dv in the backward) nontemporally: every mask kind, odd lengths, against a direct softmax(q k^T) v, and
// bit-identical to the same entries computed one at a time (operands in cache: no prefetch, plain stores; the
// backward with an empty entry and every output element written). An output argument that is not 64-byte aligned
// takes plain stores and gives the same bits. Sharp scores take the softmax's exponential over its whole range.
#include "codegen/LmToLoops/Lowering.h"
#include "runtime/lib/lmrt.h"
#include "tests/unit/KernelLibrary.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

namespace {

namespace lm = lmcc::lm;

template <int R> struct MemRef {
  float *allocated, *aligned;
  int64_t offset, sizes[R], strides[R];
};
using AttentionFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *);
using GradFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *, MemRef<3> *,
                        MemRef<3> *);

constexpr int64_t kHeads = 8, kModel = 512, kRows = 37, kBatch = 64;
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

/// out of entry b against a direct softmax(q k^T / sqrt(dh)) v in double over the keys the mask shows (every row,
/// head and feature of the entry's length); `lowest` (if given) lowered to the least score - row max seen.
void expectDirectSoftmax(lm::MaskKind mask, const char *name, int64_t b, const float *out, const float *q,
                         const float *k, const float *v, int64_t len, double *lowest = nullptr) {
  const int64_t entry = kRows * kModel, dh = kModel / kHeads;
  for (int64_t h = 0; h < kHeads; ++h)
    for (int64_t i = 0; i < len; ++i) {
      std::vector<double> p(len, 0);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < len; ++j)
        if (sees(mask, i, j)) {
          double d = 0;
          for (int64_t e = 0; e < dh; ++e)
            d += double(q[b * entry + i * kModel + h * dh + e]) * k[b * entry + j * kModel + h * dh + e];
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
          ref += p[j] * v[b * entry + j * kModel + h * dh + e];
        ref = sum > 0 ? ref / sum : 0;
        ASSERT_NEAR(out[b * entry + i * kModel + h * dh + e], ref, 1e-4 * (1 + std::fabs(ref)))
            << name << " entry " << b << " head " << h << " row " << i << " feature " << e;
      }
    }
}

class AttentionStreamTest : public ::testing::Test {
protected:
  static void build() {
    if (library.handle)
      return;
    mlir::MLIRContext context;
    mlir::OwningOpRef<mlir::ModuleOp> module;
    // Every mask's kernels and their tasks in one module (the runtime functions declared once).
    auto absorb = [&](mlir::OwningOpRef<mlir::ModuleOp> kernels) {
      if (!module) {
        module = std::move(kernels);
        return;
      }
      for (auto fn : llvm::make_early_inc_range(kernels->getOps<mlir::func::FuncOp>()))
        if (!module->lookupSymbol(fn.getSymName()))
          fn->moveBefore(module->getBody(), module->getBody()->end());
    };
    for (auto [mask, name] : kMasks) {
      auto forward = lmcc::codegen::buildAttentionModule(context, mask, kHeads, kModel);
      auto grad = lmcc::codegen::buildAttentionGradModule(context, mask, kHeads, kModel);
      ASSERT_TRUE(forward && grad) << name;
      forward->lookupSymbol<mlir::func::FuncOp>("attention_kernel").setSymName(std::string("attention_") + name);
      grad->lookupSymbol<mlir::func::FuncOp>("attention_grad_kernel").setSymName(std::string("attention_grad_") + name);
      absorb(std::move(forward));
      absorb(std::move(grad));
    }
    ASSERT_NO_FATAL_FAILURE(library.build(*module, "attention-stream"));
  }
  static void TearDownTestSuite() { library.close(); }
  template <typename Fn> static Fn symbol(const std::string &name) { return library.symbol<Fn>(name); }
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(build());
    // The premise: the batch's operands exceed the threads' L2 (the streaming path), one entry's do not.
    const int64_t entryBytes = 4 * kRows * kModel * int64_t(sizeof(float));
    ASSERT_LT(lm_rt_private_cache_bytes(), kBatch * entryBytes);
    ASSERT_GT(lm_rt_private_cache_bytes(), entryBytes);
    // Lengths 1..kRows, the longest first and last.
    for (int64_t b = 0; b < kBatch; ++b)
      lengths[b] = b == 0 || b == kBatch - 1 ? int32_t(kRows) : int32_t(1 + (b * 7) % kRows);
  }
  static inline lmcc::test::KernelLibrary library;
  int32_t lengths[kBatch];
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
    auto grad = symbol<GradFn>(std::string("attention_grad_") + name);
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

} // namespace
