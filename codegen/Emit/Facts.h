//===- Facts.h - The model facts the header and glue need, read off lm IR ---===//
#pragma once

#include "codegen/Emit/Header.h"

#include "mlir/IR/BuiltinOps.h"

namespace lmcc::codegen {

/// The lm.model, lm.family and lm.spec_hash module attributes as ModelFacts; fails (with a diagnostic on
/// the module) when lm.model is missing.
mlir::FailureOr<ModelFacts> readModelFacts(mlir::ModuleOp module);

} // namespace lmcc::codegen
