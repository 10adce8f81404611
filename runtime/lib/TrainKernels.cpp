//===- TrainKernels.cpp - Backward and loss kernels the lowered training code calls ===//
//
// The lm backward ops (dialect/LmOps.td, "Training") lowered by lm-to-loops call these
// functions (codegen/LmToLoops/Backward.cpp). Their meaning is the reference executor's
// backward of the same op (runtime/reference/Ops.h). The GEMMs of the losses and of the linear
// backward run on the GEMM generated into the model's library (lm_rt_gemm_fn, passed by the
// lowered call; operands packed here); the attention backward's remaining Eigen products and the
// loops are compiled once per ISA level (baseline, AVX2+FMA, AVX-512) into their own namespace,
// LMRT_ISA; TrainDispatch.cpp picks the best the CPU has at first use, so they run with the host's
// vector units while liblmrt itself stays portable.
//
// Determinism: every parallel loop splits work into pieces of a fixed size that do not depend
// on the thread count, each piece is computed the same way whoever runs it, and reductions
// over pieces are summed in piece order. The same inputs give bit-identical outputs for any
// number of threads.
//
//===----------------------------------------------------------------------===//
#include "runtime/lib/Internal.h"
#include "runtime/lib/TrainKernels.h"
#include "runtime/lib/lmrt.h"
#include "runtime/train/Philox.h"

#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cstring>
#include <new>
#include <utility>

#ifndef LMRT_ISA
#error "compile with -DLMRT_ISA=<namespace>"
#endif

namespace lmrt::LMRT_ISA {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Eigen's vectorized exp/erf/tanh, on buffers aligned to its packets: an unaligned destination would have its
// first elements computed by the scalar libm functions, so results would depend on addresses (and vary from run to
// run). Reductions are written out in a fixed order (Eigen's depend on alignment too).
using Array = Eigen::Map<Eigen::ArrayXf, Eigen::AlignedMax>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

/// sum_{i < n} term(i) (double) in eight running sums (term i into sum i % 8), added in order: vectorizes, and the
/// order depends on n alone.
template <typename F> double sum8(int64_t n, F term) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      s[j] += term(i + j);
  for (; i < n; ++i)
    s[i % 8] += term(i);
  double total = 0;
  for (double v : s)
    total += v;
  return total;
}

/// sum_i double(x[i]), as sum8.
double sumDouble(const float *x, int64_t n) {
  return sum8(n, [=](int64_t i) { return double(x[i]); });
}

/// Runs f(i) for i in [0, n) on the runtime's arena, pieces of whole indices.
template <typename F> void parallelFor(int64_t n, F f) {
  struct Ctx {
    F *f;
  } ctx{&f};
  lm_rt_parallel_for(
      n,
      [](void *c, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          (*static_cast<Ctx *>(c)->f)(i);
      },
      &ctx);
}

int64_t blocks(int64_t n, int64_t size) { return (n + size - 1) / size; }

bool visible(int32_t mask, int64_t i, int64_t j) {
  switch (mask) {
  case LMRT_MASK_CAUSAL: return j <= i;
  case LMRT_MASK_ANTICAUSAL: return j >= i;
  case LMRT_MASK_DIAGONAL: return j != i;
  default: return true;
  }
}

/// The directional mask (lm.mask_fill): row i of sentence b with direction rows[b, i, 0] sees key j when
/// R: j <= i, L: j >= i, S: j != i and bit j of the words after the direction clear; skip: nothing.
bool visibleDirectional(const int32_t *row, int64_t i, int64_t j) {
  switch (row[0]) {
  case 0: return j <= i;
  case 1: return j >= i;
  case 2: return j != i && !((uint32_t(row[1 + j / 32]) >> (j % 32)) & 1u);
  default: return false;
  }
}

/// The loss's denominator: sum_b lengths[b] (per_length) or the number of rows with a target.
int64_t denominator(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int32_t perLength);

/// Number of rows (b, t < lengths[b]) with targets[b, t] >= 0.
int64_t countTargets(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N) {
  int64_t T = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < std::min<int64_t>(lengths[b], N); ++t)
      T += targets[b * N + t] >= 0;
  return T;
}

int64_t denominator(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int32_t perLength) {
  if (!perLength)
    return countTargets(targets, lengths, B, N);
  int64_t T = 0;
  for (int64_t b = 0; b < B; ++b)
    T += std::min<int64_t>(lengths[b], N);
  return T;
}

constexpr int64_t kRowBlock = 64;    ///< rows per piece of the row-wise kernels
constexpr int64_t kGemmRows = 256;   ///< rows (dx) / output features (dW) per GEMM piece of the linear backward
constexpr int64_t kVocabTile = LMRT_LOSS_VOCAB_TILE; ///< vocabulary columns per tile of the loss kernels
constexpr int64_t kVocabSlices = 8;  ///< vocabulary slices of the loss backward, each with its own dh

