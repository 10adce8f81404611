//===- Ops.cpp - Reference implementations of the `lm` dialect ops --------===//
//
// Every op loops over sentences (and groups), copies a sentence's valid rows into
// a private Eigen matrix, computes, and writes the valid rows back. Nothing reads
// padding rows, so results do not depend on batch composition.
//
//===----------------------------------------------------------------------===//
#include "runtime/reference/Ops.h"
#include "runtime/train/Philox.h"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace lmcc::reference {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPi = 3.14159265358979323846f;

[[noreturn]] void fail(const char *op, const std::string &what) {
  throw std::invalid_argument(std::string("reference ") + op + ": " + what);
}

void require(bool ok, const char *op, const char *what) {
  if (!ok)
    fail(op, what);
}

/// Applies `f` to every valid element of x, into a new batch of the same shape.
template <typename F> Batch elementwise(const Batch &x, F f) {
  Batch out = Batch::zerosLike(x, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t) {
        const float *in = x.row(b, h, t);
        float *o = out.row(b, h, t);
        for (int64_t c = 0; c < x.C; ++c)
          o[c] = f(in[c]);
      }
  return out;
}

/// Applies `f(in, out, C)` to every valid row of x, into a new batch of C columns.
template <typename F> Batch rowwise(const Batch &x, F f) {
  Batch out = Batch::zerosLike(x, x.C);
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t)
        f(x.row(b, h, t), out.row(b, h, t), x.C);
  return out;
}

/// Sentences whose weight-gradient contributions are computed at once (in parallel) before being
/// added in order; bounds the memory of pending contributions. Results do not depend on it.
constexpr int64_t kSentenceBlock = 8;

/// Runs f(b) for every sentence b in parallel (on the caller's arena); f writes sentence b's rows only.
template <typename F> void forEachSentence(int64_t B, F f) {
  tbb::parallel_for(int64_t(0), B, [&](int64_t b) { f(b); });
}

/// sum over b = 0 .. B-1 of contribution(b) (a [rows, cols] matrix), added in sentence order:
/// contributions are computed in parallel, kSentenceBlock at a time, and summed sequentially, so
/// the result is bit-identical for any thread count.
template <typename F> Matrix sumOverSentences(int64_t B, int64_t rows, int64_t cols, F contribution) {
  Matrix sum = Matrix::Zero(rows, cols);
  for (int64_t begin = 0; begin < B; begin += kSentenceBlock) {
    const int64_t end = std::min(B, begin + kSentenceBlock);
    std::vector<Matrix> parts(end - begin);
    tbb::parallel_for(begin, end, [&](int64_t b) { parts[b - begin] = contribution(b); });
    for (const Matrix &part : parts) {
      if (part.rows() != rows || part.cols() != cols)
        throw std::logic_error("reference backward: contribution shape mismatch");
      sum += part;
    }
  }
  return sum;
}

/// Applies `f(dy, x, dx, C)` to every valid row of (dy, x), into a new batch shaped like x.
template <typename F> Batch rowwiseBackward(const char *op, const Batch &dy, const Batch &x, F f) {
  if (!(dy.B == x.B && dy.H == x.H && dy.N == x.N && dy.C == x.C && dy.lengths == x.lengths))
    fail(op, "gradient and input differ in shape or lengths");
  Batch dx = Batch::zerosLike(x, x.C);
  forEachSentence(x.B, [&](int64_t b) {
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t)
        f(dy.row(b, h, t), x.row(b, h, t), dx.row(b, h, t), x.C);
  });
  return dx;
}

bool sameLayout(const Batch &a, const Batch &b) {
  return a.B == b.B && a.H == b.H && a.N == b.N && a.C == b.C && a.lengths == b.lengths;
}

} // namespace

//===----------------------------------------------------------------------===//
// Layout
//===----------------------------------------------------------------------===//

TokenBatch TokenBatch::pack(const std::vector<std::vector<int32_t>> &sentences) {
  TokenBatch out;
  out.B = static_cast<int64_t>(sentences.size());
  for (const auto &s : sentences)
    out.N = std::max<int64_t>(out.N, static_cast<int64_t>(s.size()));
  out.ids.assign(out.B * out.N, 0);
  for (int64_t b = 0; b < out.B; ++b) {
    out.lengths.push_back(static_cast<int64_t>(sentences[b].size()));
    std::copy(sentences[b].begin(), sentences[b].end(), out.ids.begin() + b * out.N);
  }
  return out;
}

Batch Batch::zeros(const std::vector<int64_t> &lengths, int64_t H, int64_t N, int64_t C) {
  Batch out;
  out.B = static_cast<int64_t>(lengths.size());
  out.H = H;
  out.N = N;
  out.C = C;
  out.lengths = lengths;
  for (int64_t n : lengths)
    if (n < 0 || n > N)
      fail("batch", "sentence length " + std::to_string(n) + " outside [0, " + std::to_string(N) + "]");
  out.data.assign(out.B * H * N * C, 0.0f);
  return out;
}

Batch Batch::zerosLike(const Batch &like, int64_t C) { return zeros(like.lengths, like.H, like.N, C); }

Matrix Batch::slice(int64_t b, int64_t h) const {
  return Eigen::Map<const Matrix>(row(b, h, 0), lengths[b], C);
}

