//===- KernelAbi.h - the C interface of the standalone kernel modules ---------===//
//
// How a caller passes buffers to the kernels of buildGemmModule (Gemm.h) and buildAttentionModule /
// buildAttentionGradModule (Lowering.h) once they are compiled and loaded (their `_mlir_ciface_` functions): MLIR's
// ranked memref descriptor and each kernel's argument list. Shared by bench/kernel_bench.cpp and the kernel tests.
// i32 buffers (lengths, directional rows) travel in the same descriptor, their pointers cast.
//
//===----------------------------------------------------------------------===//
#ifndef LMCC_CODEGEN_LMTOLOOPS_KERNELABI_H
#define LMCC_CODEGEN_LMTOLOOPS_KERNELABI_H

#include <cstdint>

namespace lmcc::codegen::abi {

/// MLIR's descriptor of a rank-R memref.
template <int R> struct MemRef {
  float *allocated, *aligned;
  int64_t offset, sizes[R], strides[R];
};

/// A row-major [rows, cols] view of p.
inline MemRef<2> view(float *p, int64_t rows, int64_t cols) { return {p, p, 0, {rows, cols}, {cols, 1}}; }

// buildGemmModule: pack(W [N, K], panels), gemm(A [M, K], panels, C [M, N]), gemm_bias(A, panels, bias [N], C).
using PackFn = void (*)(MemRef<2> *, MemRef<2> *);
using GemmFn = void (*)(MemRef<2> *, MemRef<2> *, MemRef<2> *);
using BiasGemmFn = void (*)(MemRef<2> *, MemRef<2> *, MemRef<1> *, MemRef<2> *);

// buildAttentionModule: (q, k, v, lengths[, rows][, rel_k, rel_v], out).
using AttentionFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *);
using RelativeAttentionFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<2> *, MemRef<2> *,
                                     MemRef<3> *);
using DirectionalFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *, MemRef<3> *);
using DirectionalRelativeFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *, MemRef<2> *,
                                       MemRef<2> *, MemRef<3> *);

// buildAttentionGradModule: (dO, q, k, v, lengths[, rows][, rel_k, rel_v], dq, dk, dv[, drel_k, drel_v]).
using AttentionGradFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *,
                                 MemRef<3> *, MemRef<3> *);
using RelativeGradFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<2> *,
                                MemRef<2> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<2> *, MemRef<2> *);
using DirectionalGradFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *, MemRef<3> *,
                                   MemRef<3> *, MemRef<3> *, MemRef<3> *);
using DirectionalRelativeGradFn = void (*)(MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<3> *, MemRef<1> *,
                                           MemRef<3> *, MemRef<2> *, MemRef<2> *, MemRef<3> *, MemRef<3> *,
                                           MemRef<3> *, MemRef<2> *, MemRef<2> *);

} // namespace lmcc::codegen::abi

#endif // LMCC_CODEGEN_LMTOLOOPS_KERNELABI_H
