//===- lmcc.cpp - The lmcc driver ---------------------------------------------===//
//
// Subcommands: check, emit-mlir, init, convert, compile, grad, train, score, embed, tokenize, vocab, import-hf,
// translate, cache, plot; sts, blimp, rerank in Eval.cpp. Every user error (spec, weights, ids, flags) is
// reported on stderr with the file and position or field it concerns. The streaming commands (score, embed,
// tokenize, sts, blimp, rerank) print chunk after chunk: on an error, the chunks before the bad line's may have
// been printed.
//
//===----------------------------------------------------------------------===//
#include "driver/Compile.h"
#include "codegen/Emit/Object.h"
#include "codegen/Stats.h"
#include "passes/Passes.h"
#include "frontend/MLIRGen.h"
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "tools/lmcc/Diformer.h"
#include "runtime/lib/lmrt.h"
#include "runtime/lib/Tokenizer.h"
#include "runtime/weights/ModelWeights.h"
#include "runtime/weights/UniqueJson.h"
#include "tools/lmcc/Cache.h"
#include "tools/lmcc/Common.h"
#include "tools/lmcc/Eval.h"
#include "tools/lmcc/EvalMath.h"
#include "tools/lmcc/Scorer.h"
#include "tools/lmcc/TrainRun.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace lmcc::cli;

namespace {

const char *kExitCodes = R"(Exit codes (every command):
  0  success
  1  invalid input or output: spec, weights, ids, text, corpus, or a file that cannot be written (the message
     names the file and position, field or tensor); also non-finite results
  2  invalid command line (unknown or missing options, options that exclude each other)
  3  not supported yet by this build, or compilation failed (the message says what)
  4  internal error (please report)
  5  out of memory (the message says what was being allocated when it is known)
  130 lmcc train stopped by SIGINT/SIGTERM after writing a checkpoint)";

int runCheck(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::cout << (o.json ? lmcc::toJson(spec) + "\n" : lmcc::toToml(spec));
  return kExitOk;
}

/// `text` into the file `path`: a regular file (or a new one) by a temporary file renamed over it, so that a full
/// disk or a kill leaves the old file whole (issue 21: never half-written output); a device or pipe written directly.
void writeOutputFile(const std::string &path, const std::string &text) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st) && !std::filesystem::is_directory(st)) {
    std::ofstream out(path, std::ios::binary);
    if (!(out << text) || !out.flush())
      throw InputError(path + ": cannot write");
    return;
  }
  if (std::filesystem::is_directory(st))
    throw InputError(path + ": is a directory");
  try {
    writeAtomically(path, text);
  } catch (const lmcc::cli::RunError &e) {
    throw InputError(e.what());
  }
}

int runEmit(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::string text = lmcc::emitMLIR(spec, o.train);
  if (text.empty()) {
    std::cerr << "lmcc: internal error: the IR built for " << o.spec << " does not verify\n";
    return kExitInternal;
  }
  if (o.output.empty())
    std::cout << text;
  else
    writeOutputFile(o.output, text);
  return kExitOk;
}

int runInit(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  writeWeightsFile(o.output, lmcc::initWeights(spec, o.seed));
  return kExitOk;
}

int runConvert(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (o.from != "hf")
    throw UsageError("--from " + o.from + ": only \"hf\" (Hugging Face BertForMaskedLM names) is supported");
  lmcc::WeightSet raw = lmcc::readSafetensors(o.input);
  lmcc::WeightSet canonical = lmcc::importHuggingFaceBert(raw, spec, o.input); // validated there
  canonical.metadata["name"] = spec.name;
  canonical.metadata["spec_hash"] = lmcc::specHash(spec);
  writeWeightsFile(o.output, canonical);
  return kExitOk;
}

namespace fs = std::filesystem;

// --- Training -----------------------------------------------------------------------

/// One batch of `lmcc grad` / `lmcc train`: {"inputs":[[...],...],"targets":[[...],...]}, ragged.
struct TrainBatch {
  std::vector<std::vector<int32_t>> raggedInputs, raggedTargets;
  std::vector<int32_t> inputs, targets, lengths;
  int32_t batch = 0, stride = 1;
  int64_t targetCount = 0;
};

/// The causal shift of every sentence of `inputs` (x[i+1], -1 at the end); non-lists stay as they are.
nlohmann::json causalTargets(const nlohmann::json &inputs) {
  nlohmann::json out = nlohmann::json::array();
  for (const nlohmann::json &x : inputs) {
    if (!x.is_array()) {
      out.push_back(x);
      continue;
    }
    nlohmann::json y = nlohmann::json::array();
    for (size_t i = 0; i < x.size(); ++i)
      y.push_back(i + 1 < x.size() ? x[i + 1] : nlohmann::json(-1));
    out.push_back(std::move(y));
  }
  return out;
}

