//===- Diformer.cpp - lmcc's Diformer commands ------------------------------===//
#include "tools/lmcc/Diformer.h"
#include "tools/lmcc/Common.h"

#include "runtime/lib/Tokenizer.h"
#include "runtime/reference/Diformer.h"
#include "runtime/reference/DiformerDecode.h"
#include "runtime/train/Corpus.h"
#include "runtime/train/Optimizer.h"
#include "runtime/weights/ModelWeights.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace lmcc::cli {

namespace df = lmcc::reference::diformer;

namespace {

std::string readAll(const std::string &path, const char *what) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::invalid_argument(path + ": cannot open the " + std::string(what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Lines of a file (a final newline does not start a line; "\r\n" accepted), with 1-based numbers.
std::vector<std::pair<int64_t, std::string>> lines(const std::string &text) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::istringstream in(text);
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    out.push_back({no, line});
  }
  return out;
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<int32_t> parseInts(const std::string &field, const std::string &where) {
  std::vector<int32_t> out;
  std::istringstream in(field);
  std::string tok;
  while (in >> tok) {
    // Decimal only: not '+3', a leading \v, "12abc" or an embedded NUL ("12\0xyz", issue 21).
    const std::optional<long long> v = train::parseDecimal(tok);
    if (!v || *v < INT32_MIN || *v > INT32_MAX) {
      std::string shown;
      for (char c : tok)
        shown += c == '\0' ? std::string("\\0") : std::string(1, c);
      throw std::invalid_argument(where + ": '" + shown + "' is not an integer");
    }
    out.push_back(int32_t(*v));
  }
  return out;
}

/// Source or target of a line: ids, or text through the tokenizer (bos + pieces + eos).
std::vector<int32_t> sequence(const std::string &field, const Tokenizer *tok, const std::string &where) {
  if (!tok)
    return parseInts(field, where);
  try {
    return tok->encodeSentence(trim(field), where);
  } catch (const TokenizerError &e) {
    throw std::invalid_argument(e.what());
  }
}

df::Example parseLine(const ModelSpec &spec, const std::string &line, const Tokenizer *tok, const std::string &where) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (;;) {
    size_t bar = line.find("|||", pos);
    parts.push_back(line.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos));
    if (bar == std::string::npos)
      break;
    pos = bar + 3;
  }
  if (parts.size() < 3 || parts.size() > 4)
    throw std::invalid_argument(where + ": expected SRC ||| TGT ||| DIRS [||| HIDE], got " +
                                std::to_string(parts.size()) + " field(s)");
  df::Example e;
  e.src = sequence(parts[0], tok, where + ": SRC");
  e.tgt = sequence(parts[1], tok, where + ": TGT");
  const int64_t n = int64_t(e.tgt.size());
  try {
    e.dirs = df::parseDirections(trim(parts[2]), n);
  } catch (const std::invalid_argument &err) {
    throw std::invalid_argument(where + ": " + err.what());
  }
  std::vector<int32_t> hide = parts.size() == 4 ? parseInts(parts[3], where + ": HIDE") : std::vector<int32_t>();
  e.hidden.assign(size_t(n), {});
  for (int32_t h : hide)
    if (h < 1 || h > n - 2)
      throw std::invalid_argument(where + ": HIDE position " + std::to_string(h) + " is outside 1..n-2 = 1.." +
                                  std::to_string(n - 2) + " (bos and eos are never hidden)");
  for (int64_t i = 0; i < n && !hide.empty(); ++i)
    if (e.dirs[size_t(i)] == df::Dir::S)
      for (int32_t h : hide)
        if (h != i)
          e.hidden[size_t(i)].push_back(h);
  df::validateExample(spec, e, where);
  return e;
}

WeightSet loadWeights(const std::string &path, const ModelSpec &spec) {
  return loadModelWeights(path, spec);
}


