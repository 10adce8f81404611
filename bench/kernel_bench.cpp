//===- kernel_bench.cpp - The machine's limits, GEMM and attention kernels ---===//
//
// Builds the generated GEMM (codegen/LmToLoops/Gemm.cpp) for the model shapes and the
// generated attention kernel (codegen/LmToLoops/Attention.cpp, the lm-to-loops pattern) for each mask kind, each
// into its own shared library when the first benchmark that times it starts (a filtered run compiles only what it
// times), then times:
//   - machine/peak: the FP32 FMA peak (a loop of independent AVX-512 or AVX2 FMAs), 1 and 2 threads,
//   - machine/read_bw: memory read bandwidth (a 1 GiB buffer, far past L3), 1 and 2 threads,
//   - gemm/generated: C[M, N] = A[M, K] W[N, K]^T over W packed once (as at model load), in the tile
//     lmcc picks for this host,
//   - gemm/eigen: the same product through Eigen 3.4 (what --gemm=eigen calls),
//   - gemm/openblas: cblas_sgemm, when OpenBLAS is installed (scripts/bench-deps.sh),
//   - attention/<mask>: lm.attention (8 heads, d 512) as the model kernels run it, 1 thread (operands and
//     temporaries in liblmrt's workspace, as a compiled model's activations),
//   - attention_rel/<mask>: the same with Shaw relative positions clipped at 16 (FLOPs counted as the plain one's),
//   - attention_grad_rel/<mask>, attention_grad_rt_rel/<mask>: the backwards below with those relative positions,
//   - attention_grad/<mask>: lm.attention_grad as compiled training runs it (its generated vector form), 1 thread,
//   - attention_grad_rt/<mask>: the runtime's C++ backward (lm_rt_attention_grad, liblmrt: head sizes off the
//     vector form), 1 thread,
//   - optimizer/adamw_step: one step of the trainer's optimizer (runtime/train/Optimizer.cpp: norm, clipping,
//     AdamW) over the base models' embedding, matrices and biases (25,076,736 of their 25,445,178 parameters; the
//     norms and position tables left out), 1 thread (memory-bound: GBs counts weights, gradients and moments read
//     and weights and moments written once, 7 floats a parameter).
// Mask `directional` is the Diformer's: per-row directions and hidden keys drawn as its `directional` objective
// draws them (DirectionalRows); LMCC_KERNEL_BENCH_DIRECTION=R, L or S gives every row but the first (R) and the
// last (L) that direction (S rows still hide their random keys), to time the directions apart.
// Counters: GFLOPs (GFLOP/s), GBs (GB/s) and peak_frac (of the 1-thread peak measured at
// start-up), rates over wall-clock time (as the peak's). OpenBLAS runs on one thread. The measured peak and tile
// go to stderr, so stdout is the benchmark library's report alone. Run: build/bench/kernel_bench --benchmark_min_time=0.2
// A kernel's library (lib<kernel>.so) is deleted once loaded (its mapping stays); with LMCC_KERNEL_BENCH_KEEP set
// it stays in its temporary directory (printed), e.g. for `perf annotate`.
//
// Attention A/B (two builds' kernels in one process; separate processes differ by more than a few percent here):
//   kernel_bench --build-attention DIR   this build's attention kernels (forward and generated backward, each mask,
//                                        plain and relative) into DIR/lib<kernel>.so, the names the kept libraries
//                                        of LMCC_KERNEL_BENCH_KEEP also have (so an older kernel_bench's kept
//                                        directory serves as A);
//   kernel_bench --attention-ab A B [benchmark flags]   the generated attention benchmarks of both sides, named A/...
//                                        and B/..., each B run first required to give A's output bit for bit, 12
//                                        repetitions each interleaved at random (--benchmark_repetitions=N and
//                                        --benchmark_filter override), then per kernel B / A of the median peak
//                                        fractions.
//
//===----------------------------------------------------------------------===//
#include "bench/Peak.h"
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Gemm.h"
#include "codegen/LmToLoops/KernelAbi.h"
#include "codegen/LmToLoops/Lowering.h"
#include "runtime/lib/TrainKernels.h"
#include "runtime/train/Optimizer.h"
#include "runtime/lib/lmrt.h"

#include "mlir/IR/MLIRContext.h"

#include <Eigen/Core>
#include <benchmark/benchmark.h>
#include <immintrin.h>

#ifdef LMCC_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {
namespace lm = lmcc::lm;

struct Shape {
  int64_t m, k, n;
};
// T-TA paper configuration (d 512, FFN 2048, vocab 30522): QKV/O, FFN in/out, stacked K/V, head; n = 20 and batched.
// BERT-base (d 768, FFN 3072) at n = 20. The batched PLL's FFN: biLM n = 128 (16384 rows), BERT n = 40 (1600 rows;
// its 768 x 768 projections too).
// The T-TA head at n = 128 (batch 1) and n = 20 x batch 32: the largest GEMM of those entries (half their time).
const std::vector<Shape> kShapes = {
    {20, 512, 512},    {20, 512, 1536},    {20, 512, 2048},  {20, 2048, 512},   {400, 512, 2048},
    {640, 512, 512},   {20, 512, 30522},   {10, 512, 30522},  {20, 768, 768},   {20, 768, 3072},   {20, 3072, 768},
    {20, 768, 30522},  {16384, 512, 2048}, {16384, 2048, 512}, {1600, 768, 768}, {1600, 768, 3072}, {1600, 3072, 768},
    {128, 512, 30522}, {320, 512, 30522}, {640, 512, 30522}};
