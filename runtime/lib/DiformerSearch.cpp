//===- DiformerSearch.cpp - L2R/R2L beam, mask-predict, easy-first, rerank ---===//
#include "runtime/lib/DiformerSearch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace lmcc::decode {

namespace {

/// Content ids a decoder may emit: everything but pad, bos and mask (eos only ends AR search).
bool emittable(const Tokens &t, int32_t id) { return id != t.pad && id != t.bos && id != t.mask; }

struct Hyp {
  std::vector<int32_t> tokens; ///< in generation order (l2r: bos first; r2l: eos first)
  double logprob = 0;
};

/// Beam search in one direction; every live hypothesis has the same length, so one step is one batch.
std::vector<Translation> beamSearch(Decoder &decoder, const Tokens &tk, const Options &o, bool leftToRight) {
  const int32_t start = leftToRight ? tk.bos : tk.eos, stop = leftToRight ? tk.eos : tk.bos;
  const int64_t maxTarget = o.maxTarget > 0 ? std::min(o.maxTarget, tk.maxLen - 1) : tk.maxLen - 1;
  const int64_t V = tk.vocab;
  std::vector<Hyp> live{{{start}, 0.0}};
  std::vector<Translation> finished;
  while (!live.empty() && int64_t(finished.size()) < o.beam) {
    std::vector<std::vector<int32_t>> targets;
    for (const Hyp &h : live) {
      targets.push_back(h.tokens);
      if (!leftToRight)
        std::reverse(targets.back().begin(), targets.back().end());
    }
    const std::vector<float> lp = decoder.step(targets, leftToRight);
    struct Cand {
      double logprob;
      size_t hyp;
      int32_t token;
    };
    std::vector<Cand> cands;
    for (size_t r = 0; r < live.size(); ++r) {
      const bool mustStop = int64_t(live[r].tokens.size()) + 1 >= maxTarget;
      for (int32_t v = 0; v < int32_t(V); ++v) {
        if (v != stop && (mustStop || !emittable(tk, v) || v == start))
          continue;
        cands.push_back({live[r].logprob + double(lp[r * size_t(V) + size_t(v)]), r, v});
      }
    }
    const size_t keep = std::min(cands.size(), size_t(o.beam));
    std::partial_sort(cands.begin(), cands.begin() + keep, cands.end(),
                      [](const Cand &a, const Cand &b) { return a.logprob > b.logprob; });
    std::vector<Hyp> next;
    for (size_t c = 0; c < keep; ++c) {
      Hyp h{live[cands[c].hyp].tokens, cands[c].logprob};
      h.tokens.push_back(cands[c].token);
      if (cands[c].token == stop) {
        Translation t;
        t.tgt = h.tokens;
        if (!leftToRight)
          std::reverse(t.tgt.begin(), t.tgt.end());
        t.score = h.logprob / double(h.tokens.size() - 1);
        finished.push_back(std::move(t));
      } else {
        next.push_back(std::move(h));
      }
    }
    live = std::move(next);
  }
  return finished;
}

/// One parallel pass: per row of `rows`, the argmax content token (not eos) and its log-probability.
void predictRows(Decoder &decoder, const Tokens &tk, const std::vector<int32_t> &tokens,
                 const std::vector<int64_t> &rows, const std::vector<std::vector<bool>> &hidden,
                 std::vector<int32_t> &outTok, std::vector<double> &outLp) {
  const std::vector<float> lp = decoder.predict(tokens, rows, hidden);
  const size_t V = size_t(tk.vocab);
  outTok.assign(rows.size(), 0);
  outLp.assign(rows.size(), 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    double best = -INFINITY;
    int32_t arg = tk.unk;
    for (int32_t v = 0; v < int32_t(V); ++v)
      if (emittable(tk, v) && v != tk.eos && lp[r * V + size_t(v)] > best)
        best = lp[r * V + size_t(v)], arg = v;
    outTok[r] = arg;
    outLp[r] = best;
  }
}

/// Mask-predict or easy-first refinement of one length n; score = mean token log-probability.
Translation refine(Decoder &decoder, const Tokens &tk, int64_t n, const Options &o) {
  std::vector<int32_t> tokens(size_t(n), tk.mask);
  tokens.front() = tk.bos;
  tokens.back() = tk.eos;
  const int64_t N = n - 2;
  Translation t;
  if (N <= 0) {
    t.tgt = tokens;
    return t;
  }
  std::vector<int64_t> content(static_cast<size_t>(N));
  std::iota(content.begin(), content.end(), int64_t(1));
  std::vector<double> conf(size_t(n), 0.0);
  // Pass 0: every content row sees only bos and eos.
  std::vector<std::vector<bool>> hidden(size_t(N), std::vector<bool>(size_t(n), false));
  for (auto &h : hidden)
    for (int64_t j = 1; j <= N; ++j)
      h[size_t(j)] = true;
  std::vector<int32_t> tok;
  std::vector<double> lp;
  predictRows(decoder, tk, tokens, content, hidden, tok, lp);
  for (int64_t r = 0; r < N; ++r)
    tokens[size_t(r + 1)] = tok[size_t(r)], conf[size_t(r + 1)] = lp[size_t(r)];
  const int T = std::max(1, o.iterations);
  for (int it = 1; it < T; ++it) {
    if (o.mode == Mode::MaskPredict) {
      const int64_t nMask = N * (T - it) / T;
      if (nMask == 0)
        break;
      std::vector<int64_t> order = content;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return conf[size_t(a)] < conf[size_t(b)]; });
      std::vector<int64_t> masked(order.begin(), order.begin() + nMask);
      std::sort(masked.begin(), masked.end());
      std::vector<bool> isMasked(size_t(n), false);
      for (int64_t i : masked)
        isMasked[size_t(i)] = true, tokens[size_t(i)] = tk.mask;
      std::vector<std::vector<bool>> h(masked.size(), isMasked);
      predictRows(decoder, tk, tokens, masked, h, tok, lp);
      for (size_t r = 0; r < masked.size(); ++r)
        tokens[size_t(masked[r])] = tok[r], conf[size_t(masked[r])] = lp[r];
    } else { // easy-first: row i sees the positions more confident than itself
      std::vector<int64_t> order = content;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return conf[size_t(a)] > conf[size_t(b)]; });
      std::vector<int64_t> rank(size_t(n), 0);
      for (size_t k = 0; k < order.size(); ++k)
        rank[size_t(order[k])] = int64_t(k);
      std::vector<std::vector<bool>> h(size_t(N), std::vector<bool>(size_t(n), false));
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 1; j <= N; ++j)
          h[size_t(r)][size_t(j)] = rank[size_t(j)] >= rank[size_t(r + 1)];
      predictRows(decoder, tk, tokens, content, h, tok, lp);
      bool changed = false;
      for (int64_t r = 0; r < N; ++r) {
        changed = changed || tokens[size_t(r + 1)] != tok[size_t(r)];
        tokens[size_t(r + 1)] = tok[size_t(r)], conf[size_t(r + 1)] = lp[size_t(r)];
      }
      if (!changed)
        break;
    }
  }
  t.tgt = tokens;
  double sum = 0;
  for (int64_t i = 1; i <= N; ++i)
    sum += conf[size_t(i)];
  t.score = sum / double(N);
  return t;
}

} // namespace