std::vector<int32_t> intList(const nlohmann::json &j, const std::string &where) {
  if (!j.is_array())
    throw std::invalid_argument(where + ": expected a list of integers");
  std::vector<int32_t> out;
  for (const auto &v : j) {
    if (!v.is_number_integer())
      throw std::invalid_argument(where + ": expected integers");
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) // no wrap to int32: the range check after it sees the real value
      throw std::invalid_argument(where + ": integer " + v.dump() + " out of range");
    out.push_back(int32_t(x));
  }
  return out;
}

/// A batch object {"src","tgt"[,"dirs","hide"]}; with `needDirections`, dirs and hide are required.
std::vector<df::Example> parseBatch(const ModelSpec &spec, const nlohmann::json &j, const std::string &where,
                                    bool needDirections) {
  if (!j.is_object() || !j.contains("src") || !j.contains("tgt"))
    throw std::invalid_argument(where + ": expected {\"src\":[[...]],\"tgt\":[[...]],\"dirs\":[\"R..L\"],\"hide\":[[[...]]]}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "src" && it.key() != "tgt" && it.key() != "dirs" && it.key() != "hide")
      throw std::invalid_argument(where + ": unknown key \"" + it.key() + "\" (valid: src, tgt, dirs, hide)");
  const bool hasDirs = j.contains("dirs");
  if (needDirections && (!hasDirs || !j.contains("hide")))
    throw std::invalid_argument(where + ": the batch needs \"dirs\" and \"hide\" (fixed draws)");
  if (j.contains("hide") && !hasDirs)
    throw std::invalid_argument(where + ": \"hide\" without \"dirs\"");
  const auto &src = j["src"], &tgt = j["tgt"];
  if (!src.is_array() || !tgt.is_array() || src.size() != tgt.size() || src.empty())
    throw std::invalid_argument(where + ": \"src\" and \"tgt\" must be non-empty lists of equal length");
  if (hasDirs && (!j["dirs"].is_array() || j["dirs"].size() != src.size() ||
                  (j.contains("hide") && (!j["hide"].is_array() || j["hide"].size() != src.size()))))
    throw std::invalid_argument(where + ": \"dirs\" and \"hide\" need one entry per sentence");
  std::vector<df::Example> out;
  for (size_t b = 0; b < src.size(); ++b) {
    const std::string at = where + ": sentence " + std::to_string(b);
    df::Example e;
    e.src = intList(src[b], at + ": src");
    e.tgt = intList(tgt[b], at + ": tgt");
    const int64_t n = int64_t(e.tgt.size());
    if (hasDirs) {
      // A string ("RSLL") or a list of one-letter strings (["R", "S", "L", "L"]): issue 19's "one-letter strings
      // per row".
      const auto &d = j["dirs"][b];
      std::string letters;
      if (d.is_string())
        letters = d.get<std::string>();
      else if (d.is_array() && std::all_of(d.begin(), d.end(), [](const nlohmann::json &x) {
                 return x.is_string() && x.get_ref<const std::string &>().size() == 1;
               }))
        for (const auto &x : d)
          letters += x.get<std::string>();
      else
        throw std::invalid_argument(at + ": dirs must be a string of R, L, S, - or a list of such one-letter strings "
                                         "(one per target row)");
      try {
        e.dirs = df::parseDirections(letters, n);
      } catch (const std::invalid_argument &err) {
        throw std::invalid_argument(at + ": " + err.what());
      }
      e.hidden.assign(size_t(n), {});
      if (j.contains("hide")) {
        const auto &h = j["hide"][b];
        if (!h.is_array() || int64_t(h.size()) != n)
          throw std::invalid_argument(at + ": hide needs one list per target row (" + std::to_string(n) + ")");
        for (int64_t i = 0; i < n; ++i)
          e.hidden[size_t(i)] = intList(h[size_t(i)], at + ": hide row " + std::to_string(i));
      }
    } else {
      e.dirs.assign(size_t(n), df::Dir::R);
      e.hidden.assign(size_t(n), {});
      if (n >= 2)
        e.dirs.back() = df::Dir::L;
    }
    df::validateExample(spec, e, at);
    out.push_back(std::move(e));
  }
  return out;
}

int flushOut(const std::string &out) {
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

} // namespace

namespace {

/// Validated examples as lm_rt_score_pairs's arrays.
struct PairArrays {
  int32_t batch = 0, srcStride = 1, tgtStride = 1;
  std::vector<int32_t> src, tgt, srcLen, tgtLen, dirs;
  std::vector<uint32_t> hidden;
  PairArrays(const ModelSpec &spec, const std::vector<df::Example> &examples) {
    batch = int32_t(examples.size());
    for (const df::Example &e : examples) {
      srcStride = std::max(srcStride, int32_t(e.src.size()));
      tgtStride = std::max(tgtStride, int32_t(e.tgt.size()));
    }
    const int64_t words = LM_HIDDEN_WORDS(spec.dims.maxLen);
    src.assign(size_t(batch) * srcStride, 0);
    tgt.assign(size_t(batch) * tgtStride, 0);
    dirs.assign(size_t(batch) * tgtStride, 3);
    hidden.assign(size_t(batch) * tgtStride * words, 0u);
    for (int32_t b = 0; b < batch; ++b) {
      const df::Example &e = examples[size_t(b)];
      srcLen.push_back(int32_t(e.src.size()));
      tgtLen.push_back(int32_t(e.tgt.size()));
      std::copy(e.src.begin(), e.src.end(), src.begin() + int64_t(b) * srcStride);
      std::copy(e.tgt.begin(), e.tgt.end(), tgt.begin() + int64_t(b) * tgtStride);
      for (size_t i = 0; i < e.tgt.size(); ++i) {
        const int64_t row = int64_t(b) * tgtStride + int64_t(i);
        dirs[size_t(row)] = int32_t(e.dirs[i]); // Dir's codes are the runtime's: 0 R, 1 L, 2 S, 3 skip
        for (int32_t j : e.hidden[i])
          hidden[size_t(row * words + j / 32)] |= 1u << (j % 32);
      }
    }
  }
};

/// Scores validated examples through a compiled library's lm_rt_score_pairs; `origins` says where each comes
/// from (a non-finite result names its input).
std::vector<df::Score> scoreCompiled(const ModelSpec &spec, CompiledModel &compiled,
                                     const std::vector<df::Example> &examples, const std::vector<std::string> &origins) {
  if (examples.empty()) // empty input: nothing to score (the runtime refuses a batch of 0)
    return {};
  PairArrays a(spec, examples);
  const int32_t batch = a.batch, tgtStride = a.tgtStride;
  const size_t B = size_t(batch);
  std::vector<float> lp(B * size_t(tgtStride)), scores(B), lengths(B);
  if (int status = lm_rt_score_pairs(compiled.model, a.src.data(), a.srcLen.data(), a.srcStride, a.tgt.data(),
                                     a.tgtLen.data(), tgtStride, a.dirs.data(), a.hidden.data(), batch, lp.data(),
                                     scores.data(), lengths.data());
      status != LM_OK)
    throwRuntimeStatus(status, origins);
  std::vector<df::Score> out(examples.size());
  for (int32_t b = 0; b < batch; ++b) {
    df::Score &s = out[size_t(b)];
    const df::Example &e = examples[size_t(b)];
    s.tokenLogprobs.assign(lp.begin() + int64_t(b) * tgtStride, lp.begin() + int64_t(b) * tgtStride + e.tgt.size());
    s.score = scores[size_t(b)];
    s.lengthLogprob = lengths[size_t(b)];
    for (df::Dir d : e.dirs)
      s.nScored += d != df::Dir::Skip;
  }
  return out;
}

} // namespace

int diformerScore(const ModelSpec &spec, const std::string &weights, const std::string &input, const Tokenizer *tok,
                  int threads, CompiledModel *compiled) {
  // Streams like lmcc score: chunks of lines, each chunk's results printed before the next is read.
  LineReader in(input, "input file");
  std::optional<WeightSet> w;
  std::vector<df::Example> examples;
  std::vector<std::string> origins; // "file:line" of each example
  std::string line;
  auto run = [&]() {
    if (!w && !compiled)
      w = loadWeights(weights, spec);
    std::vector<df::Score> results =
        compiled ? scoreCompiled(spec, *compiled, examples, origins) : df::score(spec, *w, examples, threads);
    for (size_t s = 0; s < results.size(); ++s) { // the runtime checked the compiled ones
      checkFinite(results[s].tokenLogprobs.data(), results[s].tokenLogprobs.size(), origins[s], "score");
      checkFinite(&results[s].score, 1, origins[s], "score");
      checkFinite(&results[s].lengthLogprob, 1, origins[s], "score");
    }
    std::string out;
    for (size_t s = 0; s < results.size(); ++s) {
      const std::string what = "result for " + origins[s];
      out += "{\"token_logprobs\":[";
      for (size_t i = 0; i < results[s].tokenLogprobs.size(); ++i) {
        if (i)
          out += ',';
        appendNumber(out, results[s].tokenLogprobs[i], what);
      }
      out += "],\"score\":";
      appendNumber(out, results[s].score, what);
      out += ",\"n_scored\":" + std::to_string(results[s].nScored) + ",\"length_logprob\":";
      appendNumber(out, results[s].lengthLogprob, what);
      out += "}\n";
    }
    examples.clear();
    origins.clear();
    return flushOut(out);
  };
  while (in.next(line)) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (trim(line).empty())
      throw std::invalid_argument(in.where() + ": empty line (every line must hold one pair)");
    examples.push_back(parseLine(spec, line, tok, in.where()));
    origins.push_back(in.where());
    if (examples.size() == 64 && run())
      return 1;
  }
  if (!examples.empty() || !w)
    return run();
  return 0;
}

