// The activations the generated code applies (codegen/LmToLoops/Elementwise.cpp, emitActivation): GELU against
// x Phi(x) in double over a dense sweep and the special values, on vector<16xf32> (the GEMM epilogue, lm-fuse-activation)
// and on scalars (the activation op's row loop, vectorized by LLVM): the two forms must give the same bits.
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
#include <limits>
#include <vector>

namespace {

using namespace mlir;

/// out[i] = activation(in[i]) for i < size: `vector` in steps of 16 (size a multiple of 16), else element by element.
void addKernel(OpBuilder &b, ModuleOp module, StringRef name, StringRef kind, bool vector) {
  Location loc = b.getUnknownLoc();
  auto f32 = b.getF32Type();
  auto buffer = MemRefType::get({ShapedType::kDynamic}, f32);
  b.setInsertionPointToEnd(module.getBody());
  auto func = b.create<func::FuncOp>(loc, name, b.getFunctionType({buffer, buffer}, {}));
  func->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = func.addEntryBlock();
  b.setInsertionPointToStart(entry);
  Value in = entry->getArgument(0), out = entry->getArgument(1);
  Value zero = b.create<arith::ConstantIndexOp>(loc, 0), size = b.create<memref::DimOp>(loc, in, zero);
  auto loop = b.create<scf::ForOp>(loc, zero, size, b.create<arith::ConstantIndexOp>(loc, vector ? 16 : 1));
  b.setInsertionPointToStart(loop.getBody());
  Value i = loop.getInductionVar();
  if (vector) {
    auto vt = VectorType::get({16}, f32);
    Value x = b.create<vector::LoadOp>(loc, vt, in, ValueRange{i});
    b.create<vector::StoreOp>(loc, lmcc::codegen::emitActivation(b, loc, kind, x), out, ValueRange{i});
  } else {
    Value x = b.create<memref::LoadOp>(loc, in, ValueRange{i});
    b.create<memref::StoreOp>(loc, lmcc::codegen::emitActivation(b, loc, kind, x), out, ValueRange{i});
  }
  b.setInsertionPointToEnd(entry);
  b.create<func::ReturnOp>(loc);
}

double phiGelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

double ulpOf(float y) {
  float a = std::fabs(y);
  return std::max(double(std::nextafter(a, std::numeric_limits<float>::infinity()) - a), 1.4e-45);
}

class Activation : public lmcc::test::KernelTest {
protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(buildKernels("activation", [](OpBuilder &b, ModuleOp module) {
      addKernel(b, module, "gelu_vector", "gelu", true);
      addKernel(b, module, "gelu_scalar", "gelu", false);
    }));
  }
  std::vector<float> run(const std::string &name, std::vector<float> x) {
    return library.runOnVector(name, std::move(x));
  }
};

TEST_F(Activation, GeluIsXPhiXWithinItsBounds) {
  std::vector<float> x;
  for (int64_t i = -800000; i < 800000; ++i) // [-8, 8) in steps of 1e-5, then every float of [1, 2) and [-2, -1)
    x.push_back(float(double(i) * 1e-5));
  for (float v = 1.0f; v < 2.0f; v = std::nextafter(v, 3.0f))
    x.push_back(v), x.push_back(-v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, 20.0f, -20.0f, 1e30f, -1e30f, 5.54f, -5.54f, 1.5f, -1.5f})
    x.push_back(v);
  while (x.size() % 16)
    x.push_back(0.25f);
  const std::vector<float> vec = run("gelu_vector", x), sc = run("gelu_scalar", x);
  double worstPositive = 0, worstSmallNegative = 0, worstTail = 0, worstAbs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::memcmp(&vec[i], &sc[i], sizeof(float)), 0) << "x = " << x[i] << ": " << vec[i] << " vs " << sc[i];
    const double want = phiGelu(x[i]), err = std::fabs(double(vec[i]) - want);
    ASSERT_TRUE(std::isfinite(vec[i])) << "x = " << x[i];
    const double ulps = err / ulpOf(float(want));
    if (x[i] >= 0)
      worstPositive = std::max(worstPositive, ulps);
    else if (x[i] > -2)
      worstSmallNegative = std::max(worstSmallNegative, ulps);
    else if (x[i] > -5.5)
      worstTail = std::max(worstTail, ulps);
    worstAbs = std::max(worstAbs, err);
  }
  // x >= 0: within the rounding of 1 + erf and the final products; -2 < x < 0: 1 + erf(x / sqrt 2) loses bits to
  // cancellation (as x (1 + erf) in any float formula); below -2 the value is erfc's, computed without it.
  EXPECT_LE(worstPositive, 2.5);
  EXPECT_LE(worstSmallNegative, 6.0);
  EXPECT_LE(worstTail, 40.0);
  EXPECT_LE(worstAbs, 1e-6);
  std::printf("GELU: max error %.2f ulp (x >= 0), %.2f ulp (-2 < x < 0), %.2f ulp (-5.5 < x <= -2), %.3g absolute\n",
              worstPositive, worstSmallNegative, worstTail, worstAbs);
  // The special values: 0 and -0 keep their sign, the far tails are x and 0, NaN stays NaN, +inf is +inf.
  const std::vector<float> special = run("gelu_vector", {0.0f, -0.0f, 20.0f, -20.0f, INFINITY, NAN, 1e30f, -1e30f,
                                                         1e-40f, 8.0f, -8.0f, 3.0f, -3.0f, 0.5f, -0.5f, 6.0f});
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_TRUE(std::signbit(special[1]));
  EXPECT_EQ(special[2], 20.0f);
  EXPECT_EQ(special[3], -0.0f);
  EXPECT_EQ(special[4], INFINITY);
  EXPECT_TRUE(std::isnan(special[5]));
  EXPECT_EQ(special[6], 1e30f);
  EXPECT_EQ(special[7], -0.0f);
  EXPECT_NEAR(special[8], 0.5e-40f, 1e-45f);
}

} // namespace
