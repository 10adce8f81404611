//===- Lowering.h - Shared pieces of the lm-to-loops conversion patterns ----===//
//
// The lm-to-loops pass (LmToLoops.cpp) lowers each `lm` op to buffer-level scf / memref / arith / math /
// vector loop nests with one conversion pattern per op, grouped in one file per op family:
//   Elementwise.cpp  embeddings, positions, elementwise ops, norms, softmaxes, heads, decomposed attention
//   Attention.cpp    lm.attention (key-tiled online softmax; the vector form for head sizes % 16 == 0)
//   AttentionGrad.cpp the vector form of its VJP lm.attention_grad (both built from AttentionVector.h)
//   Logprob.cpp      lm.token_logprob (streamed vocabulary tiles), lm.gather, lm.sentence_score, lm.mean_pool
//   MaskedBatch.cpp  lm.mask_and_predict (n passes), lm.masked_batch, lm.take_row, lm.splice_copies
//   Rows.cpp         lm.target_rows, lm.gather_rows, lm.scatter_rows (a training loss's predicted rows)
//   Gemm.cpp         lm.linear (the generated GEMM over load-time packed weights, or the runtime's Eigen GEMM)
//   Weights.cpp      lm.weight, lm.concat, lm.folded_rows, lm.fold functions and the init kernel
//   Backward.cpp     the training loss and lm-autodiff's backward ops (calls of the runtime's training kernels)
//   NGram.cpp        the n-gram heads: WDR conjugate, ensemble, the ngram loss and its VJP
//   Diformer.cpp     the Diformer decoder's queries and targets from its rows' directions, the length head
// Tensors become memrefs (the type converter in LmToLoops.cpp): dynamic-shaped values identity-layout
// buffers, static-shaped values (weights) views into the one flat weight buffer, which every lowered
// function takes as its first argument. The meaning of every op is the function of the same name in
// runtime/reference/Ops.cpp; numerics follow it (double accumulation in norms, softmaxes, scores).
//
// Dynamic dimensions: in every lm tensor type the first `?` is the batch B (the copies C inside
// lm.masked_batch) and every further `?` is the sequence length N; a pattern reads B and N off its
// operands' buffers. Encoder-decoder models have two sequences (the Diformer's source and target): the
// patterns of ops that may mix them (attention scores [B, H, N, M], elementwise ops on them) size their
// results from their operands' buffers (Loops::dims) instead.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "codegen/Layout/WeightLayout.h"
#include "codegen/LmToLoops/Gemm.h"
#include "dialect/LmDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Transforms/DialectConversion.h"

#include <cmath>
#include <functional>
#include <optional>

namespace lmcc::codegen {

/// What every pattern may read besides its op: the weight layout, the GEMM choice and tile.
struct LoweringContext {
  const WeightLayout *layout = nullptr;
  bool generatedGemm = true; ///< false: --gemm=eigen (lm_rt_sgemm_nt)
  GemmTile tile = GemmTile::forVectorBits(256); ///< the target's tile (tileFor: a weight's)
  int64_t l1Ways = 0;        ///< ways of the target's L1 data cache (0: unknown)
  bool halfBlocks = false;   ///< the target splits 512-bit operations: attention scores at 8 lanes where they can (Geometry)
  int64_t maxLen = 0;        ///< the model's max_len (folded tables)
  /// Set when a lowering needed a batch size or sequence length no operand carried (Loops::B, Loops::N): the
  /// error is on the op; the pass fails after the conversion.
  mutable bool missingSizes = false;
  /// The tile of the GEMM of a packed weight of depth k: its packing and its product (GemmTile::forDepth).
  GemmTile tileFor(int64_t k) const { return GemmTile::forDepth(tile, k, l1Ways); }
};

/// tensor<...> -> memref<...>: identity layout for dynamic shapes, a view with a dynamic offset for static shapes.
mlir::MemRefType bufferType(mlir::RankedTensorType type);

void populateElementwisePatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                                 const LoweringContext &context);
void populateAttentionPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                               const LoweringContext &context);
void populateLogprobPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                             const LoweringContext &context);
void populateMaskedBatchPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                                 const LoweringContext &context);
void populateGemmPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                          const LoweringContext &context);
void populateWeightPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                            const LoweringContext &context);
void populateBackwardPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                              const LoweringContext &context);
/// NGram.cpp: lm.wdr_conjugate, lm.ngram_ensemble, lm.ngram_loss and its VJP (issue 18).
void populateNGramPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                           const LoweringContext &context);
/// Rows.cpp: lm.target_rows, lm.gather_rows, lm.scatter_rows (lm-prune-loss-rows).
void populateRowsPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                          const LoweringContext &context);
/// Diformer.cpp: lm.decoder_queries, lm.directional_targets, lm.length_logprob (issue 19).
void populateDiformerPatterns(mlir::TypeConverter &converter, mlir::RewritePatternSet &patterns,
                              const LoweringContext &context);
