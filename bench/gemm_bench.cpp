//===- gemm_bench.cpp - Generated GEMM vs Eigen, against the measured FMA peak --===//
//
// Builds the generated GEMM (codegen/LmToLoops/Gemm.cpp) for the model shapes into a
// shared library at start-up, then times, at 1 thread:
//   - the machine's FP32 FMA peak (an AVX-512 loop of independent FMAs),
//   - generated: C[M, N] = A[M, K] W[N, K]^T over W packed once (as at model load),
//   - eigen: the same product through Eigen 3.4 (what --gemm=eigen calls),
//   - openblas: cblas_sgemm, when OpenBLAS is installed (scripts/bench-deps.sh).
// Counters: GFLOP/s and fraction of the measured peak. Run:
//   build/bench/gemm_bench --benchmark_min_time=0.2
//
//===----------------------------------------------------------------------===//
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Gemm.h"

#include "mlir/IR/MLIRContext.h"

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <immintrin.h>

#ifdef LMCC_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace {

struct Shape {
  int64_t m, k, n;
};
// T-TA paper configuration (d 512, FFN 2048, vocab 30522): QKV/O, FFN in/out, stacked K/V, head; n = 20 and batched.
const std::vector<Shape> kShapes = {{20, 512, 512},   {20, 512, 1536},  {20, 512, 2048}, {20, 2048, 512},
                                    {400, 512, 2048}, {640, 512, 512},  {20, 512, 30522}};

template <int R> struct MemRef {
  float *allocated, *aligned;
  int64_t offset, sizes[R], strides[R];
};
MemRef<2> view(float *p, int64_t rows, int64_t cols) { return {p, p, 0, {rows, cols}, {cols, 1}}; }

using PackFn = void (*)(MemRef<2> *, MemRef<2> *);
using GemmFn = void (*)(MemRef<2> *, MemRef<2> *, MemRef<2> *);
void *g_library = nullptr;

/// Compiles the generated GEMM for every (N, K) of kShapes into a temporary shared library.
void buildLibrary() {
  std::vector<std::pair<int64_t, int64_t>> nk;
  for (const Shape &s : kShapes)
    if (std::find(nk.begin(), nk.end(), std::make_pair(s.n, s.k)) == nk.end())
      nk.push_back({s.n, s.k});
  mlir::MLIRContext context;
  auto module = lmcc::codegen::buildGemmModule(context, nk);
  if (mlir::failed(lmcc::codegen::lowerToLLVMDialect(*module))) {
    std::fprintf(stderr, "gemm_bench: lowering failed\n");
    std::exit(1);
  }
  auto dir = std::filesystem::temp_directory_path() / ("lmcc-gemm-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string object = (dir / "gemm.o").string(), library = (dir / "libgemm.so").string();
  if (std::string err = lmcc::codegen::emitObject(*module, object, {}); !err.empty()) {
    std::fprintf(stderr, "gemm_bench: %s\n", err.c_str());
    std::exit(1);
  }
  std::string link = "cc -shared -o " + library + " " + object + " -lm";
  if (std::system(link.c_str()) != 0 || !(g_library = ::dlopen(library.c_str(), RTLD_NOW))) {
    std::fprintf(stderr, "gemm_bench: cannot link or load %s\n", library.c_str());
    std::exit(1);
  }
}

template <typename Fn> Fn symbol(const std::string &name) {
  auto fn = reinterpret_cast<Fn>(::dlsym(g_library, ("_mlir_ciface_" + name).c_str()));
  if (!fn) {
    std::fprintf(stderr, "gemm_bench: %s missing\n", name.c_str());
    std::exit(1);
  }
  return fn;
}

std::vector<float> randomVector(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float &x : v)
    x = u(rng);
  return v;
}