const std::vector<std::pair<lm::MaskKind, const char *>> kMasks = {{lm::MaskKind::none, "none"},
                                                                   {lm::MaskKind::causal, "causal"},
                                                                   {lm::MaskKind::anticausal, "anticausal"},
                                                                   {lm::MaskKind::diagonal, "diagonal"},
                                                                   {lm::MaskKind::directional, "directional"}};
constexpr int64_t kHeads = 8, kModel = 512;
constexpr int64_t kRowWords = 1 + 128 / 32; ///< directional rows: direction, hidden-key bits for n <= 128
constexpr int64_t kClip = 16; ///< Shaw relative positions of attention_rel (the diformer's clip)

using namespace lmcc::codegen::abi;
// This host's vector width as lmcc sees it (codegen/Emit/Object.h) picks both the peak loops below and the
// register tile lmcc compiles for it (12 x 32 with AVX-512, 6 x 16 with AVX2).
const bool g_avx512 = lmcc::codegen::targetVectorBits("") >= 512;
const lmcc::codegen::GemmTile g_tile = lmcc::codegen::GemmTile::forVectorBits(g_avx512 ? 512 : 256);

/// The tile lmcc picks on this host for a weight of the shape's depth (GemmTile::forDepth).
lmcc::codegen::GemmTile tileOf(const Shape &s) {
  return lmcc::codegen::GemmTile::forDepth(g_tile, s.k, lmcc::codegen::hostL1Ways());
}
/// "<N>x<K>_<tile>": the suffix of buildGemmModule's lm_bench_pack_ / lm_bench_gemm_ functions for `s`.
std::string gemmSuffix(const Shape &s) {
  return std::to_string(s.n) + "x" + std::to_string(s.k) + "_" + tileOf(s).name();
}

/// The kernels are compiled on first use, in the set-up of the first benchmark that times them (outside its timed
/// loop): one shared library per kernel, so a run filtered to a few benchmarks compiles only their kernels. Each
/// library is deleted once loaded (its mapping stays) unless LMCC_KERNEL_BENCH_KEEP is set.
std::filesystem::path g_libraryDir;
std::map<std::string, void *> g_libraries; // kernel function name -> its loaded library

/// A kernel module's function `kernel` renamed `as` (its tasks and runtime declarations keep their names).
mlir::OwningOpRef<mlir::ModuleOp> renamed(mlir::OwningOpRef<mlir::ModuleOp> module, const char *kernel,
                                          const std::string &as) {
  if (module)
    module->lookupSymbol<mlir::func::FuncOp>(kernel).setSymName(as);
  return module;
}

/// Builds the module holding `name` (a GEMM pair lm_bench_pack_/lm_bench_gemm_<N>x<K>_<tile>, or attention[_grad]
/// [_rel]_<mask>), or a null module for a name no benchmark uses.
mlir::OwningOpRef<mlir::ModuleOp> buildKernel(mlir::MLIRContext &context, const std::string &name) {
  using lmcc::codegen::buildAttentionGradModule, lmcc::codegen::buildAttentionModule;
  for (const Shape &s : kShapes) {
    const std::string suffix = gemmSuffix(s);
    if (name == "lm_bench_pack_" + suffix || name == "lm_bench_gemm_" + suffix)
      return lmcc::codegen::buildGemmModule(context, {{s.n, s.k}}, {tileOf(s)});
  }
  for (auto [mask, maskName] : kMasks) {
    const int64_t words = mask == lm::MaskKind::directional ? kRowWords : 0;
    for (int64_t clip : {int64_t(0), kClip}) {
      const std::string infix = clip ? "_rel_" : "_";
      if (name == "attention" + infix + maskName)
        return renamed(buildAttentionModule(context, mask, kHeads, kModel, clip, words), "attention_kernel", name);
      if (name == "attention_grad" + infix + maskName)
        return renamed(buildAttentionGradModule(context, mask, kHeads, kModel, clip, words), "attention_grad_kernel",
                       name);
    }
  }
  return nullptr;
}

/// The library holding kernel `name`, compiled and loaded on first use.
void *kernelLibrary(const std::string &name) {
  if (auto it = g_libraries.find(name); it != g_libraries.end())
    return it->second;
  mlir::MLIRContext context;
  auto module = buildKernel(context, name);
  if (!module) {
    std::fprintf(stderr, "kernel_bench: cannot build %s\n", name.c_str());
    std::exit(1);
  }
  if (g_libraryDir.empty()) {
    g_libraryDir = std::filesystem::temp_directory_path() / ("lmcc-kernel-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(g_libraryDir);
  }
  const std::string library = (g_libraryDir / ("lib" + name + ".so")).string();
  if (std::string err = lmcc::codegen::emitKernelLibrary(*module, library); !err.empty()) {
    std::fprintf(stderr, "kernel_bench: %s\n", err.c_str());
    std::exit(1);
  }
  void *handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "kernel_bench: cannot load %s: %s\n", library.c_str(), ::dlerror());
    std::exit(1);
  }
  if (std::getenv("LMCC_KERNEL_BENCH_KEEP"))
    std::fprintf(stderr, "kernel_bench: %s kept in %s\n", name.c_str(), library.c_str());
  else
    std::filesystem::remove(library);
  // A GEMM's pack and product come from one module: both names resolve to its library.
  for (auto fn : module->getOps<mlir::func::FuncOp>())
    if (!fn.isExternal())
      g_libraries.emplace(fn.getSymName().str(), handle);
  g_libraries.emplace(name, handle);
  return handle;
}