/// Declares the runtime's training kernels (lm_rt_token_loss, lm_rt_linear_grad, ...) at b's insertion point.
void declareTrainingRuntime(mlir::OpBuilder &b, mlir::Location loc);
/// The static depths of the loss-head kernels' GEMMs for a head weight [vocab, d]: the logits' (d), and with
/// `backward` the hidden state gradient's (the runtime's vocabulary tile); the weight gradient's depth is the
/// batch's rows.
llvm::SmallVector<TrainGemmDepth, 2> lossHeadGemmDepths(mlir::ShapedType weight, bool backward);

/// `<model>_init_kernel(weights)`: packs every GEMM weight into its panel layout, then calls every lowered
/// lm.fold function (which writes its table) on one sentence of max_len pad ids. Built after the conversion.
mlir::LogicalResult buildInitKernel(mlir::ModuleOp module, const LoweringContext &context, llvm::StringRef name,
                                    int64_t padId);

/// The activation `kind` of x, an f32 or a vector of f32: "gelu" (lm.gelu: x * 0.5 * (1 + erf(x / sqrt 2))),
/// "gelu_tanh" (lm.gelu {approximate}: 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))) or "relu" (lm.relu). The
/// same operations lane by lane whatever the type (no contraction, the same math approximations), so the GEMM's
/// fused epilogue (lm.linear {activation}) and the activation op's row loop give the same bits.
mlir::Value emitActivation(mlir::OpBuilder &b, mlir::Location loc, llvm::StringRef kind, mlir::Value x);

/// e^x (x an f32 or a vector of f32, lane-wise) for x <= 88 (a softmax's x - max <= 0), exactly 0 for x <= -88 and -inf:
/// x = n ln 2 + r with n = round(x log2 e) (by adding 1.5 * 2^23), r in two parts of ln 2 (Cephes' split), e^r by
/// Cephes' expf polynomial (about 1 ulp) and 2^n from n's bits (n = -127 gives 0). NaN stays NaN. About half the
/// instructions of math.exp's approximation, which also handles x > 88 and denormal results.
mlir::Value emitVectorExp(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x);

/// max(x, y) lane-wise as x86's maxps: y where either is NaN (no NaN test; a softmax's NaN input still reaches its
/// output through the exponential and the sum).
mlir::Value emitGreater(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x, mlir::Value y);

/// Every lane of the vector x combined by `combine` (emitGreater, an add) in a butterfly of lane swaps (l ^ n/2, ...,
/// l ^ 1): one fixed order, so every lane gets the same bits; a max is exact.
mlir::Value emitAcrossLanes(mlir::OpBuilder &b, mlir::Location loc, mlir::Value x,
                            const std::function<mlir::Value(mlir::Value, mlir::Value)> &combine);

/// emitAcrossLanes of every vector of xs at once, each result then `then` lane-wise (when given) and broadcast from
/// one lane: the butterflies run side by side, two vectors' states in one from the first swap on (a group of 2w
/// lanes holds a vector's whole state before the swap of distance w), so 8 vectors take 23 operations where apart
/// they take 64, and `then` (a division, say) runs once for every 16 vectors. Lane l of a merged vector holds lane l
/// of its vector's own butterfly, combined with its own value first, so the bits are emitAcrossLanes'.
llvm::SmallVector<mlir::Value> emitAcrossLanesOfEach(mlir::OpBuilder &b, mlir::Location loc,
                                                     llvm::ArrayRef<mlir::Value> xs,
                                                     const std::function<mlir::Value(mlir::Value, mlir::Value)> &combine,
                                                     const std::function<mlir::Value(mlir::Value)> &then = {});

