//===- Diformer.cpp - Reference Diformer (issue 19's contract) --------------===//
//
// Forward and hand-written backward of the Diformer, one sentence at a time. Every
// sub-layer keeps what its backward needs in a small record; the backward walks the
// records in reverse. Matrix products are Eigen's; LayerNorm statistics and softmax sums
// are in double (Ops.h's conventions), so the numbers agree with the other families' ops.
//
//===----------------------------------------------------------------------===//
#include "runtime/reference/Diformer.h"

#include "runtime/train/Philox.h"
#include "runtime/weights/WeightNames.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <numeric>
#include <stdexcept>

namespace lmcc::reference::diformer {

using Matrix = Model::Matrix;
using RowVector = Model::RowVector;

namespace {

// --- parameters --------------------------------------------------------------------------

struct Linear {
  std::string name; ///< prefix
  Matrix W;         ///< [out, in]
  RowVector b;      ///< [out]
};
struct Norm {
  std::string name;
  RowVector g, b;
};
struct Attention {
  Linear q, k, v, o;
  std::string relKName, relVName;
  Matrix relK, relV; ///< [2k+1, dh] or empty
};
struct EncoderLayer {
  Attention attn;
  Norm attnNorm, ffnNorm;
  Linear ffnIn, ffnOut;
};
struct DecoderLayer {
  Attention self, cross;
  Norm attnNorm, crossNorm, ffnNorm;
  Linear ffnIn, ffnOut;
};

Matrix toMatrix(const Tensor &t, const std::string &name, int64_t rows, int64_t cols) {
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    throw WeightError("tensor '" + name + "': expected shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                      "]");
  return Eigen::Map<const Matrix>(t.data.data(), rows, cols);
}
RowVector toRow(const Tensor &t, const std::string &name, int64_t n) {
  if (t.shape.size() != 1 || t.shape[0] != n)
    throw WeightError("tensor '" + name + "': expected shape [" + std::to_string(n) + "]");
  return Eigen::Map<const RowVector>(t.data.data(), n);
}

// --- per-sentence forward records and backward ---------------------------------------------

/// y = x W^T + b.
Matrix linearForward(const Linear &l, const Matrix &x) {
  Matrix y = x * l.W.transpose();
  y.rowwise() += l.b;
  return y;
}

/// Gradients by parameter name, allocated on first use.
struct GradSink {
  WeightSet &grads;
  Matrix &mat(const std::string &name, int64_t rows, int64_t cols) {
    auto it = mats.find(name);
    if (it == mats.end())
      it = mats.emplace(name, Matrix::Zero(rows, cols)).first;
    return it->second;
  }
  RowVector &row(const std::string &name, int64_t n) {
    auto it = rows.find(name);
    if (it == rows.end())
      it = rows.emplace(name, RowVector::Zero(n)).first;
    return it->second;
  }
  /// Adds the collected gradients into `grads` (whose tensors exist with the right shapes).
  void flush() {
    for (auto &[name, m] : mats) {
      Tensor &t = grads.tensors.at(name);
      Eigen::Map<Matrix>(t.data.data(), m.rows(), m.cols()) += m;
    }
    for (auto &[name, r] : rows) {
      Tensor &t = grads.tensors.at(name);
      Eigen::Map<RowVector>(t.data.data(), r.cols()) += r;
    }
  }
  std::map<std::string, Matrix> mats;
  std::map<std::string, RowVector> rows;
};

Matrix linearBackward(const Linear &l, const Matrix &x, const Matrix &dy, GradSink &g) {
  g.mat(names::weight(l.name), l.W.rows(), l.W.cols()).noalias() += dy.transpose() * x;
  g.row(names::bias(l.name), l.b.cols()) += dy.colwise().sum();
  return dy * l.W;
}

struct NormRecord {
  Matrix xhat;                 ///< normalized input
  std::vector<double> inv;     ///< 1 / sqrt(var + eps) per row
};

Matrix normForward(const Norm &n, const Matrix &x, double eps, NormRecord *rec) {
  Matrix y(x.rows(), x.cols());
  if (rec) {
    rec->xhat.resize(x.rows(), x.cols());
    rec->inv.resize(size_t(x.rows()));
  }
  const int64_t D = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < D; ++c)
      mean += x(r, c);
    mean /= double(D);
    for (int64_t c = 0; c < D; ++c)
      var += (x(r, c) - mean) * (x(r, c) - mean);
    var /= double(D);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < D; ++c) {
      const double xh = (x(r, c) - mean) * inv;
      y(r, c) = float(xh * n.g[c] + n.b[c]);
      if (rec)
        rec->xhat(r, c) = float(xh);
    }
    if (rec)
      rec->inv[size_t(r)] = inv;
  }
  return y;
}

Matrix normBackward(const Norm &n, const NormRecord &rec, const Matrix &dy, GradSink &gs) {
  const int64_t D = dy.cols();
  RowVector &dg = gs.row(names::weight(n.name), D), &db = gs.row(names::bias(n.name), D);
  Matrix dx(dy.rows(), D);
  for (int64_t r = 0; r < dy.rows(); ++r) {
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < D; ++c) {
      const double g = double(dy(r, c)) * n.g[c];
      mg += g;
      mgx += g * rec.xhat(r, c);
      dg[c] += dy(r, c) * rec.xhat(r, c);
      db[c] += dy(r, c);
    }
    mg /= double(D);
    mgx /= double(D);
    for (int64_t c = 0; c < D; ++c) {
      const double g = double(dy(r, c)) * n.g[c];
      dx(r, c) = float(rec.inv[size_t(r)] * (g - mg - rec.xhat(r, c) * mgx));
    }
  }
  return dx;
}

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double geluTanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double activationGrad(double x, Activation a) {
  switch (a) {
  case Activation::Relu: return x > 0 ? 1.0 : 0.0;
  case Activation::GeluTanh: {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2.0 / M_PI) * (1 + 3 * 0.044715 * x * x);
  }
  case Activation::Gelu: break;
  }
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
Matrix activate(const Matrix &x, Activation a) {
  Matrix y(x.rows(), x.cols());
  for (int64_t i = 0; i < x.size(); ++i) {
    const double v = x.data()[i];
    y.data()[i] = float(a == Activation::Relu ? std::max(v, 0.0) : a == Activation::GeluTanh ? geluTanh(v) : gelu(v));
  }
  return y;
}