/// n T's of scratch from the runtime's per-thread workspace cache (lmrt.h, _mlir_memref_to_llvm_aligned_alloc), as
/// the generated kernels' temporaries: a kernel called again with the same shapes takes nothing from the system
/// (a steady-state training step allocates nothing). 64-byte aligned; uninitialized unless a fill value is given.
template <typename T> class Buffer {
public:
  explicit Buffer(int64_t n) : n_(std::max<int64_t>(n, 1)) {
    p_ = static_cast<T *>(_mlir_memref_to_llvm_aligned_alloc(64, sizeof(T) * uint64_t(n_)));
    if (!p_)
      throw std::bad_alloc();
  }
  Buffer(int64_t n, T fill) : Buffer(n) { std::fill(p_, p_ + n_, fill); }
  ~Buffer() { _mlir_memref_to_llvm_free(p_); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  T *data() const { return p_; }
  T &operator[](int64_t i) const { return p_[i]; }

private:
  int64_t n_;
  T *p_;
};
using Scratch = Buffer<float>;
using MatrixMap = Eigen::Map<Matrix, Eigen::AlignedMax>;

/// The rows (b, t < lengths[b]) with targets[b, t] >= 0, in order, into `live` (room for B * N); returns their
/// count.
int64_t liveRows(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t *live) {
  int64_t R = 0;
  for (int64_t r = 0; r < B * N; ++r)
    if (r % N < lengths[r / N] && targets[r] >= 0)
      live[R++] = r;
  return R;
}

/// 16 floats (GCC's generic vectors: one zmm, two ymm or four xmm registers as the ISA of this copy has them).
typedef float V16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

/// One transpose stage: rows i (bit h clear) and i + h swap their off-diagonal h x h blocks (constant masks: a
/// variable one made the AVX2 and baseline copies emulate the shuffle, 2x slower than no transpose).
template <int h, int... c> constexpr std::pair<I16, I16> stageMasks(std::integer_sequence<int, c...>) {
  return {I16{(c & h ? 16 + c - h : c)...}, I16{(c & h ? 16 + c : c + h)...}};
}
template <int h> inline __attribute__((always_inline)) void transposeStage(V16 *rows) {
  const auto [low, high] = stageMasks<h>(std::make_integer_sequence<int, 16>());
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    if (!(i & h)) {
      const V16 top = rows[i], bottom = rows[i + h];
      rows[i] = __builtin_shuffle(top, bottom, low);
      rows[i + h] = __builtin_shuffle(top, bottom, high);
    }
}

/// rows[0..16) := their transpose: four stages, each swapping the off-diagonal h x h blocks of every 2h x 2h block
/// (h = 8, 4, 2, 1) with one two-vector shuffle per row (as codegen/LmToLoops/Gemm.cpp's transpose16).
inline __attribute__((always_inline)) void transpose16(V16 *rows) {
  transposeStage<8>(rows);
  transposeStage<4>(rows);
  transposeStage<2>(rows);
  transposeStage<1>(rows);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/// r[0..8) := their transpose (8 x 8 floats): 24 single-instruction shuffles (unpcklps / unpckhps, shufps, 128-bit
/// lane selects), as codegen's VectorKernel::transposeBlock8.
inline __attribute__((always_inline)) void transpose8(__m256 *r) {
  __m256 t[8], s[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int q = 0; q < 2; ++q) {
    s[4 * q + 0] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    s[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xee);
    s[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    s[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
  }
}
#endif

/// The transpose of a 16 x 16 block: dst[k * ldo + j] = src[j * ld + k] for rows j < valid of src, 0 for the rest.
/// The AVX2 copy transposes the block's four 8 x 8 quarters in ymm registers and swaps the off-diagonal two: GCC
/// lowers transpose16's 16-lane shuffles there to single floats moved through memory (546 vmovss in
/// transposeColumns), and the transposes took 5% of a biLM train step on a Zen 3.
inline __attribute__((always_inline)) void transposeBlock(const float *src, int64_t ld, int64_t valid, float *dst,
                                                          int64_t ldo) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  __m256 q[4][8]; // quarters: rows 0-7 / 8-15 x columns 0-7 / 8-15
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const bool has = j < valid;
    q[j / 8 * 2][j % 8] = has ? _mm256_loadu_ps(src + j * ld) : _mm256_setzero_ps();
    q[j / 8 * 2 + 1][j % 8] = has ? _mm256_loadu_ps(src + j * ld + 8) : _mm256_setzero_ps();
  }
  for (auto &quarter : q)
    transpose8(quarter);
  // Row k < 8 of the transpose: (top-left^T row k, bottom-left^T row k); row 8 + k: the right quarters'.
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) {
    _mm256_storeu_ps(dst + k * ldo, q[k / 8][k % 8]);
    _mm256_storeu_ps(dst + k * ldo + 8, q[k / 8 + 2][k % 8]);
  }
#else
  V16 block[16]; // in registers: every loop over it unrolled
#pragma GCC unroll 16
  for (int64_t j = 0; j < 16; ++j)
    if (j < valid)
      std::memcpy(&block[j], src + j * ld, sizeof(V16));
    else
      block[j] = V16{};
  transpose16(block);
#pragma GCC unroll 16
  for (int64_t k = 0; k < 16; ++k)
    std::memcpy(dst + k * ldo, &block[k], sizeof(V16));
#endif
}

/// The generated GEMM of the model's library (lmrt.h lm_rt_gemm_fn) and the width of its packed column slices.
struct Gemm {
  lm_rt_gemm_fn fn;
  int64_t cols;

  static int64_t panels(int64_t n) { return blocks(n, 64); }
  /// Floats of a packed B with depth K and N columns.
  static int64_t packedSize(int64_t K, int64_t N) { return panels(N) * K * 64; }
  /// Packs panels [p0, p1) of B [K, N] (zero past N): B[k][n] = src[k*ld + n] (byRows) or src[n*ld + k].
  void pack(const float *src, int64_t ld, bool byRows, int64_t K, int64_t N, float *out, int64_t p0, int64_t p1) const {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t g = 0; g < 64 / cols; ++g) {
        float *slice = out + p * K * 64 + g * K * cols;
        const int64_t n0 = p * 64 + g * cols, nn = std::clamp<int64_t>(N - n0, 0, cols);
        if (byRows) {
          if (nn == cols && cols % 16 == 0) { // whole rows in 64-byte copies the compiler inlines (no memcpy call)
            for (int64_t k = 0; k < K; ++k)
              for (int64_t j = 0; j < cols; j += 16)
                std::memcpy(slice + k * cols + j, src + k * ld + n0 + j, sizeof(V16));
            continue;
          }
          for (int64_t k = 0; k < K; ++k) {
            std::memcpy(slice + k * cols, src + k * ld + n0, sizeof(float) * size_t(nn));
            std::fill(slice + k * cols + nn, slice + (k + 1) * cols, 0.0f);
          }
          continue;
        }
        // 16 x 16 blocks (16 words of 16 source rows) transposed in registers and stored whole, the last K mod 16
        // words one by one. Word by word down the slice (writes cols words apart) the loss head's three packs of
        // the 62.5 MB vocabulary a step took 35-41 ms each on a Xeon; blocked so, 33 ms; transposed in registers, 17-19.
        int64_t k0 = 0;
        if (cols % 16 == 0)
          for (; k0 + 16 <= K; k0 += 16)
            for (int64_t j0 = 0; j0 < cols; j0 += 16)
              transposeBlock(src + (n0 + j0) * ld + k0, ld, nn - j0, slice + k0 * cols + j0, cols);
        for (int64_t j = 0; j < cols; ++j)
          for (int64_t k = k0; k < K; ++k)
            slice[k * cols + j] = j < nn ? src[(n0 + j) * ld + k] : 0.0f;
      }
  }
  /// C[M, N] = A[M, K] B (+ C when `accumulate`) over every panel.
  void run(const float *A, int64_t lda, int64_t M, int64_t K, const float *packed, float *C, int64_t ldc, int64_t N,
           bool accumulate) const {
    if (M > 0 && N > 0)
      fn(A, lda, M, K, packed, C, ldc, N, 0, panels(N), accumulate ? 1 : 0);
  }
};