/// Task functions for lm_rt_parallel_for have the signature `(ctx: !llvm.ptr, begin: i64, end: i64)` and read
/// their operands from i64 fields of ctx (addresses and sizes). The task's entry block argument 0 is ctx.
mlir::func::FuncOp createTask(mlir::OpBuilder &b, mlir::ModuleOp module, llvm::StringRef name);
/// Field i of a task's ctx, as an i64.
mlir::Value taskField(mlir::OpBuilder &b, mlir::Location loc, mlir::Value ctx, int64_t i);
/// A memref of `type` (no offset) over the buffer at the i64 `address`, with i64 sizes and strides.
mlir::Value memrefAt(mlir::OpBuilder &b, mlir::Location loc, mlir::Value address, llvm::ArrayRef<mlir::Value> sizes,
                     llvm::ArrayRef<mlir::Value> strides, mlir::MemRefType type);

/// A row-major view of the flat weight buffer `weights` at a float offset (static: in the view's type; or an index
/// value: a dynamic offset).
mlir::Value weightView(mlir::OpBuilder &b, mlir::Location loc, mlir::Value weights, mlir::OpFoldResult offset,
                       llvm::ArrayRef<int64_t> shape);
inline mlir::Value weightView(mlir::OpBuilder &b, mlir::Location loc, mlir::Value weights, int64_t offset,
                              llvm::ArrayRef<int64_t> shape) {
  return weightView(b, loc, weights, b.getIndexAttr(offset), shape);
}
/// The private function `name` of `module` taking `inputs`, made on first use with `b` (in a pattern, its
/// rewriter), its body by body(its arguments) with `b` at the end of its entry block (the return is added after,
/// and `b`'s insertion point restored), and marked no_inline (kept by func-to-llvm as LLVM's noinline): code that
/// many call sites share stays one copy (Loops::outlined, the init kernel's packs).
mlir::func::FuncOp getOrCreateNoInline(mlir::OpBuilder &b, mlir::ModuleOp module, llvm::StringRef name,
                                       mlir::TypeRange inputs,
                                       const std::function<void(mlir::ValueRange)> &body);

/// The type converter (tensor -> bufferType, casts as materializations) and the target (lm illegal; the loop
/// dialects, func calls and casts legal) every lowering with these patterns uses.
void configureLowering(mlir::TypeConverter &converter, mlir::ConversionTarget &target);

/// Forwards memref -> tensor -> memref unrealized-cast chains (left by out-of-order conversion) to the memref
/// and erases the casts nobody uses.
void foldCastPairs(mlir::ModuleOp module);

/// The training entries' weight gradients: lm.param_grad's copy into the slot (a memcpy) goes where the gradient's
/// buffer is a temporary of the entry, which becomes the slot itself (its producer writes there); the slots of
/// tensors without an lm.param_grad are zeroed at the entry's start, so that every tensor's slot is written.
void writeGradientsInPlace(mlir::ModuleOp module, const WeightLayout &layout);

/// lm.token_loss_and_grad and lm.ngram_loss_and_grad keep the live rows' logits for their backward while they take
/// at most this much (the runtime kernels' keep_bytes).
constexpr int64_t kKeptLogitsBytes = int64_t(512) << 20;
/// Frees every buffer right after its last use in the block that allocates it (the pass's last step).
void deallocateAfterLastUse(mlir::ModuleOp module);

/// The target a kernel module below is lowered for: its vector width (AttentionVector.h's Geometry; 0: the host's)
/// and whether it splits 512-bit operations into halves (Geometry::halfBlocks; unset: as the host).
struct KernelTarget {
  int64_t vectorBits = 0;
  std::optional<bool> splitsWideVectors;
};

