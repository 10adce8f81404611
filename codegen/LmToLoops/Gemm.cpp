//===- Gemm.cpp - Generated GEMM microkernels over load-time packed weights -===//
//
// The weights of every linear layer are constants: the runtime packs them once at load time into panels of 64 output
// features, zero-padded, each panel stored as contiguous K x c slices of the tile's width c, so the kernel streams B
// sequentially and never re-packs. The microkernel keeps a tile of C in vector registers across a chunk of the K loop
// (scf.for iter_args), sized to the target: on AVX-512, 12 x 32 in 24 vector<16xf32>, 2 loads of B and 12 broadcasts of
// A per k step for 24 FMAs; on AVX2, 6 x 16 in 12 vector<8xf32>, 2 loads and 6 broadcasts for 12 FMAs (the classic
// 16-register tile). Rows come in blocks that keep A in L2; depths over 512 are cut into chunks of 128 whose slice of B
// stays in L1 across the block's tiles; a block is cut into tiles of balanced heights; the last partial panel is
// written with masked stores. Every output element is one FMA chain over k in order, whatever the tile, block or chunk,
// so the choice never changes a result. DESIGN.md records the recipe.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Gemm.h"
#include "codegen/LmToLoops/Lowering.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <algorithm>
#include <set>

using namespace mlir;

namespace lmcc::codegen {

/// The i32 constant v of `type` (i32 or a vector of i32: splat).
static Value i32Constant(OpBuilder &b, Location loc, Type type, uint32_t v) {
  if (auto vector = dyn_cast<VectorType>(type))
    return b.create<arith::ConstantOp>(loc, vector, DenseElementsAttr::get(vector, int32_t(v)));
  return b.create<arith::ConstantOp>(loc, b.getI32IntegerAttr(int32_t(v)));
}

/// The bf16 bits of x (f32, or a vector of f32 lane by lane) in the low half of an i32: rounded to nearest even in
/// integer arithmetic (LLVM lowers an f32 -> bf16 truncation to a libgcc call on CPUs without AVX512_BF16, which
/// older toolchains lack); a NaN becomes the quiet NaN 0x7fc0.
static Value bf16Bits(OpBuilder &b, Location loc, Value x) {
  auto vector = dyn_cast<VectorType>(x.getType());
  Type type = vector ? Type(VectorType::get(vector.getShape(), b.getI32Type())) : Type(b.getI32Type());
  auto c = [&](uint32_t v) { return i32Constant(b, loc, type, v); };
  Value w = b.create<arith::BitcastOp>(loc, type, x);
  Value odd = b.create<arith::AndIOp>(loc, b.create<arith::ShRUIOp>(loc, w, c(16)), c(1));
  Value rounded =
      b.create<arith::ShRUIOp>(loc, b.create<arith::AddIOp>(loc, w, b.create<arith::AddIOp>(loc, c(0x7fff), odd)), c(16));
  Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, x, x);
  return b.create<arith::SelectOp>(loc, nan, c(0x7fc0), rounded);
}

/// The 32-bit word holding the bf16 pair (lo, hi), lo in the low half, as an f32 (lane by lane for vectors).
static Value bf16Pair(OpBuilder &b, Location loc, Value lo, Value hi) {
  Value loBits = bf16Bits(b, loc, lo), hiBits = bf16Bits(b, loc, hi);
  Value word = b.create<arith::OrIOp>(
      loc, loBits, b.create<arith::ShLIOp>(loc, hiBits, i32Constant(b, loc, hiBits.getType(), 16)));
  return b.create<arith::BitcastOp>(loc, lo.getType(), word);
}

/// bf16Pair on 16 pairs at once: the 16 words of x = 32 consecutive floats (pair l = x[2l], x[2l + 1]), as a
/// vector<16xf32>: the same bits as 16 scalar pairs.
static Value bf16PairWords(OpBuilder &b, Location loc, Value x) {
  SmallVector<int64_t> evens, odds;
  for (int64_t l = 0; l < 16; ++l)
    evens.push_back(2 * l), odds.push_back(2 * l + 1);
  return bf16Pair(b, loc, b.create<vector::ShuffleOp>(loc, x, x, evens), b.create<vector::ShuffleOp>(loc, x, x, odds));
}

/// Pair kv of `row` of the [*, k] buffer `m` as a bf16 word: m[row][2 kv] and m[row][2 kv + 1] (0 past k).
static Value loadBf16Pair(OpBuilder &b, Location loc, Value m, Value row, Value kv, int64_t k) {
  Value k0 = b.create<arith::MulIOp>(loc, kv, b.create<arith::ConstantIndexOp>(loc, 2));
  Value k1 = b.create<arith::AddIOp>(loc, k0, b.create<arith::ConstantIndexOp>(loc, 1));
  Value lo = b.create<memref::LoadOp>(loc, m, ValueRange{row, k0});
  if (k % 2 == 0)
    return bf16Pair(b, loc, lo, b.create<memref::LoadOp>(loc, m, ValueRange{row, k1}));
  Value hasHi = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, k1, b.create<arith::ConstantIndexOp>(loc, k));
  auto hi = b.create<scf::IfOp>(loc, TypeRange{b.getF32Type()}, hasHi, true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(hi.thenBlock());
    b.create<scf::YieldOp>(loc, ValueRange{b.create<memref::LoadOp>(loc, m, ValueRange{row, k1})});
    b.setInsertionPointToStart(hi.elseBlock());
    b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0)).getResult()});
  }
  return bf16Pair(b, loc, lo, hi.getResult(0));
}

void emitPack(OpBuilder &b, Location loc, Value weight, Value packed, int64_t n, int64_t k, GemmTile tile) {
  // Column j of panel p (row p*64 + j of W) becomes the stride-c column jj = j % c of slice g = j / c: flat(P)[p*K*64 +
  // g*K*c + kv*c + jj] for kv < K (Gemm.h), zero past N. One W row is read in order per (p, j); no division per
  // element (the trainer re-packs every weight after each step).
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  const bool bf16 = tile.bf16();
  const int64_t kk = packedDepth(k, bf16), c = tile.cols();
  Value flat = b.create<memref::CollapseShapeOp>(loc, packed, ArrayRef<ReassociationIndices>{{0, 1}});
  Value fzero = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0));
  OpBuilder::InsertionGuard guard(b);
  auto lp = b.create<scf::ForOp>(loc, cidx(0), cidx((n + kPanel - 1) / kPanel), cidx(1));
  b.setInsertionPointToStart(lp.getBody());
  auto lj = b.create<scf::ForOp>(loc, cidx(0), cidx(kPanel), cidx(1));
  b.setInsertionPointToStart(lj.getBody());
  Value p = lp.getInductionVar(), j = lj.getInductionVar();
  Value row = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(kPanel)), j);
  Value g = b.create<arith::DivUIOp>(loc, j, cidx(c)), jj = b.create<arith::RemUIOp>(loc, j, cidx(c));
  Value base = b.create<arith::AddIOp>(
      loc, b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(kk * kPanel)), b.create<arith::MulIOp>(loc, g, cidx(kk * c))),
      jj);
  Value inside = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, row, cidx(n));
  auto branch = b.create<scf::IfOp>(loc, inside, /*withElseRegion=*/true);
  auto column = [&](bool real) {
    auto lk = b.create<scf::ForOp>(loc, cidx(0), cidx(kk), cidx(1));
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(lk.getBody());
    Value kv = lk.getInductionVar();
    Value word = !real ? fzero
                 : bf16 ? loadBf16Pair(b, loc, weight, row, kv, k)
                        : Value(b.create<memref::LoadOp>(loc, weight, ValueRange{row, kv}));
    Value at = b.create<arith::AddIOp>(loc, base, b.create<arith::MulIOp>(loc, kv, cidx(c)));
    b.create<memref::StoreOp>(loc, word, flat, ValueRange{at});
  };
  b.setInsertionPointToStart(branch.thenBlock());
  column(true);
  b.setInsertionPointToStart(branch.elseBlock());
  column(false);
}