/// out[c][r] = in[r][c] for columns [c0, c1) of the [rows, ld] matrix `in` (out: [*, ldo], ldo >= rows): 16 x 16
/// blocks transposed in registers and stored as whole rows, the edges word by word.
void transposeColumns(const float *in, int64_t rows, int64_t ld, int64_t c0, int64_t c1, float *out, int64_t ldo) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16)
      transposeBlock(in + r0 * ld + c, ld, 16, out + c * ldo + r0, ldo);
    for (; c < c1; ++c)
      for (int64_t j = 0; j < 16; ++j)
        out[c * ldo + r0 + j] = in[(r0 + j) * ld + c];
  }
  for (; r0 < rows; ++r0)
    for (int64_t c = c0; c < c1; ++c)
      out[c * ldo + r0] = in[r0 * ld + c];
}

/// A row stride for a transposed copy of `rows` words a row that the generated GEMM reads as its A: rows rounded up to
/// whole lines, a line more where that is a multiple of 1024 words (4 KB), which would put the 12 rows of a tile in
/// the same L1 sets (as Gemm.h GemmTile::rowsShareL1Sets).
int64_t transposedStride(int64_t rows) {
  const int64_t lines = (rows + 15) / 16 * 16;
  return lines % 1024 == 0 ? lines + 16 : lines;
}

} // namespace

namespace {
/// tokenLoss; with `keep`, every tile's logits (bias added) stay there for tokenLossGradScaled: tile t's R x
/// kVocabTile block (row stride kVocabTile) at t R kVocabTile, R the live rows.
void tokenLossKeeping(const float *h, const float *W, const float *bias, const int32_t *targets,
                      const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, float *ce,
                      float *lse, const Gemm &G, float *keep) {
  const int64_t rows = B * N;
  // Only rows that predict something: the others get ce = lse = 0 (the masked objective has a target on
  // ~15% of its rows). Their hidden states are gathered so that the GEMMs run on them alone.
  std::fill(ce, ce + rows, 0.0f);
  std::fill(lse, lse + rows, 0.0f);
  Buffer<int64_t> live(rows);
  const int64_t R = liveRows(targets, lengths, B, N, live.data());
  Scratch Hl(R * D);
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(Hl.data() + i * D, h + live[i] * D, sizeof(float) * D);
  // The vocabulary slices of tokenLossGrad (fixed, independent of threads), each over all live rows: the
  // weights are read once and every GEMM has all R rows. Per slice and row, over its tiles in order: a
  // running max and sum of exponentials (double), the sum of all logits, and the target's logit; the
  // slices are merged in order.
  const int64_t tiles = blocks(V, kVocabTile);
  const int64_t slices = std::min<int64_t>(kVocabSlices, tiles);
  // Slice s's statistics of row r at [s R + r] of each: mx, sum, total, target (double) and hasTarget.
  Buffer<double> mxAll(slices * R, -INFINITY), sumAll(slices * R, 0.0), totalAll(slices * R, 0.0),
      targetAll(slices * R, 0.0);
  Buffer<char> hasTargetAll(slices * R, 0);
  struct Stats {
    double *mx, *sum, *total, *target;
    char *hasTarget;
  };
  auto slice = [&](int64_t s) {
    return Stats{mxAll.data() + s * R, sumAll.data() + s * R, totalAll.data() + s * R, targetAll.data() + s * R,
                 hasTargetAll.data() + s * R};
  };
  parallelFor(slices, [&](int64_t s) {
    const Stats st = slice(s);
    Scratch scratch(keep ? 0 : R * kVocabTile), exps(kVocabTile); // exps aligned (see Array)
    Scratch Wt(Gemm::packedSize(D, kVocabTile));
    for (int64_t tile = s; tile < tiles; tile += slices) {
      const int64_t v0 = tile * kVocabTile, nv = std::min(kVocabTile, V - v0);
      float *logits = keep ? keep + tile * R * kVocabTile : scratch.data();
      // logits = Hl W[v0 : v0 + nv]^T: B[k = d][n = v] = W[v0 + v][d].
      G.pack(W + v0 * D, D, /*byRows=*/false, D, nv, Wt.data(), 0, Gemm::panels(nv));
      G.run(Hl.data(), D, R, D, Wt.data(), logits, kVocabTile, nv, false);
      if (bias)
        for (int64_t r = 0; r < R; ++r)
          Eigen::Map<Eigen::RowVectorXf>(logits + r * kVocabTile, nv) +=
              Eigen::Map<const Eigen::RowVectorXf>(bias + v0, nv);
      for (int64_t r = 0; r < R; ++r) {
        const float *row = logits + r * kVocabTile;
        const auto x = ConstArray(row, nv);
        const double m = std::max(st.mx[r], double(x.maxCoeff()));
        // Exponentials in float (the logits are float; Eigen's vectorized exp), summed in double.
        const float mf = float(m);
        auto ex = Array(exps.data(), nv);
        ex = (x - mf).exp();
        const double e = sumDouble(exps.data(), nv), tot = sumDouble(row, nv);
        st.sum[r] = st.sum[r] * std::exp(st.mx[r] - m) + e;
        st.mx[r] = m;
        st.total[r] += tot;
        const int32_t y = targets[live[r]];
        if (y >= v0 && y < v0 + nv)
          st.target[r] = row[y - v0], st.hasTarget[r] = 1;
      }
    }
  });
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, sum = 0, total = 0, target = 0;
    for (int64_t s = 0; s < slices; ++s)
      m = std::max(m, slice(s).mx[r]);
    for (int64_t s = 0; s < slices; ++s) {
      const Stats st = slice(s);
      sum += st.sum[r] * std::exp(st.mx[r] - m);
      total += st.total[r];
      if (st.hasTarget[r])
        target = st.target[r];
    }
    const int64_t at = live[r];
    const double l = m + std::log(sum);
    lse[at] = float(l);
    ce[at] = float(-(1 - smoothing) * (target - l) - smoothing / double(V) * (total - double(V) * l));
  }
}