TrainBatch parseBatch(const nlohmann::json &j, const std::string &where, const lmcc::ModelSpec &spec) {
  // Family ngram (issue 18): each input row is a whole sentence; its heads' targets derive from the causal
  // shift, so "targets" may be left out and, when given, must be that shift.
  const bool ngram = spec.family == lmcc::Family::NGram;
  if (!j.is_object() || !j.contains("inputs") || (!j.contains("targets") && !ngram))
    throw InputError(where + ": expected an object {\"inputs\": [[...], ...], \"targets\": [[...], ...]}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "inputs" && it.key() != "targets")
      throw InputError(where + ": unknown key \"" + it.key() + "\" (valid: inputs, targets)");
  const nlohmann::json &in = j["inputs"];
  const nlohmann::json tg = j.contains("targets") ? j["targets"] : causalTargets(in);
  if (!in.is_array() || !tg.is_array() || in.size() != tg.size())
    throw InputError(where + ": \"inputs\" and \"targets\" must be arrays with one list per sentence (got " +
                     std::to_string(in.is_array() ? in.size() : 0) + " and " +
                     std::to_string(tg.is_array() ? tg.size() : 0) + ")");
  if (in.empty())
    throw InputError(where + ": the batch has no sentence");
  TrainBatch b;
  b.batch = int32_t(in.size());
  for (size_t s = 0; s < in.size(); ++s) {
    if (!in[s].is_array() || !tg[s].is_array() || in[s].size() != tg[s].size())
      throw InputError(where + ": sentence " + std::to_string(s) + ": inputs and targets must be lists of equal length");
    if (in[s].empty() || int64_t(in[s].size()) > spec.dims.maxLen)
      throw InputError(where + ": sentence " + std::to_string(s) + ": length " + std::to_string(in[s].size()) +
                       " outside [1, max_len = " + std::to_string(spec.dims.maxLen) + "]");
    b.stride = std::max<int32_t>(b.stride, int32_t(in[s].size()));
  }
  b.inputs.assign(size_t(b.batch) * b.stride, 0);
  b.targets.assign(size_t(b.batch) * b.stride, -1);
  for (size_t s = 0; s < in.size(); ++s) {
    b.lengths.push_back(int32_t(in[s].size()));
    auto at = [&](size_t i) { return where + ": sentence " + std::to_string(s) + ", position " + std::to_string(i); };
    // The inputs first: an ngram batch without "targets" takes its targets from them.
    for (size_t i = 0; i < in[s].size(); ++i) {
      if (!in[s][i].is_number_integer())
        throw InputError(at(i) + ": ids and targets must be integers");
      const int64_t x = in[s][i].get<int64_t>();
      if (x < 0 || x >= spec.dims.vocab)
        throw InputError(at(i) + ": input id " + std::to_string(x) + " outside the vocabulary [0, " +
                         std::to_string(spec.dims.vocab) + ")");
    }
    for (size_t i = 0; i < in[s].size(); ++i) {
      if (!tg[s][i].is_number_integer())
        throw InputError(at(i) + ": ids and targets must be integers");
      const int64_t x = in[s][i].get<int64_t>(), y = tg[s][i].get<int64_t>();
      if (y < -1 || y >= spec.dims.vocab)
        throw InputError(at(i) + ": target " + std::to_string(y) + " outside [0, " + std::to_string(spec.dims.vocab) +
                         ") (or -1 for none)");
      if (ngram) {
        const int64_t shift = i + 1 < in[s].size() ? in[s][i + 1].get<int64_t>() : -1;
        if (y != shift)
          throw InputError(at(i) + ": target " + std::to_string(y) + ", but family \"ngram\" trains on the causal " +
                           "shift of each input sentence (x[i+1], -1 at the end): expected " + std::to_string(shift) +
                           " (or leave \"targets\" out)");
      }
      b.inputs[s * b.stride + i] = int32_t(x);
      b.targets[s * b.stride + i] = int32_t(y);
      b.targetCount += y >= 0;
    }
    b.raggedInputs.emplace_back(b.inputs.begin() + s * b.stride, b.inputs.begin() + s * b.stride + in[s].size());
    b.raggedTargets.emplace_back(b.targets.begin() + s * b.stride, b.targets.begin() + s * b.stride + in[s].size());
  }
  if (b.targetCount == 0)
    throw InputError(where + ": the batch has no target (every target is -1)");
  return b;
}

/// The batches file of `lmcc train`: one batch object per non-empty line.
std::vector<TrainBatch> readBatches(const std::string &path, const lmcc::ModelSpec &spec) {
  std::string text = readInput(path, "batches file");
  std::vector<TrainBatch> out;
  std::istringstream lines(text);
  std::string line;
  for (int64_t no = 1; std::getline(lines, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    const std::string where = path + ":" + std::to_string(no);
    out.push_back(parseBatch(parseJson(line, where), where, spec));
  }
  if (out.empty())
    throw InputError(path + ": no batch (one JSON object per line)");
  return out;
}

int runGrad(Options o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (spec.family == lmcc::Family::Diformer) { // {"src","tgt","dirs","hide"} batches
    std::optional<CompiledModel> compiled;
    if (!o.reference) {
      o.train = true;
      setRuntime(o);
      compiled.emplace(spec, o, o.weights);
    }
    return lmcc::cli::diformerGrad(spec, o.weights, o.batch, o.output, o.threads, compiled ? &*compiled : nullptr);
  }
  TrainBatch b = parseBatch(parseJson(readInput(o.batch, "batch file"), o.batch), o.batch, spec);
  if (o.output.empty())
    throw UsageError("lmcc grad needs -o GRADS.safetensors");
  float loss = 0;
  lmcc::WeightSet out;
  if (o.reference) { // the Eigen oracle: runtime/reference's lossAndGrad
    lmcc::reference::LossAndGrad r = lmcc::reference::lossAndGrad(
        spec, lmcc::loadModelWeights(o.weights, spec), b.raggedInputs, b.raggedTargets, spec.train.labelSmoothing,
        o.threads);
    loss = float(r.loss);
    out.tensors = std::move(r.grads.tensors);
  } else {
    o.train = true;
    CompiledModel m(spec, o);
    setRuntime(o);
    const lm_model_desc *d = m.desc();
    std::vector<float> grad(size_t(lm_rt_num_params(d)));
    if (int status = lm_rt_loss_and_grad(m.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch,
                                         b.stride, &loss, grad.data());
        status != LM_OK) {
      throwCallStatus(status, lm_last_error());
    }
    out = lmcc::cli::unpackGradient(d, grad);
  }
  out.metadata["name"] = spec.name;
  out.metadata["spec_hash"] = lmcc::specHash(spec);
  out.metadata["loss"] = std::to_string(loss);
  writeWeightsFile(o.output, out);
  std::string line = "{\"loss\":";
  appendNumber(line, loss, "loss");
  line += ",\"targets\":" + std::to_string(b.targetCount) + "}\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitInput;
}

/// A spec lmcc train can train, checked before anything is compiled or written.
void checkTrainable(const lmcc::ModelSpec &spec, const std::string &path) {
  if (!spec.mlm)
    throw InputError(path + ": [head] mlm = false: an encoder-only model has no output head to train (training "
                     "needs mlm = true)");
}

int runTrainBatches(Options o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  checkTrainable(spec, o.spec);
  if (spec.family == lmcc::Family::Diformer) { // directional objective; --reference: the Eigen oracle
    if (!o.resume.empty()) // was ignored: the run started over from a seeded model
      throw UsageError("--resume: a Diformer run keeps no optimizer state to continue from (it writes "
                       "DIR/weights.safetensors only); start a new run from its weights with --weights " +
                       (fs::path(o.resume) / "weights.safetensors").string());
    lmcc::cli::CompileFn compile;
    if (!o.reference) {
      o.train = true;
      setRuntime(o);
      compile = [&](const std::string &path) { return std::make_unique<CompiledModel>(spec, o, path); };
    }
    return lmcc::cli::diformerTrain(spec, o.weights, o.batches, o.output, o.steps, o.saveEvery, o.threads, compile);
  }
  if (o.batches.empty())
    throw UsageError("lmcc train needs --data FILE (a corpus) or --batches FILE (explicit batches)");
  std::vector<TrainBatch> batches = readBatches(o.batches, spec);
  if (o.output.empty())
    throw UsageError("lmcc train needs -o DIR");
  if (o.weights.empty() && o.resume.empty())
    throw UsageError("lmcc train needs --weights W (initial weights) or --resume DIR");
  // Issue 14's synopsis gives --weights W on every call and `--resume DIR continues from them`: with both, the
  // run continues from DIR's weights and optimizer state, and W is not read.
  if (!o.weights.empty() && !o.resume.empty())
    std::cerr << "lmcc train: note: --resume " << o.resume << ": continuing from its weights and optimizer state; --weights "
              << o.weights << " is not read\n";
  if (std::error_code ec; fs::exists(fs::path(o.output) / "run.json", ec))
    throw InputError(o.output + ": a run directory of lmcc train --data (holds run.json); --batches writes "
                                "weights.safetensors and trainer.safetensors: use another directory");
  const fs::path resume(o.resume);
  if (!o.resume.empty())
    for (const char *file : {"weights.safetensors", "trainer.safetensors"})
      if (!fs::exists(resume / file))
        throw InputError((resume / file).string() + ": not found (--resume needs a directory written by lmcc train)");
  o.train = true;
  CompiledModel m(spec, o, o.resume.empty() ? o.weights : (resume / "weights.safetensors").string());
  setRuntime(o);
  lm_trainer *trainer = nullptr;
  if (lm_rt_trainer_new(m.model, &trainer) != LM_OK)
    throw InputError(lm_last_error());
  std::unique_ptr<lm_trainer, void (*)(lm_trainer *)> owner(trainer, lm_rt_trainer_free);
  if (!o.resume.empty() && lm_rt_trainer_load(trainer, (resume / "trainer.safetensors").c_str()) != LM_OK)
    throw InputError(lm_last_error());
  const int64_t steps = o.steps > 0 ? o.steps : int64_t(batches.size());
  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec)
    throw InputError(o.output + ": " + ec.message());
  auto save = [&] {
    if (lm_rt_save_weights(m.model, (fs::path(o.output) / "weights.safetensors").c_str()) != LM_OK ||
        lm_rt_trainer_save(trainer, (fs::path(o.output) / "trainer.safetensors").c_str()) != LM_OK)
      throw InputError(lm_last_error());
  };
  // SIGINT / SIGTERM: the step in progress finishes, the weights and optimizer state are written, exit 130 (as
  // lmcc train --data; they ended the process with every step lost).
  const lmcc::cli::StopSignals signals;
  for (int64_t k = 0; k < steps; ++k) {
    if (const int sig = lmcc::cli::StopSignals::caught()) {
      save();
      std::fprintf(stderr, "lmcc train: stopped by signal %d after step %lld; the weights and optimizer state are in "
                           "%s (--resume %s continues)\n",
                   sig, static_cast<long long>(lm_rt_trainer_steps(trainer)), o.output.c_str(), o.output.c_str());
      return 130;
    }
    const int64_t step = lm_rt_trainer_steps(trainer);
    const TrainBatch &b = batches[size_t(step % int64_t(batches.size()))];
    float loss = 0;
    double lr = 0, norm = 0;
    if (int status = lm_rt_train_step_ex(trainer, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch,
                                         b.stride, &loss, &lr, &norm);
        status != LM_OK) {
      std::string why = "step " + std::to_string(step + 1) + ": " + lm_last_error();
      if (k > 0) { // the steps done are kept: --resume DIR continues from them
        save();
        why += "; the weights and optimizer state after step " + std::to_string(step) + " are in " + o.output;
      }
      throwCallStatus(status, why);
    }
    std::string line = "{\"step\":" + std::to_string(step + 1) + ",\"loss\":";
    appendNumber(line, loss, "loss at step " + std::to_string(step + 1));
    line += ",\"lr\":";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", lr);
    line += buf;
    line += ",\"grad_norm\":";
    appendNumber(line, norm, "gradient norm at step " + std::to_string(step + 1));
    line += "}\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  }
  save();
  return kExitOk;
}

/// `lmcc train --data`: the corpus workflow of tools/lmcc/TrainRun.cpp.
int runTrainData(Options o, bool resumeGiven) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  checkTrainable(spec, o.spec);
  if (spec.family == lmcc::Family::Diformer)
    throw InputError(o.spec + ": family \"diformer\" trains on translation pairs: lmcc train --batches FILE with "
                     "{\"src\",\"tgt\",\"dirs\",\"hide\"} batches (a --data corpus of sentences has no pairs)");
  lmcc::cli::TrainRunOptions &r = o.run;
  if (!o.batches.empty())
    throw UsageError("--data and --batches: give one (a corpus, or explicit batches)");
  if (o.output.empty() && !o.resume.empty())
    o.output = o.resume;
  if (o.output.empty())
    throw UsageError("lmcc train --data needs -o RUN_DIR");
  if (!o.resume.empty() && fs::path(o.resume) != fs::path(o.output))
    throw UsageError("--resume " + o.resume + " and -o " + o.output + " name different run directories");
  r.runDir = o.output, r.weights = o.weights, r.resume = resumeGiven, r.steps = o.steps, r.threads = o.threads;
  r.maxMemoryMB = o.maxMemoryMB;
  std::optional<lmcc::Tokenizer> tok;
  lmcc::cli::TrainRunHooks hooks;
  if (r.ids) {
    hooks.encode = [vocab = spec.dims.vocab](std::string_view line, const std::string &where) {
      return lmcc::train::parseIdLine(line, where, vocab);
    };
  } else {
    tok.emplace(loadTokenizer(spec));
    hooks.encode = [&tok](std::string_view line, const std::string &where) {
      try {
        return tok->encodeSentence(line, where);
      } catch (const lmcc::TokenizerError &e) {
        throw lmcc::train::CorpusError(e.what());
      }
    };
  }
  o.train = true;
  std::unique_ptr<CompiledModel> model;
  hooks.load = [&](const std::string &weights) {
    model = std::make_unique<CompiledModel>(spec, o, weights);
    return model->model;
  };
  hooks.writeInitWeights = [&](const std::string &path) {
    lmcc::writeSafetensors(path, lmcc::initWeights(spec, uint64_t(spec.train.seed)));
  };
  return lmcc::cli::runTrainCorpus(spec, r, hooks);
}

/// Issue 6's `--stats` lines, one per entry point: `<entry>: flops=<int> temp_bytes=<int>`, then the entry's
/// further fields when `extra` has any (the runtime's memory model of score and embed), on the same line.
void printStats(const std::vector<lmcc::codegen::EntryStats> &stats,
                const std::map<std::string, std::string> &extra = {}) {
  for (const auto &entry : stats)
    if (entry.entry.rfind("fold_", 0) != 0) { // load-time functions (lm-fold-constants) are not entry points
      auto more = extra.find(entry.entry);
      std::cout << (entry.entry == "loss_grad" ? std::string("train") : entry.entry) << ": flops=" << entry.flops
                << " temp_bytes=" << entry.tempBytes << (more == extra.end() ? "" : more->second) << "\n";
    }
}

int runStats(const Options &o, const lmcc::ModelSpec &spec) {
  lmcc::driver::LibraryOptions options;
  applyPipelineFlags(o, options);
  options.dumpDir = o.dumpIR;
  mlir::MLIRContext context;
  std::string error;
  mlir::OwningOpRef<mlir::ModuleOp> module = lmcc::driver::buildOptimizedModule(context, spec, options, &error);
  if (!module) {
    std::cerr << "lmcc: " << o.spec << ": " << error << "\n";
    return kExitInternal;
  }
  // With --max-memory, the runtime's memory model (what it cuts calls with): one sentence of n tokens, one
  // thread; with bf16 weights on an AMX target, the GEMMs' rounded input copies included (as compileLibrary builds
  // it). Appended to the entry's line: one line per entry point, and without --max-memory exactly issue 6's
  // `<entry>: flops=<integer> temp_bytes=<integer>`.
  std::map<std::string, std::string> memory;
  const bool amxCopies = o.weightsDtype == "bf16" && lmcc::codegen::targetHasAmx(o.cpu);
  for (const char *entry : {"score", "embed"}) {
    if (o.maxMemoryMB <= 0)
      break;
    lmcc::codegen::MemoryModel mm =
        lmcc::codegen::memoryModel(*module, entry, o.statsN, amxCopies, o.gemm == "generated");
    if (mm.perSentence.empty())
      continue;
    const int64_t n = o.statsN, sentence = mm.perSentence[n], copy = mm.perCopy[n];
    std::ostringstream line;
    line << " sentence_bytes=" << sentence << " copy_bytes=" << copy;
    const int64_t limit = o.maxMemoryMB << 20;
    // Mask-and-predict scoring and embedding cut a sentence's copies into windows (ABI 10 for embed).
    const bool splits = spec.method == lmcc::ScoreMethod::MaskAndPredict && spec.mlm;
    int64_t copies = copy > 0 ? n : 0;
    if (sentence + copies * copy > limit)
      copies = splits && copy > 0 ? (limit - sentence) / copy : -1;
    if (copies < (copy > 0 ? 1 : 0))
      line << " limit_bytes=" << limit << " fits=no needs_bytes="
           << sentence + (splits ? copy : copy * n); // the runtime refuses such a call (LM_ERR_MEMORY)
    else
      line << " limit_bytes=" << limit << " copies_per_call=" << copies << " peak_bytes=" << sentence + copies * copy;
    // What each thread past the first adds (its work items' scratch): the call above on T threads needs
    // (T - 1) * thread_bytes more.
    line << " thread_bytes=" << mm.perThread[n];
    memory[entry] = line.str();
  }
  printStats(lmcc::codegen::countStats(*module, o.statsN), memory);
  return kExitOk;
}

int runCompile(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (o.stats) {
    if (o.statsN == 0)
      throw UsageError("--stats needs --n N: the sentence length to count for, in [1, max_len = " +
                       std::to_string(spec.dims.maxLen) + "]");
    if (o.statsN < 1 || o.statsN > spec.dims.maxLen)
      throw UsageError("--n " + std::to_string(o.statsN) + " must be in [1, max_len = " +
                       std::to_string(spec.dims.maxLen) + "]");
    if (o.output.empty())
      return runStats(o, spec);
  } else if (o.output.empty()) {
    throw UsageError("lmcc compile needs -o DIR (or --stats --n N)");
  }
  if (o.embedWeights && o.weights.empty())
    throw UsageError("--embed-weights needs --weights W");
  { // output errors are input errors (exit 1), found before anything is compiled
    fs::path out = fs::path(o.output).lexically_normal();
    if (!out.has_filename() && out.has_parent_path()) // DIR/ names DIR
      out = out.parent_path();
    const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
    if (fs::exists(out) && !fs::is_directory(out))
      throw InputError(o.output + ": exists and is not a directory");
    if (!fs::exists(out) && !fs::is_directory(parent))
      throw InputError(o.output + ": the parent directory " + parent.string() +
                       " does not exist (-o creates only the last level)");
    // Writable: a probe directory made and removed where the library's files will go (/proc, a read-only mount).
    auto probe = [](const std::string &flag, const fs::path &where) {
      const fs::path p = where / (".lmcc-probe-" + std::to_string(::getpid()));
      std::error_code ec;
      if (!fs::create_directory(p, ec))
        throw InputError(flag + ": cannot create files in " + where.string() + (ec ? ": " + ec.message() : ""));
      fs::remove(p, ec);
    };
    probe(o.output, fs::exists(out) ? out : parent);
    if (!o.dumpIR.empty()) {
      const fs::path dump = fs::path(o.dumpIR).lexically_normal();
      const fs::path dumpParent = dump.has_parent_path() ? dump.parent_path() : fs::path(".");
      if (fs::exists(dump) && !fs::is_directory(dump))
        throw InputError("--dump-ir " + o.dumpIR + ": cannot create the directory (a file of that name exists)");
      if (fs::is_directory(dump) || fs::is_directory(dumpParent))
        probe("--dump-ir " + o.dumpIR, fs::is_directory(dump) ? dump : dumpParent);
    }
  }
  lmcc::driver::LibraryOptions options;
  applyPipelineFlags(o, options);
  options.outputDir = o.output;
  options.weightsPath = o.weights;
  options.embedWeights = o.embedWeights;
  options.staticArchive = o.staticArchive;
  options.cpu = o.cpu;
  options.l1Ways = o.l1Ways;
  options.dumpDir = o.dumpIR;
  options.runtimeDir = runtimeDir();
  options.statsN = o.stats ? o.statsN : 0;
  lmcc::driver::CompileReport report; // --stats with -o: counted on the module compiled, one pipeline run
  if (std::string err = lmcc::driver::compileLibrary(spec, options, o.stats ? &report : nullptr); !err.empty()) {
    std::cerr << "lmcc: " << o.spec << ": " << err << "\n";
    return kExitUnsupported;
  }
  printStats(report.stats);
  return kExitOk;
}

int runTokenize(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  lmcc::Tokenizer tok = loadTokenizer(spec);
  LineReader in(o.text, "text file");
  std::string line, out;
  while (in.next(line)) {
    const std::vector<int32_t> ids = encodeText(line, in.where(), spec, tok, o.truncate);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i)
        out += ' ';
      out += o.tokens ? tok.piece(ids[i]) : std::to_string(ids[i]);
    }
    out += '\n';
    if (out.size() >= (1u << 16))
      writeStdout(std::exchange(out, {}));
  }
  writeStdout(out);
  return kExitOk;
}

