//===- Translate.cpp - lm_rt_translate: the Diformer's search on compiled kernels ===//
//
// decode::Decoder (runtime/lib/DiformerSearch.h) over a compiled Diformer's entries. The encoder runs once per
// source (pair_encode: the length distribution and the cross-attention keys/values of every decoder layer);
// each token's self-attention keys/values are computed once (pair_token_kv: they depend on the token alone)
// and cached by token id; an autoregressive step is one pair_step call whose batch is the live hypotheses,
// each computing only its new row (an R row at the end of the prefix, or an L row at its start) over the
// cached keys/values; a parallel pass is one pair_decode call; the rerank's teacher-forced scores are
// pair_score calls. Every container of a call is a Vec (runtime/lib/Recycled.h) or reused from the call before on
// the thread (the rerank's packed pair): a steady-state call takes nothing from the system allocator.
//
//===----------------------------------------------------------------------===//
#include "runtime/lib/DiformerSearch.h"
#include "runtime/lib/Internal.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>

using namespace lmrt::detail;
using lmcc::decode::Vec;

namespace {

class CompiledDecoder : public lmcc::decode::Decoder {
public:
  CompiledDecoder(lm_model *m, const int32_t *src, int32_t srcLength)
      : m(m), d(m->desc), src(src, src + srcLength), M(srcLength), K(d->kv_width), V(d->vocab),
        W(1 + LM_HIDDEN_WORDS(d->max_len)) {
    crossKV.resize(size_t(M * K));
    Vec<float> lengths(size_t(d->max_len));
    lm_memref1f w = weights();
    Vec<int32_t> len{int32_t(M)};
    lm_memref2i srcRef = memref2(this->src.data(), 1, M);
    lm_memref1i lenRef = memref1(len.data(), 1);
    lm_memref2f lpRef = memref2(lengths.data(), 1, d->max_len);
    lm_memref3f kvRef = memref3(crossKV.data(), 1, M, K);
    runKernel("translate", [&] { d->pair_encode(&w, &srcRef, &lenRef, &lpRef, &kvRef); }, Bound::Held);
    finite(crossKV, "translate (encoder)");
    finite(lengths, "translate (length head)");
    lengthLp.assign(lengths.begin(), lengths.end());
  }

  Vec<double> lengthLogprobs() override { return lengthLp; }

  Vec<float> step(const Vec<Vec<int32_t>> &targets, bool leftToRight) override {
    const int64_t B = int64_t(targets.size()), n = int64_t(targets.front().size());
    Vec<int32_t> rows = skipRows(B * n);
    Vec<int32_t> positions(static_cast<size_t>(B)), srcLen(static_cast<size_t>(B), int32_t(M)),
        tgtLen(static_cast<size_t>(B), int32_t(n));
    Vec<float> selfKV = keysValues(targets);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t i = leftToRight ? n - 1 : 0;
      positions[size_t(b)] = int32_t(i);
      rows[size_t((b * n + i) * W)] = leftToRight ? 0 : 1;
    }
    // The source's cross keys/values once per hypothesis, copied once per source (the beam's width at most).
    while (int64_t(crossRows.size()) < B * M * K)
      crossRows.insert(crossRows.end(), crossKV.begin(), crossKV.end());
    Vec<float> out(size_t(B * V));
    lm_memref1f w = weights();
    lm_memref3f selfRef = memref3(selfKV.data(), B, n, K), crossRef = memref3(crossRows.data(), B, M, K),
                outRef = memref3(out.data(), B, 1, V);
    lm_memref1i srcLenRef = memref1(srcLen.data(), B), tgtLenRef = memref1(tgtLen.data(), B),
                posRef = memref1(positions.data(), B);
    lm_memref3i rowsRef = memref3(rows.data(), B, n, W);
    runKernel(
        "translate", [&] { d->pair_step(&w, &selfRef, &crossRef, &srcLenRef, &tgtLenRef, &rowsRef, &posRef, &outRef); },
        Bound::Held);
    finite(out, "translate (decoding step)");
    return out;
  }