/// A module with the single kernel `attention_kernel(q, k, v [B, N, d_model], lengths [B], out [B, N, d_model])`
/// (C interface): lm.attention with `mask` lowered by the model's pattern; with `clip` > 0, Shaw relative
/// positions: `attention_kernel(q, k, v, lengths, rel_k, rel_v [2 clip + 1, d_head], out)`; with `rowWords` > 0
/// (mask directional) the directional rows [B, N, rowWords] i32 (lm.mask_fill states them) follow the lengths.
/// Lowered for `target`. For kernel benchmarks (bench/kernel_bench.cpp) and tests.
mlir::OwningOpRef<mlir::ModuleOp> buildAttentionModule(mlir::MLIRContext &context, lm::MaskKind mask, int64_t heads,
                                                       int64_t dModel, int64_t clip = 0, int64_t rowWords = 0,
                                                       KernelTarget target = {});
/// A module with the single kernel `attention_grad_kernel(dO, q, k, v [B, N, d_model], lengths [B], dq, dk, dv)`
/// (C interface): lm.attention_grad with `mask` lowered by the model's pattern (its vector form); with `clip` > 0,
/// Shaw relative positions: `attention_grad_kernel(dO, q, k, v, lengths, rel_k, rel_v, dq, dk, dv, drel_k, drel_v)`;
/// with `rowWords` > 0 the directional rows follow the lengths, as in buildAttentionModule. Lowered for `target`.
/// For kernel benchmarks and tests.
mlir::OwningOpRef<mlir::ModuleOp> buildAttentionGradModule(mlir::MLIRContext &context, lm::MaskKind mask,
                                                           int64_t heads, int64_t dModel, int64_t clip = 0,
                                                           int64_t rowWords = 0, KernelTarget target = {});

/// Builder helpers for one op's lowering: constants, loop nests, loads and stores, comparisons, and the
/// op's converted operands (`in`). B and N are read off the converted operands (see the file comment).
class Loops {
public:
  Loops(mlir::ConversionPatternRewriter &rewriter, mlir::Operation *op, mlir::ValueRange operands,
        const LoweringContext &context);

  mlir::ConversionPatternRewriter &b;
  mlir::Location loc;
  const LoweringContext &context;
  /// The batch size and the sequence length: the first and second `?` of the op's operand buffers. Where the
  /// operands have fewer `?` (hand-written IR with static sizes), an error on the op and the size 1 in its place;
  /// the pass then fails (LoweringContext::missingSizes). Const: a lowering whose leading size is another count
  /// passes its own sizes to alloc rather than assigning these.
  const mlir::Value B() { return B_ ? B_ : (B_ = missingSize("batch size")); }
  const mlir::Value N() { return N_ ? N_ : (N_ = missingSize("sequence length")); }

  /// The buffer of `original`, one of the op's operands.
  mlir::Value in(mlir::Value original) const;
  /// Replaces the op with `buffer` (cast to the converted type of its result when they differ).
  mlir::LogicalResult set(mlir::Operation *op, mlir::Value buffer);
  /// The same for every result of a multi-result op.
  mlir::LogicalResult setAll(mlir::Operation *op, llvm::ArrayRef<mlir::Value> buffers);

