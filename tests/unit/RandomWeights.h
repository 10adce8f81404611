// Random canonical weights for compiled-model tests: enough spread that attention and the head are not flat.
#pragma once

#include "runtime/weights/ModelWeights.h"

#include <cmath>
#include <random>

namespace lmcc::test {

inline WeightSet randomWeights(const ModelSpec &spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  WeightSet w;
  for (const TensorInfo &t : expectedTensors(spec)) {
    Tensor tensor;
    tensor.shape = t.shape;
    tensor.data.resize(tensor.numel());
    bool isNorm = t.name.find("norm.weight") != std::string::npos;
    float scale = t.shape.size() == 2 ? 1.0f / std::sqrt(float(t.shape[1])) : 0.1f;
    if (t.name == "embed.token" || t.name == "embed.position")
      scale = 0.5f;
    for (float &v : tensor.data)
      v = (isNorm ? 1.0f : 0.0f) + scale * normal(rng);
    w.tensors[t.name] = std::move(tensor);
  }
  return w;
}

} // namespace lmcc::test
