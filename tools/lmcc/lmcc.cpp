//===- lmcc.cpp - The lmcc driver ---------------------------------------------===//
//
// Subcommands: check, emit-mlir, init, convert, score, embed. Every user error
// (spec, weights, ids, flags) is reported on stderr with the file and position or
// field it concerns; stdout receives nothing unless the whole command succeeds.
//
//===----------------------------------------------------------------------===//
#include "driver/Compile.h"
#include "codegen/Stats.h"
#include "passes/Passes.h"
#include "frontend/MLIRGen.h"
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "runtime/lib/lmrt.h"
#include "runtime/weights/ModelWeights.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace {

constexpr int kExitOk = 0, kExitInput = 1, kExitUsage = 2, kExitUnsupported = 3, kExitInternal = 4;

const char *kExitCodes = R"(Exit codes:
  0  success
  1  invalid input: spec, weights, ids or output file (the message names the file and position, field or tensor)
  2  invalid command line
  3  not supported yet by this build, or compilation failed (the message says what)
  4  internal error (please report))";

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Reads one sentence of token ids per line. A final newline does not start a
/// line; empty lines, non-integers, ids outside [0, vocab) and lines longer than
/// max_len are errors naming `source:line`.
std::vector<std::vector<int32_t>> readIds(const std::string &path, const lmcc::ModelSpec &spec) {
  std::string text;
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw InputError(path + ": cannot open the ids file");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const std::string name = path == "-" ? "<stdin>" : path;
  std::vector<std::vector<int32_t>> sentences;
  size_t pos = 0;
  int64_t lineNo = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    ++lineNo;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    std::vector<int32_t> ids;
    size_t i = 0;
    int64_t column = 0;
    while (i < line.size()) {
      if (line[i] == ' ' || line[i] == '\t') {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t')
        ++j;
      std::string token = line.substr(i, j - i);
      ++column;
      errno = 0;
      char *endp = nullptr;
      long long value = std::strtoll(token.c_str(), &endp, 10);
      std::string where = name + ":" + std::to_string(lineNo) + ": token " + std::to_string(column);
      if (*endp || errno == ERANGE || token.empty())
        throw InputError(where + " '" + token + "' is not an integer token id");
      if (value < 0 || value >= spec.dims.vocab)
        throw InputError(where + " (id " + token + ") is outside the vocabulary [0, " +
                         std::to_string(spec.dims.vocab) + ")");
      ids.push_back(int32_t(value));
      i = j;
    }
    if (ids.empty())
      throw InputError(name + ":" + std::to_string(lineNo) + ": empty line (every line must hold one sentence)");
    if (int64_t(ids.size()) > spec.dims.maxLen)
      throw InputError(name + ":" + std::to_string(lineNo) + ": sentence of " + std::to_string(ids.size()) +
                       " tokens is longer than max_len = " + std::to_string(spec.dims.maxLen));
    sentences.push_back(std::move(ids));
  }
  return sentences;
}

/// Formats a float with 9 significant digits; non-finite values are an error.
void appendNumber(std::string &out, double v, const char *what, size_t line) {
  if (!std::isfinite(v))
    throw InputError("non-finite " + std::string(what) + " for input line " + std::to_string(line + 1) +
                     " (check the weights)");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  out += buf;
}

struct Options {
  std::string spec, weights, ids = "-", output, from, input, cpu, dumpIR, gemm = "generated";
  bool json = false, reference = false, embedWeights = false, staticArchive = false, naive = false, stats = false;
  std::map<std::string, bool> noPass; // pass flag -> --no-<pass> given
  int64_t statsN = 0;
  int threads = 1;
  uint64_t seed = 0;
  bool train = false;
  std::string batch, batches, resume;
  int64_t steps = 0;
};

int runCheck(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::cout << (o.json ? lmcc::toJson(spec) + "\n" : lmcc::toToml(spec));
  return kExitOk;
}

int runEmit(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::string text = lmcc::emitMLIR(spec, o.train);
  if (text.empty()) {
    std::cerr << "lmcc: internal error: the IR built for " << o.spec << " does not verify\n";
    return kExitInternal;
  }
  if (o.output.empty()) {
    std::cout << text;
  } else {
    std::ofstream out(o.output);
    if (!(out << text))
      throw InputError(o.output + ": cannot write");
  }
  return kExitOk;
}

