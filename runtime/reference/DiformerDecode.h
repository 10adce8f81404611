//===- DiformerDecode.h - Diformer decoding on the reference model --------===//
//
// The four decoding modes of issue 19 and self-reranking (runtime/lib/DiformerSearch.h, the search
// shared with the compiled library's lm_rt_translate), driven by reference::diformer::Model: a step
// computes only the new rows, with keys and values cached per token id (they depend on the token
// alone) and the cross-attention keys/values projected once per source.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/lib/DiformerSearch.h"
#include "runtime/reference/Diformer.h"

namespace lmcc::reference::diformer {

using decode::Translation;
using DecodeMode = decode::Mode;
using DecodeOptions = decode::Options;

/// The search's special tokens and sizes of a spec.
decode::Tokens searchTokens(const ModelSpec &spec);

Translation translate(const Model &model, const std::vector<int32_t> &src, const DecodeOptions &options);

/// Teacher-forced sum of log p over the rows of an l2r (R..R-) or r2l (-L..L) scoring of tgt.
double teacherForced(const Model &model, const std::vector<int32_t> &src, const std::vector<int32_t> &tgt, Dir dir);

/// The log-probabilities an L2R beam step would compute for row i = prefix.size() - 1 (the
/// incremental path: one row, cached keys/values), for tests against the one-pass score.
std::vector<float> incrementalL2R(const Model &model, const Model::Memory &memory, const std::vector<int32_t> &prefix);

} // namespace lmcc::reference::diformer
