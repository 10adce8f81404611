// The generated GEMM (codegen/LmToLoops/Gemm.cpp) against a naive loop and the runtime's Eigen GEMM (--gemm=eigen,
// lm_rt_sgemm_nt): odd shapes, N not a multiple of the 64-wide panel, every M from 1 to 70 (and row counts that cut
// into several row blocks), weights packed once, in both register tiles (bit-identical to each other).
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Gemm.h"
#include "codegen/LmToLoops/KernelAbi.h"
#include "runtime/lib/lmrt.h"
#include "tests/unit/Bf16.h"
#include "tests/unit/KernelLibrary.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

namespace {

using namespace lmcc::codegen::abi;

// (N, K): the panel edge cases and the shapes of the tiny test models. Odd shapes, then every (N, K) of the bundled
// models (T-TA/biLM/uniLM paper size: projections, stacked K/V, FFN, vocabulary; BERT-base; the Diformer's stacked
// projections and 32000-word vocabulary, the n-gram heads' 1024-wide projection). Shapes packing to more than 1 MiB
// take the prefetching kernel; fp32 depths over 768 run in chunks of 128 (901: seven and a partial one; 3072 at
// M >= 47: two blocks of rows), depths 513-768 unchunked in 256 KB blocks of rows (601, 768).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 5},       {16, 7},      {63, 33},    {64, 8},     {65, 19},    {67, 30},     {130, 17},   {30, 46},
    {120, 30},    {4133, 71},   {100, 601},  {100, 901},  {512, 512},  {1536, 512},  {3072, 512}, {2048, 512},
    {512, 2048},  {30522, 512}, {768, 768},  {2304, 768}, {3072, 768}, {768, 3072},  {30522, 768}, {1024, 512},
    {6144, 512},  {32000, 512}};

// Every register tile runs on any x86-64 with AVX2 (512-bit vectors are split in two there): the AVX-512 and AVX2
// tiles and AVX-512's tile of deep weights on an 8-way L1 (5 x 64, GemmTile::forDepth).
const std::vector<lmcc::codegen::GemmTile> kTiles = {
    lmcc::codegen::GemmTile::forVectorBits(512), lmcc::codegen::GemmTile::forVectorBits(256),
    lmcc::codegen::GemmTile::forDepth(lmcc::codegen::GemmTile::forVectorBits(512), 1024, 8)};
std::string tileSuffix(lmcc::codegen::GemmTile t) { return t.name(); }

// The training GEMM's static depths (getOrCreateTrainGemm): unchunked without and with the prefetch (512 twice: merged
// into one body that prefetches), and chunked. Built for an 8-way L1 (kL1Ways): depth 2048 puts A's rows 8 KB apart,
// so the 12-row tile's body reads a copy of A (as the run-time depth body does) and the 6- and 5-row ones read A.
const std::vector<lmcc::codegen::TrainGemmDepth> kTrainDepths = {{64, false}, {512, false}, {512, true}, {2048, true}};
constexpr int64_t kL1Ways = 8;

class GemmTest : public ::testing::Test {
protected:
  // Built from the test body, not SetUpTestSuite: a failure there would show as a skipped test.
  static void build() {
    if (library.handle)
      return;
    mlir::MLIRContext context;
    auto module = lmcc::codegen::buildGemmModule(context, kShapes, kTiles, kTrainDepths, kL1Ways);
    // TrainGemmIsTheOrderedFmaChain runs both static depth 2048 bodies: copying A (12 rows) and not (6 rows).
    ASSERT_TRUE(module->lookupSymbol("lm_train_gemm_" + kTiles[0].name() + "_k2048pc")) << kTiles[0].name();
    ASSERT_TRUE(module->lookupSymbol("lm_train_gemm_" + kTiles[1].name() + "_k2048p")) << kTiles[1].name();
    ASSERT_NO_FATAL_FAILURE(library.build(*module, "gemm"));
  }
  static void TearDownTestSuite() { library.close(); }
  template <typename Fn> static Fn symbol(const std::string &name) { return library.symbol<Fn>(name); }
  static inline lmcc::test::KernelLibrary library;
};

