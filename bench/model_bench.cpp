//===- model_bench.cpp - Entry points of generated libraries, end to end -----===//
//
// Times <name>_score / <name>_embed of libraries made by `lmcc compile`, the way an
// application calls them (through liblmrt: argument checks, chunking, threads), on the
// token ids of a file. What to run comes from a plan file, one benchmark per line:
//
//   BENCH_NAME LIBRARY MODEL WEIGHTS ENTRY IDS THREADS OUTPUT
//
//   LIBRARY  path of lib<MODEL>.so (its directory holds the liblmrt.so it links)
//   ENTRY    score | embed
//   IDS      B lines of space-separated token ids (the batch of one call)
//   OUTPUT   file receiving the result of the first call ('-': none): one line per
//            sentence, the score (score) or the embedding (embed), "%.9g"
//
// scripts/bench.sh writes the plan (bench/run.py), compares OUTPUT with the peers'
// results and turns the JSON report into bench/results/. Run by hand:
//   build/bench/model_bench --plan PLAN --benchmark_min_time=0.5 --benchmark_format=json
//
// --perf-ctl FIFO writes "enable" to FIFO once a benchmark's model is loaded and warmed
// up, before its timed calls: under `perf record -D -1 --control fifo:FIFO` the profile
// holds the timed calls only, not the loading of the weights (bench/run.py profiles the
// report's gap entries this way).
//
// A/B mode: two libraries of one model (two lmcc builds, or two sets of flags), or one
// library at two thread counts, called alternately in one process:
//   build/bench/model_bench --ab LIB_A LIB_B MODEL WEIGHTS score|embed IDS THREADS_A THREADS_B [ROUNDS]
// says whether both give bit-identical results (one pipeline at two thread counts or built
// by two lmcc versions should; --naive and the optimized pipeline round differently: then the
// largest difference), then times ROUNDS rounds (default 16), each calling A and B for about
// 0.2 s, the order reversed every other round, and prints B's speedup over A: the median of
// the per-round ratios, with the rounds B won; then every round's times and ratio with the round trip
// of a cache line between the process's first two CPUs before and after it (-1: one CPU), which says
// whether a 2-thread side's threads shared a last-level cache (CoreLatency.h). On a shared host, model_bench processes a
// minute apart differ by more than the few percent a change is worth (2026-11-30: a runtime
// change read 1.03-1.13x faster in alternating processes, 0.99-1.01x alternating calls in
// one). Both libraries run under the first one's liblmrt.so (a process loads one): their
// runtime ABI must be the same (lm_rt_check_abi says so at load).
//
//===----------------------------------------------------------------------===//
#include "CoreLatency.h"
#include "lmrt.h"

#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string perfControl; ///< --perf-ctl: perf's control FIFO, or empty

struct Plan {
  std::string name, library, model, weights, entry, ids, output;
  int threads = 1;
};

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "model_bench: %s\n", message.c_str());
  std::exit(1);
}

std::vector<Plan> readPlan(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    fail("cannot read plan file " + path);
  std::vector<Plan> plans;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream fields(line);
    Plan p;
    if (!(fields >> p.name >> p.library >> p.model >> p.weights >> p.entry >> p.ids >> p.threads >> p.output) ||
        (p.entry != "score" && p.entry != "embed") || p.threads < 1)
      fail(path + ":" + std::to_string(number) +
           ": expected 'NAME LIBRARY MODEL WEIGHTS score|embed IDS THREADS OUTPUT'");
    plans.push_back(p);
  }
  return plans;
}

/// The runtime functions, looked up through the generated library (which exports the
/// forwarders and links its own liblmrt.so).
struct Library {
  void *handle = nullptr;
  const lm_model_desc *desc = nullptr;
  int (*load)(const lm_model_desc *, const char *, lm_model **) = nullptr;
  int (*score)(lm_model *, const int32_t *, const int32_t *, int32_t, int32_t, float *, float *) = nullptr;
  int (*embed)(lm_model *, const int32_t *, const int32_t *, int32_t, int32_t, float *) = nullptr;
  void (*free)(lm_model *) = nullptr;
  const char *(*lastError)() = nullptr;
  int (*setThreads)(int) = nullptr;
};

template <typename Fn> void find(void *handle, const std::string &name, Fn &fn) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name.c_str()));
  if (!fn)
    fail("symbol " + name + " not found: " + ::dlerror());
}

Library &open(const Plan &p) {
  static std::map<std::string, Library> libraries;
  auto [it, fresh] = libraries.try_emplace(p.library);
  Library &lib = it->second;
  if (!fresh)
    return lib;
  if (!(lib.handle = ::dlopen(p.library.c_str(), RTLD_NOW | RTLD_LOCAL)))
    fail(std::string("cannot load ") + ::dlerror());
  const lm_model_desc *(*descriptor)() = nullptr;
  find(lib.handle, p.model + "_descriptor", descriptor);
  lib.desc = descriptor();
  find(lib.handle, "lm_rt_load", lib.load);
  find(lib.handle, "lm_rt_score", lib.score);
  find(lib.handle, "lm_rt_embed", lib.embed);
  find(lib.handle, "lm_rt_free", lib.free);
  find(lib.handle, "lm_last_error", lib.lastError);
  find(lib.handle, "lm_set_num_threads", lib.setThreads);
  return lib;
}

