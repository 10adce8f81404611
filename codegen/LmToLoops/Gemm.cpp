//===- Gemm.cpp - Generated GEMM microkernels over load-time packed weights -===//
//
// The weights of every linear layer are constants: the runtime packs them once at load time into panels of 64 output
// features, zero-padded, each panel stored as contiguous K x c slices of the tile's width c, so the kernel streams B
// sequentially and never re-packs. The microkernel keeps a tile of C in vector registers across a chunk of the K loop
// (scf.for iter_args), sized to the target: on AVX-512, 12 x 32 in 24 vector<16xf32>, 2 loads of B and 12 broadcasts of
// A per k step for 24 FMAs; on AVX2, 6 x 16 in 12 vector<8xf32>, 2 loads and 6 broadcasts for 12 FMAs (the classic
// 16-register tile). Rows come in blocks that keep A in L2; fp32 depths over 768 (bf16 over 512 pairs) are cut into
// chunks of 128 whose slice of B stays in L1 across the block's tiles; a block is cut into tiles of balanced heights;
// the last partial panel is written with masked stores. Every output element is one FMA chain over k in order,
// whatever the tile, block or chunk, so the choice never changes a result. DESIGN.md records the recipe.
// This file: the load-time packing and the fp32 / bf16 bodies; the AMX body is GemmAmx.cpp's, the GEMM functions
// and lm.linear's lowering Linear.cpp's.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/GemmBody.h"
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

/// A 16 x 16 block in 16 vectors (rows) -> its transpose (rows = the block's columns): log2(16) stages, each swapping
/// the off-diagonal h x h blocks of every 2h x 2h block (h = 8, 4, 2, 1) with one two-vector shuffle per row.
static SmallVector<Value> transpose16(OpBuilder &b, Location loc, SmallVector<Value> rows) {
  for (int64_t h = 8; h >= 1; h /= 2) {
    SmallVector<int64_t> low, high; // row i (bit h clear) keeps its low columns, row i + h its high ones
    for (int64_t c = 0; c < 16; ++c) {
      low.push_back(c & h ? 16 + c - h : c);
      high.push_back(c & h ? 16 + c : c + h);
    }
    for (int64_t i = 0; i < 16; ++i)
      if (!(i & h)) {
        Value top = rows[i], bottom = rows[i + h];
        rows[i] = b.create<vector::ShuffleOp>(loc, top, bottom, low);
        rows[i + h] = b.create<vector::ShuffleOp>(loc, top, bottom, high);
      }
  }
  return rows;
}

