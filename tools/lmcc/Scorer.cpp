//===- Scorer.cpp - One loaded model that scores and embeds chunk after chunk ===//
#include "tools/lmcc/Scorer.h"

#include "runtime/weights/ModelWeights.h"
#include "tools/lmcc/EvalMath.h"

namespace lmcc::cli {

void SentenceBatch::add(std::vector<int32_t> ids, std::string origin, std::vector<int32_t> wordSpans) {
  const int64_t n = int64_t(ids.size());
  cost += squared ? n * n : n;
  sentences.push_back(std::move(ids));
  origins.push_back(std::move(origin));
  if (!wordSpans.empty())
    spans.push_back(std::move(wordSpans));
}

void SentenceBatch::clear() {
  sentences.clear();
  spans.clear();
  origins.clear();
  cost = 0;
}

bool wordL2R(const ModelSpec &spec, const Options &o) {
  if (o.pll == "original")
    return false;
  if (spec.method != ScoreMethod::MaskAndPredict)
    throw UsageError("--pll word-l2r applies to mask-and-predict scoring (family bilm): " + spec.sourcePath +
                     " (family " + toString(spec.family) + ") scores with method " + toString(spec.method) +
                     ", which masks no word");
  return true;
}

Scorer::Scorer(const ModelSpec &spec, const Options &o) : spec(spec), o(o) {}

Scorer::~Scorer() = default;

void Scorer::load() {
  if (compiled || weights)
    return;
  if (o.reference) {
    weights = loadModelWeights(o.weights, spec);
    return;
  }
  compiled = std::make_unique<CompiledModel>(spec, o);
  setRuntime(o);
}

std::vector<reference::ScoreResult> Scorer::score(const SentenceBatch &batch) {
  load();
  const std::vector<std::vector<int32_t>> &sentences = batch.sentences, &spans = batch.spans;
  bool original = true;
  for (const std::vector<int32_t> &s : spans)
    original = original && originalSpans(s);
  if (weights) {
    std::vector<reference::ScoreResult> results =
        reference::score(spec, *weights, sentences, o.threads, original ? nullptr : &spans);
    for (size_t b = 0; b < results.size(); ++b) {
      checkFinite(results[b].tokenLogprobs.data(), results[b].tokenLogprobs.size(), batch.origins[b], "score");
      checkFinite(&results[b].score, 1, batch.origins[b], "score");
    }
    return results;
  }
  Padded p(sentences);
  const int32_t rows = int32_t(sentences.size());
  std::vector<float> lp(size_t(rows) * p.stride), scores(rows);
  std::vector<int32_t> nScored(rows);
  std::vector<int32_t> padded; // the spans in the ids' layout
  if (!original) {
    padded.assign(size_t(rows) * p.stride, 0);
    for (int32_t b = 0; b < rows; ++b)
      std::copy(spans[b].begin(), spans[b].end(), padded.begin() + size_t(b) * p.stride);
  }
  const auto start = std::chrono::steady_clock::now();
  // Spans only where a sentence has other than the original PLL's (lm_rt_score_spans refuses models that do not
  // score by mask-and-predict).
  const int status = rows == 0 ? LM_OK
                     : original ? lm_rt_score_ex(compiled->model, p.ids.data(), p.lengths.data(), rows, p.stride,
                                                 lp.data(), scores.data(), nScored.data())
                                : lm_rt_score_spans(compiled->model, p.ids.data(), p.lengths.data(), rows, p.stride,
                                                    padded.data(), lp.data(), scores.data(), nScored.data());
  if (status != LM_OK)
    throwRuntimeStatus(status, batch.origins);
  ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::vector<reference::ScoreResult> results(rows);
  for (int32_t b = 0; b < rows; ++b) {
    results[b].tokenLogprobs.assign(lp.begin() + size_t(b) * p.stride, lp.begin() + size_t(b) * p.stride + p.lengths[b]);
    results[b].score = scores[b];
    results[b].nScored = nScored[b];
  }
  return results;
}

std::vector<std::vector<float>> Scorer::embed(const SentenceBatch &batch) {
  load();
  const std::vector<std::vector<int32_t>> &sentences = batch.sentences;
  if (weights) {
    std::vector<std::vector<float>> results = reference::embed(spec, *weights, sentences, o.threads);
    for (size_t b = 0; b < results.size(); ++b)
      checkFinite(results[b].data(), results[b].size(), batch.origins[b], "embed");
    return results;
  }
  Padded p(sentences);
  const int32_t rows = int32_t(sentences.size());
  const size_t d = size_t(spec.dims.dModel);
  std::vector<float> out(size_t(rows) * d);
  if (int status = rows ? lm_rt_embed(compiled->model, p.ids.data(), p.lengths.data(), rows, p.stride, out.data())
                        : LM_OK;
      status != LM_OK)
    throwRuntimeStatus(status, batch.origins);
  std::vector<std::vector<float>> results(rows);
  for (int32_t b = 0; b < rows; ++b)
    results[b].assign(out.begin() + b * d, out.begin() + (b + 1) * d);
  return results;
}

} // namespace lmcc::cli
