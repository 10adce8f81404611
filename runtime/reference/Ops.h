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
// Backward. Each op's backward follows its forward: given the gradient of a
// scalar loss with respect to the op's output (`dy`, `dOut`, same layout) and
// the forward's inputs, it returns the gradients with respect to the inputs.
// Activation gradients follow the same conventions as activations (valid rows
// only, padding rows zero). Weight gradients (tables, weights, biases, norms)
// are sums over sentences: each sentence's contribution is computed on its own
// rows, and contributions are added in sentence order (computed in parallel on
// the caller's oneTBB arena, summed sequentially), so the result is bit-identical
// for any thread count, and a sentence's contribution does not depend on which
// other sentences share its batch or padding.
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
/// Backward of embed w.r.t. the table: a [vocab, D] matrix with dTable[ids[b, t]] += dOut[b, t]
/// over valid rows (scatter-add; sentences in order, positions in order). Rows no id reached are 0.
Matrix embedBackward(const Batch &dOut, const TokenBatch &ids, int64_t vocab);

/// The sinusoidal table [rows, D] (computed in double, rounded to float):
/// P[t, 2i] = sin(t / 10000^(2i/D)), P[t, 2i+1] = cos(t / 10000^(2i/D)).
Matrix sinusoidalTable(int64_t rows, int64_t D);

/// lm.positions: out[b, t] = P[t], P the learned `table` [L, D] (kind Learned) or the
/// sinusoidal table (kind Sinusoidal); zeros for kind None. Reads only the shape of ids.
Batch positions(const TokenBatch &ids, PositionKind kind, const Matrix *table, int64_t D);
/// Backward of positions with a learned table: [tableRows, D], dTable[t] = sum over sentences
/// (in order) of dOut[b, t] for t < lengths[b]. Sinusoidal and none positions have no parameters.
Matrix positionsBackward(const Batch &dOut, int64_t tableRows);

//===----------------------------------------------------------------------===//
// Dense layers, norms, elementwise ops
//===----------------------------------------------------------------------===//

/// lm.linear: y = x W^T + b over the last axis; W [out, in], bias [out] or none.
Batch linear(const Batch &x, const Matrix &W, const RowVector *bias);
/// Gradients of linear: dx = dy W, dW = sum over (b, h) of dy^T x, dBias = column sums of dy
/// (empty when the forward had no bias).
struct LinearGrad {
  Batch dx;
  Matrix dWeight; ///< [out, in]
  RowVector dBias; ///< [out], or empty
};
LinearGrad linearBackward(const Batch &dy, const Batch &x, const Matrix &W, bool hasBias);

/// lm.layer_norm: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis,
/// biased variance; mean, variance and the normalization in double.
Batch layerNorm(const Batch &x, const RowVector &gamma, const RowVector &beta, double eps);
/// Gradients of layerNorm (per row, in double): with xhat = (x - mean) * inv, g = dy * gamma,
/// dx = inv * (g - mean(g) - xhat * mean(g * xhat)); dGamma = sum dy * xhat, dBeta = sum dy.
struct LayerNormGrad {
  Batch dx;
  RowVector dGamma, dBeta;
};
LayerNormGrad layerNormBackward(const Batch &dy, const Batch &x, const RowVector &gamma, double eps);

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
/// dx = dy * gelu'(x) (derivative in double): exact: Phi(x) + x phi(x); tanh form:
/// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
Batch geluBackward(const Batch &dy, const Batch &x, bool approximate);
/// dx = dy where x > 0, 0 elsewhere (0 at x == 0, as torch).
Batch reluBackward(const Batch &dy, const Batch &x);
/// Backward of activation(x, act).
Batch activationBackward(const Batch &dy, const Batch &x, Activation act);

/// lm.add: a + b elementwise (same shape and lengths).
Batch add(const Batch &a, const Batch &b);
/// (Backward of add: dy passes unchanged to both operands.)
/// lm.scale: x * factor.
Batch scale(const Batch &x, float factor);
/// Backward of scale: dx = dy * factor.
Batch scaleBackward(const Batch &dy, float factor);
/// lm.interpolate: log((1 - lambda) e^a + lambda e^b), elementwise, stable (in double).
Batch interpolate(const Batch &a, const Batch &b, double lambda);
/// Backward of interpolate (in double): da = dy (1 - lambda) e^(a - out), db = dy lambda e^(b - out).
struct InterpolateGrad {
  Batch da, db;
};
InterpolateGrad interpolateBackward(const Batch &dy, const Batch &a, const Batch &b, double lambda);

//===----------------------------------------------------------------------===//
// Attention, decomposed
//===----------------------------------------------------------------------===//