/// The library lib<name>.so of directory `dir` (--build-attention's), loaded on first use.
void *prebuiltLibrary(const std::string &dir, const std::string &name) {
  static std::map<std::string, void *> loaded;
  const std::string path = dir + "/lib" + name + ".so";
  if (auto it = loaded.find(path); it != loaded.end())
    return it->second;
  void *handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "kernel_bench: cannot load %s: %s\n", path.c_str(), ::dlerror());
    std::exit(1);
  }
  return loaded[path] = handle;
}

/// Kernel `name` (its C interface), compiled by this build or, with `dir`, from --build-attention's directory.
template <typename Fn> Fn symbol(const std::string &name, const std::string &dir = "") {
  void *library = dir.empty() ? kernelLibrary(name) : prebuiltLibrary(dir, name);
  auto fn = reinterpret_cast<Fn>(::dlsym(library, ("_mlir_ciface_" + name).c_str()));
  if (!fn) {
    std::fprintf(stderr, "kernel_bench: %s missing\n", name.c_str());
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

double fmaLoop(int64_t iterations) { return lmcc::bench::fmaLoop(g_avx512, iterations); }

double g_peak = 0; // 1-thread GFLOP/s, measured at start-up (best of three)

/// Runs fn(thread) on `threads` threads at once (the calling thread is thread 0).
template <typename Fn> void onThreads(int threads, Fn fn) {
  std::vector<std::thread> others;
  for (int t = 1; t < threads; ++t)
    others.emplace_back(fn, t);
  fn(0);
  for (auto &t : others)
    t.join();
}

/// The FP32 FMA peak of `threads` cores: every thread runs the FMA loop at once.
void BM_Peak(benchmark::State &state) {
  int threads = int(state.range(0));
  constexpr int64_t kIterations = 2'000'000;
  double perThread = 0;
  for (auto _ : state)
    onThreads(threads, [&](int t) {
      double f = fmaLoop(kIterations);
      if (t == 0)
        perThread = f;
    });
  double flops = perThread * threads * state.iterations();
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
}

/// Sums `floats` floats (a multiple of 64) with 4 independent accumulators: a pure read stream.
__attribute__((target("avx512f"), noinline)) float readStream512(const float *p, int64_t floats) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < floats; i += 64)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(p + i + 16 * j));
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

__attribute__((target("avx2"), noinline)) float readStream256(const float *p, int64_t floats) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < floats; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_add_ps(acc[j], _mm256_load_ps(p + i + 8 * j));
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  return lanes[0];
}

float readStream(const float *p, int64_t floats) {
  return g_avx512 ? readStream512(p, floats) : readStream256(p, floats);
}