void Batch::setSlice(int64_t b, int64_t h, const Matrix &m) {
  require(m.rows() == lengths[b] && m.cols() == C, "batch", "slice shape mismatch");
  Eigen::Map<Matrix>(row(b, h, 0), lengths[b], C) = m;
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

Batch embed(const Matrix &table, const TokenBatch &ids) {
  Batch out = Batch::zeros(ids.lengths, 1, ids.N, table.cols());
  for (int64_t b = 0; b < ids.B; ++b)
    for (int64_t t = 0; t < ids.lengths[b]; ++t) {
      int32_t id = ids.at(b, t);
      if (id < 0 || id >= table.rows())
        fail("embed", "id " + std::to_string(id) + " outside the table of " + std::to_string(table.rows()) + " rows");
      Eigen::Map<RowVector>(out.row(b, 0, t), table.cols()) = table.row(id);
    }
  return out;
}

Matrix embedBackward(const Batch &dOut, const TokenBatch &ids, int64_t vocab) {
  require(dOut.H == 1 && dOut.B == ids.B && dOut.lengths == ids.lengths, "embed backward",
          "gradient and ids differ in shape or lengths");
  Matrix dTable = Matrix::Zero(vocab, dOut.C);
  for (int64_t b = 0; b < ids.B; ++b) {
    // The sentence's contribution (rows with the same id summed in position order), then added.
    std::vector<int32_t> order;
    std::vector<RowVector> sums;
    for (int64_t t = 0; t < ids.lengths[b]; ++t) {
      int32_t id = ids.at(b, t);
      if (id < 0 || id >= vocab)
        fail("embed backward", "id " + std::to_string(id) + " outside the table of " + std::to_string(vocab) +
                                   " rows");
      Eigen::Map<const RowVector> g(dOut.row(b, 0, t), dOut.C);
      auto it = std::find(order.begin(), order.end(), id);
      if (it == order.end()) {
        order.push_back(id);
        sums.push_back(g);
      } else {
        sums[it - order.begin()] += g;
      }
    }
    for (size_t i = 0; i < order.size(); ++i)
      dTable.row(order[i]) += sums[i];
  }
  return dTable;
}

Matrix sinusoidalTable(int64_t rows, int64_t D) {
  Matrix P(rows, D);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < D; ++c) {
      int64_t i2 = c - c % 2; // 2i for both members of the (sin, cos) pair
      double angle = static_cast<double>(t) / std::pow(10000.0, static_cast<double>(i2) / static_cast<double>(D));
      P(t, c) = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return P;
}

Batch positions(const TokenBatch &ids, PositionKind kind, const Matrix *table, int64_t D) {
  Batch out = Batch::zeros(ids.lengths, 1, ids.N, D);
  if (kind == PositionKind::None)
    return out;
  Matrix sinusoidal;
  if (kind == PositionKind::Learned) {
    require(table != nullptr, "positions", "a learned position table is required");
    if (table->cols() != D || table->rows() < ids.N)
      fail("positions", "the table is [" + std::to_string(table->rows()) + ", " + std::to_string(table->cols()) +
                            "], sentences need [" + std::to_string(ids.N) + ", " + std::to_string(D) + "]");
  } else {
    sinusoidal = sinusoidalTable(ids.N, D);
    table = &sinusoidal;
  }
  for (int64_t b = 0; b < ids.B; ++b)
    for (int64_t t = 0; t < ids.lengths[b]; ++t)
      Eigen::Map<RowVector>(out.row(b, 0, t), D) = table->row(t);
  return out;
}

Matrix positionsBackward(const Batch &dOut, int64_t tableRows) {
  require(dOut.H == 1 && dOut.N <= tableRows, "positions backward", "sentences longer than the table");
  Matrix dTable = Matrix::Zero(tableRows, dOut.C);
  for (int64_t b = 0; b < dOut.B; ++b)
    for (int64_t t = 0; t < dOut.lengths[b]; ++t)
      dTable.row(t) += Eigen::Map<const RowVector>(dOut.row(b, 0, t), dOut.C);
  return dTable;
}

//===----------------------------------------------------------------------===//
// Dense layers, norms, elementwise ops
//===----------------------------------------------------------------------===//

Batch linear(const Batch &x, const Matrix &W, const RowVector *bias) {
  if (W.cols() != x.C)
    fail("linear", "weight has " + std::to_string(W.cols()) + " inputs, x has " + std::to_string(x.C) + " features");
  require(!bias || bias->size() == W.rows(), "linear", "bias size differs from the weight's outputs");
  Batch out = Batch::zerosLike(x, W.rows());
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h) {
      Matrix y = x.slice(b, h) * W.transpose(); // [n, in] x [in, out]
      if (bias)
        y.rowwise() += *bias;
      out.setSlice(b, h, y);
    }
  return out;
}

LinearGrad linearBackward(const Batch &dy, const Batch &x, const Matrix &W, bool hasBias) {
  require(W.cols() == x.C && W.rows() == dy.C, "linear backward", "weight differs from the input or gradient");
  require(dy.B == x.B && dy.H == x.H && dy.N == x.N && dy.lengths == x.lengths, "linear backward",
          "gradient and input differ in shape or lengths");
  LinearGrad g;
  g.dx = Batch::zerosLike(x, x.C);
  forEachSentence(x.B, [&](int64_t b) {
    for (int64_t h = 0; h < x.H; ++h)
      g.dx.setSlice(b, h, dy.slice(b, h) * W); // [n, out] x [out, in]
  });
  g.dWeight = sumOverSentences(x.B, W.rows(), W.cols(), [&](int64_t b) {
    Matrix c = Matrix::Zero(W.rows(), W.cols());
    for (int64_t h = 0; h < x.H; ++h)
      c += dy.slice(b, h).transpose() * x.slice(b, h); // [out, n] x [n, in]
    return c;
  });
  if (hasBias)
    g.dBias = sumOverSentences(x.B, 1, W.rows(), [&](int64_t b) {
                Matrix c = Matrix::Zero(1, W.rows());
                for (int64_t h = 0; h < x.H; ++h)
                  c += dy.slice(b, h).colwise().sum();
                return c;
              }).row(0);
  return g;
}