int runInit(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  lmcc::writeSafetensors(o.output, lmcc::initWeights(spec, o.seed));
  return kExitOk;
}

int runConvert(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (o.from != "hf")
    throw InputError("--from " + o.from + ": only \"hf\" (Hugging Face BertForMaskedLM names) is supported");
  lmcc::WeightSet raw = lmcc::readSafetensors(o.input);
  lmcc::WeightSet canonical = lmcc::importHuggingFaceBert(raw, spec, o.input);
  lmcc::validateWeights(canonical, spec, o.input);
  canonical.metadata["name"] = spec.name;
  canonical.metadata["spec_hash"] = lmcc::specHash(spec);
  lmcc::writeSafetensors(o.output, canonical);
  return kExitOk;
}

namespace fs = std::filesystem;

/// Where this lmcc's runtime (liblmrt.so, lmrt.h) lives: <prefix>/lib next to <prefix>/bin/lmcc.
std::string runtimeDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "lib").string();
}

/// The pipeline the flags ask for: --naive runs no pass, --no-<pass> drops one.
void applyPipelineFlags(const Options &o, lmcc::driver::LibraryOptions &options) {
  options.naive = o.naive;
  options.gemm = o.gemm;
  options.train = o.train;
  for (const auto &[flag, off] : o.noPass)
    if (off)
      options.disabledPasses.insert(flag);
}

/// A short tag naming the pipeline, so cached libraries of different pipelines never mix.
std::string pipelineTag(const lmcc::driver::LibraryOptions &options) {
  if (options.naive)
    return "naive-" + options.gemm + (options.train ? "-train" : "");
  std::string tag = "opt-" + options.gemm;
  for (const std::string &flag : options.disabledPasses)
    tag += "-no" + flag.substr(2);
  return options.train ? tag + "-train" : tag;
}

/// A cached compiled library of `spec` for this lmcc binary, compiled on first use.
std::string cachedLibrary(const lmcc::ModelSpec &spec, const Options &o) {
  const char *env = std::getenv("LMCC_CACHE_DIR");
  const char *xdg = std::getenv("XDG_CACHE_HOME");
  const char *home = std::getenv("HOME");
  fs::path cache = env && *env ? fs::path(env)
                   : xdg && *xdg ? fs::path(xdg) / "lmcc"
                                 : fs::path(home && *home ? home : "/tmp") / ".cache" / "lmcc";
  struct stat st {};
  ::stat("/proc/self/exe", &st);
  std::string stamp = std::to_string(st.st_size) + "-" + std::to_string(st.st_mtime);
  lmcc::driver::LibraryOptions options;
  applyPipelineFlags(o, options);
  fs::path dir = cache / (spec.name + "-" + lmcc::specHash(spec) + "-" + pipelineTag(options) + "-" + stamp);
  fs::path lib = dir / ("lib" + spec.name + ".so");
  if (fs::exists(lib))
    return lib.string();
  // Compile into a private directory, then move it into place (concurrent lmcc runs are safe).
  fs::path tmp = cache / (".tmp-" + spec.name + "-" + std::to_string(::getpid()));
  options.outputDir = tmp.string();
  options.runtimeDir = runtimeDir();
  if (std::string err = lmcc::driver::compileLibrary(spec, options); !err.empty())
    throw std::runtime_error("compiling " + spec.name + ": " + err);
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec)
    fs::remove_all(tmp, ec);
  return lib.string();
}

/// Scores or embeds through the compiled library (JIT by way of a cached library).
struct CompiledModel {
  void *handle = nullptr;
  lm_model *model = nullptr;
  CompiledModel(const lmcc::ModelSpec &spec, const Options &o, const std::string &weightsPath = "") {
    const std::string &weights = weightsPath.empty() ? o.weights : weightsPath;
    std::string lib = cachedLibrary(spec, o);
    handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      throw std::runtime_error(std::string("cannot load ") + lib + ": " + ::dlerror());
    auto descriptor = reinterpret_cast<const lm_model_desc *(*)()>(::dlsym(handle, (spec.name + "_descriptor").c_str()));
    if (!descriptor)
      throw std::runtime_error(lib + " has no " + spec.name + "_descriptor");
    std::string path = weights;
    lmcc::WeightSet raw = lmcc::readSafetensors(weights);
    fs::path converted;
    if (lmcc::isHuggingFaceBert(raw)) { // the runtime reads canonical names: convert once
      converted = fs::temp_directory_path() / ("lmcc-" + std::to_string(::getpid()) + ".safetensors");
      lmcc::writeSafetensors(converted.string(), lmcc::importHuggingFaceBert(raw, spec, weights));
      path = converted.string();
    }
    int status = lm_rt_load(descriptor(), path.c_str(), &model);
    if (!converted.empty())
      fs::remove(converted);
    if (status != LM_OK)
      throw InputError(lm_last_error());
  }
  ~CompiledModel() {
    if (model)
      lm_rt_free(model);
  }
  const lm_model_desc *desc() const { return reinterpret_cast<const lm_model_desc *const *>(model)[0]; }
};