  // One pair_decode call per pass: measured faster on the CPU than one call for the length beam's candidates
  // padded to the longest (experiments/diformer: 14.5 vs 18.6 ms per sentence for mask-predict).
  Vec<Vec<float>> predict(const Vec<Pass> &passes) override {
    Vec<Vec<float>> out;
    for (const Pass &p : passes) {
      const int64_t n = int64_t(p.tokens.size());
      Vec<int32_t> rows = skipRows(n), srcLen{int32_t(M)}, tgtLen{int32_t(n)};
      for (size_t r = 0; r < p.rows.size(); ++r) {
        int32_t *row = rows.data() + p.rows[r] * W;
        row[0] = 2;
        for (int64_t j = 0; j < n; ++j)
          if (p.hidden[r][size_t(j)])
            row[1 + j / 32] = int32_t(uint32_t(row[1 + j / 32]) | (1u << (j % 32)));
      }
      Vec<float> selfKV = keysValues(Vec<Vec<int32_t>>{p.tokens}), all(size_t(n * V));
      lm_memref1f w = weights();
      lm_memref3f selfRef = memref3(selfKV.data(), 1, n, K), crossRef = memref3(crossKV.data(), 1, M, K),
                  outRef = memref3(all.data(), 1, n, V);
      lm_memref1i srcLenRef = memref1(srcLen.data(), 1), tgtLenRef = memref1(tgtLen.data(), 1);
      lm_memref3i rowsRef = memref3(rows.data(), 1, n, W);
      runKernel(
          "translate", [&] { d->pair_decode(&w, &selfRef, &crossRef, &srcLenRef, &tgtLenRef, &rowsRef, &outRef); },
          Bound::Held);
      Vec<float> lp;
      for (int64_t r : p.rows)
        lp.insert(lp.end(), all.begin() + r * V, all.begin() + (r + 1) * V);
      finite(lp, "translate (parallel pass)");
      out.push_back(std::move(lp));
    }
    return out;
  }

  double teacherForced(const Vec<int32_t> &tgt, bool leftToRight) override {
    const int32_t n = int32_t(tgt.size()), m = int32_t(M);
    Vec<int32_t> dirs(size_t(n), leftToRight ? 0 : 1);
    (leftToRight ? dirs.back() : dirs.front()) = 3;
    thread_local PairBatch pb; // packPairs reuses its buffers
    packPairs(pb, d, src.data(), &m, m, tgt.data(), &n, n, dirs.data(), nullptr, 0, 1);
    Vec<int32_t> nScored(1);
    Vec<float> lp(static_cast<size_t>(n)), score(1), length(1);
    lm_memref1f w = weights();
    lm_memref2i srcRef = pb.srcRef(), tgtRef = pb.tgtRef();
    lm_memref1i srcLenRef = pb.srcLenRef(), tgtLenRef = pb.tgtLenRef(), nRef = memref1(nScored.data(), 1);
    lm_memref3i rowsRef = pb.rowsRef();
    lm_memref2f lpRef = memref2(lp.data(), 1, n);
    lm_memref1f scRef = memref1(score.data(), 1), lenRef = memref1(length.data(), 1);
    runKernel(
        "translate",
        [&] { d->pair_score(&w, &srcRef, &srcLenRef, &tgtRef, &tgtLenRef, &rowsRef, &lpRef, &scRef, &nRef, &lenRef); },
        Bound::Held);
    finite(score, "translate (rerank)");
    return score[0];
  }

private:
  /// The cached self-attention keys/values of every token of `targets` (all of one length), [B, n, K]; tokens
  /// not seen before are computed first, in one pair_token_kv call.
  Vec<float> keysValues(const Vec<Vec<int32_t>> &targets) {
    Vec<int32_t> missing;
    for (const auto &t : targets)
      for (int32_t id : t)
        if (!cache.count(id) && std::find(missing.begin(), missing.end(), id) == missing.end())
          missing.push_back(id);
    if (!missing.empty()) {
      const int64_t T = int64_t(missing.size());
      Vec<float> kv(size_t(T * K));
      lm_memref1f w = weights();
      lm_memref2i idsRef = memref2(missing.data(), T, 1);
      lm_memref3f kvRef = memref3(kv.data(), T, 1, K);
      runKernel("translate", [&] { d->pair_token_kv(&w, &idsRef, &kvRef); }, Bound::Held);
      finite(kv, "translate (keys and values)");
      for (int64_t t = 0; t < T; ++t)
        cache.emplace(missing[size_t(t)], Vec<float>(kv.begin() + t * K, kv.begin() + (t + 1) * K));
    }
    Vec<float> out;
    out.reserve(targets.size() * targets.front().size() * size_t(K));
    for (const auto &t : targets)
      for (int32_t id : t) {
        const Vec<float> &row = cache.at(id);
        out.insert(out.end(), row.begin(), row.end());
      }
    return out;
  }
  /// `count` rows of the kernels' rows operand: direction 3 (skip), no hidden keys.
  Vec<int32_t> skipRows(int64_t count) const {
    Vec<int32_t> rows(size_t(count * W), 0);
    for (int64_t r = 0; r < count; ++r)
      rows[size_t(r * W)] = 3;
    return rows;
  }
  lm_memref1f weights() const { return memref1(m->weights, d->total_floats); }
  static void finite(const Vec<float> &v, const char *what) {
    for (float x : v)
      if (std::isnan(x) || x == INFINITY)
        nonFiniteResult(std::string(what) + " gave a NaN or +infinity (the weights may hold huge values)");
  }

