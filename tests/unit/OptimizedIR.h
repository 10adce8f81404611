//===- OptimizedIR.h - The lm IR a pipeline hands to the lowering, as text ---===//
//
// For tests that skip compiling a pipeline whose IR equals another's: everything compileLibrary compiles depends
// on this IR and on the lowering's options alone.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "driver/Compile.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <string>

namespace lmcc::test {

/// driver::buildOptimizedModule's module for `spec` under `options`, printed; only its function `function` when
/// one is named. A failure to build is a test failure (and an empty string).
inline std::string optimizedIR(const ModelSpec &spec, const driver::LibraryOptions &options,
                               const char *function = nullptr) {
  mlir::MLIRContext ctx;
  std::string error, text;
  auto module = driver::buildOptimizedModule(ctx, spec, options, &error);
  EXPECT_TRUE(module) << error;
  if (!module)
    return text;
  llvm::raw_string_ostream os(text);
  if (!function) {
    module->print(os);
    return text;
  }
  auto func = module->lookupSymbol<mlir::func::FuncOp>(function);
  EXPECT_TRUE(func) << "no function " << function;
  if (func)
    func->print(os);
  return text;
}

} // namespace lmcc::test