/// 16 independent FMA chains of 16 floats: the FP32 FMA peak of one core.
__attribute__((target("avx512f"), noinline)) float fmaLoop(int64_t iterations) {
  __m512 acc[16];
  for (auto &a : acc)
    a = _mm512_set1_ps(0.5f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto &a : acc)
      a = _mm512_fmadd_ps(a, x, y);
  __m512 sum = acc[0];
  for (int j = 1; j < 16; ++j)
    sum = _mm512_add_ps(sum, acc[j]);
  return _mm512_reduce_add_ps(sum);
}

double g_peak = 0; // GFLOP/s, measured once

double measurePeak() {
  int64_t iterations = 20'000'000;
  benchmark::DoNotOptimize(iterations);
  auto start = std::chrono::steady_clock::now();
  benchmark::DoNotOptimize(fmaLoop(iterations));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return double(iterations) * 16 * 16 * 2 / seconds / 1e9;
}

void report(benchmark::State &state, const Shape &s) {
  double flops = 2.0 * s.m * s.n * s.k * state.iterations();
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  state.counters["peak_frac"] = benchmark::Counter(flops / 1e9 / g_peak, benchmark::Counter::kIsRate);
}

void BM_Generated(benchmark::State &state, Shape s) {
  std::string suffix = std::to_string(s.n) + "x" + std::to_string(s.k);
  auto pack = symbol<PackFn>("lm_bench_pack_" + suffix);
  auto gemm = symbol<GemmFn>("lm_bench_gemm_" + suffix);
  std::vector<float> a = randomVector(s.m * s.k, 1), w = randomVector(s.n * s.k, 2), c(s.m * s.n);
  int64_t panelRows = lmcc::codegen::packedRows(s.n, s.k);
  std::vector<float> packed(panelRows * lmcc::codegen::kPanel);
  MemRef<2> wm = view(w.data(), s.n, s.k), pm = view(packed.data(), panelRows, lmcc::codegen::kPanel);
  pack(&wm, &pm); // once, as at model load
  MemRef<2> am = view(a.data(), s.m, s.k), cm = view(c.data(), s.m, s.n);
  for (auto _ : state) {
    gemm(&am, &pm, &cm);
    benchmark::ClobberMemory();
  }
  // Spot check against a naive dot product.
  double ref = 0;
  for (int64_t k = 0; k < s.k; ++k)
    ref += double(a[k]) * w[(s.n - 1) * s.k + k];
  if (std::abs(ref - c[s.n - 1]) > 1e-3 * (1 + std::abs(ref)))
    state.SkipWithError("generated GEMM result differs from the naive product");
  report(state, s);
}

void BM_Eigen(benchmark::State &state, Shape s) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Matrix a = Matrix::Random(s.m, s.k), w = Matrix::Random(s.n, s.k), c(s.m, s.n);
  for (auto _ : state) {
    c.noalias() = a * w.transpose();
    benchmark::ClobberMemory();
  }
  report(state, s);
}

#ifdef LMCC_HAVE_OPENBLAS
void BM_OpenBLAS(benchmark::State &state, Shape s) {
  std::vector<float> a = randomVector(s.m * s.k, 1), w = randomVector(s.n * s.k, 2), c(s.m * s.n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(s.k),
                w.data(), int(s.k), 0.0f, c.data(), int(s.n));
    benchmark::ClobberMemory();
  }
  report(state, s);
}
#endif

} // namespace

int main(int argc, char **argv) {
  buildLibrary();
  g_peak = measurePeak();
  for (int i = 0; i < 2; ++i) // the best of three runs of 1.3 G FMAs
    g_peak = std::max(g_peak, measurePeak());
  std::printf("measured FP32 FMA peak: %.1f GFLOP/s (1 thread)\n", g_peak);
  for (const Shape &s : kShapes) {
    std::string name = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    benchmark::RegisterBenchmark(("generated/" + name).c_str(), BM_Generated, s);
    benchmark::RegisterBenchmark(("eigen/" + name).c_str(), BM_Eigen, s);
#ifdef LMCC_HAVE_OPENBLAS
    benchmark::RegisterBenchmark(("openblas/" + name).c_str(), BM_OpenBLAS, s);
#endif
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
