//===- train_bench.cpp - Compiled training steps: time, throughput, memory ---===//
//
// Times `lm_rt_train_step_ex` of a library compiled with `lmcc compile --train` (issue 14) on a
// fixed random batch, the way an application calls it (dlopen, through liblmrt):
//
//   train_bench --spec SPEC [--lib DIR] [--weights W] --batch B --n N [--threads T] [--steps S]
//               [--seed K] [--lmcc PATH] [--flops F] [--peak-gflops G] [--dump-batch FILE]
//
//   --lib DIR      a directory written by `lmcc compile SPEC --train -o DIR` (holding lib<name>.so);
//                  when it has no lib<name>.so, `lmcc compile SPEC --train -o DIR` is run first.
//                  Default: ./train-bench-<name>.
//   --weights W    canonical safetensors; default DIR/init.safetensors, made by
//                  `lmcc init SPEC --seed 1 -o DIR/init.safetensors` when missing.
//   --lmcc PATH    default: ../bin/lmcc next to this executable (build/bench -> build/bin).
//   --flops F      train FLOPs of one step; default: `lmcc compile SPEC --stats --n N --train`, whose
//                  `train: flops=` line is per sentence at batch 1, times B, less the loss head's 8 x d_model x
//                  vocab FLOPs (forward, recomputed logits, dh, dW) of every row without a target for the
//                  causal, masked and autoencoding objectives (--stats counts the head on every row; the
//                  compiled step runs it on target rows only: the masked objective trains about 15% of them;
//                  bench/train_grid.py's useful_flops, which the training grid applies to a given --flops).
//   --peak-gflops G  the machine's FP32 FMA peak at T threads; default: measured here (independent
//                  FMA chains, AVX-512 where the CPU has it, else AVX2; best of three; T threads at once).
//   --peak-only    prints {"threads":T,"peak_gflops":G,"peak_isa":...} (the measurement above) and exits.
//   --breakdown    after the timed steps, also times lm_rt_loss (forward only) and lm_rt_loss_and_grad
//                  (forward + backward, no optimizer), best of two each: fields loss_ms, grad_ms.
//   --dump-batch FILE  writes the batch as {"inputs":[[...]],"targets":[[...]]} (what lmcc grad and
//                  bench/train_peers.py read), so that a peer trains on exactly the same batch.
//
// The batch: B sentences of exactly N tokens, bos, N-2 ids drawn uniformly (std::mt19937, --seed,
// default 7) from the vocabulary minus the special ids (pad, eos, unk, bos, mask), eos; turned into
// inputs/targets by the spec's objective (lmcc::train::makeExamples, step 0). The same batch is fed
// to every step. One warm-up step, then S timed steps (wall time of each call).
//
// Prints one JSON line: ms_per_step (median), spread_pct (population standard deviation / median),
// min_ms, max_ms, steps_per_s, tokens_per_s (B*N per median step), peak_rss_mb (getrusage
// ru_maxrss of this process; child processes are not counted), train_flops_per_step, gflops,
// peak_gflops, roofline_fraction (achieved GFLOP/s / peak), first_loss (the warm-up step's loss,
// on the initial weights) and last_loss.
//
//===----------------------------------------------------------------------===//
#include "lmrt.h"

#include "bench/Peak.h"
#include "frontend/Spec.h"
#include "runtime/train/Objectives.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "train_bench: %s\n", message.c_str());
  std::exit(1);
}

struct Args {
  std::string spec, lib, weights, lmcc, dumpBatch;
  int64_t batch = 0, n = 0, threads = 1, steps = 5, seed = 7;
  double flops = 0, peak = 0;
  bool peakOnly = false, breakdown = false;
};

