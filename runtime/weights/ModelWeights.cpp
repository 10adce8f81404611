//===- ModelWeights.cpp - Spec-aware model weights ------------------------===//
//
// The canonical tensor list of a spec (DESIGN.md names, linear weights [out, in]),
// Hugging Face BertForMaskedLM import, validation of a weight set against a spec
// and seeded BERT-style initialization.
//
//===----------------------------------------------------------------------===//

#include "runtime/weights/ModelWeights.h"
#include "runtime/weights/UniqueJson.h"

#include "runtime/weights/Format.h"
#include "runtime/weights/WeightNames.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace lmcc {

namespace {

// --- Small helpers -----------------------------------------------------------

bool startsWith(const std::string &s, const std::string &prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void tensorError(const std::string &path, const std::string &name,
                              const std::string &what) {
  throw WeightError(path + ": tensor " + lmcc::quoted(name) + ": " + what);
}

const char *familyName(Family family) {
  switch (family) {
  case Family::UniLM: return "unilm";
  case Family::BiLM: return "bilm";
  case Family::TTA: return "tta";
  case Family::NGram: return "ngram";
  case Family::Diformer: return "diformer";
  }
  return "unknown";
}

/// The number of elements `shape` describes when every dimension is >= 0 and the
/// product fits in 64 bits; -1 otherwise. Used on in-memory tensors, which nobody
/// has validated.
int64_t checkedNumel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      return -1;
    n *= d;
  }
  return n;
}

/// True when `t` is a rank-2 tensor whose data matches its shape.
bool isConsistentMatrix(const Tensor &t) {
  return t.shape.size() == 2 && checkedNumel(t.shape) >= 0 &&
         static_cast<uint64_t>(checkedNumel(t.shape)) == t.data.size();
}

// --- The canonical tensor list -----------------------------------------------

/// How initWeights fills a tensor.
enum class Init { Normal, Zero, One };

struct ExpectedTensor {
  TensorInfo info;
  Init init;
};

/// Rejects specs this release cannot hold weights for, and dims that would make
/// the shapes meaningless (a resolved spec never has them; a spec built in code may).
void checkSpec(const ModelSpec &spec) {
  const std::string where = "spec " + lmcc::quoted(spec.name) + ": ";
  if (spec.family == Family::Diformer && !spec.diformer)
    throw WeightError(where + "family diformer needs its encoder/decoder sizes");
  const Dims &d = spec.dims;
  if (d.vocab <= 0 || d.maxLen <= 0 || d.dModel <= 0 || d.heads <= 0 || d.dFF <= 0 ||
      d.layers < 0)
    throw WeightError(where + "dims must be positive");
  if (d.dModel % d.heads != 0)
    throw WeightError(where + "d_model " + std::to_string(d.dModel) +
                      " is not a multiple of heads " + std::to_string(d.heads));
  if (spec.relativePositions < 0)
    throw WeightError(where + "relative_positions must be >= 0");
}