/// Visibility and relative offsets of an attention: row r sees keys visible[r] with offsets
/// offsets[r] (key position - row position); an empty `visible` means every key, offset unused.
struct Pattern {
  bool all = true;
  std::vector<std::vector<int32_t>> visible;
  std::vector<std::vector<int64_t>> offsets;
};

struct AttentionRecord {
  Matrix query;               ///< sub-layer input (rows)
  Matrix Q, ctx;              ///< projected queries [r, D], merged context [r, D]
  std::vector<Matrix> probs;  ///< per head [r, m] (0 for hidden keys)
};

/// Multi-head attention of `query` rows over projected keys/values K, V [m, D]:
/// e_ij = Q_i . (K_j + relK[c_ij]) / sqrt(dh) over visible j, out_i = sum_j a_ij (V_j + relV[c_ij]),
/// c_ij = clip(offset, -k, k) + k; then the output projection.
Matrix attentionForward(const Attention &a, int64_t heads, int64_t clip, const Matrix &query, const Matrix &K,
                        const Matrix &V, const Pattern &p, AttentionRecord *rec) {
  const int64_t r = query.rows(), m = K.rows(), D = K.cols(), dh = D / heads;
  const bool rel = clip > 0 && a.relK.size() > 0;
  const float scale = 1.0f / std::sqrt(float(dh));
  Matrix Q = linearForward(a.q, query);
  Matrix ctx = Matrix::Zero(r, D);
  if (rec) {
    rec->query = query;
    rec->probs.assign(size_t(heads), Matrix());
  }
  for (int64_t h = 0; h < heads; ++h) {
    Matrix Qh = Q.middleCols(h * dh, dh);
    Matrix S = Qh * K.middleCols(h * dh, dh).transpose(); // [r, m]
    Matrix QR;
    if (rel)
      QR = Qh * a.relK.transpose(); // [r, 2k+1]
    Matrix P = Matrix::Zero(r, m);
    for (int64_t i = 0; i < r; ++i) {
      const int64_t count = p.all ? m : int64_t(p.visible[size_t(i)].size());
      if (count == 0)
        continue; // no visible key: zero context
      std::vector<double> e(static_cast<size_t>(count));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < count; ++t) {
        const int64_t j = p.all ? t : p.visible[size_t(i)][size_t(t)];
        float s = S(i, j);
        if (rel)
          s += QR(i, std::clamp<int64_t>(p.offsets[size_t(i)][size_t(t)], -clip, clip) + clip);
        e[size_t(t)] = double(s * scale);
        mx = std::max(mx, e[size_t(t)]);
      }
      double sum = 0;
      for (double &v : e)
        sum += (v = std::exp(v - mx));
      for (int64_t t = 0; t < count; ++t) {
        const int64_t j = p.all ? t : p.visible[size_t(i)][size_t(t)];
        P(i, j) = float(e[size_t(t)] / sum);
      }
    }
    Matrix C = P * V.middleCols(h * dh, dh);
    if (rel) {
      for (int64_t i = 0; i < r; ++i) {
        if (p.all)
          break;
        for (size_t t = 0; t < p.visible[size_t(i)].size(); ++t) {
          const int64_t j = p.visible[size_t(i)][t];
          C.row(i) += P(i, j) * a.relV.row(std::clamp<int64_t>(p.offsets[size_t(i)][t], -clip, clip) + clip);
        }
      }
    }
    ctx.middleCols(h * dh, dh) = C;
    if (rec)
      rec->probs[size_t(h)] = std::move(P);
  }
  if (rec) {
    rec->Q = Q;
    rec->ctx = ctx;
  }
  return linearForward(a.o, ctx);
}

/// Backward of attentionForward: returns d(query); adds dK, dV into the given matrices.
Matrix attentionBackward(const Attention &a, int64_t heads, int64_t clip, const Matrix &K, const Matrix &V,
                         const Pattern &p, const AttentionRecord &rec, const Matrix &dOut, Matrix &dK, Matrix &dV,
                         GradSink &g) {
  const int64_t r = rec.Q.rows(), D = K.cols(), dh = D / heads;
  const bool rel = clip > 0 && a.relK.size() > 0;
  const float scale = 1.0f / std::sqrt(float(dh));
  Matrix dCtx = linearBackward(a.o, rec.ctx, dOut, g);
  Matrix dQ = Matrix::Zero(r, D);
  Matrix *dRelK = rel ? &g.mat(a.relKName, a.relK.rows(), a.relK.cols()) : nullptr;
  Matrix *dRelV = rel ? &g.mat(a.relVName, a.relV.rows(), a.relV.cols()) : nullptr;
  for (int64_t h = 0; h < heads; ++h) {
    const Matrix &P = rec.probs[size_t(h)];
    Matrix dC = dCtx.middleCols(h * dh, dh);
    Matrix Vh = V.middleCols(h * dh, dh), Kh = K.middleCols(h * dh, dh), Qh = rec.Q.middleCols(h * dh, dh);
    Matrix dP = dC * Vh.transpose(); // [r, m]
    dV.middleCols(h * dh, dh).noalias() += P.transpose() * dC;
    Matrix dCR;
    if (rel)
      dCR = dC * a.relV.transpose(); // [r, 2k+1]
    Matrix dS = Matrix::Zero(P.rows(), P.cols());
    Matrix B;
    if (rel)
      B = Matrix::Zero(r, 2 * clip + 1);
    for (int64_t i = 0; i < r; ++i) {
      const int64_t count = p.all ? P.cols() : int64_t(p.visible[size_t(i)].size());
      double dot = 0;
      for (int64_t t = 0; t < count; ++t) {
        const int64_t j = p.all ? t : p.visible[size_t(i)][size_t(t)];
        float dp = dP(i, j);
        if (rel) {
          const int64_t c = std::clamp<int64_t>(p.offsets[size_t(i)][size_t(t)], -clip, clip) + clip;
          dp += dCR(i, c);
          dRelV->row(c) += P(i, j) * dC.row(i);
          dP(i, j) = dp;
        }
        dot += double(P(i, j)) * dp;
      }
      for (int64_t t = 0; t < count; ++t) {
        const int64_t j = p.all ? t : p.visible[size_t(i)][size_t(t)];
        const float ds = float(double(P(i, j)) * (double(dP(i, j)) - dot)) * scale;
        dS(i, j) = ds;
        if (rel)
          B(i, std::clamp<int64_t>(p.offsets[size_t(i)][size_t(t)], -clip, clip) + clip) += ds;
      }
    }
    Matrix dQh = dS * Kh;
    if (rel) {
      dQh.noalias() += B * a.relK;
      dRelK->noalias() += B.transpose() * Qh;
    }
    dQ.middleCols(h * dh, dh) = dQh;
    dK.middleCols(h * dh, dh).noalias() += dS.transpose() * Qh;
  }
  return linearBackward(a.q, rec.query, dQ, g);
}

} // namespace