std::string GemmTile::name() const {
  const char *format = weights == Weights::Bf16Dot    ? "_bf16dot"
                       : weights == Weights::Bf16Amx  ? "_bf16amx"
                       : weights == Weights::Bf16Widen ? "_bf16"
                                                       : "";
  return std::to_string(rows) + "x" + std::to_string(cols()) + format;
}

static std::string gemmName(const char *prefix, int64_t n, int64_t k, bool withBias, GemmTile tile,
                            StringRef activation = {}) {
  return prefix + std::to_string(n) + "x" + std::to_string(k) + (withBias ? "_bias_" : "_") + tile.name() +
         (activation.empty() ? "" : "_" + activation.str());
}

namespace {

/// The operands of one generated GEMM body (getOrCreateGemm, getOrCreateTrainGemm). `k` is the static depth, or
/// ShapedType::kDynamic with `K` its runtime value (fp32 only). `N` bounds the columns; `accumulate` (an i1, or null)
/// adds C's old values to the products; `activation` (emitActivation's kind, or empty) is applied to each element
/// of the product plus the bias, over each panel of a row block once the panel is done.
struct GemmBody {
  Value A, P, bias, C, pBegin, pEnd, cBase, N, K, accumulate;
  int64_t n, k;
  bool withBias, prefetch;
  StringRef activation;
};

} // namespace

