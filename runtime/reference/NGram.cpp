//===- NGram.cpp - Reference ops of the n-gram heads (issue 18) -----------===//
#include "runtime/reference/NGram.h"

namespace lmcc::reference {

namespace {
int64_t binomial(int64_t n, int64_t k) {
  int64_t c = 1;
  for (int64_t i = 1; i <= k; ++i)
    c = c * (n - k + i) / i;
  return c;
}
} // namespace

Batch wdrConjugate(const Matrix &table, const TokenBatch &ids, int64_t head) {
  Batch out = Batch::zeros(ids.lengths, 1, ids.N, table.cols());
  for (int64_t b = 0; b < ids.B; ++b)
    for (int64_t s = 0; s < ids.lengths[b]; ++s) {
      float *row = out.row(b, 0, s);
      for (int64_t i = 1; i < head; ++i) {
        const int64_t pos = s + head - i;
        if (pos >= ids.lengths[b])
          continue;
        const float coef = float((i % 2 ? 1 : -1) * binomial(head - 1, i));
        const float *w = table.row(ids.at(b, pos)).data();
        for (int64_t c = 0; c < table.cols(); ++c)
          row[c] += coef * w[c];
      }
    }
  return out;
}

Batch ngramEnsembleLogits(const std::vector<Batch> &z, double lambda) {
  const Batch &z1 = z.front();
  const int64_t n = int64_t(z.size());
  Batch out = Batch::zerosLike(z1, z1.C);
  for (int64_t b = 0; b < z1.B; ++b)
    for (int64_t p = 1; p < z1.lengths[b]; ++p) {
      float *row = out.row(b, 0, p);
      const float *main = z1.row(b, 0, p - 1);
      for (int64_t v = 0; v < z1.C; ++v) {
        double acc = (1 - lambda) * main[v];
        for (int64_t j = 2; j <= n; ++j)
          acc += lambda / double(n - 1) * (p >= j ? z[j - 1].row(b, 0, p - j)[v] : main[v]);
        row[v] = float(acc);
      }
    }
  return out;
}

TokenBatch shiftTargets(const TokenBatch &targets, int64_t shift) {
  TokenBatch y = targets;
  for (int64_t b = 0; b < y.B; ++b)
    for (int64_t s = 0; s < y.lengths[b]; ++s)
      y.at(b, s) = s + shift < y.lengths[b] ? targets.at(b, s + shift) : -1;
  return y;
}

} // namespace lmcc::reference