// --- the model ---------------------------------------------------------------------------

struct Model::Impl {
  int64_t V = 0, L = 0, D = 0, clip = 0;
  StackDims enc, dec;
  double eps = 1e-12;
  Activation act = Activation::Gelu;
  bool embedNorm = false;
  bool pre = false; ///< pre-norm blocks: x + sublayer(norm(x)), a final norm after each stack
  Matrix token, position, lengthW, direction, posL2R, posR2L;
  Norm encNorm, decNorm;
  Norm encFinal, decFinal; ///< pre-norm only
  RowVector headBias; ///< [V] (zeros when the spec has no head bias)
  bool hasHeadBias = false;
  std::vector<EncoderLayer> encoder;
  std::vector<DecoderLayer> decoder;

  Linear linear(const WeightSet &w, const std::string &prefix, int64_t out, int64_t in) {
    return {prefix, toMatrix(w.get(names::weight(prefix)), names::weight(prefix), out, in),
            toRow(w.get(names::bias(prefix)), names::bias(prefix), out)};
  }
  Norm norm(const WeightSet &w, const std::string &prefix) {
    return {prefix, toRow(w.get(names::weight(prefix)), names::weight(prefix), D),
            toRow(w.get(names::bias(prefix)), names::bias(prefix), D)};
  }
  Attention attention(const WeightSet &w, const std::string &prefix, bool relative, int64_t heads) {
    Attention a{linear(w, names::q(prefix), D, D), linear(w, names::k(prefix), D, D), linear(w, names::v(prefix), D, D),
                linear(w, names::o(prefix), D, D), {}, {}, {}, {}};
    if (relative && clip > 0) {
      a.relKName = names::relK(prefix);
      a.relVName = names::relV(prefix);
      a.relK = toMatrix(w.get(a.relKName), a.relKName, 2 * clip + 1, D / heads);
      a.relV = toMatrix(w.get(a.relVName), a.relVName, 2 * clip + 1, D / heads);
    }
    return a;
  }

  /// A sublayer's input: x (post-norm) or norm(x) (pre-norm).
  Matrix sublayerInput(const Norm &n, const Matrix &x, NormRecord *rec) const {
    return pre ? normForward(n, x, eps, rec) : x;
  }
  /// A sublayer's residual: norm(x + out) (post-norm) or x + out (pre-norm).
  Matrix residual(const Norm &n, const Matrix &x, const Matrix &out, NormRecord *rec) const {
    return pre ? Matrix(x + out) : normForward(n, x + out, eps, rec);
  }
  /// Backward of residual: d(x + out) from d(result).
  Matrix residualBackward(const Norm &n, const NormRecord &rec, const Matrix &dy, GradSink &g) const {
    return pre ? dy : normBackward(n, rec, dy, g);
  }
  /// Backward of sublayerInput: d(x) from d(input).
  Matrix sublayerInputBackward(const Norm &n, const NormRecord &rec, const Matrix &dIn, GradSink &g) const {
    return pre ? normBackward(n, rec, dIn, g) : dIn;
  }

