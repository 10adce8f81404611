//===- Object.h - Loop-level IR -> LLVM -> object code ------------------------===//
#pragma once

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace lmcc::codegen {

struct ObjectOptions {
  std::string cpu;                 ///< target CPU; empty = the host's (with its features, AVX-512 where present)
  std::string embeddedWeightsFile; ///< when set, the object defines `embeddedSymbol` with this file's bytes
  std::string embeddedSymbol;
};

/// Lowers scf/memref/arith/math/func IR to the LLVM dialect (math functions
/// without LLVM intrinsics become libm calls). Fails with diagnostics.
mlir::LogicalResult lowerToLLVMDialect(mlir::ModuleOp module);

/// Translates an LLVM-dialect module to LLVM IR, optimizes it at O3 for the target
/// and writes a position-independent object file to `path`. Returns "" or an error.
std::string emitObject(mlir::ModuleOp module, const std::string &path, const ObjectOptions &options);

} // namespace lmcc::codegen
