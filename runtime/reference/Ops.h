//===- Ops.h - Reference implementations of the `lm` dialect ops ----------===//
//
// One function per `lm` op (dialect/LmOps.td), written for clarity rather than
// speed: plain Eigen, no fusion, float32 except where a comment says otherwise.
// Together with Executor.cpp these are the numeric definition of every model.
//
// Layout. Activations are padded batches `Batch` of shape [B, H, N, C]: B
// sentences, H groups (1 for token tensors [B, N, C], the heads for per-head
// tensors [B, H, N, dh] and attention scores [B, H, N, M]), N = the longest
// sentence, C features. Row (b, h, t) is valid iff t < lengths[b]. Every op
// computes and reads valid rows only, one sentence at a time, on a private copy
// of that sentence's rows; padding rows stay zero. A sentence's result is thus
// bit-identical whatever batch it is in and whichever thread computes it.
//
// Key axes. In scores and probabilities [B, H, N, M] (self-attention, M = N) the
// last axis is the key axis: key j of sentence b exists iff j < lengths[b].
// `maskFill` writes -inf into the missing keys (key padding) as well as into the
// keys the mask hides, so `softmax` may treat the whole last axis uniformly, and
// the plain `matmul` contracts over the right operand's valid rows only.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/reference/Executor.h"

#include <Eigen/Dense>

#include <cstdint>
#include <functional>
#include <vector>

namespace lmcc::reference {

/// Row-major float matrix (one sentence's rows, or a weight [out, in]).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A bias, LayerNorm gain or shift: one float per feature.
using RowVector = Eigen::Matrix<float, 1, Eigen::Dynamic>;

/// Token ids of a padded batch [B, N]; (b, t) is valid iff t < lengths[b].
struct TokenBatch {
  int64_t B = 0, N = 0;
  std::vector<int64_t> lengths; ///< [B]
  std::vector<int32_t> ids;     ///< [B, N] row-major; padding holds 0 and is never read

  /// Packs sentences into [B, max length].
  static TokenBatch pack(const std::vector<std::vector<int32_t>> &sentences);
  int32_t at(int64_t b, int64_t t) const { return ids[b * N + t]; }
  int32_t &at(int64_t b, int64_t t) { return ids[b * N + t]; }
};

/// A padded float batch [B, H, N, C] (see the file comment).
struct Batch {
  int64_t B = 0, H = 1, N = 0, C = 0;
  std::vector<int64_t> lengths; ///< [B] valid rows per sentence
  std::vector<float> data;      ///< [B, H, N, C] row-major; padding rows are zero

  /// A zero batch with the given lengths, N = max length unless given.
  static Batch zeros(const std::vector<int64_t> &lengths, int64_t H, int64_t N, int64_t C);
  /// A zero batch with the same B, H, N and lengths as `like`, and C columns.
  static Batch zerosLike(const Batch &like, int64_t C);

  float *row(int64_t b, int64_t h, int64_t t) { return data.data() + ((b * H + h) * N + t) * C; }
  const float *row(int64_t b, int64_t h, int64_t t) const {
    return data.data() + ((b * H + h) * N + t) * C;
  }
  float &at(int64_t b, int64_t h, int64_t t, int64_t c) { return row(b, h, t)[c]; }
  float at(int64_t b, int64_t h, int64_t t, int64_t c) const { return row(b, h, t)[c]; }

