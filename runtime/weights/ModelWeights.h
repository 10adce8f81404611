//===- ModelWeights.h - Spec-aware model weights ---------------------------===//
//
// The weights a ModelSpec needs: the canonical tensor list (names from
// WeightNames.h, linear weights [out, in]), import of Hugging Face BERT names,
// validation against the spec (missing, unexpected, wrong shape, non-finite
// values) and seeded BERT-style init. The compiler and the reference executor use
// this layer; liblmrt does not (it sees only Safetensors.h).
// Every error is a WeightError whose message names the file and the tensor.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/weights/Safetensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace lmcc {

/// The canonical tensors (DESIGN.md names, linear weights [out, in]) that `spec`
/// needs, in a stable order. Supports families unilm, bilm and tta.
std::vector<TensorInfo> expectedTensors(const ModelSpec &spec);

/// True when the names look like a Hugging Face BERT checkpoint (`bert.*`, `cls.*`).
bool isHuggingFaceBert(const WeightSet &weights);
/// Maps Hugging Face BertForMaskedLM and BertModel names (the "bert." prefix optional) to canonical
/// names: folds token-type row 0 into the position table, cuts a longer position table to max_len
/// (shorter is an error), ignores pooler.*, cls.seq_relationship.*, the integer buffers
/// *position_ids / *token_type_ids, and with [head] mlm = false the MLM head cls.predictions.*.
/// Checks a config.json beside `path` first (checkHuggingFaceConfig) and the result against the spec
/// (validateWeights; errors name `path` and the tensor's Hugging Face name where it has one).
WeightSet importHuggingFaceBert(const WeightSet &hf, const ModelSpec &spec, const std::string &path);

/// When a Hugging Face `config.json` lies beside `weightsPath`, checks it against the spec (model_type,
/// vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
/// max_position_embeddings >= max_len, layer_norm_eps, hidden_act, position_embedding_type); throws
/// WeightError naming config.json and the key. Called by importHuggingFaceBert.
void checkHuggingFaceConfig(const std::string &weightsPath, const ModelSpec &spec);

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