// --- Training -----------------------------------------------------------------------

/// One batch of `lmcc grad` / `lmcc train`: {"inputs":[[...],...],"targets":[[...],...]}, ragged.
struct TrainBatch {
  std::vector<std::vector<int32_t>> raggedInputs, raggedTargets;
  std::vector<int32_t> inputs, targets, lengths;
  int32_t batch = 0, stride = 1;
  int64_t targetCount = 0;
};

TrainBatch parseBatch(const nlohmann::json &j, const std::string &where, const lmcc::ModelSpec &spec) {
  if (!j.is_object() || !j.contains("inputs") || !j.contains("targets"))
    throw InputError(where + ": expected an object {\"inputs\": [[...], ...], \"targets\": [[...], ...]}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "inputs" && it.key() != "targets")
      throw InputError(where + ": unknown key \"" + it.key() + "\" (valid: inputs, targets)");
  const nlohmann::json &in = j["inputs"], &tg = j["targets"];
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
    for (size_t i = 0; i < in[s].size(); ++i) {
      const std::string at = where + ": sentence " + std::to_string(s) + ", position " + std::to_string(i);
      if (!in[s][i].is_number_integer() || !tg[s][i].is_number_integer())
        throw InputError(at + ": ids and targets must be integers");
      int64_t x = in[s][i].get<int64_t>(), y = tg[s][i].get<int64_t>();
      if (x < 0 || x >= spec.dims.vocab)
        throw InputError(at + ": input id " + std::to_string(x) + " outside the vocabulary [0, " +
                         std::to_string(spec.dims.vocab) + ")");
      if (y < -1 || y >= spec.dims.vocab)
        throw InputError(at + ": target " + std::to_string(y) + " outside [0, " + std::to_string(spec.dims.vocab) +
                         ") (or -1 for none)");
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

std::string readText(const std::string &path, const char *what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(path + ": cannot open the " + std::string(what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parseJson(const std::string &text, const std::string &where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error &e) {
    throw InputError(where + ": invalid JSON: " + e.what());
  }
}

/// The batches file of `lmcc train`: one batch object per non-empty line.
std::vector<TrainBatch> readBatches(const std::string &path, const lmcc::ModelSpec &spec) {
  std::string text = readText(path, "batches file");
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

void checkTrainable(const lmcc::ModelSpec &spec) {
  if (spec.family != lmcc::Family::UniLM && spec.family != lmcc::Family::BiLM && spec.family != lmcc::Family::TTA)
    throw InputError(std::string("family \"") + lmcc::toString(spec.family) + "\" has no training entry yet");
}

int runGrad(Options o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  checkTrainable(spec);
  TrainBatch b = parseBatch(parseJson(readText(o.batch, "batch file"), o.batch), o.batch, spec);
  if (o.output.empty())
    throw InputError("lmcc grad needs -o GRADS.safetensors");
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
    lm_set_num_threads(o.threads);
    const lm_model_desc *d = m.desc();
    std::vector<float> grad(size_t(lm_rt_num_params(d)));
    if (lm_rt_loss_and_grad(m.model, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride, &loss,
                            grad.data()) != LM_OK)
      throw InputError(lm_last_error());
    for (int32_t i = 0; i < d->num_tensors; ++i) {
      const char *name = nullptr;
      int64_t offset = 0, count = 0;
      lm_rt_param_info(d, i, &name, &offset, &count);
      lmcc::Tensor t;
      t.shape.assign(d->tensors[i].shape, d->tensors[i].shape + d->tensors[i].rank);
      t.data.assign(grad.begin() + offset, grad.begin() + offset + count);
      out.tensors.emplace(name, std::move(t));
    }
  }
  out.metadata["name"] = spec.name;
  out.metadata["spec_hash"] = lmcc::specHash(spec);
  out.metadata["loss"] = std::to_string(loss);
  const std::string tmp = o.output + ".tmp-" + std::to_string(::getpid());
  lmcc::writeSafetensors(tmp, out);
  if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError(o.output + ": cannot write");
  }
  std::string line = "{\"loss\":";
  appendNumber(line, loss, "loss", 0);
  line += ",\"targets\":" + std::to_string(b.targetCount) + "}\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitInput;
}

int runTrainBatches(Options o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  checkTrainable(spec);
  std::vector<TrainBatch> batches = readBatches(o.batches, spec);
  if (o.output.empty())
    throw InputError("lmcc train needs -o DIR");
  if (o.weights.empty() && o.resume.empty())
    throw InputError("lmcc train needs --weights W (initial weights) or --resume DIR");
  const fs::path resume(o.resume);
  if (!o.resume.empty())
    for (const char *file : {"weights.safetensors", "trainer.safetensors"})
      if (!fs::exists(resume / file))
        throw InputError((resume / file).string() + ": not found (--resume needs a directory written by lmcc train)");
  o.train = true;
  CompiledModel m(spec, o, o.resume.empty() ? o.weights : (resume / "weights.safetensors").string());
  lm_set_num_threads(o.threads);
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
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t step = lm_rt_trainer_steps(trainer);
    const TrainBatch &b = batches[size_t(step % int64_t(batches.size()))];
    float loss = 0;
    double lr = 0, norm = 0;
    if (lm_rt_train_step_ex(trainer, b.inputs.data(), b.targets.data(), b.lengths.data(), b.batch, b.stride, &loss,
                            &lr, &norm) != LM_OK)
      throw InputError("step " + std::to_string(step + 1) + ": " + lm_last_error());
    std::string line = "{\"step\":" + std::to_string(step + 1) + ",\"loss\":";
    appendNumber(line, loss, "loss", size_t(step));
    line += ",\"lr\":";
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", lr);
    line += buf;
    line += ",\"grad_norm\":";
    appendNumber(line, norm, "gradient norm", size_t(step));
    line += "}\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  }
  if (lm_rt_save_weights(m.model, (fs::path(o.output) / "weights.safetensors").c_str()) != LM_OK ||
      lm_rt_trainer_save(trainer, (fs::path(o.output) / "trainer.safetensors").c_str()) != LM_OK)
    throw InputError(lm_last_error());
  return kExitOk;
}

struct Padded {
  std::vector<int32_t> ids, lengths;
  int32_t stride = 1;
  explicit Padded(const std::vector<std::vector<int32_t>> &sentences) {
    for (const auto &s : sentences)
      stride = std::max<int32_t>(stride, int32_t(s.size()));
    ids.assign(sentences.size() * stride, 0);
    for (size_t b = 0; b < sentences.size(); ++b) {
      std::copy(sentences[b].begin(), sentences[b].end(), ids.begin() + b * stride);
      lengths.push_back(int32_t(sentences[b].size()));
    }
  }
};

std::vector<lmcc::reference::ScoreResult> compiledScore(const lmcc::ModelSpec &spec, const Options &o,
                                                        const std::vector<std::vector<int32_t>> &sentences) {
  CompiledModel m(spec, o);
  Padded p(sentences);
  int32_t batch = int32_t(sentences.size());
  std::vector<float> lp(size_t(batch) * p.stride), scores(batch);
  std::vector<int32_t> nScored(batch);
  lm_set_num_threads(o.threads);
  if (batch && lm_rt_score_ex(m.model, p.ids.data(), p.lengths.data(), batch, p.stride, lp.data(), scores.data(),
                              nScored.data()) != LM_OK)
    throw std::runtime_error(lm_last_error());
  std::vector<lmcc::reference::ScoreResult> results(batch);
  for (int32_t b = 0; b < batch; ++b) {
    results[b].tokenLogprobs.assign(lp.begin() + size_t(b) * p.stride, lp.begin() + size_t(b) * p.stride + p.lengths[b]);
    results[b].score = scores[b];
    results[b].nScored = nScored[b];
  }
  return results;
}

std::vector<std::vector<float>> compiledEmbed(const lmcc::ModelSpec &spec, const Options &o,
                                              const std::vector<std::vector<int32_t>> &sentences) {
  CompiledModel m(spec, o);
  Padded p(sentences);
  int32_t batch = int32_t(sentences.size());
  std::vector<float> out(size_t(batch) * spec.dims.dModel);
  lm_set_num_threads(o.threads);
  if (batch && lm_rt_embed(m.model, p.ids.data(), p.lengths.data(), batch, p.stride, out.data()) != LM_OK)
    throw std::runtime_error(lm_last_error());
  std::vector<std::vector<float>> results(batch);
  for (int32_t b = 0; b < batch; ++b)
    results[b].assign(out.begin() + size_t(b) * spec.dims.dModel, out.begin() + size_t(b + 1) * spec.dims.dModel);
  return results;
}

void printStats(const std::vector<lmcc::codegen::EntryStats> &stats) {
  for (const auto &entry : stats)
    if (entry.entry.rfind("fold_", 0) != 0) // load-time functions (lm-fold-constants) are not entry points
      std::cout << (entry.entry == "loss_grad" ? std::string("train") : entry.entry) << ": flops=" << entry.flops
                << " temp_bytes=" << entry.tempBytes << "\n";
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
  printStats(lmcc::codegen::countStats(*module, o.statsN));
  return kExitOk;
}

int runCompile(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (o.stats) {
    if (o.statsN < 1 || o.statsN > spec.dims.maxLen)
      throw InputError("--n " + std::to_string(o.statsN) + " must be in [1, max_len = " +
                       std::to_string(spec.dims.maxLen) + "]");
    if (o.output.empty())
      return runStats(o, spec);
  } else if (o.output.empty()) {
    throw InputError("lmcc compile needs -o DIR (or --stats --n N)");
  }
  lmcc::driver::LibraryOptions options;
  applyPipelineFlags(o, options);
  options.outputDir = o.output;
  options.weightsPath = o.weights;
  options.embedWeights = o.embedWeights;
  options.staticArchive = o.staticArchive;
  options.cpu = o.cpu;
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

int runScoreOrEmbed(const Options &o, bool score) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (spec.family == lmcc::Family::NGram || spec.family == lmcc::Family::Diformer) {
    std::cerr << "lmcc: " << o.spec << ": family \"" << lmcc::toString(spec.family)
              << "\" is parsed and emitted as IR only; executing it comes with its training objective\n";
    return kExitUnsupported;
  }
  std::vector<std::vector<int32_t>> sentences = readIds(o.ids, spec);
  std::string out;
  if (score) {
    std::vector<lmcc::reference::ScoreResult> results;
    if (o.reference)
      results = lmcc::reference::score(spec, lmcc::loadModelWeights(o.weights, spec), sentences, o.threads);
    else
      results = compiledScore(spec, o, sentences);
    for (size_t s = 0; s < results.size(); ++s) {
      out += "{\"token_logprobs\":[";
      for (size_t i = 0; i < results[s].tokenLogprobs.size(); ++i) {
        if (i)
          out += ',';
        appendNumber(out, results[s].tokenLogprobs[i], "log-probability", s);
      }
      out += "],\"score\":";
      appendNumber(out, results[s].score, "score", s);
      out += ",\"n_scored\":" + std::to_string(results[s].nScored) + "}\n";
    }
  } else {
    auto results = o.reference ? lmcc::reference::embed(spec, lmcc::loadModelWeights(o.weights, spec), sentences, o.threads)
                               : compiledEmbed(spec, o, sentences);
    for (size_t s = 0; s < results.size(); ++s) {
      out += "{\"embedding\":[";
      for (size_t i = 0; i < results[s].size(); ++i) {
        if (i)
          out += ',';
        appendNumber(out, results[s][i], "embedding value", s);
      }
      out += "]}\n";
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? kExitOk : kExitInput;
}

} // namespace

int main(int argc, char **argv) {
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
  init->add_option("--seed", o.seed, "random seed")->required();
  init->add_option("-o,--output", o.output, "output safetensors file")->required();

  auto *convert = app.add_subcommand("convert", "convert a checkpoint to canonical weight names");
  convert->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  convert->add_option("--from", o.from, "source naming: hf (Hugging Face BertForMaskedLM)")->required();
  convert->add_option("INPUT", o.input, "input safetensors file")->required();
  convert->add_option("-o,--output", o.output, "output safetensors file")->required();

  auto *compile = app.add_subcommand("compile", "compile a model into DIR/lib<name>.so and DIR/<name>.h");
  compile->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  compile->add_option("-o,--output", o.output, "output directory (required unless --stats)");
  compile->add_flag("--stats", o.stats, "print '<entry>: flops=<int> temp_bytes=<int>' per entry point");
  compile->add_option("--n", o.statsN, "sentence length for --stats (batch 1)");
  compile->add_option("--weights", o.weights, "weights to validate now (and bake in with --embed-weights)");
  compile->add_flag("--embed-weights", o.embedWeights, "bake the weights into the library (_load takes NULL)");
  compile->add_flag("--static", o.staticArchive, "also write lib<name>.a (link it with liblmrt.so)");
  compile->add_option("--cpu", o.cpu, "target CPU (LLVM name, e.g. znver4, skylake-avx512); default: this host");
  compile->add_option("--dump-ir", o.dumpIR, "write the IR after every pass and lowering step into this directory");
  auto addPipelineFlags = [&](CLI::App *cmd) {
    cmd->add_flag("--naive", o.naive, "run no optimization pass (decomposed attention, n-pass mask-and-predict)");
    for (const std::string &flag : lmcc::defaultPipeline())
      cmd->add_flag("--no-" + flag.substr(3), o.noPass[flag], "drop the " + flag + " pass");
    cmd->add_option("--gemm", o.gemm,
                    "generated: vector microkernels over weights packed at load time; eigen: the runtime's Eigen GEMM")
        ->check(CLI::IsMember({"generated", "eigen"}))
        ->capture_default_str();
  };
  addPipelineFlags(compile);
  compile->add_flag("--train", o.train, "also compile the training entries (loss, gradients; the header's _train_step)");

  auto *grad = app.add_subcommand("grad", "gradient of one batch's loss for every weight: prints {\"loss\",\"targets\"}");
  grad->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  grad->add_option("--weights", o.weights, "safetensors weights")->required();
  grad->add_option("--batch", o.batch, "one JSON object {\"inputs\":[[...]],\"targets\":[[...]]} (ragged)")
      ->required();
  grad->add_option("-o,--output", o.output, "gradients as safetensors (canonical names)")->required();
  grad->add_flag("--reference", o.reference, "compute with the reference executor (the numeric oracle)");
  grad->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  addPipelineFlags(grad);

  auto *train = app.add_subcommand("train", "optimizer steps on explicit batches: one JSON line per step");
  train->add_option("SPEC", o.spec, "model spec (TOML; optimizer settings from [train])")->required();
  train->add_option("--weights", o.weights, "initial weights (safetensors)");
  train->add_option("--batches", o.batches, "one batch object per line, cycled")->required();
  train->add_option("-o,--output", o.output, "output directory: weights.safetensors, trainer.safetensors")
      ->required();
  train->add_option("--steps", o.steps, "steps to run (default: one per line of the batches file)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  train->add_option("--resume", o.resume, "continue from a directory written by lmcc train");
  train->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  addPipelineFlags(train);

  CLI::App *runners[2];
  const char *names[2] = {"score", "embed"};
  const char *help[2] = {"score sentences: one JSON object per input line",
                         "embed sentences: mean-pooled last-layer states, one JSON object per input line"};
  for (int k = 0; k < 2; ++k) {
    runners[k] = app.add_subcommand(names[k], help[k]);
    runners[k]->add_option("SPEC", o.spec, "model spec (TOML)")->required();
    runners[k]->add_option("--weights", o.weights, "safetensors weights (canonical or Hugging Face BERT names)")
        ->required();
    runners[k]->add_option("--ids", o.ids, "token ids, one sentence per line ('-' = stdin)")->capture_default_str();
    runners[k]->add_flag("--reference", o.reference,
                         "run the reference executor (the numeric oracle) instead of compiled code");
    runners[k]->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    addPipelineFlags(runners[k]);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  try {
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
    if (*train)
      return runTrainBatches(o);
    return runScoreOrEmbed(o, bool(*runners[0]));
  } catch (const lmcc::SpecError &e) {
    std::cerr << e.what() << "\n";
  } catch (const lmcc::WeightError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const InputError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::invalid_argument &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const std::exception &e) {
    std::cerr << "lmcc: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  return kExitInput;
}
