//===- Diformer.h - Reference Diformer: score, loss and gradient, decoding -===//
//
// The numeric oracle of the Diformer family (issue 19's contract; diformer paper 2.2-2.3):
// a biLM encoder over the source (post-norm, or pre-norm with final norms in both stacks), a length head on the mean of its output, and a
// directional decoder. Decoder row i (direction z_i in {R, L, S}) has the query
// direction[z_i] + (z_i == L ? position.r2l[n-1-i] : position.l2r[i]); its self-attention keys
// and values are the projections of embed.token[y_j] alone (input isolation), with Shaw relative
// terms rel_k / rel_v indexed by c = clip(j - i, -k, k) + k; key j is visible to row i when
//   R: j <= i;   L: j >= i;   S: j != i and j not in H_i.
// Row i predicts tau_i = y_{i+1} (R), y_{i-1} (L), y_i (S) through the head tied to embed.token.
//
// Plain Eigen, one sentence at a time (valid rows only), float storage with double LayerNorm
// statistics and softmax sums, like Ops.h. The visibility of a row is a predicate evaluated per
// (row, key) from the directions and hidden sets: no mask tensor is an input.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/weights/Safetensors.h"

#include <Eigen/Dense>

#include <cstdint>
#include <string>
#include <vector>

namespace lmcc::reference::diformer {

/// A row's direction; Skip ('-') rows are neither scored nor computed.
enum class Dir : int8_t { R = 0, L = 1, S = 2, Skip = 3 };

/// One source/target pair with the directions and hidden sets of the target's rows.
struct Example {
  std::vector<int32_t> src;              ///< source ids
  std::vector<int32_t> tgt;              ///< bos .. eos (n >= 2)
  std::vector<Dir> dirs;                 ///< n directions
  std::vector<std::vector<int32_t>> hidden; ///< n hidden sets (H_i, S rows only; empty otherwise)
};

/// Parses DIRS ("RSL-" letters, or l2r / r2l / pll) for a target of n tokens; throws
/// std::invalid_argument (message without location) for an unknown letter, a wrong count,
/// z_0 not R or '-', or z_{n-1} not L or '-'.
std::vector<Dir> parseDirections(const std::string &text, int64_t n);
char letter(Dir d);

/// Checks an example against the spec (ids in range, lengths, bos/eos at the ends, direction
/// rules, hidden positions in 1..n-2 and only on S rows); throws std::invalid_argument starting
/// with `where`.
void validateExample(const ModelSpec &spec, const Example &e, const std::string &where);

struct Score {
  std::vector<float> tokenLogprobs; ///< n entries: log p(tau_i), 0 for '-' rows
  double score = 0;                 ///< sum of tokenLogprobs (length excluded)
  int64_t nScored = 0;              ///< rows not '-'
  double lengthLogprob = 0;         ///< log P(n | X)
};

/// The weights of one Diformer as Eigen matrices (built once; every entry point reads it).
class Model {
public:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using RowVector = Eigen::Matrix<float, 1, Eigen::Dynamic>;

  /// Throws WeightError for a missing tensor or a wrong shape (the weights should be validated).
  Model(const ModelSpec &spec, const WeightSet &weights);
  ~Model();
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  const ModelSpec &spec() const { return spec_; }
  /// Name and shape of every tensor of the weights the model was built from (the gradient's layout).
  const std::vector<std::pair<std::string, std::vector<int64_t>>> &gradShapes() const { return shapes_; }

  /// Encoder output [m, D] and the length log-probabilities [max_len] of one source.
  struct Memory {
    Matrix states;
    std::vector<double> lengthLogprobs;
    std::vector<Matrix> crossKeys, crossValues; ///< per decoder layer, projected once
  };
  Memory encode(const std::vector<int32_t> &src) const;

  /// The self-attention keys and values of one target token in every decoder layer (they depend
  /// on the token alone: input isolation), the unit of the decoding caches.
  struct KeyValue {
    std::vector<RowVector> keys, values; ///< per decoder layer, [D]
  };
  KeyValue keyValue(int32_t token) const;

  /// Log-probabilities [rows, V] of decoder rows. Row r has direction dirs[r] (R, L or S), query
  /// position queryPos[r] (the position-table row: i for R/S, n-1-i for L) and sees keys
  /// visible[r] (indices into `keys`) with relative offsets offsets[r][j] = (key position -
  /// row position). Only these rows are computed.
  Matrix rowLogprobs(const Memory &memory, const std::vector<const KeyValue *> &keys, const std::vector<Dir> &dirs,
                     const std::vector<int64_t> &queryPos, const std::vector<std::vector<int32_t>> &visible,
                     const std::vector<std::vector<int64_t>> &offsets) const;

  /// Scores one validated example.
  Score score(const Example &e) const;

  /// Loss pieces and gradients of one validated example (every row not '-' predicts tau_i):
  /// tokenNll = -sum_i log p(tau_i), lengthNll = -log P(n | X); grads accumulate
  /// tokenScale * d(tokenNll) + lengthScale * d(lengthNll).
  struct Pieces {
    double tokenNll = 0, lengthNll = 0;
  };
  Pieces accumulateGrad(const Example &e, double tokenScale, double lengthScale, WeightSet &grads) const;

  struct Impl;

private:
  ModelSpec spec_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_;
  Impl *impl_;
};

/// Scores validated examples (threads <= 0: all cores; results do not depend on it).
std::vector<Score> score(const ModelSpec &spec, const WeightSet &weights, const std::vector<Example> &examples,
                         int threads = 1);

/// The `directional` objective's draw for one pair (sets e.dirs and e.hidden from e.tgt): z_0 = R,
/// z_{n-1} = L, every other row uniform over {R, L, S}; an S row hides a uniform subset of
/// c_i ~ U{0..n-3} other content positions. Philox4x32-10 of (seed, step, sentence, row): the same
/// draws for the same step whatever the thread count or batch composition.
void drawDirections(Example &e, uint64_t seed, uint64_t step, uint32_t sentence);

/// The `directional` objective's loss of a batch and its gradient (every canonical tensor):
/// loss = sum_b tokenNll_b / sum_b n_b + length_loss * mean_b lengthNll_b.
struct LossAndGrad {
  double loss = 0, tokenNll = 0, lengthNll = 0;
  int64_t tokens = 0; ///< sum_b n_b
  WeightSet grads;
};
/// Sentences in parallel with `threads` (<= 0: all cores); bit-identical for any thread count.
LossAndGrad lossAndGrad(const ModelSpec &spec, const Model &model, const std::vector<Example> &examples,
                        int threads = 1);

} // namespace lmcc::reference::diformer
