//===- DiformerDecode.cpp - L2R/R2L beam, mask-predict, easy-first, rerank -===//
#include "runtime/reference/DiformerDecode.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>

namespace lmcc::reference::diformer {

namespace {

/// Keys/values per token id, computed once (they depend on the token alone).
class KeyValueCache {
public:
  explicit KeyValueCache(const Model &m) : model(m) {}
  const Model::KeyValue *get(int32_t token) {
    auto it = cache.find(token);
    if (it == cache.end())
      it = cache.emplace(token, std::make_unique<Model::KeyValue>(model.keyValue(token))).first;
    return it->second.get();
  }

private:
  const Model &model;
  std::map<int32_t, std::unique_ptr<Model::KeyValue>> cache;
};

/// Content ids a decoder may emit: everything but pad, bos and mask (eos only ends AR search).
bool emittable(const ModelSpec &spec, int32_t id) {
  return id != spec.tokens.pad && id != spec.tokens.bos && id != spec.tokens.mask;
}

struct Hyp {
  std::vector<int32_t> tokens; ///< in generation order (l2r: bos first; r2l: eos first)
  double logprob = 0;
};

/// Beam search in one direction. L2R: rows R at position i = len - 1 see keys 0..i; R2L: rows L at
/// distance d = len - 1 from the right see keys at distances 0..d (offset j - i = d - e).
std::vector<Translation> beamSearch(const Model &model, const Model::Memory &mem, KeyValueCache &kv,
                                    const DecodeOptions &o, bool leftToRight) {
  const ModelSpec &spec = model.spec();
  const int32_t start = int32_t(leftToRight ? spec.tokens.bos : spec.tokens.eos);
  const int32_t stop = int32_t(leftToRight ? spec.tokens.eos : spec.tokens.bos);
  const int64_t maxTarget = o.maxTarget > 0 ? std::min(o.maxTarget, spec.dims.maxLen - 1) : spec.dims.maxLen - 1;
  std::vector<Hyp> live{{{start}, 0.0}};
  std::vector<Translation> finished;
  while (!live.empty() && int64_t(finished.size()) < o.beam) {
    // One row per live hypothesis, keys concatenated; each row sees its own hypothesis's keys.
    std::vector<const Model::KeyValue *> keys;
    std::vector<Dir> dirs;
    std::vector<int64_t> queryPos;
    std::vector<std::vector<int32_t>> visible;
    std::vector<std::vector<int64_t>> offsets;
    for (const Hyp &h : live) {
      const int64_t d = int64_t(h.tokens.size()) - 1;
      std::vector<int32_t> vis;
      std::vector<int64_t> off;
      for (int64_t e = 0; e <= d; ++e) {
        vis.push_back(int32_t(keys.size()));
        keys.push_back(kv.get(h.tokens[size_t(e)]));
        off.push_back(leftToRight ? e - d : d - e);
      }
      dirs.push_back(leftToRight ? Dir::R : Dir::L);
      queryPos.push_back(d);
      visible.push_back(std::move(vis));
      offsets.push_back(std::move(off));
    }
    Model::Matrix lp = model.rowLogprobs(mem, keys, dirs, queryPos, visible, offsets);
    struct Cand {
      double logprob;
      size_t hyp;
      int32_t token;
    };
    std::vector<Cand> cands;
    for (size_t r = 0; r < live.size(); ++r) {
      const bool mustStop = int64_t(live[r].tokens.size()) + 1 >= maxTarget;
      for (int32_t v = 0; v < int32_t(lp.cols()); ++v) {
        if (v != stop && (mustStop || !emittable(spec, v) || v == start))
          continue;
        cands.push_back({live[r].logprob + double(lp(int64_t(r), v)), r, v});
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

/// One parallel pass of S rows over `tokens` (length n): row i in `rows` hides hidden[i].
/// Returns per row the argmax token (content ids only) and its log-probability.
void predictRows(const Model &model, const Model::Memory &mem, KeyValueCache &kv, const std::vector<int32_t> &tokens,
                 const std::vector<int64_t> &rows, const std::vector<std::vector<bool>> &hiddenFrom,
                 std::vector<int32_t> &outTok, std::vector<double> &outLp) {
  const ModelSpec &spec = model.spec();
  const int64_t n = int64_t(tokens.size());
  std::vector<const Model::KeyValue *> keys;
  for (int32_t t : tokens)
    keys.push_back(kv.get(t));
  std::vector<Dir> dirs(rows.size(), Dir::S);
  std::vector<int64_t> queryPos(rows.begin(), rows.end());
  std::vector<std::vector<int32_t>> visible;
  std::vector<std::vector<int64_t>> offsets;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> vis;
    std::vector<int64_t> off;
    for (int64_t j = 0; j < n; ++j)
      if (j != rows[r] && !hiddenFrom[r][size_t(j)]) {
        vis.push_back(int32_t(j));
        off.push_back(j - rows[r]);
      }
    visible.push_back(std::move(vis));
    offsets.push_back(std::move(off));
  }
  Model::Matrix lp = model.rowLogprobs(mem, keys, dirs, queryPos, visible, offsets);
  outTok.assign(rows.size(), 0);
  outLp.assign(rows.size(), 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    double best = -INFINITY;
    int32_t arg = int32_t(spec.tokens.unk);
    for (int32_t v = 0; v < int32_t(lp.cols()); ++v)
      if (emittable(spec, v) && v != spec.tokens.eos && lp(int64_t(r), v) > best)
        best = lp(int64_t(r), v), arg = v;
    outTok[r] = arg;
    outLp[r] = best;
  }
}

/// Mask-predict or easy-first refinement of one length n; score = mean token log-probability.
Translation refine(const Model &model, const Model::Memory &mem, KeyValueCache &kv, int64_t n, const DecodeOptions &o) {
  const ModelSpec &spec = model.spec();
  std::vector<int32_t> tokens(size_t(n), int32_t(spec.tokens.mask));
  tokens.front() = int32_t(spec.tokens.bos);
  tokens.back() = int32_t(spec.tokens.eos);
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
  predictRows(model, mem, kv, tokens, content, hidden, tok, lp);
  for (int64_t r = 0; r < N; ++r)
    tokens[size_t(r + 1)] = tok[size_t(r)], conf[size_t(r + 1)] = lp[size_t(r)];
  const int T = std::max(1, o.iterations);
  for (int it = 1; it < T; ++it) {
    if (o.mode == DecodeMode::MaskPredict) {
      const int64_t nMask = N * (T - it) / T;
      if (nMask == 0)
        break;
      std::vector<int64_t> order = content;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return conf[size_t(a)] < conf[size_t(b)]; });
      std::vector<int64_t> masked(order.begin(), order.begin() + nMask);
      std::sort(masked.begin(), masked.end());
      std::vector<bool> isMasked(size_t(n), false);
      for (int64_t i : masked)
        isMasked[size_t(i)] = true, tokens[size_t(i)] = int32_t(spec.tokens.mask);
      std::vector<std::vector<bool>> h(masked.size(), isMasked);
      predictRows(model, mem, kv, tokens, masked, h, tok, lp);
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
      predictRows(model, mem, kv, tokens, content, h, tok, lp);
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

Example teacherExample(const std::vector<int32_t> &src, const std::vector<int32_t> &tgt, Dir dir) {
  Example e{src, tgt, {}, std::vector<std::vector<int32_t>>(tgt.size())};
  e.dirs.assign(tgt.size(), dir);
  (dir == Dir::R ? e.dirs.back() : e.dirs.front()) = Dir::Skip;
  return e;
}

} // namespace

double teacherForced(const Model &model, const std::vector<int32_t> &src, const std::vector<int32_t> &tgt, Dir dir) {
  return model.score(teacherExample(src, tgt, dir)).score;
}

std::vector<float> incrementalL2R(const Model &model, const Model::Memory &memory, const std::vector<int32_t> &prefix) {
  KeyValueCache kv(model);
  const int64_t i = int64_t(prefix.size()) - 1;
  std::vector<const Model::KeyValue *> keys;
  std::vector<int32_t> vis;
  std::vector<int64_t> off;
  for (int64_t j = 0; j <= i; ++j) {
    keys.push_back(kv.get(prefix[size_t(j)]));
    vis.push_back(int32_t(j));
    off.push_back(j - i);
  }
  Model::Matrix lp = model.rowLogprobs(memory, keys, {Dir::R}, {i}, {vis}, {off});
  return std::vector<float>(lp.data(), lp.data() + lp.cols());
}

Translation translate(const Model &model, const std::vector<int32_t> &src, const DecodeOptions &o) {
  if (o.beam < 1 || o.lengthBeam < 1 || o.iterations < 1)
    throw std::invalid_argument("translate: --beam, --length-beam and --iterations must be >= 1");
  const ModelSpec &spec = model.spec();
  Model::Memory mem = model.encode(src);
  KeyValueCache kv(model);
  std::vector<Translation> cands;
  if (o.mode == DecodeMode::L2R || o.mode == DecodeMode::R2L) {
    cands = beamSearch(model, mem, kv, o, o.mode == DecodeMode::L2R);
  } else {
    std::vector<int64_t> lengths;
    for (int64_t n = 2; n < spec.dims.maxLen; ++n)
      lengths.push_back(n);
    std::stable_sort(lengths.begin(), lengths.end(), [&](int64_t a, int64_t b) {
      return mem.lengthLogprobs[size_t(a)] > mem.lengthLogprobs[size_t(b)];
    });
    lengths.resize(std::min(lengths.size(), size_t(o.lengthBeam)));
    for (int64_t n : lengths)
      cands.push_back(refine(model, mem, kv, n, o));
  }
  if (cands.empty())
    throw std::runtime_error("translate: no hypothesis finished");
  if (o.rerank)
    for (Translation &t : cands) {
      const double n1 = double(t.tgt.size() - 1);
      t.score = 0.5 * (teacherForced(model, src, t.tgt, Dir::R) + teacherForced(model, src, t.tgt, Dir::L)) / n1;
    }
  size_t best = 0;
  for (size_t c = 1; c < cands.size(); ++c)
    if (cands[c].score > cands[best].score)
      best = c;
  Translation out = cands[best];
  out.candidates = int64_t(cands.size());
  return out;
}

} // namespace lmcc::reference::diformer