/// lm.split_heads: [B, 1, N, D] -> [B, H, N, D/H]; head h holds features [h*dh, (h+1)*dh).
Batch splitHeads(const Batch &x, int64_t heads);
/// lm.merge_heads: [B, H, N, dh] -> [B, 1, N, H*dh], the inverse of splitHeads.
Batch mergeHeads(const Batch &x);
/// Backward of splitHeads: mergeHeads(dy) (a permutation of features).
Batch splitHeadsBackward(const Batch &dy);
/// Backward of mergeHeads: splitHeads(dy, heads).
Batch mergeHeadsBackward(const Batch &dy, int64_t heads);

/// lm.matmul, per (b, h):
///  * transposeRhs: lhs [N, K] x rhs [M, K]^T -> [N, M]; out[i, j] = lhs_i . rhs_j for
///    valid rows i of lhs and valid rows j of rhs; M = rhs.N, other entries 0.
///  * otherwise: lhs [N, M] x rhs [M, C] -> [N, C]; contracts over rhs's valid rows
///    k < rhs.lengths[b] only (lhs's columns past them are key padding, never read).
Batch matmul(const Batch &lhs, const Batch &rhs, bool transposeRhs);
/// Gradients of matmul, per (b, h), over valid rows and keys only:
///  * transposeRhs: dLhs = dOut[:, :m] rhs, dRhs = dOut[:, :m]^T lhs (m = rhs.lengths[b]);
///  * otherwise: dLhs[:, :m] = dOut rhs^T (key padding columns get 0), dRhs = lhs[:, :m]^T dOut.
struct MatmulGrad {
  Batch dLhs, dRhs;
};
MatmulGrad matmulBackward(const Batch &dOut, const Batch &lhs, const Batch &rhs, bool transposeRhs);

/// Whether key j is visible to query i of a sentence of n tokens: j < n and
///   none: always; causal: j <= i; anticausal: j >= i; diagonal: j != i.
/// Directional masks need per-row data: std::invalid_argument.
bool keyVisible(MaskKind kind, int64_t i, int64_t j, int64_t n);

/// lm.mask_fill: scores [B, H, N, M]; out = scores where keyVisible(i, j, lengths[b]),
/// -inf elsewhere on valid rows (key padding j >= lengths[b] included).
Batch maskFill(const Batch &scores, MaskKind kind);
/// Backward of maskFill: dOut where keyVisible, 0 elsewhere (hidden keys and key padding).
Batch maskFillBackward(const Batch &dOut, MaskKind kind);

/// lm.softmax over the last axis of every valid row: p_j = exp(x_j - max) / sum_k exp(x_k - max),
/// the sum in double. A row whose entries are all -inf gives all zeros (never NaN).
Batch softmax(const Batch &x);
/// Backward of softmax from its output p: dx_j = p_j (dy_j - sum_k p_k dy_k), the sum in double.
/// Masked entries (p = 0) and fully masked rows get 0.
Batch softmaxBackward(const Batch &dy, const Batch &probs);

/// Index of the Shaw relative-position embedding: clip(j - i, -k, k) + k.
int64_t relativeIndex(int64_t i, int64_t j, int64_t k);

/// lm.relative_scores: out[b,h,i,j] = query[b,h,i] . rel[relativeIndex(i, j, k)] for valid
/// query rows i and keys j < keys.lengths[b]; rel [2k+1, dh]; M = keys.N. Added to Q K^T
/// before the 1/sqrt(dh) scaling.
Batch relativeScores(const Batch &query, const Batch &keys, const Matrix &rel, int64_t k);
/// Gradients of relativeScores: dQuery[i] = sum_j dOut[i, j] rel[r(i, j)];
/// dRel[r(i, j)] += dOut[i, j] query[i] over valid (i, j), summed over heads and sentences.
struct RelativeScoresGrad {
  Batch dQuery;
  Matrix dRel; ///< [2k+1, dh]
};
RelativeScoresGrad relativeScoresBackward(const Batch &dOut, const Batch &query, const Batch &keys,
                                          const Matrix &rel, int64_t k);

/// lm.relative_values: out[b,h,i] = sum_{j < lengths[b]} p[b,h,i,j] rel[relativeIndex(i, j, k)]
/// (probs [B, H, N, M], rel [2k+1, dh]).
Batch relativeValues(const Batch &probs, const Matrix &rel, int64_t k);
/// Gradients of relativeValues: dProbs[i, j] = dOut[i] . rel[r(i, j)] (j < lengths[b]);
/// dRel[r(i, j)] += probs[i, j] dOut[i], summed over heads and sentences.
struct RelativeValuesGrad {
  Batch dProbs;
  Matrix dRel; ///< [2k+1, dh]
};
RelativeValuesGrad relativeValuesBackward(const Batch &dOut, const Batch &probs, const Matrix &rel, int64_t k);

