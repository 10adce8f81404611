//===- OpsBackwardTest.cpp - Reference op backwards vs finite differences -===//
//
// Every backward of runtime/reference/Ops.h is checked against central finite
// differences of a double-precision forward written here (plain loops over the
// same padded layout, independent of Ops.cpp): for a random upstream gradient G,
// phi(theta) = sum G * f(theta) in double, d phi / d theta_k by central
// differences (step 1e-6, truncation and rounding errors ~1e-10), against the
// float backward at the same (float-representable) point. Odd sizes, ragged
// sentences with padding rows, every mask kind, relative positions. Padding rows
// of every activation gradient must be exactly zero.
//
//===----------------------------------------------------------------------===//
#include "runtime/reference/Ops.h"
#include "tests/unit/NaiveModel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace lmcc;
using namespace lmcc::reference;

namespace {

using Vec = std::vector<double>;
constexpr double kInfD = std::numeric_limits<double>::infinity();

/// Float backward vs double finite differences: max |analytic - fd| / max |fd| per tensor.
/// Float rounding (2^-24 ~ 6e-8 per operation, sums of ~10 terms) gives up to ~3e-7 here
/// (measured worst: 2.3e-7, attention dRelK); 2e-6 leaves a margin of ~10 and still fails
/// any wrong term, which shows up at the size of the gradient itself.
constexpr double kTolerance = 2e-6;

//===----------------------------------------------------------------------===//
// A double batch with the layout of Batch
//===----------------------------------------------------------------------===//

struct DB {
  int64_t B = 0, H = 1, N = 0, C = 0;
  std::vector<int64_t> lengths;
  Vec data;
  double &at(int64_t b, int64_t h, int64_t t, int64_t c) { return data[((b * H + h) * N + t) * C + c]; }
  double at(int64_t b, int64_t h, int64_t t, int64_t c) const { return data[((b * H + h) * N + t) * C + c]; }
};

DB zerosD(const std::vector<int64_t> &lengths, int64_t H, int64_t N, int64_t C) {
  DB d{static_cast<int64_t>(lengths.size()), H, N, C, lengths, {}};
  d.data.assign(d.B * H * N * C, 0.0);
  return d;
}

DB toD(const Batch &x) {
  DB d{x.B, x.H, x.N, x.C, x.lengths, Vec(x.data.begin(), x.data.end())};
  return d;
}

Vec toVec(const Matrix &m) {
  Vec v(m.size());
  for (int64_t r = 0; r < m.rows(); ++r)
    for (int64_t c = 0; c < m.cols(); ++c)
      v[r * m.cols() + c] = m(r, c);
  return v;
}

Vec toVec(const RowVector &m) { return Vec(m.data(), m.data() + m.size()); }

/// sum G * y over every entry (G is zero on padding rows).
double dot(const Batch &G, const DB &y) {
  double s = 0;
  for (size_t i = 0; i < y.data.size(); ++i)
    if (G.data[i] != 0) // skips -inf * 0 on masked entries
      s += G.data[i] * y.data[i];
  return s;
}

//===----------------------------------------------------------------------===//
// Random inputs
//===----------------------------------------------------------------------===//

Batch randomBatch(const std::vector<int64_t> &lengths, int64_t H, int64_t N, int64_t C, uint32_t seed,
                  float stdev = 1.0f, float awayFromZero = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stdev);
  Batch x = Batch::zeros(lengths, H, N, C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < lengths[b]; ++t)
        for (int64_t c = 0; c < C; ++c) {
          float v = normal(rng);
          if (std::fabs(v) < awayFromZero)
            v = v < 0 ? v - awayFromZero : v + awayFromZero;
          x.at(b, h, t, c) = v;
        }
  return x;
}

Matrix randomMatrix(int64_t rows, int64_t cols, uint32_t seed, float stdev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stdev);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i)
    m.data()[i] = normal(rng);
  return m;
}

RowVector randomRow(int64_t n, uint32_t seed, float stdev = 1.0f, float mean = 0.0f) {
  return randomMatrix(1, n, seed, stdev, mean).row(0);
}