Translation translate(Decoder &decoder, const Tokens &tk, const Options &o) {
  if (o.beam < 1 || o.lengthBeam < 1 || o.iterations < 1)
    throw std::invalid_argument("translate: --beam, --length-beam and --iterations must be >= 1");
  std::vector<Translation> cands;
  if (o.mode == Mode::L2R || o.mode == Mode::R2L) {
    cands = beamSearch(decoder, tk, o, o.mode == Mode::L2R);
  } else {
    const std::vector<double> lengthLp = decoder.lengthLogprobs();
    std::vector<int64_t> lengths;
    for (int64_t n = 2; n < tk.maxLen; ++n)
      lengths.push_back(n);
    std::stable_sort(lengths.begin(), lengths.end(),
                     [&](int64_t a, int64_t b) { return lengthLp[size_t(a)] > lengthLp[size_t(b)]; });
    lengths.resize(std::min(lengths.size(), size_t(o.lengthBeam)));
    for (int64_t n : lengths)
      cands.push_back(refine(decoder, tk, n, o));
  }
  if (cands.empty())
    throw std::runtime_error("translate: no hypothesis finished");
  if (o.rerank)
    for (Translation &t : cands) {
      const double n1 = double(t.tgt.size() - 1);
      t.score = 0.5 * (decoder.teacherForced(t.tgt, true) + decoder.teacherForced(t.tgt, false)) / n1;
    }
  size_t best = 0;
  for (size_t c = 1; c < cands.size(); ++c)
    if (cands[c].score > cands[best].score)
      best = c;
  Translation out = cands[best];
  out.candidates = int64_t(cands.size());
  return out;
}

} // namespace lmcc::decode
