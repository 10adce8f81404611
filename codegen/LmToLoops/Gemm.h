//===- Gemm.h - Generated GEMM microkernels over load-time packed weights ---===//
#pragma once

#include "codegen/Layout/WeightLayout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace lmcc::codegen {

/// The packed form of a weight W [N, K] (stored [out, in]): a [packedRows(N, K), kPanel] buffer (WeightLayout.h)
/// holding panels of kPanel output features, zero past N. Inside panel p, the columns are stored in slices of the
/// GEMM tile's width c (GemmTile::cols(), which divides 64), each slice K x c and contiguous: flat(P)[p*K*64 +
/// (j/c)*K*c + k*c + j%c] = W[p*64 + j][k]. With c = 64 that is P[p*K + k][j].

/// The register tile of the generated GEMM: `rows` x (`vectors` x `lanes`) accumulators, sized to the target's vector
/// registers (the tile must fit in them with room for B and the broadcast of A).
struct GemmTile {
  int64_t rows, vectors, lanes;
  /// The packed weights' element type and how the kernel multiplies them: fp32 FMAs; bf16 pairs by AVX512_BF16
  /// dot products (vdpbf16ps: the activations rounded to bf16 pairs too, f32 accumulation); bf16 pairs by AMX tile
  /// dot products (tdpbf16ps on 16 x 16 tiles of C, the same rounding of the activations, f32 accumulation); or
  /// bf16 pairs widened to f32 in the kernel (CPUs without AVX512_BF16: fp32 activations, two FMAs per pair).
  enum class Weights { F32, Bf16Dot, Bf16Amx, Bf16Widen } weights = Weights::F32;
  int64_t cols() const { return vectors * lanes; }
  bool bf16() const { return weights != Weights::F32; }
  /// "<rows>x<cols>" and "_bf16dot" / "_bf16amx" / "_bf16" for bf16 weights: the suffix of the kernels' symbols.
  std::string name() const;
  /// 512-bit registers (AVX-512, 32 of them): 12 x 32 in 24 zmm (2 loads of B and 12 broadcasts of A per k step
  /// for 24 FMAs: half the B traffic per FMA of a 5 x 64 tile, which a core with two FMA ports needs from L1/L2;
  /// BLIS's SKX sgemm tile has the same shape). 256-bit (AVX2, 16): 6 x 16 in 12 ymm.
  static GemmTile forVectorBits(int64_t bits) { return bits >= 512 ? GemmTile{12, 2, 16} : GemmTile{6, 2, 8}; }
  /// The tile for a target: `bf16` weights use AMX tiles when `hasAmx` (2 x 2 tiles of 16 x 16: 32 rows x 32
  /// columns, the packing of the 12 x 32 tile), else dot products when `hasBf16Dot` (512-bit tiles), else widening
  /// (targetBf16Kernel in codegen/Emit/Object.h says which a CPU gets).
  static GemmTile forTarget(int64_t bits, bool bf16, bool hasBf16Dot, bool hasAmx = false) {
    GemmTile t = forVectorBits(bits);
    if (bf16 && hasAmx && bits >= 512)
      return GemmTile{32, 2, 16, Weights::Bf16Amx};
    if (bf16)
      t.weights = hasBf16Dot && bits >= 512 ? Weights::Bf16Dot : Weights::Bf16Widen;
    // The widening kernel holds four widened B vectors and two broadcasts of A per pair of k: with 12 x 32
    // accumulators that is 31 zmm and LLVM spilled in the inner loop (T-TA n 128 0.62x the fp32 library on the
    // Xeon of 2026-12-04); 10 x 32 fits (0.99x; 11 rows spilled, 8 rows measured 1.5% slower).
    if (t.weights == Weights::Bf16Widen && bits >= 512)
      t.rows = 10;
    return t;
  }
  /// The tile of a weight of depth `k` (A's rows k floats apart) on a target whose tile is `target` and whose L1
  /// data cache has `l1Ways` ways (0: unknown): `target`, except the 5 x 64 fp32 tile (20 zmm, 4 loads of B and 5
  /// broadcasts of A per k step) for depths that are a multiple of 1024 floats where the L1 has fewer ways than the
  /// 12 x 32 tile has rows. Such a depth puts A's rows 4 KB (or a multiple) apart, so every row of a tile maps to
  /// the same L1 sets: 12 rows' lines evict each other and the block's B chunk from 8 ways, 5 rows' do not.
  /// Measured on a Zen 4 (8-way 32 KB L1; bench/results/2026-11-30-deep-tile.md): 1.06-1.09x on depths 2048 and
  /// 3072 from 40 rows on (96% of the peak), level at 20 rows; at other depths 12 x 32 stays ahead (0.99x for 5 x 64
  /// on 20 x 768 x 3072). Results do not depend on the tile (getOrCreateGemm).
  static GemmTile forDepth(GemmTile target, int64_t k, int64_t l1Ways) {
    if (target.weights == Weights::F32 && target.lanes == 16 && rowsOverflowL1Sets(k, target.rows, l1Ways))
      return GemmTile{5, 4, 16};
    return target;
  }
  /// Whether rows of `words` 4-byte words put every row of a tile in the same L1 sets (a multiple of 4 KB apart).
  static bool rowsShareL1Sets(int64_t words) { return words % 1024 == 0; }
  /// Whether a tile of `rows` rows `words` apart overflows the sets they share in an L1 of `l1Ways` ways (0: unknown).
  static bool rowsOverflowL1Sets(int64_t words, int64_t rows, int64_t l1Ways) {
    return rowsShareL1Sets(words) && l1Ways > 0 && l1Ways < rows;
  }
};