/// One loaded model at a time (the paper-size weights are 120-440 MB): consecutive
/// benchmarks of the same library and weights share it.
lm_model *loadModel(const Plan &p, Library &lib) {
  static std::string key;
  static lm_model *model = nullptr;
  static Library *owner = nullptr;
  if (model && key == p.library + "\n" + p.weights)
    return model;
  if (model)
    owner->free(model);
  model = nullptr;
  if (lib.load(lib.desc, p.weights.c_str(), &model) != LM_OK)
    fail(p.library + ": cannot load " + p.weights + ": " + lib.lastError());
  key = p.library + "\n" + p.weights;
  owner = &lib;
  return model;
}

struct Batch {
  std::vector<int32_t> ids, lengths;
  int32_t stride = 0;
};

Batch readIds(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    fail("cannot read ids file " + path);
  std::vector<std::vector<int32_t>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<int32_t> row;
    for (int32_t id; fields >> id;)
      row.push_back(id);
    if (!row.empty())
      rows.push_back(row);
  }
  if (rows.empty())
    fail(path + ": no sentences");
  Batch b;
  for (auto &r : rows)
    b.stride = std::max<int32_t>(b.stride, int32_t(r.size()));
  for (auto &r : rows) {
    b.lengths.push_back(int32_t(r.size()));
    r.resize(b.stride, 0);
    b.ids.insert(b.ids.end(), r.begin(), r.end());
  }
  return b;
}

void BM_Entry(benchmark::State &state, Plan p) {
  Library &lib = open(p);
  lm_model *model = loadModel(p, lib);
  Batch batch = readIds(p.ids);
  auto rows = int32_t(batch.lengths.size());
  std::vector<float> logprobs(size_t(rows) * batch.stride), scores(rows), embeddings(size_t(rows) * lib.desc->d_model);
  lib.setThreads(p.threads);
  auto call = [&] {
    return p.entry == "score"
               ? lib.score(model, batch.ids.data(), batch.lengths.data(), rows, batch.stride, logprobs.data(),
                           scores.data())
               : lib.embed(model, batch.ids.data(), batch.lengths.data(), rows, batch.stride, embeddings.data());
  };
  if (call() != LM_OK) { // warm-up: the workspace cache fills here
    state.SkipWithError((std::string("call failed: ") + lib.lastError()).c_str());
    return;
  }
  if (p.output != "-") {
    std::FILE *out = std::fopen(p.output.c_str(), "w");
    if (!out)
      fail("cannot write " + p.output);
    for (int32_t r = 0; r < rows; ++r) {
      if (p.entry == "score")
        std::fprintf(out, "%.9g\n", scores[r]);
      else
        for (int64_t e = 0; e < lib.desc->d_model; ++e)
          std::fprintf(out, "%.9g%c", embeddings[r * lib.desc->d_model + e], e + 1 == lib.desc->d_model ? '\n' : ' ');
    }
    std::fclose(out);
  }
  if (!perfControl.empty()) { // every benchmark run enables it: enabling twice is harmless
    std::FILE *ctl = std::fopen(perfControl.c_str(), "w");
    if (!ctl || std::fputs("enable\n", ctl) < 0 || std::fclose(ctl) != 0)
      fail("cannot write to the perf control FIFO " + perfControl);
  }
  for (auto _ : state)
    if (call() != LM_OK) {
      state.SkipWithError((std::string("call failed: ") + lib.lastError()).c_str());
      break;
    }
  state.counters["sentences"] = benchmark::Counter(double(rows) * state.iterations(), benchmark::Counter::kIsRate);
}