/// tokenLossGrad with the seed d ce = invT given (the n-gram heads: w_j / T of the causal targets). With `kept`
/// (tokenLossKeeping's), each tile's logits are read from there (and overwritten) instead of computed again: the
/// same GEMM on the same rows gave them, so the same bits.
void tokenLossGradScaled(const float *h, const float *W, const float *bias, const int32_t *targets,
                         const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                         double smoothing, double invT, float *dh, float *dW, float *dbias, const Gemm &gemm,
                         float *kept) {
  const int64_t rows = B * N;
  const double off = smoothing / double(V);
  // Rows that predict something; the others have a zero logit gradient.
  Buffer<int64_t> live(rows);
  const int64_t R = liveRows(targets, lengths, B, N, live.data());
  Scratch Hl(R * D);
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(Hl.data() + i * D, h + live[i] * D, sizeof(float) * D);
  // Fixed vocabulary slices (independent of threads), each with its own dh accumulator; summed in order.
  const int64_t tiles = blocks(V, kVocabTile);
  const int64_t slices = std::min<int64_t>(kVocabSlices, tiles);
  // Hl packed once as the B of every tile's dW = G^T Hl: B[k = r][n = d] = Hl[r][d].
  Scratch Hp(Gemm::packedSize(R, D));
  parallelFor(Gemm::panels(D), [&](int64_t p) { gemm.pack(Hl.data(), D, /*byRows=*/true, R, D, Hp.data(), p, p + 1); });
  Scratch dhSlices(slices * R * D); // slice s's dh at [s R D]
  parallelFor(slices, [&](int64_t s) {
    Scratch scratch(kept ? 0 : R * kVocabTile);
    Scratch Wt(kept ? 0 : Gemm::packedSize(D, kVocabTile)), Wr(Gemm::packedSize(kVocabTile, D));
    const int64_t ldGt = transposedStride(R);
    Scratch Gt(kVocabTile * ldGt);
    for (int64_t tile = s; tile < tiles; tile += slices) {
      const int64_t v0 = tile * kVocabTile, nv = std::min(kVocabTile, V - v0);
      const float *Wtile = W + v0 * D;
      float *const G = kept ? kept + tile * R * kVocabTile : scratch.data();
      if (!kept) {
        // The logits again: G = Hl Wtile^T (B[k = d][n = v] = Wtile[v][d]), then the bias as the forward adds it.
        gemm.pack(Wtile, D, /*byRows=*/false, D, nv, Wt.data(), 0, Gemm::panels(nv));
        gemm.run(Hl.data(), D, R, D, Wt.data(), G, kVocabTile, nv, false);
        if (bias)
          for (int64_t i = 0; i < R; ++i)
            Eigen::Map<Eigen::RowVectorXf>(G + i * kVocabTile, nv) +=
                Eigen::Map<const Eigen::RowVectorXf>(bias + v0, nv);
      }
      for (int64_t i = 0; i < R; ++i) {
        const int32_t y = targets[live[i]];
        const double l = lse[live[i]];
        float *row = G + i * kVocabTile;
        const float lf = float(l), offf = float(off), invTf = float(invT);
        auto g = Array(row, nv);
        g = ((g - lf).exp() - offf) * invTf;
        if (y >= v0 && y < v0 + nv)
          row[y - v0] -= float((1 - smoothing) * invT);
      }
      // dW[v0 : v0 + nv] = G^T Hl.
      transposeColumns(G, R, kVocabTile, 0, nv, Gt.data(), ldGt);
      gemm.run(Gt.data(), ldGt, nv, R, Hp.data(), dW + v0 * D, D, D, false);
      if (dbias) {
        Buffer<double> acc(nv, 0.0); // each column summed over the rows in order
        for (int64_t i = 0; i < R; ++i) {
          const float *row = G + i * kVocabTile;
          for (int64_t c = 0; c < nv; ++c)
            acc[c] += row[c];
        }
        for (int64_t c = 0; c < nv; ++c)
          dbias[v0 + c] = float(acc[c]);
      }
      // dh (this slice's) += G Wtile: B[k = v][n = d] = Wtile[v][d].
      gemm.pack(Wtile, D, /*byRows=*/true, nv, D, Wr.data(), 0, Gemm::panels(D));
      gemm.run(G, kVocabTile, R, nv, Wr.data(), dhSlices.data() + s * R * D, D, D, /*accumulate=*/tile != s);
    }
  });
  std::memset(dh, 0, sizeof(float) * rows * D);
  for (int64_t i = 0; i < R; ++i) {
    float *out = dh + live[i] * D;
    for (int64_t s = 0; s < slices; ++s)
      for (int64_t c = 0; c < D; ++c)
        out[c] += dhSlices[(s * R + i) * D + c];
  }
}

/// The buffer tokenLossKeeping keeps the logits of the rows of `targets` with a target in (kVocabTile columns a tile,
/// the last one padded) when it takes at most keepBytes and the call's workspace gives it; else none (null), and
/// the backward computes them again.
class KeptLogits {
public:
  KeptLogits(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V, int64_t keepBytes) {
    const int64_t floats = blocks(V, kVocabTile) * countTargets(targets, lengths, B, N) * kVocabTile;
    if (floats > 0 && floats <= keepBytes / int64_t(sizeof(float)))
      p_ = static_cast<float *>(lmrt::detail::tryAllocateTemporary(64, uint64_t(floats) * sizeof(float)));
  }
  ~KeptLogits() {
    if (p_)
      _mlir_memref_to_llvm_free(p_);
  }
  KeptLogits(const KeptLogits &) = delete;
  KeptLogits &operator=(const KeptLogits &) = delete;
  float *data() const { return p_; }

private:
  float *p_ = nullptr;
};

} // namespace

void tokenLoss(const float *h, const float *W, const float *bias, const int32_t *targets, const int32_t *lengths,
               int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, float *ce, float *lse, lm_rt_gemm_fn gemm,
               int64_t gemmCols) {
  tokenLossKeeping(h, W, bias, targets, lengths, B, N, D, V, smoothing, ce, lse, Gemm{gemm, gemmCols}, nullptr);
}

void tokenLossGrad(const float *h, const float *W, const float *bias, const int32_t *targets, const int32_t *lengths,
                   const float *lse, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, int32_t perLength,
                   float *dh, float *dW, float *dbias, lm_rt_gemm_fn gemm, int64_t gemmCols) {
  const int64_t T = denominator(targets, lengths, B, N, perLength);
  tokenLossGradScaled(h, W, bias, targets, lengths, lse, B, N, D, V, smoothing, T > 0 ? 1.0 / double(T) : 0.0, dh,
                      dW, dbias, Gemm{gemm, gemmCols}, nullptr);
}