  // Encoder forward with records (rec == nullptr: inference).
  struct EncoderRecord {
    Matrix embedSum; NormRecord embedNorm, finalNorm;
    struct Layer {
      Matrix in, K, V, fin, f1; ///< attention input, keys, values, FFN input, FFN hidden (pre-activation)
      AttentionRecord attn; NormRecord n1, n2;
    };
    std::vector<Layer> layers;
  };
  Matrix encode(const std::vector<int32_t> &src, EncoderRecord *rec) const {
    const int64_t m = int64_t(src.size());
    Matrix x(m, D);
    for (int64_t t = 0; t < m; ++t)
      x.row(t) = token.row(src[size_t(t)]) + position.row(t);
    if (rec)
      rec->embedSum = x;
    if (embedNorm)
      x = normForward(encNorm, x, eps, rec ? &rec->embedNorm : nullptr);
    Pattern all;
    if (rec)
      rec->layers.resize(encoder.size());
    for (size_t l = 0; l < encoder.size(); ++l) {
      const EncoderLayer &E = encoder[l];
      auto *lr = rec ? &rec->layers[l] : nullptr;
      Matrix in = sublayerInput(E.attnNorm, x, lr ? &lr->n1 : nullptr);
      Matrix K = linearForward(E.attn.k, in), Vv = linearForward(E.attn.v, in);
      Matrix att = attentionForward(E.attn, enc.heads, 0, in, K, Vv, all, lr ? &lr->attn : nullptr);
      Matrix a = residual(E.attnNorm, x, att, lr ? &lr->n1 : nullptr);
      Matrix fin = sublayerInput(E.ffnNorm, a, lr ? &lr->n2 : nullptr);
      Matrix f1 = linearForward(E.ffnIn, fin);
      Matrix y = residual(E.ffnNorm, a, linearForward(E.ffnOut, activate(f1, act)), lr ? &lr->n2 : nullptr);
      if (lr) {
        lr->in = std::move(in); lr->K = std::move(K); lr->V = std::move(Vv); lr->fin = std::move(fin);
        lr->f1 = std::move(f1);
      }
      x = std::move(y);
    }
    return pre ? normForward(encFinal, x, eps, rec ? &rec->finalNorm : nullptr) : x;
  }
  /// Backward of encode: dStates [m, D] -> parameter gradients.
  void encodeBackward(const std::vector<int32_t> &src, const EncoderRecord &rec, Matrix dx, GradSink &g) const {
    Pattern all;
    if (pre)
      dx = normBackward(encFinal, rec.finalNorm, dx, g);
    for (size_t l = encoder.size(); l-- > 0;) {
      const EncoderLayer &E = encoder[l];
      const auto &lr = rec.layers[l];
      Matrix dSum2 = residualBackward(E.ffnNorm, lr.n2, dx, g); // d(a + f)
      Matrix dAct = linearBackward(E.ffnOut, activate(lr.f1, act), dSum2, g);
      for (int64_t i = 0; i < dAct.size(); ++i)
        dAct.data()[i] = float(dAct.data()[i] * activationGrad(lr.f1.data()[i], act));
      Matrix da = dSum2 + sublayerInputBackward(E.ffnNorm, lr.n2, linearBackward(E.ffnIn, lr.fin, dAct, g), g);
      Matrix dSum1 = residualBackward(E.attnNorm, lr.n1, da, g); // d(x + att)
      Matrix dK = Matrix::Zero(lr.K.rows(), D), dV = Matrix::Zero(lr.V.rows(), D);
      Matrix dIn = attentionBackward(E.attn, enc.heads, 0, lr.K, lr.V, all, lr.attn, dSum1, dK, dV, g);
      dIn += linearBackward(E.attn.k, lr.in, dK, g) + linearBackward(E.attn.v, lr.in, dV, g);
      dx = dSum1 + sublayerInputBackward(E.attnNorm, lr.n1, dIn, g);
    }
    if (embedNorm)
      dx = normBackward(encNorm, rec.embedNorm, dx, g);
    Matrix &dTok = g.mat(names::embedToken(), V, D), &dPos = g.mat(names::embedPosition(), L, D);
    for (int64_t t = 0; t < dx.rows(); ++t) {
      dTok.row(src[size_t(t)]) += dx.row(t);
      dPos.row(t) += dx.row(t);
    }
  }

  std::vector<double> lengthLogprobs(const Matrix &states, RowVector *mean) const {
    RowVector m = states.colwise().sum() / float(states.rows());
    Eigen::VectorXf logits = lengthW * m.transpose();
    double mx = logits.maxCoeff(), sum = 0;
    for (int64_t i = 0; i < L; ++i)
      sum += std::exp(double(logits[i]) - mx);
    std::vector<double> lp(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i)
      lp[size_t(i)] = double(logits[i]) - mx - std::log(sum);
    if (mean)
      *mean = m;
    return lp;
  }

  // Decoder forward over `rows` query rows with keys given per layer.
  struct DecoderRecord {
    Matrix q0sum; NormRecord q0norm, finalNorm;
    struct Layer {
      Matrix fin, f1; ///< FFN input, FFN hidden (pre-activation)
      AttentionRecord self, cross; NormRecord n1, n2, n3;
    };
    std::vector<Layer> layers;
    Matrix hidden, logprobs;
  };
  Matrix queries(const std::vector<Dir> &dirs, const std::vector<int64_t> &queryPos) const {
    Matrix q(int64_t(dirs.size()), D);
    for (size_t r = 0; r < dirs.size(); ++r) {
      const int d = dirs[r] == Dir::Skip ? 0 : int(dirs[r]);
      q.row(int64_t(r)) = direction.row(d) + (dirs[r] == Dir::L ? posR2L : posL2R).row(queryPos[r]);
    }
    return q;
  }
  /// keys[l], values[l]: [m, D] self-attention keys/values of layer l; crossK/V[l]: [src, D].
  Matrix decode(Matrix x, const std::vector<Matrix> &keys, const std::vector<Matrix> &values,
                const std::vector<Matrix> &crossK, const std::vector<Matrix> &crossV, const Pattern &p,
                DecoderRecord *rec) const {
    if (rec)
      rec->q0sum = x;
    if (embedNorm)
      x = normForward(decNorm, x, eps, rec ? &rec->q0norm : nullptr);
    Pattern all;
    if (rec)
      rec->layers.resize(decoder.size());
    for (size_t l = 0; l < decoder.size(); ++l) {
      const DecoderLayer &Dl = decoder[l];
      auto *lr = rec ? &rec->layers[l] : nullptr;
      Matrix in = sublayerInput(Dl.attnNorm, x, lr ? &lr->n1 : nullptr);
      Matrix s = attentionForward(Dl.self, dec.heads, clip, in, keys[l], values[l], p, lr ? &lr->self : nullptr);
      Matrix a = residual(Dl.attnNorm, x, s, lr ? &lr->n1 : nullptr);
      in = sublayerInput(Dl.crossNorm, a, lr ? &lr->n2 : nullptr);
      Matrix cr = attentionForward(Dl.cross, dec.heads, 0, in, crossK[l], crossV[l], all, lr ? &lr->cross : nullptr);
      Matrix c = residual(Dl.crossNorm, a, cr, lr ? &lr->n2 : nullptr);
      Matrix fin = sublayerInput(Dl.ffnNorm, c, lr ? &lr->n3 : nullptr);
      Matrix f1 = linearForward(Dl.ffnIn, fin);
      Matrix y = residual(Dl.ffnNorm, c, linearForward(Dl.ffnOut, activate(f1, act)), lr ? &lr->n3 : nullptr);
      if (lr) {
        lr->fin = std::move(fin); lr->f1 = std::move(f1);
      }
      x = std::move(y);
    }
    return pre ? normForward(decFinal, x, eps, rec ? &rec->finalNorm : nullptr) : x;
  }
  /// log_softmax(h E^T + bias), per row, sums in double.
  Matrix logSoftmax(const Matrix &h) const {
    Matrix logits = h * token.transpose();
    logits.rowwise() += headBias;
    for (int64_t r = 0; r < logits.rows(); ++r) {
      const double mx = logits.row(r).maxCoeff();
      double sum = 0;
      for (int64_t v = 0; v < V; ++v)
        sum += std::exp(double(logits(r, v)) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t v = 0; v < V; ++v)
        logits(r, v) = float(double(logits(r, v)) - lse);
    }
    return logits;
  }
};