static void emitGemmBody(OpBuilder &b, Location loc, const GemmBody &op, GemmTile tile) {
  MLIRContext *ctx = b.getContext();
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type();
  const int64_t n = op.n, k = op.k;
  const bool dynamicK = k == dyn, withBias = op.withBias, prefetch = op.prefetch;
  Value A = op.A, P = op.P, bias = op.bias, C = op.C, pBegin = op.pBegin, pEnd = op.pEnd, cBase = op.cBase;
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  const int64_t R = tile.rows, V = tile.vectors, L = tile.lanes, W = tile.cols(), groups = kPanel / W;
  auto vec = VectorType::get({L}, f32);
  Value zeroVec = b.create<arith::ConstantOp>(loc, vec, DenseElementsAttr::get(vec, 0.0f));
  Value M = b.create<memref::DimOp>(loc, A, 0);

  // P as one flat array: column slice q = p*groups + g (K x W, Gemm.h) starts at q*K*W.
  auto flatType = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, dyn, {1}));
  Value flatP = b.create<memref::CollapseShapeOp>(loc, flatType, P, ArrayRef<ReassociationIndices>{{0, 1}});
  const bool bf16 = tile.bf16(), dot = tile.weights == GemmTile::Weights::Bf16Dot;
  assert((!dynamicK || !bf16) && "a dynamic depth takes fp32 operands");
  // Rows of a column slice: k floats, or ceil(k / 2) bf16 pairs.
  Value depth = dynamicK ? op.K : cidx(packedDepth(k, bf16));
  Value sliceFloats = b.create<arith::MulIOp>(loc, depth, cidx(W));
  assert((!dot || L == 16) && "bf16 dot products take 16 f32 lanes");
  Value lastFloat = b.create<arith::SubIOp>(
      loc, b.create<arith::MulIOp>(loc, b.create<memref::DimOp>(loc, P, 0), cidx(kPanel)), cidx(1));
  // Depth chunks: a depth over kMaxUnchunked packed rows is cut into chunks of kChunk, so that a chunk of a column
  // slice (kChunk x W floats, 16 KB at W = 32) stays in L1 while the block's tiles pass over it, the tiles' partial
  // sums waiting in `partial` between chunks (exact: each element is still one FMA chain over k in order). Without
  // chunks a tile streamed the whole K x W slice from L2, and K >= 2048 ran at 28-53% of peak on a core with two FMA
  // ports (80-83% with chunks); a slice of depth 512 or less streams fast enough (the 16384-row FFN of K 512 ran 20%
  // faster unchunked). The rows of a block (about kBlockBytes of A, all of K) stay in L2 across the slices; a larger
  // block streams the weight from memory fewer times (bench/results/2026-11-28-chunks.md).
  constexpr int64_t kChunk = 128, kMaxUnchunked = 512, kBlockBytes = 512 << 10, kMaxBlockRows = 256;
  const bool chunked = dynamicK || packedDepth(k, bf16) > kMaxUnchunked;
  // The bf16 dot kernel keeps its block of A as pairs on the stack: 128 KB of A (a 64 KB buffer) there.
  const int64_t blockBytes = chunked && !dot ? kBlockBytes : 128 << 10, maxRows = std::max(R, kMaxBlockRows / R * R);
  // Bf16Dot: the block's rows of A as bf16 pairs (the activations rounded like the weights), [block row, pair].
  const int64_t staticBlockRows = dynamicK ? maxRows : std::clamp(blockBytes / (4 * k) / R * R, R, maxRows);
  Value blockRows = dynamicK ? b.create<arith::MinSIOp>(
                                   loc, cidx(maxRows),
                                   b.create<arith::MaxSIOp>(
                                       loc, cidx(R),
                                       b.create<arith::MulIOp>(
                                           loc,
                                           b.create<arith::DivUIOp>(
                                               loc,
                                               b.create<arith::DivUIOp>(loc, cidx(blockBytes / 4),
                                                                        b.create<arith::MaxSIOp>(loc, depth, cidx(1))),
                                               cidx(R)),
                                           cidx(R))))
                             : cidx(staticBlockRows);
  // An unchunked weight read from beyond L2 (`prefetch`): when all of A fits in two blocks of kBlockBytes, those
  // (one or two passes over the weight, where 128 KB blocks made up to nine: the vocabulary projection of 320 rows,
  // T-TA / uniLM scoring of 10-token sentences at batch 32, ran 6-11% faster). Larger A keeps the 128 KB blocks:
  // kernel_bench's 16384x512x2048 ran 8% slower with 512 KB ones (bench/results/2026-11-29-gemm-blocks.md).
  if (const int64_t wideRows = std::clamp(kBlockBytes / (4 * k) / R * R, R, maxRows);
      prefetch && !chunked && !dot && wideRows > staticBlockRows)
    blockRows = b.create<arith::SelectOp>(
        loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ule, M, cidx(2 * wideRows)), cidx(wideRows), blockRows);
  // Its rows are a line longer where a multiple of 1024 words would put them 4 KB apart: every row of a tile in the
  // same L1 sets, which 12 rows overflow on an 8-way L1 (GemmTile::forDepth; bench/results/2026-11-30-deep-tile.md).
  const int64_t pairRow = packedDepth(k, bf16) + (dot && GemmTile::rowsShareL1Sets(packedDepth(k, bf16)) ? 16 : 0);
  Value A2 = dot ? Value(b.create<memref::AllocaOp>(loc, MemRefType::get({staticBlockRows, pairRow}, f32)))
                 : Value();
  Value partial =
      chunked ? Value(b.create<memref::AllocaOp>(loc, MemRefType::get({staticBlockRows, W}, f32))) : Value();
  auto bf16Vec = VectorType::get({2 * L}, b.getBF16Type());
  auto i32Vec = VectorType::get({L}, b.getI32Type());
  Value highHalf = b.create<arith::ConstantOp>(loc, i32Vec, DenseElementsAttr::get(i32Vec, int32_t(0xffff0000u)));
  Value sixteen = b.create<arith::ConstantOp>(loc, i32Vec, DenseElementsAttr::get(i32Vec, int32_t(16)));
  // One r x W tile at rows [m0, m0 + r) (row m0 - mb of the block) of the column slice starting at `slice` (panel p,
  // group g). `aheads` are lines of the next slice, prefetched at the same k (the second only when `fewTiles`).
  auto tileAt = [&](int64_t r, Value m0, Value mb, Value p, Value g, Value slice, ArrayRef<Value> aheads,
                    Value fewTiles, Value kBegin, Value kEnd, Value firstChunk, Value lastChunk) {
    Value g0 = b.create<arith::MulIOp>(loc, g, cidx(W));
    Value blockRow = b.create<arith::SubIOp>(loc, m0, mb);
    SmallVector<Value> init(r * V, zeroVec);
    if (chunked) { // the first chunk starts from zero, the others from the partial sums the previous one left
      auto start = b.create<scf::IfOp>(loc, TypeRange(SmallVector<Type>(r * V, vec)), firstChunk, true);
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(start.thenBlock());
      b.create<scf::YieldOp>(loc, init);
      b.setInsertionPointToStart(start.elseBlock());
      SmallVector<Value> loaded;
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < V; ++j)
          loaded.push_back(b.create<vector::LoadOp>(
              loc, vec, partial, ValueRange{b.create<arith::AddIOp>(loc, blockRow, cidx(i)), cidx(L * j)}));
      b.create<scf::YieldOp>(loc, loaded);
      init.assign(start.getResults().begin(), start.getResults().end());
    }
    auto loop = b.create<scf::ForOp>(loc, kBegin, kEnd, cidx(1), init);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value kv = loop.getInductionVar();
      Value kW = b.create<arith::MulIOp>(loc, kv, cidx(W));
      Value at = b.create<arith::AddIOp>(loc, slice, kW);
      if (prefetch) {
        // Streamed from memory when the weight is larger than the caches (the vocabulary projection), into L2 only
        // (prefetcht1): prefetching into L1 two slices ahead made the 10-row vocabulary projection 1.3-1.5x slower
        // than this, and no prefetch at all was in between (bench/results/2026-11-25-stream.md). Past the end,
        // clamped to the last float.
        auto prefetchLine = [&](Value line) {
          Value target = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, line, kW), lastFloat);
          b.create<memref::PrefetchOp>(loc, flatP, ValueRange{target},
                                       /*isWrite=*/false, /*localityHint=*/2,
                                       /*isDataCache=*/true);
        };
        prefetchLine(aheads[0]);
        if (aheads.size() > 1) {
          auto second = b.create<scf::IfOp>(loc, fewTiles, /*withElse=*/false);
          OpBuilder::InsertionGuard inner(b);
          b.setInsertionPointToStart(second.thenBlock());
          prefetchLine(aheads[1]);
        }
      }
      SmallVector<Value> bv;
      for (int64_t j = 0; j < V; ++j)
        bv.push_back(
            b.create<vector::LoadOp>(loc, vec, flatP, ValueRange{b.create<arith::AddIOp>(loc, at, cidx(L * j))}));
      auto acc = [&](int64_t i, int64_t j) { return loop.getRegionIterArgs()[i * V + j]; };
      SmallVector<Value> next;
      if (tile.weights == GemmTile::Weights::F32) {
        for (int64_t i = 0; i < r; ++i) {
          Value a = b.create<memref::LoadOp>(loc, A, ValueRange{b.create<arith::AddIOp>(loc, m0, cidx(i)), kv});
          Value av = b.create<vector::BroadcastOp>(loc, vec, a);
          for (int64_t j = 0; j < V; ++j)
            next.push_back(b.create<vector::FMAOp>(loc, av, bv[j], acc(i, j)));
        }
      } else if (dot) {
        // acc += A2[row, kv].lo * B[2kv] + A2[row, kv].hi * B[2kv + 1] per lane: one vdpbf16ps.
        for (int64_t j = 0; j < V; ++j)
          bv[j] = b.create<vector::BitCastOp>(loc, bf16Vec, bv[j]);
        for (int64_t i = 0; i < r; ++i) {
          Value a = b.create<memref::LoadOp>(loc, A2, ValueRange{b.create<arith::AddIOp>(loc, blockRow, cidx(i)), kv});
          Value av = b.create<vector::BitCastOp>(loc, bf16Vec, b.create<vector::BroadcastOp>(loc, vec, a));
          for (int64_t j = 0; j < V; ++j)
            next.push_back(b.create<LLVM::CallIntrinsicOp>(
                                loc, TypeRange{vec}, b.getStringAttr("llvm.x86.avx512bf16.dpbf16ps.512"),
                                ValueRange{acc(i, j), av, bv[j]},
                                LLVM::FastmathFlagsAttr::get(ctx, LLVM::FastmathFlags::none))
                               .getResult(0));
        }
      } else {
        // Widen the pairs: even k = word << 16, odd k = word & 0xffff0000, then two fp32 FMAs (the odd A index clamped
        // to k - 1 past an odd k, where the packed half is 0).
        SmallVector<Value> even, odd;
        for (int64_t j = 0; j < V; ++j) {
          Value w = b.create<vector::BitCastOp>(loc, i32Vec, bv[j]);
          even.push_back(b.create<vector::BitCastOp>(loc, vec, b.create<arith::ShLIOp>(loc, w, sixteen)));
          odd.push_back(b.create<vector::BitCastOp>(loc, vec, b.create<arith::AndIOp>(loc, w, highHalf)));
        }
        Value k0 = b.create<arith::MulIOp>(loc, kv, cidx(2));
        Value k1 = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, k0, cidx(1)), cidx(k - 1));
        for (int64_t i = 0; i < r; ++i) {
          Value row = b.create<arith::AddIOp>(loc, m0, cidx(i));
          Value a0 = b.create<vector::BroadcastOp>(loc, vec, b.create<memref::LoadOp>(loc, A, ValueRange{row, k0}));
          Value a1 = b.create<vector::BroadcastOp>(loc, vec, b.create<memref::LoadOp>(loc, A, ValueRange{row, k1}));
          for (int64_t j = 0; j < V; ++j)
            next.push_back(b.create<vector::FMAOp>(loc, a1, odd[j], b.create<vector::FMAOp>(loc, a0, even[j], acc(i, j))));
        }
      }
      b.create<scf::YieldOp>(loc, next);
    }
    OpBuilder::InsertionGuard guard(b);
    if (chunked) { // all but the last chunk leave their sums in `partial`
      auto last = b.create<scf::IfOp>(loc, lastChunk, /*withElse=*/true);
      b.setInsertionPointToStart(last.elseBlock());
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < V; ++j)
          b.create<vector::StoreOp>(loc, loop.getResult(i * V + j), partial,
                                    ValueRange{b.create<arith::AddIOp>(loc, blockRow, cidx(i)), cidx(L * j)});
      b.setInsertionPointToStart(last.thenBlock());
    }
    Value colW = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(kPanel)), g0);
    Value colC = b.create<arith::AddIOp>(
        loc, b.create<arith::MulIOp>(loc, b.create<arith::SubIOp>(loc, p, cBase), cidx(kPanel)), g0);
    for (int64_t j = 0; j < V; ++j) {
      Value col = b.create<arith::AddIOp>(loc, colW, cidx(L * j));
      Value valid = b.create<arith::SubIOp>(loc, op.N, col);
      Value mask = b.create<vector::CreateMaskOp>(loc, VectorType::get({L}, b.getI1Type()), ValueRange{valid});
      Value biasVec =
          withBias ? Value(b.create<vector::MaskedLoadOp>(loc, vec, bias, ValueRange{col}, mask, zeroVec)) : zeroVec;
      Value outCol = b.create<arith::AddIOp>(loc, colC, cidx(L * j));
      // Whole vectors (every column but those of the last partial one) take plain stores: a masked store with a
      // run-time mask is microcoded on AMD's cores (vmaskmovps, about 12 cycles each on Zen 2 / Zen 3; gemm_ab on
      // a Zen 3: 1.02-1.06x on the depth 512 shapes, whose tiles store most often).
      auto whole = b.create<scf::IfOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, valid, cidx(L)),
                                       /*withElseRegion=*/true);
      for (bool plain : {true, false}) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(plain ? whole.thenBlock() : whole.elseBlock());
        for (int64_t i = 0; i < r; ++i) {
          Value row = b.create<arith::AddIOp>(loc, m0, cidx(i));
          Value v = b.create<arith::AddFOp>(loc, loop.getResult(i * V + j), biasVec);
          if (op.accumulate) {
            Value old = plain ? Value(b.create<vector::LoadOp>(loc, vec, C, ValueRange{row, outCol}))
                              : Value(b.create<vector::MaskedLoadOp>(loc, vec, C, ValueRange{row, outCol}, mask,
                                                                     zeroVec));
            v = b.create<arith::AddFOp>(loc, v, b.create<arith::SelectOp>(loc, op.accumulate, old, zeroVec));
          }
          if (plain)
            b.create<vector::StoreOp>(loc, v, C, ValueRange{row, outCol});
          else
            b.create<vector::MaskedStoreOp>(loc, C, ValueRange{row, outCol}, mask, v);
        }
      }
    }
  };

  // Blocks of rows outermost, so that a block of A (128-512 KB) stays in L2 while every column slice of B passes over
  // it (the batched PLL has 16384 rows: A alone is 32 MB). The M rows are cut into ceil(M / blockRows) blocks of equal
  // height rounded up to R (320 rows at a 252-row limit: 168 + 152, not 252 + 68), since each block streams all of
  // B. Then column slices (panel p, group g), then row tiles: a slice of B stays in L1/L2 while the tiles of the
  // block pass over it. A block of Mb rows is cut into ceil(Mb / R) tiles of balanced heights (20 rows: 5, 5, 5, 5
  // rather than 6, 6, 6, 2), since a short tile has too few accumulators to hide the FMA latency.
  {
    auto ceilDiv = [&](Value x, Value y) {
      Value up = b.create<arith::AddIOp>(loc, x, b.create<arith::SubIOp>(loc, y, cidx(1)));
      return b.create<arith::DivUIOp>(loc, up, y);
    };
    Value count = b.create<arith::MaxSIOp>(loc, ceilDiv(M, blockRows), cidx(1));
    Value height = b.create<arith::MulIOp>(loc, ceilDiv(ceilDiv(M, count), cidx(R)), cidx(R));
    blockRows = b.create<arith::MaxSIOp>(loc, height, cidx(R)); // <= the limit, a multiple of R
  }
  auto blocks = b.create<scf::ForOp>(loc, cidx(0), M, blockRows);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(blocks.getBody());
    Value mb = blocks.getInductionVar();
    Value Mb = b.create<arith::MinSIOp>(loc, b.create<arith::SubIOp>(loc, M, mb), blockRows);
    if (dot) { // the block's rows of A as bf16 pairs, once for every column slice
      auto rowsLoop = b.create<scf::ForOp>(loc, cidx(0), Mb, cidx(1));
      OpBuilder::InsertionGuard g2(b);
      b.setInsertionPointToStart(rowsLoop.getBody());
      Value i = rowsLoop.getInductionVar(), row = b.create<arith::AddIOp>(loc, mb, i);
      // 16 pairs (32 floats) a step, then the pairs of the last k mod 32 one by one: the same words. Element by
      // element the conversion took a fifth of the vocabulary projection's time at 128 rows (it runs per block and
      // per task).
      const int64_t vectorPairs = k / 32 * 16;
      if (vectorPairs > 0) {
        auto steps = b.create<scf::ForOp>(loc, cidx(0), cidx(vectorPairs), cidx(16));
        OpBuilder::InsertionGuard g3(b);
        b.setInsertionPointToStart(steps.getBody());
        Value kv = steps.getInductionVar();
        Value x = b.create<vector::LoadOp>(loc, VectorType::get({32}, f32), A,
                                           ValueRange{row, b.create<arith::MulIOp>(loc, kv, cidx(2))});
        b.create<vector::StoreOp>(loc, bf16PairWords(b, loc, x), A2, ValueRange{i, kv});
      }
      auto pairs = b.create<scf::ForOp>(loc, cidx(vectorPairs), depth, cidx(1));
      b.setInsertionPointToStart(pairs.getBody());
      Value kv = pairs.getInductionVar();
      b.create<memref::StoreOp>(loc, loadBf16Pair(b, loc, A, row, kv, k), A2, ValueRange{i, kv});
    }
    Value T = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, Mb, cidx(R - 1)), cidx(R));
    // A k row of the slice is W floats: `lines` cache lines (prefetch below).
    const int64_t lines = std::max<int64_t>(1, W / 16);
    Value fewTiles = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ule, T, cidx(lines / 2));
    auto panels = b.create<scf::ForOp>(loc, pBegin, pEnd, cidx(1));
    b.setInsertionPointToStart(panels.getBody());
    Value p = panels.getInductionVar();
    auto slices = b.create<scf::ForOp>(loc, cidx(0), cidx(groups), cidx(1));
    if (!op.activation.empty()) {
      // The activation over the block's rows of this panel once its slices are done (Mb x 64 floats, at most 64 KB,
      // just stored: in L1 or L2), a row of 64 / L vectors at a time. Applied instead to each tile's accumulators
      // before the store, or over each tile just stored, it cost 1.3-1.7x the activation op's own pass over C (biLM
      // PLL n 40 on a Zen 3, perf: a tile's few vectors per constant load, spilled temporaries).
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointAfter(slices);
      Value colC = b.create<arith::MulIOp>(loc, b.create<arith::SubIOp>(loc, p, cBase), cidx(kPanel));
      auto rows = b.create<scf::ForOp>(loc, mb, b.create<arith::AddIOp>(loc, mb, Mb), cidx(1));
      b.setInsertionPointToStart(rows.getBody());
      Value row = rows.getInductionVar();
      for (int64_t j = 0; j < kPanel / L; ++j) {
        Value valid = b.create<arith::SubIOp>(
            loc, op.N, b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(kPanel)), cidx(L * j)));
        Value outCol = b.create<arith::AddIOp>(loc, colC, cidx(L * j));
        auto whole = b.create<scf::IfOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, valid, cidx(L)),
                                         /*withElseRegion=*/true);
        OpBuilder::InsertionGuard inner(b);
        b.setInsertionPointToStart(whole.thenBlock());
        Value x = b.create<vector::LoadOp>(loc, vec, C, ValueRange{row, outCol});
        b.create<vector::StoreOp>(loc, emitActivation(b, loc, op.activation, x), C, ValueRange{row, outCol});
        b.setInsertionPointToStart(whole.elseBlock());
        auto some = b.create<scf::IfOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sgt, valid, cidx(0)),
                                        /*withElseRegion=*/false);
        b.setInsertionPointToStart(some.thenBlock());
        Value mask = b.create<vector::CreateMaskOp>(loc, VectorType::get({L}, b.getI1Type()), ValueRange{valid});
        x = b.create<vector::MaskedLoadOp>(loc, vec, C, ValueRange{row, outCol}, mask, zeroVec);
        b.create<vector::MaskedStoreOp>(loc, C, ValueRange{row, outCol}, mask, emitActivation(b, loc, op.activation, x));
      }
    }
    b.setInsertionPointToStart(slices.getBody());
    Value g = slices.getInductionVar();
    Value q = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(groups)), g);
    Value slice = b.create<arith::MulIOp>(loc, q, sliceFloats);
    // The block's tiles over packed rows [kBegin, kEnd) of the slice. `distance`: how far ahead (in floats) the tiles
    // prefetch: the next slice, or the next chunk (slices are contiguous, so past the slice's last chunk that is the
    // next slice's first).
    auto tilesOver = [&](Value kBegin, Value kEnd, Value firstChunk, Value lastChunk, Value distance) {
      Value ahead = b.create<arith::AddIOp>(loc, slice, distance);
      auto tiles = b.create<scf::ForOp>(loc, cidx(0), T, cidx(1));
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(tiles.getBody());
      // Tile t covers rows [t*Mb/T, (t+1)*Mb/T) of the block: floor(Mb/T) or ceil(Mb/T) of them, never more than R.
      Value t = tiles.getInductionVar();
      Value first = b.create<arith::DivUIOp>(loc, b.create<arith::MulIOp>(loc, t, Mb), T);
      Value next =
          b.create<arith::DivUIOp>(loc, b.create<arith::MulIOp>(loc, b.create<arith::AddIOp>(loc, t, cidx(1)), Mb), T);
      Value height = b.create<arith::SubIOp>(loc, next, first);
      Value m0 = b.create<arith::AddIOp>(loc, mb, first);
      // Tile t prefetches line t mod lines of each row ahead, and when the block has at most lines / 2 tiles (the
      // vocabulary projection of a short sentence) also line t + lines / 2, so that the tiles bring all of it (a
      // second line a k step for every tile made 20-row sentences 4-6% slower; one line a tile left half of the
      // lines to demand misses).
      SmallVector<Value> tileAheads;
      for (int64_t i = 0; i < std::min<int64_t>(lines, 2); ++i) {
        Value line =
            b.create<arith::RemUIOp>(loc, i ? b.create<arith::AddIOp>(loc, t, cidx(lines / 2)) : t, cidx(lines));
        tileAheads.push_back(b.create<arith::AddIOp>(loc, ahead, b.create<arith::MulIOp>(loc, line, cidx(16))));
      }
      for (int64_t r = R; r >= 1; --r) {
        Value isR = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, height, cidx(r));
        auto branch = b.create<scf::IfOp>(loc, isR, /*withElse=*/false);
        OpBuilder::InsertionGuard inner(b);
        b.setInsertionPointToStart(branch.thenBlock());
        tileAt(r, m0, mb, p, g, slice, tileAheads, fewTiles, kBegin, kEnd, firstChunk, lastChunk);
      }
    };
    if (!chunked) {
      tilesOver(cidx(0), depth, Value(), Value(), sliceFloats);
    } else {
      // At least one chunk: a zero depth still writes C (zeros, the bias, or C's old values).
      auto chunks = b.create<scf::ForOp>(loc, cidx(0), b.create<arith::MaxSIOp>(loc, depth, cidx(1)), cidx(kChunk));
      b.setInsertionPointToStart(chunks.getBody());
      Value kBegin = chunks.getInductionVar();
      Value kEnd = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, kBegin, cidx(kChunk)), depth);
      tilesOver(kBegin, kEnd, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, kBegin, cidx(0)),
                b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, kEnd, depth), cidx(kChunk * W));
    }
  }
}

