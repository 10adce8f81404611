// The lane reductions of the generated kernels (codegen/LmToLoops/Elementwise.cpp): emitAcrossLanesOfEach, which the
// attention kernels use for a tile's row maxima, row sums and 1 / l, must give the bits emitAcrossLanes gives each
// vector apart, for any count of vectors (odd counts leave one without a partner at some swap; more than 16 leave
// several merged vectors), and apply its `then` once per merged vector with the same result.
#include "codegen/LmToLoops/Lowering.h"
#include "tests/unit/KernelLibrary.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace mlir;

constexpr int64_t kLanes = 16;
const int64_t kCounts[] = {1, 2, 3, 5, 8, 9, 16, 17, 33};
const char *const kKinds[] = {"sum", "max", "inverse"};

std::string kernelName(const char *kind, int64_t n, bool merged) {
  return std::string(merged ? "merged_" : "apart_") + kind + "_" + std::to_string(n);
}

/// out[16 r .. 16 r + 16) = the reduction of vector r of in (n vectors of 16): emitAcrossLanesOfEach over all n
/// (`merged`) or emitAcrossLanes on each; "inverse" is the sum, then 1 / x.
void addKernel(OpBuilder &b, ModuleOp module, const char *kind, int64_t n, bool merged) {
  Location loc = b.getUnknownLoc();
  auto f32 = b.getF32Type();
  auto vt = VectorType::get({kLanes}, f32);
  auto buffer = MemRefType::get({ShapedType::kDynamic}, f32);
  b.setInsertionPointToEnd(module.getBody());
  auto func = b.create<func::FuncOp>(loc, kernelName(kind, n, merged), b.getFunctionType({buffer, buffer}, {}));
  func->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = func.addEntryBlock();
  b.setInsertionPointToStart(entry);
  const bool sum = std::string(kind) != "max", inverse = std::string(kind) == "inverse";
  auto combine = [&](Value x, Value y) {
    return sum ? Value(b.create<arith::AddFOp>(loc, x, y)) : lmcc::codegen::emitGreater(b, loc, x, y);
  };
  std::function<Value(Value)> then;
  if (inverse)
    then = [&](Value x) -> Value {
      Value one = b.create<arith::ConstantOp>(loc, vt, DenseElementsAttr::get(vt, b.getF32FloatAttr(1.0f)));
      return b.create<arith::DivFOp>(loc, one, x);
    };
  SmallVector<Value> xs;
  for (int64_t r = 0; r < n; ++r)
    xs.push_back(b.create<vector::LoadOp>(loc, vt, entry->getArgument(0),
                                          ValueRange{b.create<arith::ConstantIndexOp>(loc, r * kLanes)}));
  SmallVector<Value> ys;
  if (merged) {
    ys = lmcc::codegen::emitAcrossLanesOfEach(b, loc, xs, combine, then);
  } else {
    for (Value x : xs) {
      Value y = lmcc::codegen::emitAcrossLanes(b, loc, x, combine);
      ys.push_back(then ? then(y) : y);
    }
  }
  for (int64_t r = 0; r < n; ++r)
    b.create<vector::StoreOp>(loc, ys[r], entry->getArgument(1),
                              ValueRange{b.create<arith::ConstantIndexOp>(loc, r * kLanes)});
  b.create<func::ReturnOp>(loc);
}

class LaneReduction : public lmcc::test::KernelTest {
protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(buildKernels("lanereduction", [](OpBuilder &b, ModuleOp module) {
      for (const char *kind : kKinds)
        for (int64_t n : kCounts)
          for (bool merged : {false, true})
            addKernel(b, module, kind, n, merged);
    }));
  }
  std::vector<float> run(const std::string &name, std::vector<float> x) {
    return library.runOnVector(name, std::move(x));
  }
};

/// n vectors of values spread over many magnitudes and both signs (so that the order of a sum's additions shows in
/// its bits), with some -inf (a masked score) and, unless `signedZeros` is false, some +0 and -0.
std::vector<float> inputs(int64_t n, std::mt19937 &rng, bool signedZeros) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20), special(0, 15);
  std::vector<float> x(n * kLanes);
  for (float &v : x) {
    v = std::ldexp(mantissa(rng), exponent(rng));
    int s = special(rng);
    if (s == 0)
      v = -INFINITY;
    else if (signedZeros && s == 1)
      v = 0.0f;
    else if (signedZeros && s == 2)
      v = -0.0f;
  }
  return x;
}

TEST_F(LaneReduction, MergedVectorsGiveEachVectorsBits) {
  std::mt19937 rng(7);
  for (const char *kind : kKinds)
    for (int64_t n : kCounts)
      for (int trial = 0; trial < 50; ++trial) {
        // Sums: every lane of a vector's butterfly has the same bits, whatever the data. Maxima: the same unless
        // +0 and -0 tie (x86's max keeps the second), so their bits are compared on data without zeros.
        const bool signedZeros = std::string(kind) != "max";
        std::vector<float> x = inputs(n, rng, signedZeros);
        const std::vector<float> apart = run(kernelName(kind, n, false), x), merged = run(kernelName(kind, n, true), x);
        for (int64_t i = 0; i < n * kLanes; ++i)
          ASSERT_EQ(std::memcmp(&apart[i], &merged[i], sizeof(float)), 0)
              << kind << " of " << n << " vectors, vector " << i / kLanes << " lane " << i % kLanes << ": "
              << apart[i] << " apart, " << merged[i] << " merged";
      }
}

TEST_F(LaneReduction, MergedMaximaEqualWithSignedZeros) {
  std::mt19937 rng(11);
  for (int64_t n : kCounts)
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x = inputs(n, rng, /*signedZeros=*/true);
      const std::vector<float> apart = run(kernelName("max", n, false), x), merged = run(kernelName("max", n, true), x);
      for (int64_t r = 0; r < n; ++r) {
        float want = -INFINITY;
        for (int64_t l = 0; l < kLanes; ++l)
          want = std::max(want, x[r * kLanes + l]);
        for (int64_t l = 0; l < kLanes; ++l) {
          ASSERT_EQ(apart[r * kLanes + l], want) << n << " vectors, vector " << r << " lane " << l;
          ASSERT_EQ(merged[r * kLanes + l], want) << n << " vectors, vector " << r << " lane " << l;
        }
      }
    }
}

} // namespace
