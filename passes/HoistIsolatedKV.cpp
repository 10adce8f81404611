//===- HoistIsolatedKV.cpp - lm-hoist-isolated-kv ---------------------------===//
//
// Projections that read the same value become one wide GEMM. Under T-TA's input
// isolation every layer's keys and values are projections of the one embedding
// value X, so the 2L projections of the layer stack become
//   kv = linear(X, concat(Wk0, Wv0, Wk1, ...), concat(bk0, bv0, ...))
// computed once before the stack, and each layer reads its slice. In a standard
// stack the same rewrite joins each layer's Q/K/V projections of its input. Exact:
// every output feature is the same dot product. lmcc lays stacked weights out
// contiguously at load time, so the concatenation costs nothing.
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"
#include "passes/Utils.h"

#include "llvm/ADT/MapVector.h"

namespace lmcc {
#define GEN_PASS_DEF_LMHOISTISOLATEDKV
#include "passes/Passes.h.inc"
} // namespace lmcc

using namespace mlir;
using namespace lmcc;

namespace {

struct LmHoistIsolatedKV : lmcc::impl::LmHoistIsolatedKVBase<LmHoistIsolatedKV> {
  void runOnOperation() override {
    SmallVector<Block *> blocks;
    getOperation().walk([&](Block *block) {
      if (!inTrainingFunction(block->getParentOp()))
        blocks.push_back(block);
    });
    for (Block *block : blocks)
      hoist(*block);
  }

  /// Groups the linears of `block` by input (weights and biases must be lm.weight
  /// values, all with or all without bias) and stacks groups of two or more.
  void hoist(Block &block) {
    llvm::MapVector<Value, SmallVector<lm::LinearOp>> groups;
    for (Operation &op : block)
      if (auto linear = dyn_cast<lm::LinearOp>(op))
        if (linear.getWeight().getDefiningOp<lm::WeightOp>() &&
            (!linear.getBias() || linear.getBias().getDefiningOp<lm::WeightOp>()))
          groups[linear.getInput()].push_back(linear);
    for (auto &[input, linears] : groups) {
      bool withBias = bool(linears.front().getBias());
      llvm::erase_if(linears, [&](lm::LinearOp l) { return bool(l.getBias()) != withBias || l.getActivation(); });
      if (linears.size() < 2)
        continue;
      stack(input, linears, withBias);
    }
  }

  void stack(Value input, SmallVector<lm::LinearOp> linears, bool withBias) {
    OpBuilder builder(linears.front().getOperation());
    Location loc = linears.front().getLoc();
    // Fresh weight ops here: the originals may be defined after the first linear.
    SmallVector<Value> weights, biases;
    int64_t rows = 0, in = linears.front().getWeight().getType().getDimSize(1);
    for (lm::LinearOp l : linears) {
      auto w = l.getWeight().getDefiningOp<lm::WeightOp>();
      weights.push_back(builder.create<lm::WeightOp>(loc, w.getType(), w.getNameAttr()));
      if (withBias) {
        auto b = l.getBias().getDefiningOp<lm::WeightOp>();
        biases.push_back(builder.create<lm::WeightOp>(loc, b.getType(), b.getNameAttr()));
      }
      rows += w.getType().getDimSize(0);
    }
    Type f32 = builder.getF32Type();
    Value weight = builder.create<lm::ConcatOp>(loc, RankedTensorType::get({rows, in}, f32), weights);
    Value bias = withBias ? Value(builder.create<lm::ConcatOp>(loc, RankedTensorType::get({rows}, f32), biases))
                          : Value();
    auto inType = llvm::cast<RankedTensorType>(input.getType());
    SmallVector<int64_t> shape(inType.getShape());
    shape.back() = rows;
    Value wide = builder.create<lm::LinearOp>(loc, RankedTensorType::get(shape, f32), input, weight, bias);
    // Build every slice before erasing: the builder inserts before the first linear.
    SmallVector<Value> slices;
    int64_t offset = 0;
    for (lm::LinearOp l : linears) {
      int64_t size = l.getType().getShape().back();
      slices.push_back(builder.create<lm::SliceFeaturesOp>(loc, l.getType(), wide, builder.getI64IntegerAttr(offset),
                                                           builder.getI64IntegerAttr(size)));
      offset += size;
    }
    for (auto [l, slice] : llvm::zip(linears, slices)) {
      l.replaceAllUsesWith(slice);
      l.erase();
    }
  }
};

} // namespace