Value emitRoundToPairs(OpBuilder &b, Location loc, Value A, int64_t k) {
  // 32 floats at a time: vcvtneps2bf16 (round to nearest even, like the weights; a denormal becomes zero, which
  // tdpbf16ps makes of a denormal bf16 anyway), the pairs stored as 16 words; a masked load past k.
  Type f32 = b.getF32Type();
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  Value rows = b.create<memref::DimOp>(loc, A, 0);
  Value padded = b.create<arith::MulIOp>(
      loc, b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, rows, cidx(kAmxRows - 1)), cidx(kAmxRows)),
      cidx(kAmxRows));
  Value pairs = b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic, amxInputPairs(k)}, f32),
                                          ValueRange{padded}, b.getI64IntegerAttr(64));
  auto vec = VectorType::get({16}, f32), wideVec = VectorType::get({32}, f32);
  auto bf16Wide = VectorType::get({32}, b.getBF16Type());
  Value zeroVec = b.create<arith::ConstantOp>(loc, vec, DenseElementsAttr::get(vec, 0.0f));
  Value wideZero = b.create<arith::ConstantOp>(loc, wideVec, DenseElementsAttr::get(wideVec, 0.0f));
  Value M = rows;
  OpBuilder::InsertionGuard guard(b);
  auto rowsLoop = b.create<scf::ForOp>(loc, cidx(0), padded, cidx(1));
  b.setInsertionPointToStart(rowsLoop.getBody());
  Value i = rowsLoop.getInductionVar();
  auto branch = b.create<scf::IfOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, i, M), true);
  b.setInsertionPointToStart(branch.thenBlock());
  auto convert = [&](Value c, Value mask) {
    Value x = mask ? Value(b.create<vector::MaskedLoadOp>(loc, wideVec, A, ValueRange{i, c}, mask, wideZero))
                   : Value(b.create<vector::LoadOp>(loc, wideVec, A, ValueRange{i, c}));
    Value words = b.create<vector::BitCastOp>(loc, vec, b.create<arith::TruncFOp>(loc, bf16Wide, x));
    b.create<vector::StoreOp>(loc, words, pairs, ValueRange{i, b.create<arith::DivUIOp>(loc, c, cidx(2))});
  };
  if (k >= 32) {
    auto chunks = b.create<scf::ForOp>(loc, cidx(0), cidx(k / 32 * 32), cidx(32));
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(chunks.getBody());
    convert(chunks.getInductionVar(), Value());
  }
  if (k % 32)
    convert(cidx(k / 32 * 32),
            b.create<vector::CreateMaskOp>(loc, VectorType::get({32}, b.getI1Type()), ValueRange{cidx(k % 32)}));
  b.setInsertionPointToStart(branch.elseBlock());
  auto zeros = b.create<scf::ForOp>(loc, cidx(0), cidx(amxInputPairs(k)), cidx(16));
  b.setInsertionPointToStart(zeros.getBody());
  b.create<vector::StoreOp>(loc, zeroVec, pairs, ValueRange{i, zeros.getInductionVar()});
  return pairs;
}