TEST_F(GemmTest, MatchesNaiveProductForEveryRowCount) {
  ASSERT_NO_FATAL_FAILURE(build());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [n, k] : kShapes) {
    std::string shape = std::to_string(n) + "x" + std::to_string(k);
    std::vector<float> w(n * k);
    for (float &x : w)
      x = u(rng);
    // Each tile packs W in its own slice order (Gemm.h).
    int64_t rows = lmcc::codegen::packedRows(n, k);
    std::vector<std::vector<float>> packed;
    std::vector<GemmFn> gemms;
    for (auto tile : kTiles) {
      auto pack = symbol<PackFn>("lm_bench_pack_" + shape + "_" + tileSuffix(tile));
      auto gemm = symbol<GemmFn>("lm_bench_gemm_" + shape + "_" + tileSuffix(tile));
      ASSERT_TRUE(pack && gemm) << shape << " " << tileSuffix(tile);
      packed.emplace_back(rows * lmcc::codegen::kPanel, 7.0f);
      MemRef<2> wm = view(w.data(), n, k), pm = view(packed.back().data(), rows, lmcc::codegen::kPanel);
      pack(&wm, &pm);
      gemms.push_back(gemm);
    }
    bool large = n * k > 100000;
    std::vector<int64_t> rowCounts;
    for (int64_t m = 1; m <= 70; m += large ? 23 : 1)
      rowCounts.push_back(m);
    // A weight streamed from beyond L2 at depth 512: up to 504 rows in one or two equal blocks of up to 252 (253: 132 +
    // 121), more in 60-row ones (505: 8 x 60 + 25).
    if (n == 1536 && k == 512)
      rowCounts.insert(rowCounts.end(), {253, 505});
    for (int64_t m : rowCounts) {
      std::vector<float> a(m * k);
      for (float &x : a)
        x = u(rng);
      const float sentinel = 1234.5f;
      MemRef<2> am = view(a.data(), m, k);
      std::vector<std::vector<float>> c;
      for (size_t t = 0; t < kTiles.size(); ++t) {
        c.emplace_back(m * n + 3, sentinel); // 3 floats past the end must stay untouched
        MemRef<2> pm = view(packed[t].data(), rows, lmcc::codegen::kPanel), cm = view(c[t].data(), m, n);
        gemms[t](&am, &pm, &cm);
        for (int x = 0; x < 3; ++x)
          ASSERT_EQ(c[t][m * n + x], sentinel)
              << shape << " " << tileSuffix(kTiles[t]) << " m=" << m << ": written past C";
      }
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0;
          for (int64_t kk = 0; kk < k; ++kk)
            ref += double(a[i * k + kk]) * w[j * k + kk];
          ASSERT_NEAR(c[0][i * n + j], ref, 1e-4 * (1 + std::fabs(ref)))
              << shape << " m=" << m << " [" << i << "," << j << "]";
        }
      // The runtime's Eigen GEMM (another summation order): the same products within float rounding.
      std::vector<float> eigen(m * n);
      lm_rt_sgemm_nt(m, n, k, a.data(), k, w.data(), k, nullptr, eigen.data(), n);
      for (int64_t x = 0; x < m * n; ++x)
        ASSERT_NEAR(c[0][x], eigen[x], 1e-4 * (1 + std::fabs(eigen[x])))
            << shape << " m=" << m << " [" << x / n << "," << x % n << "] against Eigen";
      // Every tile computes the same ordered FMA chain per element: bit-identical results.
      for (size_t t = 1; t < kTiles.size(); ++t)
        ASSERT_EQ(0, std::memcmp(c[0].data(), c[t].data(), c[0].size() * sizeof(float)))
            << shape << " " << tileSuffix(kTiles[t]) << " m=" << m;
    }
  }
}