Batch layerNorm(const Batch &x, const RowVector &gamma, const RowVector &beta, double eps) {
  require(gamma.size() == x.C && beta.size() == x.C, "layer_norm", "gamma/beta size differs from features");
  return rowwise(x, [&](const float *in, float *out, int64_t C) {
    double mean = 0;
    for (int64_t c = 0; c < C; ++c)
      mean += in[c];
    mean /= static_cast<double>(C);
    double var = 0; // biased: divided by C
    for (int64_t c = 0; c < C; ++c)
      var += (in[c] - mean) * (in[c] - mean);
    var /= static_cast<double>(C);
    double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      out[c] = static_cast<float>((in[c] - mean) * inv) * gamma[c] + beta[c];
  });
}

LayerNormGrad layerNormBackward(const Batch &dy, const Batch &x, const RowVector &gamma, double eps) {
  require(gamma.size() == x.C, "layer_norm backward", "gamma size differs from features");
  require(dy.B == x.B && dy.H == x.H && dy.N == x.N && dy.C == x.C && dy.lengths == x.lengths,
          "layer_norm backward", "gradient and input differ in shape or lengths");
  const int64_t C = x.C;
  LayerNormGrad g;
  g.dx = Batch::zerosLike(x, C);
  // xhat as the forward rounds it (the factor gamma multiplies), per sentence [n, C].
  std::vector<Matrix> xhat(x.B);
  forEachSentence(x.B, [&](int64_t b) {
    xhat[b] = Matrix::Zero(x.H * x.lengths[b], C);
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t) {
        const float *in = x.row(b, h, t), *dout = dy.row(b, h, t);
        double mean = 0;
        for (int64_t c = 0; c < C; ++c)
          mean += in[c];
        mean /= static_cast<double>(C);
        double var = 0;
        for (int64_t c = 0; c < C; ++c)
          var += (in[c] - mean) * (in[c] - mean);
        var /= static_cast<double>(C);
        const double inv = 1.0 / std::sqrt(var + eps);
        double meanG = 0, meanGX = 0; // mean(g), mean(g * xhat), g = dy * gamma
        for (int64_t c = 0; c < C; ++c) {
          double xh = (in[c] - mean) * inv, gc = static_cast<double>(dout[c]) * gamma[c];
          meanG += gc;
          meanGX += gc * xh;
          xhat[b](h * x.lengths[b] + t, c) = static_cast<float>(xh);
        }
        meanG /= static_cast<double>(C);
        meanGX /= static_cast<double>(C);
        float *dx = g.dx.row(b, h, t);
        for (int64_t c = 0; c < C; ++c) {
          double xh = (in[c] - mean) * inv, gc = static_cast<double>(dout[c]) * gamma[c];
          dx[c] = static_cast<float>(inv * (gc - meanG - xh * meanGX));
        }
      }
  });
  auto dyRows = [&](int64_t b) { // [H * n, C], in the order of xhat[b]
    Matrix m(x.H * x.lengths[b], C);
    for (int64_t h = 0; h < x.H; ++h)
      m.middleRows(h * x.lengths[b], x.lengths[b]) = dy.slice(b, h);
    return m;
  };
  g.dGamma = sumOverSentences(x.B, 1, C, [&](int64_t b) {
               Matrix c = dyRows(b).cwiseProduct(xhat[b]).colwise().sum();
               return c;
             }).row(0);
  g.dBeta = sumOverSentences(x.B, 1, C, [&](int64_t b) {
              Matrix c = dyRows(b).colwise().sum();
              return c;
            }).row(0);
  return g;
}

float geluExact(float x) { return x * 0.5f * (1.0f + std::erf(x / std::sqrt(2.0f))); }

float geluTanh(float x) {
  const float k = std::sqrt(2.0f / kPi);
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

Batch gelu(const Batch &x, bool approximate) {
  return approximate ? elementwise(x, geluTanh) : elementwise(x, geluExact);
}

Batch relu(const Batch &x) {
  return elementwise(x, [](float v) { return v > 0.0f ? v : 0.0f; });
}

Batch activation(const Batch &x, Activation act) {
  switch (act) {
  case Activation::Gelu:
    return gelu(x, /*approximate=*/false);
  case Activation::GeluTanh:
    return gelu(x, /*approximate=*/true);
  case Activation::Relu:
    return relu(x);
  }
  throw std::invalid_argument("reference activation: unknown kind");
}

Batch geluBackward(const Batch &dy, const Batch &x, bool approximate) {
  return rowwiseBackward("gelu backward", dy, x, [approximate](const float *d, const float *in, float *out, int64_t C) {
    const double pi = 3.14159265358979323846, k = std::sqrt(2.0 / pi);
    for (int64_t c = 0; c < C; ++c) {
      const double v = in[c];
      double slope;
      if (approximate) {
        const double th = std::tanh(k * (v + 0.044715 * v * v * v));
        slope = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * 0.044715 * v * v);
      } else {
        slope = 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * pi);
      }
      out[c] = static_cast<float>(d[c] * slope);
    }
  });
}

Batch reluBackward(const Batch &dy, const Batch &x) {
  return rowwiseBackward("relu backward", dy, x, [](const float *d, const float *in, float *out, int64_t C) {
    for (int64_t c = 0; c < C; ++c)
      out[c] = in[c] > 0.0f ? d[c] : 0.0f;
  });
}

Batch activationBackward(const Batch &dy, const Batch &x, Activation act) {
  switch (act) {
  case Activation::Gelu:
    return geluBackward(dy, x, /*approximate=*/false);
  case Activation::GeluTanh:
    return geluBackward(dy, x, /*approximate=*/true);
  case Activation::Relu:
    return reluBackward(dy, x);
  }
  throw std::invalid_argument("reference activation backward: unknown kind");
}

Batch add(const Batch &a, const Batch &b) {
  require(sameLayout(a, b), "add", "operands differ in shape or lengths");
  Batch out = Batch::zerosLike(a, a.C);
  for (int64_t s = 0; s < a.B; ++s)
    for (int64_t h = 0; h < a.H; ++h)
      out.setSlice(s, h, a.slice(s, h) + b.slice(s, h));
  return out;
}