/// Memory read bandwidth: `threads` threads each stream their half of a 1 GiB buffer (32x the L3).
void BM_ReadBandwidth(benchmark::State &state) {
  int threads = int(state.range(0));
  constexpr int64_t kFloats = int64_t(1) << 28; // 1 GiB
  float *buffer = static_cast<float *>(std::aligned_alloc(64, kFloats * sizeof(float)));
  onThreads(threads, [&](int t) { // first touch by the thread that reads it
    std::fill(buffer + t * (kFloats / threads), buffer + (t + 1) * (kFloats / threads), 1.0f);
  });
  for (auto _ : state)
    onThreads(threads, [&](int t) {
      benchmark::DoNotOptimize(readStream(buffer + t * (kFloats / threads), kFloats / threads));
    });
  std::free(buffer);
  double bytes = double(kFloats) * sizeof(float) * state.iterations();
  state.counters["GBs"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

/// Wall-clock seconds since construction: the kernels' rates are over wall time, as the peak's (UseRealTime), not
/// over the process's CPU time (which a descheduled run undercounts), and keep their benchmark names.
struct WallClock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

/// GFLOPs and peak_frac of `flops` FLOPs done in `seconds` of wall time.
void setRates(benchmark::State &state, double flops, double seconds) {
  state.counters["GFLOPs"] = flops / 1e9 / seconds;
  state.counters["peak_frac"] = flops / 1e9 / seconds / g_peak;
}

void report(benchmark::State &state, const Shape &s, double seconds) {
  setRates(state, 2.0 * s.m * s.n * s.k * state.iterations(), seconds);
}

/// A zeroed buffer of `floats` in 2 MB-aligned memory advised as huge pages, as liblmrt holds a model's weights.
struct HugePageBuffer {
  float *data;
  explicit HugePageBuffer(size_t floats) {
    const size_t huge = size_t(2) << 20, bytes = (floats * sizeof(float) + huge - 1) / huge * huge;
    void *p = std::aligned_alloc(huge, bytes);
    if (!p)
      throw std::bad_alloc();
    ::madvise(p, bytes, MADV_HUGEPAGE);
    data = static_cast<float *>(std::memset(p, 0, bytes));
  }
  HugePageBuffer(const HugePageBuffer &) = delete;
  HugePageBuffer &operator=(const HugePageBuffer &) = delete;
  ~HugePageBuffer() { std::free(data); }
};

/// An activation buffer as a compiled model holds one: a block of liblmrt's workspace (lmrt.h; 64-byte aligned,
/// from 2 MB on 2 MB-aligned pages advised as huge pages), holding `init`.
struct Activation {
  float *data;
  explicit Activation(const std::vector<float> &init)
      : data(static_cast<float *>(_mlir_memref_to_llvm_aligned_alloc(64, init.size() * sizeof(float)))) {
    if (!data)
      throw std::bad_alloc();
    std::copy(init.begin(), init.end(), data);
  }
  Activation(const Activation &) = delete;
  Activation &operator=(const Activation &) = delete;
  ~Activation() { _mlir_memref_to_llvm_free(data); }
  float operator[](size_t i) const { return data[i]; }
};

void BM_Generated(benchmark::State &state, Shape s) {
  const std::string suffix = gemmSuffix(s);
  auto pack = symbol<PackFn>("lm_bench_pack_" + suffix);
  auto gemm = symbol<GemmFn>("lm_bench_gemm_" + suffix);
  std::vector<float> a = randomVector(s.m * s.k, 1), w = randomVector(s.n * s.k, 2), c(s.m * s.n);
  int64_t panelRows = lmcc::codegen::packedRows(s.n, s.k);
  HugePageBuffer packed(panelRows * lmcc::codegen::kPanel);
  MemRef<2> wm = view(w.data(), s.n, s.k), pm = view(packed.data, panelRows, lmcc::codegen::kPanel);
  pack(&wm, &pm); // once, as at model load
  MemRef<2> am = view(a.data(), s.m, s.k), cm = view(c.data(), s.m, s.n);
  const WallClock wall;
  for (auto _ : state) {
    gemm(&am, &pm, &cm);
    benchmark::ClobberMemory();
  }
  const double seconds = wall.seconds();
  // Spot check against a naive dot product.
  double ref = 0;
  for (int64_t k = 0; k < s.k; ++k)
    ref += double(a[k]) * w[(s.n - 1) * s.k + k];
  if (std::abs(ref - c[s.n - 1]) > 1e-3 * (1 + std::abs(ref)))
    state.SkipWithError("generated GEMM result differs from the naive product");
  report(state, s, seconds);
}

void BM_Eigen(benchmark::State &state, Shape s) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Matrix a = Matrix::Random(s.m, s.k), w = Matrix::Random(s.n, s.k), c(s.m, s.n);
  const WallClock wall;
  for (auto _ : state) {
    c.noalias() = a * w.transpose();
    benchmark::ClobberMemory();
  }
  report(state, s, wall.seconds());
}

#ifdef LMCC_HAVE_OPENBLAS
void BM_OpenBLAS(benchmark::State &state, Shape s) {
  std::vector<float> a = randomVector(s.m * s.k, 1), w = randomVector(s.n * s.k, 2), c(s.m * s.n);
  const WallClock wall;
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(s.k),
                w.data(), int(s.k), 0.0f, c.data(), int(s.n));
    benchmark::ClobberMemory();
  }
  report(state, s, wall.seconds());
}
#endif

/// LMCC_KERNEL_BENCH_DIRECTION: the direction (0 R, 1 L, 2 S) of the directional mask's inner rows, or -1 (drawn).
const int32_t g_direction = [] {
  const char *d = std::getenv("LMCC_KERNEL_BENCH_DIRECTION");
  if (!d)
    return -1;
  const std::string s = d;
  if (s != "R" && s != "L" && s != "S") {
    std::fprintf(stderr, "kernel_bench: LMCC_KERNEL_BENCH_DIRECTION is R, L or S, not '%s'\n", d);
    std::exit(2);
  }
  return s == "R" ? 0 : s == "L" ? 1 : 2;
}();

/// A benchmark's mask over `batch` sentences of n tokens: a kind, and for the directional one the rows
/// [batch, n, kRowWords] as the Diformer's `directional` objective draws them (runtime/reference/Diformer.h: row 0
/// R, row n - 1 L, the others uniform over R, L, S; an S row hides c ~ U{0..n-3} of the other content positions).
struct BenchMask {
  lm::MaskKind kind;
  int64_t n;
  std::vector<int32_t> rows;
  BenchMask(lm::MaskKind kind, int64_t batch, int64_t n) : kind(kind), n(n) {
    if (kind != lm::MaskKind::directional)
      return;
    rows.assign(batch * n * kRowWords, 0);
    std::mt19937 rng(11);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < n; ++i) {
        int32_t *row = &rows[(b * n + i) * kRowWords];
        row[0] = i == 0 ? 0 : i == n - 1 ? 1 : int32_t(rng() % 3);
        if (g_direction >= 0 && i > 0 && i < n - 1)
          row[0] = g_direction;
        if (row[0] != 2 || n < 3)
          continue;
        std::vector<int64_t> others;
        for (int64_t j = 1; j < n - 1; ++j)
          if (j != i)
            others.push_back(j);
        std::shuffle(others.begin(), others.end(), rng);
        others.resize(rng() % (n - 2));
        for (int64_t j : others)
          row[1 + j / 32] |= int32_t(1u << (j % 32));
      }
  }
  /// Whether query i of sentence b sees key j (the spot checks' reference).
  bool sees(int64_t b, int64_t i, int64_t j) const {
    switch (kind) {
    case lm::MaskKind::causal: return j <= i;
    case lm::MaskKind::anticausal: return j >= i;
    case lm::MaskKind::diagonal: return j != i;
    case lm::MaskKind::directional: {
      const int32_t *row = &rows[(b * n + i) * kRowWords];
      return row[0] == 0   ? j <= i
             : row[0] == 1 ? j >= i
             : row[0] == 2 ? j != i && !((uint32_t(row[1 + j / 32]) >> (j % 32)) & 1)
                           : false;
    }
    default: return true;
    }
  }
  /// Query-key pairs lm.attention visits per head over the batch.
  double visiblePairs(int64_t batch) const {
    switch (kind) {
    case lm::MaskKind::causal:
    case lm::MaskKind::anticausal: return double(batch) * n * (n + 1) / 2;
    case lm::MaskKind::diagonal: return double(batch) * n * (n - 1);
    case lm::MaskKind::directional: {
      double pairs = 0;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j)
            pairs += sees(b, i, j);
      return pairs;
    }
    default: return double(batch) * n * n;
    }
  }
  MemRef<3> view() {
    float *p = reinterpret_cast<float *>(rows.data());
    const int64_t batch = int64_t(rows.size()) / (n * kRowWords);
    return {p, p, 0, {batch, n, kRowWords}, {n * kRowWords, kRowWords, 1}};
  }
};