/// Diformer (issue 19): encoder.layers.*, embed.*, length.weight, decoder.{direction, position.l2r,
/// position.r2l, embed_norm}, decoder.layers.* (attn with rel_k/rel_v of the decoder's head size,
/// cross, norms, ffn), head.bias; the output head is tied to embed.token.
std::vector<ExpectedTensor> diformerList(const ModelSpec &spec) {
  const int64_t V = spec.dims.vocab, L = spec.dims.maxLen, D = spec.dims.dModel, k = spec.relativePositions;
  const DiformerOptions &df = *spec.diformer;
  std::vector<ExpectedTensor> list;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
    list.push_back({{std::move(name), std::move(shape)}, init});
  };
  auto addNorm = [&](const std::string &prefix) {
    add(names::weight(prefix), {D}, Init::One);
    add(names::bias(prefix), {D}, Init::Zero);
  };
  auto addLinear = [&](const std::string &prefix, int64_t out, int64_t in) {
    add(names::weight(prefix), {out, in}, Init::Normal);
    add(names::bias(prefix), {out}, Init::Zero);
  };
  auto addAttention = [&](const std::string &attn) {
    for (const std::string &proj : {names::q(attn), names::k(attn), names::v(attn), names::o(attn)})
      addLinear(proj, D, D);
  };
  add(names::embedToken(), {V, D}, Init::Normal);
  add(names::embedPosition(), {L, D}, Init::Normal);
  if (spec.embeddingNorm)
    addNorm(names::embedNorm());
  for (int64_t i = 0; i < df.encoder.layers; ++i) {
    const std::string layer = names::encoderLayer(i), ffn = names::ffn(layer);
    addAttention(names::attn(layer));
    addNorm(names::attnNorm(layer));
    addLinear(names::ffnIn(ffn), df.encoder.dFF, D);
    addLinear(names::ffnOut(ffn), D, df.encoder.dFF);
    addNorm(names::ffnNorm(layer));
  }
  if (spec.norm == NormPlacement::Pre)
    addNorm(names::encoderFinalNorm());
  add(names::lengthWeight(), {L, D}, Init::Normal);
  add(names::decoderDirection(), {3, D}, Init::Normal);
  add(names::decoderPositionL2R(), {L, D}, Init::Normal);
  add(names::decoderPositionR2L(), {L, D}, Init::Normal);
  if (spec.embeddingNorm)
    addNorm(names::decoderEmbedNorm());
  const int64_t dh = D / df.decoder.heads;
  for (int64_t i = 0; i < df.decoder.layers; ++i) {
    const std::string layer = names::decoderLayer(i), attn = names::attn(layer), ffn = names::ffn(layer);
    addAttention(attn);
    if (k > 0) {
      add(names::relK(attn), {2 * k + 1, dh}, Init::Normal);
      add(names::relV(attn), {2 * k + 1, dh}, Init::Normal);
    }
    addNorm(names::attnNorm(layer));
    addAttention(names::cross(layer));
    addNorm(names::crossNorm(layer));
    addLinear(names::ffnIn(ffn), df.decoder.dFF, D);
    addLinear(names::ffnOut(ffn), D, df.decoder.dFF);
    addNorm(names::ffnNorm(layer));
  }
  if (spec.norm == NormPlacement::Pre)
    addNorm(names::decoderFinalNorm());
  if (spec.headBias)
    add(names::headBias(), {V}, Init::Zero);
  return list;
}

std::vector<ExpectedTensor> expectedList(const ModelSpec &spec) {
  checkSpec(spec);
  const int64_t V = spec.dims.vocab, L = spec.dims.maxLen, D = spec.dims.dModel,
                F = spec.dims.dFF, dh = spec.dims.headDim(), k = spec.relativePositions;
  std::vector<ExpectedTensor> list;
  auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
    list.push_back({{std::move(name), std::move(shape)}, init});
  };
  auto addNorm = [&](const std::string &prefix) {
    add(names::weight(prefix), {D}, Init::One);
    add(names::bias(prefix), {D}, Init::Zero);
  };

  if (spec.family == Family::Diformer)
    return diformerList(spec);
  add(names::embedToken(), {V, D}, Init::Normal);
  if (spec.position == PositionKind::Learned)
    add(names::embedPosition(), {L, D}, Init::Normal);
  if (spec.embeddingNorm)
    addNorm(names::embedNorm());
  for (int64_t i = 0; i < spec.dims.layers; ++i) {
    const std::string layer = names::layer(i), attn = names::attn(layer), ffn = names::ffn(layer);
    for (const std::string &proj : {names::q(attn), names::k(attn), names::v(attn), names::o(attn)}) {
      add(names::weight(proj), {D, D}, Init::Normal);
      add(names::bias(proj), {D}, Init::Zero);
    }
    if (k > 0) {
      add(names::relK(attn), {2 * k + 1, dh}, Init::Normal);
      add(names::relV(attn), {2 * k + 1, dh}, Init::Normal);
    }
    addNorm(names::attnNorm(layer));
    add(names::weight(names::ffnIn(ffn)), {F, D}, Init::Normal);
    add(names::bias(names::ffnIn(ffn)), {F}, Init::Zero);
    add(names::weight(names::ffnOut(ffn)), {D, F}, Init::Normal);
    add(names::bias(names::ffnOut(ffn)), {D}, Init::Zero);
    addNorm(names::ffnNorm(layer));
  }
  if (spec.norm == NormPlacement::Pre)
    addNorm(names::finalNorm());
  if (!spec.mlm) // encoder only: no output head
    return list;
  if (spec.headTransform) {
    add(names::weight(names::headTransform()), {D, D}, Init::Normal);
    add(names::bias(names::headTransform()), {D}, Init::Zero);
    addNorm(names::headNorm());
  }
  if (!spec.tied)
    add(names::headOutputWeight(), {V, D}, Init::Normal);
  if (spec.headBias)
    add(names::headBias(), {V}, Init::Zero);
  if (spec.ngram) { // heads j = 2..n: u_j = out_j(act(in_j(H))) (issue 18)
    const int64_t Dh = spec.ngram->hiddenWidth(D);
    for (int64_t j = 2; j <= spec.ngram->n; ++j) {
      const std::string head = names::ngramHead(j);
      add(names::weight(names::ffnIn(head)), {Dh, D}, Init::Normal);
      add(names::bias(names::ffnIn(head)), {Dh}, Init::Zero);
      add(names::weight(names::ffnOut(head)), {D, Dh}, Init::Normal);
      add(names::bias(names::ffnOut(head)), {D}, Init::Zero);
    }
  }
  return list;
}