int diformerGrad(const ModelSpec &spec, const std::string &weights, const std::string &batch, const std::string &out,
                 int threads, CompiledModel *compiled) {
  std::vector<df::Example> examples = parseBatch(spec, parseJson(readAll(batch, "batch file"), batch), batch, true);
  if (compiled) { // lm_rt_pair_loss_and_grad of the library compiled with --train
    PairArrays a(spec, examples);
    const lm_model_desc *d = compiled->desc();
    std::vector<float> grad(size_t(lm_rt_num_params(d)));
    float loss = 0;
    double nll[2] = {0, 0};
    if (int status = lm_rt_pair_loss_and_grad(compiled->model, a.src.data(), a.srcLen.data(), a.srcStride,
                                              a.tgt.data(), a.tgtLen.data(), a.tgtStride, a.dirs.data(),
                                              a.hidden.data(), a.batch, &loss, nll, grad.data());
        status != LM_OK) {
      throwCallStatus(status, batch + ": " + lm_rt_last_error());
    }
    WeightSet grads = unpackGradient(d, grad);
    int64_t tokens = 0;
    for (int32_t n : a.tgtLen)
      tokens += n;
    grads.metadata["name"] = spec.name;
    grads.metadata["spec_hash"] = specHash(spec);
    grads.metadata["loss"] = std::to_string(loss);
    writeWeightsFile(out, grads);
    std::string line = "{\"loss\":";
    appendNumber(line, loss, "loss");
    line += ",\"tokens\":" + std::to_string(tokens) + ",\"token_nll\":";
    appendNumber(line, nll[0] * double(tokens), "token NLL");
    line += ",\"length_nll\":";
    appendNumber(line, nll[1] * double(a.batch), "length NLL");
    line += "}\n";
    return flushOut(line);
  }
  WeightSet w = loadWeights(weights, spec);
  df::Model model(spec, w);
  df::LossAndGrad r = df::lossAndGrad(spec, model, examples, threads);
  r.grads.metadata["name"] = spec.name;
  r.grads.metadata["spec_hash"] = specHash(spec);
  r.grads.metadata["loss"] = std::to_string(r.loss);
  writeWeightsFile(out, r.grads);
  std::string line = "{\"loss\":";
  appendNumber(line, r.loss, "loss");
  line += ",\"tokens\":" + std::to_string(r.tokens) + ",\"token_nll\":";
  appendNumber(line, r.tokenNll, "token NLL");
  line += ",\"length_nll\":";
  appendNumber(line, r.lengthNll, "length NLL");
  line += "}\n";
  return flushOut(line);
}