Batch scale(const Batch &x, float factor) {
  return elementwise(x, [factor](float v) { return v * factor; });
}

Batch scaleBackward(const Batch &dy, float factor) { return scale(dy, factor); }

Batch interpolate(const Batch &a, const Batch &b, double lambda) {
  require(sameLayout(a, b), "interpolate", "operands differ in shape or lengths");
  require(lambda >= 0 && lambda <= 1, "interpolate", "lambda outside [0, 1]");
  // log((1 - lambda) e^a + lambda e^b) = logaddexp(log(1 - lambda) + a, log(lambda) + b)
  const double logA = std::log1p(-lambda), logB = std::log(lambda);
  Batch out = Batch::zerosLike(a, a.C);
  for (int64_t s = 0; s < a.B; ++s)
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t t = 0; t < a.lengths[s]; ++t)
        for (int64_t c = 0; c < a.C; ++c) {
          double u = logA + a.at(s, h, t, c), v = logB + b.at(s, h, t, c);
          double m = std::max(u, v);
          out.at(s, h, t, c) = m == -std::numeric_limits<double>::infinity()
                                   ? kNegInf
                                   : static_cast<float>(m + std::log(std::exp(u - m) + std::exp(v - m)));
        }
  return out;
}

InterpolateGrad interpolateBackward(const Batch &dy, const Batch &a, const Batch &b, double lambda) {
  require(sameLayout(a, b) && sameLayout(a, dy), "interpolate backward", "operands differ in shape or lengths");
  require(lambda >= 0 && lambda <= 1, "interpolate backward", "lambda outside [0, 1]");
  const double logA = std::log1p(-lambda), logB = std::log(lambda);
  InterpolateGrad g{Batch::zerosLike(a, a.C), Batch::zerosLike(a, a.C)};
  for (int64_t s = 0; s < a.B; ++s)
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t t = 0; t < a.lengths[s]; ++t)
        for (int64_t c = 0; c < a.C; ++c) {
          double u = logA + a.at(s, h, t, c), v = logB + b.at(s, h, t, c);
          double m = std::max(u, v);
          if (m == -std::numeric_limits<double>::infinity())
            continue; // both weights zero: no gradient
          double wu = std::exp(u - m), wv = std::exp(v - m), d = dy.at(s, h, t, c);
          g.da.at(s, h, t, c) = static_cast<float>(d * wu / (wu + wv));
          g.db.at(s, h, t, c) = static_cast<float>(d * wv / (wu + wv));
        }
  return g;
}

//===----------------------------------------------------------------------===//
// Attention, decomposed
//===----------------------------------------------------------------------===//

Batch splitHeads(const Batch &x, int64_t heads) {
  require(x.H == 1 && heads > 0 && x.C % heads == 0, "split_heads", "features not divisible by heads");
  int64_t dh = x.C / heads;
  Batch out = Batch::zeros(x.lengths, heads, x.N, dh);
  for (int64_t b = 0; b < x.B; ++b) {
    Matrix s = x.slice(b);
    for (int64_t h = 0; h < heads; ++h)
      out.setSlice(b, h, s.middleCols(h * dh, dh));
  }
  return out;
}

Batch mergeHeads(const Batch &x) {
  int64_t dh = x.C;
  Batch out = Batch::zeros(x.lengths, 1, x.N, x.H * dh);
  for (int64_t b = 0; b < x.B; ++b) {
    Matrix merged(x.lengths[b], x.H * dh);
    for (int64_t h = 0; h < x.H; ++h)
      merged.middleCols(h * dh, dh) = x.slice(b, h);
    out.setSlice(b, 0, merged);
  }
  return out;
}

Batch splitHeadsBackward(const Batch &dy) { return mergeHeads(dy); }

Batch mergeHeadsBackward(const Batch &dy, int64_t heads) { return splitHeads(dy, heads); }

Batch matmul(const Batch &lhs, const Batch &rhs, bool transposeRhs) {
  require(lhs.B == rhs.B && lhs.H == rhs.H, "matmul", "batch or group counts differ");
  if (transposeRhs) {
    // [N, K] x [M, K]^T -> [N, M]
    require(lhs.C == rhs.C, "matmul", "contraction sizes differ");
    Batch out = Batch::zeros(lhs.lengths, lhs.H, lhs.N, rhs.N);
    for (int64_t b = 0; b < lhs.B; ++b)
      for (int64_t h = 0; h < lhs.H; ++h) {
        Matrix product = lhs.slice(b, h) * rhs.slice(b, h).transpose(); // [n, m]
        Matrix padded = Matrix::Zero(lhs.lengths[b], rhs.N);
        padded.leftCols(product.cols()) = product;
        out.setSlice(b, h, padded);
      }
    return out;
  }
  // [N, M] x [M, C] -> [N, C], contracting over rhs's valid rows only.
  require(lhs.C == rhs.N, "matmul", "contraction sizes differ");
  Batch out = Batch::zeros(lhs.lengths, lhs.H, lhs.N, rhs.C);
  for (int64_t b = 0; b < lhs.B; ++b)
    for (int64_t h = 0; h < lhs.H; ++h) {
      Matrix a = lhs.slice(b, h).leftCols(rhs.lengths[b]); // a private copy: [n, m]
      out.setSlice(b, h, a * rhs.slice(b, h));
    }
  return out;
}