//===----------------------------------------------------------------------===//
// Finite differences and comparison
//===----------------------------------------------------------------------===//

/// Central differences of phi() with respect to every element of theta (phi reads theta).
Vec numericGradient(const std::function<double()> &phi, Vec &theta, double step = 1e-6) {
  Vec g(theta.size());
  for (size_t k = 0; k < theta.size(); ++k) {
    const double saved = theta[k];
    if (!std::isfinite(saved)) { // -inf scores: no derivative
      g[k] = 0;
      continue;
    }
    theta[k] = saved + step;
    const double plus = phi();
    theta[k] = saved - step;
    const double minus = phi();
    theta[k] = saved;
    g[k] = (plus - minus) / (2 * step);
  }
  return g;
}

double worstSeen = 0;
std::string worstWhat;

/// Expects analytic ~ fd relative to max |fd|; records and prints the error.
void expectClose(const std::string &what, const Vec &fd, const float *analytic, size_t n) {
  ASSERT_EQ(fd.size(), n) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < n; ++i)
    scale = std::max(scale, std::fabs(fd[i]));
  ASSERT_GT(scale, 1e-8) << what << ": the finite-difference gradient is zero; the test checks nothing";
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(analytic[i])) << what << " [" << i << "]";
    err = std::max(err, std::fabs(analytic[i] - fd[i]));
  }
  const double rel = err / scale;
  std::printf("  FD %-40s max|grad| %.3g  max rel err %.2e\n", what.c_str(), scale, rel);
  if (rel > worstSeen) {
    worstSeen = rel;
    worstWhat = what;
  }
  EXPECT_LE(rel, kTolerance) << what;
}

void expectClose(const std::string &what, const Vec &fd, const Batch &analytic) {
  expectClose(what, fd, analytic.data.data(), analytic.data.size());
}
void expectClose(const std::string &what, const Vec &fd, const Matrix &analytic) {
  Vec a = toVec(analytic);
  std::vector<float> f(a.begin(), a.end());
  expectClose(what, fd, f.data(), f.size());
}
void expectClose(const std::string &what, const Vec &fd, const RowVector &analytic) {
  expectClose(what, fd, analytic.data(), analytic.size());
}

/// Padding rows (t >= lengths[b]) of a gradient batch are exactly zero.
void expectZeroPadding(const std::string &what, const Batch &g) {
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t t = g.lengths[b]; t < g.N; ++t)
        for (int64_t c = 0; c < g.C; ++c)
          ASSERT_EQ(g.at(b, h, t, c), 0.0f) << what << ": padding row (" << b << ", " << h << ", " << t << ")";
}

//===----------------------------------------------------------------------===//
// Double-precision forwards (plain loops, SEMANTICS.md)
//===----------------------------------------------------------------------===//

DB linearD(const DB &x, const Vec &W, int64_t out, const Vec *bias) {
  DB y = zerosD(x.lengths, x.H, x.N, out);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t)
        for (int64_t o = 0; o < out; ++o) {
          double s = bias ? (*bias)[o] : 0.0;
          for (int64_t c = 0; c < x.C; ++c)
            s += x.at(b, h, t, c) * W[o * x.C + c];
          y.at(b, h, t, o) = s;
        }
  return y;
}

DB layerNormD(const DB &x, const Vec &gamma, const Vec &beta, double eps) {
  DB y = x;
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t) {
        double mean = 0, var = 0;
        for (int64_t c = 0; c < x.C; ++c)
          mean += x.at(b, h, t, c) / x.C;
        for (int64_t c = 0; c < x.C; ++c)
          var += (x.at(b, h, t, c) - mean) * (x.at(b, h, t, c) - mean) / x.C;
        for (int64_t c = 0; c < x.C; ++c)
          y.at(b, h, t, c) = (x.at(b, h, t, c) - mean) / std::sqrt(var + eps) * gamma[c] + beta[c];
      }
  return y;
}

