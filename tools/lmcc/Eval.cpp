//===- Eval.cpp - lmcc sts, blimp, rerank ---------------------------------===//
#include "tools/lmcc/Eval.h"
#include "runtime/weights/UniqueJson.h"

#include "tools/lmcc/EvalMath.h"
#include "tools/lmcc/Scorer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

namespace lmcc::cli {
namespace fs = std::filesystem;

namespace {

/// The spec must score (blimp, rerank) or embed (sts) with the common entries.
void checkEvalSpec(const ModelSpec &spec, const Options &o, bool scores, const char *command) {
  if (spec.family == Family::Diformer)
    throw InputError(o.spec + ": lmcc " + command + " does not support family \"diformer\" (it scores source-target "
                     "pairs: lmcc score, translate)");
  if (scores && !spec.mlm)
    throw SpecError(spec.where("head.mlm"), "head.mlm",
                    std::string("this model is encoder only (mlm = false): it has no output head to score with; "
                                "lmcc ") + command + " needs sentence scores");
}

/// `v` with 9 significant digits (the score/embed format); `what` names it in the non-finite error.
std::string number(double v, const char *what) {
  std::string s;
  appendNumber(s, v, what);
  return s;
}

/// The tab-separated fields of a line.
std::vector<std::string_view> splitTabs(std::string_view line) {
  std::vector<std::string_view> cols;
  for (size_t pos = 0;;) {
    size_t tab = line.find('\t', pos);
    cols.push_back(line.substr(pos, tab == std::string_view::npos ? std::string_view::npos : tab - pos));
    if (tab == std::string_view::npos)
      return cols;
    pos = tab + 1;
  }
}

} // namespace

// --- sts ----------------------------------------------------------------------------

int runSts(const Options &o) {
  ModelSpec spec = loadSpec(o.spec);
  checkEvalSpec(spec, o, false, "sts");
  wordL2R(spec, o); // validated; the embedding does not use it
  Tokenizer tok = loadTokenizer(spec);
  LineReader in(o.data, "STS data");
  Scorer model(spec, o);
  SentenceBatch batch(spec);
  Progress progress("pairs");
  std::vector<double> gold, similarity;
  auto run = [&] {
    std::vector<std::vector<float>> e = model.embed(batch);
    for (size_t i = 0; i + 1 < e.size(); i += 2)
      similarity.push_back(cosine(e[i], e[i + 1]));
    progress.add(int64_t(batch.size() / 2));
    batch.clear();
  };
  std::string line, layout = o.layout;
  while (in.next(line)) {
    if (in.lineNumber() == 1 && line.rfind("index", 0) == 0 && layout != "original") {
      layout = "glue"; // the GLUE header row
      continue;
    }
    if (layout.empty())
      layout = "original";
    if (line.empty())
      throw InputError(in.where() + ": empty line (every line must hold one sentence pair)");
    // GLUE: sentence1, sentence2, score in columns 8, 9, 10; original: score, sentence1, sentence2 in 5, 6, 7.
    const bool glue = layout == "glue";
    const size_t need = glue ? 10 : 7, scoreCol = glue ? 9 : 4, firstCol = glue ? 7 : 5;
    std::vector<std::string_view> cols = splitTabs(line);
    if (cols.size() < need)
      throw InputError(in.where() + ": " + std::to_string(cols.size()) + " tab-separated columns, the " + layout +
                       " layout needs at least " + std::to_string(need) + " (score in column " +
                       std::to_string(scoreCol + 1) + ")");
    const std::string scoreText(cols[scoreCol]);
    char *end = nullptr;
    const double g = std::strtod(scoreText.c_str(), &end);
    if (scoreText.empty() || *end != '\0' || !std::isfinite(g))
      throw InputError(in.where() + ": the gold score (column " + std::to_string(scoreCol + 1) + ") \"" + scoreText +
                       "\" is not a number");
    gold.push_back(g);
    batch.add(encodeText(cols[firstCol], in.where(), spec, tok, o.truncate), in.where());
    batch.add(encodeText(cols[firstCol + 1], in.where(), spec, tok, o.truncate), in.where());
    if (batch.full())
      run();
  }
  if (batch.size())
    run();
  if (gold.size() < 2)
    throw InputError(in.fileName() + ": " + std::to_string(gold.size()) +
                     " sentence pairs; a correlation needs at least 2");
  const double r = pearson(similarity, gold), rho = spearman(similarity, gold);
  if (!std::isfinite(r) || !std::isfinite(rho))
    throw InputError(in.fileName() + ": the gold scores or the model's similarities are all equal: no correlation");
  writeStdout("{\"pearson\":" + number(100 * r, "Pearson correlation") + ",\"spearman\":" +
              number(100 * rho, "Spearman correlation") + ",\"pairs\":" + std::to_string(gold.size()) + "}\n");
  return kExitOk;
}

// --- blimp --------------------------------------------------------------------------

namespace {

struct Paradigm {
  std::string uid, field;
  int64_t pairs = 0, correct = 0;
  double accuracy() const { return double(correct) / double(pairs); }
};

/// The BLiMP paper's accuracies (models_summary.jsonl: {"UID", "linguistics_term", <model>: accuracy, ...}), by
/// paradigm; rows with UID "overall" (per phenomenon) are left out: lmcc computes the means it shows.
struct PaperModels {
  std::vector<std::string> models; // in the file's order
  std::map<std::string, std::map<std::string, double>> byUid;
};

PaperModels readPaperModels(const fs::path &path) {
  PaperModels p;
  if (!fs::exists(path))
    return p;
  LineReader in(path.string(), "BLiMP models summary");
  std::string line;
  while (in.next(line)) {
    if (line.find_first_not_of(" \t") == std::string::npos)
      continue;
    nlohmann::ordered_json j; // the models in the file's order
    try {
      j = parseUniqueJson<nlohmann::ordered_json>(line);
    } catch (const nlohmann::json::exception &e) { // syntax, or a number out of range
      throw InputError(in.where() + ": invalid JSON: " + e.what());
    } catch (const DuplicateJsonKey &e) {
      throw InputError(in.where() + ": " + e.what());
    }
    if (!j.is_object() || !j.contains("UID") || !j["UID"].is_string())
      throw InputError(in.where() + ": expected an object with a \"UID\" string");
    const std::string uid = j["UID"].get<std::string>();
    for (auto &[key, value] : j.items()) {
      if (!value.is_number())
        continue;
      if (std::find(p.models.begin(), p.models.end(), key) == p.models.end())
        p.models.push_back(key);
      if (uid != "overall")
        p.byUid[uid][key] = value.get<double>();
    }
  }
  return p;
}

const char *modelTitle(const std::string &key) {
  return key == "ngram" ? "5-gram" : key == "lstm" ? "LSTM" : key == "txl" ? "Transformer-XL"
         : key == "gpt2" ? "GPT-2" : key.c_str();
}

std::string fixed3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

} // namespace

int runBlimp(const Options &o) {
  ModelSpec spec = loadSpec(o.spec);
  checkEvalSpec(spec, o, true, "blimp");
  const bool spans = wordL2R(spec, o);
  Tokenizer tok = loadTokenizer(spec);
  const fs::path dir(o.data);
  if (!fs::is_directory(dir))
    throw InputError(o.data + ": not a directory (lmcc blimp reads a folder of BLiMP paradigm files)");
  std::vector<fs::path> files;
  for (const fs::directory_entry &e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    auto endsWith = [&](const std::string &suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if ((endsWith(".jsonl") || endsWith(".jsonl.gz")) && name.rfind("models_summary.jsonl", 0) != 0)
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw InputError(o.data + ": no BLiMP paradigm file (*.jsonl or *.jsonl.gz)");

  Scorer model(spec, o);
  SentenceBatch batch(spec); // good, bad, good, bad, ...
  Progress progress("pairs");
  std::vector<Paradigm> paradigms;
  std::map<std::string, std::string> fileOfUid; // a paradigm counts once: causative.jsonl beside causative.jsonl.gz
  auto run = [&] {
    std::vector<reference::ScoreResult> r = model.score(batch);
    for (size_t i = 0; i + 1 < r.size(); i += 2)
      paradigms.back().correct += r[i].score > r[i + 1].score;
    progress.add(int64_t(batch.size() / 2));
    batch.clear();
  };
  auto add = [&](std::vector<int32_t> ids, std::string origin) {
    std::vector<int32_t> ws = spans ? wordSpans(tok, ids) : std::vector<int32_t>{};
    batch.add(std::move(ids), std::move(origin), std::move(ws));
  };
  for (const fs::path &file : files) {
    LineReader in(file.string(), "BLiMP paradigm file");
    Paradigm p;
    std::string line;
    while ((o.maxPairs == 0 || p.pairs < o.maxPairs) && in.next(line)) {
      if (line.find_first_not_of(" \t") == std::string::npos)
        continue;
      nlohmann::json j = parseJson(line, in.where());
      auto text = [&](const char *key) {
        if (!j.is_object() || !j.contains(key) || !j[key].is_string())
          throw InputError(in.where() + ": missing the string field \"" + key +
                           "\" (a BLiMP pair has sentence_good, sentence_bad, UID, field)");
        return j[key].get<std::string>();
      };
      const std::string uid = text("UID");
      // BLiMP spells its fourth field both "syntax_semantics" and "syntax/semantics" (the paper's "syntax &
      // semantics"): one field.
      std::string field = text("field");
      std::replace(field.begin(), field.end(), '/', '_');
      if (p.pairs == 0) {
        auto [seen, fresh] = fileOfUid.emplace(uid, file.string());
        if (!fresh)
          throw InputError(in.where() + ": paradigm \"" + uid + "\" again (also in " + seen->second +
                           "): one file a paradigm");
        p.uid = uid, p.field = field;
        paradigms.push_back(p);
      } else if (uid != p.uid) {
        throw InputError(in.where() + ": UID \"" + uid + "\", but the file's first pair is of \"" + p.uid +
                         "\" (one paradigm a file)");
      } else if (field != p.field) {
        throw InputError(in.where() + ": field \"" + text("field") + "\", but the file's first pair is of \"" +
                         p.field + "\" (one field a paradigm)");
      }
      add(encodeText(text("sentence_good"), in.where(), spec, tok, o.truncate), in.where() + ": sentence_good");
      add(encodeText(text("sentence_bad"), in.where(), spec, tok, o.truncate), in.where() + ": sentence_bad");
      ++p.pairs;
      paradigms.back().pairs = p.pairs;
      if (batch.full())
        run();
    }
    if (batch.size())
      run();
    if (p.pairs == 0)
      throw InputError(file.string() + ": no sentence pair");
  }

  // Means: per field over its paradigms, and over every paradigm.
  std::vector<std::string> fields;
  for (const Paradigm &p : paradigms)
    if (std::find(fields.begin(), fields.end(), p.field) == fields.end())
      fields.push_back(p.field);
  std::sort(fields.begin(), fields.end());
  auto mean = [&](const std::string &field, auto value) -> std::optional<double> {
    double sum = 0;
    size_t n = 0;
    for (const Paradigm &p : paradigms) {
      if (!field.empty() && p.field != field)
        continue;
      std::optional<double> v = value(p);
      if (!v)
        return std::nullopt;
      sum += *v, ++n;
    }
    return sum / double(n);
  };
  auto ours = [](const Paradigm &p) { return std::optional<double>(p.accuracy()); };
  int64_t total = 0;
  for (const Paradigm &p : paradigms)
    total += p.pairs;

  std::string out;
  if (!o.markdown) {
    out = "{\"paradigms\":{";
    for (size_t i = 0; i < paradigms.size(); ++i)
      out += (i ? "," : "") + jsonString(paradigms[i].uid) + ":" + number(paradigms[i].accuracy(), "accuracy");
    out += "},\"fields\":{";
    for (size_t i = 0; i < fields.size(); ++i)
      out += (i ? "," : "") + jsonString(fields[i]) + ":" + number(*mean(fields[i], ours), "accuracy");
    out += "},\"mean\":" + number(*mean("", ours), "accuracy") + ",\"paradigm_count\":" +
           std::to_string(paradigms.size()) + ",\"pairs\":" + std::to_string(total);
    if (o.maxPairs > 0)
      out += ",\"pairs_per_paradigm\":" + std::to_string(o.maxPairs);
    writeStdout(out + "}\n");
    return kExitOk;
  }
  const PaperModels paper = readPaperModels(dir / "models_summary.jsonl");
  auto row = [&](const std::string &name, const std::string &field, auto value) {
    std::string r = "| " + name + " | " + field + " | " + fixed3(*value(ours)) + " |";
    for (const std::string &m : paper.models) {
      std::optional<double> v = value([&](const Paradigm &p) -> std::optional<double> {
        auto uid = paper.byUid.find(p.uid);
        if (uid == paper.byUid.end() || !uid->second.count(m))
          return std::nullopt;
        return uid->second.at(m);
      });
      r += " " + (v ? fixed3(*v) : std::string("-")) + " |";
    }
    return r + "\n";
  };
  out = "| paradigm | field | " + spec.name + " |";
  std::string rule = "|---|---|---:|";
  for (const std::string &m : paper.models)
    out += std::string(" ") + modelTitle(m) + " |", rule += "---:|";
  out += "\n" + rule + "\n";
  for (const Paradigm &p : paradigms)
    out += row(p.uid, p.field, [&](auto value) { return value(p); });
  for (const std::string &f : fields)
    out += row("**mean of " + f + "**", f, [&](auto value) { return mean(f, value); });
  out += row("**mean of " + std::to_string(paradigms.size()) + " paradigms**", "all",
             [&](auto value) { return mean("", value); });
  out += "\nAccuracy: the share of pairs with score(sentence_good) > score(sentence_bad); " + std::to_string(total) +
         " pairs" + (o.maxPairs > 0 ? " (at most " + std::to_string(o.maxPairs) + " per paradigm)" : "") +
         (paper.models.empty() ? "" : "; the other columns: the BLiMP paper (models_summary.jsonl, 1000 pairs each)") +
         ".\n";
  writeStdout(out);
  return kExitOk;
}

// --- rerank -------------------------------------------------------------------------

namespace {

/// One utterance of an n-best file, scored.
struct NBest {
  std::string where; ///< file:line
  nlohmann::json id;
  int64_t refWords = 0;
  std::vector<std::string> texts;
  std::vector<double> am, lm;
  std::vector<int64_t> words, errors; // words of each hypothesis, its word edit distance to the reference
};

/// Streams an n-best file: parses and validates each line, scores the hypotheses in chunks and hands every
/// utterance, scored, to `done` in file order.
void readNBest(const std::string &path, const ModelSpec &spec, const Options &o, const Tokenizer &tok, bool spans,
               Scorer &model, const std::function<void(NBest &)> &done, const std::function<void()> &chunkDone) {
  LineReader in(path, "n-best file");
  SentenceBatch batch(spec);
  std::vector<NBest> pending;
  Progress progress("utterances");
  auto run = [&] {
    std::vector<reference::ScoreResult> r = model.score(batch);
    size_t k = 0;
    for (NBest &u : pending) {
      for (size_t h = 0; h < u.texts.size(); ++h)
        u.lm.push_back(r[k++].score);
      done(u);
    }
    chunkDone();
    progress.add(int64_t(pending.size()));
    pending.clear();
    batch.clear();
  };
  std::string line;
  while (in.next(line)) {
    if (line.find_first_not_of(" \t") == std::string::npos)
      continue;
    const std::string where = in.where();
    nlohmann::json j = parseJson(line, where);
    if (!j.is_object())
      throw InputError(where + ": expected an object {\"id\", \"ref\", \"hyps\": [{\"text\", \"score\"}, ...]}");
    if (!j.contains("id"))
      throw InputError(where + ": missing the field \"id\"");
    if (!j.contains("ref") || !j["ref"].is_string())
      throw InputError(where + ": missing the string field \"ref\" (the reference transcript)");
    if (!j.contains("hyps") || !j["hyps"].is_array())
      throw InputError(where + ": missing the array field \"hyps\"");
    if (j["hyps"].empty())
      throw InputError(where + ": \"hyps\" is empty (an utterance needs at least one hypothesis)");
    NBest u;
    u.where = where;
    u.id = j["id"];
    const std::string ref = j["ref"].get<std::string>();
    const std::vector<std::string_view> refWords = splitWords(ref);
    u.refWords = int64_t(refWords.size());
    for (size_t h = 0; h < j["hyps"].size(); ++h) {
      const nlohmann::json &hyp = j["hyps"][h];
      const std::string at = where + ": hyps[" + std::to_string(h) + "]";
      if (!hyp.is_object() || !hyp.contains("text") || !hyp["text"].is_string())
        throw InputError(at + ": missing the string field \"text\"");
      if (!hyp.contains("score") || !hyp["score"].is_number() || !std::isfinite(hyp["score"].get<double>()))
        throw InputError(at + ": \"score\" (the acoustic model's) is missing or not a number");
      u.texts.push_back(hyp["text"].get<std::string>());
      u.am.push_back(hyp["score"].get<double>());
      const std::vector<std::string_view> words = splitWords(u.texts.back());
      u.words.push_back(int64_t(words.size()));
      u.errors.push_back(wordEditDistance(refWords, words));
      std::vector<int32_t> ids = encodeText(u.texts.back(), at, spec, tok, o.truncate);
      std::vector<int32_t> ws = spans ? wordSpans(tok, ids) : std::vector<int32_t>{};
      batch.add(std::move(ids), at, std::move(ws));
    }
    pending.push_back(std::move(u));
    if (batch.full())
      run();
  }
  if (batch.size())
    run();
}

/// The hypothesis with the highest am + lambda * lm + penalty * words (ties: the first); a sum that is not a
/// finite number (a lambda or penalty so large that it overflows) is an error naming the hypothesis.
size_t choose(const NBest &u, double lambda, double penalty) {
  size_t best = 0;
  double bestScore = -INFINITY;
  for (size_t h = 0; h < u.am.size(); ++h) {
    const double s = u.am[h] + lambda * u.lm[h] + penalty * double(u.words[h]);
    if (!std::isfinite(s))
      throw InputError(u.where + ": hyps[" + std::to_string(h) + "]: am + lambda * lm + length penalty * words = " +
                       std::to_string(s) + " (lambda " + std::to_string(lambda) + ", lm " + std::to_string(u.lm[h]) +
                       "): not a finite number");
    if (s > bestScore)
      best = h, bestScore = s;
  }
  return best;
}

/// Word errors and reference words, summed.
struct Wer {
  int64_t errors = 0, words = 0;
  double percent() const { return words ? 100.0 * double(errors) / double(words) : 0.0; }
};

} // namespace

int runRerank(const Options &o) {
  ModelSpec spec = loadSpec(o.spec);
  checkEvalSpec(spec, o, true, "rerank");
  const bool spans = wordL2R(spec, o);
  Tokenizer tok = loadTokenizer(spec);
  Scorer model(spec, o);
  const double penalty = o.lengthPenaltyGiven ? o.lengthPenalty : 0.0;
  double lambda = o.rerankLambda;
  if (!o.tune.empty()) {
    // Grid search on the dev file: lambda = 0, 0.05, ..., 2 (k / 20, no accumulated rounding); the lowest WER
    // wins, ties the smallest lambda. The dev file's numbers are kept (a few per hypothesis), not its text.
    std::vector<NBest> dev;
    readNBest(o.tune, spec, o, tok, spans, model, [&](NBest &u) {
      u.texts.clear();
      dev.push_back(std::move(u));
    }, [] {});
    if (dev.empty())
      throw InputError(o.tune + ": no utterance");
    if (std::all_of(dev.begin(), dev.end(), [](const NBest &u) { return u.refWords == 0; }))
      throw InputError(o.tune + ": every reference is empty: the word error rate is undefined");
    auto werAt = [&](double l, bool amOnly) {
      Wer w;
      for (const NBest &u : dev) {
        w.errors += u.errors[amOnly ? choose(u, 0, 0) : choose(u, l, penalty)];
        w.words += u.refWords;
      }
      return w;
    };
    double best = INFINITY;
    for (int k = 0; k <= 40; ++k) {
      const double l = k / 20.0, w = werAt(l, false).percent();
      if (w < best)
        best = w, lambda = l;
    }
    writeStdout("{\"tune\":" + jsonString(o.tune) + ",\"lambda\":" + number(lambda, "lambda") +
                ",\"dev_wer_before\":" + number(werAt(0, true).percent(), "WER") + ",\"dev_wer\":" +
                number(best, "WER") + ",\"utterances\":" + std::to_string(dev.size()) + "}\n");
  }
  Wer before, after;
  int64_t utterances = 0;
  std::string out;
  readNBest(o.nbest, spec, o, tok, spans, model, [&](NBest &u) {
    const size_t h = choose(u, lambda, penalty);
    before.errors += u.errors[choose(u, 0, 0)];
    after.errors += u.errors[h];
    before.words += u.refWords, after.words += u.refWords;
    ++utterances;
    out += ("{\"id\":" + u.id.dump() + ",\"chosen\":" + std::to_string(h) + ",\"text\":" + jsonString(u.texts[h]) +
                ",\"score\":" + number(u.am[h] + lambda * u.lm[h] + penalty * double(u.words[h]), "score") + "}\n");
  }, [&] { writeStdout(std::exchange(out, {})); });
  if (utterances == 0) // as --tune: an n-best file without an utterance is not an input to rerank
    throw InputError(o.nbest + ": no utterance");
  if (before.words == 0) // the choices are out; WER over no reference word is not a number
    throw InputError(o.nbest + ": every reference is empty: the word error rate is undefined");
  std::string summary = "{\"lambda\":" + number(lambda, "lambda");
  if (o.lengthPenaltyGiven)
    summary += ",\"length_penalty\":" + number(penalty, "length penalty");
  writeStdout(summary + ",\"utterances\":" + std::to_string(utterances) + ",\"ref_words\":" +
              std::to_string(before.words) + ",\"wer_before\":" + number(before.percent(), "WER") +
              ",\"wer_after\":" + number(after.percent(), "WER") + "}\n");
  return kExitOk;
}

} // namespace lmcc::cli