MatmulGrad matmulBackward(const Batch &dOut, const Batch &lhs, const Batch &rhs, bool transposeRhs) {
  require(lhs.B == rhs.B && lhs.H == rhs.H && dOut.B == lhs.B && dOut.H == lhs.H && dOut.lengths == lhs.lengths,
          "matmul backward", "batch, group counts or lengths differ");
  MatmulGrad g{Batch::zerosLike(lhs, lhs.C), Batch::zerosLike(rhs, rhs.C)};
  if (transposeRhs) {
    require(lhs.C == rhs.C && dOut.C == rhs.N, "matmul backward", "contraction sizes differ");
    forEachSentence(lhs.B, [&](int64_t b) {
      for (int64_t h = 0; h < lhs.H; ++h) {
        Matrix d = dOut.slice(b, h).leftCols(rhs.lengths[b]); // [n, m]
        g.dLhs.setSlice(b, h, d * rhs.slice(b, h));             // [n, m] x [m, K]
        g.dRhs.setSlice(b, h, d.transpose() * lhs.slice(b, h)); // [m, n] x [n, K]
      }
    });
    return g;
  }
  require(lhs.C == rhs.N && dOut.C == rhs.C, "matmul backward", "contraction sizes differ");
  forEachSentence(lhs.B, [&](int64_t b) {
    for (int64_t h = 0; h < lhs.H; ++h) {
      const int64_t m = rhs.lengths[b];
      Matrix a = lhs.slice(b, h).leftCols(m), d = dOut.slice(b, h);
      Matrix dA = Matrix::Zero(lhs.lengths[b], lhs.C); // key padding columns stay 0
      dA.leftCols(m) = d * rhs.slice(b, h).transpose(); // [n, C] x [C, m]
      g.dLhs.setSlice(b, h, dA);
      g.dRhs.setSlice(b, h, a.transpose() * d); // [m, n] x [n, C]
    }
  });
  return g;
}

bool keyVisible(MaskKind kind, int64_t i, int64_t j, int64_t n) {
  if (j < 0 || j >= n)
    return false; // key padding
  switch (kind) {
  case MaskKind::None:
    return true;
  case MaskKind::Causal:
    return j <= i;
  case MaskKind::Anticausal:
    return j >= i;
  case MaskKind::Diagonal:
    return j != i;
  case MaskKind::Directional:
    break;
  }
  throw std::invalid_argument("reference mask_fill: mask 'directional' needs per-row data and executes in a "
                              "later release");
}

Batch maskFill(const Batch &scores, MaskKind kind) {
  Batch out = scores;
  for (int64_t b = 0; b < scores.B; ++b)
    for (int64_t h = 0; h < scores.H; ++h)
      for (int64_t i = 0; i < scores.lengths[b]; ++i) {
        float *row = out.row(b, h, i);
        for (int64_t j = 0; j < scores.C; ++j)
          if (!keyVisible(kind, i, j, scores.lengths[b]))
            row[j] = kNegInf;
      }
  return out;
}

Batch maskFillBackward(const Batch &dOut, MaskKind kind) {
  Batch dx = Batch::zerosLike(dOut, dOut.C);
  for (int64_t b = 0; b < dOut.B; ++b)
    for (int64_t h = 0; h < dOut.H; ++h)
      for (int64_t i = 0; i < dOut.lengths[b]; ++i)
        for (int64_t j = 0; j < dOut.C; ++j)
          if (keyVisible(kind, i, j, dOut.lengths[b]))
            dx.at(b, h, i, j) = dOut.at(b, h, i, j);
  return dx;
}

Batch softmax(const Batch &x) {
  return rowwise(x, [](const float *in, float *out, int64_t C) {
    float max = kNegInf;
    for (int64_t c = 0; c < C; ++c)
      max = std::max(max, in[c]);
    if (max == kNegInf) { // nothing visible: all zeros (the row was zero-initialized)
      return;
    }
    double sum = 0;
    for (int64_t c = 0; c < C; ++c)
      sum += std::exp(static_cast<double>(in[c]) - max);
    for (int64_t c = 0; c < C; ++c)
      out[c] = static_cast<float>(std::exp(static_cast<double>(in[c]) - max) / sum);
  });
}

Batch softmaxBackward(const Batch &dy, const Batch &probs) {
  return rowwiseBackward("softmax backward", dy, probs, [](const float *d, const float *p, float *out, int64_t C) {
    double dot = 0; // sum_k p_k dy_k
    for (int64_t c = 0; c < C; ++c)
      dot += static_cast<double>(p[c]) * d[c];
    for (int64_t c = 0; c < C; ++c)
      out[c] = static_cast<float>(p[c] * (d[c] - dot));
  });
}

int64_t relativeIndex(int64_t i, int64_t j, int64_t k) { return std::clamp(j - i, -k, k) + k; }

Batch relativeScores(const Batch &query, const Batch &keys, const Matrix &rel, int64_t k) {
  require(query.B == keys.B && query.H == keys.H, "relative_scores", "batch or group counts differ");
  require(k > 0 && rel.rows() == 2 * k + 1 && rel.cols() == query.C, "relative_scores",
          "rel must be [2k+1, dh]");
  Batch out = Batch::zeros(query.lengths, query.H, query.N, keys.N);
  for (int64_t b = 0; b < query.B; ++b)
    for (int64_t h = 0; h < query.H; ++h)
      for (int64_t i = 0; i < query.lengths[b]; ++i) {
        const float *q = query.row(b, h, i);
        for (int64_t j = 0; j < keys.lengths[b]; ++j) {
          const float *r = rel.row(relativeIndex(i, j, k)).data();
          float dot = 0; // q_i . rel[r], in order
          for (int64_t c = 0; c < query.C; ++c)
            dot += q[c] * r[c];
          out.at(b, h, i, j) = dot;
        }
      }
  return out;
}