  lm_model *m;
  const lm_model_desc *d;
  Vec<int32_t> src;
  int64_t M, K, V, W;
  Vec<float> crossKV;   ///< [M, K]
  Vec<float> crossRows; ///< crossKV repeated for a step's hypotheses
  Vec<double> lengthLp;
  /// token id -> its keys/values [K]
  std::unordered_map<int32_t, Vec<float>, std::hash<int32_t>, std::equal_to<int32_t>,
                     lmcc::decode::Recycled<std::pair<const int32_t, Vec<float>>>>
      cache;
};

void translateImpl(lm_model *m, const int32_t *src, int32_t srcLength, int32_t mode, int32_t beam, int32_t lengthBeam,
                   int32_t iterations, int32_t rerank, int32_t maxTarget, int32_t *tgt, int32_t capacity,
                   int32_t *tgtLength, double *score, int32_t *candidates) {
  if (!m)
    argument("the model is NULL");
  const lm_model_desc *d = m->desc;
  if (!d->pair_encode || !d->pair_token_kv || !d->pair_decode || !d->pair_step || !d->pair_score)
    argument("model " + std::string(d->name) + " does not translate (only family \"diformer\" does)");
  checkModelInputs(m, src, &srcLength, 1, srcLength < 1 ? 1 : srcLength);
  if (mode < LM_DECODE_L2R || mode > LM_DECODE_EASY_FIRST)
    argument("mode = " + std::to_string(mode) + " must be LM_DECODE_L2R (0), LM_DECODE_R2L (1), "
             "LM_DECODE_MASK_PREDICT (2) or LM_DECODE_EASY_FIRST (3)");
  if (beam < 1 || lengthBeam < 1 || iterations < 1 || beam > 1000 || lengthBeam > 1000 || iterations > 1000)
    argument("beam = " + std::to_string(beam) + ", length_beam = " + std::to_string(lengthBeam) +
             " and iterations = " + std::to_string(iterations) + " must be in [1, 1000] (lmcc translate's range; a "
             "beam's rows are held at once)");
  if (maxTarget != 0 && (maxTarget < 2 || maxTarget > d->max_len - 1))
    argument("max_target = " + std::to_string(maxTarget) + " must be 0 or in [2, max_len-1=" +
             std::to_string(d->max_len - 1) + "]");
  if (!tgt || !tgtLength)
    argument("tgt and tgt_length must not be NULL");
  if (capacity < 1)
    argument("capacity = " + std::to_string(capacity) + " must be at least 1");
  lmcc::decode::Tokens tokens;
  tokens.vocab = d->vocab, tokens.maxLen = d->max_len;
  tokens.pad = d->pad_id, tokens.unk = d->unk_id, tokens.bos = d->bos_id, tokens.eos = d->eos_id;
  tokens.mask = d->mask_id;
  lmcc::decode::Options o;
  o.mode = lmcc::decode::Mode(mode);
  o.beam = beam, o.lengthBeam = lengthBeam, o.iterations = iterations, o.rerank = rerank != 0;
  o.maxTarget = maxTarget;
  lmcc::decode::Translation t;
  try {
    CompiledDecoder decoder(m, src, srcLength);
    t = lmcc::decode::translate(decoder, tokens, o);
  } catch (const std::runtime_error &e) {
    internal(e.what());
  }
  *tgtLength = int32_t(t.tgt.size());
  if (int64_t(t.tgt.size()) > capacity)
    argument("the translation has " + std::to_string(t.tgt.size()) + " tokens: capacity = " +
             std::to_string(capacity) + " is too small (max_len = " + std::to_string(d->max_len) + " always fits)");
  std::copy(t.tgt.begin(), t.tgt.end(), tgt);
  if (score)
    *score = t.score;
  if (candidates)
    *candidates = int32_t(t.candidates);
}

} // namespace

int lm_rt_translate(lm_model *m, const int32_t *src, int32_t src_length, int32_t mode, int32_t beam,
                    int32_t length_beam, int32_t iterations, int32_t rerank, int32_t max_target, int32_t *tgt,
                    int32_t capacity, int32_t *tgt_length, double *score, int32_t *candidates) {
  return guardedCall([&] {
    translateImpl(m, src, src_length, mode, beam, length_beam, iterations, rerank, max_target, tgt, capacity,
                  tgt_length, score, candidates);
  });
}
