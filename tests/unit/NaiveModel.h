//===- NaiveModel.h - A double-precision model for the tests, written from the contract ===//
//
// uniLM, biLM and T-TA's forward in plain loops over double, from runtime/SEMANTICS.md and issue 14's contract
// (attention dropout's Philox draws included), independently of runtime/reference (Ops.cpp, Executor.cpp) and of
// the compiled pipeline: the oracle of ReferenceTest's whole-model scores and of GradTest's finite differences.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/weights/Safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace lmcc::naive {

using Vec = std::vector<double>;
using Rows = std::vector<Vec>;

/// Whether query row i sees key j under a structural mask (key padding aside).
inline bool visible(MaskKind kind, int64_t i, int64_t j) {
  switch (kind) {
  case MaskKind::Causal:
    return j <= i;
  case MaskKind::Anticausal:
    return j >= i;
  case MaskKind::Diagonal:
    return j != i;
  default:
    return true;
  }
}

class NaiveModel {
public:
  /// `w` (the weights in double, naiveWeights) is read at every call: a caller may change its values in between.
  NaiveModel(const ModelSpec &s, const std::map<std::string, Vec> &w) : s(s), w(w) {}

  /// Sentence x's last hidden states; b (the sentence's index in its batch) keys the attention dropout masks.
  Rows hidden(const std::vector<int32_t> &x, int64_t b = 0) const {
    const int64_t n = static_cast<int64_t>(x.size()), D = s.dims.dModel;
    Rows P(n, Vec(D, 0.0));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < D; ++c) {
        if (s.position == PositionKind::Learned)
          P[t][c] = W("embed.position")[t * D + c];
        else if (s.position == PositionKind::Sinusoidal) {
          double angle = t / std::pow(10000.0, (c - c % 2) / static_cast<double>(D));
          P[t][c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
        }
      }
    const Vec &E = W("embed.token");
    auto embedPlusP = [&](auto idOf) {
      Rows r(n, Vec(D));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < D; ++c)
          r[t][c] = E[idOf(t) * D + c] + P[t][c];
      return normE(r);
    };
    Rows X = embedPlusP([&](int64_t t) { return x[t]; });
    Rows h = s.firstQuery == FirstQuery::Embedding  ? X
             : s.firstQuery == FirstQuery::Position ? normE(P)
                                                    : embedPlusP([&](int64_t) { return s.tokens.mask; });
    for (int64_t i = 0; i < s.dims.layers; ++i) {
      std::string p = "layers." + std::to_string(i) + ".";
      bool hid = s.keysValues == KeyValueSource::Hidden;
      if (s.norm == NormPlacement::Post) {
        Rows a = ln(plus(h, attention(p, h, hid ? h : X, b, i)), p + "attn_norm");
        h = ln(plus(a, ffn(p, a)), p + "ffn_norm");
      } else {
        Rows q = ln(h, p + "attn_norm");
        Rows a = plus(h, attention(p, q, hid ? q : X, b, i));
        h = plus(a, ffn(p, ln(a, p + "ffn_norm")));
      }
    }
    return s.norm == NormPlacement::Pre ? ln(h, "final_norm") : h;
  }

  /// Log-probabilities over the vocabulary of every row of h.
  Rows logprobs(const Rows &h) const {
    Rows t = s.headTransform ? ln(act(lin(h, "head.transform")), "head.norm") : h;
    const Vec &out = W(s.tied ? "embed.token" : "head.output.weight");
    const int64_t D = s.dims.dModel;
    Rows lp;
    for (const auto &row : t) {
      Vec logits(s.dims.vocab);
      for (int64_t v = 0; v < s.dims.vocab; ++v) {
        double z = s.headBias ? W("head.bias")[v] : 0.0;
        for (int64_t c = 0; c < D; ++c)
          z += row[c] * out[v * D + c];
        logits[v] = z;
      }
      double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
      for (double z : logits)
        sum += std::exp(z - m);
      for (double &z : logits)
        z -= m + std::log(sum);
      lp.push_back(logits);
    }
    return lp;
  }