RelativeScoresGrad relativeScoresBackward(const Batch &dOut, const Batch &query, const Batch &keys,
                                          const Matrix &rel, int64_t k) {
  require(query.B == keys.B && query.H == keys.H && dOut.lengths == query.lengths && dOut.C == keys.N,
          "relative_scores backward", "shapes or lengths differ");
  require(k > 0 && rel.rows() == 2 * k + 1 && rel.cols() == query.C, "relative_scores backward",
          "rel must be [2k+1, dh]");
  RelativeScoresGrad g{Batch::zerosLike(query, query.C), Matrix()};
  forEachSentence(query.B, [&](int64_t b) {
    for (int64_t h = 0; h < query.H; ++h)
      for (int64_t i = 0; i < query.lengths[b]; ++i) {
        Eigen::Map<RowVector> dq(g.dQuery.row(b, h, i), query.C);
        for (int64_t j = 0; j < keys.lengths[b]; ++j)
          dq += dOut.at(b, h, i, j) * rel.row(relativeIndex(i, j, k));
      }
  });
  g.dRel = sumOverSentences(query.B, rel.rows(), rel.cols(), [&](int64_t b) {
    Matrix c = Matrix::Zero(rel.rows(), rel.cols());
    for (int64_t h = 0; h < query.H; ++h)
      for (int64_t i = 0; i < query.lengths[b]; ++i)
        for (int64_t j = 0; j < keys.lengths[b]; ++j)
          c.row(relativeIndex(i, j, k)) += dOut.at(b, h, i, j) * Eigen::Map<const RowVector>(query.row(b, h, i), query.C);
    return c;
  });
  return g;
}

Batch relativeValues(const Batch &probs, const Matrix &rel, int64_t k) {
  require(k > 0 && rel.rows() == 2 * k + 1, "relative_values", "rel must be [2k+1, dh]");
  Batch out = Batch::zeros(probs.lengths, probs.H, probs.N, rel.cols());
  for (int64_t b = 0; b < probs.B; ++b)
    for (int64_t h = 0; h < probs.H; ++h)
      for (int64_t i = 0; i < probs.lengths[b]; ++i) {
        Eigen::Map<RowVector> o(out.row(b, h, i), rel.cols());
        for (int64_t j = 0; j < probs.lengths[b]; ++j)
          o += probs.at(b, h, i, j) * rel.row(relativeIndex(i, j, k));
      }
  return out;
}

RelativeValuesGrad relativeValuesBackward(const Batch &dOut, const Batch &probs, const Matrix &rel, int64_t k) {
  require(k > 0 && rel.rows() == 2 * k + 1 && rel.cols() == dOut.C, "relative_values backward",
          "rel must be [2k+1, dh]");
  require(dOut.B == probs.B && dOut.H == probs.H && dOut.lengths == probs.lengths, "relative_values backward",
          "shapes or lengths differ");
  RelativeValuesGrad g{Batch::zerosLike(probs, probs.C), Matrix()};
  forEachSentence(probs.B, [&](int64_t b) {
    for (int64_t h = 0; h < probs.H; ++h)
      for (int64_t i = 0; i < probs.lengths[b]; ++i) {
        Eigen::Map<const RowVector> d(dOut.row(b, h, i), dOut.C);
        for (int64_t j = 0; j < probs.lengths[b]; ++j)
          g.dProbs.at(b, h, i, j) = d.dot(rel.row(relativeIndex(i, j, k)));
      }
  });
  g.dRel = sumOverSentences(probs.B, rel.rows(), rel.cols(), [&](int64_t b) {
    Matrix c = Matrix::Zero(rel.rows(), rel.cols());
    for (int64_t h = 0; h < probs.H; ++h)
      for (int64_t i = 0; i < probs.lengths[b]; ++i)
        for (int64_t j = 0; j < probs.lengths[b]; ++j)
          c.row(relativeIndex(i, j, k)) += probs.at(b, h, i, j) * Eigen::Map<const RowVector>(dOut.row(b, h, i), dOut.C);
    return c;
  });
  return g;
}

Batch applyDropout(const Batch &x, const DropoutMask &d) {
  Batch out = x;
  const float scale = static_cast<float>(1.0 / (1.0 - d.rate));
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t h = 0; h < x.H; ++h)
      for (int64_t t = 0; t < x.lengths[b]; ++t)
        for (int64_t c = 0; c < x.C; ++c) {
          float &v = out.at(b, h, t, c);
          v = train::dropoutKeep(d.seed, d.step, d.site, uint32_t(b * x.H + h), uint32_t(t), uint32_t(c), d.rate)
                  ? v * scale
                  : 0.0f;
        }
  return out;
}

Batch attention(const Batch &query, const Batch &key, const Batch &value, int64_t heads, MaskKind mask,
                float scaleFactor, const RelativePositions *relative, const DropoutMask *dropout) {
  require(query.lengths == key.lengths && key.lengths == value.lengths, "attention",
          "query, key and value lengths differ (self-attention only)");
  Batch q = splitHeads(query, heads), k = splitHeads(key, heads), v = splitHeads(value, heads);
  Batch scores = matmul(q, k, /*transposeRhs=*/true);
  if (relative)
    scores = add(scores, relativeScores(q, k, *relative->keys, relative->clip));
  scores = scale(scores, scaleFactor);
  scores = maskFill(scores, mask);
  Batch probs = softmax(scores);
  if (dropout)
    probs = applyDropout(probs, *dropout);
  Batch context = matmul(probs, v, /*transposeRhs=*/false);
  if (relative)
    context = add(context, relativeValues(probs, *relative->values, relative->clip));
  return mergeHeads(context);
}