// The training GEMM (Gemm.h getOrCreateTrainGemm, lmrt.h lm_rt_gemm_fn): depth known only at run time, strided A and
// C, a panel range, accumulation into C. Packed here from the documented layout (not the runtime's packer); every
// element must be the ordered FMA chain over k (fmaf here), added to C's old value when accumulating: bit-identical.
// Both the run-time depth body alone (lm_train_gemm_any_) and the GEMM specialized for kTrainDepths, whose cases with
// K == lda == 64, 512 or 2048 run a static-depth body (512, given with and without the prefetch: one body, with it).
TEST_F(GemmTest, TrainGemmIsTheOrderedFmaChain) {
  ASSERT_NO_FATAL_FAILURE(build());
  using TrainGemmFn = void (*)(const float *, int64_t, int64_t, int64_t, const float *, float *, int64_t, int64_t,
                               int64_t, int64_t, int64_t);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  struct Case {
    int64_t m, k, n, lda, ldc, pBegin, pEnd;
    bool accumulate;
  };
  const std::vector<Case> cases = {{1, 1, 1, 1, 1, 0, 1, false},       {7, 5, 3, 9, 4, 0, 1, true},
                                   {23, 0, 70, 1, 70, 0, 2, false},     {23, 0, 70, 1, 70, 0, 2, true},
                                   {70, 33, 130, 40, 131, 0, 3, false}, {70, 33, 130, 33, 130, 1, 3, true},
                                   {129, 517, 64, 600, 64, 0, 1, true}, {5, 2048, 200, 2048, 256, 2, 4, false},
                                   {300, 64, 511, 64, 512, 0, 8, false},
                                   // Run-time depths up to 512 are one chunk; A over 1 MB then comes in 128 KB blocks.
                                   {40, 512, 64, 512, 64, 0, 1, false}, {700, 500, 100, 503, 101, 0, 2, true},
                                   {61, 513, 70, 513, 70, 0, 2, true},
                                   // Static depths: blocks of A, panels and accumulation; a depth equal to one but
                                   // with another lda (the run-time body).
                                   {700, 512, 130, 512, 131, 1, 3, true}, {25, 64, 200, 64, 200, 0, 4, true},
                                   {37, 2048, 70, 2048, 70, 0, 2, true}, {30, 512, 64, 520, 64, 0, 1, false}};
  std::vector<std::pair<lmcc::codegen::GemmTile, std::string>> gemms;
  for (auto tile : kTiles)
    for (std::string prefix : {"lm_train_gemm_", "lm_train_gemm_any_"})
      gemms.push_back({tile, prefix});
  for (const auto &[tile, prefix] : gemms) {
    auto gemm = reinterpret_cast<TrainGemmFn>(::dlsym(library.handle, (prefix + tile.name()).c_str()));
    ASSERT_NE(gemm, nullptr) << prefix << tile.name();
    const int64_t c = tile.cols();
    for (const Case &t : cases) {
      std::vector<float> a(std::max<int64_t>(1, t.m * t.lda)), b(std::max<int64_t>(1, t.k * t.n));
      for (float &x : a)
        x = u(rng);
      for (float &x : b)
        x = u(rng);
      const int64_t panels = (t.n + 63) / 64;
      std::vector<float> packed(std::max<int64_t>(1, panels * t.k * 64), 0.0f);
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t j = 0; j < 64 && p * 64 + j < t.n; ++j)
          for (int64_t kk = 0; kk < t.k; ++kk)
            packed[p * t.k * 64 + (j / c) * t.k * c + kk * c + j % c] = b[kk * t.n + p * 64 + j];
      std::vector<float> cOld(t.m * t.ldc + 3);
      for (float &x : cOld)
        x = u(rng);
      std::vector<float> out = cOld;
      gemm(a.data(), t.lda, t.m, t.k, packed.data(), out.data(), t.ldc, t.n, t.pBegin, t.pEnd, t.accumulate);
      const std::string where = prefix + tile.name() + " m=" + std::to_string(t.m) + " k=" + std::to_string(t.k) +
                                " n=" + std::to_string(t.n) + (t.accumulate ? " +=" : "");
      for (int64_t i = 0; i < t.m; ++i)
        for (int64_t j = 0; j < t.ldc; ++j) {
          const bool inside = j < t.n && j / 64 >= t.pBegin && j / 64 < t.pEnd;
          float expect = cOld[i * t.ldc + j];
          if (inside) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < t.k; ++kk)
              acc = std::fma(a[i * t.lda + kk], b[kk * t.n + j], acc);
            expect = t.accumulate ? acc + expect : acc;
          }
          ASSERT_EQ(out[i * t.ldc + j], expect) << where << " [" << i << "," << j << "]"
                                                << (inside ? "" : " (outside the panels: must stay)");
        }
      for (int x = 0; x < 3; ++x)
        ASSERT_EQ(out[t.m * t.ldc + x], cOld[t.m * t.ldc + x]) << where << ": written past C";
    }
  }
}