/// A/B runs (--attention-ab): the kernels come from `dir` (else this build's), and with `other` (side B) the
/// output is first required to equal side A's kernel's (from `other`) bit for bit.
struct Side {
  std::string dir, other;
};

/// One attention kernel (forward or backward) of a mask and relative setting, from this build or `from`: one of the
/// four pointers is set (none in a default Kernels: the runtime's C++ backward).
template <typename PlainFn, typename RelativeFn, typename DirectionalFnT, typename DirectionalRelativeFnT>
struct Kernels {
  PlainFn plain = nullptr;
  RelativeFn relative = nullptr;
  DirectionalFnT directional = nullptr;
  DirectionalRelativeFnT directionalRelative = nullptr;
  Kernels() = default;
  /// `prefix` "attention_" or "attention_grad_".
  Kernels(const std::string &prefix, const std::string &name, bool rel, bool dir, const std::string &from) {
    const std::string kernel = prefix + (rel ? "rel_" : "") + name;
    if (dir && rel)
      directionalRelative = symbol<DirectionalRelativeFnT>(kernel, from);
    else if (dir)
      directional = symbol<DirectionalFnT>(kernel, from);
    else if (rel)
      relative = symbol<RelativeFn>(kernel, from);
    else
      plain = symbol<PlainFn>(kernel, from);
  }
};
using Forward = Kernels<AttentionFn, RelativeAttentionFn, DirectionalFn, DirectionalRelativeFn>;
using Backward = Kernels<AttentionGradFn, RelativeGradFn, DirectionalGradFn, DirectionalRelativeGradFn>;

/// lm.attention over [batch, n, 512] queries/keys/values, 8 heads: 4 * d_model FLOPs per visible pair
/// (q.k and p*v), the exponentials not counted. With `relative`, Shaw relative positions clipped at kClip
/// (attention_rel/<mask>), counted the same: the relative terms' work (the rows' products with the 2 kClip + 1
/// table rows, the per-row sums and the table's product) is overhead on the plain attention's FLOPs.
void BM_Attention(benchmark::State &state, lm::MaskKind mask, std::string name, bool relative, Side side) {
  int64_t n = state.range(0), batch = state.range(1);
  BenchMask visible(mask, batch, n);
  const bool directional = mask == lm::MaskKind::directional;
  MemRef<3> rows = directional ? visible.view() : MemRef<3>{};
  const Forward kernel("attention_", name, relative, directional, side.dir);
  const int64_t T = 2 * kClip + 1, dh = kModel / kHeads;
  std::vector<float> relK = randomVector(T * dh, 4), relV = randomVector(T * dh, 5);
  MemRef<2> relKm = view(relK.data(), T, dh), relVm = view(relV.data(), T, dh);
  std::vector<float> q = randomVector(batch * n * kModel, 1), k = randomVector(batch * n * kModel, 2),
                     v = randomVector(batch * n * kModel, 3);
  Activation qa(q), ka(k), va(v), out(std::vector<float>(batch * n * kModel));
  std::vector<int32_t> lengths(batch, int32_t(n));
  auto view3 = [&](float *p) { return MemRef<3>{p, p, 0, {batch, n, kModel}, {n * kModel, kModel, 1}}; };
  MemRef<3> qm = view3(qa.data), km = view3(ka.data), vm = view3(va.data), om = view3(out.data);
  MemRef<1> lm_ = {reinterpret_cast<float *>(lengths.data()), reinterpret_cast<float *>(lengths.data()), 0, {batch}, {1}};
  auto run = [&](const Forward &f) {
    if (f.directionalRelative)
      f.directionalRelative(&qm, &km, &vm, &lm_, &rows, &relKm, &relVm, &om);
    else if (f.directional)
      f.directional(&qm, &km, &vm, &lm_, &rows, &om);
    else if (f.relative)
      f.relative(&qm, &km, &vm, &lm_, &relKm, &relVm, &om);
    else
      f.plain(&qm, &km, &vm, &lm_, &om);
  };
  if (!side.other.empty()) {
    run(Forward("attention_", name, relative, directional, side.other));
    const std::vector<float> a(out.data, out.data + batch * n * kModel);
    run(kernel);
    if (std::memcmp(a.data(), out.data, a.size() * sizeof(float))) {
      state.SkipWithError("B's output differs from A's");
      return;
    }
  }
  const WallClock wall;
  for (auto _ : state) {
    run(kernel);
    benchmark::ClobberMemory();
  }
  const double seconds = wall.seconds();
  // Spot check: the last row (directional: the middle one; the last is L and sees itself alone) of head 0 against a
  // direct softmax(q (k + rel_k)^T / 8) (v + rel_v).
  int64_t i = directional ? n / 2 : n - 1;
  auto rel = [&](int64_t j) { return relative ? std::clamp<int64_t>(j - i, -kClip, kClip) + kClip : -1; };
  const float *qi = &q[((batch - 1) * n + i) * kModel];
  std::vector<double> p(n, -INFINITY);
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (!visible.sees(batch - 1, i, j))
      continue;
    double d = 0;
    for (int64_t e = 0; e < dh; ++e)
      d += double(qi[e]) * (k[((batch - 1) * n + j) * kModel + e] + (relative ? relK[rel(j) * dh + e] : 0.0f));
    p[j] = d / std::sqrt(double(dh));
    mx = std::max(mx, p[j]);
  }
  double ref = 0;
  for (int64_t j = 0; j < n; ++j)
    if (p[j] > -INFINITY) {
      double w = std::exp(p[j] - mx);
      sum += w;
      ref += w * (v[((batch - 1) * n + j) * kModel] + (relative ? relV[rel(j) * dh] : 0.0f));
    }
  ref = sum > 0 ? ref / sum : 0;
  if (std::abs(ref - out[((batch - 1) * n + i) * kModel]) > 1e-4 * (1 + std::abs(ref)))
    state.SkipWithError("generated attention differs from a direct softmax(q k^T) v");
  setRates(state, 4.0 * kModel * visible.visiblePairs(batch) * state.iterations(), seconds);
}

