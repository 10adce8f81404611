//===- Pipeline.cpp - The default optimization pipeline ---------------------===//
#include "passes/Passes.h"

namespace lmcc {

const std::vector<std::string> &defaultPipeline() {
  static const std::vector<std::string> passes = {"lm-fuse-attention", "lm-fuse-logprob"};
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
  }
}

} // namespace lmcc
