//===- gemm_ab.cpp - Paired A/B timing of two builds of the generated GEMM ---===//
//
// On a shared host the same GEMM measures 2x apart in processes a minute apart (bench/results/2026-11-29-rounds.md),
// so a 5% change to the GEMM's code generation cannot be judged by two kernel_bench runs. This tool times two
// builds of the generated GEMM in one process, alternately, and compares them round by round:
//
//   gemm_ab build OUT.so [--tile RxC|amx] [--train-any] M K N [M K N ...]
//       compiles this build's generated GEMM (codegen/LmToLoops/Gemm.cpp) for each shape's (N, K), in the register
//       tile lmcc picks for this host and that depth (GemmTile::forDepth) or RxC (rows x columns, e.g. 6x64), or
//       the bf16 AMX kernel (`amx`: weights packed as bf16 pairs; only against another AMX build, on a host with
//       AMX-BF16), into the shared library OUT.so. --train-any: its training GEMM is the run-time depth body alone
//       (lm_train_gemm_any_<tile>: what a model's calls of a depth no call site fixes run, the weight gradients'
//       products of depth = rows), not one specialized for the shapes' depths;
//   gemm_ab compare A.so B.so [--rounds R] [--cold] [--cold-c] [--train] M K N [M K N ...]
//       loads both libraries, packs one random weight per shape with each library's own packer (as at model load),
//       checks that both compute bit-identical C (every element is the same ordered FMA chain whatever the tile,
//       block or chunk: Gemm.h), then times R rounds (default 20), each calling A and B for about 15 ms, the order
//       reversed every other round, and prints per shape: B's speedup over A as the median over rounds of
//       A's time / B's time, the rounds B won, and each one's best and median GFLOP/s. --cold: the packed weight is
//       flushed from every cache level (clflush, untimed) before each call, as in a model call, where the other
//       layers' weights have evicted it (a repeated GEMM otherwise reads its weight from L2/L3). --cold-c: C is
//       flushed likewise before each call, as where a GEMM writes memory the step has not touched since its last
//       one (a weight's gradient, a table of logits), whose lines it must fetch before it can store. --train: times
//       the training GEMM instead (lm_train_gemm_<tile>, lmrt.h's lm_rt_gemm_fn: the depth, strides and panels
//       given at run time, as TrainKernels.cpp calls it) on the same packed weight; the libraries must have been
//       built with one fp32 tile for every shape.
//   gemm_ab init A.so B.so MODEL [--rounds R]
//       loads two libraries of one model compiled by `lmcc compile` (lib<MODEL>.so), runs each one's init kernel
//       (<MODEL>_init_kernel: every GEMM weight packed, the load-time folds) on the same random weights in a 64-byte
//       aligned buffer, as lm_rt_load and the trainer after every step do, R rounds (default 10) in alternating
//       order, and prints each one's best and median time and B's speedup; the two buffers must end bit-identical.
//
// To judge a code generation change: `build` with the old tree's gemm_ab (a git worktree) and with the new one,
// then `compare old.so new.so` with either. A verdict near 1.00x that B won in neither nearly all nor nearly none of
// the rounds is inside the host's noise (two builds of the same code: 0.99-1.05x, 4-7 rounds of 10).
//
//===----------------------------------------------------------------------===//
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Gemm.h"
#include "codegen/LmToLoops/KernelAbi.h"
#include "runtime/lib/lmrt.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace lmcc::codegen::abi;

struct Shape {
  int64_t m, k, n;
  std::string name() const { return std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n); }
};

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "gemm_ab: %s\n", message.c_str());
  std::exit(2);
}

[[noreturn]] void usage() {
  fail("usage: gemm_ab build OUT.so [--tile RxC|amx] [--train-any] M K N [M K N ...]\n"
       "       gemm_ab compare A.so B.so [--rounds R] [--cold] [--cold-c] [--train] M K N [M K N ...]\n"
       "       gemm_ab init A.so B.so MODEL [--rounds R]");
}

int64_t positive(const std::string &text, const char *what) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || errno || v < 1 || v > (int64_t(1) << 24))
    fail(std::string(what) + " '" + text + "' is not an integer in [1, 16777216]");
  return v;
}