template <typename F> DB mapD(DB x, F f) {
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t)
        for (int64_t c = 0; c < x.C; ++c)
          x.at(b, h, t, c) = f(x.at(b, h, t, c));
  return x;
}

double geluD(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }
double geluTanhD(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) * (v + 0.044715 * v * v * v)));
}

DB softmaxD(const DB &x, bool log) {
  DB y = x;
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t) {
        double m = -kInfD, sum = 0;
        for (int64_t c = 0; c < x.C; ++c)
          m = std::max(m, x.at(b, h, t, c));
        for (int64_t c = 0; c < x.C; ++c) {
          if (m == -kInfD) {
            y.at(b, h, t, c) = 0;
            continue;
          }
          sum += std::exp(x.at(b, h, t, c) - m);
        }
        for (int64_t c = 0; c < x.C && m != -kInfD; ++c)
          y.at(b, h, t, c) = log ? x.at(b, h, t, c) - m - std::log(sum) : std::exp(x.at(b, h, t, c) - m) / sum;
      }
  return y;
}

DB matmulD(const DB &l, const DB &r, bool transposeRhs) {
  DB y = zerosD(l.lengths, l.H, l.N, transposeRhs ? r.N : r.C);
  for (int64_t b = 0; b < l.B; ++b)
    for (int64_t h = 0; h < l.H; ++h)
      for (int64_t i = 0; i < l.lengths[b]; ++i) {
        if (transposeRhs) {
          for (int64_t j = 0; j < r.lengths[b]; ++j)
            for (int64_t c = 0; c < l.C; ++c)
              y.at(b, h, i, j) += l.at(b, h, i, c) * r.at(b, h, j, c);
        } else {
          for (int64_t k = 0; k < r.lengths[b]; ++k)
            for (int64_t c = 0; c < r.C; ++c)
              y.at(b, h, i, c) += l.at(b, h, i, k) * r.at(b, h, k, c);
        }
      }
  return y;
}

int64_t relIndex(int64_t i, int64_t j, int64_t k) { return std::clamp<int64_t>(j - i, -k, k) + k; }

DB relativeScoresD(const DB &q, const DB &keys, const Vec &rel, int64_t k) {
  DB y = zerosD(q.lengths, q.H, q.N, keys.N);
  for (int64_t b = 0; b < q.B; ++b)
    for (int64_t h = 0; h < q.H; ++h)
      for (int64_t i = 0; i < q.lengths[b]; ++i)
        for (int64_t j = 0; j < keys.lengths[b]; ++j)
          for (int64_t c = 0; c < q.C; ++c)
            y.at(b, h, i, j) += q.at(b, h, i, c) * rel[relIndex(i, j, k) * q.C + c];
  return y;
}

DB relativeValuesD(const DB &p, const Vec &rel, int64_t k, int64_t dh) {
  DB y = zerosD(p.lengths, p.H, p.N, dh);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.lengths[b]; ++i)
        for (int64_t j = 0; j < p.lengths[b]; ++j)
          for (int64_t c = 0; c < dh; ++c)
            y.at(b, h, i, c) += p.at(b, h, i, j) * rel[relIndex(i, j, k) * dh + c];
  return y;
}

/// Naive attention on [B, 1, N, D] inputs, heads split by feature ranges.
DB attentionD(const DB &Q, const DB &K, const DB &V, int64_t heads, MaskKind mask, double scale, const Vec *relK,
              const Vec *relV, int64_t k) {
  const int64_t dh = Q.C / heads;
  DB y = zerosD(Q.lengths, 1, Q.N, Q.C);
  for (int64_t b = 0; b < Q.B; ++b) {
    const int64_t n = Q.lengths[b];
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        Vec s(n, -kInfD);
        double m = -kInfD;
        for (int64_t j = 0; j < n; ++j) {
          if (!naive::visible(mask, i, j))
            continue;
          double dotv = 0;
          for (int64_t c = 0; c < dh; ++c)
            dotv += Q.at(b, 0, i, h * dh + c) *
                    (K.at(b, 0, j, h * dh + c) + (relK ? (*relK)[relIndex(i, j, k) * dh + c] : 0.0));
          s[j] = dotv * scale;
          m = std::max(m, s[j]);
        }
        if (m == -kInfD)
          continue;
        double sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += s[j] == -kInfD ? 0.0 : std::exp(s[j] - m);
        for (int64_t j = 0; j < n; ++j) {
          if (s[j] == -kInfD)
            continue;
          double p = std::exp(s[j] - m) / sum;
          for (int64_t c = 0; c < dh; ++c)
            y.at(b, 0, i, h * dh + c) +=
                p * (V.at(b, 0, j, h * dh + c) + (relV ? (*relV)[relIndex(i, j, k) * dh + c] : 0.0));
        }
      }
  }
  return y;
}

