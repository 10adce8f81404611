//===- LmDialect.td - The lm dialect ------------------------------------===//
#ifndef LM_DIALECT_TD
#define LM_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Lm_Dialect : Dialect {
  let name = "lm";
  let cppNamespace = "::lmcc::lm";
  let summary = "Transformer language models with masks and input isolation as structure";
  let description = [{
    Tensor-level ops on ranked f32 tensors: static model dimensions, dynamic batch
    and sequence length. Attention masks are attributes (`#lm.mask<...>`), never
    n x n tensors; key padding is always given as per-sentence lengths. The naive,
    decomposed form (matmul / scale / mask_fill / softmax / matmul,
    `lm.mask_and_predict` as n passes) is what MLIRGen emits; passes rewrite it
    into fused, batched and pruned forms with the same numbers. The meaning of
    every op is the function of the same name in runtime/reference/Ops.h.
  }];
  let useDefaultAttributePrinterParser = 1;
  // Discardable attributes lmcc puts on modules and functions (verified by verifyOperationAttribute):
  //   lm.model (module): #lm.model<...>, the model facts codegen and the header read;
  //   lm.family, lm.spec_hash (module): the spec's family and specHash();
  //   lm.method (the score entry point): how the score is computed (causal, mask-and-predict, single-pass);
  //   lm.fold (a private function made by lm-fold-constants): evaluated once at load time;
  //   lm.length_loss (a Diformer pair loss): the weight of the length term (lm-autodiff's seed).
  let discardableAttrs = (ins
    "::lmcc::lm::ModelAttr":$model,
    "::mlir::StringAttr":$family,
    "::mlir::StringAttr":$spec_hash,
    "::mlir::StringAttr":$method,
    "::mlir::UnitAttr":$fold,
    "::mlir::FloatAttr":$length_loss
  );
  let hasOperationAttrVerify = 1;
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::tensor::TensorDialect"];
}

class Lm_Op<string mnemonic, list<Trait> traits = []> : Op<Lm_Dialect, mnemonic, traits>;

#endif // LM_DIALECT_TD
