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
  Vec<int32_t> tokens; ///< in generation order (l2r: bos first; r2l: eos first)
  double logprob = 0;
};

/// Beam search in one direction; every live hypothesis has the same length, so one step is one batch.
Vec<Translation> beamSearch(Decoder &decoder, const Tokens &tk, const Options &o, bool leftToRight) {
  const int32_t start = leftToRight ? tk.bos : tk.eos, stop = leftToRight ? tk.eos : tk.bos;
  const int64_t maxTarget = o.maxTarget > 0 ? std::min(o.maxTarget, tk.maxLen - 1) : tk.maxLen - 1;
  const int64_t V = tk.vocab;
  Vec<Hyp> live{{{start}, 0.0}};
  Vec<Translation> finished;
  while (!live.empty() && int64_t(finished.size()) < o.beam) {
    Vec<Vec<int32_t>> targets;
    for (const Hyp &h : live) {
      targets.push_back(h.tokens);
      if (!leftToRight)
        std::reverse(targets.back().begin(), targets.back().end());
    }
    const Vec<float> lp = decoder.step(targets, leftToRight);
    struct Cand {
      double logprob;
      size_t hyp;
      int32_t token;
    };
    Vec<Cand> cands;
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
    Vec<Hyp> next;
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

/// Per row of a pass's log-probabilities [rows * V]: the argmax content token (not eos) and its log-probability.
void best(const Tokens &tk, const Vec<float> &lp, size_t rows, Vec<int32_t> &outTok, Vec<double> &outLp) {
  const size_t V = size_t(tk.vocab);
  outTok.assign(rows, 0);
  outLp.assign(rows, 0);
  for (size_t r = 0; r < rows; ++r) {
    double top = -INFINITY;
    int32_t arg = tk.unk;
    for (int32_t v = 0; v < int32_t(V); ++v)
      if (emittable(tk, v) && v != tk.eos && lp[r * V + size_t(v)] > top)
        top = lp[r * V + size_t(v)], arg = v;
    outTok[r] = arg;
    outLp[r] = top;
  }
}

/// Mask-predict or easy-first refinement of one target length n (n - 2 content positions).
class Refinement {
public:
  Refinement(const Tokens &tk, int64_t n) : tk(tk), n(n), N(n - 2), tokens(size_t(n), tk.mask), conf(size_t(n), 0.0) {
    tokens.front() = tk.bos;
    tokens.back() = tk.eos;
    for (int64_t i = 1; i <= N; ++i)
      content.push_back(i);
  }

  bool done() const { return finished || N <= 0; }

  /// The pass of iteration `it` (0: every content row sees only bos and eos), or finishes the refinement.
  Decoder::Pass pass(const Options &o, int it) {
    Decoder::Pass p;
    if (it == 0) {
      p.rows = content;
      p.hidden.assign(size_t(N), Vec<bool>(size_t(n), false));
      for (auto &h : p.hidden)
        for (int64_t j = 1; j <= N; ++j)
          h[size_t(j)] = true;
    } else if (o.mode == Mode::MaskPredict) {
      const int T = std::max(1, o.iterations);
      const int64_t nMask = N * (T - it) / T;
      if (nMask == 0) {
        finished = true;
        return p;
      }
      // Least confident first, ties in position order (std::stable_sort's order from `content`, ascending,
      // without the temporary buffer stable_sort takes from the system).
      Vec<int64_t> order = content;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return conf[size_t(a)] < conf[size_t(b)] || (conf[size_t(a)] == conf[size_t(b)] && a < b);
      });
      p.rows.assign(order.begin(), order.begin() + nMask);
      std::sort(p.rows.begin(), p.rows.end());
      Vec<bool> isMasked(size_t(n), false);
      for (int64_t i : p.rows)
        isMasked[size_t(i)] = true, tokens[size_t(i)] = tk.mask;
      p.hidden.assign(p.rows.size(), isMasked);
    } else { // easy-first: row i sees the positions more confident than itself
      Vec<int64_t> order = content;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return conf[size_t(a)] > conf[size_t(b)] || (conf[size_t(a)] == conf[size_t(b)] && a < b);
      });
      Vec<int64_t> rank(size_t(n), 0);
      for (size_t k = 0; k < order.size(); ++k)
        rank[size_t(order[k])] = int64_t(k);
      p.rows = content;
      p.hidden.assign(size_t(N), Vec<bool>(size_t(n), false));
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 1; j <= N; ++j)
          p.hidden[size_t(r)][size_t(j)] = rank[size_t(j)] >= rank[size_t(r + 1)];
    }
    p.tokens = tokens;
    return p;
  }

  /// Takes the pass's predictions; easy-first finishes when no token changed (after the first pass).
  void update(const Options &o, int it, const Decoder::Pass &p, const Vec<float> &lp) {
    Vec<int32_t> tok;
    Vec<double> lpBest;
    best(tk, lp, p.rows.size(), tok, lpBest);
    bool changed = false;
    for (size_t r = 0; r < p.rows.size(); ++r) {
      const size_t i = size_t(p.rows[r]);
      changed = changed || tokens[i] != tok[r];
      tokens[i] = tok[r], conf[i] = lpBest[r];
    }
    if (it > 0 && o.mode == Mode::EasyFirst && !changed)
      finished = true;
  }

  /// The target and its score (mean token log-probability; 0 without content).
  Translation result() const {
    Translation t;
    t.tgt = tokens;
    if (N > 0) {
      double sum = 0;
      for (int64_t i = 1; i <= N; ++i)
        sum += conf[size_t(i)];
      t.score = sum / double(N);
    }
    return t;
  }