Model::Model(const ModelSpec &spec, const WeightSet &w) : spec_(spec), impl_(new Impl) {
  if (spec.family != Family::Diformer || !spec.diformer) {
    delete impl_;
    throw std::invalid_argument("reference::diformer: the spec is not family \"diformer\"");
  }
  for (const auto &[name, t] : w.tensors)
    shapes_.push_back({name, t.shape});
  Impl &m = *impl_;
  m.V = spec.dims.vocab, m.L = spec.dims.maxLen, m.D = spec.dims.dModel, m.clip = spec.relativePositions;
  m.enc = spec.diformer->encoder, m.dec = spec.diformer->decoder;
  m.eps = spec.eps, m.act = spec.activation, m.embedNorm = spec.embeddingNorm;
  m.pre = spec.norm == NormPlacement::Pre;
  try {
    m.token = toMatrix(w.get(names::embedToken()), names::embedToken(), m.V, m.D);
    m.position = toMatrix(w.get(names::embedPosition()), names::embedPosition(), m.L, m.D);
    m.lengthW = toMatrix(w.get(names::lengthWeight()), names::lengthWeight(), m.L, m.D);
    m.direction = toMatrix(w.get(names::decoderDirection()), names::decoderDirection(), 3, m.D);
    m.posL2R = toMatrix(w.get(names::decoderPositionL2R()), names::decoderPositionL2R(), m.L, m.D);
    m.posR2L = toMatrix(w.get(names::decoderPositionR2L()), names::decoderPositionR2L(), m.L, m.D);
    if (m.embedNorm) {
      m.encNorm = m.norm(w, names::embedNorm());
      m.decNorm = m.norm(w, names::decoderEmbedNorm());
    }
    if (m.pre) {
      m.encFinal = m.norm(w, names::encoderFinalNorm());
      m.decFinal = m.norm(w, names::decoderFinalNorm());
    }
    m.hasHeadBias = spec.headBias;
    m.headBias = spec.headBias ? toRow(w.get(names::headBias()), names::headBias(), m.V) : RowVector::Zero(m.V);
    for (int64_t i = 0; i < m.enc.layers; ++i) {
      const std::string p = names::encoderLayer(i), f = names::ffn(p);
      m.encoder.push_back({m.attention(w, names::attn(p), false, m.enc.heads), m.norm(w, names::attnNorm(p)),
                           m.norm(w, names::ffnNorm(p)), m.linear(w, names::ffnIn(f), m.enc.dFF, m.D),
                           m.linear(w, names::ffnOut(f), m.D, m.enc.dFF)});
    }
    for (int64_t i = 0; i < m.dec.layers; ++i) {
      const std::string p = names::decoderLayer(i), f = names::ffn(p);
      m.decoder.push_back({m.attention(w, names::attn(p), true, m.dec.heads),
                           m.attention(w, names::cross(p), false, m.dec.heads), m.norm(w, names::attnNorm(p)),
                           m.norm(w, names::crossNorm(p)), m.norm(w, names::ffnNorm(p)),
                           m.linear(w, names::ffnIn(f), m.dec.dFF, m.D), m.linear(w, names::ffnOut(f), m.D, m.dec.dFF)});
    }
  } catch (...) {
    delete impl_;
    throw;
  }
}

Model::~Model() { delete impl_; }

Model::Memory Model::encode(const std::vector<int32_t> &src) const {
  Memory mem;
  mem.states = impl_->encode(src, nullptr);
  mem.lengthLogprobs = impl_->lengthLogprobs(mem.states, nullptr);
  for (const DecoderLayer &Dl : impl_->decoder) {
    mem.crossKeys.push_back(linearForward(Dl.cross.k, mem.states));
    mem.crossValues.push_back(linearForward(Dl.cross.v, mem.states));
  }
  return mem;
}

Model::KeyValue Model::keyValue(int32_t tok) const {
  KeyValue kv;
  Matrix e = impl_->token.row(tok);
  for (const DecoderLayer &Dl : impl_->decoder) {
    kv.keys.push_back(linearForward(Dl.self.k, e).row(0));
    kv.values.push_back(linearForward(Dl.self.v, e).row(0));
  }
  return kv;
}

Matrix Model::rowLogprobs(const Memory &memory, const std::vector<const KeyValue *> &keys,
                          const std::vector<Dir> &dirs, const std::vector<int64_t> &queryPos,
                          const std::vector<std::vector<int32_t>> &visible,
                          const std::vector<std::vector<int64_t>> &offsets) const {
  const Impl &m = *impl_;
  std::vector<Matrix> K, Vv;
  for (size_t l = 0; l < m.decoder.size(); ++l) {
    Matrix k(int64_t(keys.size()), m.D), v(int64_t(keys.size()), m.D);
    for (size_t j = 0; j < keys.size(); ++j) {
      k.row(int64_t(j)) = keys[j]->keys[l];
      v.row(int64_t(j)) = keys[j]->values[l];
    }
    K.push_back(std::move(k));
    Vv.push_back(std::move(v));
  }
  Pattern p{false, visible, offsets};
  Matrix h = m.decode(m.queries(dirs, queryPos), K, Vv, memory.crossKeys, memory.crossValues, p, nullptr);
  return m.logSoftmax(h);
}

