//===- Safetensors.h - Named float32 tensors and safetensors I/O ----------===//
//
// Spec-free: read any safetensors file into named float32 tensors (F32, F16, BF16
// and F64 converted), validating the header JSON, dtypes, shapes, offsets inside
// the file and overlaps; write float32 files. liblmrt links this part only, so
// nothing here may depend on the spec (the spec-aware layer is ModelWeights.h).
// Every error is a WeightError whose message names the file and the tensor.
//
//===----------------------------------------------------------------------===//
#pragma once

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
  /// Integer and boolean tensors (name -> dtype, e.g. "I64"): checked in the header, not loaded.
  /// Model weights never are; importers ignore known buffers (position_ids) and reject others.
  std::map<std::string, std::string> integerTensors;
  /// The tensor `name`; throws WeightError naming it when absent.
  const Tensor &get(const std::string &name) const;
  bool has(const std::string &name) const { return tensors.count(name) != 0; }
};

struct WeightError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Name and shape of one tensor a model needs.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
};

/// Reads a safetensors file. Throws WeightError ("FILE: tensor 'NAME': ...").
WeightSet readSafetensors(const std::string &path);
/// Writes all tensors as F32 with the metadata, to a temporary name then renamed into place (never a
/// half-written file at `path`). Throws WeightError on I/O failure.
void writeSafetensors(const std::string &path, const WeightSet &weights);

} // namespace lmcc
