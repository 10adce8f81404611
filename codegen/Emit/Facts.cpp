//===- Facts.cpp - The model facts the header and glue need, read off lm IR -===//
#include "codegen/Emit/Facts.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace lmcc::codegen {

mlir::FailureOr<ModelFacts> readModelFacts(mlir::ModuleOp module) {
  auto *dialect = module.getContext()->getLoadedDialect<lm::LmDialect>();
  lm::ModelAttr model = dialect ? dialect->getModelAttrHelper().getAttr(module) : lm::ModelAttr();
  if (!model)
    return module.emitError("the module has no lm.model attribute");
  ModelFacts facts;
  facts.name = model.getName().str();
  if (auto family = dialect->getFamilyAttrHelper().getAttr(module))
    facts.family = family.str();
  if (auto hash = dialect->getSpecHashAttrHelper().getAttr(module))
    facts.specHash = hash.str();
  facts.vocab = model.getVocab();
  facts.maxLen = model.getMaxLen();
  facts.dModel = model.getDModel();
  facts.heads = model.getHeads();
  facts.dFF = model.getDFf();
  facts.layers = model.getLayers();
  facts.pad = model.getPad();
  facts.unk = model.getUnk();
  facts.bos = model.getBos();
  facts.eos = model.getEos();
  facts.mask = model.getMask();
  auto score = module.lookupSymbol<mlir::func::FuncOp>("score");
  facts.hasScore = bool(score);
  facts.scoreSpans = score && score.getNumArguments() == 3;
  facts.pairs = score && score.getNumArguments() == 5;
  auto tokenKV = module.lookupSymbol<mlir::func::FuncOp>("token_kv");
  facts.decoding = facts.pairs && tokenKV && module.lookupSymbol<mlir::func::FuncOp>("encode") &&
                   module.lookupSymbol<mlir::func::FuncOp>("decode") && module.lookupSymbol<mlir::func::FuncOp>("step");
  if (facts.decoding)
    facts.kvWidth = llvm::cast<mlir::RankedTensorType>(tokenKV.getResultTypes()[0]).getDimSize(2);
  auto embed = module.lookupSymbol<mlir::func::FuncOp>("embed");
  facts.hasEmbed = bool(embed);
  facts.embedStates = embed && embed.getNumArguments() == 3;
  if (facts.embedStates) {
    auto pool = embed->getAttrOfType<mlir::StringAttr>("lmcc.pool");
    auto exclude = embed->getAttrOfType<mlir::DenseI32ArrayAttr>("lmcc.pool_exclude");
    auto normalize = embed->getAttrOfType<mlir::BoolAttr>("lmcc.pool_normalize");
    if (!pool || !exclude || !normalize || (pool.getValue() != "mean" && pool.getValue() != "mean_all" &&
                                            pool.getValue() != "cls"))
      return embed.emitError("a mask-and-predict embed entry needs lmcc.pool, lmcc.pool_exclude and "
                             "lmcc.pool_normalize");
    facts.embedPool = pool.getValue() == "mean" ? 0 : pool.getValue() == "mean_all" ? 1 : 2;
    facts.embedExclude.assign(exclude.asArrayRef().begin(), exclude.asArrayRef().end());
    facts.embedNormalize = normalize.getValue();
  }
  if (auto loss = module.lookupSymbol<mlir::func::FuncOp>("loss"))
    if (auto weight = dialect->getLengthLossAttrHelper().getAttr(loss))
      facts.lengthLoss = weight.getValueAsDouble();
  return facts;
}

} // namespace lmcc::codegen