const std::vector<int64_t> kLengths = {5, 1, 3}; ///< ragged, one single-token sentence
constexpr int64_t kN = 6;                        ///< padded past the longest sentence

//===----------------------------------------------------------------------===//
// Dense layers, norms, elementwise
//===----------------------------------------------------------------------===//

TEST(OpsBackward, Linear) {
  for (int64_t H : {1, 2})
    for (bool hasBias : {true, false}) {
      const int64_t in = 7, out = 5;
      Batch x = randomBatch(kLengths, H, kN, in, 1);
      Matrix W = randomMatrix(out, in, 2, 0.5f);
      RowVector bias = randomRow(out, 3);
      Batch G = randomBatch(kLengths, H, kN, out, 4);
      LinearGrad g = linearBackward(G, x, W, hasBias);
      expectZeroPadding("linear dx", g.dx);
      DB xd = toD(x);
      Vec Wd = toVec(W), bd = toVec(bias);
      auto phi = [&] { return dot(G, linearD(xd, Wd, out, hasBias ? &bd : nullptr)); };
      const std::string tag = "linear H=" + std::to_string(H) + (hasBias ? " bias" : "") + " ";
      expectClose(tag + "dx", numericGradient(phi, xd.data), g.dx);
      expectClose(tag + "dW", numericGradient(phi, Wd), g.dWeight);
      if (hasBias)
        expectClose(tag + "dBias", numericGradient(phi, bd), g.dBias);
      else
        EXPECT_EQ(g.dBias.size(), 0);
    }
}

TEST(OpsBackward, LayerNorm) {
  const int64_t C = 7;
  const double eps = 1e-5;
  Batch x = randomBatch(kLengths, 2, kN, C, 5, 2.0f);
  RowVector gamma = randomRow(C, 6, 0.3f, 1.0f), beta = randomRow(C, 7, 0.1f);
  Batch G = randomBatch(kLengths, 2, kN, C, 8);
  LayerNormGrad g = layerNormBackward(G, x, gamma, eps);
  expectZeroPadding("layer_norm dx", g.dx);
  DB xd = toD(x);
  Vec gd = toVec(gamma), bd = toVec(beta);
  auto phi = [&] { return dot(G, layerNormD(xd, gd, bd, eps)); };
  expectClose("layer_norm dx", numericGradient(phi, xd.data), g.dx);
  expectClose("layer_norm dGamma", numericGradient(phi, gd), g.dGamma);
  expectClose("layer_norm dBeta", numericGradient(phi, bd), g.dBeta);
}

TEST(OpsBackward, Activations) {
  Batch x = randomBatch(kLengths, 1, kN, 7, 9, 1.5f, /*awayFromZero=*/0.01f);
  Batch G = randomBatch(kLengths, 1, kN, 7, 10);
  DB xd = toD(x);
  struct Case {
    Activation act;
    const char *name;
    double (*f)(double);
  };
  for (Case c : {Case{Activation::Gelu, "gelu", geluD}, Case{Activation::GeluTanh, "gelu_tanh", geluTanhD},
                 Case{Activation::Relu, "relu", [](double v) { return std::max(v, 0.0); }}}) {
    Batch dx = activationBackward(G, x, c.act);
    expectZeroPadding(c.name, dx);
    auto phi = [&] { return dot(G, mapD(xd, c.f)); };
    expectClose(std::string(c.name) + " dx", numericGradient(phi, xd.data), dx);
  }
  // Relu at exactly 0 passes nothing (torch's convention).
  Batch zero = Batch::zeros({1}, 1, 1, 1), one = Batch::zeros({1}, 1, 1, 1);
  one.at(0, 0, 0, 0) = 1.0f;
  EXPECT_EQ(reluBackward(one, zero).at(0, 0, 0, 0), 0.0f);
}

