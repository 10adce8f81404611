//===- GemmBody.h - The generated GEMM bodies (Gemm.cpp, GemmAmx.cpp) ---------===//
//
// What the GEMM function builders (Linear.cpp) hand the bodies that fill them: the fp32 / bf16 register-tiled
// body (Gemm.cpp) and the AMX one (GemmAmx.cpp). Internal to lm-to-loops.
//
//===----------------------------------------------------------------------===//
#ifndef LMCC_CODEGEN_LMTOLOOPS_GEMMBODY_H
#define LMCC_CODEGEN_LMTOLOOPS_GEMMBODY_H

#include "codegen/LmToLoops/Gemm.h"

#include "mlir/IR/Builders.h"

namespace lmcc::codegen {

/// The operands of one generated GEMM body (getOrCreateGemm, getOrCreateTrainGemm). `k` is the static depth, or
/// ShapedType::kDynamic with `K` its runtime value (fp32 only). `N` bounds the columns; `accumulate` (an i1, or null)
/// adds C's old values to the products; `activation` (emitActivation's kind, or empty) is applied to each element
/// of the product plus the bias, over each panel of a row block once the panel is done. `copyA` (fp32 only) reads A
/// from a copy of each row block whose rows are a fixed distance apart (Gemm.cpp).
struct GemmBody {
  mlir::Value A, P, bias, C, pBegin, pEnd, cBase, N, K, accumulate;
  int64_t n, k;
  bool withBias, prefetch;
  bool copyA = false;
  llvm::StringRef activation;
};

/// The body of a generated GEMM of `tile` (fp32 or bf16 weights; Gemm.cpp).
void emitGemmBody(mlir::OpBuilder &b, mlir::Location loc, const GemmBody &op, GemmTile tile);

/// The AMX body of a generated GEMM (static depth, bf16 pairs; GemmAmx.cpp).
void emitAmxGemmBody(mlir::OpBuilder &b, mlir::Location loc, const GemmBody &op);

} // namespace lmcc::codegen

#endif // LMCC_CODEGEN_LMTOLOOPS_GEMMBODY_H