/// The AMX body of getOrCreateGemm (static depth, bf16 weights packed as for the 12 x 32 tile). AMX multiplies tiles
/// of up to 16 rows x 64 bytes: C[16 x 16 f32] += A[16 x 16 bf16 pairs] B[16 pairs x 16 f32 columns] is one tdpbf16ps
/// (16 pair-rows of depth, 32 k). A arrives rounded to bf16 pairs (emitRoundToPairs, once per lm op before the threads
/// split the panels; zero past the depth and past M's last 32-row tile); for each block of up to 1 MB of its rows,
/// every 32-column slice of the packed
/// weight (its pair-row kv is 32 words, 128 bytes: the 16-column B tiles are its two halves at a stride of 128 bytes)
/// passes over the block's 32-row tiles: four C tiles of 16 x 16 starting from the bias, two A and two B tiles per 16
/// pair-rows. LLVM cannot carry AMX tiles around a loop (its x86_amx values do not pass through phis), so the steps are
/// straight-line code up to kStraight of them (K <= 4096); a deeper K passes the tiles through memory (`Cs`) every
/// kUnroll steps. A whole tile is stored straight into C; a partial one (rows past M, columns past N) through Cs with
/// masked stores. A depth that is not a multiple of 32 ends with a step whose B tile comes from a zero-padded copy of
/// the slice's last pair-rows (`Bs`), A being zero there. Every C element is one sequence of tile products over k in
/// order, so results do not depend on how M or the panels are split (the thread count). Zeroing the accumulators
/// through memory first (tilestored, then tileloadd of the same lines) cost 45% of the FFN GEMM's time: they start in
/// registers.
static void emitAmxGemmBody(OpBuilder &b, Location loc, const GemmBody &op) {
  MLIRContext *ctx = b.getContext();
  const int64_t dyn = ShapedType::kDynamic, k = op.k;
  assert(k != dyn && !op.accumulate && "the AMX body takes a static depth");
  Type f32 = b.getF32Type();
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  constexpr int64_t kUnroll = 16, kStraight = 128, kTileRows = kAmxRows, kBlockBytes = 1 << 20, kMaxBlockRows = 512,
                    W = 32;
  const int64_t pairs = packedDepth(k, true), steps = pairs / 16, rem = pairs % 16;
  const int64_t totalSteps = steps + (rem ? 1 : 0), paddedPairs = amxInputPairs(k), groups = kPanel / W;
  assert(paddedPairs == totalSteps * 16);
  const int64_t blockRows = std::clamp(kBlockBytes / (4 * paddedPairs) / kTileRows * kTileRows, kTileRows, kMaxBlockRows);
  auto pairTile = VectorType::get({16, 32}, b.getBF16Type());
  auto accTile = VectorType::get({16, 16}, f32);
  auto vec = VectorType::get({16}, f32);
  Value zeroVec = b.create<arith::ConstantOp>(loc, vec, DenseElementsAttr::get(vec, 0.0f));
  Value M = b.create<memref::DimOp>(loc, op.A, 0);

  // The packed weight as rows of 32 words: slice q (panel p, group g) is rows [q * pairs, (q + 1) * pairs).
  auto meta = b.create<memref::ExtractStridedMetadataOp>(loc, op.P);
  Value sliceRows = b.create<arith::MulIOp>(loc, b.create<memref::DimOp>(loc, op.P, 0), cidx(groups));
  auto rowsType = MemRefType::get({dyn, W}, f32, StridedLayoutAttr::get(ctx, dyn, {W, 1}));
  Value Pv = b.create<memref::ReinterpretCastOp>(loc, rowsType, meta.getBaseBuffer(), meta.getOffset(),
                                                 ValueRange{sliceRows, cidx(W)}, ValueRange{cidx(W), cidx(1)});
  // op.A: A's rows as bf16 pairs (emitRoundToPairs: zero past the depth and past M up to a multiple of 32 rows).
  // Blocks of up to 1 MB of them (half the L2 of the AMX CPUs) stay in L2 while the whole weight streams past once.
  Value Cs = b.create<memref::AllocaOp>(loc, MemRefType::get({kTileRows, W}, f32));
  Value Bt = op.withBias ? Value(b.create<memref::AllocaOp>(loc, MemRefType::get({16, W}, f32))) : Value();
  Value Bs = rem ? Value(b.create<memref::AllocaOp>(loc, MemRefType::get({16, W}, f32))) : Value();
  if (rem) // rows [rem, 16) stay zero; each slice copies its last rem pair-rows into [0, rem)
    for (int64_t r = rem; r < 16; ++r)
      for (int64_t j = 0; j < W; j += 16)
        b.create<vector::StoreOp>(loc, zeroVec, Bs, ValueRange{cidx(r), cidx(j)});
  auto forLoop = [&](Value lo, Value hi, int64_t step, auto body) {
    auto loop = b.create<scf::ForOp>(loc, lo, hi, cidx(step));
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    body(loop.getInductionVar());
  };
  const int64_t cOffsets[4][2] = {{0, 0}, {0, 16}, {16, 0}, {16, 16}};

  forLoop(cidx(0), M, blockRows, [&](Value mb) {
    Value Mb = b.create<arith::MinSIOp>(loc, b.create<arith::SubIOp>(loc, M, mb), cidx(blockRows));
    Value tiles = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, Mb, cidx(kTileRows - 1)), cidx(kTileRows));
    forLoop(op.pBegin, op.pEnd, 1, [&](Value p) {
      forLoop(cidx(0), cidx(groups), 1, [&](Value g) {
        Value q = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(groups)), g);
        Value slice = b.create<arith::MulIOp>(loc, q, cidx(pairs));
        for (int64_t r = 0; r < rem; ++r)
          for (int64_t j = 0; j < W; j += 16) {
            Value row = b.create<arith::AddIOp>(loc, slice, cidx(steps * 16 + r));
            b.create<vector::StoreOp>(loc, b.create<vector::LoadOp>(loc, vec, Pv, ValueRange{row, cidx(j)}), Bs,
                                      ValueRange{cidx(r), cidx(j)});
          }
        // The slice's columns: W past N masked; the C tiles start from the bias (Bt: 16 rows of it).
        Value g0 = b.create<arith::MulIOp>(loc, g, cidx(W));
        Value colW = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, cidx(kPanel)), g0);
        Value colC = b.create<arith::AddIOp>(
            loc, b.create<arith::MulIOp>(loc, b.create<arith::SubIOp>(loc, p, op.cBase), cidx(kPanel)), g0);
        Value masks[2];
        for (int64_t j = 0; j < 2; ++j)
          masks[j] = b.create<vector::CreateMaskOp>(
              loc, VectorType::get({16}, b.getI1Type()),
              ValueRange{b.create<arith::SubIOp>(loc, op.N, b.create<arith::AddIOp>(loc, colW, cidx(16 * j)))});
        if (op.withBias)
          for (int64_t j = 0; j < 2; ++j) {
            Value biasVec = b.create<vector::MaskedLoadOp>(
                loc, vec, op.bias, ValueRange{b.create<arith::AddIOp>(loc, colW, cidx(16 * j))}, masks[j], zeroVec);
            for (int64_t r = 0; r < 16; ++r)
              b.create<vector::StoreOp>(loc, biasVec, Bt, ValueRange{cidx(r), cidx(16 * j)});
          }
        Value wholeSlice = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sle,
                                                   b.create<arith::AddIOp>(loc, colW, cidx(W)), op.N);
        forLoop(cidx(0), tiles, 1, [&](Value t) {
          Value m0 = b.create<arith::MulIOp>(loc, t, cidx(kTileRows)); // in the block
          Value row0 = b.create<arith::AddIOp>(loc, mb, m0);             // in A and C
          // `count` steps from pair-row `first`: the last, when `padded`, reads B from Bs.
          auto run = [&](SmallVector<Value> acc, Value first, int64_t count, bool padded) {
            for (int64_t s = 0; s < count; ++s) {
              Value kv = b.create<arith::AddIOp>(loc, first, cidx(16 * s));
              bool fromBs = padded && s + 1 == count;
              Value a[2], w[2];
              for (int64_t h = 0; h < 2; ++h) {
                a[h] = b.create<amx::TileLoadOp>(loc, pairTile, op.A,
                                                 ValueRange{b.create<arith::AddIOp>(loc, row0, cidx(16 * h)), kv});
                w[h] = fromBs ? b.create<amx::TileLoadOp>(loc, pairTile, Bs, ValueRange{cidx(0), cidx(16 * h)})
                              : b.create<amx::TileLoadOp>(loc, pairTile, Pv,
                                                          ValueRange{b.create<arith::AddIOp>(loc, slice, kv), cidx(16 * h)});
              }
              for (int64_t c = 0; c < 4; ++c)
                acc[c] = b.create<amx::TileMulFOp>(loc, accTile, a[c / 2], w[c % 2], acc[c]);
            }
            return acc;
          };
          auto store = [&](ArrayRef<Value> acc, Value base, Value row0, Value col0) {
            for (int64_t c = 0; c < 4; ++c)
              b.create<amx::TileStoreOp>(loc, base,
                                         ValueRange{b.create<arith::AddIOp>(loc, row0, cidx(cOffsets[c][0])),
                                                    b.create<arith::AddIOp>(loc, col0, cidx(cOffsets[c][1]))},
                                         acc[c]);
          };
          auto load = [&](Value base) {
            SmallVector<Value> acc;
            for (auto [i, j] : cOffsets)
              acc.push_back(b.create<amx::TileLoadOp>(loc, accTile, base, ValueRange{cidx(i), cidx(j)}));
            return acc;
          };
          SmallVector<Value> acc;
          if (op.withBias) {
            for (int64_t c = 0; c < 4; ++c)
              acc.push_back(b.create<amx::TileLoadOp>(loc, accTile, Bt, ValueRange{cidx(0), cidx(cOffsets[c][1])}));
          } else {
            // One tilezero per accumulator: one zero tile used four times became three copies through the stack
            // (tilestored, then tileloadd of the same lines, which stalls).
            for (int64_t c = 0; c < 4; ++c)
              acc.push_back(b.create<amx::TileZeroOp>(loc, accTile));
          }
          // Up to kStraight steps in straight-line code (the tiles stay in registers); a deeper K in chunks of
          // kUnroll steps with the tiles in Cs between them.
          if (totalSteps <= kStraight) {
            acc = run(acc, cidx(0), totalSteps, rem != 0);
          } else {
            acc = run(acc, cidx(0), kUnroll, false);
            store(acc, Cs, cidx(0), cidx(0));
            const int64_t chunked = (steps - kUnroll) / kUnroll * kUnroll;
            forLoop(cidx(16 * kUnroll), cidx(16 * (kUnroll + chunked)), 16 * kUnroll,
                    [&](Value kv) { store(run(load(Cs), kv, kUnroll, false), Cs, cidx(0), cidx(0)); });
            acc = load(Cs);
            if (int64_t tail = steps - kUnroll - chunked + (rem ? 1 : 0))
              acc = run(acc, cidx(16 * (kUnroll + chunked)), tail, rem != 0);
          }
          // A whole 32 x 32 tile inside C goes there straight; a partial one through Cs, rows < M and columns < N.
          Value rowsHere = b.create<arith::MinSIOp>(loc, b.create<arith::SubIOp>(loc, Mb, m0), cidx(kTileRows));
          Value whole = b.create<arith::AndIOp>(
              loc, wholeSlice, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, rowsHere, cidx(kTileRows)));
          auto branch = b.create<scf::IfOp>(loc, whole, /*withElse=*/true);
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPointToStart(branch.thenBlock());
          store(acc, op.C, row0, colC);
          b.setInsertionPointToStart(branch.elseBlock());
          store(acc, Cs, cidx(0), cidx(0));
          for (int64_t j = 0; j < 2; ++j) {
            Value outCol = b.create<arith::AddIOp>(loc, colC, cidx(16 * j));
            forLoop(cidx(0), rowsHere, 1, [&](Value i) {
              Value v = b.create<vector::LoadOp>(loc, vec, Cs, ValueRange{i, cidx(16 * j)});
              b.create<vector::MaskedStoreOp>(loc, op.C, ValueRange{b.create<arith::AddIOp>(loc, row0, i), outCol},
                                              masks[j], v);
            });
          }
        });
      });
    });
  });
}

