//===- Pipeline.cpp - The default optimization pipeline ---------------------===//
#include "passes/Passes.h"

namespace lmcc {

const std::vector<std::string> &defaultPipeline() {
  static const std::vector<std::string> passes = {"lm-fuse-attention", "lm-fuse-logprob", "lm-batch-mask-predict",
                                                  "lm-share-first-layer", "lm-prune-rows", "lm-prune-loss-rows",
                                                  "lm-hoist-isolated-kv", "lm-fold-constants", "lm-fuse-activation"};
  return passes;
}

void addOptimizationPasses(mlir::OpPassManager &pm, const std::set<std::string> &disabled) {
  for (const std::string &flag : defaultPipeline()) {
    if (disabled.count(flag))
      continue;
    if (flag == "lm-fuse-attention")
      pm.addPass(createLmFuseAttention());
    else if (flag == "lm-fuse-logprob")
      pm.addPass(createLmFuseLogprob());
    else if (flag == "lm-batch-mask-predict")
      pm.addPass(createLmBatchMaskPredict());
    else if (flag == "lm-share-first-layer")
      pm.addPass(createLmShareFirstLayer());
    else if (flag == "lm-hoist-isolated-kv")
      pm.addPass(createLmHoistIsolatedKV());
    else if (flag == "lm-fold-constants")
      pm.addPass(createLmFoldConstants());
    else if (flag == "lm-prune-rows")
      pm.addPass(createLmPruneRows());
    else if (flag == "lm-prune-loss-rows")
      pm.addPass(createLmPruneLossRows());
    else if (flag == "lm-fuse-activation")
      pm.addPass(createLmFuseActivation());
  }
}

const std::vector<std::string> &trainingPipeline() {
  static const std::vector<std::string> passes = {"lm-fuse-loss-grad"};
  return passes;
}

void addTrainingPasses(mlir::OpPassManager &pm, const std::set<std::string> &disabled) {
  if (!disabled.count("lm-fuse-loss-grad"))
    pm.addPass(createLmFuseLossGrad());
}

} // namespace lmcc
