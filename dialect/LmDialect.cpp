//===- LmDialect.cpp - lm dialect registration -----------------------------===//
#include "dialect/LmDialect.h"

#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
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

/// The discardable `lm.*` attributes are declared in LmDialect.td; any other `lm.` name, or a declared one
/// with the wrong kind of value or on the wrong kind of op, is an error.
LogicalResult LmDialect::verifyOperationAttribute(Operation *op, NamedAttribute attribute) {
  StringRef name = attribute.getName().strref();
  Attribute value = attribute.getValue();
  auto expect = [&](bool ok, StringRef what) -> LogicalResult {
    if (ok)
      return success();
    return op->emitError("attribute '") << name << "' must be " << what << ", got " << value;
  };
  if (name == ModelAttrHelper::getNameStr())
    return expect(isa<ModelAttr>(value) && isa<ModuleOp>(op), "a #lm.model<...> on a module");
  if (name == FamilyAttrHelper::getNameStr())
    return expect(isa<StringAttr>(value) && isa<ModuleOp>(op), "a string on a module");
  if (name == SpecHashAttrHelper::getNameStr())
    return expect(isa<StringAttr>(value) && isa<ModuleOp>(op), "a string on a module");
  if (name == MethodAttrHelper::getNameStr())
    return expect(isa<StringAttr>(value) && isa<FunctionOpInterface>(op), "a string on a function");
  if (name == FoldAttrHelper::getNameStr())
    return expect(isa<UnitAttr>(value) && isa<FunctionOpInterface>(op), "a unit attribute on a function");
  if (name == LengthLossAttrHelper::getNameStr())
    return expect(isa<FloatAttr>(value) && isa<FunctionOpInterface>(op), "a float on a function");
  return op->emitError("unknown lm dialect attribute '") << name << "'";
}