AttentionGrad attentionBackward(const Batch &dOut, const Batch &query, const Batch &key, const Batch &value,
                                int64_t heads, MaskKind mask, float scaleFactor, const RelativePositions *relative,
                                const DropoutMask *dropout) {
  require(query.lengths == key.lengths && key.lengths == value.lengths && dOut.lengths == query.lengths,
          "attention backward", "query, key, value and gradient lengths differ (self-attention only)");
  // The forward chain of attention(), keeping what the backward needs.
  Batch q = splitHeads(query, heads), k = splitHeads(key, heads), v = splitHeads(value, heads);
  Batch scores = matmul(q, k, /*transposeRhs=*/true);
  if (relative)
    scores = add(scores, relativeScores(q, k, *relative->keys, relative->clip));
  Batch probs = softmax(maskFill(scale(scores, scaleFactor), mask));
  const Batch dropped = dropout ? applyDropout(probs, *dropout) : probs; // what C_h = P V_h multiplied

  // Backward, op by op in reverse.
  AttentionGrad g;
  Batch dContext = mergeHeadsBackward(dOut, heads);
  MatmulGrad pv = matmulBackward(dContext, dropped, v, /*transposeRhs=*/false);
  Batch dProbs = pv.dLhs;
  if (relative) {
    RelativeValuesGrad rv = relativeValuesBackward(dContext, dropped, *relative->values, relative->clip);
    dProbs = add(dProbs, rv.dProbs);
    g.dRelValues = rv.dRel;
  }
  if (dropout)
    dProbs = applyDropout(dProbs, *dropout);
  Batch dScores = scaleBackward(maskFillBackward(softmaxBackward(dProbs, probs), mask), scaleFactor);
  MatmulGrad qk = matmulBackward(dScores, q, k, /*transposeRhs=*/true);
  Batch dq = qk.dLhs;
  if (relative) {
    RelativeScoresGrad rs = relativeScoresBackward(dScores, q, k, *relative->keys, relative->clip);
    dq = add(dq, rs.dQuery);
    g.dRelKeys = rs.dRel;
  }
  g.dQuery = splitHeadsBackward(dq);
  g.dKey = splitHeadsBackward(qk.dRhs);
  g.dValue = splitHeadsBackward(pv.dRhs);
  return g;
}

//===----------------------------------------------------------------------===//
// Output head and scores
//===----------------------------------------------------------------------===//

Batch logSoftmax(const Batch &x) {
  return rowwise(x, [](const float *in, float *out, int64_t C) {
    float max = kNegInf;
    for (int64_t c = 0; c < C; ++c)
      max = std::max(max, in[c]);
    double sum = 0;
    for (int64_t c = 0; c < C; ++c)
      sum += std::exp(static_cast<double>(in[c]) - max);
    double logSumExp = max + std::log(sum);
    for (int64_t c = 0; c < C; ++c)
      out[c] = static_cast<float>(static_cast<double>(in[c]) - logSumExp);
  });
}

Batch logSoftmaxBackward(const Batch &dy, const Batch &logprobs) {
  return rowwiseBackward("log_softmax backward", dy, logprobs,
                         [](const float *d, const float *lp, float *out, int64_t C) {
                           double sum = 0;
                           for (int64_t c = 0; c < C; ++c)
                             sum += d[c];
                           for (int64_t c = 0; c < C; ++c)
                             out[c] = static_cast<float>(d[c] - std::exp(static_cast<double>(lp[c])) * sum);
                         });
}

CrossEntropy crossEntropy(const Batch &logits, const TokenBatch &targets, double labelSmoothing,
                          double gradScale) {
  require(logits.H == 1 && logits.B == targets.B && logits.lengths == targets.lengths, "cross_entropy",
          "logits and targets differ in shape or lengths");
  require(labelSmoothing >= 0 && labelSmoothing <= 1, "cross_entropy", "label smoothing outside [0, 1]");
  const int64_t V = logits.C;
  const double e = labelSmoothing;
  for (int64_t b = 0; b < targets.B; ++b)
    for (int64_t t = 0; t < targets.lengths[b]; ++t)
      if (targets.at(b, t) < -1 || targets.at(b, t) >= V)
        throw std::invalid_argument("sentence " + std::to_string(b) + ", position " + std::to_string(t) +
                                    ": target " + std::to_string(targets.at(b, t)) + " outside [0, " +
                                    std::to_string(V) + ") (or -1 for none)");
  CrossEntropy out;
  out.dLogits = Batch::zerosLike(logits, V);
  std::vector<double> sentenceLoss(targets.B, 0.0);
  std::vector<int64_t> sentenceTargets(targets.B, 0);
  forEachSentence(targets.B, [&](int64_t b) {
    std::vector<double> logp(V);
    for (int64_t t = 0; t < targets.lengths[b]; ++t) {
      const int32_t target = targets.at(b, t);
      if (target < 0)
        continue;
      const float *z = logits.row(b, 0, t);
      double max = -std::numeric_limits<double>::infinity(), sum = 0, sumLogp = 0;
      for (int64_t v = 0; v < V; ++v)
        max = std::max(max, static_cast<double>(z[v]));
      for (int64_t v = 0; v < V; ++v)
        sum += std::exp(z[v] - max);
      const double logSumExp = max + std::log(sum);
      for (int64_t v = 0; v < V; ++v) {
        logp[v] = z[v] - logSumExp;
        sumLogp += logp[v];
      }
      sentenceLoss[b] += -(1 - e) * logp[target] - e / static_cast<double>(V) * sumLogp;
      ++sentenceTargets[b];
      float *dz = out.dLogits.row(b, 0, t);
      for (int64_t v = 0; v < V; ++v)
        dz[v] = static_cast<float>(gradScale * (std::exp(logp[v]) - (v == target ? 1 - e : 0.0) -
                                                e / static_cast<double>(V)));
    }
  });
  for (int64_t b = 0; b < targets.B; ++b) {
    out.lossSum += sentenceLoss[b];
    out.targets += sentenceTargets[b];
  }
  return out;
}

Batch gather(const Batch &logprobs, const TokenBatch &targets, int64_t shift) {
  require(logprobs.H == 1 && logprobs.B == targets.B && logprobs.lengths == targets.lengths, "gather",
          "log-probs and targets differ in shape or lengths");
  require(shift >= 0, "gather", "negative shift");
  Batch out = Batch::zeros(targets.lengths, 1, targets.N, 1);
  for (int64_t b = 0; b < targets.B; ++b)
    for (int64_t t = shift; t < targets.lengths[b]; ++t) {
      int32_t id = targets.at(b, t);
      if (id < 0 || id >= logprobs.C)
        fail("gather", "target id " + std::to_string(id) + " out of range");
      out.at(b, 0, t, 0) = logprobs.at(b, 0, t - shift, id);
    }
  return out;
}