/// Relative-position tables of one attention layer (Shaw et al.), shared by heads.
struct RelativePositions {
  const Matrix *keys = nullptr;   ///< rel_k [2k+1, dh]
  const Matrix *values = nullptr; ///< rel_v [2k+1, dh]
  int64_t clip = 0;               ///< k
};

/// One dropout site's masks ([train] dropout / attention_dropout; runtime/train/Philox.h).
struct DropoutMask {
  double rate = 0;
  uint64_t seed = 0, step = 0; ///< [train] seed, the training step
  uint32_t site = 0;
};
/// lm.dropout (training) on x [B, H, N, C] (H = 1: an activation; the heads: attention probabilities):
/// x * keep / (1 - rate) over the valid rows, element (b, h, t, c) keyed as (sentence b H + h, row t, feature c).
/// Also the backward: the same mask and scale on the gradient.
Batch applyDropout(const Batch &x, const DropoutMask &d);

/// lm.attention on projected Q [B, N, D], K and V [B, N, D] (heads split inside):
///   S = Q_h K_h^T (+ relativeScores); S = S * scale; S = maskFill(S); P = softmax(S);
///   P = applyDropout(P) (training with attention dropout only);
///   C_h = P V_h (+ relativeValues); out = mergeHeads(C).
/// Exactly the decomposed chain; a query with no visible key gets a zero context vector.
Batch attention(const Batch &query, const Batch &key, const Batch &value, int64_t heads, MaskKind mask,
                float scale, const RelativePositions *relative = nullptr, const DropoutMask *dropout = nullptr);

/// Gradients of attention through the decomposed chain (recomputed from query, key and value,
/// then each op's backward in reverse order). dRelKeys/dRelValues are empty without `relative`.
struct AttentionGrad {
  Batch dQuery, dKey, dValue; ///< [B, 1, N, D]
  Matrix dRelKeys, dRelValues; ///< [2k+1, dh], relative positions only
};
AttentionGrad attentionBackward(const Batch &dOut, const Batch &query, const Batch &key, const Batch &value,
                                int64_t heads, MaskKind mask, float scale,
                                const RelativePositions *relative = nullptr,
                                const DropoutMask *dropout = nullptr);

//===----------------------------------------------------------------------===//
// Output head and scores
//===----------------------------------------------------------------------===//

/// lm.log_softmax over the last axis of every valid row: x - max - log(sum exp(x - max)),
/// the sum and the logarithm in double.
Batch logSoftmax(const Batch &x);
/// Backward of logSoftmax from its output lp: dx_j = dy_j - exp(lp_j) sum_k dy_k, in double.
Batch logSoftmaxBackward(const Batch &dy, const Batch &logprobs);

/// Label-smoothed cross-entropy of logits [B, 1, N, V] (rows predict `targets`, -1 = no target):
/// per row with a target, in double, log p = logits - logsumexp(logits) and
/// CE = -(1 - e) log p[target] - (e / V) sum_v log p[v]. lossSum = the sum of CE over such rows
/// (per sentence in order), targets = their count, dLogits = gradScale * d(lossSum)/d(logits)
/// = gradScale * (p - (1 - e) onehot(target) - e / V), rounded to float once; 0 on rows without a target.
/// A target outside [-1, V) throws std::invalid_argument naming the sentence and the position.
struct CrossEntropy {
  double lossSum = 0;
  int64_t targets = 0;
  Batch dLogits;
};
CrossEntropy crossEntropy(const Batch &logits, const TokenBatch &targets, double labelSmoothing,
                          double gradScale);

/// lm.gather: out[b, t] = lp[b, t - shift, ids[b, t]] for shift <= t < lengths[b], 0 for t < shift.
/// lp [B, 1, N, V] -> [B, 1, N, 1].
Batch gather(const Batch &logprobs, const TokenBatch &targets, int64_t shift);
/// Backward of gather: dLogprobs [B, 1, N, vocab] with dLogprobs[b, t - shift, ids[b, t]] = dOut[b, t].
Batch gatherBackward(const Batch &dOut, const TokenBatch &targets, int64_t shift, int64_t vocab);

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
/// With `spans` (packed like ids): position i of sentence b is predicted with positions
/// [i, min(spans[b, i], lengths[b])) masked, and only when that range is not empty (other rows: zero).
Batch maskAndPredict(const TokenBatch &ids, int32_t maskToken,
                     const std::function<Batch(const TokenBatch &)> &region, const TokenBatch *spans = nullptr);

} // namespace lmcc::reference