void tokenLossAndGrad(const float *h, const float *W, const float *bias, const int32_t *targets,
                      const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                      int32_t perLength, int64_t keepBytes, float *ce, float *lse, float *dh, float *dW, float *dbias,
                      lm_rt_gemm_fn gemm, int64_t gemmCols) {
  const Gemm G{gemm, gemmCols};
  const KeptLogits kept(targets, lengths, B, N, V, keepBytes);
  tokenLossKeeping(h, W, bias, targets, lengths, B, N, D, V, smoothing, ce, lse, G, kept.data());
  const int64_t T = denominator(targets, lengths, B, N, perLength);
  tokenLossGradScaled(h, W, bias, targets, lengths, lse, B, N, D, V, smoothing, T > 0 ? 1.0 / double(T) : 0.0, dh,
                      dW, dbias, G, kept.data());
}

namespace {
/// Head j's targets: y[b, s] = targets[b, s + shift] while s + shift < lengths[b], else -1.
void shiftedTargets(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t shift,
                    int32_t *y) {
  std::fill(y, y + B * N, -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + shift < std::min<int64_t>(lengths[b], N); ++s)
      y[b * N + s] = targets[b * N + s + shift];
}
} // namespace

namespace {
/// One n-gram head's loss over its shifted targets y: total = [total +] weight * ce (first: overwritten).
void ngramHeadLossOn(const float *u, const float *W, const float *bias, const int32_t *y, const int32_t *lengths,
                     int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, double weight, int32_t first,
                     float *total, float *lse, const Gemm &G, float *keep) {
  Scratch ce(B * N);
  tokenLossKeeping(u, W, bias, y, lengths, B, N, D, V, smoothing, ce.data(), lse, G, keep);
  for (int64_t r = 0; r < B * N; ++r)
    total[r] = float((first ? 0.0 : double(total[r])) + weight * double(ce[r]));
}

/// Its gradient seeded with weight / T (T the causal rows of the unshifted targets), written (first) or added into
/// dW and dbias.
void ngramHeadGradOn(const float *u, const float *W, const float *bias, const int32_t *targets, const int32_t *y,
                     const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                     double smoothing, double weight, int32_t first, float *du, float *dW, float *dbias, const Gemm &G,
                     float *kept) {
  const int64_t T = countTargets(targets, lengths, B, N); // the causal rows: the loss's denominator
  const double scale = T > 0 ? weight / double(T) : 0.0;
  if (first) {
    tokenLossGradScaled(u, W, bias, y, lengths, lse, B, N, D, V, smoothing, scale, du, dW, dbias, G, kept);
    return;
  }
  Scratch dWj(V * D), dbj(dbias ? V : 0);
  tokenLossGradScaled(u, W, bias, y, lengths, lse, B, N, D, V, smoothing, scale, du, dWj.data(),
                      dbias ? dbj.data() : nullptr, G, kept);
  for (int64_t i = 0; i < V * D; ++i)
    dW[i] += dWj[i];
  if (dbias)
    for (int64_t v = 0; v < V; ++v)
      dbias[v] += dbj[v];
}
} // namespace

void ngramHeadLoss(const float *u, const float *W, const float *bias, const int32_t *targets, const int32_t *lengths,
                   int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, int64_t shift, double weight,
                   int32_t first, float *total, float *lse, lm_rt_gemm_fn gemm, int64_t gemmCols) {
  Buffer<int32_t> y(B * N);
  shiftedTargets(targets, lengths, B, N, shift, y.data());
  ngramHeadLossOn(u, W, bias, y.data(), lengths, B, N, D, V, smoothing, weight, first, total, lse, Gemm{gemm, gemmCols},
                  nullptr);
}

void ngramHeadGrad(const float *u, const float *W, const float *bias, const int32_t *targets, const int32_t *lengths,
                   const float *lse, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing, int64_t shift,
                   double weight, int32_t first, float *du, float *dW, float *dbias, lm_rt_gemm_fn gemm,
                   int64_t gemmCols) {
  Buffer<int32_t> y(B * N);
  shiftedTargets(targets, lengths, B, N, shift, y.data());
  ngramHeadGradOn(u, W, bias, targets, y.data(), lengths, lse, B, N, D, V, smoothing, weight, first, du, dW, dbias,
                  Gemm{gemm, gemmCols}, nullptr);
}

void ngramHeadLossAndGrad(const float *u, const float *W, const float *bias, const int32_t *targets,
                          const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                          int64_t shift, double weight, int32_t first, int64_t keepBytes, float *total, float *lse,
                          float *du, float *dW, float *dbias, lm_rt_gemm_fn gemm, int64_t gemmCols) {
  const Gemm G{gemm, gemmCols};
  Buffer<int32_t> y(B * N);
  shiftedTargets(targets, lengths, B, N, shift, y.data());
  const KeptLogits kept(y.data(), lengths, B, N, V, keepBytes);
  ngramHeadLossOn(u, W, bias, y.data(), lengths, B, N, D, V, smoothing, weight, first, total, lse, G, kept.data());
  ngramHeadGradOn(u, W, bias, targets, y.data(), lengths, lse, B, N, D, V, smoothing, weight, first, du, dW, dbias, G,
                  kept.data());
}

void linearGrad(const float *dy, const float *x, const float *W, int64_t rows, int64_t in, int64_t out, float *dx,
                float *dW, float *db, lm_rt_gemm_fn gemm, int64_t gemmCols) {
  const Gemm G{gemm, gemmCols};
  const int64_t inPanels = Gemm::panels(in);
  // dx = dy W: B[k = o][n = i] = W[o][i]. dW = dy^T x: A = dy^T, B[k = r][n = i] = x[r][i].
  Scratch Wp(dx ? Gemm::packedSize(out, in) : 0), xp(Gemm::packedSize(rows, in));
  const int64_t ldT = transposedStride(rows);
  Scratch dyT(out * ldT);
  const int64_t wPieces = dx ? inPanels : 0, tPieces = blocks(out, 64);
  parallelFor(wPieces + inPanels + tPieces, [&](int64_t p) {
    if (p < wPieces)
      return G.pack(W, in, /*byRows=*/true, out, in, Wp.data(), p, p + 1);
    p -= wPieces;
    if (p < inPanels)
      return G.pack(x, in, /*byRows=*/true, rows, in, xp.data(), p, p + 1);
    p -= inPanels;
    transposeColumns(dy, rows, out, p * 64, std::min(out, (p + 1) * 64), dyT.data(), ldT);
  });
  // Pieces: dx row blocks, then dW blocks of output features (with their bias sums).
  const int64_t rowBlocks = dx ? blocks(rows, kGemmRows) : 0;
  const int64_t outBlocks = blocks(out, kGemmRows / 2);
  parallelFor(rowBlocks + outBlocks, [&](int64_t p) {
    if (p < rowBlocks) {
      const int64_t r0 = p * kGemmRows, nr = std::min(kGemmRows, rows - r0);
      G.run(dy + r0 * out, out, nr, out, Wp.data(), dx + r0 * in, in, in, false);
      return;
    }
    const int64_t o0 = (p - rowBlocks) * (kGemmRows / 2), no = std::min(kGemmRows / 2, out - o0);
    G.run(dyT.data() + o0 * ldT, ldT, no, rows, xp.data(), dW + o0 * in, in, in, false);
    if (db) {
      // Each feature's sum runs over the rows in order; the features side by side (contiguous, vectorized).
      Buffer<double> acc(no, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const float *row = dy + r * out + o0;
        for (int64_t o = 0; o < no; ++o)
          acc[o] += row[o];
      }
      for (int64_t o = 0; o < no; ++o)
        db[o0 + o] = float(acc[o]);
    }
  });
}

