//===- lmcc.cpp - The lmcc driver ---------------------------------------------===//
//
// Subcommands: check, emit-mlir, init, convert, score, embed. Every user error
// (spec, weights, ids, flags) is reported on stderr with the file and position or
// field it concerns; stdout receives nothing unless the whole command succeeds.
//
//===----------------------------------------------------------------------===//
#include "frontend/MLIRGen.h"
#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"
#include "runtime/weights/Weights.h"

#include <CLI/CLI.hpp>

#include <cerrno>
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
  3  not supported yet by this build (the message says what)
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
  std::string spec, weights, ids = "-", output, from, input;
  bool json = false, reference = false;
  int threads = 1;
  uint64_t seed = 0;
};

int runCheck(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::cout << (o.json ? lmcc::toJson(spec) + "\n" : lmcc::toToml(spec));
  return kExitOk;
}

int runEmit(const Options &o) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  std::string text = lmcc::emitMLIR(spec);
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

int runScoreOrEmbed(const Options &o, bool score) {
  lmcc::ModelSpec spec = lmcc::loadSpec(o.spec);
  if (!o.reference) {
    std::cerr << "lmcc: compiled execution is not built yet; run with --reference (the reference executor)\n";
    return kExitUnsupported;
  }
  if (spec.family == lmcc::Family::NGram || spec.family == lmcc::Family::Diformer) {
    std::cerr << "lmcc: " << o.spec << ": family \"" << lmcc::toString(spec.family)
              << "\" is parsed and emitted as IR only; executing it comes with its training objective\n";
    return kExitUnsupported;
  }
  lmcc::WeightSet weights = lmcc::loadModelWeights(o.weights, spec);
  std::vector<std::vector<int32_t>> sentences = readIds(o.ids, spec);
  std::string out;
  if (score) {
    auto results = lmcc::reference::score(spec, weights, sentences, o.threads);
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
    auto results = lmcc::reference::embed(spec, weights, sentences, o.threads);
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

  auto *init = app.add_subcommand("init", "write a seeded BERT-style random initialization");
  init->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  init->add_option("--seed", o.seed, "random seed")->required();
  init->add_option("-o,--output", o.output, "output safetensors file")->required();

  auto *convert = app.add_subcommand("convert", "convert a checkpoint to canonical weight names");
  convert->add_option("SPEC", o.spec, "model spec (TOML)")->required();
  convert->add_option("--from", o.from, "source naming: hf (Hugging Face BertForMaskedLM)")->required();
  convert->add_option("INPUT", o.input, "input safetensors file")->required();
  convert->add_option("-o,--output", o.output, "output safetensors file")->required();

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
    runners[k]->add_flag("--reference", o.reference, "run the reference executor (the numeric oracle)");
    runners[k]->add_option("--threads", o.threads, "worker threads (results do not depend on it)")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
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
