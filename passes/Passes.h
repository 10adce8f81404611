//===- Passes.h - lmcc optimization passes ---------------------------------===//
#pragma once

#include "dialect/LmDialect.h"

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <set>
#include <string>

namespace lmcc {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// The default optimization pipeline, in order, by flag (without the "lm-" prefix
/// the driver's --no-<pass> flags use it as is, e.g. --no-fuse-attention).
const std::vector<std::string> &defaultPipeline();

/// Adds the default pipeline minus `disabled` (pass flags such as "lm-fuse-attention").
void addOptimizationPasses(mlir::OpPassManager &pm, const std::set<std::string> &disabled);

/// The passes that run on the differentiated module (after lm-autodiff, `lmcc compile --train` without --naive),
/// by flag; --no-<pass> drops one as it does the default pipeline's.
const std::vector<std::string> &trainingPipeline();

/// Adds the training pipeline minus `disabled`.
void addTrainingPasses(mlir::OpPassManager &pm, const std::set<std::string> &disabled);

} // namespace lmcc