/// The AMX kernel's input: A's rows rounded to bf16 pairs (as the weights: round to nearest even), each row
/// amxInputPairs(k) words (ceil(k / 32) steps of 16 pairs, zero past k), rows padded with zeros to a multiple of
/// kAmxRows (the kernel's row tile reads them; its C rows past M are never written).
constexpr int64_t kAmxRows = 32;
inline int64_t amxInputPairs(int64_t k) { return (k + 31) / 32 * 16; }
/// Emits a fresh buffer [roundup(M, kAmxRows), amxInputPairs(k)] (memref.alloc: the caller frees it) and loops that
/// fill it from A [M, k] (rows past M zero); returns the buffer.
mlir::Value emitRoundToPairs(mlir::OpBuilder &b, mlir::Location loc, mlir::Value A, int64_t k);

/// Emits, at the builder's point, loops that pack `weight` [N, K] into `packed` for `tile`.
void emitPack(mlir::OpBuilder &b, mlir::Location loc, mlir::Value weight, mlir::Value packed, int64_t n, int64_t k,
              GemmTile tile);

/// The generated GEMM for (N, K): C[m, (p - cBase)*64 + j] = sum_k A[m, k] W[p*64 + j][k] (+ bias[p*64 + j]) for panels
/// p in [pBegin, pEnd) and p*64 + j < N (P packed for `tile`). A register-tiled vector kernel: `tile.rows` rows x
/// tile.cols() columns of accumulators carried over k, B loaded as tile.vectors vectors per k, A broadcast; rows in
/// blocks of about 128 KB of A, each cut into tiles of balanced heights; partial panels by masked stores. Every
/// element is the same ordered FMA chain over k whatever the tile, so results do not depend on it. Created once per
/// shape and tile. Arguments: (A memref<?xKxf32>, P memref<?x64xf32, strided<[64,1], offset:?>>, bias memref<?xf32,
/// strided<[1], offset:?>> (ignored when !withBias), C memref<?x?xf32>, pBegin, pEnd, cBase: index). The AMX kernel
/// takes A already rounded (memref<?x amxInputPairs(K) x f32>, emitRoundToPairs; M = its size, rows padded past it).
/// With an `activation` (emitActivation's kind; not for the AMX kernel) each element of the product plus the bias
/// goes through it, a panel of the row block at a time once the panel is done (in L1/L2): lm.linear {activation}
/// without a second pass over C in memory.
mlir::func::FuncOp getOrCreateGemm(mlir::ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                   llvm::StringRef activation = {});
/// The part of lm.linear's `activation` that `tile`'s kernel applies itself: all of it, or none for the AMX kernel
/// (the lowering then runs emitActivationInPlace after the product).
inline llvm::StringRef kernelActivation(GemmTile tile, llvm::StringRef activation) {
  return tile.weights == GemmTile::Weights::Bf16Amx ? llvm::StringRef() : activation;
}

/// Whether the generated GEMM prefetches a weight [n, k] (packed for fp32, or as bf16 pairs): when the packed weight
/// does not fit in the L2 cache (over 1 MB), where software prefetch pays off.
inline bool prefetchesWeight(int64_t n, int64_t k, bool bf16) {
  return packedRows(n, k, bf16) * kPanel * 4 > (int64_t(1) << 20);
}

/// A depth a training GEMM is specialized for (getOrCreateTrainGemm): calls with K == lda == k run a body of static
/// depth k, and prefetch the packed weight when `prefetch`.
struct TrainGemmDepth {
  int64_t k;
  bool prefetch;
  /// Shallower depths keep the run-time depth body: their products are small next to a model's, and each body
  /// costs about what the run-time one does to compile (a tiny test model's training library: 7.2 s -> 9.2 s with
  /// its depths 30 and 46 specialized).
  static constexpr int64_t kMinDepth = 64;
  /// Depth k for weights of at most `n` columns: prefetched as the fixed-shape kernel prefetches its weight.
  static TrainGemmDepth forWeight(int64_t k, int64_t n) { return {k, prefetchesWeight(n, k, /*bf16=*/false)}; }
  bool operator<(const TrainGemmDepth &o) const { return k != o.k ? k < o.k : prefetch < o.prefetch; }
};