std::vector<Shape> shapesOf(const std::vector<std::string> &args) {
  if (args.empty() || args.size() % 3)
    fail("shapes come as M K N triples (got " + std::to_string(args.size()) + " numbers)");
  std::vector<Shape> shapes;
  for (size_t i = 0; i < args.size(); i += 3)
    shapes.push_back({positive(args[i], "M"), positive(args[i + 1], "K"), positive(args[i + 2], "N")});
  return shapes;
}

// The library's functions per (N, K): ab_pack_<N>x<K> (W [N, K] -> packed) and ab_gemm_<N>x<K> (A, packed, C).
std::string suffix(const Shape &s) { return std::to_string(s.n) + "x" + std::to_string(s.k); }

/// `tileOf(k)`: the tile of a weight of depth k.
void build(const std::string &out, const std::function<lmcc::codegen::GemmTile(int64_t)> &tileOf,
           const std::vector<Shape> &shapes, bool trainAny) {
  std::vector<std::pair<int64_t, int64_t>> nk;
  std::vector<lmcc::codegen::GemmTile> tiles;
  for (const Shape &s : shapes) {
    if (std::find(nk.begin(), nk.end(), std::make_pair(s.n, s.k)) == nk.end())
      nk.push_back({s.n, s.k});
    const lmcc::codegen::GemmTile t = tileOf(s.k);
    if (std::none_of(tiles.begin(), tiles.end(), [&](const auto &u) { return u.name() == t.name(); }))
      tiles.push_back(t);
  }
  // The training GEMM specialized for every shape's depth (lda = K, as gemm_ab calls it), each prefetching as the
  // fixed kernel would its widest weight of that depth: what a model's call sites of that depth get. With trainAny,
  // no depth: the run-time depth body alone.
  std::map<int64_t, int64_t> widest;
  for (auto [n, k] : nk)
    widest[k] = std::max(widest[k], n);
  std::vector<lmcc::codegen::TrainGemmDepth> depths;
  for (auto [k, n] : widest)
    if (!trainAny)
      depths.push_back(lmcc::codegen::TrainGemmDepth::forWeight(k, n));
  mlir::MLIRContext context;
  auto module = lmcc::codegen::buildGemmModule(context, nk, tiles, depths, lmcc::codegen::hostL1Ways());
  std::string names;
  for (auto [n, k] : nk) { // tile-independent names, so that libraries of different tiles compare
    const std::string tile = tileOf(k).name(), to = suffix({0, k, n}), from = to + "_" + tile;
    module->lookupSymbol<mlir::func::FuncOp>("lm_bench_pack_" + from).setSymName("ab_pack_" + to);
    module->lookupSymbol<mlir::func::FuncOp>("lm_bench_gemm_" + from).setSymName("ab_gemm_" + to);
    names += " " + to + ":" + tile;
  }
  // Every shape was built in every tile: only the chosen pairs are compiled. The training GEMM (run-time depth and
  // strides, lmrt.h's lm_rt_gemm_fn; specialized for the shapes' depths) is kept as ab_train_gemm, with the private
  // bodies it calls, where one fp32 tile serves every shape.
  const bool oneTrainGemm = tiles.size() == 1 && !tiles[0].bf16();
  for (auto fn : llvm::to_vector(module->getOps<mlir::func::FuncOp>()))
    if (llvm::StringRef name = fn.getSymName(); oneTrainGemm && name == "lm_train_gemm_" + tiles[0].name())
      fn.setSymName("ab_train_gemm");
    else if (name.starts_with("lm_bench_") || (name.starts_with("lm_train_gemm_") && !oneTrainGemm))
      fn.erase();
  if (std::string err = lmcc::codegen::emitKernelLibrary(*module, out); !err.empty())
    fail(err);
  std::printf("%s: %zu GEMM shapes (N x K: tile):%s\n", out.c_str(), nk.size(), names.c_str());
}