Args parse(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        fail(k + " needs a value");
      return argv[++i];
    };
    auto integer = [&]() -> int64_t {
      std::string v = value();
      char *end = nullptr;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end)
        fail(k + ": not an integer: " + v);
      return x;
    };
    if (k == "--spec") a.spec = value();
    else if (k == "--lib") a.lib = value();
    else if (k == "--weights") a.weights = value();
    else if (k == "--lmcc") a.lmcc = value();
    else if (k == "--dump-batch") a.dumpBatch = value();
    else if (k == "--batch") a.batch = integer();
    else if (k == "--n") a.n = integer();
    else if (k == "--threads") a.threads = integer();
    else if (k == "--steps") a.steps = integer();
    else if (k == "--seed") a.seed = integer();
    else if (k == "--flops") a.flops = std::atof(value().c_str());
    else if (k == "--peak-gflops") a.peak = std::atof(value().c_str());
    else if (k == "--peak-only") a.peakOnly = true;
    else if (k == "--breakdown") a.breakdown = true;
    else fail("unknown argument " + k + " (see the comment at the top of bench/train_bench.cpp)");
  }
  if (a.peakOnly)
    return a;
  if (a.spec.empty() || a.batch < 1 || a.n < 2 || a.threads < 1 || a.steps < 1)
    fail("usage: train_bench --spec SPEC [--lib DIR] [--weights W] --batch B --n N (>= 2) [--threads T] "
         "[--steps S] [--seed K] [--lmcc PATH] [--flops F] [--peak-gflops G] [--dump-batch FILE]");
  return a;
}

std::string quote(const std::string &s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Runs a shell command; returns its stdout, fails on a non-zero exit.
std::string run(const std::string &command) {
  FILE *p = ::popen(command.c_str(), "r");
  if (!p)
    fail("cannot run " + command);
  std::string out;
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, p)) > 0;)
    out.append(buf, got);
  if (int rc = ::pclose(p); rc != 0)
    fail("command failed (" + std::to_string(rc) + "): " + command + "\n" + out);
  return out;
}

/// GFLOP/s of `threads` threads running the FMA loop at once (bench/Peak.h, best of three).
double measurePeak(int threads, std::string *isa) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  *isa = avx512 ? "avx512" : "avx2";
  return lmcc::bench::measurePeak(avx512, threads, 3);
}

// --- The library ---------------------------------------------------------------------------------

struct Runtime {
  const lm_model_desc *desc = nullptr;
  int (*load)(const lm_model_desc *, const char *, lm_model **) = nullptr;
  int (*trainerNew)(lm_model *, lm_trainer **) = nullptr;
  int (*step)(lm_trainer *, const int32_t *, const int32_t *, const int32_t *, int32_t, int32_t, float *, double *,
              double *) = nullptr;
  void (*trainerFree)(lm_trainer *) = nullptr;
  void (*modelFree)(lm_model *) = nullptr;
  const char *(*lastError)() = nullptr;
  int (*setThreads)(int) = nullptr;
  int64_t (*numParams)(const lm_model_desc *) = nullptr;
  int (*loss)(lm_model *, const int32_t *, const int32_t *, const int32_t *, int32_t, int32_t, float *,
              int64_t *) = nullptr;
  int (*lossAndGrad)(lm_model *, const int32_t *, const int32_t *, const int32_t *, int32_t, int32_t, float *,
                     float *) = nullptr;
};

template <typename Fn> void find(void *handle, const std::string &name, Fn &fn) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name.c_str()));
  if (!fn)
    fail("symbol " + name + " not found: " + ::dlerror());
}

std::string objectiveName(lmcc::Objective o) {
  switch (o) {
  case lmcc::Objective::Causal: return "causal";
  case lmcc::Objective::Masked: return "masked";
  case lmcc::Objective::Autoencoding: return "autoencoding";
  default: return "auto";
  }
}

} // namespace

