//===- LmDialect.h - The lm dialect: ops, attributes ------------------------===//
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialect/LmEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/LmAttrs.h.inc"

// After the attributes: the dialect's discardable-attribute helpers name lm::ModelAttr.
#include "dialect/LmDialect.h.inc"

#define GET_OP_CLASSES
#include "dialect/LmOps.h.inc"

namespace lmcc::lm {

/// The kind an activation op folds into as lm.linear {activation}: "gelu" (lm.gelu), "gelu_tanh" (lm.gelu
/// {approximate}), "relu" (lm.relu); "" for any other op.
llvm::StringRef activationKind(mlir::Operation *op);
/// The activation op of `kind` (activationKind's inverse) over x.
mlir::Value createActivation(mlir::OpBuilder &b, mlir::Location loc, llvm::StringRef kind, mlir::Value x);

} // namespace lmcc::lm
