//===- GemmAmx.cpp - The generated GEMM on AMX tiles --------------------------===//
//
// The inputs rounded to bf16 pairs and the AMX body of a generated GEMM (tdpbf16ps over load-time packed bf16
// weights), where the CPU has AMX-BF16.
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
/// order, so results do not depend on how M or the panels are split (the thread count). A weight over 1 MB is
/// prefetched into L2 a slice ahead by blocks of 16 tiles or more, two lines a step spread over the block. Zeroing the
/// accumulators through memory first (tilestored, then tileloadd of the same lines) cost 45% of the FFN GEMM's time:
/// they start in registers.
void emitAmxGemmBody(OpBuilder &b, Location loc, const GemmBody &op) {
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

  // A streamed weight (op.prefetch: over 1 MB) is prefetched into L2 one slice ahead, spread evenly over the block:
  // the next slice's 2 x pairs lines over its T tiles x totalSteps steps x kPrefetches slots (slot u takes line
  // u x scale >> 16, scale = 2 pairs / (T totalSteps kPrefetches) in 16-bit fixed point), as the vector body does;
  // past the last slice, clamped to the weight's last float. Only blocks of kPrefetchTiles tiles or more, where every
  // line gets a slot (so only depths whose blocks can hold 512 rows): prefetching every few lines in smaller blocks
  // made them 4-8% slower with the weight flushed (depths 2048 and 3072, 100 rows), as if the sparse requests got in
  // the way of the hardware's stream. With the weight flushed the 640-row vocabulary projection runs 1.32x faster,
  // T-TA scoring at batch 32 1.04-1.06x (bench/results/2026-12-06-amx-prefetch.md).
  constexpr int64_t kPrefetches = 2, kPrefetchTiles = 16;
  static_assert(16 % kPrefetches == 0, "a step's slots start at a multiple of kPrefetches");
  const bool prefetch = op.prefetch && blockRows >= kPrefetchTiles * kTileRows;
  Value flatP, lastFloat;
  if (prefetch) {
    auto flatType = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, dyn, {1}));
    flatP = b.create<memref::CollapseShapeOp>(loc, flatType, op.P, ArrayRef<ReassociationIndices>{{0, 1}});
    lastFloat = b.create<arith::SubIOp>(loc, b.create<arith::MulIOp>(loc, sliceRows, cidx(W)), cidx(1));
  }

  forLoop(cidx(0), M, blockRows, [&](Value mb) {
    Value Mb = b.create<arith::MinSIOp>(loc, b.create<arith::SubIOp>(loc, M, mb), cidx(blockRows));
    Value tiles = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, Mb, cidx(kTileRows - 1)), cidx(kTileRows));
    Value scale = prefetch ? Value(b.create<arith::DivUIOp>(
                                    loc, cidx((2 * pairs) << 16),
                                    b.create<arith::MulIOp>(loc, tiles, cidx(totalSteps * kPrefetches))))
                              : Value();
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
        // The block's tiles over this slice, prefetching the next one or not (chosen per slice, below).
        auto tilesLoop = [&](bool prefetching) { forLoop(cidx(0), tiles, 1, [&](Value t) {
          Value m0 = b.create<arith::MulIOp>(loc, t, cidx(kTileRows)); // in the block
          Value row0 = b.create<arith::AddIOp>(loc, mb, m0);             // in A and C
          // The tile's first slot in fixed point and the next slice's first float (its line l is 16 floats on).
          Value tileFixed, nextFloat;
          if (prefetching) {
            tileFixed = b.create<arith::MulIOp>(
                loc, b.create<arith::MulIOp>(loc, t, cidx(totalSteps * kPrefetches)), scale);
            nextFloat = b.create<arith::MulIOp>(loc, b.create<arith::AddIOp>(loc, slice, cidx(pairs)), cidx(W));
          }
          // `count` steps from pair-row `first`: the last, when `padded`, reads B from Bs.
          auto run = [&](SmallVector<Value> acc, Value first, int64_t count, bool padded) {
            // Slot (t totalSteps + first / 16 + s) kPrefetches + j in fixed point, one addition of scale a slot.
            Value fixed;
            if (prefetching)
              fixed = b.create<arith::AddIOp>(
                  loc, tileFixed,
                  b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, first, cidx(16 / kPrefetches)), scale));
            for (int64_t s = 0; s < count; ++s) {
              Value kv = b.create<arith::AddIOp>(loc, first, cidx(16 * s));
              bool fromBs = padded && s + 1 == count;
              if (prefetching)
                for (int64_t j = 0; j < kPrefetches; ++j) {
                  Value line = b.create<arith::ShRUIOp>(loc, fixed, cidx(16));
                  Value at = b.create<arith::AddIOp>(loc, nextFloat, b.create<arith::MulIOp>(loc, line, cidx(16)));
                  b.create<memref::PrefetchOp>(loc, flatP, ValueRange{b.create<arith::MinSIOp>(loc, at, lastFloat)},
                                               /*isWrite=*/false, /*localityHint=*/2, /*isDataCache=*/true);
                  fixed = b.create<arith::AddIOp>(loc, fixed, scale);
                }
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
        }); };
        if (!prefetch) {
          tilesLoop(false);
          return;
        }
        auto many = b.create<scf::IfOp>(
            loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, tiles, cidx(kPrefetchTiles)), true);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(many.thenBlock());
        tilesLoop(true);
        b.setInsertionPointToStart(many.elseBlock());
        tilesLoop(false);
      });
    });
  });
}

} // namespace lmcc::codegen