// --weights-dtype bf16 (Gemm.h): W packed as bf16 pairs. On weights that are bf16 numbers already the packing is
// lossless: the widening kernels (any x86-64) run the fp32 kernel's FMA chain and give its result bit for bit; the
// AVX512_BF16 dot-product kernel (when this host has it) also rounds A to bf16, and equals the exact product of the
// rounded operands up to f32 accumulation; so does the AMX tile kernel (when this host has AMX-BF16). Odd K (the last
// pair half padding, and for AMX a depth that is not a multiple of 32), N past a panel, every M to 23, and for AMX also
// M past one 32-row tile and past one block of rows (1 MB of rounded rows, at most 512). Depth 2048: the dot kernel's
// rounded rows of A at a padded stride (1024 pairs and a line).
TEST(GemmBf16, MatchesTheRoundedProduct) {
  using lmcc::codegen::GemmTile;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 5},   {16, 7},    {63, 33},   {65, 19},
                                                           {67, 30}, {130, 17},  {40, 1101}, {512, 512}, {768, 3072},
                                                           {70, 2048}};
  std::vector<GemmTile> tiles = {GemmTile::forVectorBits(512), GemmTile::forTarget(512, true, false),
                                 GemmTile::forVectorBits(256), GemmTile::forTarget(256, true, false)};
  const bool dot = lmcc::codegen::targetHasBf16Dot(""), amx = lmcc::codegen::targetHasAmx("");
  if (dot)
    tiles.push_back(GemmTile::forTarget(512, true, true));
  if (amx) {
    ASSERT_EQ(lm_rt_request_amx(), LM_OK) << lm_rt_last_error();
    tiles.push_back(GemmTile::forTarget(512, true, true, true));
  }
  if (!amx)
    std::printf("GemmBf16: this host has no AMX-BF16: the AMX kernel is not run here\n");
  mlir::MLIRContext context;
  auto module = lmcc::codegen::buildGemmModule(context, shapes, tiles);
  lmcc::test::KernelLibrary library;
  ASSERT_NO_FATAL_FAILURE(library.build(*module, "gemm-bf16"));
  auto symbol = [&](const std::string &name) { return ::dlsym(library.handle, ("_mlir_ciface_" + name).c_str()); };
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [n, k] : shapes) {
    std::string shape = std::to_string(n) + "x" + std::to_string(k);
    std::vector<float> w(n * k);
    for (float &x : w)
      x = lmcc::test::roundToBf16(u(rng));
    std::vector<int64_t> ms;
    for (int64_t m = 1; m <= 23; m += n * k > 100000 ? 11 : 1)
      ms.push_back(m);
    for (int64_t m : {33, 70, 300, 600})
      if (m < 300 || n * k <= (m == 300 ? 100000 : 5000))
        ms.push_back(m); // past a 32-row AMX tile; 600: past the AMX kernel's 512-row blocks at small depths
    for (int64_t m : ms) {
      std::vector<float> a(m * k);
      for (float &x : a)
        x = u(rng);
      std::vector<float> bias(n);
      for (float &x : bias)
        x = u(rng);
      std::vector<std::vector<float>> c, cb; // without and with the bias
      for (const GemmTile &tile : tiles) {
        auto pack = reinterpret_cast<PackFn>(symbol("lm_bench_pack_" + shape + "_" + tile.name()));
        auto gemm = reinterpret_cast<GemmFn>(symbol("lm_bench_gemm_" + shape + "_" + tile.name()));
        auto gemmBias = reinterpret_cast<BiasGemmFn>(symbol("lm_bench_gemm_bias_" + shape + "_" + tile.name()));
        ASSERT_TRUE(pack && gemm && (gemmBias || !tile.bf16())) << shape << " " << tile.name();
        int64_t rows = lmcc::codegen::packedRows(n, k, tile.bf16());
        std::vector<float> packed(rows * lmcc::codegen::kPanel, 7.0f);
        MemRef<2> wm = view(w.data(), n, k), pm = view(packed.data(), rows, lmcc::codegen::kPanel);
        pack(&wm, &pm);
        c.emplace_back(m * n, 0.0f), cb.emplace_back(m * n, 0.0f);
        MemRef<2> am = view(a.data(), m, k), cm = view(c.back().data(), m, n), cbm = view(cb.back().data(), m, n);
        MemRef<1> bm = {bias.data(), bias.data(), 0, {n}, {1}};
        gemm(&am, &pm, &cm);
        if (gemmBias)
          gemmBias(&am, &pm, &bm, &cbm);
      }
      // tiles: 0 = fp32 512, 1 = bf16 widen 512, 2 = fp32 256, 3 = bf16 widen 256, 4 = bf16 dot, then AMX.
      ASSERT_EQ(0, std::memcmp(c[0].data(), c[1].data(), c[0].size() * sizeof(float))) << shape << " m=" << m;
      ASSERT_EQ(0, std::memcmp(c[2].data(), c[3].data(), c[0].size() * sizeof(float))) << shape << " m=" << m;
      for (size_t t : {1, 3}) // the widening kernels (and the fp32 ones: the same epilogue) add it to the finished sum
        for (int64_t i = 0; i < m * n; ++i)
          ASSERT_EQ(cb[t][i], c[t][i] + bias[i % n]) << tiles[t].name() << " " << shape << " m=" << m << " bias";
      for (size_t t = 4; t < tiles.size(); ++t) // the dot kernel adds it at the end too, AMX starts from it
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, size = 0;
            for (int64_t kk = 0; kk < k; ++kk) {
              double term = double(lmcc::test::roundToBf16(a[i * k + kk])) * w[j * k + kk];
              ref += term, size += std::fabs(term);
            }
            const std::string where = tiles[t].name() + " " + shape + " m=" + std::to_string(m) + " [" +
                                      std::to_string(i) + "," + std::to_string(j) + "]";
            ASSERT_NEAR(c[t][i * n + j], ref, 1e-5 * (1 + size)) << where;
            ASSERT_NEAR(cb[t][i * n + j], ref + bias[j], 1e-5 * (1 + size + std::fabs(bias[j]))) << where << " bias";
          }
    }
  }
}