TEST(OpsBackward, ScaleAndInterpolate) {
  Batch x = randomBatch(kLengths, 1, kN, 4, 11), G = randomBatch(kLengths, 1, kN, 4, 12);
  DB xd = toD(x);
  auto phiScale = [&] { return dot(G, mapD(xd, [](double v) { return v * 0.37; })); };
  expectClose("scale dx", numericGradient(phiScale, xd.data), scaleBackward(G, 0.37f));

  Batch a = randomBatch(kLengths, 1, kN, 4, 13), b = randomBatch(kLengths, 1, kN, 4, 14);
  DB ad = toD(a), bd = toD(b);
  const double lambda = 0.3;
  auto phi = [&] {
    DB y = ad;
    for (size_t i = 0; i < y.data.size(); ++i)
      y.data[i] = std::log((1 - lambda) * std::exp(ad.data[i]) + lambda * std::exp(bd.data[i]));
    return dot(G, y);
  };
  InterpolateGrad g = interpolateBackward(G, a, b, lambda);
  expectClose("interpolate da", numericGradient(phi, ad.data), g.da);
  expectClose("interpolate db", numericGradient(phi, bd.data), g.db);
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

TEST(OpsBackward, EmbedAndPositions) {
  const int64_t V = 11, D = 5, L = 7;
  TokenBatch ids = TokenBatch::pack({{3, 7, 3, 0, 10}, {7}, {1, 3, 3}}); // repeated ids accumulate
  Matrix table = randomMatrix(V, D, 15), pos = randomMatrix(L, D, 16);
  Batch G = randomBatch(ids.lengths, 1, ids.N, D, 17);
  Vec td = toVec(table), pd = toVec(pos);
  auto phiEmbed = [&] {
    DB y = zerosD(ids.lengths, 1, ids.N, D);
    for (int64_t b = 0; b < ids.B; ++b)
      for (int64_t t = 0; t < ids.lengths[b]; ++t)
        for (int64_t c = 0; c < D; ++c)
          y.at(b, 0, t, c) = td[ids.at(b, t) * D + c];
    return dot(G, y);
  };
  Matrix dTable = embedBackward(G, ids, V);
  expectClose("embed dTable", numericGradient(phiEmbed, td), dTable);
  EXPECT_EQ(dTable.row(2).norm(), 0.0f) << "id 2 is never used";
  auto phiPos = [&] {
    DB y = zerosD(ids.lengths, 1, ids.N, D);
    for (int64_t b = 0; b < ids.B; ++b)
      for (int64_t t = 0; t < ids.lengths[b]; ++t)
        for (int64_t c = 0; c < D; ++c)
          y.at(b, 0, t, c) = pd[t * D + c];
    return dot(G, y);
  };
  Matrix dPos = positionsBackward(G, L);
  expectClose("positions dTable", numericGradient(phiPos, pd), dPos);
  EXPECT_EQ(dPos.bottomRows(L - ids.N).norm(), 0.0f) << "rows past the longest sentence";
  EXPECT_THROW(embedBackward(G, ids, 5), std::invalid_argument) << "id 10 outside a 5-row table";
}

//===----------------------------------------------------------------------===//
// Attention pieces
//===----------------------------------------------------------------------===//

TEST(OpsBackward, SplitAndMergeHeadsAreAdjoint) {
  Batch x = randomBatch(kLengths, 1, kN, 9, 18), G = randomBatch(kLengths, 3, kN, 3, 19);
  // <split(x), G> == <x, splitBackward(G)> and splitBackward == merge (a permutation).
  DB split = toD(splitHeads(x, 3));
  Batch back = splitHeadsBackward(G);
  EXPECT_NEAR(dot(G, split), dot(back, toD(x)), 1e-5);
  EXPECT_EQ(back.data, mergeHeads(G).data);
  EXPECT_EQ(mergeHeadsBackward(back, 3).data, G.data);
}

TEST(OpsBackward, Matmul) {
  const int64_t K = 4;
  // transposeRhs: [N, K] x [M, K]^T (scores)
  Batch l = randomBatch(kLengths, 2, kN, K, 20), r = randomBatch(kLengths, 2, kN, K, 21);
  Batch G = randomBatch(kLengths, 2, kN, kN, 22);
  for (int64_t b = 0; b < G.B; ++b) // upstream gradient lives on valid keys only
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < kLengths[b]; ++t)
        for (int64_t j = kLengths[b]; j < kN; ++j)
          G.at(b, h, t, j) = 0;
  MatmulGrad g = matmulBackward(G, l, r, true);
  expectZeroPadding("matmul^T dLhs", g.dLhs);
  expectZeroPadding("matmul^T dRhs", g.dRhs);
  DB ld = toD(l), rd = toD(r);
  auto phi = [&] { return dot(G, matmulD(ld, rd, true)); };
  expectClose("matmul^T dLhs", numericGradient(phi, ld.data), g.dLhs);
  expectClose("matmul^T dRhs", numericGradient(phi, rd.data), g.dRhs);

  // plain: probabilities [N, M] x values [M, C]; key-padding columns of lhs get 0
  Batch p = randomBatch(kLengths, 2, kN, kN, 23), v = randomBatch(kLengths, 2, kN, 5, 24);
  Batch G2 = randomBatch(kLengths, 2, kN, 5, 25);
  MatmulGrad g2 = matmulBackward(G2, p, v, false);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < kLengths[b]; ++t)
      for (int64_t j = kLengths[b]; j < kN; ++j)
        EXPECT_EQ(g2.dLhs.at(b, 1, t, j), 0.0f) << "key padding column";
  DB pd = toD(p), vd = toD(v);
  auto phi2 = [&] { return dot(G2, matmulD(pd, vd, false)); };
  Vec fdP = numericGradient(phi2, pd.data);
  expectClose("matmul dLhs", fdP, g2.dLhs);
  expectClose("matmul dRhs", numericGradient(phi2, vd.data), g2.dRhs);
}