int diformerTrain(const ModelSpec &spec, const std::string &weights, const std::string &batchesPath,
                  const std::string &outDir, int64_t steps, int64_t saveEvery, int threads, const CompileFn &compile) {
  std::vector<std::vector<df::Example>> batches;
  for (auto &[no, line] : lines(readAll(batchesPath, "batches file"))) {
    if (trim(line).empty())
      continue;
    const std::string where = batchesPath + ":" + std::to_string(no);
    batches.push_back(parseBatch(spec, parseJson(line, where), where, false));
  }
  if (batches.empty())
    throw std::invalid_argument(batchesPath + ": no batch (one JSON object per line)");
  // Which batches carry fixed directions: those are used as given; the others are drawn.
  std::vector<bool> fixed;
  for (auto &[no, line] : lines(readAll(batchesPath, "batches file")))
    if (!trim(line).empty())
      fixed.push_back(line.find("\"dirs\"") != std::string::npos);
  WeightSet w = weights.empty() ? initWeights(spec, uint64_t(spec.train.seed)) : loadWeights(weights, spec);
  std::filesystem::create_directories(outDir);
  const std::string weightsOut = (std::filesystem::path(outDir) / "weights.safetensors").string();
  if (steps <= 0)
    steps = int64_t(batches.size());
  // Step s's batch: line s mod lines, its directions drawn by the objective unless the line fixes them.
  auto batchOf = [&](int64_t step) {
    const size_t bi = size_t(step % int64_t(batches.size()));
    std::vector<df::Example> examples = batches[bi];
    if (!fixed[bi])
      for (size_t b = 0; b < examples.size(); ++b)
        df::drawDirections(examples[b], uint64_t(spec.train.seed), uint64_t(step), uint32_t(b));
    return examples;
  };
  auto logStep = [&](int64_t done, double loss, double tokenNll, double lengthNll, int64_t tokens, double lr,
                     double gradNorm, double ms) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"step\":%lld,\"loss\":%.6g,\"token_nll\":%.6g,\"length_nll\":%.6g,\"tokens\":%lld,\"lr\":%.6g,"
                  "\"grad_norm\":%.6g,\"ms\":%.1f}\n",
                  (long long)done, loss, tokenNll, lengthNll, (long long)tokens, lr, gradNorm, ms);
    std::fputs(buf, stdout);
    std::fflush(stdout);
  };
  if (compile) { // the compiled library's trainer (lm_rt_train_step_pairs)
    // The library loads its weights from a file: the initial ones are written beside the output first.
    const std::string initPath = (std::filesystem::path(outDir) / ".init.safetensors").string();
    w.metadata["name"] = spec.name;
    w.metadata["spec_hash"] = specHash(spec);
    writeSafetensors(initPath, w);
    std::unique_ptr<CompiledModel> m = compile(initPath);
    std::filesystem::remove(initPath);
    lm_trainer *trainer = nullptr;
    if (lm_rt_trainer_new(m->model, &trainer) != LM_OK)
      throw std::invalid_argument(std::string("trainer: ") + lm_rt_last_error());
    std::unique_ptr<lm_trainer, void (*)(lm_trainer *)> own(trainer, lm_rt_trainer_free);
    auto save = [&] {
      if (lm_rt_save_weights(m->model, weightsOut.c_str()) != LM_OK)
        throw std::runtime_error(lm_rt_last_error());
    };
    for (int64_t step = 0; step < steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<df::Example> examples = batchOf(step);
      PairArrays a(spec, examples);
      float loss = 0;
      double nll[2] = {0, 0}, lr = 0, gradNorm = 0;
      if (int status = lm_rt_train_step_pairs(trainer, a.src.data(), a.srcLen.data(), a.srcStride, a.tgt.data(),
                                              a.tgtLen.data(), a.tgtStride, a.dirs.data(), a.hidden.data(), a.batch,
                                              &loss, nll, &lr, &gradNorm);
          status != LM_OK) {
        throwCallStatus(status, batchesPath + ": step " + std::to_string(step + 1) + ": " + lm_rt_last_error());
      }
      int64_t tokens = 0;
      for (int32_t n : a.tgtLen)
        tokens += n;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      logStep(lm_rt_trainer_steps(trainer), loss, nll[0], nll[1], tokens, lr, gradNorm, ms);
      if (saveEvery > 0 && lm_rt_trainer_steps(trainer) % saveEvery == 0)
        save();
    }
    save();
    return 0;
  }
  std::vector<train::ParamSlot> slots;
  int64_t total = 0;
  for (auto &[name, t] : w.tensors) {
    slots.push_back({name, t.shape, total});
    total += t.numel();
  }
  std::vector<float> params(static_cast<size_t>(total)), grads(static_cast<size_t>(total));
  for (const auto &s : slots)
    std::copy(w.tensors[s.name].data.begin(), w.tensors[s.name].data.end(), params.begin() + s.offset);
  const TrainOptions &t = spec.train;
  train::OptimizerConfig c;
  c.kind = t.optimizer == OptimizerKind::Adam ? train::OptimizerConfig::Adam
           : t.optimizer == OptimizerKind::SGD ? train::OptimizerConfig::SGD
                                               : train::OptimizerConfig::AdamW;
  c.schedule = t.schedule == Schedule::Constant ? train::OptimizerConfig::Constant
               : t.schedule == Schedule::Cosine ? train::OptimizerConfig::Cosine
                                                : train::OptimizerConfig::Linear;
  c.lr = t.lr, c.beta1 = t.beta1, c.beta2 = t.beta2, c.eps = t.eps, c.weightDecay = t.weightDecay;
  c.warmupSteps = t.warmupSteps, c.totalSteps = t.steps, c.clipNorm = t.clipNorm;
  train::Optimizer opt(c, slots);
  auto save = [&] {
    for (const auto &s : slots)
      std::copy(params.begin() + s.offset, params.begin() + s.offset + int64_t(w.tensors[s.name].data.size()),
                w.tensors[s.name].data.begin());
    w.metadata["name"] = spec.name;
    w.metadata["spec_hash"] = specHash(spec);
    w.metadata["steps"] = std::to_string(opt.steps());
    writeSafetensors(weightsOut, w);
  };
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<df::Example> examples = batchOf(step);
    for (const auto &s : slots)
      std::copy(params.begin() + s.offset, params.begin() + s.offset + int64_t(w.tensors[s.name].data.size()),
                w.tensors[s.name].data.begin());
    df::Model model(spec, w);
    df::LossAndGrad r = df::lossAndGrad(spec, model, examples, threads);
    for (const auto &s : slots) {
      const auto &g = r.grads.tensors.at(s.name).data;
      std::copy(g.begin(), g.end(), grads.begin() + s.offset);
    }
    train::Optimizer::StepInfo info = opt.step(params.data(), grads.data());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    logStep(opt.steps(), r.loss, r.tokenNll / double(r.tokens), r.lengthNll / double(examples.size()), r.tokens,
            info.lr, info.gradNorm, ms);
    if (saveEvery > 0 && opt.steps() % saveEvery == 0)
      save();
  }
  save();
  return 0;
}

