//===- LmAttrs.td - lm dialect attributes -------------------------------===//
#ifndef LM_ATTRS_TD
#define LM_ATTRS_TD

include "dialect/LmDialect.td"
include "mlir/IR/EnumAttr.td"

// Which keys a query row may see, always conjoined with key padding (j < length).
def Lm_MaskKind : I32EnumAttr<"MaskKind", "attention mask kind", [
    I32EnumAttrCase<"none", 0>,         // every key
    I32EnumAttrCase<"causal", 1>,       // j <= i
    I32EnumAttrCase<"anticausal", 2>,   // j >= i
    I32EnumAttrCase<"diagonal", 3>,     // j != i (T-TA: self-unknown)
    I32EnumAttrCase<"directional", 4>,  // per-row direction operand: 0 R (j < i), 1 L (j > i), 2 S (j != i)
    I32EnumAttrCase<"Explicit", 5, "explicit">  // per-sentence [n, n] i1 operand (true = visible)
  ]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::lmcc::lm";
}

def Lm_MaskAttr : EnumAttr<Lm_Dialect, Lm_MaskKind, "mask"> {
  let summary = "attention mask as structure: #lm.mask<causal>";
  let assemblyFormat = "`<` $value `>`";
}

#endif // LM_ATTRS_TD
