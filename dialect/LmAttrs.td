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
    I32EnumAttrCase<"directional", 4>,  // per-row [B, N, 1 + W] operand: direction 0 R (j <= i), 1 L (j >= i),
                                        // 2 S (j != i, j not hidden), 3 skip (none); then W words of hidden bits
    I32EnumAttrCase<"Explicit", 5, "explicit">  // per-sentence [n, n] i1 operand (true = visible)
  ]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::lmcc::lm";
}

def Lm_MaskAttr : EnumAttr<Lm_Dialect, Lm_MaskKind, "mask"> {
  let summary = "attention mask as structure: #lm.mask<causal>";
  let assemblyFormat = "`<` $value `>`";
}

// What the lowering, the C glue and the generated header need to know about the model,
// set by MLIRGen on the module as `lm.model`, so that codegen reads the IR and never the spec.
def Lm_ModelAttr : AttrDef<Lm_Dialect, "Model"> {
  let mnemonic = "model";
  let summary = "the model's name, dimensions and special token ids";
  let description = [{
    ```mlir
    module @tiny attributes {lm.model = #lm.model<name = "tiny", vocab = 67, max_len = 24, d_model = 30,
        heads = 3, d_ff = 46, layers = 2, pad = 0, eos = 1, unk = 2, bos = 3, mask = 4>} { ... }
    ```
  }];
  let parameters = (ins StringRefParameter<"C identifier of the model">:$name, "int64_t":$vocab, "int64_t":$max_len,
                        "int64_t":$d_model, "int64_t":$heads, "int64_t":$d_ff, "int64_t":$layers, "int64_t":$pad,
                        "int64_t":$eos, "int64_t":$unk, "int64_t":$bos, "int64_t":$mask);
  let assemblyFormat = "`<` struct(params) `>`";
}

#endif // LM_ATTRS_TD