namespace {

/// The target each row predicts, or -1 for '-'.
int32_t targetOf(const Example &e, size_t i) {
  switch (e.dirs[i]) {
  case Dir::R: return e.tgt[i + 1];
  case Dir::L: return e.tgt[i - 1];
  case Dir::S: return e.tgt[i];
  case Dir::Skip: break;
  }
  return -1;
}

/// The computed rows of an example (every row not '-') with their visibility and offsets.
struct Rows {
  std::vector<int64_t> index, queryPos;
  std::vector<Dir> dirs;
  Pattern pattern{false, {}, {}};
};
Rows rowsOf(const Example &e) {
  Rows r;
  const int64_t n = int64_t(e.tgt.size());
  for (int64_t i = 0; i < n; ++i) {
    const Dir d = e.dirs[size_t(i)];
    if (d == Dir::Skip)
      continue;
    std::vector<int32_t> vis;
    std::vector<int64_t> off;
    for (int64_t j = 0; j < n; ++j) {
      bool v = d == Dir::R ? j <= i : d == Dir::L ? j >= i : j != i;
      if (v && d == Dir::S)
        for (int32_t hdn : e.hidden[size_t(i)])
          v = v && hdn != j;
      if (v) {
        vis.push_back(int32_t(j));
        off.push_back(j - i);
      }
    }
    r.index.push_back(i);
    r.queryPos.push_back(d == Dir::L ? n - 1 - i : i);
    r.dirs.push_back(d);
    r.pattern.visible.push_back(std::move(vis));
    r.pattern.offsets.push_back(std::move(off));
  }
  return r;
}

} // namespace

Score Model::score(const Example &e) const {
  const Impl &m = *impl_;
  Memory mem = encode(e.src);
  const int64_t n = int64_t(e.tgt.size());
  Score s;
  s.tokenLogprobs.assign(size_t(n), 0.0f);
  s.lengthLogprob = mem.lengthLogprobs[size_t(n)];
  Rows rows = rowsOf(e);
  if (rows.index.empty())
    return s;
  Matrix words(n, m.D);
  for (int64_t j = 0; j < n; ++j)
    words.row(j) = m.token.row(e.tgt[size_t(j)]);
  std::vector<Matrix> K, Vv;
  for (const DecoderLayer &Dl : m.decoder) {
    K.push_back(linearForward(Dl.self.k, words));
    Vv.push_back(linearForward(Dl.self.v, words));
  }
  Matrix h = m.decode(m.queries(rows.dirs, rows.queryPos), K, Vv, mem.crossKeys, mem.crossValues, rows.pattern, nullptr);
  Matrix lp = m.logSoftmax(h);
  for (size_t r = 0; r < rows.index.size(); ++r) {
    const size_t i = size_t(rows.index[r]);
    s.tokenLogprobs[i] = lp(int64_t(r), targetOf(e, i));
    s.score += s.tokenLogprobs[i];
    ++s.nScored;
  }
  return s;
}

Model::Pieces Model::accumulateGrad(const Example &e, double tokenScale, double lengthScale, WeightSet &grads) const {
  const Impl &m = *impl_;
  GradSink g{grads, {}, {}};
  Pieces out;
  Impl::EncoderRecord erec;
  Matrix mem = m.encode(e.src, &erec);
  RowVector mean;
  std::vector<double> lenLp = m.lengthLogprobs(mem, &mean);
  const int64_t n = int64_t(e.tgt.size()), S = mem.rows();
  out.lengthNll = -lenLp[size_t(n)];
  Matrix dMem = Matrix::Zero(S, m.D);
  { // length head: d/dlogits of -log softmax[n] = p - onehot(n), scaled
    Eigen::VectorXf dLogits(m.L);
    for (int64_t i = 0; i < m.L; ++i)
      dLogits[i] = float(lengthScale * (std::exp(lenLp[size_t(i)]) - (i == n ? 1.0 : 0.0)));
    g.mat(names::lengthWeight(), m.L, m.D).noalias() += dLogits * mean;
    RowVector dMean = dLogits.transpose() * m.lengthW;
    dMem.rowwise() += dMean / float(S);
  }
  Rows rows = rowsOf(e);
  if (!rows.index.empty()) {
    Matrix words(n, m.D);
    for (int64_t j = 0; j < n; ++j)
      words.row(j) = m.token.row(e.tgt[size_t(j)]);
    std::vector<Matrix> K, Vv, Kc, Vc;
    for (const DecoderLayer &Dl : m.decoder) {
      K.push_back(linearForward(Dl.self.k, words));
      Vv.push_back(linearForward(Dl.self.v, words));
      Kc.push_back(linearForward(Dl.cross.k, mem));
      Vc.push_back(linearForward(Dl.cross.v, mem));
    }
    Impl::DecoderRecord drec;
    Matrix h = m.decode(m.queries(rows.dirs, rows.queryPos), K, Vv, Kc, Vc, rows.pattern, &drec);
    Matrix lp = m.logSoftmax(h);
    // d(-sum log p(tau)) / dlogits = softmax - onehot, scaled.
    Matrix dLogits(lp.rows(), m.V);
    for (int64_t r = 0; r < lp.rows(); ++r) {
      const int32_t tau = targetOf(e, size_t(rows.index[size_t(r)]));
      out.tokenNll -= lp(r, tau);
      for (int64_t v = 0; v < m.V; ++v)
        dLogits(r, v) = float(tokenScale * (std::exp(double(lp(r, v))) - (v == tau ? 1.0 : 0.0)));
    }
    Matrix &dTok = g.mat(names::embedToken(), m.V, m.D);
    dTok.noalias() += dLogits.transpose() * h;
    if (m.hasHeadBias)
      g.row(names::headBias(), m.V) += dLogits.colwise().sum();
    Matrix dx = dLogits * m.token;
    if (m.pre)
      dx = normBackward(m.decFinal, drec.finalNorm, dx, g);
    Matrix dWords = Matrix::Zero(n, m.D);
    Pattern all;
    for (size_t l = m.decoder.size(); l-- > 0;) {
      const DecoderLayer &Dl = m.decoder[l];
      const auto &lr = drec.layers[l];
      Matrix dSum3 = m.residualBackward(Dl.ffnNorm, lr.n3, dx, g); // d(c + f)
      Matrix dAct = linearBackward(Dl.ffnOut, activate(lr.f1, m.act), dSum3, g);
      for (int64_t i = 0; i < dAct.size(); ++i)
        dAct.data()[i] = float(dAct.data()[i] * activationGrad(lr.f1.data()[i], m.act));
      Matrix dc = dSum3 + m.sublayerInputBackward(Dl.ffnNorm, lr.n3, linearBackward(Dl.ffnIn, lr.fin, dAct, g), g);
      Matrix dSum2 = m.residualBackward(Dl.crossNorm, lr.n2, dc, g); // d(a + cross)
      Matrix dKc = Matrix::Zero(S, m.D), dVc = Matrix::Zero(S, m.D);
      Matrix dCross = attentionBackward(Dl.cross, m.dec.heads, 0, Kc[l], Vc[l], all, lr.cross, dSum2, dKc, dVc, g);
      Matrix da = dSum2 + m.sublayerInputBackward(Dl.crossNorm, lr.n2, dCross, g);
      dMem += linearBackward(Dl.cross.k, mem, dKc, g) + linearBackward(Dl.cross.v, mem, dVc, g);
      Matrix dSum1 = m.residualBackward(Dl.attnNorm, lr.n1, da, g); // d(x + self)
      Matrix dK = Matrix::Zero(n, m.D), dV = Matrix::Zero(n, m.D);
      Matrix dSelf = attentionBackward(Dl.self, m.dec.heads, m.clip, K[l], Vv[l], rows.pattern, lr.self, dSum1, dK, dV, g);
      dx = dSum1 + m.sublayerInputBackward(Dl.attnNorm, lr.n1, dSelf, g);
      dWords += linearBackward(Dl.self.k, words, dK, g) + linearBackward(Dl.self.v, words, dV, g);
    }
    if (m.embedNorm)
      dx = normBackward(m.decNorm, drec.q0norm, dx, g);
    Matrix &dDir = g.mat(names::decoderDirection(), 3, m.D);
    Matrix &dL2R = g.mat(names::decoderPositionL2R(), m.L, m.D), &dR2L = g.mat(names::decoderPositionR2L(), m.L, m.D);
    for (size_t r = 0; r < rows.index.size(); ++r) {
      dDir.row(int(rows.dirs[r])) += dx.row(int64_t(r));
      (rows.dirs[r] == Dir::L ? dR2L : dL2R).row(rows.queryPos[r]) += dx.row(int64_t(r));
    }
    for (int64_t j = 0; j < n; ++j)
      dTok.row(e.tgt[size_t(j)]) += dWords.row(j);
  }
  m.encodeBackward(e.src, erec, dMem, g);
  g.flush();
  return out;
}