  /// A private copy of the valid rows of (b, h): [lengths[b], C].
  Matrix slice(int64_t b, int64_t h = 0) const;
  /// Writes the valid rows of (b, h); `m` must be [lengths[b], C].
  void setSlice(int64_t b, int64_t h, const Matrix &m);
};

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

/// lm.embed: out[b, t] = table[ids[b, t]]; table [V, D]. Ids must be in range.
Batch embed(const Matrix &table, const TokenBatch &ids);

/// The sinusoidal table [rows, D] (computed in double, rounded to float):
/// P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(t / 10000^(2i/D)).
Matrix sinusoidalTable(int64_t rows, int64_t D);

/// lm.positions: out[b, t] = P[t], P the learned `table` [L, D] (kind Learned) or the
/// sinusoidal table (kind Sinusoidal); zeros for kind None. Reads only the shape of ids.
Batch positions(const TokenBatch &ids, PositionKind kind, const Matrix *table, int64_t D);

//===----------------------------------------------------------------------===//
// Dense layers, norms, elementwise ops
//===----------------------------------------------------------------------===//

/// lm.linear: y = x W^T + b over the last axis; W [out, in], bias [out] or none.
Batch linear(const Batch &x, const Matrix &W, const RowVector *bias);

/// lm.layer_norm: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis,
/// biased variance; mean, variance and the normalization in double.
Batch layerNorm(const Batch &x, const RowVector &gamma, const RowVector &beta, double eps);

/// Scalar GELU, exact: x * 0.5 * (1 + erf(x / sqrt 2)).
float geluExact(float x);
/// Scalar GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
float geluTanh(float x);

/// lm.gelu: elementwise geluExact, or geluTanh when `approximate`.
Batch gelu(const Batch &x, bool approximate);
/// lm.relu: max(x, 0).
Batch relu(const Batch &x);
/// The block activation of a spec: gelu, gelu_tanh or relu.
Batch activation(const Batch &x, Activation act);

/// lm.add: a + b elementwise (same shape and lengths).
Batch add(const Batch &a, const Batch &b);
/// lm.scale: x * factor.
Batch scale(const Batch &x, float factor);
/// lm.interpolate: log((1 - lambda) e^a + lambda e^b), elementwise, stable (in double).
Batch interpolate(const Batch &a, const Batch &b, double lambda);

//===----------------------------------------------------------------------===//
// Attention, decomposed
//===----------------------------------------------------------------------===//

/// lm.split_heads: [B, 1, N, D] -> [B, H, N, D/H]; head h holds features [h*dh, (h+1)*dh).
Batch splitHeads(const Batch &x, int64_t heads);
/// lm.merge_heads: [B, H, N, dh] -> [B, 1, N, H*dh], the inverse of splitHeads.
Batch mergeHeads(const Batch &x);

/// lm.matmul, per (b, h):
///  * transposeRhs: lhs [N, K] x rhs [M, K]^T -> [N, M]; out[i, j] = lhs_i . rhs_j for
///    valid rows i of lhs and valid rows j of rhs; M = rhs.N, other entries 0.
///  * otherwise: lhs [N, M] x rhs [M, C] -> [N, C]; contracts over rhs's valid rows
///    k < rhs.lengths[b] only (lhs's columns past them are key padding, never read).
Batch matmul(const Batch &lhs, const Batch &rhs, bool transposeRhs);

/// Whether key j is visible to query i of a sentence of n tokens: j < n and
///   none: always; causal: j <= i; anticausal: j >= i; diagonal: j != i.
/// Directional masks need per-row data: std::invalid_argument.
bool keyVisible(MaskKind kind, int64_t i, int64_t j, int64_t n);

/// lm.mask_fill: scores [B, H, N, M]; out = scores where keyVisible(i, j, lengths[b]),
/// -inf elsewhere on valid rows (key padding j >= lengths[b] included).
Batch maskFill(const Batch &scores, MaskKind kind);

/// lm.softmax over the last axis of every valid row: p_j = exp(x_j - max) / sum_k exp(x_k - max),
/// the sum in double. A row whose entries are all -inf gives all zeros (never NaN).
Batch softmax(const Batch &x);

/// Index of the Shaw relative-position embedding: clip(j - i, -k, k) + k.
int64_t relativeIndex(int64_t i, int64_t j, int64_t k);

/// lm.relative_scores: out[b,h,i,j] = query[b,h,i] . rel[relativeIndex(i, j, k)] for valid
/// query rows i and keys j < keys.lengths[b]; rel [2k+1, dh]; M = keys.N. Added to Q K^T
/// before the 1/sqrt(dh) scaling.
Batch relativeScores(const Batch &query, const Batch &keys, const Matrix &rel, int64_t k);

/// lm.relative_values: out[b,h,i] = sum_{j < lengths[b]} p[b,h,i,j] rel[relativeIndex(i, j, k)]
/// (probs [B, H, N, M], rel [2k+1, dh]).
Batch relativeValues(const Batch &probs, const Matrix &rel, int64_t k);

/// Relative-position tables of one attention layer (Shaw et al.), shared by heads.
struct RelativePositions {
  const Matrix *keys = nullptr;   ///< rel_k [2k+1, dh]
  const Matrix *values = nullptr; ///< rel_v [2k+1, dh]
  int64_t clip = 0;               ///< k
};

/// lm.attention on projected Q [B, N, D], K and V [B, N, D] (heads split inside):
///   S = Q_h K_h^T (+ relativeScores); S = S * scale; S = maskFill(S); P = softmax(S);
///   C_h = P V_h (+ relativeValues); out = mergeHeads(C).
/// Exactly the decomposed chain; a query with no visible key gets a zero context vector.
Batch attention(const Batch &query, const Batch &key, const Batch &value, int64_t heads, MaskKind mask,
                float scale, const RelativePositions *relative = nullptr);

//===----------------------------------------------------------------------===//
// Output head and scores
//===----------------------------------------------------------------------===//

/// lm.log_softmax over the last axis of every valid row: x - max - log(sum exp(x - max)),
/// the sum and the logarithm in double.
Batch logSoftmax(const Batch &x);

/// lm.gather: out[b, t] = lp[b, t - shift, ids[b, t]] for shift <= t < lengths[b], 0 for t < shift.
/// lp [B, 1, N, V] -> [B, 1, N, 1].
Batch gather(const Batch &logprobs, const TokenBatch &targets, int64_t shift);

/// lm.token_logprob: gather(logSoftmax(linear(h, W, bias)), targets, shift). The reference
/// form materializes the logits; the compiled form never does.
Batch tokenLogprob(const Batch &hidden, const Matrix &W, const RowVector *bias, const TokenBatch &targets,
                   int64_t shift);

/// lm.sentence_score: per sentence, token log-probs with positions t < first and positions
/// holding a token in `skip` set to 0; score = their sum (in double), nScored = the rest.
std::vector<ScoreResult> sentenceScore(const Batch &tokenLogprobs, const TokenBatch &ids,
                                       const std::vector<int32_t> &skip, int64_t first);

/// lm.mean_pool: per sentence, the mean (in double) of h's valid rows at positions not holding a
/// token in `exclude`; of all valid rows when every one is excluded. h [B, 1, N, D] -> B x [D].
std::vector<std::vector<float>> meanPool(const Batch &hidden, const TokenBatch &ids,
                                         const std::vector<int32_t> &exclude);

/// The embed output: meanPool (Mean: excluding `special`; MeanAll: every valid row) or row 0 (Cls),
/// then, with `normalize`, x / max(||x||_2, 1e-12) per sentence.
std::vector<std::vector<float>> pool(const Batch &hidden, const TokenBatch &ids, Pooling how,
                                     const std::vector<int32_t> &special, bool normalize);

/// lm.mask_and_predict, naive form: for each position i < N, evaluate `region` on the ids with
/// ids[b, i] := maskToken in every sentence with i < lengths[b], and keep row i of its result:
/// result[b, i] = region(ids with position i masked)[b, i]. Region results are [B, 1, N, C].
Batch maskAndPredict(const TokenBatch &ids, int32_t maskToken,
                     const std::function<Batch(const TokenBatch &)> &region);

} // namespace lmcc::reference