void layerNormGrad(const float *dy, const float *x, const float *gamma, int64_t rows, int64_t D, double eps,
                   float *dx, float *dgamma, float *dbeta) {
  const int64_t nb = blocks(rows, kRowBlock);
  Buffer<double> pg(nb * D, 0.0), pb(nb * D, 0.0);
  parallelFor(nb, [&](int64_t blk) {
    Buffer<double> xhat(D), g(D);
    double *__restrict xh = xhat.data(), *__restrict gr = g.data();
    double *__restrict pgb = pg.data() + blk * D, *__restrict pbb = pb.data() + blk * D;
    for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
      const float *__restrict xr = x + r * D, *__restrict dyr = dy + r * D;
      // The four row sums in eight running sums each (sum8): they vectorize, and their order depends on D alone.
      const double mean = sum8(D, [&](int64_t c) { return double(xr[c]); }) / double(D);
      const double var = sum8(D, [&](int64_t c) { return (xr[c] - mean) * (xr[c] - mean); }) / double(D);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < D; ++c) {
        xh[c] = (xr[c] - mean) * inv;
        gr[c] = double(dyr[c]) * gamma[c];
        pgb[c] += double(dyr[c]) * xh[c];
        pbb[c] += dyr[c];
      }
      const double mg = sum8(D, [&](int64_t c) { return gr[c]; }) / double(D);
      const double mgx = sum8(D, [&](int64_t c) { return gr[c] * xh[c]; }) / double(D);
      for (int64_t c = 0; c < D; ++c)
        dx[r * D + c] = float(inv * (gr[c] - mg - xh[c] * mgx));
    }
  });
  for (int64_t c = 0; c < D; ++c) {
    double sg = 0, sb = 0;
    for (int64_t blk = 0; blk < nb; ++blk)
      sg += pg[blk * D + c], sb += pb[blk * D + c];
    dgamma[c] = float(sg);
    dbeta[c] = float(sb);
  }
}

void activationGrad(const float *dy, const float *x, int64_t n, int32_t kind, float *dx) {
  constexpr double kInvSqrt2 = 0.70710678118654752440, kInvSqrt2Pi = 0.39894228040143267794;
  const float kf = float(std::sqrt(2.0 / 3.14159265358979323846)), c = 0.044715f;
  constexpr int64_t kBlock = 4096; // elements a piece; its results on the stack
  parallelFor(blocks(n, kBlock), [&](int64_t blk) {
    // float math (the forward is float too), vectorized: Eigen's erf, exp and tanh on whole blocks.
    const int64_t i0 = blk * kBlock, len = std::min(n, i0 + kBlock) - i0;
    const auto v = ConstArray(x + i0, len), g = ConstArray(dy + i0, len);
    alignas(64) float out[kBlock]; // computed aligned (see Array), then copied
    auto d = Array(out, len);
    if (kind == LMRT_ACT_RELU) {
      d = g * (v > 0.0f).cast<float>();
    } else if (kind == LMRT_ACT_GELU) {
      d = g * (0.5f * (1.0f + (v * float(kInvSqrt2)).erf()) + v * float(kInvSqrt2Pi) * (-0.5f * v * v).exp());
    } else {
      alignas(64) float thBuf[kBlock];
      auto th = Array(thBuf, len);
      th = (kf * (v + c * v * v * v)).tanh();
      d = g * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kf * (1.0f + 3.0f * c * v * v));
    }
    std::memcpy(dx + i0, out, sizeof(float) * size_t(len));
  });
}

/// out = the sum of `pieces` consecutive partial results of `size` floats each, added in piece order.
void sumPieces(const float *parts, int64_t pieces, int64_t size, int64_t stride, float *out) {
  std::memset(out, 0, sizeof(float) * size);
  for (int64_t piece = 0; piece < pieces; ++piece)
    for (int64_t e = 0; e < size; ++e)
      out[e] += parts[piece * stride + e];
}

int64_t relIndex(int64_t i, int64_t j, int64_t clip) { return std::clamp<int64_t>(j - i, -clip, clip) + clip; }

/// e^x in float for x <= 0 (softmax arguments after the max is subtracted; -inf gives 0): 2^t, t = x log2 e,
/// split into an integer power (exponent bits) and 2^f, f = t - round(t) in [-1/2, 1/2], by its degree-7 Taylor
/// polynomial (relative error 7e-9, below float rounding). A plain loop over it vectorizes (libm's expf does
/// not), which the backward's n * m exponentials need.
inline float expNonPositive(float x) {
  const float t = std::max(x * 1.44269504088896341f, -126.0f); // 2^-126: the smallest normal; below it, 0
  const float fi = std::floor(t + 0.5f), f = t - fi;
  float p = 1.5252733804e-05f;
  p = p * f + 1.5403530393e-04f;
  p = p * f + 1.3333558146e-03f;
  p = p * f + 9.6181291076e-03f;
  p = p * f + 5.5504108665e-02f;
  p = p * f + 2.4022650696e-01f;
  p = p * f + 6.9314718056e-01f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += int32_t(fi) * (1 << 23);
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return t <= -126.0f ? 0.0f : r;
}

