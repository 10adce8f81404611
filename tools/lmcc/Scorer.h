//===- Scorer.h - One loaded model that scores and embeds chunk after chunk ===//
//
// The streaming commands (score, embed, sts, blimp, rerank) load the model once, compiled (the library cache)
// or the reference executor's weights (--reference), and run it on bounded chunks of sentences
// (SentenceBatch says when a chunk is full).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/reference/Executor.h"
#include "tools/lmcc/Common.h"

#include <memory>
#include <optional>

namespace lmcc::cli {

/// A chunk of sentences under a budget: at most 256 sentences, and at most 16,384 tokens (mask-and-predict
/// scoring: n^2 per sentence of n tokens, as it masks each position once), but always at least one.
struct SentenceBatch {
  explicit SentenceBatch(const ModelSpec &spec) : squared(spec.method == ScoreMethod::MaskAndPredict) {}
  std::vector<std::vector<int32_t>> sentences;
  std::vector<std::vector<int32_t>> spans; ///< word-l2r spans per sentence (empty: original PLL)
  std::vector<std::string> origins;        ///< where each sentence comes from ("ids.txt:3"), for errors
  bool full() const { return sentences.size() >= 256 || cost >= 16384; }
  void add(std::vector<int32_t> ids, std::string origin, std::vector<int32_t> wordSpans = {});
  void clear();
  size_t size() const { return sentences.size(); }

private:
  bool squared;
  int64_t cost = 0;
};

/// --pll of the scoring commands: "word-l2r" needs mask-and-predict scoring (a UsageError naming the spec's
/// method otherwise); returns whether spans are needed.
bool wordL2R(const ModelSpec &spec, const Options &o);

class Scorer {
public:
  /// Loads nothing yet: the model is loaded (compiled and cached on first use) by the first call, so that input
  /// errors in the first chunk are reported before a compilation.
  Scorer(const ModelSpec &spec, const Options &o);
  ~Scorer();
  /// Loads the model now (validating the weights) if no call has.
  void load();
  /// Sentence scores ([score] method) of the batch's sentences, with its word-l2r spans when it has them
  /// (EvalMath.h). A non-finite result, compiled or reference, is an InputError naming the sentence's origin.
  std::vector<reference::ScoreResult> score(const SentenceBatch &batch);
  /// Pooled embeddings ([embed]), one vector of d_model floats per sentence; non-finite values as score's.
  std::vector<std::vector<float>> embed(const SentenceBatch &batch);
  /// Wall time of the compiled scoring calls so far, in milliseconds (--timing).
  double scoreMs() const { return ms; }

private:
  const ModelSpec &spec;
  const Options &o;
  std::unique_ptr<CompiledModel> compiled;
  std::optional<WeightSet> weights; // --reference
  double ms = 0;
};

} // namespace lmcc::cli