int diformerTranslate(const ModelSpec &spec, const std::string &weights, const std::string &input,
                      const Tokenizer *tok, const TranslateOptions &o, CompiledModel *compiled) {
  df::DecodeOptions d;
  if (o.mode == "l2r")
    d.mode = df::DecodeMode::L2R;
  else if (o.mode == "r2l")
    d.mode = df::DecodeMode::R2L;
  else if (o.mode == "mask-predict")
    d.mode = df::DecodeMode::MaskPredict;
  else if (o.mode == "easy-first")
    d.mode = df::DecodeMode::EasyFirst;
  else
    throw std::invalid_argument("--mode must be l2r, r2l, mask-predict or easy-first, got '" + o.mode + "'");
  d.beam = o.beam, d.lengthBeam = o.lengthBeam, d.iterations = o.iterations, d.rerank = o.rerank;
  std::optional<WeightSet> w;
  std::optional<df::Model> model;
  if (!compiled) {
    w = loadWeights(weights, spec);
    model.emplace(spec, *w);
  }
  LineReader in(input, "input file");
  for (std::string line; in.next(line);) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    const std::string where = in.where();
    std::vector<int32_t> src = sequence(line, tok, where);
    if (src.empty() || int64_t(src.size()) > spec.dims.maxLen)
      throw std::invalid_argument(where + ": source of " + std::to_string(src.size()) + " tokens: must hold 1..max_len");
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i] < 0 || src[i] >= spec.dims.vocab)
        throw std::invalid_argument(where + ": token " + std::to_string(i + 1) + ": id " + std::to_string(src[i]) +
                                    " is outside the vocabulary [0, " + std::to_string(spec.dims.vocab) + ")");
    d.maxTarget = std::min<int64_t>(spec.dims.maxLen - 1, 2 * int64_t(src.size()) + 10);
    const auto start = std::chrono::steady_clock::now();
    df::Translation t;
    if (compiled) {
      std::vector<int32_t> tgt(size_t(spec.dims.maxLen));
      int32_t length = 0, candidates = 0;
      if (int status = lm_rt_translate(compiled->model, src.data(), int32_t(src.size()), int32_t(d.mode), d.beam,
                                       d.lengthBeam, d.iterations, d.rerank ? 1 : 0, int32_t(d.maxTarget), tgt.data(),
                                       int32_t(tgt.size()), &length, &t.score, &candidates);
          status != LM_OK) {
        throwCallStatus(status, where + ": " + lm_rt_last_error());
      }
      t.tgt.assign(tgt.begin(), tgt.begin() + length);
      t.candidates = candidates;
    } else {
      t = df::translate(*model, src, d);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::string out = "{\"ids\":[";
    for (size_t i = 0; i < t.tgt.size(); ++i)
      out += (i ? "," : "") + std::to_string(t.tgt[i]);
    out += "],\"score\":";
    appendNumber(out, t.score, "score");
    out += ",\"candidates\":" + std::to_string(t.candidates);
    char buf[32];
    std::snprintf(buf, sizeof buf, ",\"ms\":%.3f", ms);
    out += buf;
    if (tok) {
      std::string text;
      for (size_t i = 1; i + 1 < t.tgt.size(); ++i) {
        const std::string &p = tok->piece(t.tgt[i]);
        if (p.rfind("##", 0) == 0)
          text += p.substr(2);
        else
          text += (text.empty() ? "" : " ") + p;
      }
      out += ",\"text\":" + nlohmann::json(text).dump();
    }
    out += "}\n";
    if (flushOut(out))
      return 1;
  }
  return 0;
}

} // namespace lmcc::cli