TEST(OpsBackward, MaskFillPassesVisibleEntriesOnly) {
  Batch G = randomBatch(kLengths, 2, kN, kN, 26);
  for (MaskKind kind : {MaskKind::None, MaskKind::Causal, MaskKind::Anticausal, MaskKind::Diagonal}) {
    Batch d = maskFillBackward(G, kind);
    expectZeroPadding("mask_fill", d);
    for (int64_t b = 0; b < G.B; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < kLengths[b]; ++i)
          for (int64_t j = 0; j < kN; ++j)
            EXPECT_EQ(d.at(b, h, i, j), keyVisible(kind, i, j, kLengths[b]) ? G.at(b, h, i, j) : 0.0f)
                << toString(kind) << " (" << b << ", " << i << ", " << j << ")";
  }
}

TEST(OpsBackward, SoftmaxAndLogSoftmax) {
  // Scores with masked (-inf) entries and a fully masked row (sentence 1 under the diagonal mask).
  Batch x = maskFill(randomBatch(kLengths, 2, kN, kN, 27, 2.0f), MaskKind::Diagonal);
  Batch G = randomBatch(kLengths, 2, kN, kN, 28);
  Batch p = softmax(x);
  Batch dx = softmaxBackward(G, p);
  expectZeroPadding("softmax", dx);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < kN; ++j)
      EXPECT_EQ(dx.at(1, h, 0, j), 0.0f) << "fully masked row";
  DB xd = toD(x);
  auto phi = [&] { return dot(G, softmaxD(xd, false)); };
  expectClose("softmax dx", numericGradient(phi, xd.data), dx);

  Batch z = randomBatch(kLengths, 1, kN, 13, 29, 3.0f), G2 = randomBatch(kLengths, 1, kN, 13, 30);
  Batch dz = logSoftmaxBackward(G2, logSoftmax(z));
  expectZeroPadding("log_softmax", dz);
  DB zd = toD(z);
  auto phi2 = [&] { return dot(G2, softmaxD(zd, true)); };
  expectClose("log_softmax dx", numericGradient(phi2, zd.data), dz);
}