// The dot kernel rounds its rows of A to bf16 pairs (Gemm.cpp: 16 pairs a vector step, the pairs past the last
// multiple of 32 floats one by one) exactly as the weights are rounded: through an identity weight each C element is
// one product, round(A) x 1, so C = round(A) bit for bit. Ties to even in both directions and carries into the next
// binade among random normal numbers; no infinities or NaNs (times the zero weights they would reach every column)
// and no denormals (vdpbf16ps reads them as zero).
TEST(GemmBf16, DotKernelRoundsActivationsExactly) {
  if (!lmcc::codegen::targetHasBf16Dot(""))
    GTEST_SKIP() << "this host has no AVX512_BF16 to run the dot-product kernel";
  const lmcc::codegen::GemmTile tile = lmcc::codegen::GemmTile::forTarget(512, true, true);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 64}, {70, 70}, {31, 31}}; // 70: 3 pairs alone
  mlir::MLIRContext context;
  auto module = lmcc::codegen::buildGemmModule(context, shapes, {tile});
  lmcc::test::KernelLibrary library;
  ASSERT_NO_FATAL_FAILURE(library.build(*module, "gemm-bf16-round"));
  auto symbol = [&](const std::string &name) { return ::dlsym(library.handle, ("_mlir_ciface_" + name).c_str()); };
  const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3fff8000u, 0x3f80ffffu, 0x3f807fffu,
                           0x7f7f7fffu, 0x00808000u, 0x00818000u};
  std::mt19937 rng(5);
  for (auto [n, k] : shapes) {
    const std::string shape = std::to_string(n) + "x" + std::to_string(k);
    auto pack = reinterpret_cast<PackFn>(symbol("lm_bench_pack_" + shape + "_" + tile.name()));
    auto gemm = reinterpret_cast<GemmFn>(symbol("lm_bench_gemm_" + shape + "_" + tile.name()));
    ASSERT_TRUE(pack && gemm) << shape;
    std::vector<float> w(n * k, 0.0f);
    for (int64_t j = 0; j < n; ++j)
      w[j * k + j] = 1.0f;
    std::vector<float> packed(lmcc::codegen::packedRows(n, k, true) * lmcc::codegen::kPanel, 7.0f);
    MemRef<2> wm = view(w.data(), n, k), pm = view(packed.data(), packed.size() / lmcc::codegen::kPanel,
                                                   lmcc::codegen::kPanel);
    pack(&wm, &pm);
    const int64_t m = 13;
    std::vector<float> a(m * k), c(m * n, -1.0f);
    for (size_t i = 0; i < a.size(); ++i) {
      uint32_t bits = i % 3 == 0 ? ties[(i / 3) % std::size(ties)] : uint32_t(rng());
      while (((bits >> 23) & 0xffu) == 0 || ((bits >> 23) & 0xffu) == 0xffu || (bits & 0x7fffffffu) >= 0x7f7f8000u)
        bits = uint32_t(rng()); // normal numbers that round to a finite bf16
      std::memcpy(&a[i], &bits, 4);
    }
    MemRef<2> am = view(a.data(), m, k), cm = view(c.data(), m, n);
    gemm(&am, &pm, &cm);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float expect = lmcc::test::roundToBf16(a[i * k + j]);
        ASSERT_EQ(0, std::memcmp(&c[i * n + j], &expect, 4))
            << shape << " [" << i << "," << j << "]: " << c[i * n + j] << " for " << a[i * k + j] << " (bf16 "
            << expect << ")";
      }
  }
}