/// A private function `name` of `inputs` -> () at the end of `module`, `b` at the start of its entry block.
static func::FuncOp newPrivateFunction(OpBuilder &b, ModuleOp module, StringRef name, TypeRange inputs) {
  b.setInsertionPointToEnd(module.getBody());
  auto fn = b.create<func::FuncOp>(b.getUnknownLoc(), name, b.getFunctionType(inputs, {}));
  fn.setPrivate();
  b.setInsertionPointToStart(fn.addEntryBlock());
  return fn;
}

func::FuncOp getOrCreateGemm(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                             StringRef activation) {
  assert(kPanel % tile.cols() == 0 && "a tile's columns divide the panel");
  const bool amx = tile.weights == GemmTile::Weights::Bf16Amx;
  assert((activation.empty() || !amx) && "the AMX kernel stores its tiles without an epilogue");
  std::string name = gemmName("lm_gemm_", n, k, withBias, tile, activation);
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Location loc = b.getUnknownLoc();
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type(), index = b.getIndexType();
  auto aType = MemRefType::get({dyn, amx ? amxInputPairs(k) : k}, f32);
  auto pType = MemRefType::get({dyn, kPanel}, f32, StridedLayoutAttr::get(ctx, dyn, {kPanel, 1}));
  auto biasType = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, dyn, {1}));
  auto cType = MemRefType::get({dyn, dyn}, f32);
  func::FuncOp fn = newPrivateFunction(b, module, name, {aType, pType, biasType, cType, index, index, index});
  Block *entry = &fn.getBody().front();
  GemmBody op;
  op.A = entry->getArgument(0), op.P = entry->getArgument(1), op.bias = entry->getArgument(2);
  op.C = entry->getArgument(3), op.pBegin = entry->getArgument(4), op.pEnd = entry->getArgument(5);
  op.cBase = entry->getArgument(6);
  op.n = n, op.k = k, op.withBias = withBias, op.activation = activation;
  op.N = b.create<arith::ConstantIndexOp>(loc, n);
  // Software prefetch pays off when the packed weight does not fit in the L2 cache.
  op.prefetch = packedRows(n, k, tile.bf16()) * kPanel * 4 > (int64_t(1) << 20);
  if (amx)
    emitAmxGemmBody(b, loc, op);
  else
    emitGemmBody(b, loc, op, tile);
  b.create<func::ReturnOp>(loc);
  return fn;
}