private:
  const Tokens &tk;
  int64_t n, N;
  Vec<int32_t> tokens;
  Vec<double> conf;
  Vec<int64_t> content;
  bool finished = false;
};

/// The length beam's refinements side by side: iteration t is one predict call over the unfinished ones.
Vec<Translation> refineAll(Decoder &decoder, const Tokens &tk, const Vec<int64_t> &lengths, const Options &o) {
  Vec<Refinement> cands;
  for (int64_t n : lengths)
    cands.emplace_back(tk, n);
  const int T = std::max(1, o.iterations);
  for (int it = 0; it < T; ++it) {
    Vec<size_t> active;
    Vec<Decoder::Pass> passes;
    for (size_t c = 0; c < cands.size(); ++c) {
      if (cands[c].done())
        continue;
      Decoder::Pass p = cands[c].pass(o, it);
      if (cands[c].done())
        continue;
      active.push_back(c);
      passes.push_back(std::move(p));
    }
    if (passes.empty())
      break;
    const Vec<Vec<float>> lp = decoder.predict(passes);
    for (size_t k = 0; k < active.size(); ++k)
      cands[active[k]].update(o, it, passes[k], lp[k]);
  }
  Vec<Translation> out;
  for (const Refinement &r : cands)
    out.push_back(r.result());
  return out;
}

} // namespace

Translation translate(Decoder &decoder, const Tokens &tk, const Options &o) {
  if (o.beam < 1 || o.lengthBeam < 1 || o.iterations < 1)
    throw std::invalid_argument("translate: --beam, --length-beam and --iterations must be >= 1");
  Vec<Translation> cands;
  if (o.mode == Mode::L2R || o.mode == Mode::R2L) {
    cands = beamSearch(decoder, tk, o, o.mode == Mode::L2R);
  } else {
    const Vec<double> lengthLp = decoder.lengthLogprobs();
    // Lengths with at least one content token: an empty target (bos, eos) has no token log-probability to
    // rank it by (its mean would be 0, above every real candidate's); it is a candidate only where max_len
    // leaves no other length.
    Vec<int64_t> lengths;
    for (int64_t n = tk.maxLen > 3 ? 3 : 2; n < tk.maxLen; ++n)
      lengths.push_back(n);
    std::sort(lengths.begin(), lengths.end(), [&](int64_t a, int64_t b) {
      return lengthLp[size_t(a)] > lengthLp[size_t(b)] || (lengthLp[size_t(a)] == lengthLp[size_t(b)] && a < b);
    });
    lengths.resize(std::min(lengths.size(), size_t(o.lengthBeam)));
    cands = refineAll(decoder, tk, lengths, o);
  }
  if (cands.empty())
    throw std::runtime_error("translate: no hypothesis finished");
  // Self-reranking (issue 19's contract, the paper's 2.4): the mean of the two directions' teacher-forced
  // log-likelihoods, each the sum over the candidate's n - 1 predicted tokens (not normalized by length).
  if (o.rerank)
    for (Translation &t : cands)
      t.score = 0.5 * (decoder.teacherForced(t.tgt, true) + decoder.teacherForced(t.tgt, false));
  size_t best = 0;
  for (size_t c = 1; c < cands.size(); ++c)
    if (cands[c].score > cands[best].score)
      best = c;
  Translation out = cands[best];
  out.candidates = int64_t(cands.size());
  return out;
}

} // namespace lmcc::decode