TEST(OpsBackward, RelativeScoresAndValues) {
  const int64_t dh = 3, k = 2;
  Batch q = randomBatch(kLengths, 2, kN, dh, 31), keys = randomBatch(kLengths, 2, kN, dh, 32);
  Matrix rel = randomMatrix(2 * k + 1, dh, 33);
  Batch G = randomBatch(kLengths, 2, kN, kN, 34);
  RelativeScoresGrad gs = relativeScoresBackward(G, q, keys, rel, k);
  expectZeroPadding("relative_scores", gs.dQuery);
  DB qd = toD(q), kd = toD(keys);
  Vec rd = toVec(rel);
  auto phi = [&] { return dot(G, relativeScoresD(qd, kd, rd, k)); };
  expectClose("relative_scores dQuery", numericGradient(phi, qd.data), gs.dQuery);
  expectClose("relative_scores dRel", numericGradient(phi, rd), gs.dRel);

  Batch p = softmax(maskFill(randomBatch(kLengths, 2, kN, kN, 35), MaskKind::None));
  Batch G2 = randomBatch(kLengths, 2, kN, dh, 36);
  RelativeValuesGrad gv = relativeValuesBackward(G2, p, rel, k);
  expectZeroPadding("relative_values", gv.dProbs);
  DB pd = toD(p);
  auto phi2 = [&] { return dot(G2, relativeValuesD(pd, rd, k, dh)); };
  Vec fdP = numericGradient(phi2, pd.data);
  expectClose("relative_values dProbs", fdP, gv.dProbs);
  expectClose("relative_values dRel", numericGradient(phi2, rd), gv.dRel);
}

TEST(OpsBackward, AttentionEveryMaskWithAndWithoutRelativePositions) {
  const int64_t heads = 3, D = 9, dh = 3, k = 2;
  const float scale = static_cast<float>(1.0 / std::sqrt(3.0));
  Batch Q = randomBatch(kLengths, 1, kN, D, 37), K = randomBatch(kLengths, 1, kN, D, 38),
        V = randomBatch(kLengths, 1, kN, D, 39);
  Matrix relK = randomMatrix(2 * k + 1, dh, 40), relV = randomMatrix(2 * k + 1, dh, 41);
  Batch G = randomBatch(kLengths, 1, kN, D, 42);
  for (MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::Anticausal, MaskKind::Diagonal})
    for (bool relative : {false, true}) {
      RelativePositions rp{&relK, &relV, k};
      AttentionGrad g = attentionBackward(G, Q, K, V, heads, mask, scale, relative ? &rp : nullptr);
      const std::string tag = std::string("attention ") + toString(mask) + (relative ? " rel" : "") + " ";
      expectZeroPadding(tag + "dQ", g.dQuery);
      expectZeroPadding(tag + "dK", g.dKey);
      expectZeroPadding(tag + "dV", g.dValue);
      DB qd = toD(Q), kd = toD(K), vd = toD(V);
      Vec rkd = toVec(relK), rvd = toVec(relV);
      auto phi = [&] {
        return dot(G, attentionD(qd, kd, vd, heads, mask, scale, relative ? &rkd : nullptr,
                                 relative ? &rvd : nullptr, k));
      };
      expectClose(tag + "dQ", numericGradient(phi, qd.data), g.dQuery);
      expectClose(tag + "dK", numericGradient(phi, kd.data), g.dKey);
      expectClose(tag + "dV", numericGradient(phi, vd.data), g.dValue);
      if (relative) {
        expectClose(tag + "dRelK", numericGradient(phi, rkd), g.dRelKeys);
        expectClose(tag + "dRelV", numericGradient(phi, rvd), g.dRelValues);
      } else {
        EXPECT_EQ(g.dRelKeys.size(), 0);
      }
      if (mask == MaskKind::Diagonal) // sentence 1 (one token) has no visible key: no gradient at all
        for (int64_t c = 0; c < D; ++c) {
          EXPECT_EQ(g.dQuery.at(1, 0, 0, c), 0.0f);
          EXPECT_EQ(g.dValue.at(1, 0, 0, c), 0.0f);
        }
    }
}