func::FuncOp getOrCreateTrainGemm(ModuleOp module, GemmTile tile) {
  tile.weights = GemmTile::Weights::F32;
  std::string name = "lm_train_gemm_" + tile.name();
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Location loc = b.getUnknownLoc();
  int64_t dyn = ShapedType::kDynamic;
  Type i64 = b.getI64Type(), f32 = b.getF32Type();
  auto ptr = LLVM::LLVMPointerType::get(ctx);
  // (A, lda, M, K, P, C, ldc, N, pBegin, pEnd, accumulate): lmrt.h's lm_rt_gemm_fn.
  func::FuncOp fn = newPrivateFunction(b, module, name, {ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64});
  Block *entry = &fn.getBody().front();
  auto arg = [&](int i) { return entry->getArgument(i); };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
  auto address = [&](Value p) -> Value { return b.create<LLVM::PtrToIntOp>(loc, i64, p); };
  auto toIndex = [&](Value v) -> Value { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), v); };
  auto rowMajor = MemRefType::get({dyn, dyn}, f32, StridedLayoutAttr::get(ctx, 0, {dyn, 1}));
  Value K = arg(3);
  Value panels = b.create<LLVM::UDivOp>(loc, i64, b.create<LLVM::AddOp>(loc, i64, arg(7), c64(kPanel - 1)), c64(kPanel));
  Value pRows = b.create<LLVM::MulOp>(loc, i64, panels, K);
  GemmBody op;
  op.A = memrefAt(b, loc, address(arg(0)), {arg(2), K}, {arg(1), c64(1)}, rowMajor);
  op.P = memrefAt(b, loc, address(arg(4)), {pRows, c64(kPanel)}, {c64(kPanel), c64(1)},
                  MemRefType::get({dyn, kPanel}, f32, StridedLayoutAttr::get(ctx, dyn, {kPanel, 1})));
  op.C = memrefAt(b, loc, address(arg(5)), {arg(2), arg(7)}, {arg(6), c64(1)}, rowMajor);
  op.pBegin = toIndex(arg(8)), op.pEnd = toIndex(arg(9));
  op.cBase = b.create<arith::ConstantIndexOp>(loc, 0);
  op.N = toIndex(arg(7)), op.K = toIndex(K);
  op.accumulate = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, arg(10), c64(0));
  op.n = dyn, op.k = dyn, op.withBias = false, op.prefetch = true;
  emitGemmBody(b, loc, op, tile);
  b.create<func::ReturnOp>(loc);
  return fn;
}