// --- Hugging Face BERT names ---------------------------------------------------

/// What one Hugging Face tensor becomes.
struct HfTarget {
  enum Kind {
    Unknown,   ///< not a BertForMaskedLM tensor: an error
    Ignore,    ///< pooler, next-sentence head, position_ids
    TiedDecoder, ///< the decoder weight under a tied spec: must equal the word embeddings
    Canonical, ///< renamed to `name`
    Position,  ///< position table (cut, token-type row 0 folded in)
    TokenType, ///< token-type table (row 0 folded into the position table)
    HeadBias,  ///< cls.predictions.bias
    DecoderBias ///< cls.predictions.decoder.bias (the same parameter in HF)
  } kind = Unknown;
  std::string name;
};

/// names::weight or names::bias: a tensor of a linear layer or LayerNorm prefix.
using Leaf = std::string (*)(std::string_view prefix);

/// The canonical leaf of a dense layer's Hugging Face tensor "weight"/"bias"; null when unknown.
Leaf denseLeaf(const std::string &s) {
  if (s == "weight")
    return names::weight;
  if (s == "bias")
    return names::bias;
  return nullptr;
}

/// The same for a LayerNorm; TF-era checkpoints call its tensors gamma/beta.
Leaf layerNormLeaf(const std::string &s) {
  if (s == "weight" || s == "gamma")
    return names::weight;
  if (s == "bias" || s == "beta")
    return names::bias;
  return nullptr;
}

/// leaf(prefix), or "" (unknown) when there is no leaf.
std::string leafName(Leaf leaf, const std::string &prefix) { return leaf ? leaf(prefix) : ""; }

/// Maps the part of a layer name after "encoder.layer.{i}." to its canonical name in
/// `layer` (names::layer(i)); empty when unknown.
std::string mapLayerTensor(const std::string &rest, const std::string &layer) {
  struct Rule {
    const char *hf;
    std::string (*module)(std::string_view layer); ///< the canonical prefix in the layer
    bool layerNorm;
  };
  static const Rule rules[] = {
      {"attention.self.query.", [](std::string_view l) { return names::q(names::attn(l)); }, false},
      {"attention.self.key.", [](std::string_view l) { return names::k(names::attn(l)); }, false},
      {"attention.self.value.", [](std::string_view l) { return names::v(names::attn(l)); }, false},
      {"attention.output.dense.", [](std::string_view l) { return names::o(names::attn(l)); }, false},
      {"attention.output.LayerNorm.", names::attnNorm, true},
      {"intermediate.dense.", [](std::string_view l) { return names::ffnIn(names::ffn(l)); }, false},
      {"output.dense.", [](std::string_view l) { return names::ffnOut(names::ffn(l)); }, false},
      {"output.LayerNorm.", names::ffnNorm, true},
  };
  for (const Rule &r : rules) {
    if (!startsWith(rest, r.hf))
      continue;
    const std::string leaf = rest.substr(std::strlen(r.hf));
    return leafName(r.layerNorm ? layerNormLeaf(leaf) : denseLeaf(leaf), r.module(layer));
  }
  return "";
}