// The packer (Gemm.cpp emitPack) against the documented layout (Gemm.h), word for word, computed here from W:
// flat(P)[p*K*64 + g*K*c + kv*c + jj] = W[p*64 + g*c + jj][kv], zero past N; bf16 words are the pair (W[.][2 kv],
// W[.][2 kv + 1]) rounded to nearest even, low then high half, the high one zero past an odd K. Depths that are and
// are not multiples of 16 (the vector steps and the word-by-word rest), N past the last panel, every tile's slice
// width; P 64-byte aligned (nontemporal vector stores) and 4 bytes off (ordinary ones); every word written.
TEST(GemmPack, WritesTheDocumentedLayout) {
  using lmcc::codegen::GemmTile;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 5},  {16, 7},   {63, 33},  {65, 19},  {67, 30},
                                                           {130, 17}, {100, 601}, {70, 64}, {33, 1101}, {64, 32}};
  const std::vector<GemmTile> tiles = {GemmTile::forVectorBits(512), GemmTile::forVectorBits(256),
                                       GemmTile::forDepth(GemmTile::forVectorBits(512), 1024, 8),
                                       GemmTile::forTarget(512, true, false), GemmTile::forTarget(256, true, false)};
  mlir::MLIRContext context;
  auto module = lmcc::codegen::buildGemmModule(context, shapes, tiles);
  lmcc::test::KernelLibrary library;
  ASSERT_NO_FATAL_FAILURE(library.build(*module, "gemm-pack"));
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-2, 2);
  auto bits = [](float x) {
    uint32_t w;
    std::memcpy(&w, &x, 4);
    return w;
  };
  for (auto [n, k] : shapes) {
    const std::string shape = std::to_string(n) + "x" + std::to_string(k);
    std::vector<float> w(n * k);
    for (float &x : w)
      x = u(rng);
    for (const GemmTile &tile : tiles) {
      auto pack = reinterpret_cast<PackFn>(
          ::dlsym(library.handle, ("_mlir_ciface_lm_bench_pack_" + shape + "_" + tile.name()).c_str()));
      ASSERT_TRUE(pack) << shape << " " << tile.name();
      const int64_t c = tile.cols(), kk = lmcc::codegen::packedDepth(k, tile.bf16());
      const int64_t rows = lmcc::codegen::packedRows(n, k, tile.bf16()), words = rows * lmcc::codegen::kPanel;
      for (int64_t skew : {0, 1}) {
        std::vector<float> storage(words + 16 + 1, 7.0f);
        float *p = storage.data();
        while (reinterpret_cast<uintptr_t>(p) % 64)
          ++p;
        p += skew;
        MemRef<2> wm = view(w.data(), n, k), pm = view(p, rows, lmcc::codegen::kPanel);
        pack(&wm, &pm);
        const std::string where = shape + " " + tile.name() + (skew ? " (P unaligned)" : " (P aligned)");
        for (int64_t q = 0; q < words / (kk * c); ++q)
          for (int64_t kv = 0; kk && kv < kk; ++kv)
            for (int64_t jj = 0; jj < c; ++jj) {
              const int64_t row = q * c + jj;
              uint32_t expect = 0;
              if (row < n && !tile.bf16()) {
                expect = bits(w[row * k + kv]);
              } else if (row < n) {
                const uint32_t lo = bits(lmcc::test::roundToBf16(w[row * k + 2 * kv])) >> 16;
                const uint32_t hi = 2 * kv + 1 < k ? bits(lmcc::test::roundToBf16(w[row * k + 2 * kv + 1])) >> 16 : 0;
                expect = lo | hi << 16;
              }
              ASSERT_EQ(bits(p[q * kk * c + kv * c + jj]), expect)
                  << where << ": slice " << q << " word " << kv << " column " << jj;
            }
        ASSERT_EQ(bits(p[words]), bits(7.0f)) << where << ": written past P";
      }
    }
  }
}