// --- parsing and validation ------------------------------------------------------------

char letter(Dir d) { return "RLS-"[int(d)]; }

std::vector<Dir> parseDirections(const std::string &text, int64_t n) {
  std::vector<Dir> dirs;
  if (text == "l2r" || text == "r2l" || text == "pll") {
    if (n < 2)
      throw std::invalid_argument("DIRS needs a target of at least 2 tokens (bos, eos)");
    const Dir fill = text == "l2r" ? Dir::R : text == "r2l" ? Dir::L : Dir::S;
    dirs.assign(size_t(n), fill);
    if (text != "l2r")
      dirs.front() = Dir::Skip;
    if (text != "r2l")
      dirs.back() = Dir::Skip;
    return dirs;
  }
  for (char c : text) {
    switch (c) {
    case 'R': dirs.push_back(Dir::R); break;
    case 'L': dirs.push_back(Dir::L); break;
    case 'S': dirs.push_back(Dir::S); break;
    case '-': dirs.push_back(Dir::Skip); break;
    default:
      throw std::invalid_argument(std::string("DIRS: '") + c + "' is not a direction (R, L, S, -, or l2r / r2l / pll)");
    }
  }
  if (int64_t(dirs.size()) != n)
    throw std::invalid_argument("DIRS has " + std::to_string(dirs.size()) + " letters for a target of " +
                                std::to_string(n) + " tokens");
  if (dirs.front() != Dir::R && dirs.front() != Dir::Skip)
    throw std::invalid_argument(std::string("DIRS: z_0 must be R or - (row 0 has no left neighbour to predict), got ") +
                                letter(dirs.front()));
  if (dirs.back() != Dir::L && dirs.back() != Dir::Skip)
    throw std::invalid_argument(std::string("DIRS: z_{n-1} must be L or - (the last row has no right neighbour to "
                                            "predict), got ") + letter(dirs.back()));
  return dirs;
}