private:
  const Vec &W(const std::string &name) const { return w.at(name); }
  Rows plus(const Rows &a, const Rows &b) const {
    Rows r = a;
    for (size_t i = 0; i < r.size(); ++i)
      for (size_t c = 0; c < r[i].size(); ++c)
        r[i][c] += b[i][c];
    return r;
  }
  Rows lin(const Rows &x, const std::string &p) const {
    const Vec &Wt = W(p + ".weight"), &bias = W(p + ".bias");
    const size_t out = bias.size(), in = x.empty() ? 0 : x[0].size();
    Rows y;
    for (const auto &row : x) {
      Vec o(out);
      for (size_t r = 0; r < out; ++r) {
        o[r] = bias[r];
        for (size_t c = 0; c < in; ++c)
          o[r] += Wt[r * in + c] * row[c];
      }
      y.push_back(o);
    }
    return y;
  }
  Rows ln(const Rows &x, const std::string &p) const {
    const Vec &g = W(p + ".weight"), &bb = W(p + ".bias");
    Rows y = x;
    for (auto &row : y) {
      double mean = 0, var = 0;
      for (double v : row)
        mean += v / row.size();
      for (double v : row)
        var += (v - mean) * (v - mean) / row.size();
      for (size_t c = 0; c < row.size(); ++c)
        row[c] = (row[c] - mean) / std::sqrt(var + s.eps) * g[c] + bb[c];
    }
    return y;
  }
  Rows normE(const Rows &x) const { return s.embeddingNorm ? ln(x, "embed.norm") : x; }
  Rows act(Rows x) const {
    for (auto &row : x)
      for (double &v : row) {
        if (s.activation == Activation::Gelu)
          v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        else if (s.activation == Activation::GeluTanh)
          v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) * (v + 0.044715 * v * v * v)));
        else
          v = std::max(v, 0.0);
      }
    return x;
  }
  Rows ffn(const std::string &p, const Rows &x) const { return lin(act(lin(x, p + "ffn.in")), p + "ffn.out"); }
  /// [train] attention_dropout's keep/(1 - rate) factor of probability (sentence b, head h, row i, key j) of layer
  /// `layer` at step 0, from the contract (runtime/train/Philox.h): Philox4x32-10 of counter
  /// {i, j, b H + h, 0} and key {seed, 0xD0000000 | (2^20 + layer)}, kept iff its first word / 2^32 >= rate.
  double probabilityFactor(int64_t b, int64_t h, int64_t i, int64_t j, int64_t layer) const {
    const double rate = s.train.attentionDropout;
    if (rate <= 0)
      return 1.0;
    const uint32_t counter[4] = {uint32_t(i), uint32_t(j), uint32_t(b * s.dims.heads + h), 0};
    const uint32_t key[2] = {uint32_t(s.train.seed), 0xD0000000u | uint32_t((1 << 20) + layer)};
    const uint32_t w0 = philox4x32_10(counter, key);
    return double(w0) / 4294967296.0 >= rate ? 1.0 / (1.0 - rate) : 0.0;
  }
  /// Random123's philox4x32-10, first output word.
  static uint32_t philox4x32_10(const uint32_t in[4], const uint32_t k[2]) {
    uint32_t c[4] = {in[0], in[1], in[2], in[3]}, k0 = k[0], k1 = k[1];
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
      const uint32_t next[4] = {uint32_t(p1 >> 32) ^ c[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k1,
                                uint32_t(p0)};
      std::memcpy(c, next, sizeof c);
      k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    return c[0];
  }

  Rows attention(const std::string &p, const Rows &qIn, const Rows &kvIn, int64_t b, int64_t layer) const {
    Rows Q = lin(qIn, p + "attn.q"), K = lin(kvIn, p + "attn.k"), V = lin(kvIn, p + "attn.v");
    const int64_t n = static_cast<int64_t>(Q.size()), H = s.dims.heads, dh = s.dims.headDim();
    const int64_t k = s.relativePositions;
    const Vec *relK = k > 0 ? &W(p + "attn.rel_k") : nullptr, *relV = k > 0 ? &W(p + "attn.rel_v") : nullptr;
    Rows ctx(n, Vec(s.dims.dModel, 0.0));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        Vec score(n, 0.0);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (!visible(s.mask, i, j))
            continue;
          int64_t r = std::clamp<int64_t>(j - i, -k, k) + k;
          for (int64_t c = 0; c < dh; ++c)
            score[j] += Q[i][h * dh + c] * (K[j][h * dh + c] + (relK ? (*relK)[r * dh + c] : 0.0));
          score[j] /= std::sqrt(static_cast<double>(dh));
          m = std::max(m, score[j]);
        }
        if (m == -INFINITY)
          continue;
        double sum = 0;
        for (int64_t j = 0; j < n; ++j)
          sum += visible(s.mask, i, j) ? std::exp(score[j] - m) : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          if (!visible(s.mask, i, j))
            continue;
          double pij = std::exp(score[j] - m) / sum * probabilityFactor(b, h, i, j, layer);
          int64_t r = std::clamp<int64_t>(j - i, -k, k) + k;
          for (int64_t c = 0; c < dh; ++c)
            ctx[i][h * dh + c] += pij * (V[j][h * dh + c] + (relV ? (*relV)[r * dh + c] : 0.0));
        }
      }
    return lin(ctx, p + "attn.o");
  }

  const ModelSpec &s;
  const std::map<std::string, Vec> &w;
};

/// The weights in double, by canonical name (NaiveModel's input).
inline std::map<std::string, Vec> naiveWeights(const WeightSet &w) {
  std::map<std::string, Vec> out;
  for (const auto &[name, t] : w.tensors)
    out[name] = Vec(t.data.begin(), t.data.end());
  return out;
}

} // namespace lmcc::naive
