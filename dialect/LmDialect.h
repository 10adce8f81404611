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
