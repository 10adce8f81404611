//===- WeightLayoutIR.cpp - The weight layout of an optimized lm module -----===//
#include "codegen/Layout/WeightLayout.h"

#include "codegen/LmToLoops/Lowering.h"
#include "dialect/LmDialect.h"

#include "mlir/IR/BuiltinOps.h"

#include <map>

using namespace mlir;

namespace lmcc::codegen {
namespace {

std::vector<int64_t> shapeOf(Type type) {
  auto shaped = llvm::cast<ShapedType>(type);
  return {shaped.getShape().begin(), shaped.getShape().end()};
}

} // namespace

WeightLayout computeWeightLayout(ModuleOp module, bool packGemmWeights, bool bf16) {
  // 1. Loaded tensors in the order the IR first names them. Each lm.concat of weights none of which is in an
  //    earlier stack is a stack: its tensors lie back to back (the first aligned, the rest unpadded), placed
  //    where the IR first names one of them. A concat overlapping an earlier stack is copied at run time.
  std::vector<std::vector<std::string>> stacks;
  std::map<std::string, size_t> stackOf;
  module.walk([&](lm::ConcatOp concat) {
    std::vector<std::string> names = weightNames(concat.getResult());
    bool free = !names.empty();
    for (const std::string &name : names)
      free = free && !stackOf.count(name);
    if (!free)
      return;
    for (const std::string &name : names)
      stackOf[name] = stacks.size();
    stacks.push_back(names);
  });
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> order;
  module.walk([&](lm::WeightOp w) {
    if (shapes.emplace(w.getName().str(), shapeOf(w.getType())).second)
      order.push_back(w.getName().str());
  });
  std::vector<LayoutTensor> ordered;
  std::set<std::string> placed, stacked;
  for (const std::string &name : order) {
    if (placed.count(name))
      continue;
    auto it = stackOf.find(name);
    const std::vector<std::string> single{name};
    const std::vector<std::string> &members = it == stackOf.end() ? single : stacks[it->second];
    for (size_t i = 0; i < members.size(); ++i) {
      ordered.push_back({members[i], shapes[members[i]]});
      placed.insert(members[i]);
      if (i > 0)
        stacked.insert(members[i]);
    }
  }
  auto isStack = [&](const std::vector<std::string> &names) {
    auto it = stackOf.find(names[0]);
    return names.size() == 1 || (it != stackOf.end() && stacks[it->second] == names);
  };

  WeightLayout layout;
  layout.bf16 = packGemmWeights && bf16;
  std::vector<WeightLayout::Entry> entries;
  for (const LayoutTensor &t : ordered)
    entries.push_back({t, WeightLayout::Kind::Loaded, 0, {}, 0, 0});
  // 2. Folded tables: [max_len, width] per lm.fold function.
  auto *dialect = module.getContext()->getLoadedDialect<lm::LmDialect>();
  int64_t maxLen = dialect->getModelAttrHelper().getAttr(module).getMaxLen();
  for (auto fn : module.getOps<func::FuncOp>())
    if (dialect->getFoldAttrHelper().isAttrPresent(fn))
      entries.push_back({{fn.getSymName().str(), {maxLen, llvm::cast<ShapedType>(fn.getResultTypes()[0]).getDimSize(2)}},
                         WeightLayout::Kind::Folded, 0, {}, 0, 0});
  // 3. Packed GEMM weights, once per weight; stacked weights only when their tensors lie back to back.
  if (packGemmWeights) {
    std::set<std::string> seen;
    module.walk([&](Operation *op) {
      Value weight;
      if (auto l = dyn_cast<lm::LinearOp>(op))
        weight = l.getWeight();
      else if (auto t = dyn_cast<lm::TokenLogprobOp>(op))
        weight = t.getWeight();
      else
        return;
      std::vector<std::string> names = weightNames(weight);
      auto type = llvm::cast<RankedTensorType>(weight.getType());
      if (names.empty() || type.getRank() != 2 || !seen.insert(packKey(names)).second)
        return;
      if (!isStack(names))
        return;
      int64_t n = type.getDimSize(0), k = type.getDimSize(1);
      entries.push_back({{packKey(names), {packedRows(n, k, bf16), kPanel}}, WeightLayout::Kind::Packed, 0, names, n, k});
    });
  }
  std::vector<LayoutTensor> all;
  for (const auto &e : entries)
    all.push_back(e.tensor);
  std::vector<int64_t> offsets = layoutOffsets(all, &layout.totalFloats, stacked);
  for (size_t i = 0; i < entries.size(); ++i)
    entries[i].offset = offsets[i];
  layout.entries = std::move(entries);
  return layout;
}

} // namespace lmcc::codegen
