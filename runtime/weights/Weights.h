//===- Weights.h - Named float32 tensors, safetensors I/O, model weights ---===//
//
// Two layers:
//  * Safetensors I/O (no spec): read any safetensors file into named float32
//    tensors (F32, F16 and BF16 converted), validating the header JSON, dtypes,
//    shapes, offsets inside the file and overlaps; write float32 files.
//  * Model weights (spec-aware): the canonical tensor list a ModelSpec needs,
//    import of Hugging Face BERT names, validation against the spec (missing,
//    unexpected, wrong shape, non-finite values), seeded BERT-style init.
// Every error is a WeightError whose message names the file and the tensor.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace lmcc {

/// A dense row-major float32 tensor.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const;
};

/// Named tensors plus the file's `__metadata__` string map.
struct WeightSet {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  /// The tensor `name`; throws WeightError naming it when absent.
  const Tensor &get(const std::string &name) const;
  bool has(const std::string &name) const { return tensors.count(name) != 0; }
};

struct WeightError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Reads a safetensors file. Throws WeightError ("FILE: tensor 'NAME': ...").
WeightSet readSafetensors(const std::string &path);
/// Writes all tensors as F32 with the metadata. Throws WeightError on I/O failure.
void writeSafetensors(const std::string &path, const WeightSet &weights);

/// Name and shape of one tensor a model needs.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
};
/// The canonical tensors (DESIGN.md names, linear weights [out, in]) that `spec`
/// needs, in a stable order. Supports families unilm, bilm and tta.
std::vector<TensorInfo> expectedTensors(const ModelSpec &spec);

/// True when the names look like a Hugging Face BERT checkpoint (`bert.*`, `cls.*`).
bool isHuggingFaceBert(const WeightSet &weights);
/// Maps Hugging Face BertForMaskedLM names to canonical names: folds token-type row 0
/// into the position table, cuts a longer position table to max_len (shorter is an
/// error), ignores bert.pooler.*, cls.seq_relationship.* and *.position_ids.
WeightSet importHuggingFaceBert(const WeightSet &hf, const ModelSpec &spec, const std::string &path);

/// Checks `weights` against expectedTensors(spec): missing, unexpected, shape, and
/// non-finite values, each error naming the tensor. `path` is used in messages.
void validateWeights(const WeightSet &weights, const ModelSpec &spec, const std::string &path);

/// readSafetensors + (HF import when the names are HF) + validateWeights.
WeightSet loadModelWeights(const std::string &path, const ModelSpec &spec);

/// Seeded BERT-style initialization: linear and embedding weights ~ N(0, 0.02)
/// truncated at 2 sigma, biases 0, LayerNorm weight 1 and bias 0. Metadata records
/// the spec's name and specHash(). Deterministic across platforms for a seed.
WeightSet initWeights(const ModelSpec &spec, uint64_t seed);

} // namespace lmcc