// The tile follows the target's vector registers, for named CPUs as for the host.
TEST(GemmTile, FollowsTheTargetsVectorWidth) {
  EXPECT_EQ(lmcc::codegen::targetVectorBits("skylake-avx512"), 512);
  EXPECT_EQ(lmcc::codegen::targetVectorBits("znver4"), 512);
  EXPECT_EQ(lmcc::codegen::targetVectorBits("znver3"), 256);
  EXPECT_EQ(lmcc::codegen::targetVectorBits("haswell"), 256);
  EXPECT_EQ(lmcc::codegen::GemmTile::forVectorBits(512).cols(), 32);
  EXPECT_EQ(lmcc::codegen::GemmTile::forVectorBits(256).cols(), 16);
}

// The bf16 kernel a named CPU gets: AMX where it has AMX-BF16 (Sapphire Rapids), dot products where it has
// AVX512_BF16 without AMX (Zen 4, Cooper Lake), else widening (AVX-512 without BF16, AVX2). The half-rate rule for
// Intel's AMX generation only applies where AMX is hidden (a VM on such a host): every named CPU of it has AMX.
TEST(GemmTile, Bf16KernelFollowsTheTarget) {
  using lmcc::codegen::Bf16Kernel;
  using lmcc::codegen::targetBf16Kernel;
  EXPECT_EQ(targetBf16Kernel("sapphirerapids"), Bf16Kernel::Amx);
  EXPECT_EQ(targetBf16Kernel("graniterapids"), Bf16Kernel::Amx);
  EXPECT_EQ(targetBf16Kernel("znver4"), Bf16Kernel::Dot);
  EXPECT_EQ(targetBf16Kernel("cooperlake"), Bf16Kernel::Dot);
  EXPECT_EQ(targetBf16Kernel("skylake-avx512"), Bf16Kernel::Widen);
  EXPECT_EQ(targetBf16Kernel("znver3"), Bf16Kernel::Widen);
  const Bf16Kernel host = targetBf16Kernel("");
  EXPECT_EQ(host == Bf16Kernel::Amx, lmcc::codegen::targetHasAmx(""));
  if (!lmcc::codegen::targetHasBf16Dot(""))
    EXPECT_EQ(host, Bf16Kernel::Widen);
}

// Deep weights (depth a multiple of 1024) take the 5 x 64 tile where the L1 has fewer ways than the 12 x 32 tile has
// rows; other depths, wider or unknown (0) L1s, AVX2 and bf16 weights keep the target's tile.
TEST(GemmTile, DeepWeightsOnNarrowL1sTakeFiveRows) {
  using lmcc::codegen::GemmTile;
  const GemmTile avx512 = GemmTile::forVectorBits(512);
  for (int64_t k : {1024, 2048, 3072}) {
    EXPECT_EQ(GemmTile::forDepth(avx512, k, 8).name(), "5x64") << k;
    EXPECT_EQ(GemmTile::forDepth(avx512, k, 12).name(), "12x32") << k;
    EXPECT_EQ(GemmTile::forDepth(avx512, k, 0).name(), "12x32") << k;
    EXPECT_EQ(GemmTile::forDepth(GemmTile::forVectorBits(256), k, 4).name(), "6x16") << k;
    EXPECT_EQ(GemmTile::forDepth(GemmTile::forTarget(512, true, true), k, 8).name(), "12x32_bf16dot") << k;
    EXPECT_EQ(GemmTile::forDepth(GemmTile::forTarget(512, true, false), k, 8).name(), "10x32_bf16") << k;
  }
  for (int64_t k : {512, 768, 1536, 3000})
    EXPECT_EQ(GemmTile::forDepth(avx512, k, 8).name(), "12x32") << k;
}

} // namespace