/// The backward of lm.attention over [batch, n, 512], 8 heads, generated (`generated`) or liblmrt's
/// lm_rt_attention_grad: 10 * d_model FLOPs per visible pair (the scores q.k recomputed, dP = dO.v, dq, dk, dv),
/// softmax not counted. With `relative`, Shaw relative positions clipped at kClip and the tables' gradients,
/// counted the same (as attention_rel).
void BM_AttentionGrad(benchmark::State &state, lm::MaskKind mask, std::string name, bool generated, bool relative,
                      Side side) {
  int64_t n = state.range(0), batch = state.range(1);
  const int32_t kind = mask == lm::MaskKind::causal        ? LMRT_MASK_CAUSAL
                       : mask == lm::MaskKind::anticausal  ? LMRT_MASK_ANTICAUSAL
                       : mask == lm::MaskKind::diagonal    ? LMRT_MASK_DIAGONAL
                       : mask == lm::MaskKind::directional ? LMRT_MASK_DIRECTIONAL
                                                           : LMRT_MASK_NONE;
  BenchMask visible(mask, batch, n);
  const bool directional = mask == lm::MaskKind::directional;
  MemRef<3> rows = directional ? visible.view() : MemRef<3>{};
  const int64_t size = batch * n * kModel;
  std::vector<float> q = randomVector(size, 1), k = randomVector(size, 2), v = randomVector(size, 3),
                     dO = randomVector(size, 4), zeros(size);
  Activation qa(q), ka(k), va(v), dOa(dO), dq(zeros), dk(zeros), dv(zeros);
  std::vector<int32_t> lengths(batch, int32_t(n));
  const float scale = 1.0f / std::sqrt(float(kModel / kHeads));
  lm_set_num_threads(1);
  auto view3 = [&](float *p) { return MemRef<3>{p, p, 0, {batch, n, kModel}, {n * kModel, kModel, 1}}; };
  MemRef<3> dOm = view3(dOa.data), qm = view3(qa.data), km = view3(ka.data), vm = view3(va.data),
            dqm = view3(dq.data), dkm = view3(dk.data), dvm = view3(dv.data);
  MemRef<1> lm_ = {reinterpret_cast<float *>(lengths.data()), reinterpret_cast<float *>(lengths.data()), 0, {batch}, {1}};
  const int64_t T = 2 * kClip + 1, dh = kModel / kHeads;
  std::vector<float> relK = randomVector(T * dh, 5), relV = randomVector(T * dh, 6), dRelK(T * dh), dRelV(T * dh);
  MemRef<2> rkm = view(relK.data(), T, dh), rvm = view(relV.data(), T, dh), drkm = view(dRelK.data(), T, dh),
            drvm = view(dRelV.data(), T, dh);
  const Backward kernel =
      generated ? Backward("attention_grad_", name, relative, directional, side.dir) : Backward();
  auto run = [&](const Backward &f) {
    if (f.plain)
      f.plain(&dOm, &qm, &km, &vm, &lm_, &dqm, &dkm, &dvm);
    else if (f.relative)
      f.relative(&dOm, &qm, &km, &vm, &lm_, &rkm, &rvm, &dqm, &dkm, &dvm, &drkm, &drvm);
    else if (f.directional)
      f.directional(&dOm, &qm, &km, &vm, &lm_, &rows, &dqm, &dkm, &dvm);
    else if (f.directionalRelative)
      f.directionalRelative(&dOm, &qm, &km, &vm, &lm_, &rows, &rkm, &rvm, &dqm, &dkm, &dvm, &drkm, &drvm);
    else
      lm_rt_attention_grad(dOa.data, qa.data, ka.data, va.data, lengths.data(), nullptr,
                           directional ? visible.rows.data() : nullptr, directional ? kRowWords : 0,
                           relative ? relK.data() : nullptr, relative ? relV.data() : nullptr, relative ? kClip : 0,
                           batch, n, n, kModel, kHeads, kind, scale, dq.data, dk.data, dv.data,
                           relative ? dRelK.data() : nullptr, relative ? dRelV.data() : nullptr);
  };
  if (!side.other.empty()) {
    const size_t floats = size_t(size), tables = relative ? size_t(T * dh) : 0;
    auto outputs = [&] {
      std::vector<float> all(dq.data, dq.data + floats);
      all.insert(all.end(), dk.data, dk.data + floats);
      all.insert(all.end(), dv.data, dv.data + floats);
      all.insert(all.end(), dRelK.begin(), dRelK.begin() + tables);
      all.insert(all.end(), dRelV.begin(), dRelV.begin() + tables);
      return all;
    };
    run(Backward("attention_grad_", name, relative, directional, side.other));
    const std::vector<float> a = outputs();
    run(kernel);
    if (std::memcmp(outputs().data(), a.data(), a.size() * sizeof(float))) { // bits: NaN == NaN, -0 != +0
      state.SkipWithError("B's gradients differ from A's");
      return;
    }
  }
  const WallClock wall;
  for (auto _ : state) {
    run(kernel);
    benchmark::ClobberMemory();
  }
  const double seconds = wall.seconds();
  // Spot check: dv of the last key of head 0, feature 0, in the last sentence: sum_i p_ij dO_i.
  const int64_t b = batch - 1, j = n - 1;
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto seen = [&](int64_t jj) { return visible.sees(b, i, jj); };
    if (!seen(j))
      continue;
    std::vector<double> s(n, -INFINITY);
    double mx = -INFINITY, sum = 0;
    for (int64_t jj = 0; jj < n; ++jj)
      if (seen(jj)) {
        double d = 0;
        const int64_t t = std::clamp<int64_t>(jj - i, -kClip, kClip) + kClip;
        for (int64_t e = 0; e < dh; ++e)
          d += double(q[(b * n + i) * kModel + e]) *
               (k[(b * n + jj) * kModel + e] + (relative ? relK[t * dh + e] : 0.0f));
        s[jj] = d * scale;
        mx = std::max(mx, s[jj]);
      }
    for (int64_t jj = 0; jj < n; ++jj)
      sum += s[jj] > -INFINITY ? std::exp(s[jj] - mx) : 0.0;
    ref += std::exp(s[j] - mx) / sum * dO[(b * n + i) * kModel];
  }
  if (std::abs(ref - dv[(b * n + j) * kModel]) > 1e-4 * (1 + std::abs(ref)))
    state.SkipWithError("the backward's dv differs from a direct sum_i p_ij dO_i");
  setRates(state, 10.0 * kModel * visible.visiblePairs(batch) * state.iterations(), seconds);
}

