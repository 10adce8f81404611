//===- Executor.h - Reference executor: whole-model scoring and embedding --===//
//
// The numeric oracle (runtime/SEMANTICS.md). Composes the per-op functions of
// Ops.h exactly as MLIRGen composes `lm` ops, without fusion. Batched with
// padding: sentences of different lengths share one padded [B, n_max, D] layout,
// and every op reads only each sentence's valid rows, so a sentence's result does
// not depend on the batch it is in or on the thread count (bit for bit).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/weights/Safetensors.h"

#include <cstdint>
#include <vector>

namespace lmcc::reference {

struct ScoreResult {
  std::vector<float> tokenLogprobs; ///< one per input token
  double score = 0;                 ///< sum of tokenLogprobs
  int64_t nScored = 0;              ///< positions scored
};

/// Scores every sentence with spec.method. Ids must already be validated
/// (0 <= id < vocab, 1 <= length <= max_len); throws std::invalid_argument otherwise.
/// `threads` <= 0 means all cores. Families: unilm, bilm, tta.
std::vector<ScoreResult> score(const ModelSpec &spec, const WeightSet &weights,
                               const std::vector<std::vector<int32_t>> &sentences, int threads = 1);

/// Mean-pooled last-layer states, one vector of D floats per sentence.
std::vector<std::vector<float>> embed(const ModelSpec &spec, const WeightSet &weights,
                                      const std::vector<std::vector<int32_t>> &sentences, int threads = 1);

/// Full log-probabilities [n, V] of one forward pass over `ids` (debugging, per-op tests).
std::vector<std::vector<float>> logprobs(const ModelSpec &spec, const WeightSet &weights,
                                         const std::vector<int32_t> &ids);

/// Last-layer hidden states [n, D] (after final_norm when pre-norm) of one forward pass
/// over `ids` (debugging, tests).
std::vector<std::vector<float>> hiddenStates(const ModelSpec &spec, const WeightSet &weights,
                                             const std::vector<int32_t> &ids);

} // namespace lmcc::reference