HfTarget mapHfName(const std::string &hfName, const ModelSpec &spec) {
  HfTarget t;
  auto canonical = [&](std::string name) {
    t.kind = name.empty() ? HfTarget::Unknown : HfTarget::Canonical;
    t.name = std::move(name);
    return t;
  };
  if (endsWith(hfName, "position_ids")) {
    t.kind = HfTarget::Ignore;
    return t;
  }

  // The masked-LM and next-sentence heads (an encoder-only spec uses neither).
  if (startsWith(hfName, "cls.")) {
    const std::string n = hfName.substr(4);
    if (startsWith(n, "seq_relationship.") || !spec.mlm) {
      t.kind = HfTarget::Ignore;
    } else if (startsWith(n, "predictions.transform.dense.")) {
      return canonical(leafName(denseLeaf(n.substr(std::strlen("predictions.transform.dense."))),
                                names::headTransform()));
    } else if (startsWith(n, "predictions.transform.LayerNorm.")) {
      return canonical(leafName(layerNormLeaf(n.substr(std::strlen("predictions.transform.LayerNorm."))),
                                names::headNorm()));
    } else if (n == "predictions.bias") {
      t.kind = HfTarget::HeadBias;
    } else if (n == "predictions.decoder.bias") {
      t.kind = HfTarget::DecoderBias;
    } else if (n == "predictions.decoder.weight") {
      // With tied embeddings the decoder weight is a copy of the word embeddings (checked below).
      if (spec.tied)
        t.kind = HfTarget::TiedDecoder;
      else
        return canonical(names::headOutputWeight());
    }
    return t;
  }

  // The encoder, with or without the "bert." prefix.
  const std::string n = startsWith(hfName, "bert.") ? hfName.substr(5) : hfName;
  if (startsWith(n, "pooler.")) {
    t.kind = HfTarget::Ignore;
  } else if (n == "embeddings.word_embeddings.weight") {
    return canonical(names::embedToken());
  } else if (n == "embeddings.position_embeddings.weight") {
    t.kind = HfTarget::Position;
  } else if (n == "embeddings.token_type_embeddings.weight") {
    t.kind = HfTarget::TokenType;
  } else if (startsWith(n, "embeddings.LayerNorm.")) {
    return canonical(
        leafName(layerNormLeaf(n.substr(std::strlen("embeddings.LayerNorm."))), names::embedNorm()));
  } else if (startsWith(n, "encoder.layer.")) {
    // encoder.layer.{i}.REST with i a plain decimal number (no leading zeros).
    const std::string afterLayer = n.substr(std::strlen("encoder.layer."));
    const size_t dot = afterLayer.find('.');
    const std::string index = afterLayer.substr(0, dot);
    const bool plainNumber =
        dot != std::string::npos && !index.empty() &&
        index.find_first_not_of("0123456789") == std::string::npos &&
        (index == "0" || index[0] != '0');
    if (plainNumber)
      return canonical(mapLayerTensor(afterLayer.substr(dot + 1), names::layer(index)));
  }
  return t;
}

bool sameTensor(const Tensor &a, const Tensor &b) {
  return a.shape == b.shape && a.data == b.data;
}

// --- Seeded initialization -----------------------------------------------------

/// N(0, stddev) truncated to [-2 stddev, 2 stddev] by resampling, from mt19937_64
/// (whose output sequence the standard fixes) through Box-Muller. The transform uses
/// only log, sqrt, sin and cos in double precision, so results agree across
/// platforms up to the last bit of a double, far below float resolution.
class TruncatedNormal {
public:
  explicit TruncatedNormal(uint64_t seed) : rng_(seed) {}

  float operator()(double stddev) {
    for (;;) {
      const double z = standard();
      if (std::fabs(z) <= 2.0)
        return static_cast<float>(stddev * z);
    }
  }

private:
  /// Uniform in (0, 1], from the top 53 bits.
  double uniform() { return static_cast<double>((rng_() >> 11) + 1) * 0x1p-53; }

