//===- DiformerDecode.h - Diformer decoding on the reference model --------===//
//
// The four decoding modes of issue 19 (diformer paper 2.4) and self-reranking, driven by
// reference::diformer::Model:
//  * l2r / r2l: beam search; a step computes only the new row of each hypothesis (keys and
//    values of a token depend on the token alone, so they are cached per token id);
//    hypotheses are ranked by log-likelihood / predicted tokens;
//  * mask-predict (CMLM): for each of the length head's `lengthBeam` best lengths, T passes of
//    S rows; pass t re-masks the floor(N (T - t) / T) least confident tokens; candidates are
//    ranked by their mean token log-probability;
//  * easy-first (DisCo): pass 0 as mask-predict; each later pass recomputes every row, row i
//    seeing bos, eos and the positions whose current prediction is more confident than its own;
//    stops early when no token changes;
//  * rerank: every candidate (the length beam's, or the beam's finished hypotheses) is scored by
//    the mean of its teacher-forced L2R and R2L log-likelihoods, each divided by n - 1.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/reference/Diformer.h"

namespace lmcc::reference::diformer {

enum class DecodeMode { L2R, R2L, MaskPredict, EasyFirst };

struct DecodeOptions {
  DecodeMode mode = DecodeMode::L2R;
  int beam = 4, lengthBeam = 5, iterations = 10;
  bool rerank = false;
  int64_t maxTarget = 0; ///< longest target (bos..eos) an AR search may build; 0: max_len - 1
};

struct Translation {
  std::vector<int32_t> tgt; ///< bos .. eos
  double score = 0;         ///< the ranking score (mode's own, or the rerank score)
  int64_t candidates = 0;   ///< hypotheses compared at the end
};

Translation translate(const Model &model, const std::vector<int32_t> &src, const DecodeOptions &options);

/// Teacher-forced sum of log p over the rows of an l2r (R..R-) or r2l (-L..L) scoring of tgt.
double teacherForced(const Model &model, const std::vector<int32_t> &src, const std::vector<int32_t> &tgt, Dir dir);

/// The log-probabilities an L2R beam step would compute for row i = prefix.size() - 1 (the
/// incremental path: one row, cached keys/values), for tests against the one-pass score.
std::vector<float> incrementalL2R(const Model &model, const Model::Memory &memory, const std::vector<int32_t> &prefix);

} // namespace lmcc::reference::diformer