func::FuncOp getOrCreateGemmTask(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                 StringRef activation) {
  std::string name = gemmName("lm_gemm_task_", n, k, withBias, tile, activation);
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  func::FuncOp gemm = getOrCreateGemm(module, n, k, withBias, tile, activation);
  OpBuilder b(module.getContext());
  func::FuncOp fn = createTask(b, module, name);
  Block *entry = &fn.getBody().front();
  b.setInsertionPointToStart(entry);
  Location loc = b.getUnknownLoc();
  Type i64 = b.getI64Type();
  auto slot = [&](int64_t i) { return taskField(b, loc, entry->getArgument(0), i); };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
  auto descriptor = [&](Value address, ArrayRef<Value> sizes, ArrayRef<Value> strides, Type type) {
    return memrefAt(b, loc, address, sizes, strides, llvm::cast<MemRefType>(type));
  };
  auto types = gemm.getArgumentTypes();
  Value M = slot(1), cols = slot(6);
  const int64_t aCols = llvm::cast<MemRefType>(types[0]).getDimSize(1); // k, or the AMX kernel's pairs
  Value A = descriptor(slot(0), {M, c64(aCols)}, {c64(aCols), c64(1)}, types[0]);
  Value P = descriptor(slot(2), {slot(3), c64(kPanel)}, {c64(kPanel), c64(1)}, types[1]);
  Value bias = descriptor(slot(4), {c64(n)}, {c64(1)}, types[2]);
  Value C = descriptor(slot(5), {M, cols}, {cols, c64(1)}, types[3]);
  // Pieces [begin, end) count from panel slot(7), which is C's column 0.
  Value first = slot(7);
  Value begin = b.create<arith::IndexCastOp>(loc, b.getIndexType(),
                                             b.create<LLVM::AddOp>(loc, i64, first, entry->getArgument(1)));
  Value end = b.create<arith::IndexCastOp>(loc, b.getIndexType(),
                                           b.create<LLVM::AddOp>(loc, i64, first, entry->getArgument(2)));
  Value base = b.create<arith::IndexCastOp>(loc, b.getIndexType(), first);
  b.create<func::CallOp>(loc, gemm, ValueRange{A, P, bias, C, begin, end, base});
  b.create<func::ReturnOp>(loc);
  return fn;
}

OwningOpRef<ModuleOp> buildGemmModule(MLIRContext &context, const std::vector<std::pair<int64_t, int64_t>> &shapes,
                                      const std::vector<GemmTile> &tiles) {
  context.loadDialect<amx::AMXDialect, arith::ArithDialect, func::FuncDialect, memref::MemRefDialect, scf::SCFDialect,
                      vector::VectorDialect, LLVM::LLVMDialect>();
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type();
  auto pDyn = MemRefType::get({dyn, kPanel}, f32);
  for (auto [n, k] : shapes)
    for (GemmTile tile : tiles) {
      std::string suffix = std::to_string(n) + "x" + std::to_string(k) + "_" + tile.name();
      b.setInsertionPointToEnd(module->getBody());
      auto pack = b.create<func::FuncOp>(loc, "lm_bench_pack_" + suffix,
                                         b.getFunctionType({MemRefType::get({n, k}, f32), pDyn}, {}));
      pack->setAttr("llvm.emit_c_interface", b.getUnitAttr());
      b.setInsertionPointToStart(pack.addEntryBlock());
      emitPack(b, loc, pack.getArgument(0), pack.getArgument(1), n, k, tile);
      b.create<func::ReturnOp>(loc);
      for (bool withBias : {false, true}) {
        if (withBias && !tile.bf16())
          continue; // (the fp32 kernel's bias epilogue is the widening kernel's, which GemmBf16 checks)
        func::FuncOp gemm = getOrCreateGemm(*module, n, k, withBias, tile);
        b.setInsertionPointToEnd(module->getBody());
        SmallVector<Type> inputs = {MemRefType::get({dyn, k}, f32), pDyn};
        if (withBias)
          inputs.push_back(MemRefType::get({n}, f32));
        inputs.push_back(MemRefType::get({dyn, dyn}, f32));
        auto run = b.create<func::FuncOp>(loc, (withBias ? "lm_bench_gemm_bias_" : "lm_bench_gemm_") + suffix,
                                          b.getFunctionType(inputs, {}));
        run->setAttr("llvm.emit_c_interface", b.getUnitAttr());
        b.setInsertionPointToStart(run.addEntryBlock());
        auto pType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[1]);
        auto biasType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[2]);
        Value p = b.create<memref::CastOp>(loc, pType, run.getArgument(1));
        Value bias = b.create<memref::CastOp>(
            loc, biasType,
            withBias ? run.getArgument(2) : Value(b.create<memref::AllocaOp>(loc, MemRefType::get({1}, f32))));
        Value zero = b.create<arith::ConstantIndexOp>(loc, 0);
        Value panels = b.create<arith::ConstantIndexOp>(loc, (n + kPanel - 1) / kPanel);
        Value a = run.getArgument(0), pairs;
        if (tile.weights == GemmTile::Weights::Bf16Amx) { // as Loops::gemmInput: A rounded to pairs first
          Value M = b.create<memref::DimOp>(loc, a, 0);
          auto pairsType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[0]);
          pairs = emitRoundToPairs(b, loc, a, k);
          const int64_t width = pairsType.getDimSize(1);
          auto c = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
          a = b.create<memref::ReinterpretCastOp>(loc, pairsType, pairs, c(0), ValueRange{M, c(width)},
                                                  ValueRange{c(width), c(1)});
        }
        b.create<func::CallOp>(loc, gemm, ValueRange{a, p, bias, run.getArguments().back(), zero, panels, zero});
        if (pairs)
          b.create<memref::DeallocOp>(loc, pairs);
        b.create<func::ReturnOp>(loc);
      }
    }
  for (GemmTile tile : tiles)
    if (!tile.bf16())
      getOrCreateTrainGemm(*module, tile).setPublic();
  return module;
}

namespace {

/// y[rows, out] = x[rows, in] W[out, in]^T + bias: the generated GEMM over the load-time packed weight
/// (split over the runtime's threads by panels), or the runtime's Eigen GEMM (--gemm=eigen). An `activation` is
/// the generated GEMM's epilogue, or a pass over y in place where the product has none (AMX, Eigen).
struct LinearLowering : LmLowering<lm::LinearOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LinearOp l, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    auto wt = L.typeOf(l.getWeight());
    int64_t n = wt.getDimSize(0), k = wt.getDimSize(1);
    Value out = L.alloc(l.getType());
    auto sizes = L.sizes(L.typeOf(l.getInput()));
    Value rows = L.idx(1); // every dim but the features
    for (size_t i = 0; i + 1 < sizes.size(); ++i)
      rows = b.create<arith::MulIOp>(loc, rows, sizes[i]);
    const StringRef activation = l.getActivation().value_or("");
    if (L.isPacked(l.getWeight())) {
      Loops::GemmInput input = L.gemmInput(L.address(L.in(l.getInput())), rows, k);
      const StringRef inKernel = kernelActivation(L.context.tile, activation);
      L.parallelGemm(l.getWeight(), n, k, input.address, rows, l.getBias(), L.address(out), L.i64c(n), L.idx(0),
                     L.idx((n + kPanel - 1) / kPanel), inKernel);
      L.release(input);
      if (inKernel != activation)
        emitActivationInPlace(L, activation, out);
      return L.set(l, out);
    }
    Value m = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
    Value bias = l.getBias() ? L.pointer(L.in(l.getBias()))
                             : Value(b.create<LLVM::ZeroOp>(loc, LLVM::LLVMPointerType::get(b.getContext())));
    b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                           ValueRange{m, L.i64c(n), L.i64c(k), L.pointer(L.in(l.getInput())), L.i64c(k),
                                      L.pointer(L.in(l.getWeight())), L.i64c(k), bias, L.pointer(out), L.i64c(n)});
    if (!activation.empty())
      emitActivationInPlace(L, activation, out);
    return L.set(l, out);
  }
};

} // namespace

void populateGemmPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<LinearLowering>(converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