int main(int argc, char **argv) {
  Args a = parse(argc, argv);
  if (a.peakOnly) { // just the machine's FP32 FMA peak at --threads
    std::string isa;
    double peak = measurePeak(int(a.threads), &isa);
    std::printf("{\"threads\":%lld,\"peak_gflops\":%.4g,\"peak_isa\":\"%s\"}\n", (long long)a.threads, peak,
                isa.c_str());
    return 0;
  }
  lmcc::ModelSpec spec;
  try {
    spec = lmcc::loadSpec(a.spec);
  } catch (const std::exception &e) {
    fail(e.what());
  }
  if (a.n > spec.dims.maxLen)
    fail("--n " + std::to_string(a.n) + " exceeds max_len " + std::to_string(spec.dims.maxLen));
  if (a.lmcc.empty())
    a.lmcc = (fs::canonical("/proc/self/exe").parent_path().parent_path() / "bin" / "lmcc").string();
  if (a.lib.empty())
    a.lib = "train-bench-" + spec.name;
  fs::path libPath = fs::path(a.lib) / ("lib" + spec.name + ".so");
  if (!fs::exists(libPath)) {
    std::fprintf(stderr, "train_bench: compiling %s with --train into %s\n", a.spec.c_str(), a.lib.c_str());
    run(quote(a.lmcc) + " compile " + quote(a.spec) + " --train -o " + quote(a.lib) + " 2>&1");
  }
  if (a.weights.empty()) {
    a.weights = (fs::path(a.lib) / "init.safetensors").string();
    if (!fs::exists(a.weights))
      run(quote(a.lmcc) + " init " + quote(a.spec) + " --seed 1 -o " + quote(a.weights) + " 2>&1");
  }
  const bool statsFlops = a.flops <= 0;
  if (statsFlops) {
    std::string out = run(quote(a.lmcc) + " compile " + quote(a.spec) + " --stats --n " + std::to_string(a.n) +
                          " --train 2>&1");
    size_t at = out.find("train: flops=");
    if (at == std::string::npos)
      fail("no 'train: flops=' line in the output of lmcc compile --stats --train:\n" + out);
    a.flops = std::atof(out.c_str() + at + 13) * double(a.batch);
  }
  std::string isa = "given";
  if (a.peak <= 0)
    a.peak = measurePeak(int(a.threads), &isa);

  // The batch: B random sentences of exactly n tokens, then the spec's objective.
  const auto &tok = spec.tokens;
  std::vector<int32_t> ordinary;
  for (int64_t id = 0; id < spec.dims.vocab; ++id)
    if (id != tok.pad && id != tok.eos && id != tok.unk && id != tok.bos && id != tok.mask)
      ordinary.push_back(int32_t(id));
  std::mt19937 rng(uint32_t(a.seed));
  std::uniform_int_distribution<size_t> pick(0, ordinary.size() - 1);
  std::vector<std::vector<int32_t>> sentences(a.batch);
  for (auto &x : sentences) {
    x.push_back(int32_t(tok.bos));
    for (int64_t i = 1; i + 1 < a.n; ++i)
      x.push_back(ordinary[pick(rng)]);
    x.push_back(int32_t(tok.eos));
  }
  lmcc::train::Examples ex = lmcc::train::makeExamples(spec, sentences, 0);
  const int32_t stride = int32_t(a.n);
  std::vector<int32_t> inputs, targets, lengths(a.batch, int32_t(a.n));
  int64_t numTargets = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    inputs.insert(inputs.end(), ex.inputs[b].begin(), ex.inputs[b].end());
    targets.insert(targets.end(), ex.targets[b].begin(), ex.targets[b].end());
    for (int32_t t : ex.targets[b])
      numTargets += t >= 0;
  }
  const lmcc::Objective objective = lmcc::resolvedObjective(spec);
  if (statsFlops && (objective == lmcc::Objective::Causal || objective == lmcc::Objective::Masked ||
                     objective == lmcc::Objective::Autoencoding))
    a.flops -= double(a.batch * a.n - numTargets) * 8.0 * double(spec.dims.dModel) * double(spec.dims.vocab);
  if (!a.dumpBatch.empty()) {
    std::ofstream out(a.dumpBatch);
    auto rows = [&](const std::vector<std::vector<int32_t>> &v) {
      out << '[';
      for (size_t b = 0; b < v.size(); ++b) {
        out << (b ? ",[" : "[");
        for (size_t i = 0; i < v[b].size(); ++i)
          out << (i ? "," : "") << v[b][i];
        out << ']';
      }
      out << ']';
    };
    out << "{\"inputs\":";
    rows(ex.inputs);
    out << ",\"targets\":";
    rows(ex.targets);
    out << "}\n";
    if (!out)
      fail("cannot write " + a.dumpBatch);
  }

  void *handle = ::dlopen(fs::absolute(libPath).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    fail(std::string("cannot load ") + ::dlerror());
  Runtime rt;
  const lm_model_desc *(*descriptor)() = nullptr;
  find(handle, spec.name + "_descriptor", descriptor);
  rt.desc = descriptor();
  if (!rt.desc->loss_grad || !rt.desc->train)
    fail(libPath.string() + " was compiled without --train");
  find(handle, "lm_rt_load", rt.load);
  find(handle, "lm_rt_trainer_new", rt.trainerNew);
  find(handle, "lm_rt_train_step_ex", rt.step);
  find(handle, "lm_rt_trainer_free", rt.trainerFree);
  find(handle, "lm_rt_free", rt.modelFree);
  find(handle, "lm_last_error", rt.lastError);
  find(handle, "lm_set_num_threads", rt.setThreads);
  find(handle, "lm_rt_num_params", rt.numParams);
  find(handle, "lm_rt_loss", rt.loss);
  find(handle, "lm_rt_loss_and_grad", rt.lossAndGrad);
  rt.setThreads(int(a.threads));

  lm_model *model = nullptr;
  if (rt.load(rt.desc, a.weights.c_str(), &model) != LM_OK)
    fail("cannot load " + a.weights + ": " + rt.lastError());
  lm_trainer *trainer = nullptr;
  if (rt.trainerNew(model, &trainer) != LM_OK)
    fail(std::string("trainer: ") + rt.lastError());

  auto step = [&](float *loss) {
    double lr = 0, norm = 0;
    auto start = std::chrono::steady_clock::now();
    if (rt.step(trainer, inputs.data(), targets.data(), lengths.data(), int32_t(a.batch), stride, loss, &lr, &norm) !=
        LM_OK)
      fail(std::string("train step: ") + rt.lastError());
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  float firstLoss = 0, lastLoss = 0;
  double warmupMs = step(&firstLoss);
  std::vector<double> ms;
  for (int64_t s = 0; s < a.steps; ++s)
    ms.push_back(step(&lastLoss));

  struct rusage usage {}; // before the breakdown's gradient buffer
  ::getrusage(RUSAGE_SELF, &usage);
  double lossMs = -1, gradMs = -1;
  if (a.breakdown) {
    std::vector<float> grad(size_t(rt.numParams(rt.desc)));
    auto timed = [&](auto &&call) {
      double best = 1e300;
      for (int rep = 0; rep < 2; ++rep) {
        auto start = std::chrono::steady_clock::now();
        if (call() != LM_OK)
          fail(std::string("breakdown: ") + rt.lastError());
        best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                                  .count());
      }
      return best;
    };
    float l = 0;
    lossMs = timed([&] {
      return rt.loss(model, inputs.data(), targets.data(), lengths.data(), int32_t(a.batch), stride, &l, nullptr);
    });
    gradMs = timed([&] {
      return rt.lossAndGrad(model, inputs.data(), targets.data(), lengths.data(), int32_t(a.batch), stride, &l,
                            grad.data());
    });
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  size_t k = sorted.size();
  double median = k % 2 ? sorted[k / 2] : 0.5 * (sorted[k / 2 - 1] + sorted[k / 2]);
  double mean = 0, var = 0;
  for (double x : ms)
    mean += x / double(k);
  for (double x : ms)
    var += (x - mean) * (x - mean) / double(k);
  double gflops = a.flops / (median / 1e3) / 1e9;

  std::printf("{\"system\":\"lmcc\",\"model\":\"%s\",\"objective\":\"%s\",\"batch\":%lld,\"n\":%lld,"
              "\"threads\":%lld,\"steps\":%lld,\"d_model\":%lld,\"vocab\":%lld,\"targets\":%lld,\"params\":%lld,\"first_loss\":%.9g,"
              "\"last_loss\":%.9g,\"warmup_ms\":%.3f,\"ms_per_step\":%.3f,\"spread_pct\":%.2f,\"min_ms\":%.3f,"
              "\"max_ms\":%.3f,\"steps_per_s\":%.5g,\"tokens_per_s\":%.6g,\"peak_rss_mb\":%.1f,"
              "\"train_flops_per_step\":%.0f,\"gflops\":%.4g,\"peak_gflops\":%.4g,\"peak_isa\":\"%s\","
              "\"roofline_fraction\":%.4f,\"loss_ms\":%.3f,\"grad_ms\":%.3f}\n",
              spec.name.c_str(), objectiveName(objective).c_str(), (long long)a.batch,
              (long long)a.n, (long long)a.threads, (long long)a.steps, (long long)spec.dims.dModel,
              (long long)spec.dims.vocab, (long long)numTargets,
              (long long)rt.numParams(rt.desc), firstLoss, lastLoss, warmupMs, median,
              100.0 * std::sqrt(var) / median, sorted.front(), sorted.back(), 1e3 / median,
              double(a.batch * a.n) * 1e3 / median, double(usage.ru_maxrss) / 1024.0, a.flops, gflops, a.peak,
              isa.c_str(), gflops / a.peak, lossMs, gradMs);
  rt.trainerFree(trainer);
  rt.modelFree(model);
  return 0;
}
