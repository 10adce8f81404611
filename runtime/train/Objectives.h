//===- Objectives.h - Training objectives: (inputs, targets) from a sentence -===//
//
// Issue 14's objectives. Given a sentence x (bos .. eos, as ids) they build the
// explicit (inputs, targets) pair that reference::lossAndGrad and the compiled
// `<name>_loss_and_grad` take: row i of the model's last layer over `inputs`
// predicts targets[i], -1 = no prediction at row i.
//
//   causal:       inputs = x; targets[i] = x[i+1] for i < L-1, -1 at i = L-1.
//   ngram:        as causal (head j's targets x[i+j] are derived from these by the model).
//   autoencoding: inputs = x; targets[i] = x[i] where x[i] is neither bos nor eos, else -1.
//   masked:       see maskedExample below.
//
// "Special" positions are those holding the spec's tokens.bos or tokens.eos.
//
// Randomness (masked only) comes from Philox4x32-10 (Salmon et al., SC'11; the
// Random123 algorithm, checked against its known-answer vectors), a counter-based
// generator: every draw is a pure function of
//   key     = (seed mod 2^32, seed >> 32)                       [train] seed
//   counter = (position, purpose, sentence mod 2^32, step mod 2^32)
// so a sentence's example depends only on (seed, sentence index, step, x), never
// on the thread count, on the order of calls or on the other sentences.
// A uniform u in [0, 1) is taken from the first two output words w0, w1 as
//   u = ((w0 << 32 | w1) >> 11) * 2^-53.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/train/Philox.h"

#include <array>
#include <cstdint>
#include <vector>

namespace lmcc::train {

// philox4x32: runtime/train/Philox.h.

/// What a draw is for: counter word 1. Different purposes never share a counter.
enum class Purpose : uint32_t {
  Choose = 1,   ///< at position i: is i chosen (u < mask_prob)?
  Fallback = 2, ///< at position 0: which candidate, when none was chosen
  Subset = 3,   ///< at position i: the sort key of chosen i, when more than max_masks were chosen
  Replace = 4,  ///< at position i: bert's 80/10/10 choice for chosen i
  RandomId = 5, ///< at position i: bert's random id for chosen i
  // The corpus pipeline (Corpus.h): "step" is the epoch, "sentence" the sentence or batch index.
  Shuffle = 16,    ///< sentence i's sort key among equal lengths in an epoch
  BatchOrder = 17, ///< batch b's sort key in an epoch
  Holdout = 18,    ///< sentence i's key for the held-out validation part
};

/// The uniform [0, 1) draw for (seed, step, sentence, position, purpose), as the file comment says.
double uniform(uint64_t seed, uint64_t step, uint64_t sentence, uint32_t position, Purpose purpose);

/// One training example: inputs and targets of the same length.
struct Example {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets; ///< -1 = no prediction at that row
};

/// causal: inputs = x, targets[i] = x[i+1], -1 at the last row.
Example causalExample(const std::vector<int32_t> &x);

/// autoencoding: inputs = x, targets[i] = x[i] on non-special positions, -1 on bos/eos.
Example autoencodingExample(const ModelSpec &spec, const std::vector<int32_t> &x);

/// masked (spec.train: mask_prob p, max_masks K, mask_replace, seed), the draws in this order:
///  1. candidates = the non-special positions, ascending; position i is chosen iff
///     uniform(i, Choose) < p;
///  2. none chosen (and candidates non-empty): the candidate at index floor(u * m) is chosen,
///     u = uniform(0, Fallback), m = the number of candidates;
///  3. more than K chosen: the K with the smallest uniform(i, Subset) stay chosen (ties: the
///     lower position), a uniformly random K-subset;
///  4. each chosen i: "mask": inputs[i] = tokens.mask; "bert": with r = uniform(i, Replace),
///     r < 0.8: tokens.mask; 0.8 <= r < 0.9: floor(uniform(i, RandomId) * V) (any id in [0, V),
///     possibly x[i]); r >= 0.9: x[i] unchanged;
///  5. targets[i] = x[i] on chosen positions, -1 elsewhere; other inputs are x.
/// A sentence with no non-special position gets no target (all -1).
Example maskedExample(const ModelSpec &spec, const std::vector<int32_t> &x, uint64_t step, uint64_t sentence);

/// The example of resolvedObjective(spec) for sentence x (step and sentence index matter for the
/// masked objective only). Throws std::invalid_argument for an empty sentence or an id outside
/// [0, vocab), naming the sentence and the position.
Example makeExample(const ModelSpec &spec, const std::vector<int32_t> &x, uint64_t step, uint64_t sentence);

/// A batch of examples: inputs and targets, one per sentence.
struct Examples {
  std::vector<std::vector<int32_t>> inputs, targets;
};

/// makeExample for every sentence b, with sentence index firstSentence + b.
Examples makeExamples(const ModelSpec &spec, const std::vector<std::vector<int32_t>> &sentences, uint64_t step,
                      uint64_t firstSentence = 0);

} // namespace lmcc::train
