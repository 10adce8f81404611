//===- TrainKernels.h - The loss and backward kernels, one copy per ISA level --===//
//
// Declared once per namespace (base, avx2, avx512: TrainKernels.cpp compiled three times);
// TrainDispatch.cpp exports them as the lm_rt_* functions of lmrt.h, choosing the copy for the
// host CPU. All tensors are dense row-major float32; B sentences padded to N rows, lengths[b]
// valid rows each.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/lib/lmrt.h"

#include <cstdint>

/* Mask kinds and activations as the kernels receive them (lm.attention_grad / lm.activation_grad). */
#define LMRT_MASK_NONE 0
#define LMRT_MASK_CAUSAL 1
#define LMRT_MASK_ANTICAUSAL 2
#define LMRT_MASK_DIAGONAL 3
#define LMRT_MASK_DIRECTIONAL 4 /* per-row rows [B, N, rowWidth]: direction, then hidden-key bits (lm.mask_fill) */
#define LMRT_ACT_GELU 0
#define LMRT_ACT_GELU_TANH 1
#define LMRT_ACT_RELU 2
/* Vocabulary columns per tile of the loss kernels: the depth (and A's row stride) of the loss backward's dh
   products, one of the depths the library's training GEMM specializes (codegen/LmToLoops/Backward.cpp). */
#define LMRT_LOSS_VOCAB_TILE 512

#define LMRT_DECLARE_TRAIN_KERNELS(NS)                                                                            \
  namespace lmrt::NS {                                                                                            \
  void tokenLoss(const float *h, const float *W, const float *bias, const int32_t *targets,                     \
                 const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, float *ce, \
                 float *lse, lm_rt_gemm_fn gemm, int64_t gemmCols);                                               \
  void tokenLossGrad(const float *h, const float *W, const float *bias, const int32_t *targets,                 \
                     const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,        \
                     double smoothing, int32_t perLength, float *dh, float *dW, float *dbias, lm_rt_gemm_fn gemm, \
                     int64_t gemmCols);                                                                           \
  void tokenLossAndGrad(const float *h, const float *W, const float *bias, const int32_t *targets,              \
                        const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,     \
                        int32_t perLength, int64_t keepBytes, float *ce, float *lse, float *dh, float *dW,         \
                        float *dbias, lm_rt_gemm_fn gemm, int64_t gemmCols);                                      \
  void ngramHeadLoss(const float *u, const float *W, const float *bias, const int32_t *targets,                 \
                     const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,        \
                     int64_t shift, double weight, int32_t first, float *total, float *lse, lm_rt_gemm_fn gemm,    \
                     int64_t gemmCols);                                                                           \
  void ngramHeadGrad(const float *u, const float *W, const float *bias, const int32_t *targets,                 \
                     const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,        \
                     double smoothing, int64_t shift, double weight, int32_t first, float *du, float *dW,         \
                     float *dbias, lm_rt_gemm_fn gemm, int64_t gemmCols);                                         \
  void ngramHeadLossAndGrad(const float *u, const float *W, const float *bias, const int32_t *targets,          \
                            const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, \
                            int64_t shift, double weight, int32_t first, int64_t keepBytes, float *total,         \
                            float *lse, float *du, float *dW, float *dbias, lm_rt_gemm_fn gemm,                   \
                            int64_t gemmCols);                                                                    \
  void linearGrad(const float *dy, const float *x, const float *W, int64_t rows, int64_t in, int64_t out,        \
                  float *dx, float *dW, float *db, lm_rt_gemm_fn gemm, int64_t gemmCols);                         \
  void layerNormGrad(const float *dy, const float *x, const float *gamma, int64_t rows, int64_t D, double eps,  \
                     float *dx, float *dgamma, float *dbeta);                                                     \
  void activationGrad(const float *dy, const float *x, int64_t n, int32_t kind, float *dx);                      \
  void attentionGrad(const float *dO, const float *q, const float *k, const float *v, const int32_t *lengths,   \
                     const int32_t *queryLengths, const int32_t *rows, int64_t rowWidth, const float *relK,     \
                     const float *relV, int64_t clip,                                                           \
                     int64_t B, int64_t N, int64_t M,                                                           \
                     int64_t D, int64_t heads, int32_t mask, float scale, float *dq, float *dk, float *dv,      \
                     float *dRelK, float *dRelV);                                                                 \
  void relativeScoresGrad(const float *dOut, const float *q, const float *rel, int64_t BH, int64_t N,          \
                          int64_t M, int64_t dh, int64_t clip, float *dq, float *dRel);                          \
  void relativeValuesGrad(const float *dOut, const float *p, const float *rel, int64_t BH, int64_t N,          \
                          int64_t M, int64_t dh, int64_t clip, float *dp, float *dRel);                          \
  void embedGrad(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N, int64_t D,  \
                 int64_t V, float *out);                                                                          \
  void embedGradAdd(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N,         \
                    int64_t D, int64_t V, float *out);                                                            \
  void positionsGrad(const float *dy, const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t L,       \
                     float *out);                                                                                 \
  void crossEntropy(const float *lp, const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N,      \
                    int64_t V, double smoothing, float *ce);                                                      \
  void crossEntropyGrad(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V,        \
                        double smoothing, int32_t perLength, float *dlp);                                         \
  void softmaxGrad(const float *dy, const float *y, int64_t rows, int64_t C, int32_t logarithmic, float *dx);     \
  /* x [B, H, N, C]: element (b, h, t, c) as dropoutKeep's (sentence b H + h, row t, feature c); H = 1 for an */ \
  /* activation, the heads for attention probabilities. rows [B, N] (H = 1, or null): packed rows, row t of     */ \
  /* sentence b the sentence's row rows[b N + t] (-1: none) */                                                    \
  void dropout(const float *x, const int32_t *lengths, const int32_t *rows, int64_t B, int64_t H, int64_t N,    \
               int64_t C, double rate, int64_t site, uint64_t seed, uint64_t step, float *out);                  \
  }

namespace lmrt {
/// The (seed, step) of the dropout masks of this thread's current training call; set by the trainer
/// around each gradient kernel (TrainDispatch.cpp). Step 0 and the compiled [train] seed otherwise.
void setDropoutContext(uint64_t seed, uint64_t step);
} // namespace lmrt

LMRT_DECLARE_TRAIN_KERNELS(base)
LMRT_DECLARE_TRAIN_KERNELS(avx2)
LMRT_DECLARE_TRAIN_KERNELS(avx512)
