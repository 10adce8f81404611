//===- LmDialect.cpp - lm dialect registration -----------------------------===//
#include "dialect/LmDialect.h"

#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cctype>

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

namespace {

/// The values lm.family and lm.method take (MLIRGen sets them; Spec.cpp's families and score methods, the
/// training and Diformer entry points).
constexpr StringRef kFamilies[] = {"unilm", "bilm", "tta", "ngram", "diformer"};
constexpr StringRef kMethods[] = {"causal", "mask-and-predict", "single-pass", "loss",          "loss_grad",
                                  "pairs",  "pair_encode",      "pair_token_kv", "pair_decode", "pair_step",
                                  "pair_loss", "pair_loss_grad"};

/// A #lm.model that the lowering and the header can use: a C identifier for a name (the library's symbols are
/// named after it), positive sizes, heads dividing d_model and every special token id in the vocabulary.
LogicalResult verifyModel(Operation *op, ModelAttr m) {
  auto fail = [&](const Twine &what) { return op->emitError("#lm.model: ") << what; };
  StringRef name = m.getName();
  auto identifierChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) || !llvm::all_of(name, identifierChar))
    return fail("name \"" + name + "\" is not a C identifier");
  const std::pair<StringRef, int64_t> sizes[] = {{"vocab", m.getVocab()},     {"max_len", m.getMaxLen()},
                                                 {"d_model", m.getDModel()}, {"heads", m.getHeads()},
                                                 {"d_ff", m.getDFf()},       {"layers", m.getLayers()}};
  for (auto [field, size] : sizes)
    if (size < 1)
      return fail(field + " must be positive, got " + Twine(size));
  if (m.getDModel() % m.getHeads())
    return fail("heads (" + Twine(m.getHeads()) + ") must divide d_model (" + Twine(m.getDModel()) + ")");
  const std::pair<StringRef, int64_t> ids[] = {
      {"pad", m.getPad()}, {"eos", m.getEos()}, {"unk", m.getUnk()}, {"bos", m.getBos()}, {"mask", m.getMask()}};
  for (auto [field, id] : ids)
    if (id < 0 || id >= m.getVocab())
      return fail(field + " id " + Twine(id) + " is outside the vocabulary [0, " + Twine(m.getVocab()) + ")");
  return success();
}

} // namespace

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
  auto oneOf = [&](ArrayRef<StringRef> names) {
    auto text = dyn_cast<StringAttr>(value);
    return text && llvm::is_contained(names, text.getValue());
  };
  if (name == ModelAttrHelper::getNameStr()) {
    if (failed(expect(isa<ModelAttr>(value) && isa<ModuleOp>(op), "a #lm.model<...> on a module")))
      return failure();
    return verifyModel(op, cast<ModelAttr>(value));
  }
  if (name == FamilyAttrHelper::getNameStr())
    return expect(oneOf(kFamilies) && isa<ModuleOp>(op),
                  "one of \"unilm\", \"bilm\", \"tta\", \"ngram\", \"diformer\" on a module");
  if (name == SpecHashAttrHelper::getNameStr())
    return expect(isa<StringAttr>(value) && isa<ModuleOp>(op), "a string on a module");
  if (name == MethodAttrHelper::getNameStr())
    return expect(oneOf(kMethods) && isa<FunctionOpInterface>(op),
                  "an entry point's method (" + llvm::join(ArrayRef<StringRef>(kMethods), ", ") + ") on a function");
  if (name == FoldAttrHelper::getNameStr())
    return expect(isa<UnitAttr>(value) && isa<FunctionOpInterface>(op), "a unit attribute on a function");
  if (name == LengthLossAttrHelper::getNameStr())
    return expect(isa<FloatAttr>(value) && isa<FunctionOpInterface>(op), "a float on a function");
  return op->emitError("unknown lm dialect attribute '") << name << "'";
}