void validateExample(const ModelSpec &spec, const Example &e, const std::string &where) {
  auto fail = [&](const std::string &what) { throw std::invalid_argument(where + ": " + what); };
  const int64_t n = int64_t(e.tgt.size()), V = spec.dims.vocab, L = spec.dims.maxLen;
  if (e.src.empty() || int64_t(e.src.size()) > L)
    fail("source of " + std::to_string(e.src.size()) + " tokens: must hold 1..max_len = " + std::to_string(L));
  if (n < 2 || n >= L)
    fail("target of " + std::to_string(n) + " tokens: must hold 2..max_len-1 = " + std::to_string(L - 1) +
         " (bos .. eos; the length head predicts n < max_len)");
  for (auto [what, ids] : {std::pair<const char *, const std::vector<int32_t> *>{"source", &e.src}, {"target", &e.tgt}})
    for (size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (*ids)[i] >= V)
        fail(std::string(what) + " position " + std::to_string(i) + ": id " + std::to_string((*ids)[i]) +
             " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (e.tgt.front() != spec.tokens.bos || e.tgt.back() != spec.tokens.eos)
    fail("the target must start with bos (" + std::to_string(spec.tokens.bos) + ") and end with eos (" +
         std::to_string(spec.tokens.eos) + ")");
  if (int64_t(e.dirs.size()) != n || int64_t(e.hidden.size()) != n)
    fail("directions and hidden sets need one entry per target position");
  if (e.dirs.front() != Dir::R && e.dirs.front() != Dir::Skip)
    fail(std::string("z_0 must be R or -, got ") + letter(e.dirs.front()));
  if (e.dirs.back() != Dir::L && e.dirs.back() != Dir::Skip)
    fail(std::string("z_{n-1} must be L or -, got ") + letter(e.dirs.back()));
  for (int64_t i = 0; i < n; ++i)
    for (int32_t h : e.hidden[size_t(i)]) {
      if (e.dirs[size_t(i)] != Dir::S)
        fail("row " + std::to_string(i) + " (" + letter(e.dirs[size_t(i)]) + ") has a hidden set; only S rows hide keys");
      if (h < 1 || h > n - 2)
        fail("row " + std::to_string(i) + ": hidden position " + std::to_string(h) + " is outside 1..n-2 = 1.." +
             std::to_string(n - 2) + " (bos and eos are never hidden)");
    }
}

std::vector<Score> score(const ModelSpec &spec, const WeightSet &weights, const std::vector<Example> &examples,
                         int threads) {
  Model model(spec, weights);
  std::vector<Score> out(examples.size());
  tbb::task_arena arena(threads <= 0 ? tbb::task_arena::automatic : threads);
  arena.execute([&] {
    tbb::parallel_for(size_t(0), examples.size(), [&](size_t b) { out[b] = model.score(examples[b]); });
  });
  return out;
}

namespace {
/// Uniform [0, 1) draw of the directional objective: a function of the seed, step, sentence,
/// row and purpose (Philox4x32-10).
double uniform(uint64_t seed, uint64_t step, uint32_t sentence, uint32_t row, uint32_t purpose, uint32_t k = 0) {
  const std::array<uint32_t, 4> w = train::philox4x32({row, k, sentence, uint32_t(step)},
                                                      {uint32_t(seed), 0xD1F00000u | purpose});
  return double(w[0]) * (1.0 / 4294967296.0);
}

/// The directional objective's draw for one pair: z_0 = R, z_{n-1} = L, other rows uniform over
/// {R, L, S}; an S row hides a uniform subset of c_i ~ U{0..n-3} other content positions.
} // namespace

void drawDirections(Example &e, uint64_t seed, uint64_t step, uint32_t sentence) {
  const int64_t n = int64_t(e.tgt.size());
  e.dirs.assign(size_t(n), Dir::R);
  e.hidden.assign(size_t(n), {});
  e.dirs.back() = Dir::L;
  for (int64_t i = 1; i + 1 < n; ++i) {
    const int pick = std::min(2, int(uniform(seed, step, sentence, uint32_t(i), 0) * 3));
    e.dirs[size_t(i)] = Dir(pick);
    if (e.dirs[size_t(i)] != Dir::S)
      continue;
    std::vector<int32_t> others;
    for (int64_t j = 1; j + 1 < n; ++j)
      if (j != i)
        others.push_back(int32_t(j));
    const int64_t c = std::min<int64_t>(int64_t(others.size()),
                                        int64_t(uniform(seed, step, sentence, uint32_t(i), 1) * double(others.size() + 1)));
    for (int64_t k = 0; k < c; ++k) { // partial Fisher-Yates
      const int64_t r = k + std::min<int64_t>(int64_t(others.size()) - 1 - k,
                                              int64_t(uniform(seed, step, sentence, uint32_t(i), 2, uint32_t(k)) *
                                                      double(others.size() - k)));
      std::swap(others[size_t(k)], others[size_t(r)]);
    }
    others.resize(size_t(c));
    std::sort(others.begin(), others.end());
    e.hidden[size_t(i)] = std::move(others);
  }
}

LossAndGrad lossAndGrad(const ModelSpec &spec, const Model &model, const std::vector<Example> &examples,
                        int threads) {
  if (examples.empty())
    throw std::invalid_argument("reference::diformer::lossAndGrad: empty batch");
  LossAndGrad r;
  for (const Example &e : examples)
    r.tokens += int64_t(e.tgt.size());
  const double lengthLoss = spec.diformer->lengthLoss, B = double(examples.size());
  // Every canonical tensor, zero; contributions are added sentence by sentence, in order.
  for (const auto &[name, shape] : model.gradShapes()) {
    Tensor t;
    t.shape = shape;
    t.data.assign(size_t(std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>())), 0.0f);
    r.grads.tensors.emplace(name, std::move(t));
  }
  if (threads == 1) {
    for (const Example &e : examples) {
      Model::Pieces p = model.accumulateGrad(e, 1.0 / double(r.tokens), lengthLoss / B, r.grads);
      r.tokenNll += p.tokenNll;
      r.lengthNll += p.lengthNll;
    }
  } else {
    // Chunks of sentences in parallel, each into its own zero gradient (0 + x is exact), then added in
    // sentence order: bit-identical to the sequential loop for any thread count.
    tbb::task_arena arena(threads <= 0 ? tbb::task_arena::automatic : threads);
    const size_t chunk = size_t(arena.max_concurrency());
    for (size_t first = 0; first < examples.size(); first += chunk) {
      const size_t count = std::min(chunk, examples.size() - first);
      std::vector<WeightSet> local(count);
      std::vector<Model::Pieces> pieces(count);
      for (WeightSet &w : local)
        for (const auto &[name, t] : r.grads.tensors)
          w.tensors.emplace(name, Tensor{t.shape, std::vector<float>(t.data.size(), 0.0f)});
      arena.execute([&] {
        tbb::parallel_for(size_t(0), count, [&](size_t k) {
          pieces[k] = model.accumulateGrad(examples[first + k], 1.0 / double(r.tokens), lengthLoss / B, local[k]);
        });
      });
      for (size_t k = 0; k < count; ++k) {
        for (auto &[name, t] : r.grads.tensors) {
          const std::vector<float> &add = local[k].tensors.at(name).data;
          for (size_t i = 0; i < add.size(); ++i)
            t.data[i] += add[i];
        }
        r.tokenNll += pieces[k].tokenNll;
        r.lengthNll += pieces[k].lengthNll;
      }
    }
  }
  r.loss = r.tokenNll / double(r.tokens) + lengthLoss * r.lengthNll / B;
  return r;
}

} // namespace lmcc::reference::diformer