void emitPack(OpBuilder &b, Location loc, Value weight, Value packed, int64_t n, int64_t k, GemmTile tile) {
  // Column j of panel p (row p*64 + j of W) becomes the stride-c column jj = j % c of slice g = j / c: flat(P)[p*K*64 +
  // g*K*c + kv*c + jj] for kv < K (Gemm.h), zero past N. The loops run in the packed buffer's order (slice, kv): 16
  // words of 16 rows of W at a time, transposed in registers, then stored as 16 whole vectors; the last K mod 16
  // words of each row one by one. In W's row order (one word at a time, each row's words c apart) the packed lines
  // left L1 before they were full: packing the base models' 25M weights took 67-113 ms on a Xeon, now 14-18 ms (the
  // trainer re-packs every weight after each step; bench/results/2026-12-04-pack.md).
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  const bool bf16 = tile.bf16();
  const int64_t kk = packedDepth(k, bf16), c = tile.cols(), vectorWords = bf16 ? k / 32 * 16 : kk / 16 * 16;
  Value flat = b.create<memref::CollapseShapeOp>(loc, packed, ArrayRef<ReassociationIndices>{{0, 1}});
  Value fzero = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0));
  auto vec = VectorType::get({16}, b.getF32Type());
  Value zeroVec = b.create<vector::BroadcastOp>(loc, vec, fzero);
  // The vectors are stored nontemporally (the packed copy is not read back during the pack; without the line reads
  // of ordinary stores the pack took half the time) when P starts 64-byte aligned, as the runtime's weight buffer
  // does: every vector is then at a multiple of 16 words from its start.
  auto metadata = b.create<memref::ExtractStridedMetadataOp>(loc, flat);
  Value start = b.create<arith::AddIOp>(
      loc, b.create<memref::ExtractAlignedPointerAsIndexOp>(loc, flat),
      b.create<arith::MulIOp>(loc, metadata.getOffset(), cidx(4)));
  Value aligned = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                          b.create<arith::RemUIOp>(loc, start, cidx(64)), cidx(0));
  OpBuilder::InsertionGuard guard(b);
  auto ls = b.create<scf::ForOp>(loc, cidx(0), cidx((n + kPanel - 1) / kPanel * (kPanel / c)), cidx(1));
  b.setInsertionPointToStart(ls.getBody());
  Value q = ls.getInductionVar(); // slice q = p * (64 / c) + g: rows q*c.. of W, words q*K*c.. of P
  Value firstRow = b.create<arith::MulIOp>(loc, q, cidx(c));
  Value sliceBase = b.create<arith::MulIOp>(loc, q, cidx(kk * c));
  // Row jj of the slice: whether W has it, and a row to read in its place (rows past N are zeros).
  auto rowOf = [&](int64_t jj) {
    Value row = b.create<arith::AddIOp>(loc, firstRow, cidx(jj));
    Value inside = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, row, cidx(n));
    return std::pair<Value, Value>{inside, b.create<arith::MinUIOp>(loc, row, cidx(n - 1))};
  };
  if (vectorWords > 0) {
    auto lb = b.create<scf::ForOp>(loc, cidx(0), cidx(vectorWords), cidx(16));
    OpBuilder::InsertionGuard inner(b);
    b.setInsertionPointToStart(lb.getBody());
    Value kv0 = lb.getInductionVar();
    for (int64_t h = 0; h < c / 16; ++h) {
      SmallVector<Value> rows;
      for (int64_t r = 0; r < 16; ++r) {
        auto [inside, safe] = rowOf(16 * h + r);
        Value words =
            bf16 ? bf16PairWords(b, loc,
                                 b.create<vector::LoadOp>(loc, VectorType::get({32}, b.getF32Type()), weight,
                                                          ValueRange{safe, b.create<arith::MulIOp>(loc, kv0, cidx(2))}))
                 : Value(b.create<vector::LoadOp>(loc, vec, weight, ValueRange{safe, kv0}));
        rows.push_back(b.create<arith::SelectOp>(loc, inside, words, zeroVec));
      }
      SmallVector<Value> cols = transpose16(b, loc, rows);
      auto stores = b.create<scf::IfOp>(loc, aligned, /*withElseRegion=*/true);
      for (bool nontemporal : {true, false}) {
        OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(nontemporal ? stores.thenBlock() : stores.elseBlock());
        for (int64_t i = 0; i < 16; ++i) {
          Value kv = b.create<arith::AddIOp>(loc, kv0, cidx(i));
          Value at = b.create<arith::AddIOp>(
              loc, b.create<arith::AddIOp>(loc, sliceBase, b.create<arith::MulIOp>(loc, kv, cidx(c))), cidx(16 * h));
          b.create<vector::StoreOp>(loc, cols[i], flat, ValueRange{at}, nontemporal);
        }
      }
    }
  }
  auto lk = b.create<scf::ForOp>(loc, cidx(vectorWords), cidx(kk), cidx(1));
  b.setInsertionPointToStart(lk.getBody());
  Value kv = lk.getInductionVar();
  Value at = b.create<arith::AddIOp>(loc, sliceBase, b.create<arith::MulIOp>(loc, kv, cidx(c)));
  for (int64_t jj = 0; jj < c; ++jj) {
    auto [inside, safe] = rowOf(jj);
    Value word = bf16 ? loadBf16Pair(b, loc, weight, safe, kv, k)
                      : Value(b.create<memref::LoadOp>(loc, weight, ValueRange{safe, kv}));
    b.create<memref::StoreOp>(loc, b.create<arith::SelectOp>(loc, inside, word, fzero), flat,
                              ValueRange{b.create<arith::AddIOp>(loc, at, cidx(jj))});
  }
}