/// The training GEMM, callable from the runtime (lmrt.h's lm_rt_gemm_fn): `(A: !llvm.ptr, lda, M, K: i64, P: !llvm.ptr,
/// C: !llvm.ptr, ldc, N, pBegin, pEnd, accumulate: i64)` computes, for panels p in [pBegin, pEnd) and columns
/// n = p*64 + j < N, C[m*ldc + n] = (accumulate ? C[m*ldc + n] : 0) + sum_{k<K} A[m*lda + k] B[k][n], with B packed
/// as the weights above ([N, K] = B^T, column slices of tile.cols()) and K known only at run time. The same kernel
/// as getOrCreateGemm (fp32), so its results do not depend on how M or the panels are split.
///
/// With `depths` (a call site's static depths: a linear backward's dx product has the layer's output width, the
/// loss head's products the model width and the runtime's vocabulary tile; those under kMinDepth are dropped, and a
/// depth given twice prefetches if either does), a call whose K and lda equal one of them runs a body of that static
/// depth (`lm_train_gemm_<tile>_k<k>[p]`): the fixed-shape kernel's code, every row of A a constant offset from one
/// base instead of a run-time stride's chain of additions, its blocks and chunks, and its prefetch rule; other calls
/// run the run-time depth body (`lm_train_gemm_any_<tile>`, what a call without depths gets). Each element is the
/// same ordered FMA chain in both, so which body runs never changes a result. The function is
/// `lm_train_gemm_<tile>_for_k<k>[p]...` (one per set of depths), or `name` where given.
///
/// The run-time depth body copies each block of A into rows a fixed distance apart (emitGemmBody's copyA), and so
/// does a static depth's body where its rows would overflow the L1 sets they share (GemmTile::rowsOverflowL1Sets with
/// the target's `l1Ways`, 0 if unknown): the tile stays the target's, since the runtime calls one training GEMM.
mlir::func::FuncOp getOrCreateTrainGemm(mlir::ModuleOp module, GemmTile tile, int64_t l1Ways,
                                        llvm::ArrayRef<TrainGemmDepth> depths = {}, llvm::StringRef name = {});

/// A task for lm_rt_parallel_for: `(ctx: !llvm.ptr, begin: i64, end: i64)` runs the GEMM above on panels [first +
/// begin, first + end), panel `first` being C's column 0. ctx holds 8 i64 slots: A address, M, packed-weight address,
/// packed rows, bias address (0 without bias), C address, C columns, first. Splitting panels never re-packs and never
/// changes a result.
mlir::func::FuncOp getOrCreateGemmTask(mlir::ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                       llvm::StringRef activation = {});

/// The same GEMM as a task split by rows instead of panels: ctx holds the 8 slots above plus the panel count and
/// the rows of a piece (`unit`); pieces [begin, end) compute rows [begin unit, min(end unit, M)) of C over panels
/// [first, first + count). A GEMM of many more rows than columns splits so (Loops::parallelGemm): each thread then
/// reads its own rows of A once, where a split by panels makes every piece read all of A again. Every element is
/// the same ordered FMA chain whichever way the call is split.
mlir::func::FuncOp getOrCreateGemmRowTask(mlir::ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                          llvm::StringRef activation = {});

} // namespace lmcc::codegen

namespace lmcc::codegen {

/// A module exporting, for every (N, K) and tile, `lm_bench_pack_<N>x<K>_<tile.name()>(W memref<NxK>, P memref<?x64>)`,
/// `lm_bench_gemm_<N>x<K>_<tile.name()>(A memref<?xK>, P memref<?x64>, C memref<?x?>)` and
/// for bf16 tiles `lm_bench_gemm_bias_<N>x<K>_<tile.name()>(A, P, bias memref<N>, C)` (C interface), and for
/// every fp32 tile the training GEMM `lm_train_gemm_<tile.name()>` (public, lm_rt_gemm_fn; specialized for
/// `trainDepths`, getOrCreateTrainGemm) and `lm_train_gemm_any_<tile.name()>` (the run-time depth body alone), for
/// benchmarks and tests of the generated GEMM outside a model; `l1Ways` is the target's (getOrCreateTrainGemm).
mlir::OwningOpRef<mlir::ModuleOp> buildGemmModule(mlir::MLIRContext &context,
                                                  const std::vector<std::pair<int64_t, int64_t>> &shapes,
                                                  const std::vector<GemmTile> &tiles,
                                                  const std::vector<TrainGemmDepth> &trainDepths = {},
                                                  int64_t l1Ways = 0);

} // namespace lmcc::codegen