//===----------------------------------------------------------------------===//
// Head
//===----------------------------------------------------------------------===//

TEST(OpsBackward, CrossEntropyWithLabelSmoothing) {
  const int64_t V = 13;
  Batch z = randomBatch(kLengths, 1, kN, V, 43, 2.0f);
  TokenBatch targets = TokenBatch::pack({{4, -1, 12, 0, 7}, {-1}, {9, 9, -1}});
  for (double e : {0.0, 0.1}) {
    const double scale = 1.0 / 6.0;
    CrossEntropy ce = crossEntropy(z, targets, e, scale);
    EXPECT_EQ(ce.targets, 6);
    expectZeroPadding("cross_entropy", ce.dLogits);
    DB zd = toD(z);
    auto loss = [&] {
      double sum = 0;
      DB lp = softmaxD(zd, true);
      for (int64_t b = 0; b < targets.B; ++b)
        for (int64_t t = 0; t < targets.lengths[b]; ++t) {
          if (targets.at(b, t) < 0)
            continue;
          double all = 0;
          for (int64_t v = 0; v < V; ++v)
            all += lp.at(b, 0, t, v);
          sum += -(1 - e) * lp.at(b, 0, t, targets.at(b, t)) - e / V * all;
        }
      return sum;
    };
    EXPECT_NEAR(ce.lossSum, loss(), 1e-12 * std::fabs(loss()));
    auto phi = [&] { return scale * loss(); };
    Vec fd = numericGradient(phi, zd.data);
    expectClose("cross_entropy e=" + std::to_string(e).substr(0, 3) + " dLogits", fd, ce.dLogits);
    for (int64_t v = 0; v < V; ++v)
      EXPECT_EQ(ce.dLogits.at(0, 0, 1, v), 0.0f) << "row without target";
  }
  TokenBatch bad = TokenBatch::pack({{4, -1, 13, 0, 7}, {-1}, {9, 9, -1}});
  try {
    crossEntropy(z, bad, 0.0, 1.0);
    FAIL() << "target 13 outside a vocabulary of 13";
  } catch (const std::invalid_argument &err) {
    EXPECT_NE(std::string(err.what()).find("sentence 0, position 2"), std::string::npos) << err.what();
  }
}

TEST(OpsBackward, Gather) {
  const int64_t V = 6;
  TokenBatch targets = TokenBatch::pack({{1, 5, 1, 0, 2}, {3}, {4, 4, 0}});
  Batch lp = randomBatch(targets.lengths, 1, targets.N, V, 44);
  Batch G = randomBatch(targets.lengths, 1, targets.N, 1, 45);
  for (int64_t shift : {0, 1}) {
    Batch d = gatherBackward(G, targets, shift, V);
    DB lpd = toD(lp);
    auto phi = [&] {
      double s = 0;
      for (int64_t b = 0; b < targets.B; ++b)
        for (int64_t t = shift; t < targets.lengths[b]; ++t)
          s += G.at(b, 0, t, 0) * lpd.at(b, 0, t - shift, targets.at(b, t));
      return s;
    };
    expectClose("gather shift=" + std::to_string(shift), numericGradient(phi, lpd.data), d);
  }
}

TEST(OpsBackward, WorstErrorSummary) {
  std::printf("  worst relative FD error over the op tests run so far: %.2e (%s)\n", worstSeen, worstWhat.c_str());
  SUCCEED();
}

} // namespace
