//===- Passes.h - lmcc conversion passes (codegen) ---------------------------===//
#pragma once

#include "codegen/Layout/WeightLayout.h"

#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Pass/Pass.h"

#include <memory>

namespace lmcc {

#define GEN_PASS_DECL
#include "codegen/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "codegen/Passes.h.inc"

/// lm-to-loops with a layout computed by the caller (the compile driver computes it once and also feeds
/// it to the glue); createLmToLoops(options) computes it from the module.
std::unique_ptr<mlir::Pass> createLmToLoops(const LmToLoopsOptions &options, const codegen::WeightLayout &layout);

} // namespace lmcc
