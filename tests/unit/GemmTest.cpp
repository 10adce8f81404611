// The generated GEMM (codegen/LmToLoops/Gemm.cpp) against a naive loop: odd shapes,
// N not a multiple of the 64-wide panel, every M from 1 to 70, weights packed once.
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Gemm.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

namespace {

template <int R> struct MemRef {
  float *allocated, *aligned;
  int64_t offset, sizes[R], strides[R];
};
MemRef<2> view(float *p, int64_t rows, int64_t cols) { return {p, p, 0, {rows, cols}, {cols, 1}}; }
using PackFn = void (*)(MemRef<2> *, MemRef<2> *);
using GemmFn = void (*)(MemRef<2> *, MemRef<2> *, MemRef<2> *);

// (N, K): the panel edge cases and the shapes of the tiny test models.
// Odd shapes, then every (N, K) of the bundled models (T-TA/biLM/uniLM paper size: projections, stacked K/V,
// FFN, vocabulary; BERT-base). Shapes packing to more than 1 MiB take the prefetching kernel.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 5},     {16, 7},    {63, 33},   {64, 8},    {65, 19},   {67, 30},   {130, 17},   {30, 46},
    {120, 30},  {4133, 71}, {512, 512}, {1536, 512}, {3072, 512}, {2048, 512}, {512, 2048}, {30522, 512},
    {768, 768}, {2304, 768}, {3072, 768}, {768, 3072}, {30522, 768}};

class GemmTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    mlir::MLIRContext context;
    auto module = lmcc::codegen::buildGemmModule(context, kShapes);
    ASSERT_TRUE(mlir::succeeded(lmcc::codegen::lowerToLLVMDialect(*module)));
    dir = std::filesystem::temp_directory_path() / ("lmcc-gemm-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string object = (dir / "gemm.o").string(), library = (dir / "libgemm.so").string();
    ASSERT_EQ(lmcc::codegen::emitObject(*module, object, {}), "");
    ASSERT_EQ(std::system(("cc -shared -o " + library + " " + object + " -lm").c_str()), 0);
    handle = ::dlopen(library.c_str(), RTLD_NOW);
    ASSERT_NE(handle, nullptr) << ::dlerror();
  }
  static void TearDownTestSuite() {
    if (handle)
      ::dlclose(handle);
    std::filesystem::remove_all(dir);
  }
  template <typename Fn> static Fn symbol(const std::string &name) {
    return reinterpret_cast<Fn>(::dlsym(handle, ("_mlir_ciface_" + name).c_str()));
  }
  static inline void *handle = nullptr;
  static inline std::filesystem::path dir;
};

TEST_F(GemmTest, MatchesNaiveProductForEveryRowCount) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto [n, k] : kShapes) {
    std::string suffix = std::to_string(n) + "x" + std::to_string(k);
    auto pack = symbol<PackFn>("lm_bench_pack_" + suffix);
    auto gemm = symbol<GemmFn>("lm_bench_gemm_" + suffix);
    ASSERT_TRUE(pack && gemm) << suffix;
    std::vector<float> w(n * k);
    for (float &x : w)
      x = u(rng);
    int64_t rows = lmcc::codegen::packedRows(n, k);
    std::vector<float> packed(rows * lmcc::codegen::kPanel, 7.0f);
    MemRef<2> wm = view(w.data(), n, k), pm = view(packed.data(), rows, lmcc::codegen::kPanel);
    pack(&wm, &pm);
    bool large = n * k > 100000;
    for (int64_t m = 1; m <= 70; m += large ? 23 : 1) {
      std::vector<float> a(m * k);
      for (float &x : a)
        x = u(rng);
      const float sentinel = 1234.5f;
      std::vector<float> c(m * n + 3, sentinel); // 3 floats past the end must stay untouched
      MemRef<2> am = view(a.data(), m, k), cm = view(c.data(), m, n);
      gemm(&am, &pm, &cm);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0;
          for (int64_t kk = 0; kk < k; ++kk)
            ref += double(a[i * k + kk]) * w[j * k + kk];
          ASSERT_NEAR(c[i * n + j], ref, 1e-4 * (1 + std::fabs(ref))) << suffix << " m=" << m << " [" << i << "," << j << "]";
        }
      for (int x = 0; x < 3; ++x)
        ASSERT_EQ(c[m * n + x], sentinel) << suffix << " m=" << m << ": written past C";
    }
  }
}

} // namespace
