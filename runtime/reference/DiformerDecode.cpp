//===- DiformerDecode.cpp - The shared search on the reference model ------===//
#include "runtime/reference/DiformerDecode.h"

#include <map>
#include <memory>

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

Example teacherExample(const std::vector<int32_t> &src, const std::vector<int32_t> &tgt, Dir dir) {
  Example e{src, tgt, {}, std::vector<std::vector<int32_t>>(tgt.size())};
  e.dirs.assign(tgt.size(), dir);
  (dir == Dir::R ? e.dirs.back() : e.dirs.front()) = Dir::Skip;
  return e;
}

template <class Out = std::vector<float>>
Out flatten(const Model::Matrix &m) {
  return Out(m.data(), m.data() + m.size());
}

/// decode::Decoder on the reference model: rows computed one by one over cached keys and values.
class ReferenceDecoder : public decode::Decoder {
public:
  ReferenceDecoder(const Model &model, const std::vector<int32_t> &src)
      : model(model), src(src), memory(model.encode(src)), kv(model) {}

  decode::Vec<double> lengthLogprobs() override {
    return decode::Vec<double>(memory.lengthLogprobs.begin(), memory.lengthLogprobs.end());
  }

  // The new row of each target: R at i = n - 1 (position-table row i, keys j - i = -(n-1) .. 0), or L at
  // i = 0 (position-table row n - 1, keys j - i = 0 .. n - 1).
  decode::Vec<float> step(const decode::Vec<decode::Vec<int32_t>> &targets, bool leftToRight) override {
    std::vector<const Model::KeyValue *> keys;
    std::vector<Dir> dirs;
    std::vector<int64_t> queryPos;
    std::vector<std::vector<int32_t>> visible;
    std::vector<std::vector<int64_t>> offsets;
    for (const auto &t : targets) {
      const int64_t n = int64_t(t.size()), i = leftToRight ? n - 1 : 0;
      std::vector<int32_t> vis;
      std::vector<int64_t> off;
      for (int64_t j = 0; j < n; ++j) {
        vis.push_back(int32_t(keys.size()));
        keys.push_back(kv.get(t[size_t(j)]));
        off.push_back(j - i);
      }
      dirs.push_back(leftToRight ? Dir::R : Dir::L);
      queryPos.push_back(n - 1);
      visible.push_back(std::move(vis));
      offsets.push_back(std::move(off));
    }
    return flatten<decode::Vec<float>>(model.rowLogprobs(memory, keys, dirs, queryPos, visible, offsets));
  }

  decode::Vec<decode::Vec<float>> predict(const decode::Vec<Pass> &passes) override {
    decode::Vec<decode::Vec<float>> out;
    for (const Pass &p : passes) {
      const int64_t n = int64_t(p.tokens.size());
      std::vector<const Model::KeyValue *> keys;
      for (int32_t t : p.tokens)
        keys.push_back(kv.get(t));
      std::vector<Dir> dirs(p.rows.size(), Dir::S);
      std::vector<int64_t> queryPos(p.rows.begin(), p.rows.end());
      std::vector<std::vector<int32_t>> visible;
      std::vector<std::vector<int64_t>> offsets;
      for (size_t r = 0; r < p.rows.size(); ++r) {
        std::vector<int32_t> vis;
        std::vector<int64_t> off;
        for (int64_t j = 0; j < n; ++j)
          if (j != p.rows[r] && !p.hidden[r][size_t(j)]) {
            vis.push_back(int32_t(j));
            off.push_back(j - p.rows[r]);
          }
        visible.push_back(std::move(vis));
        offsets.push_back(std::move(off));
      }
      out.push_back(flatten<decode::Vec<float>>(model.rowLogprobs(memory, keys, dirs, queryPos, visible, offsets)));
    }
    return out;
  }

  double teacherForced(const decode::Vec<int32_t> &tgt, bool leftToRight) override {
    return diformer::teacherForced(model, src, std::vector<int32_t>(tgt.begin(), tgt.end()),
                                   leftToRight ? Dir::R : Dir::L);
  }

private:
  const Model &model;
  const std::vector<int32_t> &src;
  Model::Memory memory;
  KeyValueCache kv;
};

} // namespace

decode::Tokens searchTokens(const ModelSpec &spec) {
  decode::Tokens t;
  t.vocab = spec.dims.vocab, t.maxLen = spec.dims.maxLen;
  t.pad = int32_t(spec.tokens.pad), t.unk = int32_t(spec.tokens.unk), t.bos = int32_t(spec.tokens.bos);
  t.eos = int32_t(spec.tokens.eos), t.mask = int32_t(spec.tokens.mask);
  return t;
}

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
  return flatten(model.rowLogprobs(memory, keys, {Dir::R}, {i}, {vis}, {off}));
}

Translation translate(const Model &model, const std::vector<int32_t> &src, const DecodeOptions &options) {
  ReferenceDecoder decoder(model, src);
  return decode::translate(decoder, searchTokens(model.spec()), options);
}

} // namespace lmcc::reference::diformer
