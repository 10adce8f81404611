//===- Object.h - Loop-level IR -> LLVM -> object code ------------------------===//
#pragma once

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace lmcc::codegen {

struct ObjectOptions {
  std::string cpu;                 ///< target CPU; empty = the host's (with its features, AVX-512 where present)
  std::string embeddedWeightsFile; ///< when set, the object defines `embeddedSymbol` with this file's bytes
  std::string embeddedSymbol;
  /// When set, only the functions and globals whose names start with it leave the object: every other definition
  /// (fold_0, lm_gemm_*, ...: the same names in every model's object) gets internal linkage.
  std::string exportPrefix;
};

/// Lowers scf/memref/arith/math/func IR to the LLVM dialect (math functions
/// without LLVM intrinsics become libm calls). Fails with diagnostics.
mlir::LogicalResult lowerToLLVMDialect(mlir::ModuleOp module);

/// The width in bits of the widest vector registers of the target CPU (`cpu` as in ObjectOptions;
/// empty = this host): 512 with AVX-512F, else 256 (x86-64 with AVX2, our minimum for fast code).
int64_t targetVectorBits(const std::string &cpu);
/// Whether the target CPU (empty = this host) has AVX-512 and executes a 512-bit operation as two 256-bit halves
/// (AMD Zen 4, LLVM's "znver4"), so that a 256-bit FMA costs half a 512-bit one there; on the other AVX-512 cores
/// it costs as much. The attention's score products take half blocks at 256 bits on such targets (Geometry).
bool targetSplitsWideVectors(const std::string &cpu);
/// Whether the target CPU (empty = this host) has AVX512_BF16 dot products (vdpbf16ps) with AVX-512.
bool targetHasBf16Dot(const std::string &cpu);
/// Whether the target CPU (empty = this host) has AMX tiles with bf16 tile dot products (tdpbf16ps), AVX-512 and
/// AVX512_BF16 (the AMX GEMM rounds its activations with vcvtneps2bf16).
bool targetHasAmx(const std::string &cpu);
/// How the generated GEMM multiplies bf16 weights on a target CPU (GemmTile::Weights): AMX tiles where it has
/// AMX-BF16; AVX512_BF16 dot products (vdpbf16ps) where it has them at the FMA's instruction rate, so that a dot
/// product of pairs doubles the FLOP rate; otherwise the pairs widened to f32 in the kernel.
enum class Bf16Kernel { Amx, Dot, Widen };
/// The bf16 kernel for the target CPU (empty = this host). Intel's cores since Sapphire Rapids issue vdpbf16ps at
/// a quarter of their FMAs' rate (an Emerald Rapids whose VM hides AMX, LLVM's "sapphirerapids": 1.35 G
/// vdpbf16ps/s against 5.5 G vfmadd231ps/s, 16 independent chains each; bench/results/2026-12-04-bf16-widen.md):
/// dot products there reach half the FP32 peak, the widening kernel its FMA rate with half the weight bytes, so
/// they widen (only reachable where AMX is hidden: every such named CPU has AMX).
Bf16Kernel targetBf16Kernel(const std::string &cpu);
/// The ways of this host's L1 data cache (sysconf), or 0 where the system does not say.
int64_t hostL1Ways();

/// Translates an LLVM-dialect module to LLVM IR, optimizes it at O3 for the target
/// and writes a position-independent object file to `path`. Returns "" or an error.
std::string emitObject(mlir::ModuleOp module, const std::string &path, const ObjectOptions &options);

/// `s` as one word for /bin/sh: single-quoted, each ' written as '\''.
std::string shellQuote(const std::string &s);
/// The C compiler that links objects into libraries: $CC when set and not empty, else `cc`.
std::string cCompiler();

/// A module of kernels (loop-level IR) as a shared library at `path` for this host: lowered to the LLVM dialect,
/// emitted (emitObject, default options) and linked with `$CC -shared ... -lm` (cc by default; the library written
/// to a temporary name and renamed, the object removed). For the kernel benchmarks and tests, which dlopen it.
/// Returns "" or an error.
std::string emitKernelLibrary(mlir::ModuleOp module, const std::string &path);

} // namespace lmcc::codegen
