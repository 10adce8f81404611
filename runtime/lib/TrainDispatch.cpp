//===- TrainDispatch.cpp - lm_rt_* training kernels: the copy for this CPU ---===//
#include "runtime/lib/TrainKernels.h"
#include "runtime/lib/lmrt.h"

namespace {

enum class Isa { Base, Avx2, Avx512 };

Isa hostIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return Isa::Avx2;
    return Isa::Base;
  }();
  return isa;
}

struct DropoutContext {
  uint64_t seed = 0, step = 0;
};
thread_local DropoutContext t_dropout;

} // namespace

void lmrt::setDropoutContext(uint64_t seed, uint64_t step) { t_dropout = {seed, step}; }

#define LMRT_DISPATCH(fn, ...)                                                                                    \
  switch (hostIsa()) {                                                                                            \
  case Isa::Avx512: return lmrt::avx512::fn(__VA_ARGS__);                                                        \
  case Isa::Avx2: return lmrt::avx2::fn(__VA_ARGS__);                                                            \
  case Isa::Base: return lmrt::base::fn(__VA_ARGS__);                                                            \
  }

extern "C" {

void lm_rt_token_loss(const float *h, const float *W, const float *bias, const int32_t *targets,
                      const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, float *ce,
                      float *lse, lm_rt_gemm_fn gemm, int64_t gemm_cols) {
  LMRT_DISPATCH(tokenLoss, h, W, bias, targets, lengths, B, N, D, V, smoothing, ce, lse, gemm, gemm_cols)
}
void lm_rt_token_loss_grad(const float *h, const float *W, const float *bias, const int32_t *targets,
                           const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                           double smoothing, int32_t per_length, float *dh, float *dW, float *dbias, lm_rt_gemm_fn gemm,
                           int64_t gemm_cols) {
  LMRT_DISPATCH(tokenLossGrad, h, W, bias, targets, lengths, lse, B, N, D, V, smoothing, per_length, dh, dW, dbias, gemm,
                gemm_cols)
}
void lm_rt_token_loss_and_grad(const float *h, const float *W, const float *bias, const int32_t *targets,
                               const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                               int32_t per_length, int64_t keep_bytes, float *ce, float *lse, float *dh, float *dW,
                               float *dbias, lm_rt_gemm_fn gemm, int64_t gemm_cols) {
  LMRT_DISPATCH(tokenLossAndGrad, h, W, bias, targets, lengths, B, N, D, V, smoothing, per_length, keep_bytes, ce, lse,
                dh, dW, dbias, gemm, gemm_cols)
}
void lm_rt_ngram_head_loss(const float *u, const float *W, const float *bias, const int32_t *targets,
                           const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                           int64_t shift, double weight, int32_t first, float *total, float *lse, lm_rt_gemm_fn gemm,
                           int64_t gemm_cols) {
  LMRT_DISPATCH(ngramHeadLoss, u, W, bias, targets, lengths, B, N, D, V, smoothing, shift, weight, first, total, lse,
                gemm, gemm_cols)
}
void lm_rt_ngram_head_grad(const float *u, const float *W, const float *bias, const int32_t *targets,
                           const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                           double smoothing, int64_t shift, double weight, int32_t first, float *du, float *dW,
                           float *dbias, lm_rt_gemm_fn gemm, int64_t gemm_cols) {
  LMRT_DISPATCH(ngramHeadGrad, u, W, bias, targets, lengths, lse, B, N, D, V, smoothing, shift, weight, first, du, dW,
                dbias, gemm, gemm_cols)
}
void lm_rt_ngram_head_loss_and_grad(const float *u, const float *W, const float *bias, const int32_t *targets,
                                    const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V,
                                    double smoothing, int64_t shift, double weight, int32_t first, int64_t keep_bytes,
                                    float *total, float *lse, float *du, float *dW, float *dbias, lm_rt_gemm_fn gemm,
                                    int64_t gemm_cols) {
  LMRT_DISPATCH(ngramHeadLossAndGrad, u, W, bias, targets, lengths, B, N, D, V, smoothing, shift, weight, first,
                keep_bytes, total, lse, du, dW, dbias, gemm, gemm_cols)
}
void lm_rt_linear_grad(const float *dy, const float *x, const float *W, int64_t rows, int64_t in, int64_t out,
                       float *dx, float *dW, float *db, lm_rt_gemm_fn gemm, int64_t gemm_cols) {
  LMRT_DISPATCH(linearGrad, dy, x, W, rows, in, out, dx, dW, db, gemm, gemm_cols)
}
void lm_rt_layer_norm_grad(const float *dy, const float *x, const float *gamma, int64_t rows, int64_t D, double eps,
                           float *dx, float *dgamma, float *dbeta) {
  LMRT_DISPATCH(layerNormGrad, dy, x, gamma, rows, D, eps, dx, dgamma, dbeta)
}
void lm_rt_activation_grad(const float *dy, const float *x, int64_t n, int32_t kind, float *dx) {
  LMRT_DISPATCH(activationGrad, dy, x, n, kind, dx)
}
void lm_rt_attention_grad(const float *dO, const float *q, const float *k, const float *v, const int32_t *lengths,
                          const int32_t *query_lengths, const int32_t *rows, int64_t row_width, const float *relK,
                          const float *relV, int64_t clip,
                          int64_t B, int64_t N, int64_t M, int64_t D, int64_t heads, int32_t mask, float scale,
                          float *dq, float *dk, float *dv, float *dRelK, float *dRelV) {
  LMRT_DISPATCH(attentionGrad, dO, q, k, v, lengths, query_lengths, rows, row_width, relK, relV, clip, B, N, M, D, heads, mask, scale,
                dq, dk, dv, dRelK, dRelV)
}
void lm_rt_relative_scores_grad(const float *dOut, const float *q, const float *rel, int64_t BH, int64_t N, int64_t M,
                                int64_t dh, int64_t clip, float *dq, float *dRel) {
  LMRT_DISPATCH(relativeScoresGrad, dOut, q, rel, BH, N, M, dh, clip, dq, dRel)
}
void lm_rt_relative_values_grad(const float *dOut, const float *p, const float *rel, int64_t BH, int64_t N, int64_t M,
                                int64_t dh, int64_t clip, float *dp, float *dRel) {
  LMRT_DISPATCH(relativeValuesGrad, dOut, p, rel, BH, N, M, dh, clip, dp, dRel)
}
void lm_rt_embed_grad(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N, int64_t D,
                      int64_t V, float *out) {
  LMRT_DISPATCH(embedGrad, dy, ids, lengths, B, N, D, V, out)
}
void lm_rt_embed_grad_add(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N, int64_t D,
                          int64_t V, float *out) {
  LMRT_DISPATCH(embedGradAdd, dy, ids, lengths, B, N, D, V, out)
}
void lm_rt_positions_grad(const float *dy, const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t L,
                          float *out) {
  LMRT_DISPATCH(positionsGrad, dy, lengths, B, N, D, L, out)
}
void lm_rt_cross_entropy(const float *lp, const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N,
                         int64_t V, double smoothing, float *ce) {
  LMRT_DISPATCH(crossEntropy, lp, targets, lengths, B, N, V, smoothing, ce)
}
void lm_rt_cross_entropy_grad(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V,
                              double smoothing, int32_t per_length, float *dlp) {
  LMRT_DISPATCH(crossEntropyGrad, targets, lengths, B, N, V, smoothing, per_length, dlp)
}
void lm_rt_softmax_grad(const float *dy, const float *y, int64_t rows, int64_t C, int32_t logarithmic, float *dx) {
  LMRT_DISPATCH(softmaxGrad, dy, y, rows, C, logarithmic, dx)
}

void lm_rt_dropout(const float *x, const int32_t *lengths, int64_t B, int64_t N, int64_t C, double rate, int64_t site,
                   float *out) {
  LMRT_DISPATCH(dropout, x, lengths, nullptr, B, 1, N, C, rate, site, t_dropout.seed, t_dropout.step, out)
}
void lm_rt_dropout_rows(const float *x, const int32_t *lengths, const int32_t *rows, int64_t B, int64_t T, int64_t C,
                        double rate, int64_t site, float *out) {
  LMRT_DISPATCH(dropout, x, lengths, rows, B, 1, T, C, rate, site, t_dropout.seed, t_dropout.step, out)
}
void lm_rt_dropout_heads(const float *x, const int32_t *lengths, int64_t B, int64_t H, int64_t N, int64_t M,
                         double rate, int64_t site, float *out) {
  LMRT_DISPATCH(dropout, x, lengths, nullptr, B, H, N, M, rate, site, t_dropout.seed, t_dropout.step, out)
}

} // extern "C"
