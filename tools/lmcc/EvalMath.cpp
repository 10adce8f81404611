//===- EvalMath.cpp - The arithmetic of lmcc sts / blimp / rerank ---------===//
#include "tools/lmcc/EvalMath.h"

#include "runtime/lib/Tokenizer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace lmcc::cli {

std::vector<int32_t> wordSpans(const Tokenizer &tok, const std::vector<int32_t> &ids) {
  const SpecialIds &sp = tok.specials();
  auto special = [&](int32_t id) {
    return id == sp.pad || id == sp.eos || id == sp.unk || id == sp.bos || id == sp.mask;
  };
  auto continues = [&](size_t i) {
    return i > 0 && !special(ids[i]) && !special(ids[i - 1]) && tok.piece(ids[i]).rfind("##", 0) == 0;
  };
  std::vector<int32_t> spans(ids.size());
  for (size_t i = ids.size(); i-- > 0;) // a word ends where the next piece does not continue it
    spans[i] = i + 1 < ids.size() && continues(i + 1) ? spans[i + 1] : int32_t(i + 1);
  return spans;
}

bool originalSpans(const std::vector<int32_t> &spans) {
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i] != int32_t(i + 1))
      return false;
  return true;
}

double cosine(const std::vector<float> &a, const std::vector<float> &b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

double pearson(const std::vector<double> &x, const std::vector<double> &y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2)
    return std::nan("");
  // Each series divided by its largest magnitude, centred, and divided by its largest deviation: every sum below
  // stays within n, so gold scores of 1e300 (whose squares overflow) or 1e-300 (whose squares underflow) give the
  // correlation of the same numbers at any scale. Empty: every value equal (or none finite).
  auto standardized = [n](const std::vector<double> &v) {
    double scale = 0;
    for (size_t i = 0; i < n; ++i)
      scale = std::max(scale, std::fabs(v[i]));
    std::vector<double> u(n);
    if (!(scale > 0) || !std::isfinite(scale))
      return std::vector<double>();
    double mean = 0;
    for (size_t i = 0; i < n; ++i)
      mean += (u[i] = v[i] / scale);
    mean /= double(n);
    double spread = 0;
    for (double &a : u)
      spread = std::max(spread, std::fabs(a -= mean));
    if (!(spread > 0))
      return std::vector<double>();
    for (double &a : u)
      a /= spread;
    return u;
  };
  const std::vector<double> a = standardized(x), b = standardized(y);
  if (a.empty() || b.empty())
    return std::nan("");
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += a[i] * b[i];
    saa += a[i] * a[i];
    sbb += b[i] * b[i];
  }
  return sab / std::sqrt(saa * sbb);
}

std::vector<double> averageRanks(const std::vector<double> &x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> ranks(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]])
      ++j;
    const double rank = (double(i) + double(j)) / 2 + 1; // the mean of ranks i+1 .. j+1
    for (size_t k = i; k <= j; ++k)
      ranks[order[k]] = rank;
    i = j + 1;
  }
  return ranks;
}

double spearman(const std::vector<double> &x, const std::vector<double> &y) {
  return pearson(averageRanks(x), averageRanks(y));
}

std::vector<std::string_view> splitWords(std::string_view text) {
  std::vector<std::string_view> words;
  const char *space = " \t\n\r\f\v";
  for (size_t pos = text.find_first_not_of(space); pos != std::string_view::npos;
       pos = text.find_first_not_of(space, pos)) {
    size_t end = text.find_first_of(space, pos);
    if (end == std::string_view::npos)
      end = text.size();
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return words;
}

int64_t wordEditDistance(const std::vector<std::string_view> &ref, const std::vector<std::string_view> &hyp) {
  std::vector<int64_t> row(hyp.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= ref.size(); ++i) {
    int64_t diag = row[0];
    row[0] = int64_t(i);
    for (size_t j = 1; j <= hyp.size(); ++j) {
      const int64_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (ref[i - 1] == hyp[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[hyp.size()];
}

} // namespace lmcc::cli
