//===- Executor.h - Reference executor: whole-model scoring and embedding --===//
//
// The numeric oracle (runtime/SEMANTICS.md), and of training gradients (lossAndGrad,
// issue 14: each op's backward of Ops.h in reverse order). Composes the per-op functions of
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
/// `spans` (mask-and-predict scoring only; one entry per token): token i is predicted with tokens
/// [i, spans[s][i]) masked, spans[s][i] in (i, length] (i + 1 everywhere: the original PLL; the end of
/// the word: Kauf & Ivanova's within-word l2r PLL).
std::vector<ScoreResult> score(const ModelSpec &spec, const WeightSet &weights,
                               const std::vector<std::vector<int32_t>> &sentences, int threads = 1,
                               const std::vector<std::vector<int32_t>> *spans = nullptr);

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

/// The loss of a training batch and its gradient (issue 14's contract).
struct LossAndGrad {
  double loss = 0;     ///< (1/T) * sum of CE_i over rows with target >= 0
  int64_t targets = 0; ///< T
  WeightSet grads;     ///< every canonical tensor of the model (names and shapes of the weights), 0 where unreached
};

/// Loss and gradient of one batch: row i of the last layer of one forward pass over inputs[b]
/// (through the head, as scoring's single forward) predicts targets[b][i] (-1: no prediction);
/// CE_i = -(1 - e) log p(target) - (e / V) sum_v log p(v), e = labelSmoothing (in double);
/// loss = (1/T) sum CE_i, T = rows with a target in the whole batch. Tied weights (embed.token as
/// embedding, head output and mask query) accumulate every contribution. Weight gradients sum the
/// sentences' contributions in sentence order: bit-identical for any `threads` (<= 0: all cores).
/// Families unilm, bilm, tta. Throws std::invalid_argument naming the sentence and position for
/// inputs/targets of different shapes, an id or target outside [0, V) (target -1 allowed), a length
/// 0 or > max_len, or no target in the whole batch. With [train] dropout > 0 the embedding output and
/// every sub-layer output before its residual are dropped with the masks of training step `step`
/// (runtime/train/Philox.h: a function of the [train] seed, the step, the site and the element); with
/// [train] attention_dropout > 0 every layer's attention probabilities (site 2^20 + layer).
LossAndGrad lossAndGrad(const ModelSpec &spec, const WeightSet &weights,
                        const std::vector<std::vector<int32_t>> &inputs,
                        const std::vector<std::vector<int32_t>> &targets, double labelSmoothing, int threads = 1,
                        uint64_t step = 0);

} // namespace lmcc::reference
