//===- lmcc-opt.cpp - Parse, verify, transform and print lm IR ---------------===//
//
// Registers only the dialects lm IR and its lowering (lm-to-loops) use (not registerAllDialects: on two cores
// that doubles the link time) and lmcc's own passes.
//
//===----------------------------------------------------------------------===//
#include "dialect/LmDialect.h"
#include "codegen/Passes.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<lmcc::lm::LmDialect, mlir::func::FuncDialect, mlir::tensor::TensorDialect,
                  mlir::arith::ArithDialect, mlir::math::MathDialect, mlir::memref::MemRefDialect,
                  mlir::scf::SCFDialect, mlir::vector::VectorDialect, mlir::LLVM::LLVMDialect>();
  lmcc::registerLmPasses();
  lmcc::registerLmCodegenPasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "lmcc optimizer: lm dialect IR\n", registry));
}