/// The attention benchmarks (forward, relative forward, generated and runtime backwards) under `prefix`; with an
/// A/B side, the generated kernels alone, from its directory.
void registerAttention(const std::string &prefix, const Side &side) {
  const bool ab = !side.dir.empty();
  for (bool relative : {false, true})
    for (auto [mask, name] : kMasks)
      benchmark::RegisterBenchmark((prefix + (relative ? "attention_rel/" : "attention/") + name).c_str(),
                                   BM_Attention, mask, std::string(name), relative, side)
          ->ArgNames({"n", "batch"})
          ->ArgsProduct({relative ? std::vector<int64_t>{80, 128} : std::vector<int64_t>{20, 80, 128}, {1, 32}});
  for (bool relative : {false, true})
    for (bool generated : {true, false})
      for (auto [mask, name] : kMasks)
        if (generated || !ab)
          benchmark::RegisterBenchmark((prefix + (generated ? "attention_grad" : "attention_grad_rt") +
                                        (relative ? "_rel/" : "/") + name)
                                           .c_str(),
                                       BM_AttentionGrad, mask, std::string(name), generated, relative, side)
              ->ArgNames({"n", "batch"})
              ->ArgsProduct({relative ? std::vector<int64_t>{80, 128} : std::vector<int64_t>{20, 80, 128}, {1, 32}});
}

/// --build-attention DIR: every attention kernel the benchmarks time (forward and backward, each mask, plain and
/// relative), each into DIR/lib<kernel>.so, for a later --attention-ab.
int buildAttention(const std::string &dir) {
  std::filesystem::create_directories(dir);
  int built = 0;
  for (auto [mask, maskName] : kMasks)
    for (const char *kind : {"attention_", "attention_rel_", "attention_grad_", "attention_grad_rel_"}) {
      const std::string name = kind + std::string(maskName);
      mlir::MLIRContext context;
      auto module = buildKernel(context, name);
      const std::string library = dir + "/lib" + name + ".so";
      if (std::string err = module ? lmcc::codegen::emitKernelLibrary(*module, library) : "cannot build " + name;
          !err.empty()) {
        std::fprintf(stderr, "kernel_bench: %s\n", err.c_str());
        return 1;
      }
      ++built;
    }
  std::printf("%s: %d attention kernels\n", dir.c_str(), built);
  return 0;
}

