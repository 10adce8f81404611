//===- Gemm.h - Generated GEMM microkernels over load-time packed weights ---===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace lmcc::codegen {

/// Panel width of packed weights: output features are grouped 64 at a time.
constexpr int64_t kPanel = 64;

/// The packed form of a weight W [N, K] (stored [out, in]): panels of kPanel output
/// features, P[p*K + k][j] = W[p*kPanel + j][k], zero past N; shape [ceil(N/64)*K, 64].
inline int64_t packedRows(int64_t n, int64_t k) { return (n + kPanel - 1) / kPanel * k; }

/// The key under which a packed weight is laid out ("pack:" + its weight names).
std::string packKey(mlir::Value weight);

/// A weight that a linear layer or the log-prob head multiplies by, to be packed at load time.
struct PackedWeight {
  std::string key;                ///< packKey
  std::vector<std::string> names; ///< its tensors (several when stacked by lm.concat)
  int64_t n = 0, k = 0;           ///< [out, in]
};
/// Every weight of the module's lm.linear / lm.token_logprob ops that the generated GEMM
/// can use (an lm.weight, or an lm.concat of them), each once.
std::vector<PackedWeight> packedWeights(mlir::ModuleOp lmModule);

/// Emits, at the builder's point, loops that pack `weight` [N, K] into `packed`.
void emitPack(mlir::OpBuilder &b, mlir::Location loc, mlir::Value weight, mlir::Value packed, int64_t n, int64_t k);

/// The generated GEMM for (N, K): C[m, (p - cBase)*64 + j] = sum_k A[m, k] P[p*K + k][j] (+ bias[p*64 + j])
/// for panels p in [pBegin, pEnd) and p*64 + j < N. A register-tiled vector kernel: 5 rows x 64
/// columns of accumulators (20 x vector<16xf32>) carried over k, B loaded as 4 vectors per k, A
/// broadcast; remaining rows one at a time; partial panels by masked stores. Created once per shape.
/// Arguments: (A memref<?xKxf32>, P memref<?x64xf32, strided<[64,1], offset:?>>, bias memref<?xf32,
/// strided<[1], offset:?>> (ignored when !withBias), C memref<?x?xf32>, pBegin, pEnd, cBase: index).
mlir::func::FuncOp getOrCreateGemm(mlir::ModuleOp module, int64_t n, int64_t k, bool withBias);

/// A task for lm_rt_parallel_for: `(ctx: !llvm.ptr, begin: i64, end: i64)` runs the GEMM above on panels
/// [first + begin, first + end), panel `first` being C's column 0. ctx holds 8 i64 slots: A address, M,
/// packed-weight address, packed rows, bias address (0 without bias), C address, C columns, first.
/// Splitting panels never re-packs and never changes a result.
mlir::func::FuncOp getOrCreateGemmTask(mlir::ModuleOp module, int64_t n, int64_t k, bool withBias);

} // namespace lmcc::codegen

namespace lmcc::codegen {

/// A module exporting, for every (N, K), `lm_bench_pack_<N>x<K>(W memref<NxK>, P memref<?x64>)` and
/// `lm_bench_gemm_<N>x<K>(A memref<?xK>, P memref<?x64>, C memref<?x?>)` (C interface), for benchmarks
/// and tests of the generated GEMM outside a model.
mlir::OwningOpRef<mlir::ModuleOp> buildGemmModule(mlir::MLIRContext &context,
                                                  const std::vector<std::pair<int64_t, int64_t>> &shapes);

} // namespace lmcc::codegen