/// 2 MB-aligned, advised as huge pages, zeroed: as liblmrt holds weights and activations.
struct Buffer {
  float *data = nullptr;
  explicit Buffer(size_t floats) {
    const size_t huge = size_t(2) << 20, bytes = std::max<size_t>(huge, (floats * 4 + huge - 1) / huge * huge);
    data = static_cast<float *>(std::aligned_alloc(huge, bytes));
    if (!data)
      fail("out of memory");
    ::madvise(data, bytes, MADV_HUGEPAGE);
    std::memset(data, 0, bytes);
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  ~Buffer() { std::free(data); }
};

struct Library {
  void *handle;
  std::string path;
  explicit Library(const std::string &file) : path(file) {
    // dlopen needs a path with a slash to skip the search path.
    std::string p = file.find('/') == std::string::npos ? "./" + file : file;
    if (!(handle = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)))
      fail("cannot load " + file + ": " + ::dlerror());
  }
  /// The function exported as `exported` (fails naming `name`, with `hint`).
  template <typename Fn> Fn lookup(const std::string &exported, const std::string &name, const char *hint) const {
    auto fn = reinterpret_cast<Fn>(::dlsym(handle, exported.c_str()));
    if (!fn)
      fail(path + " has no " + name + " (" + hint + ")");
    return fn;
  }
  /// A function exported under its own name (no _mlir_ciface_ wrapper).
  template <typename Fn> Fn plain(const std::string &name) const {
    return lookup<Fn>(name, name, "built with one fp32 tile for every shape?");
  }
  template <typename Fn> Fn symbol(const std::string &name) const {
    return lookup<Fn>("_mlir_ciface_" + name, name, "build it with the same shapes");
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

/// Evicts [p, p + bytes) from every cache level (clflush: every x86-64 CPU has it; clflushopt would SIGILL on
/// the older ones, and the flush is not timed).
void flush(const void *p, size_t bytes) {
  const char *c = static_cast<const char *>(p);
  for (size_t i = 0; i < bytes; i += 64)
    _mm_clflush(c + i);
  _mm_mfence();
}

void compare(const Library &a, const Library &b, int rounds, bool cold, bool coldC, bool train,
             const std::vector<Shape> &shapes) {
  for (const Shape &s : shapes) // every function present before any timing
    for (const Library *l : {&a, &b})
      l->symbol<PackFn>("ab_pack_" + suffix(s)), l->symbol<GemmFn>("ab_gemm_" + suffix(s));
  if (train)
    a.plain<lm_rt_gemm_fn>("ab_train_gemm"), b.plain<lm_rt_gemm_fn>("ab_train_gemm");
  std::printf("B = %s over A = %s, %d rounds%s%s%s\n", b.path.c_str(), a.path.c_str(), rounds,
              cold ? ", the weight flushed from the caches before each call" : "",
              coldC ? ", C flushed from the caches before each call" : "",
              train ? ", the training GEMM (run-time depth and strides)" : "");
  std::printf("%-18s %-9s %-9s %-8s %-11s %-11s %-11s %-11s\n", "M x K x N", "identical", "speedup", "B won",
              "A best", "A median", "B best", "B median");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape &s : shapes) {
    const int64_t rows = lmcc::codegen::packedRows(s.n, s.k);
    std::vector<float> w(size_t(s.n) * s.k);
    for (float &x : w)
      x = u(rng);
    Buffer in(size_t(s.m) * s.k), packedA(rows * lmcc::codegen::kPanel), packedB(rows * lmcc::codegen::kPanel),
        outA(size_t(s.m) * s.n), outB(size_t(s.m) * s.n);
    for (int64_t i = 0; i < s.m * s.k; ++i)
      in.data[i] = u(rng);
    MemRef<2> wm = view(w.data(), s.n, s.k), am = view(in.data, s.m, s.k);
    MemRef<2> pa = view(packedA.data, rows, lmcc::codegen::kPanel), pb = view(packedB.data, rows, lmcc::codegen::kPanel);
    MemRef<2> ca = view(outA.data, s.m, s.n), cb = view(outB.data, s.m, s.n);
    a.symbol<PackFn>("ab_pack_" + suffix(s))(&wm, &pa);
    b.symbol<PackFn>("ab_pack_" + suffix(s))(&wm, &pb);
    // One call of a library's GEMM (the model's, or with --train the training GEMM on the same operands).
    auto caller = [&](const Library &l) -> std::function<void(MemRef<2> *, MemRef<2> *)> {
      if (!train)
        return [&am, gemm = l.symbol<GemmFn>("ab_gemm_" + suffix(s))](MemRef<2> *p, MemRef<2> *c) { gemm(&am, p, c); };
      const int64_t panels = (s.n + lmcc::codegen::kPanel - 1) / lmcc::codegen::kPanel;
      return [&am, s, panels, gemm = l.plain<lm_rt_gemm_fn>("ab_train_gemm")](MemRef<2> *p, MemRef<2> *c) {
        gemm(am.aligned, s.k, s.m, s.k, p->aligned, c->aligned, s.n, s.n, 0, panels, 0);
      };
    };
    auto gemmA = caller(a), gemmB = caller(b);
    gemmA(&pa, &ca);
    gemmB(&pb, &cb);
    const bool identical = std::memcmp(outA.data, outB.data, size_t(s.m) * s.n * 4) == 0;
    // Where both pack alike (the same tile), both read the same packed weight and write the same C: the pages under
    // a buffer (huge or not, their cache sets) then cannot favour one side (two processes' paired ratios of one
    // shape differed by up to 7% with a buffer per side).
    if (std::memcmp(packedA.data, packedB.data, size_t(rows) * lmcc::codegen::kPanel * 4) == 0)
      pb = pa, cb = ca;
    const double flops = 2.0 * s.m * s.k * s.n;
    const int reps = std::max(1, int(2e9 / flops)); // about 15 ms at 130 GFLOP/s
    const size_t packedBytes = size_t(rows) * lmcc::codegen::kPanel * 4;
    auto seconds = [&](const std::function<void(MemRef<2> *, MemRef<2> *)> &gemm, MemRef<2> *p, MemRef<2> *c) {
      if (!cold && !coldC) {
        auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r)
          gemm(p, c);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
      }
      double total = 0;
      for (int r = 0; r < reps; ++r) {
        if (cold)
          flush(p->aligned, packedBytes);
        if (coldC)
          flush(c->aligned, size_t(s.m) * s.n * 4);
        auto start = std::chrono::steady_clock::now();
        gemm(p, c);
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      return total / reps;
    };
    std::vector<double> ta, tb, ratios;
    int won = 0;
    for (int r = 0; r < rounds; ++r) {
      double x, y;
      if (r % 2) {
        y = seconds(gemmB, &pb, &cb);
        x = seconds(gemmA, &pa, &ca);
      } else {
        x = seconds(gemmA, &pa, &ca);
        y = seconds(gemmB, &pb, &cb);
      }
      ta.push_back(x), tb.push_back(y), ratios.push_back(x / y);
      won += y < x;
    }
    auto rate = [&](double t) { return flops / t / 1e9; };
    std::printf("%-18s %-9s %-9s %-8s %-11.1f %-11.1f %-11.1f %-11.1f\n", s.name().c_str(), identical ? "yes" : "NO",
                (std::to_string(median(ratios)).substr(0, 5) + "x").c_str(),
                (std::to_string(won) + "/" + std::to_string(rounds)).c_str(),
                rate(*std::min_element(ta.begin(), ta.end())), rate(median(ta)),
                rate(*std::min_element(tb.begin(), tb.end())), rate(median(tb)));
    std::fflush(stdout);
    if (!identical)
      fail(s.name() + ": the two builds' results differ (a change of the FMA order is not exact)");
  }
}

/// gemm_ab init: the init kernels of two libraries of `model`, alternately, on the same weights.
void compareInit(const Library &a, const Library &b, const std::string &model, int rounds) {
  const Library *libs[2] = {&a, &b};
  const lm_model_desc *desc[2];
  for (int s = 0; s < 2; ++s) {
    desc[s] = libs[s]->lookup<const lm_model_desc *(*)()>(model + "_descriptor", model + "_descriptor",
                                                          "a library of this model, from lmcc compile")();
    if (!desc[s]->init)
      fail(libs[s]->path + ": model " + model + " has no init kernel (nothing is packed or folded at load time)");
  }
  if (desc[0]->total_floats != desc[1]->total_floats)
    fail("the two libraries lay out " + std::to_string(desc[0]->total_floats) + " and " +
         std::to_string(desc[1]->total_floats) + " floats of weights: not the same model");
  const int64_t n = desc[0]->total_floats;
  Buffer w0{size_t(n)}, w1{size_t(n)};
  float *w[2] = {w0.data, w1.data};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < n; ++i)
    w[0][i] = u(rng);
  std::memcpy(w[1], w[0], size_t(n) * 4);
  std::vector<double> ms[2], ratios;
  int won = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int s = r % 2 ? 1 - k : k;
      lm_memref1f m{w[s], w[s], 0, {n}, {1}};
      const auto t0 = std::chrono::steady_clock::now();
      desc[s]->init(&m);
      ms[s].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ratios.push_back(ms[0].back() / ms[1].back());
    won += ms[1].back() < ms[0].back();
  }
  std::printf("%s init (%lld floats of weights): A best %.2f ms median %.2f ms, B best %.2f ms median %.2f ms; "
              "B %.2fx, %d/%d rounds\n",
              model.c_str(), static_cast<long long>(n), *std::min_element(ms[0].begin(), ms[0].end()), median(ms[0]),
              *std::min_element(ms[1].begin(), ms[1].end()), median(ms[1]), median(ratios), won, rounds);
  if (std::memcmp(w[0], w[1], size_t(n) * 4) != 0)
    fail(model + ": the two init kernels' buffers differ");
  std::printf("identical buffers\n");
}

} // namespace