  mlir::Value idx(int64_t v) { return b.create<mlir::arith::ConstantIndexOp>(loc, v); }
  mlir::Value f32c(double v) { return b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(float(v))); }
  mlir::Value f64c(double v) { return b.create<mlir::arith::ConstantOp>(loc, b.getF64FloatAttr(v)); }
  mlir::Value i32c(int64_t v) { return b.create<mlir::arith::ConstantOp>(loc, b.getI32IntegerAttr(int32_t(v))); }
  mlir::Value i64c(int64_t v) { return b.create<mlir::arith::ConstantOp>(loc, b.getI64IntegerAttr(v)); }
  mlir::Type f32() { return b.getF32Type(); }
  mlir::Type f64() { return b.getF64Type(); }
  mlir::Type i32() { return b.getI32Type(); }

  /// Runtime sizes of a tensor or memref type: first `?` = B, later `?` = N.
  llvm::SmallVector<mlir::Value> sizes(mlir::ShapedType t);
  /// A fresh 64-byte aligned buffer; deallocated after its last use in its block by the pass.
  mlir::Value alloc(mlir::ShapedType t);
  /// The sizes of a buffer (memref.dim for its dynamic dimensions): for ops whose `?` are not all N (a
  /// cross-attention's scores [B, H, N, M] have keys of another sequence than their queries).
  llvm::SmallVector<mlir::Value> dims(mlir::Value buffer);
  /// A fresh buffer of type t with the given sizes (every dimension; the static ones are ignored).
  mlir::Value alloc(mlir::ShapedType t, llvm::ArrayRef<mlir::Value> sizes);

  /// for i0 < ubs[0], i1 < ubs[1], ...: body(ivs). The builder ends after the nest.
  void nest(llvm::ArrayRef<mlir::Value> ubs, const std::function<void(mlir::ValueRange)> &body);
  /// acc = init; for i in [lb, ub): acc = step(i, acc); returns acc.
  mlir::Value reduce(mlir::Value lb, mlir::Value ub, mlir::Value init,
                     const std::function<mlir::Value(mlir::Value, mlir::Value)> &step);
  /// if (cond) then(); no results.
  void when(mlir::Value cond, const std::function<void()> &then);
  /// cond ? then() : otherwise() as a value; only the taken branch executes.
  mlir::Value choose(mlir::Value cond, mlir::Type type, const std::function<mlir::Value()> &then,
                     const std::function<mlir::Value()> &otherwise);

  mlir::Value load(mlir::Value m, mlir::ValueRange ivs) { return b.create<mlir::memref::LoadOp>(loc, m, ivs); }
  void store(mlir::Value v, mlir::Value m, mlir::ValueRange ivs) { b.create<mlir::memref::StoreOp>(loc, v, m, ivs); }
  /// lengths[bi] as an index (`lengths` = the op's lengths buffer).
  mlir::Value lengthOf(mlir::Value bi) { return toIndex(load(lengths, bi)); }
  mlir::Value toIndex(mlir::Value i) { return b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), i); }
  mlir::Value lt(mlir::Value x, mlir::Value y) { return cmp(mlir::arith::CmpIPredicate::slt, x, y); }
  mlir::Value le(mlir::Value x, mlir::Value y) { return cmp(mlir::arith::CmpIPredicate::sle, x, y); }
  mlir::Value ge(mlir::Value x, mlir::Value y) { return cmp(mlir::arith::CmpIPredicate::sge, x, y); }
  mlir::Value ne(mlir::Value x, mlir::Value y) { return cmp(mlir::arith::CmpIPredicate::ne, x, y); }
  mlir::Value eqI(mlir::Value x, mlir::Value y) { return cmp(mlir::arith::CmpIPredicate::eq, x, y); }
  mlir::Value cmp(mlir::arith::CmpIPredicate p, mlir::Value x, mlir::Value y) {
    return b.create<mlir::arith::CmpIOp>(loc, p, x, y);
  }
  mlir::Value andI(mlir::Value x, mlir::Value y) { return b.create<mlir::arith::AndIOp>(loc, x, y); }
  mlir::Value orI(mlir::Value x, mlir::Value y) { return b.create<mlir::arith::OrIOp>(loc, x, y); }
  mlir::Value notI(mlir::Value x) {
    return b.create<mlir::arith::XOrIOp>(loc, x, b.create<mlir::arith::ConstantOp>(loc, b.getBoolAttr(true)));
  }
  mlir::Value select(mlir::Value c, mlir::Value x, mlir::Value y) {
    return b.create<mlir::arith::SelectOp>(loc, c, x, y);
  }
  mlir::Value toF64(mlir::Value x) { return b.create<mlir::arith::ExtFOp>(loc, f64(), x); }
  mlir::Value toF32(mlir::Value x) { return b.create<mlir::arith::TruncFOp>(loc, f32(), x); }
  /// Whether the i32 `id` is one of `tokens`.
  mlir::Value isOneOf(mlir::Value id, llvm::ArrayRef<int32_t> tokens);
  /// clip(j - i, -k, k) + k: the row of a relative-position table.
  mlir::Value relativeIndex(mlir::Value i, mlir::Value j, int64_t k);
  /// Key j visible to Diformer row i of entry bi under the directional mask (`rows` [B, N, 1 + W], see
  /// lm.mask_fill): j < length and R: j <= i, L: j >= i, S: j != i and j's hidden bit clear, skip: never.
  mlir::Value directionalVisible(mlir::Value rows, mlir::Value bi, mlir::Value i, mlir::Value j, mlir::Value length);
  /// Row-wise max of the last axis of x at `row`.
  mlir::Value rowMax(mlir::Value x, llvm::SmallVector<mlir::Value> row, mlir::Value C);

  /// The buffer's aligned base address + its view offset, in bytes, as an i64 (runtime GEMM arguments).
  mlir::Value address(mlir::Value m);
  /// The same as an !llvm.ptr.
  mlir::Value pointer(mlir::Value m);
  /// The flat weight buffer: argument 0 of the function being lowered.
  mlir::Value weights();
  /// A [rows, cols] (or any rank, row-major) view of the weight buffer at a float offset.
  mlir::Value weightView(int64_t offset, llvm::ArrayRef<int64_t> shape);

  /// The output buffers of the entry point being lowered (its arguments after the weights and the inputs:
  /// ids, lengths and, for mask-and-predict scoring, spans).
  llvm::SmallVector<mlir::Value> outputs();
  mlir::ShapedType typeOf(mlir::Value v) { return llvm::cast<mlir::ShapedType>(v.getType()); }

  /// The packed form of a GEMM weight (an lm.weight or an lm.concat of them) in the layout, or null
  /// (--gemm=eigen, or a stack whose tensors are not back to back).
  const WeightLayout::Entry *packed(mlir::Value weight) const;
  bool isPacked(mlir::Value weight) const { return packed(weight) != nullptr; }
  /// The generated GEMM of the packed `weight` [n, k] on panels [first, first + panels), split over the
  /// runtime's threads (lm_rt_parallel_for): out[rows, cols] gets columns first*64... of the product. The
  /// task rebuilds its operands from the 8 addresses and sizes of a ctx array. `activation`: the GEMM's epilogue
  /// (getOrCreateGemm; not with the AMX tile).
  void parallelGemm(mlir::Value weight, int64_t n, int64_t k, mlir::Value inputAddress, mlir::Value rows,
                    mlir::Value bias, mlir::Value outAddress, mlir::Value cols, mlir::Value first, mlir::Value panels,
                    llvm::StringRef activation = {});
  /// What parallelGemm reads for the input [rows, k] (row-major f32 at `inputAddress`): that address, or for the AMX
  /// kernel a fresh buffer of the rows rounded to bf16 pairs (emitRoundToPairs), made once before the threads split
  /// the panels (each of them rounded all of A before: 8 times at 2 threads). `release` frees it after the GEMMs.
  struct GemmInput {
    mlir::Value address, buffer;
  };
  GemmInput gemmInput(mlir::Value inputAddress, mlir::Value rows, int64_t k);
  void release(const GemmInput &input) {
    if (input.buffer)
      b.create<mlir::memref::DeallocOp>(loc, input.buffer);
  }
  /// The address of `fn` as an !llvm.ptr (a function pointer for the runtime).
  mlir::Value functionPointer(mlir::func::FuncOp fn);
  /// The arguments (lm_rt_gemm_fn, column-slice width) that hand the runtime's training kernels the library's
  /// training GEMM (Gemm.h getOrCreateTrainGemm, the target's fp32 tile), specialized for the call's static `depths`.
  llvm::SmallVector<mlir::Value, 2> trainGemm(llvm::ArrayRef<TrainGemmDepth> depths = {});
  /// lm_rt_parallel_for(count, task, ctx) with ctx an array of the i64 `fields`; when the i1 `serial` is true,
  /// task(ctx, 0, count) on this thread instead.
  void parallelFor(mlir::func::FuncOp task, mlir::Value count, llvm::ArrayRef<mlir::Value> fields,
                   mlir::Value serial = {});
  /// A buffer as a row task sees it: `type` (identity layout) over the buffer's data, with `sizes` its
  /// dynamic sizes.
  struct TaskView {
    mlir::Value buffer;
    mlir::MemRefType type;
    llvm::SmallVector<mlir::Value> sizes;
  };
  /// The view of `buffer` as itself (with its dynamic sizes) when its layout is the identity, or as the
  /// identity-layout type of its static shape when it is a contiguous view (a weight's view at an offset);
  /// nullopt otherwise.
  std::optional<TaskView> taskView(mlir::Value buffer);
  /// Whether a task can read a buffer of `type` from its address alone: an identity layout, or a static
  /// row-major view at an offset (a weight in the weight buffer).
  static bool readableAtAddress(mlir::MemRefType type);
  /// body(views, scalars, r) for r in [0, count), in the task function `name` (made on first use: the name must
  /// say everything the body depends on but the views' data and the index `scalars`): split over the runtime's
  /// threads when `work` reaches 2^17 (a few tens of microseconds), else called on this thread. The task reads
  /// the views' addresses and sizes and the scalars from its ctx; its body must use nothing else of the caller.
  void rowTask(llvm::StringRef name, llvm::ArrayRef<TaskView> views, llvm::ArrayRef<mlir::Value> scalars,
               mlir::Value count, mlir::Value work,
               const std::function<void(llvm::ArrayRef<mlir::Value>, llvm::ArrayRef<mlir::Value>, mlir::Value)> &body);
  /// body(rows, vectors, r) for every row r of the row-major [rows, cols] forms of `buffers` (identity layouts,
  /// static last dimension: the leading dimensions flattened; the rows counted on buffers[0]) with `vectors`
  /// contiguous 1-D buffers every row reads (LayerNorm's gain and bias), by rowTask with work rows x cols x
  /// `cost`. Every row is computed the same way whatever the split. False, emitting nothing, when a layout
  /// does not fit: the caller emits its own nest.
  bool forRows(llvm::StringRef name, llvm::ArrayRef<mlir::Value> buffers, llvm::ArrayRef<mlir::Value> vectors,
               int64_t cost,
               const std::function<void(llvm::ArrayRef<mlir::Value>, llvm::ArrayRef<mlir::Value>, mlir::Value)> &body);

  /// body(params) in the private function `lm_<kind>_<hash of the argument types>` (made on first use), called
  /// here with `args` (buffers and indices; params are the function's arguments in their place). `kind` must say
  /// everything the body depends on but the arguments; the body must use nothing else of the caller (set
  /// `lengths` from a parameter when it reads them). Never inlined: the decomposed attention's ops (the naive
  /// pipeline) occur dozens of times per entry with a few signatures, and a copy of their loop nests at every
  /// use made LLVM's unrolling and vectorization of one entry take minutes.
  void outlined(llvm::StringRef kind, llvm::ArrayRef<mlir::Value> args,
                const std::function<void(llvm::ArrayRef<mlir::Value>)> &body);

  mlir::Value lengths; ///< the op's key-padding lengths buffer, when it has one