  /// A standard normal sample; Box-Muller yields two, the second is kept.
  double standard() {
    if (hasSpare_) {
      hasSpare_ = false;
      return spare_;
    }
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = kTwoPi * uniform();
    spare_ = radius * std::sin(angle);
    hasSpare_ = true;
    return radius * std::cos(angle);
  }

  std::mt19937_64 rng_;
  bool hasSpare_ = false;
  double spare_ = 0.0;
};

} // namespace

std::vector<TensorInfo> expectedTensors(const ModelSpec &spec) {
  std::vector<TensorInfo> infos;
  for (ExpectedTensor &e : expectedList(spec))
    infos.push_back(std::move(e.info));
  return infos;
}

bool isHuggingFaceBert(const WeightSet &weights) {
  // Canonical names start with embed., layers., final_norm. or head.; none of these
  // prefixes can be confused with them.
  for (const auto &entry : weights.tensors) {
    const std::string &name = entry.first;
    if (startsWith(name, "bert.") || startsWith(name, "cls.") ||
        startsWith(name, "embeddings.") || startsWith(name, "encoder.layer.") ||
        startsWith(name, "pooler."))
      return true;
  }
  return false;
}

WeightSet importHuggingFaceBert(const WeightSet &hf, const ModelSpec &spec,
                                const std::string &path) {
  checkHuggingFaceConfig(path, spec);
  WeightSet out;
  out.metadata = hf.metadata;
  // Integer buffers: position_ids / token_type_ids are inputs, not weights; anything else is an error.
  for (const auto &[name, dtype] : hf.integerTensors)
    if (!endsWith(name, "position_ids") && !endsWith(name, "token_type_ids"))
      tensorError(path, name, "integer dtype " + lmcc::quoted(dtype) + ": not a Hugging Face BERT weight (only the "
                              "position_ids / token_type_ids buffers may be integers)");
  std::map<std::string, std::string> sourceOf; // canonical name -> HF name
  std::vector<std::string> unknown;
  const std::pair<const std::string, Tensor> *position = nullptr, *tokenType = nullptr,
                                             *headBias = nullptr, *decoderBias = nullptr, *tiedDecoder = nullptr;
  bool anyHead = false; // a cls.* tensor: a BertForMaskedLM checkpoint, not a BertModel one

  auto put = [&](const std::string &canonical, const std::string &hfName, Tensor t) {
    auto [it, inserted] = sourceOf.emplace(canonical, hfName);
    if (!inserted)
      tensorError(path, hfName, "maps to " + lmcc::quoted(canonical) + ", which " +
                                    lmcc::quoted(it->second) + " already provides");
    out.tensors[canonical] = std::move(t);
  };

  for (const auto &entry : hf.tensors) {
    const HfTarget target = mapHfName(entry.first, spec);
    anyHead = anyHead || startsWith(entry.first, "cls.predictions.");
    switch (target.kind) {
    case HfTarget::Unknown: unknown.push_back(entry.first); break;
    case HfTarget::Ignore: break;
    case HfTarget::TiedDecoder: tiedDecoder = &entry; break;
    case HfTarget::Canonical: put(target.name, entry.first, entry.second); break;
    case HfTarget::Position:
    case HfTarget::TokenType:
    case HfTarget::HeadBias:
    case HfTarget::DecoderBias: {
      auto &slot = target.kind == HfTarget::Position    ? position
                   : target.kind == HfTarget::TokenType ? tokenType
                   : target.kind == HfTarget::HeadBias  ? headBias
                                                        : decoderBias;
      if (slot) // the same tensor with and without the "bert." prefix
        tensorError(path, entry.first,
                    "duplicates " + lmcc::quoted(slot->first) + " (both with and without 'bert.')");
      slot = &entry;
      break;
    }
    }
  }
  if (!unknown.empty()) {
    std::string others;
    for (size_t i = 1; i < unknown.size() && i < 6; ++i)
      others += (i > 1 ? ", " : "") + lmcc::quoted(unknown[i]);
    if (unknown.size() > 6)
      others += ", ...";
    tensorError(path, unknown[0],
                "not a Hugging Face BertForMaskedLM or BertModel tensor" +
                    (unknown.size() > 1 ? " (" + std::to_string(unknown.size() - 1) +
                                              " more unknown: " + others + ")"
                                        : std::string()));
  }

  // A BertModel checkpoint has no masked-LM head: a spec with one cannot use it (it can embed with mlm = false).
  if (spec.mlm && !anyHead)
    throw WeightError(path + ": a Hugging Face BertModel checkpoint (no cls.predictions.* masked-LM head), but the "
                      "spec has an output head; set [head] mlm = false to embed with it (lmcc import-hf does so "
                      "for such a folder)");
  // A tied spec drops the decoder weight: only if it is the word embeddings (else the scores would silently be
  // another model's).
  if (tiedDecoder) {
    auto word = out.tensors.find(names::embedToken());
    if (word != out.tensors.end() && !sameTensor(word->second, tiedDecoder->second))
      tensorError(path, tiedDecoder->first, "differs from the word embeddings, but the spec ties the output head to "
                                            "them ([head] tied = true); set [head] tied = false");
  }
  // The MLM output bias: HF stores the same parameter under one or both names.
  if (headBias && decoderBias && !sameTensor(headBias->second, decoderBias->second))
    tensorError(path, decoderBias->first, "differs from " + lmcc::quoted(headBias->first));
  if (const auto *bias = headBias ? headBias : decoderBias)
    put(names::headBias(), bias->first, bias->second);

  // Positions: token-type row 0 (single-segment input) folded into every row,
  // the table cut to max_len.
  if (position) {
    const std::string &name = position->first;
    const Tensor &table = position->second;
    if (spec.position != PositionKind::Learned)
      tensorError(path, name, "the spec does not use learned positions");
    if (!isConsistentMatrix(table))
      tensorError(path, name, "expected a [positions, d_model] table, got shape " +
                                  shapeString(table.shape) + " with " +
                                  std::to_string(table.data.size()) + " values");
    const int64_t rows = table.shape[0], cols = table.shape[1], maxLen = spec.dims.maxLen;
    if (rows < maxLen)
      tensorError(path, name, "has " + std::to_string(rows) + " rows but max_len is " +
                                  std::to_string(maxLen));
    Tensor cut;
    cut.shape = {maxLen, cols};
    cut.data.assign(table.data.begin(), table.data.begin() + maxLen * cols);
    if (tokenType) {
      const Tensor &types = tokenType->second;
      if (!isConsistentMatrix(types) || types.shape[0] < 1 || types.shape[1] != cols)
        tensorError(path, tokenType->first,
                    "expected a [types, " + std::to_string(cols) + "] table, got shape " +
                        shapeString(types.shape));
      for (int64_t r = 0; r < maxLen; ++r)
        for (int64_t c = 0; c < cols; ++c)
          cut.data[r * cols + c] += types.data[c];
    }
    put(names::embedPosition(), name, std::move(cut));
  } else if (tokenType) {
    tensorError(path, tokenType->first,
                "cannot be folded: the checkpoint has no position_embeddings table");
  }
  // Checked against the spec here, where the Hugging Face name of each tensor is known: an error names
  // the file the user gave and, after the canonical name, the checkpoint's own.
  try {
    validateWeights(out, spec, path);
  } catch (const WeightError &e) {
    std::string what = e.what();
    for (const auto &[canonical, hfName] : sourceOf) {
      const std::string quotedName = "tensor " + lmcc::quoted(canonical) + ":";
      if (const size_t at = what.find(quotedName); at != std::string::npos) {
        what.insert(at + quotedName.size() - 1, " (Hugging Face " + lmcc::quoted(hfName) + ")");
        break;
      }
    }
    throw WeightError(what);
  }
  return out;
}