/// The backward of lm.attention, one piece per (sentence, head), in blocks of query rows: each block's scores,
/// probabilities and their gradients exist for its rows only ([rows, keys] scratch; the [B, H, N, M] tensor never
/// does), over the keys the block can see (causal: up to its last row; anticausal: from its first), as small GEMMs:
///   S = Q K^T (+ Q rel_k), P = softmax(S * scale) (float, as the forward), dP = dO V^T (+ dO rel_v),
///   D_i = sum_j P_ij dP_ij (= dO_i . O_i), dS = P (dP - D) * scale,
///   dQ = dS K (+ dS rel_k), dK += dS^T Q, dV += P^T dO (+ the relative tables' gradients).
void attentionGrad(const float *dO, const float *q, const float *k, const float *v, const int32_t *lengths,
                   const int32_t *queryLengths, const int32_t *rows, int64_t rowWidth, const float *relK,
                   const float *relV, int64_t clip, int64_t B,
                   int64_t N, int64_t M, int64_t D, int64_t heads, int32_t mask, float scale, float *dq, float *dk,
                   float *dv, float *dRelK, float *dRelV) {
  using Strided = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
  using ConstStrided = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
  constexpr int64_t kRows = 32; // query rows per block (64: causal slower, none within noise)
  const int64_t dh = D / heads, R = 2 * clip + 1;
  const bool rel = relK && relV;
  std::memset(dq, 0, sizeof(float) * B * N * D);
  std::memset(dk, 0, sizeof(float) * B * M * D);
  std::memset(dv, 0, sizeof(float) * B * M * D);
  // Per-piece relative-table gradients, summed in piece order below.
  Scratch relParts(rel ? B * heads * 2 * R * dh : 0, 0.0f);
  // Its dq, dk, dv columns are written by that piece only.
  parallelFor(B * heads, [&](int64_t piece) {
    const int64_t b = piece / heads, hd = piece % heads, off = hd * dh;
    // Query rows of their own lengths when given (a cross-attention's queries are another sequence).
    const int64_t n = std::min<int64_t>((queryLengths ? queryLengths : lengths)[b], N),
                  m = std::min<int64_t>(lengths[b], M);
    auto seen = [&](int64_t i, int64_t j) {
      return mask == LMRT_MASK_DIRECTIONAL ? visibleDirectional(rows + (b * N + i) * rowWidth, i, j)
                                           : visible(mask, i, j);
    };
    const Eigen::OuterStride<> stride(D);
    ConstStrided Qall(q + b * N * D + off, n, dh, stride), Gall(dO + b * N * D + off, n, dh, stride);
    ConstStrided K(k + b * M * D + off, m, dh, stride), V(v + b * M * D + off, m, dh, stride);
    Strided dQall(dq + b * N * D + off, n, dh, stride), dK(dk + b * M * D + off, m, dh, stride),
        dV(dv + b * M * D + off, m, dh, stride);
    float *pk = rel ? relParts.data() + piece * 2 * R * dh : nullptr, *pv = rel ? pk + R * dh : nullptr;
    Scratch sBuf(kRows * m), pBuf(kRows * m), dpBuf(kRows * m);
    for (int64_t i0 = 0; i0 < n; i0 += kRows) {
      const int64_t r = std::min(kRows, n - i0);
      const int64_t j0 = mask == LMRT_MASK_ANTICAUSAL ? std::min(i0, m) : 0;
      const int64_t j1 = mask == LMRT_MASK_CAUSAL ? std::min(i0 + r, m) : m, w = j1 - j0;
      if (w <= 0)
        continue;
      MatrixMap S(sBuf.data(), r, w), P(pBuf.data(), r, w), dP(dpBuf.data(), r, w);
      auto Q = Qall.middleRows(i0, r);
      auto G = Gall.middleRows(i0, r);
      auto Kb = K.middleRows(j0, w);
      auto Vb = V.middleRows(j0, w);
      S.noalias() = Q * Kb.transpose();
      if (rel)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < w; ++j) {
            const float *rk = relK + relIndex(i0 + i, j0 + j, clip) * dh;
            float acc = 0;
            for (int64_t c = 0; c < dh; ++c)
              acc += Q(i, c) * rk[c];
            S(i, j) += acc;
          }
      // Probabilities: max over the visible keys, e^(s - max) (0 where hidden), normalized.
      for (int64_t i = 0; i < r; ++i) {
        float *s = &S(i, 0), *p = &P(i, 0);
        float mx = -INFINITY;
        for (int64_t j = 0; j < w; ++j) {
          s[j] = seen(i0 + i, j0 + j) ? s[j] * scale : -INFINITY;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) { // a row that sees no key: no probability, no gradient
          std::fill(p, p + w, 0.0f);
          continue;
        }
        float sum = 0;
        for (int64_t j = 0; j < w; ++j) {
          p[j] = expNonPositive(s[j] - mx);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < w; ++j)
          p[j] *= inv;
      }
      dP.noalias() = G * Vb.transpose();
      if (rel)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < w; ++j) {
            if (P(i, j) == 0.0f)
              continue;
            const float *rv = relV + relIndex(i0 + i, j0 + j, clip) * dh;
            float dot = 0;
            for (int64_t c = 0; c < dh; ++c)
              dot += G(i, c) * rv[c];
            dP(i, j) += dot;
          }
      // dS = P (dP - D) * scale, written over S.
      for (int64_t i = 0; i < r; ++i) {
        const float *p = &P(i, 0), *g = &dP(i, 0);
        float acc = 0;
        for (int64_t j = 0; j < w; ++j)
          acc += p[j] * g[j];
        float *ds = &S(i, 0);
        for (int64_t j = 0; j < w; ++j)
          ds[j] = p[j] * (g[j] - acc) * scale;
      }
      auto dQ = dQall.middleRows(i0, r);
      dQ.noalias() = S * Kb;
      dK.middleRows(j0, w).noalias() += S.transpose() * Q;
      dV.middleRows(j0, w).noalias() += P.transpose() * G;
      if (rel)
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < w; ++j) {
            if (P(i, j) == 0.0f)
              continue;
            const int64_t ri = relIndex(i0 + i, j0 + j, clip);
            for (int64_t c = 0; c < dh; ++c) {
              dQ(i, c) += S(i, j) * relK[ri * dh + c];
              pk[ri * dh + c] += S(i, j) * Q(i, c);
              pv[ri * dh + c] += P(i, j) * G(i, c);
            }
          }
    }
  });
  if (rel) {
    sumPieces(relParts.data(), B * heads, R * dh, 2 * R * dh, dRelK);
    sumPieces(relParts.data() + R * dh, B * heads, R * dh, 2 * R * dh, dRelV);
  }
}