int runVocab(const Options &o) {
  if (o.vocabSize < 6)
    throw UsageError("--size " + std::to_string(o.vocabSize) + ": a vocabulary needs at least the 5 special tokens "
                     "and one " + (o.wordLevel ? "word" : "character"));
  std::string corpus = readInput(o.corpus, "corpus");
  std::vector<std::string> vocab;
  try {
    // Specials first, at the ids of the family defaults ([tokens]: pad 0, eos 1, unk 2, bos 3, mask 4).
    const std::string path = o.corpus == "-" ? "<stdin>" : o.corpus;
    const std::vector<std::string> specials{"[PAD]", "[EOS]", "[UNK]", "[SOS]", "[MASK]"};
    vocab = o.wordLevel ? lmcc::buildWordVocab(corpus, path, o.vocabSize, o.lowercase, specials)
                        : lmcc::buildWordPieceVocab(corpus, path, o.vocabSize, o.lowercase, specials);
  } catch (const lmcc::TokenizerError &e) {
    throw InputError(e.what());
  }
  if (int64_t(vocab.size()) > o.vocabSize)
    vocab.resize(size_t(o.vocabSize));
  if (vocab.size() <= 5) // the specials alone: a corpus without a word
    throw InputError((o.corpus == "-" ? std::string("<stdin>") : o.corpus) + ": no word to build a vocabulary from");
  std::string text;
  for (const std::string &piece : vocab)
    text += piece + "\n";
  writeOutputFile(o.output, text);
  if (int64_t(vocab.size()) < o.vocabSize)
    std::cerr << "lmcc vocab: note: the corpus supports only " << vocab.size() << " entries ("
              << (o.wordLevel ? "distinct words" : "no pair occurs twice more") << "); wrote " << vocab.size()
              << " instead of " << o.vocabSize << "\n";
  return kExitOk;
}

