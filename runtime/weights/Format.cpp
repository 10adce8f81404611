//===- Format.cpp - How names, shapes and values appear in messages -------===//
#include "runtime/weights/Format.h"

#include <cmath>

namespace lmcc {

std::string quoted(const std::string &name) {
  constexpr size_t kMax = 200;
  if (name.size() <= kMax)
    return "'" + name + "'";
  return "'" + name.substr(0, kMax) + "...' (" + std::to_string(name.size()) + " bytes)";
}

std::string shapeString(const std::vector<int64_t> &shape) {
  constexpr size_t kMaxDims = 16;
  std::string s = "[";
  for (size_t i = 0; i < shape.size() && i < kMaxDims; ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > kMaxDims)
    s += ", ... (" + std::to_string(shape.size()) + " dims)";
  return s + "]";
}

std::string valueString(float v) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  return std::to_string(v);
}

} // namespace lmcc
