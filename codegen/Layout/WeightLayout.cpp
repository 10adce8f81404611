//===- WeightLayout.cpp - Offsets of the flat weight buffer (plain C++) -----===//
#include "codegen/Layout/WeightLayout.h"

#include <limits>
#include <stdexcept>

namespace lmcc::codegen {
namespace {

int64_t roundUp(int64_t v) { return (v + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

} // namespace

int64_t numelOf(const LayoutTensor &t) {
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / 2 / d))
      throw std::invalid_argument("tensor '" + t.name + "' has an invalid shape");
    n *= d;
  }
  return n;
}

std::vector<int64_t> layoutOffsets(const std::vector<LayoutTensor> &tensors, int64_t *totalFloats,
                                   const std::set<std::string> &stacked) {
  std::vector<int64_t> offsets;
  offsets.reserve(tensors.size());
  int64_t cursor = 0;
  for (const LayoutTensor &t : tensors) {
    const int64_t numel = numelOf(t);
    if (!stacked.count(t.name))
      cursor = roundUp(cursor);
    offsets.push_back(cursor);
    if (numel > std::numeric_limits<int64_t>::max() / 2 - cursor)
      throw std::invalid_argument("the weights do not fit in a 64-bit buffer");
    cursor += numel;
  }
  if (totalFloats)
    *totalFloats = roundUp(cursor);
  return offsets;
}

const WeightLayout::Entry *WeightLayout::find(const std::string &name) const {
  for (const Entry &e : entries)
    if (e.tensor.name == name)
      return &e;
  return nullptr;
}

std::vector<LayoutTensor> WeightLayout::loadedTensors() const {
  std::vector<LayoutTensor> out;
  for (const Entry &e : entries)
    if (e.kind == Kind::Loaded)
      out.push_back(e.tensor);
  return out;
}

std::vector<int64_t> WeightLayout::loadedOffsets() const {
  std::vector<int64_t> out;
  for (const Entry &e : entries)
    if (e.kind == Kind::Loaded)
      out.push_back(e.offset);
  return out;
}

std::string packKey(const std::vector<std::string> &names) {
  std::string key = "pack:";
  for (size_t i = 0; i < names.size(); ++i)
    key += (i ? "|" : "") + names[i];
  return key;
}

} // namespace lmcc::codegen