/// Reads a JSON object file of an HF model folder; errors name the file.
nlohmann::json readJsonFile(const fs::path &path, bool required) {
  if (std::error_code ec; fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw InputError(path.string() + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (required)
      throw InputError(path.string() + ": cannot open (an import-hf folder needs it)");
    return nlohmann::json();
  }
  try {
    nlohmann::json j = lmcc::parseUniqueJson(in);
    if (!j.is_object() && !j.is_array())
      throw InputError(path.string() + ": expected a JSON object");
    return j;
  } catch (const nlohmann::json::exception &e) {
    throw InputError(path.string() + ": not valid JSON: " + e.what());
  } catch (const lmcc::DuplicateJsonKey &e) {
    throw InputError(path.string() + ": " + e.what());
  }
}

/// `lmcc import-hf DIR -o SPEC.toml`: a spec for a Hugging Face BERT folder (config.json, vocab.txt,
/// tokenizer_config.json) or a sentence-transformers folder (modules.json, the Transformer module's
/// sentence_bert_config.json with max_seq_length, the Pooling module's config.json, Normalize).
int importHf(const Options &o) {
  const fs::path dir = o.input;
  if (!fs::is_directory(dir))
    throw InputError(o.input + ": not a directory (import-hf reads a Hugging Face model folder)");
  fs::path model = dir; // the Transformer module's folder
  std::string pooling = "", why;
  bool normalize = false, sentenceTransformers = false;
  int64_t maxSeq = 0;
  if (fs::exists(dir / "modules.json")) {
    sentenceTransformers = true;
    nlohmann::json modules = readJsonFile(dir / "modules.json", true);
    if (!modules.is_array())
      throw InputError((dir / "modules.json").string() + ": expected a JSON array of modules");
    for (size_t i = 0; i < modules.size(); ++i) {
      const nlohmann::json &m = modules[i];
      std::string type = m.value("type", ""), path = m.value("path", "");
      // "sentence_transformers.models.Pooling" (v2-v5) or "...modules.pooling.Pooling" (v6).
      auto is = [&](const char *cls) {
        std::string last = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
        return last == cls;
      };
      std::string where = (dir / "modules.json").string() + ": module " + std::to_string(i) + " (\"" + type + "\")";
      if (is("Transformer")) {
        model = dir / path;
        nlohmann::json st = readJsonFile(model / "sentence_bert_config.json", false);
        if (st.is_object() && st.contains("max_seq_length") && st["max_seq_length"].is_number_integer())
          maxSeq = st["max_seq_length"].get<int64_t>();
      } else if (is("Pooling")) {
        fs::path cfg = dir / path / "config.json";
        nlohmann::json p = readJsonFile(cfg, true);
        std::vector<std::string> modes;
        for (auto &[key, value] : p.items())
          if (key.rfind("pooling_mode_", 0) == 0 && value.is_boolean() && value.get<bool>())
            modes.push_back(key);
        if (p.contains("pooling_mode") && p["pooling_mode"].is_string())
          modes = {"pooling_mode_" + p["pooling_mode"].get<std::string>() +
                   (p["pooling_mode"] == "mean" ? "_tokens" : p["pooling_mode"] == "cls" ? "_token" : "")};
        if (modes.size() != 1 || (modes[0] != "pooling_mode_mean_tokens" && modes[0] != "pooling_mode_cls_token"))
          throw InputError(cfg.string() + ": pooling " + (modes.empty() ? std::string("(none)") : modes[0]) +
                           (modes.size() > 1 ? " and others" : "") +
                           " is not supported; lmcc pools with mean (pooling_mode_mean_tokens) or cls");
        pooling = modes[0] == "pooling_mode_cls_token" ? "cls" : "mean_all";
        if (p.value("include_prompt", true) == false)
          throw InputError(cfg.string() + ": include_prompt = false is not supported");
      } else if (is("Normalize")) {
        normalize = true;
      } else {
        throw InputError(where + " is not supported (Transformer, Pooling and Normalize are)");
      }
    }
  }
  const fs::path configPath = model / "config.json";
  nlohmann::json c = readJsonFile(configPath, true);
  if (!c.is_object())
    throw InputError(configPath.string() + ": expected a JSON object (a Hugging Face model config)");
  auto need = [&](const char *key) -> int64_t {
    if (!c.contains(key) || !c[key].is_number_integer())
      throw InputError(configPath.string() + ": \"" + key + "\" is missing or not an integer");
    return c[key].get<int64_t>();
  };
  // Optional keys of one JSON type: a value of another type is an error naming the key (nlohmann's value()
  // throws a type_error that named neither).
  auto typed = [&](const char *key, bool ok, const char *type) {
    if (!ok)
      throw InputError(configPath.string() + ": \"" + key + "\" must be " + type + ", got " + c[key].dump());
  };
  auto stringValue = [&](const char *key, const char *fallback) -> std::string {
    if (!c.contains(key))
      return fallback;
    typed(key, c[key].is_string(), "a string");
    return c[key].get<std::string>();
  };
  auto number = [&](const char *key, double fallback) -> double {
    if (!c.contains(key))
      return fallback;
    typed(key, c[key].is_number(), "a number");
    return c[key].get<double>();
  };
  auto flag = [&](const char *key, bool fallback) -> bool {
    if (!c.contains(key))
      return fallback;
    typed(key, c[key].is_boolean(), "true or false");
    return c[key].get<bool>();
  };
  if (const std::string type = stringValue("model_type", "bert"); type != "bert")
    throw InputError(configPath.string() + ": model_type \"" + type + "\" is not supported (import-hf reads BERT models)");
  if (flag("is_decoder", false))
    throw InputError(configPath.string() + ": is_decoder = true (a causal BERT) is not supported by import-hf, "
                     "which writes a bidirectional spec; write a family = \"unilm\" spec and pass the folder as "
                     "--weights");
  if (const std::string type = stringValue("position_embedding_type", "absolute"); type != "absolute")
    throw InputError(configPath.string() + ": position_embedding_type \"" + type +
                     "\" is not supported (learned absolute positions are)");
  std::string act = stringValue("hidden_act", "gelu");
  const char *activation = act == "gelu" ? "gelu" : act == "gelu_new" || act == "gelu_pytorch_tanh" ? "gelu_tanh"
                           : act == "relu" ? "relu" : nullptr;
  if (!activation)
    throw InputError(configPath.string() + ": hidden_act \"" + act + "\" is not supported");
  int64_t maxLen = need("max_position_embeddings");
  // Architecture: BertForMaskedLM (or BertForPreTraining) keeps the MLM head; BertModel and
  // sentence-transformers models are encoders.
  bool mlm = false;
  if (!sentenceTransformers && c.contains("architectures") && c["architectures"].is_array())
    for (const auto &a : c["architectures"])
      if (a == "BertForMaskedLM" || a == "BertForPreTraining")
        mlm = true;
  if (pooling.empty())
    pooling = mlm ? "mean" : "mean_all";

  // Tokenizer: vocab.txt (else the WordPiece vocabulary of tokenizer.json, written beside the spec as
  // <spec>.vocab.txt), casing and special token strings from tokenizer_config.json / tokenizer.json.
  nlohmann::json tc = readJsonFile(model / "tokenizer_config.json", false);
  nlohmann::json tj = readJsonFile(model / "tokenizer.json", false);
  fs::path vocabPath = model / "vocab.txt";
  std::string vocabText;
  bool writeVocab = false;
  if (fs::exists(vocabPath)) {
    vocabText = readInput(vocabPath.string(), "vocabulary (vocab.txt)");
  } else if (tj.is_object() && tj.contains("model") && tj["model"].value("type", "") == "WordPiece" &&
             tj["model"].contains("vocab") && tj["model"]["vocab"].is_object()) {
    std::vector<std::string> pieces(tj["model"]["vocab"].size());
    for (auto &[piece, id] : tj["model"]["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(pieces.size()) ||
          !pieces[size_t(id.get<int64_t>())].empty())
        throw InputError((model / "tokenizer.json").string() + ": model.vocab ids are not 0..n-1 (token \"" + piece + "\")");
      pieces[size_t(id.get<int64_t>())] = piece;
    }
    for (const std::string &p : pieces)
      vocabText += p + "\n";
    vocabPath = fs::path(o.output).replace_extension(".vocab.txt");
    writeVocab = true;
  } else {
    throw InputError((model / "vocab.txt").string() + ": cannot open, and no WordPiece tokenizer.json beside it");
  }
  bool lowercase = true;
  if (tj.is_object() && tj.contains("normalizer") && tj["normalizer"].is_object()) {
    const nlohmann::json &n = tj["normalizer"];
    if (n.value("type", "") != "BertNormalizer")
      throw InputError((model / "tokenizer.json").string() + ": normalizer \"" + n.value("type", "") +
                       "\" is not supported (BertNormalizer is)");
    lowercase = n.value("lowercase", true);
    if (n.contains("strip_accents") && n["strip_accents"].is_boolean() && n["strip_accents"].get<bool>() != lowercase)
      throw InputError((model / "tokenizer.json").string() + ": strip_accents differing from lowercase is not supported");
    for (const char *key : {"handle_chinese_chars", "clean_text"})
      if (n.contains(key) && n[key].is_boolean() && !n[key].get<bool>())
        throw InputError((model / "tokenizer.json").string() + ": normalizer " + key +
                         " = false is not supported (lmcc's tokenizer always does it, as BERT's default)");
  }
  if (tc.is_object() && tc.contains("do_lower_case") && tc["do_lower_case"].is_boolean())
    lowercase = tc["do_lower_case"].get<bool>();
  // tokenizer_config.json's BertTokenizer switches: strip_accents null (the default) follows do_lower_case.
  if (tc.is_object() && tc.contains("strip_accents") && tc["strip_accents"].is_boolean() &&
      tc["strip_accents"].get<bool>() != lowercase)
    throw InputError((model / "tokenizer_config.json").string() + ": strip_accents = " +
                     (tc["strip_accents"].get<bool>() ? "true" : "false") + " with do_lower_case = " +
                     (lowercase ? "true" : "false") + " is not supported (lmcc strips accents exactly when it "
                     "lowercases)");
  if (tc.is_object() && tc.contains("tokenize_chinese_chars") && tc["tokenize_chinese_chars"].is_boolean() &&
      !tc["tokenize_chinese_chars"].get<bool>())
    throw InputError((model / "tokenizer_config.json").string() + ": tokenize_chinese_chars = false is not supported "
                     "(lmcc's tokenizer splits CJK characters, as BERT's default)");
  // max_seq_length: sentence-transformers v6 keeps it as the tokenizer's model_max_length.
  if (maxSeq == 0 && tc.is_object() && tc.contains("model_max_length") && tc["model_max_length"].is_number_integer())
    maxSeq = tc["model_max_length"].get<int64_t>();
  auto tokenString = [&](const char *key, const char *fallback) -> std::string {
    if (tc.is_object() && tc.contains(key)) {
      if (tc[key].is_string())
        return tc[key].get<std::string>();
      if (tc[key].is_object() && tc[key].contains("content") && tc[key]["content"].is_string())
        return tc[key]["content"].get<std::string>();
    }
    return fallback;
  };
  const std::pair<const char *, std::string> specials[] = {{"pad", tokenString("pad_token", "[PAD]")},
                                                           {"eos", tokenString("sep_token", "[SEP]")},
                                                           {"unk", tokenString("unk_token", "[UNK]")},
                                                           {"bos", tokenString("cls_token", "[CLS]")},
                                                           {"mask", tokenString("mask_token", "[MASK]")}};
  lmcc::Tokenizer probe = [&] {
    try {
      return lmcc::Tokenizer::fromText(vocabText, vocabPath.string(), lowercase,
                                       lmcc::Tokenizer::conventionalSpecials(vocabText, vocabPath.string()));
    } catch (const lmcc::TokenizerError &e) {
      throw InputError(e.what());
    }
  }();
  std::string tokensTable, tokenizerTable;
  for (const auto &[key, str] : specials) {
    int32_t id = probe.find(str);
    if (id < 0)
      throw InputError(vocabPath.string() + ": the " + key + " token \"" + str + "\" (tokenizer_config.json) is not in "
                       "the vocabulary");
    tokensTable += std::string(key) + " = " + std::to_string(id) + "\n";
    tokenizerTable += std::string(key) + " = " + jsonString(str) + "\n";
  }
  int64_t vocab = need("vocab_size");
  if (maxSeq > 0)
    maxLen = std::min(maxLen, maxSeq);
  if (probe.size() > vocab)
    throw InputError(vocabPath.string() + ": " + std::to_string(probe.size()) + " tokens but config.json vocab_size is " +
                     std::to_string(vocab));

  // The spec's name: --name, else the folder's name made a C identifier.
  std::string name = o.name;
  if (name.empty()) {
    name = fs::absolute(dir).lexically_normal().filename().string();
    if (name.empty())
      name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
    for (char &ch : name)
      if (!std::isalnum((unsigned char)ch))
        ch = '_';
    if (name.empty() || std::isdigit((unsigned char)name[0]))
      name = "m_" + name;
  }
  fs::path specDir = fs::absolute(o.output).parent_path();
  std::string vocabRel = fs::absolute(vocabPath).lexically_normal().lexically_relative(specDir).string();
  if (vocabRel.empty())
    vocabRel = fs::absolute(vocabPath).string();

  char eps[64];
  const double epsValue = number("layer_norm_eps", 1e-12);
  const bool tied = flag("tie_word_embeddings", true);
  for (int precision = 1; precision <= 17; ++precision) { // the shortest text that reads back the same
    std::snprintf(eps, sizeof eps, "%.*g", precision, epsValue);
    if (std::strtod(eps, nullptr) == epsValue)
      break;
  }
  std::ostringstream t;
  t << "# Imported by lmcc import-hf from " << fs::absolute(dir).lexically_normal().string()
    << (sentenceTransformers ? " (sentence-transformers)" : "") << "\n"
    << "name = " << jsonString(name) << "\nfamily = \"bilm\"\n\n[dims]\n"
    << "vocab = " << vocab << "\nmax_len = " << maxLen << "\nd_model = " << need("hidden_size")
    << "\nheads = " << need("num_attention_heads") << "\nd_ff = " << need("intermediate_size")
    << "\nlayers = " << need("num_hidden_layers") << "\n\n[block]\nactivation = \"" << activation << "\"\neps = " << eps
    << "\n\n[head]\nmlm = " << (mlm ? "true" : "false")
    << (mlm && !tied ? "\ntied = false" : "") << "\n\n[tokens]\n" << tokensTable << "\n[embed]\npool = \""
    << pooling << "\"\nnormalize = " << (normalize ? "true" : "false") << "\n\n[tokenizer]\nvocab = "
    << jsonString(vocabRel) << "\nlowercase = " << (lowercase ? "true" : "false") << "\n" << tokenizerTable;
  std::string text = t.str();
  // The spec must load (and would fail the same way `lmcc check` does otherwise).
  lmcc::parseSpec(text, o.output);
  // Both outputs checked before either is written, each written atomically, the spec last: a failure leaves
  // neither a torn file nor a vocabulary without its spec.
  requireReplaceable(o.output);
  if (writeVocab)
    writeAtomically(vocabPath.string(), vocabText);
  writeAtomically(o.output, text);
  return kExitOk;
}

int runImportHf(const Options &o) {
  try {
    return importHf(o);
  } catch (const nlohmann::json::exception &e) { // a value of another JSON type than the folder's files should have
    throw InputError(o.input + ": a JSON value of an unexpected type: " + e.what());
  }
}

int runScoreOrEmbed(const Options &o, bool score) {
  if (o.truncate && o.text.empty()) // --ids (the default input)
    throw UsageError("--truncate applies to --text (token ids are taken as given; a line over max_len is an error)");
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (o.lambda) { // lmcc score --lambda: the n-gram ensemble's weight (a spec override: its own library)
    if (spec.family != lmcc::Family::NGram)
      throw UsageError("--lambda applies to family \"ngram\" (the n-gram heads' ensemble weight)");
    if (!score)
      throw UsageError("--lambda applies to lmcc score");
    spec.ngram->ensembleLambda = *o.lambda;
  }
  if (score)
    wordL2R(spec, o); // --pll validated before anything is read
  if (spec.family == lmcc::Family::Diformer && score) { // SRC ||| TGT ||| DIRS [||| HIDE] lines
    if (o.tokens)
      throw UsageError("--tokens applies to families scored one sentence a line (a diformer line is a source/target "
                       "pair; lmcc tokenize shows the pieces)");
    std::optional<lmcc::Tokenizer> tok;
    if (!o.text.empty())
      tok = loadTokenizer(spec);
    std::optional<CompiledModel> compiled;
    if (!o.reference) {
      setRuntime(o);
      compiled.emplace(spec, o, o.weights);
    }
    return lmcc::cli::diformerScore(spec, o.weights, o.text.empty() ? o.ids : o.text, tok ? &*tok : nullptr,
                                    o.threads, compiled ? &*compiled : nullptr);
  }
  if (spec.family == lmcc::Family::Diformer) {
    std::cerr << "lmcc: " << o.spec << ": family \"diformer\" has no embed entry point (it scores source/target "
              << "pairs, trains and translates)\n";
    return kExitUnsupported;
  }
  if (score && !spec.mlm)
    throw lmcc::SpecError(spec.where("head.mlm"), "head.mlm",
                          "this model is encoder only (mlm = false): it has no output head to score with; "
                          "use lmcc embed");
  // Streaming: chunks of sentences (SentenceBatch) are read, validated, run and printed one after the other.
  const bool spans = score && wordL2R(spec, o);
  std::optional<lmcc::Tokenizer> tok;
  if (!o.text.empty() || spans)
    tok = loadTokenizer(spec);
  if (o.text.empty() && o.tokens)
    throw UsageError("--tokens needs --text (and the spec's [tokenizer])");
  LineReader in(o.text.empty() ? o.ids : o.text, o.text.empty() ? "ids file" : "text file");
  Scorer model(spec, o);
  SentenceBatch batch(spec);
  Progress progress("lines");
  size_t first = 0; // sentences done so far (--timing)
  auto run = [&] {
    std::string out;
    auto tokensField = [&](size_t s) {
      std::string f = ",\"tokens\":[";
      for (size_t i = 0; i < batch.sentences[s].size(); ++i)
        f += (i ? "," : "") + jsonString(tok->piece(batch.sentences[s][i]));
      return f + "]";
    };
    if (score) {
      std::vector<lmcc::reference::ScoreResult> results = model.score(batch);
      for (size_t s = 0; s < results.size(); ++s) {
        out += "{\"token_logprobs\":[";
        for (size_t i = 0; i < results[s].tokenLogprobs.size(); ++i) {
          if (i)
            out += ',';
          appendNumber(out, results[s].tokenLogprobs[i], "log-probability for " + batch.origins[s]);
        }
        out += "],\"score\":";
        appendNumber(out, results[s].score, "score for " + batch.origins[s]);
        out += ",\"n_scored\":" + std::to_string(results[s].nScored);
        if (o.tokens)
          out += tokensField(s);
        out += "}\n";
      }
    } else {
      std::vector<std::vector<float>> results = model.embed(batch);
      for (size_t s = 0; s < results.size(); ++s) {
        out += "{\"embedding\":[";
        for (size_t i = 0; i < results[s].size(); ++i) {
          if (i)
            out += ',';
          appendNumber(out, results[s][i], "embedding value for " + batch.origins[s]);
        }
        out += "]";
        if (o.tokens)
          out += tokensField(s);
        out += "}\n";
      }
    }
    writeStdout(out);
    progress.add(int64_t(batch.size()));
    first += batch.size();
    batch.clear();
  };
  std::string line;
  while (in.next(line)) {
    std::vector<int32_t> ids = tok && !o.text.empty() ? encodeText(line, in.where(), spec, *tok, o.truncate)
                                                      : encodeIds(line, in.where(), spec);
    std::vector<int32_t> ws = spans ? wordSpans(*tok, ids) : std::vector<int32_t>{};
    batch.add(std::move(ids), in.where(), std::move(ws));
    if (batch.full())
      run();
  }
  if (batch.size())
    run();
  model.load(); // an empty input still validates the weights
  if (o.timing && !o.reference)
    std::fprintf(stderr, "timing: %zu sentences in %.2f ms (%.3f ms per sentence, %d threads; the compiled call "
                         "alone)\n", first, model.scoreMs(), model.scoreMs() / double(std::max<size_t>(1, first)),
                 o.threads);
  if (o.timing && !o.reference) {
    const int64_t limit = lm_set_workspace_limit(0); // reads the limit (and restores the default: we are done)
    std::fprintf(stderr, "timing: peak kernel temporaries %.1f MB (workspace limit %.1f MB)\n",
                 double(lm_rt_workspace_peak_bytes(0)) / (1 << 20), double(limit) / (1 << 20));
  }
  return kExitOk;
}

} // namespace