/// --ab: see the header. Both models stay loaded; every call's results are compared with its side's first.
int runAb(const std::vector<std::string> &args) {
  if (args.size() < 8 || args.size() > 9 || (args[4] != "score" && args[4] != "embed"))
    fail("usage: model_bench --ab LIB_A LIB_B MODEL WEIGHTS score|embed IDS THREADS_A THREADS_B [ROUNDS]");
  auto positive = [](const std::string &text, const char *what) {
    char *end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end || v < 1 || v > 4096)
      fail(std::string(what) + " '" + text + "' is not an integer in [1, 4096]");
    return int(v);
  };
  const int threads[2] = {positive(args[6], "THREADS_A"), positive(args[7], "THREADS_B")};
  const int rounds = args.size() == 9 ? positive(args[8], "ROUNDS") : 16;
  const bool score = args[4] == "score";
  Plan plans[2];
  Library *libs[2];
  lm_model *models[2];
  Batch batch = readIds(args[5]);
  const auto rows = int32_t(batch.lengths.size());
  std::vector<float> results[2];
  for (int s = 0; s < 2; ++s) {
    plans[s].library = args[s], plans[s].model = args[2], plans[s].weights = args[3];
    libs[s] = &open(plans[s]);
    if (libs[s]->load(libs[s]->desc, args[3].c_str(), &models[s]) != LM_OK)
      fail(args[s] + ": cannot load " + args[3] + ": " + libs[s]->lastError());
  }
  if (libs[0]->desc->d_model != libs[1]->desc->d_model || libs[0]->desc->vocab != libs[1]->desc->vocab)
    fail(args[0] + " and " + args[1] + " are not libraries of one model (d_model or vocabulary differ)");
  std::vector<float> logprobs(size_t(rows) * batch.stride), out(score ? rows : size_t(rows) * libs[0]->desc->d_model);
  auto call = [&](int s) {
    libs[s]->setThreads(threads[s]);
    const int status = score ? libs[s]->score(models[s], batch.ids.data(), batch.lengths.data(), rows, batch.stride,
                                              logprobs.data(), out.data())
                             : libs[s]->embed(models[s], batch.ids.data(), batch.lengths.data(), rows, batch.stride,
                                              out.data());
    if (status != LM_OK)
      fail(args[s] + ": call failed: " + libs[s]->lastError());
    if (score) // the token log-probabilities too
      out.insert(out.end(), logprobs.begin(), logprobs.end());
    if (results[s].empty())
      results[s] = out;
    else if (out != results[s])
      fail(args[s] + ": two calls on the same ids gave different results");
    out.resize(score ? rows : size_t(rows) * libs[0]->desc->d_model);
  };
  using Clock = std::chrono::steady_clock;
  double first = 0;
  for (int s = 0; s < 2; ++s) { // warm-up (the workspace cache fills), and how many calls make 0.2 s
    auto start = Clock::now();
    call(s);
    first = std::max(first, std::chrono::duration<double>(Clock::now() - start).count());
  }
  const bool identical = results[0] == results[1];
  double diff = 0;
  for (size_t i = 0; i < results[0].size(); ++i)
    diff = std::max(diff, double(std::fabs(results[0][i] - results[1][i])));
  const int calls = std::max(1, int(0.2 / std::max(first, 1e-6)));
  std::vector<double> times[2], ratios;
  // The CPUs' round trip before the first round and after every round (CoreLatency.h): where the threads of a
  // round sat, for the rounds' lines below.
  std::vector<double> trips{lmcc::bench::coreRoundTripNs()};
  int won = 0;
  for (int r = 0; r < rounds; ++r) {
    double t[2];
    for (int k = 0; k < 2; ++k) {
      const int s = r % 2 ? 1 - k : k;
      auto start = Clock::now();
      for (int c = 0; c < calls; ++c)
        call(s);
      t[s] = std::chrono::duration<double>(Clock::now() - start).count() / calls;
      times[s].push_back(t[s]);
    }
    ratios.push_back(t[0] / t[1]);
    won += t[1] < t[0];
    trips.push_back(lmcc::bench::coreRoundTripNs());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("B = %s (%d threads) over A = %s (%d threads): %s of %d sentences (%s), %d rounds of %d calls\n",
              args[1].c_str(), threads[1], args[0].c_str(), threads[0], args[4].c_str(), rows, args[5].c_str(),
              rounds, calls);
  char same[64];
  std::snprintf(same, sizeof same, identical ? "bit-identical" : "max |A - B| %.3g", diff);
  std::printf("%s  speedup %.3fx  B won %d/%d  A median %.3f ms  B median %.3f ms\n", same, median(ratios), won,
              rounds, median(times[0]) * 1e3, median(times[1]) * 1e3);
  for (int r = 0; r < rounds; ++r)
    std::printf("round %d: A %.3f ms  B %.3f ms  speedup %.3fx  cpu round trip %.0f / %.0f ns\n", r + 1,
                times[0][size_t(r)] * 1e3, times[1][size_t(r)] * 1e3, ratios[size_t(r)], trips[size_t(r)],
                trips[size_t(r) + 1]);
  for (int s = 0; s < 2; ++s)
    libs[s]->free(models[s]);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--ab")
    return runAb(std::vector<std::string>(argv + 2, argv + argc));
  std::string planPath;
  std::vector<char *> rest;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--plan=", 0) == 0)
      planPath = arg.substr(7);
    else if (arg == "--plan" && i + 1 < argc)
      planPath = argv[++i];
    else if (arg.rfind("--perf-ctl=", 0) == 0)
      perfControl = arg.substr(11);
    else if (arg == "--perf-ctl" && i + 1 < argc)
      perfControl = argv[++i];
    else
      rest.push_back(argv[i]);
  }
  if (planPath.empty())
    fail("usage: model_bench --plan FILE [--perf-ctl FIFO] [benchmark flags]");
  for (const Plan &p : readPlan(planPath))
    benchmark::RegisterBenchmark(p.name.c_str(), BM_Entry, p)->UseRealTime()->Unit(benchmark::kMillisecond);
  int restCount = int(rest.size());
  benchmark::Initialize(&restCount, rest.data());
  if (benchmark::ReportUnrecognizedArguments(restCount, rest.data()))
    return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