std::string GemmTile::name() const {
  const char *format = weights == Weights::Bf16Dot    ? "_bf16dot"
                       : weights == Weights::Bf16Amx  ? "_bf16amx"
                       : weights == Weights::Bf16Widen ? "_bf16"
                                                       : "";
  return std::to_string(rows) + "x" + std::to_string(cols()) + format;
}

void emitGemmBody(OpBuilder &b, Location loc, const GemmBody &op, GemmTile tile) {
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
  // faster unchunked), and so does an fp32 slice of depth 768 (BERT-base's), in blocks of 256 KB of A (84 rows):
  // 1.02-1.06x over 128-deep chunks on a Xeon (gemm_ab --cold, 100-1600 rows), BERT-base PLL n 20-40 1.02-1.03x
  // (bench/results/2026-12-05-gemm-768.md). The rows of a block (about kBlockBytes of A, all of K) stay in L2
  // across the slices; a larger block streams the weight from memory fewer times
  // (bench/results/2026-11-28-chunks.md).
  constexpr int64_t kChunk = 128, kMaxUnchunked = 512, kMaxUnchunkedF32 = 768, kBlockBytes = 512 << 10,
                    kMaxBlockRows = 256;
  const bool deepF32 = !dynamicK && !bf16 && k > kMaxUnchunked; // unchunked to kMaxUnchunkedF32
  const bool chunked = dynamicK || packedDepth(k, bf16) > (bf16 ? kMaxUnchunked : kMaxUnchunkedF32);
  // The bf16 dot kernel keeps its block of A as pairs on the stack: 128 KB of A (a 64 KB buffer) there. Unchunked
  // depths keep 128 KB blocks whatever the weight: blocks of up to 512 KB for a weight streamed from beyond L2 and
  // A of at most two such blocks (2026-11-29) were 1.00-1.08x slower in one-process A/B runs of the T-TA, uniLM and
  // biLM libraries on the same Xeon on 2026-12-05 (bench/results/2026-12-05-gemm-blocks.md).
  // Unchunked depths over 512 take blocks of 256 KB, or one block when all of A fits in kBlockBytes (below).
  const int64_t blockBytes = chunked && !dot ? kBlockBytes : (deepF32 ? 256 << 10 : 128 << 10),
                maxRows = std::max(R, kMaxBlockRows / R * R);
  // Bf16Dot: the block's rows of A as bf16 pairs (the activations rounded like the weights), [block row, pair].
  const int64_t staticBlockRows = dynamicK ? maxRows : std::clamp(blockBytes / (4 * k) / R * R, R, maxRows);
  // A run-time depth (the training GEMM) of kMaxUnchunked or less takes what a fixed one would: one chunk, and blocks
  // of 128 KB of A unless all of A fits in two blocks of kBlockBytes (below). The training GEMM's shallow shapes
  // (1016 x 512 x 512, the loss head's) ran 1.1-1.15x faster so than in 128-deep chunks of 512 KB blocks on a Xeon
  // with two FMA ports (gemm_ab compare --train); deeper ones keep both.
  Value shallow = dynamicK ? Value(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sle, depth, cidx(kMaxUnchunked)))
                           : Value();
  Value blockRows = cidx(staticBlockRows);
  if (dynamicK) {
    Value aFloats = b.create<arith::MulIOp>(loc, M, depth);
    Value wide = b.create<arith::OrIOp>(
        loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sgt, depth, cidx(kMaxUnchunked)),
        b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ule, aFloats, cidx(2 * kBlockBytes / 4)));
    Value blockFloats = b.create<arith::SelectOp>(loc, wide, cidx(kBlockBytes / 4), cidx((128 << 10) / 4));
    Value rows = b.create<arith::MulIOp>(
        loc,
        b.create<arith::DivUIOp>(loc, b.create<arith::DivUIOp>(loc, blockFloats, b.create<arith::MaxSIOp>(loc, depth, cidx(1))),
                                 cidx(R)),
        cidx(R));
    blockRows = b.create<arith::MinSIOp>(loc, cidx(maxRows), b.create<arith::MaxSIOp>(loc, cidx(R), rows));
  }
  if (deepF32) {
    // Depth 768 at 400 and 1600 rows: 256 KB blocks 1.05-1.08x faster than 128-deep chunks, 512 KB ones level with
    // 256 KB; at 100 rows (BERT-base PLL n = 10) 256 KB blocks (two) were 0.98x the chunks, one block 1.04-1.09x.
    Value fits = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ule, b.create<arith::MulIOp>(loc, M, cidx(k)),
                                         cidx(kBlockBytes / 4));
    blockRows = b.create<arith::SelectOp>(loc, fits, cidx(std::clamp(kBlockBytes / (4 * k) / R * R, R, maxRows)),
                                          blockRows);
  }
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
  // op.copyA (the training GEMM's run-time depth, and its static depths whose rows overflow the L1 sets they share)
  // copies each block of A, once for every column slice, into `copies`: parts of kCopyDepth columns, a part's rows
  // (blockRows of them) kCopyRow floats apart, so that a tile's rows are constant offsets from one address as in a
  // fixed-depth body, in distinct L1 sets. Read at the run-time stride (the weight gradients: depth = the batch's
  // rows, A = dy^T at a padded stride), x86-64 has too few general registers for the tile's row addresses and the
  // prefetch's terms: LLVM spilled them (and vector temporaries) in the k loop, and the body ran at 0.36-0.48x the
  // fixed-depth one on AVX2 (gemm_ab compare --train, build --train-any; 128 rows, depth 147-2048). Read 8 KB apart
  // (depth 2048, the 12-row tile, an 8-way L1) the fixed-depth body ran at 0.75x the copying one (Linear.cpp). A
  // chunk (kChunk, or a shallow depth of at most kMaxUnchunked) never spans two parts. The copy moves the same
  // floats: every result is unchanged.
  constexpr int64_t kCopyDepth = 512, kCopyRow = kCopyDepth + 16; // rows a line apart from 2 KB: distinct L1 sets
  static_assert(kCopyDepth % kChunk == 0 && kCopyDepth >= kMaxUnchunked);
  const bool copyA = op.copyA;
  assert((!copyA || (tile.weights == GemmTile::Weights::F32 && (dynamicK || chunked || k <= kMaxUnchunked))) &&
         "A is copied for the fp32 kernel, in parts no chunk spans");
  Value copies; // [parts * blockRows, kCopyRow], allocated below once blockRows is final
  // A k row of a slice is W floats: `lines` cache lines.
  const int64_t lines = std::max<int64_t>(1, W / 16);
  // The prefetch of one tile (below: tilesOver): at k step kv, line ((kv + row) * scale) >> 16 of the region starting
  // at float `start`, or, when `fewTiles`, two lines of row kv from float `few` on.
  struct Ahead {
    Value start, row, scale, few;
  };
  // One r x W tile at rows [m0, m0 + r) (row m0 - mb of the block) of the column slice starting at `slice` (panel p,
  // group g).
  auto tileAt = [&](int64_t r, Value m0, Value mb, Value p, Value g, Value slice, const Ahead &ahead,
                    bool few, Value kBegin, Value kEnd, Value firstChunk, Value lastChunk) {
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
    // A run-time depth reads the block's copy of A (below: copyA): the part holding [kBegin, kEnd), every row a
    // constant offset from its start.
    Value copiedRow, copiedFrom;
    if (copyA) {
      Value part = b.create<arith::DivUIOp>(loc, kBegin, cidx(kCopyDepth));
      copiedFrom = b.create<arith::MulIOp>(loc, part, cidx(kCopyDepth));
      copiedRow = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, part, blockRows), blockRow);
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
        auto prefetchLine = [&](Value floatAt) {
          Value target = b.create<arith::MinSIOp>(loc, floatAt, lastFloat);
          b.create<memref::PrefetchOp>(loc, flatP, ValueRange{target},
                                       /*isWrite=*/false, /*localityHint=*/2,
                                       /*isDataCache=*/true);
        };
        if (few) {
          Value row = b.create<arith::AddIOp>(loc, ahead.few, kW);
          prefetchLine(row);
          if (lines > 1)
            prefetchLine(b.create<arith::AddIOp>(loc, row, cidx(16)));
        } else {
          Value line = b.create<arith::ShRUIOp>(
              loc, b.create<arith::MulIOp>(loc, b.create<arith::AddIOp>(loc, kv, ahead.row), ahead.scale), cidx(16));
          prefetchLine(b.create<arith::AddIOp>(loc, ahead.start, b.create<arith::MulIOp>(loc, line, cidx(16))));
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
          Value a = copyA ? b.create<memref::LoadOp>(loc, copies, ValueRange{b.create<arith::AddIOp>(loc, copiedRow, cidx(i)),
                                                                         b.create<arith::SubIOp>(loc, kv, copiedFrom)})
                          : b.create<memref::LoadOp>(loc, A, ValueRange{b.create<arith::AddIOp>(loc, m0, cidx(i)), kv});
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
  if (copyA) {
    Value parts = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, depth, cidx(kCopyDepth - 1)),
                                           cidx(kCopyDepth));
    copies = b.create<memref::AllocOp>(loc, MemRefType::get({dyn, kCopyRow}, f32),
                                       ValueRange{b.create<arith::MulIOp>(loc, parts, blockRows)},
                                       b.getI64IntegerAttr(64));
  }
  auto blocks = b.create<scf::ForOp>(loc, cidx(0), M, blockRows);
  if (copyA) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointAfter(blocks);
    b.create<memref::DeallocOp>(loc, copies);
  }
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(blocks.getBody());
    Value mb = blocks.getInductionVar();
    Value Mb = b.create<arith::MinSIOp>(loc, b.create<arith::SubIOp>(loc, M, mb), blockRows);
    if (copyA) { // the block's rows of A into their parts: L floats a step (a part is a multiple of L), the rest one by one
      auto rowsLoop = b.create<scf::ForOp>(loc, cidx(0), Mb, cidx(1));
      OpBuilder::InsertionGuard g2(b);
      b.setInsertionPointToStart(rowsLoop.getBody());
      Value i = rowsLoop.getInductionVar(), row = b.create<arith::AddIOp>(loc, mb, i);
      auto to = [&](Value kv) -> SmallVector<Value> {
        Value part = b.create<arith::DivUIOp>(loc, kv, cidx(kCopyDepth));
        return {b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, part, blockRows), i),
                b.create<arith::RemUIOp>(loc, kv, cidx(kCopyDepth))};
      };
      Value whole = b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, depth, cidx(L)), cidx(L));
      {
        auto steps = b.create<scf::ForOp>(loc, cidx(0), whole, cidx(L));
        OpBuilder::InsertionGuard g3(b);
        b.setInsertionPointToStart(steps.getBody());
        Value kv = steps.getInductionVar();
        b.create<vector::StoreOp>(loc, b.create<vector::LoadOp>(loc, vec, A, ValueRange{row, kv}), copies, to(kv));
      }
      auto rest = b.create<scf::ForOp>(loc, whole, depth, cidx(1));
      b.setInsertionPointToStart(rest.getBody());
      Value kv = rest.getInductionVar();
      b.create<memref::StoreOp>(loc, b.create<memref::LoadOp>(loc, A, ValueRange{row, kv}), copies, to(kv));
    }
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
    // The block's tiles over packed rows [kBegin, kEnd) of the slice.
    auto tilesOver = [&](Value kBegin, Value kEnd, Value firstChunk, Value lastChunk) {
      // While they pass over these rows the tiles prefetch the next ones (slices are contiguous: past the slice's
      // last chunk that is the next slice's first), kEnd - kBegin rows from row kEnd: `span` x `lines` lines, spread
      // evenly over the block's T x span k steps (tile t's step kv takes line (t span + kv - kBegin) lines / T, in
      // 16-bit fixed point). Each tile prefetching line t mod lines of every row (2026-11-25 to 12-06) asked for all
      // of the next slice in the block's first `lines` tiles; with the weight in memory those bursts stalled the
      // tiles: BERT-base's 100-row GEMMs ran 1.16-1.21x faster spread, 1.00-1.05x with the weight in the caches
      // (bench/results/2026-12-06-prefetch-spread.md).
      Value span, regionStart, scale;
      if (prefetch) {
        span = b.create<arith::SubIOp>(loc, kEnd, kBegin);
        regionStart = b.create<arith::AddIOp>(loc, slice, b.create<arith::MulIOp>(loc, kEnd, cidx(W)));
        scale = b.create<arith::DivUIOp>(loc, cidx(lines << 16), T);
      }
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
      // A block of at most lines / 2 tiles (the vocabulary projection of a short sentence) needs two or more lines a
      // step: tile t takes lines 2t and 2t + 1 (mod lines) of each row, as many lines as the old scheme gave it, and
      // kept its instructions: the spread's fixed-point line made the 10-row entries 4-7% slower (a second line a k
      // step for every tile made 20-row sentences 4-6% slower; one line a step left half of the lines to demand
      // misses).
      Ahead ahead;
      if (prefetch) {
        Value fewLine = b.create<arith::RemUIOp>(loc, b.create<arith::MulIOp>(loc, t, cidx(2)), cidx(lines));
        Value fewOffset = b.create<arith::MulIOp>(loc, fewLine, cidx(16));
        Value rowZero = b.create<arith::SubIOp>(loc, regionStart, b.create<arith::MulIOp>(loc, kBegin, cidx(W)));
        Value few = b.create<arith::AddIOp>(loc, rowZero, fewOffset);
        Value row = b.create<arith::SubIOp>(loc, b.create<arith::MulIOp>(loc, t, span), kBegin);
        ahead = {regionStart, row, scale, few};
      }
      auto tileOfHeight = [&](bool few) {
        for (int64_t r = R; r >= 1; --r) {
          Value isR = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, height, cidx(r));
          auto branch = b.create<scf::IfOp>(loc, isR, /*withElse=*/false);
          OpBuilder::InsertionGuard inner(b);
          b.setInsertionPointToStart(branch.thenBlock());
          tileAt(r, m0, mb, p, g, slice, ahead, few, kBegin, kEnd, firstChunk, lastChunk);
        }
      };
      if (!prefetch) {
        tileOfHeight(false);
        return;
      }
      // Each way of prefetching has loops of its own (a branch between the two in the k loop cost 1.5-2.5%).
      auto mode = b.create<scf::IfOp>(loc, fewTiles, /*withElse=*/true);
      for (bool few : {true, false}) {
        OpBuilder::InsertionGuard inner(b);
        b.setInsertionPointToStart(few ? mode.thenBlock() : mode.elseBlock());
        tileOfHeight(few);
      }
    };
    if (!chunked) {
      tilesOver(cidx(0), depth, Value(), Value());
    } else {
      // At least one chunk: a zero depth still writes C (zeros, the bias, or C's old values).
      Value some = b.create<arith::MaxSIOp>(loc, depth, cidx(1));
      Value chunk = dynamicK ? Value(b.create<arith::SelectOp>(loc, shallow, some, cidx(kChunk))) : cidx(kChunk);
      auto chunks = b.create<scf::ForOp>(loc, cidx(0), some, chunk);
      b.setInsertionPointToStart(chunks.getBody());
      Value kBegin = chunks.getInductionVar();
      Value kEnd = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, kBegin, chunk), depth);
      tilesOver(kBegin, kEnd, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, kBegin, cidx(0)),
                b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, kEnd, depth));
    }
  }
}

} // namespace lmcc::codegen
