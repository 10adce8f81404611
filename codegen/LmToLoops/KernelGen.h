//===- KernelGen.h - lm IR -> buffer-level loop nests (scf/memref/arith/math) ===//
#pragma once

#include "codegen/LmToLoops/Gemm.h"
#include "dialect/LmDialect.h"
#include "frontend/Spec.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <map>
#include <string>

namespace lmcc::codegen {

/// Lowers the `score` and `embed` entry points of an `lm` module into kernels
/// with the runtime's ABI (runtime/lib/lmrt.h): `<name>_score_kernel(weights,
/// ids, lengths, token_logprobs, scores, n_scored)` and `<name>_embed_kernel(
/// weights, ids, lengths, out)`, all memrefs, `llvm.emit_c_interface`. Weights are
/// views at static offsets (`weightOffsets`) into one flat buffer; linear layers
/// call the runtime GEMM `lm_rt_sgemm_nt`; everything else (embeddings, norms,
/// activations, attention, log-softmax, scores) becomes loop nests specialized to
/// the model's constants; the generated GEMMs use `tile` (GemmTile::forVectorBits of the target).
/// Returns null and reports through the context's diagnostics when an op cannot be lowered.
mlir::OwningOpRef<mlir::ModuleOp> lowerToLoops(mlir::ModuleOp lmModule, const ModelSpec &spec,
                                               const std::map<std::string, int64_t> &weightOffsets, GemmTile tile);

/// A module with the single kernel `attention_kernel(q, k, v [B, N, d_model], lengths [B], out [B, N, d_model])`
/// (C interface): lm.attention with `mask` (none, causal, anticausal or diagonal), as the model kernels lower it.
/// For kernel benchmarks (bench/kernel_bench.cpp).
mlir::OwningOpRef<mlir::ModuleOp> buildAttentionModule(mlir::MLIRContext &context, lm::MaskKind mask, int64_t heads,
                                                       int64_t dModel);

} // namespace lmcc::codegen