void checkHuggingFaceConfig(const std::string &weightsPath, const ModelSpec &spec) {
  namespace fs = std::filesystem;
  const fs::path config = fs::path(weightsPath).parent_path() / "config.json";
  const std::string where = config.string();
  std::error_code ec;
  if (fs::exists(config, ec) && !fs::is_regular_file(config, ec))
    throw WeightError(where + ": not a regular file (a Hugging Face config.json is read beside the weights)");
  std::ifstream in(config, std::ios::binary);
  if (!in)
    return;
  nlohmann::json j;
  try {
    j = parseUniqueJson(in);
  } catch (const DuplicateJsonKey &e) {
    throw WeightError(where + ": " + e.what());
  } catch (const std::exception &e) { // JSON errors, and read errors
    throw WeightError(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object())
    throw WeightError(where + ": expected a JSON object (a Hugging Face model config)");
  const std::string specName = spec.sourcePath.empty() ? "the spec" : spec.sourcePath;
  auto mismatch = [&](const std::string &key, const std::string &have, const std::string &want) {
    throw WeightError(where + ": \"" + key + "\" is " + have + " but " + specName + " has " + want +
                      " (the checkpoint does not match the spec)");
  };
  // A key of another JSON type than HF writes is refused, as import-hf refuses it (`"hidden_act": null` was skipped).
  for (auto [key, ok, type] : {std::tuple{"model_type", &nlohmann::json::is_string, "a string"},
                               std::tuple{"hidden_act", &nlohmann::json::is_string, "a string"},
                               std::tuple{"position_embedding_type", &nlohmann::json::is_string, "a string"},
                               std::tuple{"layer_norm_eps", &nlohmann::json::is_number, "a number"},
                               std::tuple{"max_position_embeddings", &nlohmann::json::is_number_integer, "an integer"},
                               std::tuple{"tie_word_embeddings", &nlohmann::json::is_boolean, "true or false"},
                               std::tuple{"is_decoder", &nlohmann::json::is_boolean, "true or false"}})
    if (j.contains(key) && !(j[key].*ok)())
      throw WeightError(where + ": \"" + key + "\" must be " + type + ", got " + j[key].dump());
  if (j.contains("model_type") && j["model_type"] != "bert")
    mismatch("model_type", j["model_type"].dump(), "a BERT model (model_type \"bert\")");
  const std::pair<const char *, std::pair<int64_t, const char *>> ints[] = {
      {"vocab_size", {spec.dims.vocab, "[dims] vocab"}},
      {"hidden_size", {spec.dims.dModel, "[dims] d_model"}},
      {"num_hidden_layers", {spec.dims.layers, "[dims] layers"}},
      {"num_attention_heads", {spec.dims.heads, "[dims] heads"}},
      {"intermediate_size", {spec.dims.dFF, "[dims] d_ff"}}};
  for (const auto &[key, want] : ints) {
    if (!j.contains(key))
      continue;
    if (!j[key].is_number_integer())
      throw WeightError(where + ": \"" + key + "\" is not an integer");
    if (j[key].get<int64_t>() != want.first)
      mismatch(key, j[key].dump(), std::string(want.second) + " = " + std::to_string(want.first));
  }
  if (j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer() &&
      j["max_position_embeddings"].get<int64_t>() < spec.dims.maxLen)
    mismatch("max_position_embeddings", j["max_position_embeddings"].dump(),
             "[dims] max_len = " + std::to_string(spec.dims.maxLen) + " (more positions than the checkpoint has)");
  if (j.contains("layer_norm_eps") && j["layer_norm_eps"].is_number()) {
    double eps = j["layer_norm_eps"].get<double>();
    if (std::fabs(eps - spec.eps) > 1e-6 * std::fabs(spec.eps))
      mismatch("layer_norm_eps", j["layer_norm_eps"].dump(), "[block] eps = " + nlohmann::json(spec.eps).dump());
  }
  if (j.contains("hidden_act") && j["hidden_act"].is_string()) {
    const std::string act = j["hidden_act"];
    const char *want = act == "gelu"                                        ? "gelu"
                       : act == "gelu_new" || act == "gelu_pytorch_tanh" ? "gelu_tanh"
                       : act == "relu"                                      ? "relu"
                                                                            : nullptr;
    if (!want)
      throw WeightError(where + ": \"hidden_act\" \"" + act + "\" is not supported (gelu, gelu_new, "
                        "gelu_pytorch_tanh, relu)");
    if (std::string(want) != toString(spec.activation))
      mismatch("hidden_act", "\"" + act + "\"", std::string("[block] activation = \"") +
                                                     toString(spec.activation) + "\" (use \"" + want + "\")");
  }
  if (spec.mlm && spec.tied && j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == false)
    mismatch("tie_word_embeddings", "false", "[head] tied = true (set tied = false)");
  // is_decoder: HF's BERT with causal self-attention; its weights under a bidirectional family would score as
  // another model with no error.
  if (j.contains("is_decoder") && j["is_decoder"] == true && spec.family != Family::UniLM)
    mismatch("is_decoder", "true (causal self-attention)", "a bidirectional family (family = \"unilm\" is causal)");
  if (j.contains("position_embedding_type") && j["position_embedding_type"] != "absolute")
    mismatch("position_embedding_type", j["position_embedding_type"].dump(), "learned absolute positions");
}

void validateWeights(const WeightSet &weights, const ModelSpec &spec, const std::string &path) {
  for (const auto &[name, dtype] : weights.integerTensors)
    tensorError(path, name, "integer dtype " + lmcc::quoted(dtype) + ": model weights are floating point");
  const std::vector<ExpectedTensor> expected = expectedList(spec);
  std::set<std::string> expectedNames;
  for (const ExpectedTensor &e : expected)
    expectedNames.insert(e.info.name);

  // Missing tensors, in canonical order.
  std::vector<const TensorInfo *> missing;
  for (const ExpectedTensor &e : expected)
    if (!weights.has(e.info.name))
      missing.push_back(&e.info);
  if (!missing.empty())
    tensorError(path, missing[0]->name,
                "missing (expected shape " + shapeString(missing[0]->shape) + ")" +
                    (missing.size() > 1
                         ? "; " + std::to_string(missing.size() - 1) + " more missing"
                         : std::string()));

  // Tensors the spec does not use.
  for (const auto &entry : weights.tensors) {
    if (expectedNames.count(entry.first))
      continue;
    std::string hint;
    if (entry.first == names::headOutputWeight() && spec.tied)
      hint = " (the spec ties the output head to " + names::embedToken() + ")";
    else if (entry.first == names::embedPosition() && spec.position != PositionKind::Learned)
      hint = " (the spec does not use learned positions)";
    tensorError(path, entry.first, "unexpected for spec " + lmcc::quoted(spec.name) + hint);
  }

  // Shapes and values.
  for (const ExpectedTensor &e : expected) {
    const Tensor &t = weights.tensors.at(e.info.name);
    if (t.shape != e.info.shape)
      tensorError(path, e.info.name,
                  "wrong shape: expected " + shapeString(e.info.shape) + ", got " +
                      shapeString(t.shape));
    const int64_t numel = checkedNumel(t.shape);
    if (numel < 0 || static_cast<uint64_t>(numel) != t.data.size())
      tensorError(path, e.info.name,
                  "holds " + std::to_string(t.data.size()) + " values but shape " +
                      shapeString(t.shape) + " needs " + std::to_string(numel));
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        tensorError(path, e.info.name,
                    "non-finite value " + valueString(t.data[i]) + " at flat index " +
                        std::to_string(i));
  }
}

WeightSet loadModelWeights(const std::string &path, const ModelSpec &spec) {
  WeightSet weights = readSafetensors(path);
  if (isHuggingFaceBert(weights))
    return importHuggingFaceBert(weights, spec, path); // validated there
  validateWeights(weights, spec, path);
  return weights;
}

WeightSet initWeights(const ModelSpec &spec, uint64_t seed) {
  constexpr double kStddev = 0.02;
  WeightSet weights;
  TruncatedNormal normal(seed);
  // One generator drawn in canonical order: the values depend only on the seed and
  // the spec's tensor list.
  for (const ExpectedTensor &e : expectedList(spec)) {
    Tensor t;
    t.shape = e.info.shape;
    const size_t n = static_cast<size_t>(checkedNumel(t.shape));
    switch (e.init) {
    case Init::Normal:
      t.data.resize(n);
      for (float &v : t.data)
        v = normal(kStddev);
      break;
    case Init::Zero: t.data.assign(n, 0.0f); break;
    case Init::One: t.data.assign(n, 1.0f); break;
    }
    weights.tensors.emplace(e.info.name, std::move(t));
  }
  weights.metadata = {{"name", spec.name}, {"spec_hash", specHash(spec)}, {"format", "lmcc"}};
  return weights;
}

} // namespace lmcc