private:
  mlir::Value missingSize(llvm::StringRef what);

  mlir::Operation *op;
  mlir::ValueRange operands;
  mlir::Value B_, N_;
};

/// buffer = emitActivation(kind, buffer) elementwise, in place (a row task where the layout allows): lm.linear
/// {activation} where its product has no epilogue (the AMX tile, --gemm=eigen).
void emitActivationInPlace(Loops &L, llvm::StringRef kind, mlir::Value buffer);

/// The canonical weight names behind a GEMM weight operand (an lm.weight, or an lm.concat of them), or none.
std::vector<std::string> weightNames(mlir::Value weight);

/// Whether lm.attention_grad has the vector form (AttentionGrad.cpp): the forward's (head size a multiple of 16),
/// any mask kind but explicit (directional rows included).
bool hasVectorAttentionGrad(lm::AttentionGradOp op);
/// lm.attention_grad in the vector form (generated, register-tiled; split over threads by (entry, head) items).
mlir::LogicalResult lowerVectorAttentionGrad(lm::AttentionGradOp op, Loops &L);

/// A conversion pattern for one lm op that lowers it through Loops.
template <typename Op> struct LmLowering : mlir::OpConversionPattern<Op> {
  LmLowering(mlir::TypeConverter &converter, mlir::MLIRContext *ctx, const LoweringContext &context)
      : mlir::OpConversionPattern<Op>(converter, ctx), context(context) {}

  mlir::LogicalResult matchAndRewrite(Op op, typename Op::Adaptor adaptor,
                                      mlir::ConversionPatternRewriter &rewriter) const final {
    Loops L(rewriter, op, adaptor.getOperands(), context);
    return lower(op, L);
  }
  virtual mlir::LogicalResult lower(Op op, Loops &L) const = 0;

  const LoweringContext &context;
};

} // namespace lmcc::codegen