int main(int argc, char **argv) {
  // A write past the file-size limit (ulimit -f) fails with EFBIG and is reported, its temporary file removed;
  // SIGXFSZ's default action killed lmcc mid-write and left the temporary behind.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"lmcc: a compile-time specialized compiler for Transformer language models"};
  app.footer(kExitCodes);
  app.set_version_flag("--version", std::string("lmcc ") + LMCC_VERSION);
  app.require_subcommand(1);
  Options o;

  auto *check = app.add_subcommand("check", "validate a spec and print the resolved model (every default filled)");
  check->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  check->add_flag("--json", o.json, "print JSON instead of TOML");

  auto *emit = app.add_subcommand("emit-mlir", "print the model's naive lm IR");
  emit->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  emit->add_option("-o,--output", o.output, "write to a file instead of stdout");
  emit->add_flag("--train", o.train, "also emit the training entry point `loss(inputs, targets, lengths)`");

  auto *init = app.add_subcommand("init", "write a seeded BERT-style random initialization");
  init->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  init->add_option("--seed", o.seed, "random seed (0 .. 2^64-1)")->required()->check([](const std::string &v) {
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
      return "must be a non-negative integer, got " + (v.empty() ? std::string("an empty value") : v);
    errno = 0;
    (void)std::strtoull(v.c_str(), nullptr, 10);
    return errno == ERANGE ? "must be at most 2^64-1 = 18446744073709551615, got " + v : std::string();
  });
  init->add_option("-o,--output", o.output, "output safetensors file")->required();

  auto *convert = app.add_subcommand("convert", "convert a checkpoint to canonical weight names");
  convert->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  convert->add_option("--from", o.from, "source naming: hf (Hugging Face BertForMaskedLM)")->required();
  convert->add_option("INPUT", o.input, "input safetensors file")->required();
  convert->add_option("-o,--output", o.output, "output safetensors file")->required();

  auto *compile = app.add_subcommand("compile", "compile a model into DIR/lib<name>.so and DIR/<name>.h");
  compile->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  compile->add_option("-o,--output", o.output, "output directory (required unless --stats)");
  auto *stats = compile->add_flag("--stats", o.stats, "print '<entry>: flops=<int> temp_bytes=<int>' per entry point (with --max-memory, the memory model after them)");
  compile->add_option("--n", o.statsN, "sentence length for --stats (batch 1)")->needs(stats);
  compile->add_option("--max-memory", o.maxMemoryMB,
                      "with --stats: the workspace limit in MB; prints the masked copies per call and the peak")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->needs(stats);
  compile->add_option("--weights", o.weights, "weights to validate now (and bake in with --embed-weights)");
  compile->add_flag("--embed-weights", o.embedWeights, "bake the weights into the library (_load takes NULL)");
  compile->add_flag("--static", o.staticArchive, "also write lib<name>.a (link: cc app.c -I DIR DIR/lib<name>.a -L DIR -llmrt -lm -Wl,-rpath,DIR)");
  compile->add_option("--cpu", o.cpu, "target CPU (LLVM name, e.g. znver4, skylake-avx512); default: this host")
      ->check([](const std::string &v) { return v.empty() ? std::string("an empty CPU name") : std::string(); });
  compile->add_option("--l1-ways", o.l1Ways,
                      "ways of the target CPU's L1 data cache, which picks the GEMM tile of weights whose depth is a "
                      "multiple of 1024; default: this host's (with --cpu: unknown, one tile for every weight)")
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  compile->add_option("--dump-ir", o.dumpIR, "write the IR after every pass and lowering step into this directory");
  // --reference runs no compiled pipeline: the pipeline flags cannot go with it.
  auto excludePipelineFlags = [&](CLI::App *cmd, CLI::Option *reference) {
    for (CLI::Option *opt : cmd->get_options())
      if (opt->get_name() == "--naive" || opt->get_name() == "--gemm" || opt->get_name() == "--weights-dtype" ||
          opt->get_name().rfind("--no-", 0) == 0)
        reference->excludes(opt);
  };
  auto addPipelineFlags = [&](CLI::App *cmd) {
    cmd->add_flag("--naive", o.naive, "run no optimization pass (decomposed attention, n-pass mask-and-predict)");
    // --no-<pass> with the pass's name (issue 6: `--no-<pass>` drops one; --no-lm-fuse-attention) or without its
    // lm- prefix (--no-fuse-attention).
    for (const std::string &flag : lmcc::defaultPipeline())
      cmd->add_flag("--no-" + flag.substr(3) + ",--no-" + flag, o.noPass[flag], "drop the " + flag + " pass");
    for (const std::string &flag : lmcc::trainingPipeline())
      cmd->add_flag("--no-" + flag.substr(3) + ",--no-" + flag, o.noPass[flag],
                    "drop the " + flag + " pass (after lm-autodiff, --train)");
    cmd->add_option("--gemm", o.gemm,
                    "generated: vector microkernels over weights packed at load time; eigen: the runtime's Eigen GEMM")
        ->check(CLI::IsMember({"generated", "eigen"}))
        ->capture_default_str();
    cmd->add_option("--weights-dtype", o.weightsDtype,
                    "bf16: the GEMM weights (linear layers, vocabulary projection) packed as bf16 at load time and "
                    "multiplied on AMX tiles or by AVX512_BF16 dot products where the CPU has them (else widened to "
                    "f32 in the kernel)")
        ->check(CLI::IsMember({"f32", "bf16"}))
        ->capture_default_str();
  };
  addPipelineFlags(compile);
  compile->add_flag("--train", o.train, "also compile the training entries (loss, gradients; the header's _train_step)");

  auto addThreads = [&](CLI::App *cmd) {
    cmd->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
  };
  auto addPll = [&](CLI::App *cmd) {
    cmd->add_option("--pll", o.pll, "mask-and-predict scoring (family bilm): original (each piece masked alone) or "
                                    "word-l2r (a piece masked with the rest of its word, to its right)")
        ->check(CLI::IsMember({"original", "word-l2r"}))
        ->capture_default_str();
  };
  auto addMaxMemory = [&](CLI::App *cmd) {
    cmd->add_option("--max-memory", o.maxMemoryMB, "the runtime's workspace limit in MB (default: the runtime's)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  };
  auto *grad = app.add_subcommand("grad", "gradient of one batch's loss for every weight: prints {\"loss\",\"targets\"} "
                                          "(family diformer: {\"loss\",\"tokens\",\"token_nll\",\"length_nll\"}, "
                                          "the two NLLs summed over the batch's rows and sentences; lmcc train's log "
                                          "lines give their means)");
  grad->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  grad->add_option("--weights", o.weights, "safetensors weights")->required();
  grad->add_option("--batch", o.batch, "one JSON object {\"inputs\":[[...]],\"targets\":[[...]]} (ragged)")
      ->required();
  grad->add_option("-o,--output", o.output, "gradients as safetensors (canonical names)")->required();
  auto *gradReference =
      grad->add_flag("--reference", o.reference, "compute with the reference executor (the numeric oracle)");
  addThreads(grad);
  addPipelineFlags(grad);
  addMaxMemory(grad); // the workspace limit holds training calls too (LM_ERR_MEMORY past it)
  excludePipelineFlags(grad, gradReference);

  auto *train = app.add_subcommand(
      "train", "train on a corpus (--data: progress, validation, checkpoints, --resume) or on explicit batches "
               "(--batches: one JSON line per step)");
  train->add_option("SPEC", o.spec, "model spec (TOML; optimizer and objective from [train])")->required();
  auto *dataOpt = train->add_option("--data", o.run.data,
                                    "corpus: one sentence a line, text (the spec's [tokenizer]) or ids (--ids)");
  train->add_option("--batches", o.batches, "explicit batches: one {\"inputs\",\"targets\"} object per line, cycled")
      ->excludes(dataOpt);
  train->add_option("--weights", o.weights, "initial weights (safetensors); --data default: seeded from [train] seed");
  train->add_option("-o,--output", o.output,
                    "--data: the run directory; --batches: output directory (weights.safetensors, trainer.safetensors)");
  train->add_option("--steps", o.steps,
                    "steps (--data default: [train] steps, and the schedule's total; --batches default: one per line)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  train->add_option("--resume", o.resume,
                    "--data: continue the run in -o from its newest complete checkpoint (a flag); --batches: the "
                    "directory to continue from")
      ->expected(0, 1);
  train->add_option("--valid", o.run.valid, "validation corpus (default: a deterministic 1%, at least 100 lines, held out)")
      ->needs(dataOpt);
  train->add_flag("--ids", o.run.ids, "the corpora hold token ids, not text")->needs(dataOpt);
  train->add_flag("--drop-long", o.run.dropLong, "skip lines longer than max_len instead of truncating them")
      ->needs(dataOpt);
  train->add_option("--batch-tokens", o.run.batchTokens, "padded tokens per batch at most")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->capture_default_str()
      ->needs(dataOpt);
  train->add_option("--log-every", o.run.logEvery, "steps between log points (log.jsonl; plain lines off a terminal)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->capture_default_str()
      ->needs(dataOpt);
  train->add_option("--valid-every", o.run.validEvery, "steps between validations (0: only at the end)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str()
      ->needs(dataOpt);
  train->add_option("--checkpoint-every", o.run.checkpointEvery, "steps between checkpoints (0: only at the end)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str()
      ->needs(dataOpt);
  train->add_option("--keep", o.run.keep, "checkpoints kept (the newest)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->capture_default_str()
      ->needs(dataOpt);
  train->add_option("--save-every", o.saveEvery, "diformer: also write the weights every N steps (0: only at the end)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str();
  auto *trainReference = train->add_flag("--reference", o.reference,
                                         "diformer --batches: train on the reference executor (the numeric oracle)");
  addThreads(train);
  addPipelineFlags(train);
  addMaxMemory(train);
  excludePipelineFlags(train, trainReference);

  auto *cache = app.add_subcommand("cache", "the compiled-library cache of score/embed/train: list or clean");
  std::string cacheAction;
  cache->add_option("ACTION", cacheAction, "list: entries, sizes, verification; clean: remove every entry")
      ->required()
      ->check(CLI::IsMember({"list", "clean"}));

  auto *plot = app.add_subcommand("plot", "redraw RUN_DIR/loss.png from RUN_DIR/log.jsonl");
  plot->add_option("RUN_DIR", o.output, "a run directory of lmcc train --data")->required();

  auto *translate = app.add_subcommand("translate", "diformer: decode sources (l2r, r2l, mask-predict, easy-first)");
  translate->add_option("SPEC", o.spec, "model spec (TOML), family diformer")->required();
  translate->add_option("--weights", o.weights, "safetensors weights")->required();
  auto *trIds = translate->add_option("--ids", o.ids, "source ids, one sentence per line ('-' = stdin)");
  translate->add_option("--text", o.text, "source text, one sentence per line (the spec's [tokenizer])")->excludes(trIds);
  translate->add_option("--mode", o.translate.mode, "l2r, r2l, mask-predict or easy-first")->required()
      ->check(CLI::IsMember({"l2r", "r2l", "mask-predict", "easy-first"}));
  translate->add_option("--beam", o.translate.beam, "beam size of l2r / r2l")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  translate->add_option("--length-beam", o.translate.lengthBeam, "lengths tried by mask-predict / easy-first")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  translate->add_option("--iterations", o.translate.iterations, "refinement passes of mask-predict / easy-first")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  translate->add_flag("--rerank", o.translate.rerank, "rank candidates by the mean of their teacher-forced L2R and R2L log-likelihoods");
  auto *translateReference = translate->add_flag(
      "--reference", o.reference, "decode on the reference executor (the numeric oracle) instead of compiled code");
  addThreads(translate);
  addPipelineFlags(translate);
  addMaxMemory(translate);
  excludePipelineFlags(translate, translateReference);

  auto *tokenize = app.add_subcommand("tokenize", "tokenize text with the spec's [tokenizer]: ids, one sentence a line");
  tokenize->add_option("SPEC", o.spec, "model spec (TOML) with a [tokenizer] table")->required();
  tokenize->add_option("--text", o.text, "UTF-8 text, one sentence per line ('-' = stdin)")->required();
  tokenize->add_flag("--tokens", o.tokens, "print the pieces instead of the ids");
  tokenize->add_flag("--truncate", o.truncate, "cut sentences longer than max_len (bos, pieces, eos)");
  addThreads(tokenize); // issue 17: every command takes --threads (tokenizing streams on one thread)

  auto *vocab = app.add_subcommand("vocab", "build a WordPiece vocabulary from a corpus (deterministic)");
  vocab->add_option("--corpus", o.corpus, "UTF-8 text ('-' = stdin)")->required();
  vocab->add_option("--size", o.vocabSize, "vocabulary entries, specials included")
      ->required()
      ->check([](const std::string &v) { // token ids are int32 (runVocab says what the lower bound is)
        errno = 0;
        const long long size = std::strtoll(v.c_str(), nullptr, 10);
        return errno == ERANGE || size > INT32_MAX ? "at most 2^31 - 1 entries (token ids are int32), got " + v
                                                   : std::string();
      });
  vocab->add_flag("--lowercase", o.lowercase, "BERT uncased normalization (lowercase, strip accents)");
  vocab->add_flag("--word-level", o.wordLevel, "whole words: the specials, then the size-5 most frequent words "
                                               "(every other word tokenizes to [UNK])");
  vocab->add_option("-o,--output", o.output, "output vocabulary (one token a line)")->required();
  addThreads(vocab); // accepted as by every command; counting runs on one thread

  auto *importHf = app.add_subcommand("import-hf", "write a spec for a Hugging Face BERT or sentence-transformers folder");
  importHf->add_option("DIR", o.input, "model folder (config.json, vocab.txt, model.safetensors, ...)")->required();
  importHf->add_option("-o,--output", o.output, "output spec (TOML); its [tokenizer] vocab is relative to it")->required();
  importHf->add_option("--name", o.name, "the spec's name (default: the folder's name as a C identifier)");

  CLI::App *runners[2];
  const char *names[2] = {"score", "embed"};
  const char *help[2] = {"score sentences: one JSON object per input line",
                         "embed sentences: pooled last-layer states ([embed] pool), one JSON object per input line"};
  for (int k = 0; k < 2; ++k) {
    runners[k] = app.add_subcommand(names[k], help[k]);
    runners[k]->add_option("SPEC", o.spec, "model spec (TOML)")->required();
    runners[k]->add_option("--weights", o.weights, "safetensors weights (canonical or Hugging Face BERT names)")
        ->required();
    auto *idsOpt =
        runners[k]->add_option("--ids", o.ids, "token ids, one sentence per line ('-' = stdin)")->capture_default_str();
    runners[k]->add_option("--text", o.text, "UTF-8 text, one sentence per line, tokenized by the spec's [tokenizer]")
        ->excludes(idsOpt);
    runners[k]->add_flag("--tokens", o.tokens, "add a \"tokens\" field: the pieces (with --text)");
    runners[k]->add_flag("--truncate", o.truncate, "cut sentences longer than max_len (bos, pieces, eos)");
    if (k == 0)
      runners[k]
          ->add_option("--lambda", o.lambda, "family ngram: the ensemble weight of the n-gram heads in [0, 1] "
                                             "(default: the spec's [ngram] ensemble_lambda)")
          ->check([](const std::string &v) {
            char *end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return !v.empty() && *end == 0 && x >= 0 && x <= 1 ? std::string()
                                                              : "\"" + v + "\" is not a number in [0, 1]";
          });
    auto *referenceFlag = runners[k]->add_flag("--reference", o.reference,
                                               "run the reference executor (the numeric oracle) instead of compiled code");
    if (k == 0)
      runners[k]->add_flag("--timing", o.timing, "print the compiled scoring call's wall time to stderr")
          ->excludes(referenceFlag);
    if (k == 0)
      addPll(runners[k]);
    addMaxMemory(runners[k]);
    addThreads(runners[k]);
    addPipelineFlags(runners[k]);
    excludePipelineFlags(runners[k], referenceFlag);
  }

  // Evaluation (tools/lmcc/Eval.cpp): the model options of score, then each command's own.
  auto addEval = [&](const char *name, const char *what, bool pll) {
    CLI::App *cmd = app.add_subcommand(name, what);
    cmd->add_option("SPEC", o.spec, "model spec (TOML) with a [tokenizer]")->required();
    cmd->add_option("--weights", o.weights, "safetensors weights (canonical or Hugging Face BERT names)")->required();
    cmd->add_flag("--truncate", o.truncate, "cut sentences longer than max_len (bos, pieces, eos); default: an error");
    auto *referenceFlag = cmd->add_flag("--reference", o.reference,
                                        "run the reference executor (the numeric oracle) instead of compiled code");
    if (pll)
      addPll(cmd);
    addMaxMemory(cmd);
    addThreads(cmd);
    addPipelineFlags(cmd);
    excludePipelineFlags(cmd, referenceFlag);
    return cmd;
  };
  auto *sts = addEval("sts", "STS-B: Pearson and Spearman (x 100) of the cosine similarity of the two sentences' "
                             "embeddings against the gold scores: {\"pearson\",\"spearman\",\"pairs\"}", true);
  sts->add_option("--data", o.data, "STS-B tsv ('-' = stdin): GLUE layout (header row; sentences in columns 8 and 9, "
                                    "score in 10) or original (score in 5, sentences in 6 and 7)")->required();
  sts->add_option("--layout", o.layout, "glue or original (default: glue when the first line starts with \"index\")")
      ->check(CLI::IsMember({"glue", "original"}));
  auto *blimp = addEval("blimp", "BLiMP: the share of minimal pairs with score(good) > score(bad), per paradigm, per "
                                 "field and the mean over paradigms (JSON, or --markdown)", true);
  blimp->add_option("--data", o.data, "folder of paradigm files (*.jsonl, *.jsonl.gz; models_summary.jsonl: the "
                                      "paper's models for --markdown)")->required();
  blimp->add_flag("--markdown", o.markdown, "a Markdown table beside the BLiMP paper's models instead of JSON");
  blimp->add_option("--max-pairs", o.maxPairs, "only the first N pairs of each paradigm (stated in the output)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto *rerank = addEval("rerank", "n-best rescoring: am + lambda * lm (+ P * words); one line per utterance, then "
                                   "the WER in percent before (best am) and after", true);
  rerank->add_option("--nbest", o.nbest, "JSON lines {\"id\",\"ref\",\"hyps\":[{\"text\",\"score\"},...]}")
      ->required();
  auto *rerankLambda = rerank->add_option("--lambda", o.rerankLambda, "the language model's weight");
  rerank->add_option("--tune", o.tune, "an n-best dev file: lambda = 0, 0.05, ..., 2 with the lowest WER on it "
                                       "(ties: the smallest), then applied to --nbest")->excludes(rerankLambda);
  rerank->add_option("--length-penalty", o.lengthPenalty, "add P times the hypothesis' words to its score");

  // Integer options are decimal, as the ids files are: CLI11 converts with strtoll(base 0), which read --seed 010 as
  // 8 and --threads 0x2 as 2. Each integer option's value must be [+-]digits; leading zeros are dropped.
  const CLI::Validator decimal(
      [](std::string &value) -> std::string {
        if (value.empty()) // the option's own check, or CLI11's conversion, says what an empty value is
          return "";
        const size_t sign = value[0] == '-' || value[0] == '+' ? 1 : 0;
        if (value.size() == sign || !std::all_of(value.begin() + long(sign), value.end(), ::isdigit))
          return "'" + value + "' is not a decimal integer";
        const size_t first = std::min(value.find_first_not_of('0', sign), value.size() - 1);
        value = value.substr(0, sign) + value.substr(first);
        return "";
      },
      "", "decimal");
  std::function<void(CLI::App *)> decimalIntegers = [&](CLI::App *cmd) {
    for (CLI::Option *opt : cmd->get_options())
      if (opt->get_type_name().rfind("INT", 0) == 0 || opt->get_type_name().rfind("UINT", 0) == 0)
        opt->transform(decimal);
    for (CLI::App *sub : cmd->get_subcommands([](CLI::App *) { return true; }))
      decimalIntegers(sub);
  };
  decimalIntegers(&app);
  // An unknown command word: name it and the commands (CLI11 alone says "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App *sub : app.get_subcommands([](CLI::App *) { return true; }))
      names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::string list;
      for (const std::string &name : names)
        list += (list.empty() ? "" : ", ") + name;
      std::cerr << "error: unknown command '" << argv[1] << "'; the commands are " << list << "\n";
      if (std::string(argv[1]) == "bench")
        std::cerr << "benchmarks run from the source tree: scripts/bench.sh [--quick] (README: Benchmarks)\n";
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    int code = app.exit(e); // --help / --version print to stdout: a failed write is an output error
    if (code == 0 && (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout.flush())) {
      std::cerr << "error: cannot write the output to stdout\n";
      return kExitInput;
    }
    return code == 0 ? kExitOk : kExitUsage;
  }

  // Everything written to stdout must reach it: a full disk or a closed pipe is an output error (exit 1).
  auto flushed = [](int rc) {
    std::cout.flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) {
      std::cerr << "error: cannot write the output to stdout: " << std::strerror(errno ? errno : EIO) << "\n";
      return rc == kExitOk ? kExitInput : rc;
    }
    return rc;
  };
  auto dispatch = [&]() -> int {
    if (o.weightsDtype == "bf16" && o.gemm == "eigen") // options that exclude each other: a usage error (exit 2)
      throw UsageError("--weights-dtype bf16 needs --gemm generated (the Eigen GEMM reads fp32 weights)");
    if (*check)
      return runCheck(o);
    if (*emit)
      return runEmit(o);
    if (*init)
      return runInit(o);
    if (*convert)
      return runConvert(o);
    if (*compile)
      return runCompile(o);
    if (*grad)
      return runGrad(o);
    if (*train && o.reference && (!o.run.data.empty() || lmcc::loadSpec(o.spec).family != lmcc::Family::Diformer))
      throw UsageError("--reference applies to lmcc train --batches of family \"diformer\"");
    if (*train && !o.run.data.empty())
      return runTrainData(o, train->count("--resume") > 0);
    if (*train)
      return runTrainBatches(o);
    if (*cache)
      return lmcc::cli::runCache(cacheAction);
    if (*plot) {
      lmcc::cli::plotRun(o.output);
      return kExitOk;
    }
    if (*tokenize)
      return runTokenize(o);
    if (*importHf && importHf->count("--name") && o.name.empty())
      throw UsageError("--name is empty (the spec's name: a C identifier)");
    if (*translate) {
      lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
      if (spec.family != lmcc::Family::Diformer) { // not supported for the family: exit 3, as embed of a diformer
        std::cerr << "error: " << o.spec << ": lmcc translate needs family \"diformer\"\n";
        return kExitUnsupported;
      }
      std::optional<lmcc::Tokenizer> tok;
      if (!o.text.empty())
        tok = loadTokenizer(spec);
      std::optional<CompiledModel> compiled;
      if (!o.reference) {
        setRuntime(o);
        compiled.emplace(spec, o, o.weights);
      }
      return lmcc::cli::diformerTranslate(spec, o.weights, o.text.empty() ? o.ids : o.text, tok ? &*tok : nullptr,
                                          o.translate, compiled ? &*compiled : nullptr);
    }
    if (*importHf)
      return runImportHf(o);
    if (*vocab)
      return runVocab(o);
    if (*sts)
      return runSts(o);
    if (*blimp)
      return runBlimp(o);
    if (*rerank) {
      if (!*rerankLambda && o.tune.empty())
        throw UsageError("lmcc rerank needs --lambda X or --tune DEV_FILE");
      if (!std::isfinite(o.rerankLambda) || !std::isfinite(o.lengthPenalty))
        throw UsageError("--lambda and --length-penalty must be finite numbers");
      o.lengthPenaltyGiven = rerank->count("--length-penalty") > 0;
      return runRerank(o);
    }
    return runScoreOrEmbed(o, bool(*runners[0]));
  };
  try {
    return flushed(dispatch());
  } catch (const UsageError &e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::bad_alloc &) {
    std::cerr << "error: out of memory (the input or the model is too large for this machine)\n";
    return kExitResource;
  } catch (const ResourceError &e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitResource;
  } catch (const lmcc::SpecError &e) {
    std::cerr << e.what() << "\n";
  } catch (const lmcc::WeightError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const InputError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::invalid_argument &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const lmcc::train::CorpusError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const lmcc::cli::RunError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::overflow_error &e) { // --stats of a spec too large to count
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::exception &e) {
    std::cerr << "lmcc: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  return kExitInput;
}