int run(const std::vector<std::string> &args);

int main(int argc, char **argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::bad_alloc &) {
    fail("out of memory for these shapes");
  }
}

int run(const std::vector<std::string> &args) {
  if (args.size() < 2)
    usage();
  const std::string mode = args[0];
  if (mode == "build") {
    const std::string out = args[1];
    auto tile = lmcc::codegen::GemmTile::forVectorBits(lmcc::codegen::targetVectorBits(""));
    std::function<lmcc::codegen::GemmTile(int64_t)> tileOf = [tile](int64_t k) {
      return lmcc::codegen::GemmTile::forDepth(tile, k, lmcc::codegen::hostL1Ways());
    };
    std::vector<std::string> rest(args.begin() + 2, args.end());
    if (rest.size() >= 2 && rest[0] == "--tile" && rest[1] == "amx") {
      if (!lmcc::codegen::targetHasAmx(""))
        fail("--tile amx: this host has no AMX-BF16");
      tile = lmcc::codegen::GemmTile::forTarget(512, /*bf16=*/true, /*hasBf16Dot=*/true, /*hasAmx=*/true);
      tileOf = [tile](int64_t) { return tile; };
      rest.erase(rest.begin(), rest.begin() + 2);
    } else if (rest.size() >= 2 && rest[0] == "--tile") {
      const std::string t = rest[1];
      const size_t x = t.find('x');
      if (x == std::string::npos)
        fail("--tile '" + t + "' is not RxC (rows x columns, e.g. 12x32)");
      const int64_t r = positive(t.substr(0, x), "--tile rows"), c = positive(t.substr(x + 1), "--tile columns");
      if (c % tile.lanes || lmcc::codegen::kPanel % c || r * (c / tile.lanes) > 28)
        fail("--tile " + t + ": columns must be a multiple of " + std::to_string(tile.lanes) + " dividing " +
             std::to_string(lmcc::codegen::kPanel) + ", and rows x vectors at most 28 accumulators");
      tile.rows = r, tile.vectors = c / tile.lanes;
      tileOf = [tile](int64_t) { return tile; };
      rest.erase(rest.begin(), rest.begin() + 2);
    }
    const bool trainAny = !rest.empty() && rest[0] == "--train-any";
    if (trainAny)
      rest.erase(rest.begin());
    build(out, tileOf, shapesOf(rest), trainAny);
  } else if (mode == "compare") {
    if (args.size() < 3)
      usage();
    Library a(args[1]), b(args[2]);
    lm_rt_request_amx(); // AMX builds need the tile state; harmless without them
    std::vector<std::string> rest(args.begin() + 3, args.end());
    int rounds = 20;
    bool cold = false, coldC = false, train = false;
    for (bool more = true; more;) {
      more = false;
      if (rest.size() >= 2 && rest[0] == "--rounds") {
        rounds = int(std::min<int64_t>(positive(rest[1], "--rounds"), 1000));
        rest.erase(rest.begin(), rest.begin() + 2), more = true;
      } else if (!rest.empty() && rest[0] == "--cold") {
        cold = true;
        rest.erase(rest.begin()), more = true;
      } else if (!rest.empty() && rest[0] == "--cold-c") {
        coldC = true;
        rest.erase(rest.begin()), more = true;
      } else if (!rest.empty() && rest[0] == "--train") {
        train = true;
        rest.erase(rest.begin()), more = true;
      }
    }
    compare(a, b, rounds, cold, coldC, train, shapesOf(rest));
  } else if (mode == "init") {
    if (args.size() != 4 && !(args.size() == 6 && args[4] == "--rounds"))
      usage();
    Library a(args[1]), b(args[2]);
    compareInit(a, b, args[3], args.size() == 6 ? int(std::min<int64_t>(positive(args[5], "--rounds"), 1000)) : 10);
  } else {
    usage();
  }
  return 0;
}
