//===- MLIRGen.h - Build naive `lm` IR from a model spec --------------------===//
#pragma once

#include "frontend/Spec.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>

namespace lmcc {

/// Loads the dialects lm IR uses into `context`.
void loadLmDialects(mlir::MLIRContext &context);

/// Builds the module of `spec` in the naive, decomposed form: entry points
/// `score`, `embed` and `logits` (families unilm, bilm, tta, ngram) or `score`
/// (diformer: source ids, target ids, per-position directions). The module is verified.
/// With `train` (families unilm, bilm, tta) the module also has the entry point
/// `loss(inputs, targets, lengths) -> ce [B, N]` (lm.method "loss"): one forward pass over
/// inputs, row i of the head predicting targets[i] (-1: none), the per-row cross-entropy
/// with the spec's [train] label_smoothing (issue 14's loss is its sum over rows / T).
mlir::OwningOpRef<mlir::ModuleOp> buildModule(mlir::MLIRContext &context, const ModelSpec &spec, bool train = false);

/// buildModule printed as text.
std::string emitMLIR(const ModelSpec &spec, bool train = false);

} // namespace lmcc