void relativeScoresGrad(const float *dOut, const float *q, const float *rel, int64_t BH, int64_t N, int64_t M,
                        int64_t dh, int64_t clip, float *dq, float *dRel) {
  const int64_t R = 2 * clip + 1;
  Scratch parts(BH * R * dh, 0.0f);
  parallelFor(BH, [&](int64_t piece) {
    float *part = parts.data() + piece * R * dh;
    for (int64_t i = 0; i < N; ++i) {
      const float *g = dOut + (piece * N + i) * M, *qi = q + (piece * N + i) * dh;
      float *dqi = dq + (piece * N + i) * dh;
      std::fill(dqi, dqi + dh, 0.0f);
      for (int64_t j = 0; j < M; ++j) {
        if (g[j] == 0.0f)
          continue;
        const int64_t r = relIndex(i, j, clip);
        for (int64_t c = 0; c < dh; ++c) {
          dqi[c] += g[j] * rel[r * dh + c];
          part[r * dh + c] += g[j] * qi[c];
        }
      }
    }
  });
  sumPieces(parts.data(), BH, R * dh, R * dh, dRel);
}

void relativeValuesGrad(const float *dOut, const float *p, const float *rel, int64_t BH, int64_t N, int64_t M,
                        int64_t dh, int64_t clip, float *dp, float *dRel) {
  const int64_t R = 2 * clip + 1;
  Scratch parts(BH * R * dh, 0.0f);
  parallelFor(BH, [&](int64_t piece) {
    float *part = parts.data() + piece * R * dh;
    for (int64_t i = 0; i < N; ++i) {
      const float *g = dOut + (piece * N + i) * dh, *pi = p + (piece * N + i) * M;
      float *dpi = dp + (piece * N + i) * M;
      for (int64_t j = 0; j < M; ++j) {
        const int64_t r = relIndex(i, j, clip);
        float acc = 0;
        for (int64_t c = 0; c < dh; ++c)
          acc += g[c] * rel[r * dh + c];
        dpi[j] = acc;
        if (pi[j] != 0.0f)
          for (int64_t c = 0; c < dh; ++c)
            part[r * dh + c] += pi[j] * g[c];
      }
    }
  });
  sumPieces(parts.data(), BH, R * dh, R * dh, dRel);
}

void embedGrad(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N, int64_t D,
               int64_t V, float *out) {
  std::memset(out, 0, sizeof(float) * V * D);
  embedGradAdd(dy, ids, lengths, B, N, D, V, out);
}

void embedGradAdd(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N, int64_t D,
                  int64_t V, float *out) {
  // Each reached row's scatter sum starts from 0 and adds its rows of dy in order (float, sentences and positions
  // in order), then lands on out's row once; rows no id reaches are untouched. The rows of one id are chained
  // (first[v], next[r]) in a pass over the ids, so no [V, D] table is zeroed.
  Buffer<int64_t> first(V, -1), last(V), next(B * N);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < std::min<int64_t>(lengths[b], N); ++t) {
      const int32_t id = ids[b * N + t];
      if (id < 0 || id >= V)
        continue;
      const int64_t r = b * N + t;
      next[r] = -1;
      (first[id] < 0 ? first[id] : next[last[id]]) = r;
      last[id] = r;
    }
  Scratch sum(D);
  for (int64_t v = 0; v < V; ++v) {
    if (first[v] < 0)
      continue;
    std::fill(sum.data(), sum.data() + D, 0.0f);
    for (int64_t r = first[v]; r >= 0; r = next[r]) {
      const float *g = dy + r * D;
      for (int64_t c = 0; c < D; ++c)
        sum[c] += g[c];
    }
    float *row = out + v * D;
    for (int64_t c = 0; c < D; ++c)
      row[c] += sum[c];
  }
}

void positionsGrad(const float *dy, const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t L, float *out) {
  std::memset(out, 0, sizeof(float) * L * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < std::min<int64_t>({int64_t(lengths[b]), N, L}); ++t)
      for (int64_t c = 0; c < D; ++c)
        out[t * D + c] += dy[(b * N + t) * D + c];
}

void crossEntropy(const float *lp, const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V,
                  double smoothing, float *ce) {
  for (int64_t r = 0; r < B * N; ++r) {
    const int32_t y = targets[r];
    if (r % N >= lengths[r / N] || y < 0 || y >= V) {
      ce[r] = 0.0f;
      continue;
    }
    double total = 0;
    for (int64_t c = 0; c < V; ++c)
      total += lp[r * V + c];
    ce[r] = float(-(1 - smoothing) * lp[r * V + y] - smoothing / double(V) * total);
  }
}

void crossEntropyGrad(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V,
                      double smoothing, int32_t perLength, float *dlp) {
  const int64_t T = denominator(targets, lengths, B, N, perLength);
  const double invT = T > 0 ? 1.0 / double(T) : 0.0;
  for (int64_t r = 0; r < B * N; ++r) {
    const int32_t y = targets[r];
    const bool live = r % N < lengths[r / N] && y >= 0 && y < V;
    for (int64_t c = 0; c < V; ++c)
      dlp[r * V + c] = live ? float(-((c == y ? 1 - smoothing : 0.0) + smoothing / double(V)) * invT) : 0.0f;
  }
}

void softmaxGrad(const float *dy, const float *y, int64_t rows, int64_t C, int32_t logarithmic, float *dx) {
  parallelFor(blocks(rows, kRowBlock), [&](int64_t blk) {
    for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
      const float *g = dy + r * C, *o = y + r * C;
      double acc = 0;
      if (logarithmic) { // y = log p: dx = dy - p sum(dy)
        for (int64_t c = 0; c < C; ++c)
          acc += g[c];
        for (int64_t c = 0; c < C; ++c)
          dx[r * C + c] = float(g[c] - std::exp(double(o[c])) * acc);
      } else { // y = p: dx = p (dy - sum(dy p))
        for (int64_t c = 0; c < C; ++c)
          acc += double(g[c]) * o[c];
        for (int64_t c = 0; c < C; ++c)
          dx[r * C + c] = float(o[c] * (g[c] - acc));
      }
    }
  });
}

void dropout(const float *x, const int32_t *lengths, const int32_t *rows, int64_t B, int64_t H, int64_t N,
             int64_t C, double rate, int64_t site, uint64_t seed, uint64_t step, float *out) {
  const float scale = float(1.0 / (1.0 - rate));
  parallelFor(B * H, [&](int64_t bh) {
    const int64_t b = bh / H;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t at = (bh * N + t) * C + c;
        const int64_t row = rows ? rows[b * N + t] : t;
        const bool keep = row >= 0 && row < lengths[b] &&
                          lmcc::train::dropoutKeep(seed, step, uint32_t(site), uint32_t(bh), uint32_t(row),
                                                   uint32_t(c), rate);
        out[at] = keep ? x[at] * scale : 0.0f;
      }
  });
}

} // namespace lmrt::LMRT_ISA