/// The console report, then for --attention-ab each kernel's B / A ratio of the median peak fractions.
class AbReporter : public benchmark::ConsoleReporter {
public:
  AbReporter() : ConsoleReporter(OO_None) {} // no colour codes: the report goes to logs
  void ReportRuns(const std::vector<Run> &runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run &run : runs)
      if (run.aggregate_name == "median" && run.counters.count("peak_frac"))
        medians_[run.run_name.str()] = run.counters.at("peak_frac");
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nB / A (median peak fraction of each side's repetitions, interleaved at random):\n");
    for (const auto &[name, b] : medians_)
      if (name.rfind("B/", 0) == 0)
        if (auto a = medians_.find("A/" + name.substr(2)); a != medians_.end() && a->second > 0)
          std::printf("  %-48s A %.3f  B %.3f  B/A %.3f\n", name.substr(2).c_str(), double(a->second), double(b),
                      double(b) / a->second);
  }

private:
  std::map<std::string, double> medians_;
};

} // namespace

/// One AdamW step (the specs' default [train]: clipping at 1.0 active, weight decay on matrices) over the base
/// models' tensors: the token embedding, three layers of q/k/v/o and the FFN with their biases.
void BM_OptimizerStep(benchmark::State &state) {
  std::vector<lmcc::train::ParamSlot> slots;
  int64_t floats = 0;
  auto add = [&](const std::string &name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    slots.push_back({name, std::move(shape), floats});
    floats += n;
  };
  add("embed", {30522, 512});
  for (int l = 0; l < 3; ++l) {
    const std::string layer = "layers." + std::to_string(l) + ".";
    for (const char *w : {"q", "k", "v", "o"})
      add(layer + w + ".weight", {512, 512}), add(layer + w + ".bias", {512});
    add(layer + "ffn.in.weight", {2048, 512}), add(layer + "ffn.in.bias", {2048});
    add(layer + "ffn.out.weight", {512, 2048}), add(layer + "ffn.out.bias", {512});
  }
  lmcc::train::Optimizer optimizer(lmcc::train::OptimizerConfig{}, slots);
  std::vector<float> params(floats), grads(floats), fresh(floats);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int64_t i = 0; i < floats; ++i)
    params[i] = normal(rng), fresh[i] = normal(rng);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(grads.data(), fresh.data(), sizeof(float) * floats); // step() clips the gradient in place
    state.ResumeTiming();
    optimizer.step(params.data(), grads.data());
  }
  state.counters["GBs"] = benchmark::Counter(double(floats) * 7 * 4 / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if ((mode == "--build-attention" && argc != 3) || (mode == "--attention-ab" && argc < 4)) {
    std::fprintf(stderr, "kernel_bench: usage: kernel_bench --build-attention DIR\n"
                         "       kernel_bench --attention-ab A_DIR B_DIR [benchmark flags]\n");
    return 2;
  }
  if (mode == "--build-attention")
    return buildAttention(argv[2]);
  std::string dirA, dirB;
  std::vector<char *> args(argv, argv + argc);
  if (mode == "--attention-ab") {
    dirA = argv[2], dirB = argv[3];
    // Each side's repetitions interleaved at random with the other's, aggregates only; later flags override.
    static char interleave[] = "--benchmark_enable_random_interleaving=true", reps[] = "--benchmark_repetitions=12",
                aggregates[] = "--benchmark_report_aggregates_only=true";
    args = {argv[0], interleave, reps, aggregates};
    args.insert(args.end(), argv + 4, argv + argc);
  }
#ifdef LMCC_HAVE_OPENBLAS
  openblas_set_num_threads(1); // the GEMM rows compare kernels on one thread (as OPENBLAS_NUM_THREADS=1 would)
#endif
  g_peak = lmcc::bench::measurePeak(g_avx512, /*threads=*/1, /*repetitions=*/3); // 1.3 G FMAs each
  const lmcc::codegen::GemmTile deep = lmcc::codegen::GemmTile::forDepth(g_tile, 1024, lmcc::codegen::hostL1Ways());
  // On stderr: stdout is the benchmark library's report (--benchmark_format=json must parse as JSON).
  std::fprintf(stderr,
               "measured FP32 FMA peak: %.1f GFLOP/s (1 thread, %s); generated GEMM tile %lld x %lld (%lld x %lld at "
               "depths that are a multiple of 1024; L1D %lld-way)\n",
              g_peak, g_avx512 ? "AVX-512" : "AVX2", (long long)g_tile.rows, (long long)g_tile.cols(),
              (long long)deep.rows, (long long)deep.cols(), (long long)lmcc::codegen::hostL1Ways());
  if (!dirA.empty()) {
    registerAttention("A/", {dirA, ""});
    registerAttention("B/", {dirB, dirA});
    int count = int(args.size());
    benchmark::Initialize(&count, args.data());
    AbReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    return 0;
  }
  benchmark::RegisterBenchmark("machine/peak", BM_Peak)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
  benchmark::RegisterBenchmark("machine/read_bw", BM_ReadBandwidth)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
  for (const Shape &s : kShapes) {
    std::string name = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    benchmark::RegisterBenchmark(("gemm/generated/" + name).c_str(), BM_Generated, s);
    benchmark::RegisterBenchmark(("gemm/eigen/" + name).c_str(), BM_Eigen, s);
#ifdef LMCC_HAVE_OPENBLAS
    benchmark::RegisterBenchmark(("gemm/openblas/" + name).c_str(), BM_OpenBLAS, s);
#endif
  }
  registerAttention("", {});
  benchmark::RegisterBenchmark("optimizer/adamw_step", BM_OptimizerStep)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  if (!g_libraryDir.empty() && !std::getenv("LMCC_KERNEL_BENCH_KEEP")) { // the loaded libraries are deleted already
    std::error_code ignored;
    std::filesystem::remove_all(g_libraryDir, ignored);
  }
  return 0;
}
