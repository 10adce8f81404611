//===- LmDialect.cpp - lm dialect registration -----------------------------===//
#include "dialect/LmDialect.h"

#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace lmcc::lm;

#include "dialect/LmDialect.cpp.inc"
#include "dialect/LmEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "dialect/LmAttrs.cpp.inc"

void LmDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialect/LmOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialect/LmAttrs.cpp.inc"
      >();
}
