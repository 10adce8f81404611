//===- DiformerSearch.h - The Diformer's four decoding modes, model-neutral ---===//
//
// Issue 19's decoders (diformer paper 2.4) and self-reranking, written once against an abstract
// Decoder so that the reference executor (runtime/reference/DiformerDecode.cpp) and the compiled
// library (runtime/lib/Translate.cpp, lm_rt_translate) run the same search:
//  * l2r / r2l: beam search; a step computes only the new row of each hypothesis (an R row at the
//    end of the prefix, or an L row at the start of the suffix); hypotheses are ranked by
//    log-likelihood / predicted tokens;
//  * mask-predict (CMLM): for each of the length head's `lengthBeam` best lengths (of at least one
//    content token: n >= 3 where max_len allows), T passes of
//    S rows; pass t re-masks the floor(N (T - t) / T) least confident tokens; candidates are
//    ranked by their mean token log-probability; the lengths' passes run side by side (one
//    Decoder::predict call per iteration for the candidates still refining: a decoder may run
//    them as one batch);
//  * easy-first (DisCo): pass 0 as mask-predict; each later pass recomputes every row, row i
//    seeing bos, eos and the positions whose current prediction is more confident than its own;
//    stops early when no token changes;
//  * rerank: every candidate (the length beam's, or the beam's finished hypotheses) is scored by
//    the mean of its teacher-forced L2R and R2L log-likelihoods (sums over its n - 1 predicted
//    tokens; no length normalization: the contract's formula, so shorter candidates are favoured).
// Spec-free: liblmrt links it. Its containers are Vec (Recycled.h): a steady-state lm_rt_translate call takes
// nothing from the system allocator (tests/cli/alloc.test).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/lib/Recycled.h"

#include <cstdint>

namespace lmcc::decode {

enum class Mode { L2R, R2L, MaskPredict, EasyFirst };

struct Options {
  Mode mode = Mode::L2R;
  int beam = 4, lengthBeam = 5, iterations = 10;
  bool rerank = false;
  int64_t maxTarget = 0; ///< longest target (bos..eos) an AR search may build; 0: max_len - 1
};

/// The token ids the search treats specially, and the model's sizes.
struct Tokens {
  int64_t vocab = 0, maxLen = 0;
  int32_t pad = 0, unk = 0, bos = 0, eos = 0, mask = 0;
};

struct Translation {
  Vec<int32_t> tgt; ///< bos .. eos
  double score = 0;         ///< the ranking score (mode's own, or the rerank score)
  int64_t candidates = 0;   ///< hypotheses compared at the end
};

/// What a search asks of a model, for one source (encoded once, before the search starts).
class Decoder {
public:
  virtual ~Decoder() = default;
  /// log P(n | source) for n = 0 .. max_len - 1.
  virtual Vec<double> lengthLogprobs() = 0;
  /// One autoregressive step for each target (all of one length n, tokens in position order): the
  /// log-probabilities [targets.size() * vocab] of the new row: an R row at position n - 1
  /// (leftToRight, it predicts y_n) or an L row at position 0 (it predicts the token before).
  virtual Vec<float> step(const Vec<Vec<int32_t>> &targets, bool leftToRight) = 0;
  /// One target of a parallel pass: `tokens` (bos .. eos) and the S rows to compute, row r not seeing the
  /// keys j with hidden[r][j].
  struct Pass {
    Vec<int32_t> tokens;
    Vec<int64_t> rows;
    Vec<Vec<bool>> hidden;
  };
  /// Parallel passes over several targets at once (the length beam's candidates): per pass, the
  /// log-probabilities [rows.size() * vocab] of its rows.
  virtual Vec<Vec<float>> predict(const Vec<Pass> &passes) = 0;
  /// The teacher-forced sum of log p over the rows of an l2r (R..R-) or r2l (-L..L) scoring of tgt.
  virtual double teacherForced(const Vec<int32_t> &tgt, bool leftToRight) = 0;
};

/// Decodes one source; throws std::invalid_argument for options < 1 and std::runtime_error when no
/// hypothesis finishes.
Translation translate(Decoder &decoder, const Tokens &tokens, const Options &options);

} // namespace lmcc::decode