Batch gatherBackward(const Batch &dOut, const TokenBatch &targets, int64_t shift, int64_t vocab) {
  require(dOut.H == 1 && dOut.C == 1 && dOut.B == targets.B && dOut.lengths == targets.lengths,
          "gather backward", "gradient and targets differ in shape or lengths");
  Batch d = Batch::zeros(targets.lengths, 1, targets.N, vocab);
  for (int64_t b = 0; b < targets.B; ++b)
    for (int64_t t = shift; t < targets.lengths[b]; ++t) {
      int32_t id = targets.at(b, t);
      if (id < 0 || id >= vocab)
        fail("gather backward", "target id " + std::to_string(id) + " out of range");
      d.at(b, 0, t - shift, id) += dOut.at(b, 0, t, 0);
    }
  return d;
}

Batch tokenLogprob(const Batch &hidden, const Matrix &W, const RowVector *bias, const TokenBatch &targets,
                   int64_t shift) {
  return gather(logSoftmax(linear(hidden, W, bias)), targets, shift);
}

std::vector<ScoreResult> sentenceScore(const Batch &tokenLogprobs, const TokenBatch &ids,
                                       const std::vector<int32_t> &skip, int64_t first) {
  require(tokenLogprobs.C == 1 && tokenLogprobs.lengths == ids.lengths, "sentence_score",
          "token log-probs and ids differ in shape or lengths");
  std::vector<ScoreResult> results(ids.B);
  for (int64_t b = 0; b < ids.B; ++b) {
    ScoreResult &r = results[b];
    r.tokenLogprobs.assign(ids.lengths[b], 0.0f);
    for (int64_t t = first; t < ids.lengths[b]; ++t) {
      if (std::find(skip.begin(), skip.end(), ids.at(b, t)) != skip.end())
        continue;
      r.tokenLogprobs[t] = tokenLogprobs.at(b, 0, t, 0);
      r.score += r.tokenLogprobs[t];
      ++r.nScored;
    }
  }
  return results;
}

std::vector<std::vector<float>> meanPool(const Batch &hidden, const TokenBatch &ids,
                                         const std::vector<int32_t> &exclude) {
  require(hidden.H == 1 && hidden.lengths == ids.lengths, "mean_pool", "hidden and ids differ in lengths");
  std::vector<std::vector<float>> out(ids.B);
  for (int64_t b = 0; b < ids.B; ++b) {
    auto excluded = [&](int64_t t) {
      return std::find(exclude.begin(), exclude.end(), ids.at(b, t)) != exclude.end();
    };
    bool anyKept = false;
    for (int64_t t = 0; t < ids.lengths[b]; ++t)
      anyKept = anyKept || !excluded(t);
    std::vector<double> sum(hidden.C, 0.0);
    int64_t count = 0;
    for (int64_t t = 0; t < ids.lengths[b]; ++t) {
      if (anyKept && excluded(t))
        continue;
      for (int64_t c = 0; c < hidden.C; ++c)
        sum[c] += hidden.at(b, 0, t, c);
      ++count;
    }
    out[b].resize(hidden.C, 0.0f);
    for (int64_t c = 0; c < hidden.C && count > 0; ++c)
      out[b][c] = static_cast<float>(sum[c] / static_cast<double>(count));
  }
  return out;
}

std::vector<std::vector<float>> pool(const Batch &hidden, const TokenBatch &ids, Pooling how,
                                     const std::vector<int32_t> &special, bool normalize) {
  std::vector<std::vector<float>> out;
  if (how == Pooling::Cls) {
    require(hidden.H == 1 && hidden.lengths == ids.lengths, "pool", "hidden and ids differ in lengths");
    for (int64_t b = 0; b < ids.B; ++b)
      out.emplace_back(hidden.row(b, 0, 0), hidden.row(b, 0, 0) + hidden.C);
  } else {
    out = meanPool(hidden, ids, how == Pooling::Mean ? special : std::vector<int32_t>{});
  }
  if (normalize)
    for (auto &v : out) { // x / max(||x||, 1e-12), as torch.nn.functional.normalize
      double sq = 0;
      for (float x : v)
        sq += double(x) * x;
      double n = std::max(std::sqrt(sq), 1e-12);
      for (float &x : v)
        x = float(x / n);
    }
  return out;
}

Batch maskAndPredict(const TokenBatch &ids, int32_t maskToken,
                     const std::function<Batch(const TokenBatch &)> &region, const TokenBatch *spans) {
  require(!spans || (spans->B == ids.B && spans->N == ids.N), "mask_and_predict", "spans differ from the ids in shape");
  Batch out;
  for (int64_t i = 0; i < ids.N; ++i) {
    TokenBatch masked = ids;
    std::vector<int64_t> end(ids.B, i); // sentence b masks [i, end[b]); none when end[b] == i
    for (int64_t b = 0; b < ids.B; ++b)
      if (i < ids.lengths[b]) {
        end[b] = spans ? std::clamp<int64_t>(spans->at(b, i), i, ids.lengths[b]) : i + 1;
        for (int64_t t = i; t < end[b]; ++t)
          masked.at(b, t) = maskToken;
      }
    Batch result = region(masked);
    require(result.H == 1 && result.N == ids.N && result.lengths == ids.lengths, "mask_and_predict",
            "the region's result differs from the ids in shape or lengths");
    if (i == 0)
      out = Batch::zeros(ids.lengths, 1, ids.N, result.C);
    for (int64_t b = 0; b < ids.B; ++b)
      if (i < end[b])
        std::copy(result.row(b, 0, i), result.row(b, 0, i) + result.C, out.row(b, 0, i));
  }
  return out;
}

} // namespace lmcc::reference
