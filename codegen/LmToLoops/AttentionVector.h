//===- AttentionVector.h - lm-to-loops: the attention vector forms' pieces ----===//
//
// What the vector forms of lm.attention (Attention.cpp) and of its VJP lm.attention_grad (AttentionGrad.cpp)
// are built from: the tile geometry, the register-tiled score / softmax / weighted-row builders (VectorKernel)
// and the task scaffolding that splits (entry, head) items over the runtime's threads.
//
//===----------------------------------------------------------------------===//
#ifndef LMCC_CODEGEN_LMTOLOOPS_ATTENTIONVECTOR_H
#define LMCC_CODEGEN_LMTOLOOPS_ATTENTIONVECTOR_H

#include "codegen/LmToLoops/Lowering.h"
#include "codegen/LmToLoops/Scratch.h"

#include <functional>

namespace lmcc::codegen::attention {

using namespace mlir;

constexpr int64_t kLanes = 16; ///< f32 lanes of the kernels' vectors (one 512-bit register, two 256-bit ones)

/// The register tiles of the vector forms, sized to the target's vector registers. The kernels compute on
/// vector<16xf32> everywhere (so the lanes, blocks and sums, and with them every result, are the same on every
/// target); AVX2 holds such a vector in two of its 16 ymm registers, where AVX-512 holds it in one of 32 zmm, so
/// the tiles that keep accumulators in registers are smaller there. None of these sizes changes a result: each
/// score, softmax sum and output element is the same chain of operations whatever the grouping.
struct Geometry {
  int64_t scoreRows;   ///< query rows whose score accumulators are in registers at once (of a tile's kTileRows)
  int64_t scoreBlocks; ///< 16-key blocks per score step (2: one broadcast of q feeds 2 FMAs)
  int64_t pvRows;      ///< query rows per p.v tile
  int64_t pvChunks;    ///< feature vectors (of 16) per p.v and dK / dV tile
  int64_t gradKeys;    ///< keys per dK / dV tile of the backward
  /// 512-bit (32 registers): 8 rows x 2 blocks of scores (16 accumulators), p.v 4 rows x 4 vectors (16), dK / dV
  /// 4 keys x 4 vectors (16). 256-bit (16 registers, two per vector): 4 rows x 1 block, 4 rows x 1 vector, 4 keys
  /// x 1 vector (8 registers of accumulators each, the 8 independent FMA chains two ports of latency 4 need).
  static Geometry forVectorBits(int64_t bits);
};
constexpr Geometry kWideGeometry{8, 2, 4, 4, 4}, kNarrowGeometry{4, 1, 4, 1, 4};
// The backward's dq tiles (AttentionGrad.cpp) take pvRows rows at a time and the score groups scoreRows: both
// split a tile's rows evenly.
static_assert(kTileRows % kWideGeometry.pvRows == 0 && kTileRows % kNarrowGeometry.pvRows == 0 &&
              kTileRows % kWideGeometry.scoreRows == 0 && kTileRows % kNarrowGeometry.scoreRows == 0);
inline Geometry Geometry::forVectorBits(int64_t bits) { return bits >= 512 ? kWideGeometry : kNarrowGeometry; }

/// vector.shuffle masks interleaving the low (high) halves of two 16-lane vectors.
inline SmallVector<int64_t> interleaveMask(bool high) {
  SmallVector<int64_t> mask;
  for (int64_t l = 0; l < kLanes / 2; ++l) {
    mask.push_back(l + (high ? kLanes / 2 : 0));
    mask.push_back(l + (high ? kLanes / 2 : 0) + kLanes);
  }
  return mask;
}

/// The rows of one tile of R query rows of entry `entry` and the keys they see (the last tile repeats its last
/// row).
struct Tile {
  Value entry;
  SmallVector<Value> row, pos, lo, hi; ///< per row: the row, its position, its key range [lo, hi)
  SmallVector<Value> valid;            ///< per row (backward only): whether the row is a real one, not a repeat
  SmallVector<Value> ownKey;           ///< per row (directional mask): an S row's position (its key is unseen), else -1
  Value from, to, from16;              ///< the union of the rows' ranges, its start rounded down to 16
  Value allLo, allHi; ///< every row of the tile sees [allLo, allHi) (but its own key if diagonal, its own and the
                      ///< hidden keys if an S row)
};

/// The pieces both vector forms (lm.attention and its VJP lm.attention_grad) are built from, per (entry, head)
/// item: the head's keys transposed, a tile's score products, the softmax over them and the products of a tile's
/// row weights (probabilities or score gradients) with key-major rows.
struct VectorKernel {
  Loops &L;
  OpBuilder &b;
  Location loc;
  int64_t dh, chunks;
  lm::MaskKind mask;
  Value maskRows; ///< the directional mask's rows [entries, N, 1 + W] (lm.mask_fill states them), else null
  Geometry geo;   ///< the register tiles of the target (its GEMM tile's vector width)
  VectorType vt, it;
  Value negInf, negInfV, zeroV, iota;

  VectorKernel(Loops &L, int64_t dh, lm::MaskKind mask, Value maskRows = Value())
      : L(L), b(L.b), loc(L.loc), dh(dh), chunks(dh / kLanes), mask(mask), maskRows(maskRows),
        geo(Geometry::forVectorBits(L.context.tile.lanes * 32)), vt(VectorType::get({kLanes}, L.f32())),
        it(VectorType::get({kLanes}, L.b.getIndexType())) {
    negInf = L.f32c(-INFINITY), negInfV = bcast(negInf), zeroV = bcast(L.f32c(0));
    SmallVector<int64_t> lanes(kLanes);
    for (int64_t l = 0; l < kLanes; ++l)
      lanes[l] = l;
    iota = b.create<arith::ConstantOp>(loc, it, DenseElementsAttr::get(it, ArrayRef<int64_t>(lanes)));
  }

  Value bcast(Value x) { return b.create<vector::BroadcastOp>(loc, isa<IndexType>(x.getType()) ? it : vt, x); }
  Value add(Value x, Value y) { return b.create<arith::AddIOp>(loc, x, y); }
  Value roundDown(Value x, int64_t to = kLanes) {
    return b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, x, L.idx(to)), L.idx(to));
  }
  Value scratch(ArrayRef<int64_t> shape, ValueRange dyn) {
    return b.create<memref::AllocOp>(loc, MemRefType::get(shape, L.f32()), dyn, b.getI64IntegerAttr(64));
  }
  /// f32 scratch buffers of `shapes` (row-major, each a multiple of 16 floats; the dynamic sizes in order from
  /// `dyn`) as views of one 64-byte aligned allocation: one workspace block for all of them.
  SmallVector<Value> scratchViews(ArrayRef<SmallVector<int64_t>> shapes, ValueRange dyn) {
    SmallVector<Value> floats;
    size_t next = 0;
    for (const auto &shape : shapes) {
      Value n = L.idx(1);
      for (int64_t d : shape)
        n = b.create<arith::MulIOp>(loc, n, ShapedType::isDynamic(d) ? dyn[next++] : L.idx(d));
      floats.push_back(n);
    }
    Value total = L.idx(0);
    for (Value n : floats)
      total = add(total, n);
    auto bytesType = MemRefType::get({ShapedType::kDynamic}, b.getI8Type());
    Value block = b.create<memref::AllocOp>(loc, bytesType, ValueRange{b.create<arith::MulIOp>(loc, total, L.idx(4))},
                                            b.getI64IntegerAttr(64));
    SmallVector<Value> views;
    Value offset = L.idx(0);
    next = 0;
    for (auto [shape, n] : llvm::zip(shapes, floats)) {
      SmallVector<Value> sizes;
      for (int64_t d : shape)
        if (ShapedType::isDynamic(d))
          sizes.push_back(dyn[next++]);
      views.push_back(b.create<memref::ViewOp>(loc, MemRefType::get(shape, L.f32()), block,
                                               b.create<arith::MulIOp>(loc, offset, L.idx(4)), sizes));
      offset = add(offset, n);
    }
    return views;
  }
  Value load(Value m, ValueRange ivs) { return b.create<vector::LoadOp>(loc, vt, m, ivs); }
  /// A vector store; `nontemporal` ones must be at vector-aligned addresses (lowerToLLVMDialect gives them the
  /// vector's alignment, which vmovntps needs): the rows of 64-byte aligned buffers at multiples of 16 floats.
  void store(Value x, Value m, ValueRange ivs, bool nontemporal = false) {
    b.create<vector::StoreOp>(loc, x, m, ivs, nontemporal);
  }
  /// Whether the rows of `m` are stored nontemporally: `streaming` and m 64-byte aligned (the runtime's buffers
  /// always are; a kernel module's output argument may not be).
  Value nontemporalRows(Value streaming, Value m) {
    Value low = b.create<arith::AndIOp>(loc, L.address(m), L.i64c(63));
    return L.andI(streaming, L.eqI(low, L.i64c(0)));
  }
  /// stores(true) where `streaming`, else stores(false).
  void storeStreaming(Value streaming, const std::function<void(bool)> &stores) {
    auto branch = b.create<scf::IfOp>(loc, streaming, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(branch.thenBlock());
    stores(true);
    b.setInsertionPointToStart(branch.elseBlock());
    stores(false);
  }
  /// After a task's nontemporal stores (where `streaming`): a full fence (mfence), so that the threads that read
  /// the outputs next see them (nontemporal stores are weakly ordered).
  void fenceStreaming(Value streaming) {
    L.when(streaming, [&] { b.create<LLVM::FenceOp>(loc, LLVM::AtomicOrdering::seq_cst); });
  }
  /// Feature vector c of the head whose first feature is `base`.
  Value chunk(Value base, int64_t c) { return add(base, L.idx(c * kLanes)); }

  /// for loop [lb, ub) step `step` carrying `init`; body(iv, args) returns the next args.
  scf::ForOp loop(Value lb, Value ub, int64_t step, ValueRange init,
                  const std::function<SmallVector<Value>(Value, ValueRange)> &body) {
    auto f = b.create<scf::ForOp>(loc, lb, ub, L.idx(step), init);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(f.getBody());
    SmallVector<Value> next = body(f.getInductionVar(), f.getRegionIterArgs());
    if (init.empty()) // the builder made the terminator
      return f;
    b.create<scf::YieldOp>(loc, next);
    return f;
  }

  /// The transposed keys t [M16 / 16 * dh, 16] of transpose: row (j / 16) dh + e holds feature e of keys
  /// j..j+16 of a 16-key block, so that a block's dh rows are consecutive lines (the score loop's reads; in a
  /// [dh, M16] layout they were M16 floats apart, a few L1 sets for all of them).
  Value transposedRow(Value jb, Value e) {
    return add(b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, jb, L.idx(kLanes)), L.idx(dh)), e);
  }
  Value transposedScratch(Value M16) {
    return scratch({ShapedType::kDynamic, kLanes},
                   Value(b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, M16, L.idx(kLanes)), L.idx(dh))));
  }

  /// t (transposedScratch) = features base..base+dh of src[bi, 0..M) transposed, zeros from M: full blocks of 16
  /// rows x 16 features transposed in registers by four rounds of interleaves, the rest element by element.
  void transpose(Value src, Value bi, Value base, Value M, Value M16, Value t) {
    SmallVector<int64_t> lowMask = interleaveMask(false), highMask = interleaveMask(true);
    Value fullKeys = roundDown(M);
    loop(L.idx(0), fullKeys, kLanes, {}, [&](Value j0, ValueRange) {
      loop(L.idx(0), L.idx(dh), kLanes, {}, [&](Value e0, ValueRange) {
        SmallVector<Value> rowsV;
        for (int64_t r = 0; r < kLanes; ++r)
          rowsV.push_back(load(src, ValueRange{bi, add(j0, L.idx(r)), add(base, e0)}));
        for (int round = 0; round < 4; ++round) {
          SmallVector<Value> next;
          for (int64_t r = 0; r < kLanes / 2; ++r) {
            next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], lowMask));
            next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], highMask));
          }
          rowsV = next;
        }
        Value row0 = transposedRow(j0, e0);
        for (int64_t e = 0; e < kLanes; ++e)
          store(rowsV[e], t, ValueRange{add(row0, L.idx(e)), L.idx(0)});
        return SmallVector<Value>{};
      });
      return SmallVector<Value>{};
    });
    loop(fullKeys, M16, 1, {}, [&](Value j, ValueRange) {
      Value real = L.lt(j, M);
      Value lane = b.create<arith::RemUIOp>(loc, j, L.idx(kLanes));
      L.nest({L.idx(dh)}, [&](ValueRange e) {
        Value x = L.choose(real, L.f32(), [&] { return L.load(src, {bi, j, add(base, e[0])}); },
                           [&] { return L.f32c(0); });
        L.store(x, t, {transposedRow(j, e[0]), lane});
      });
      return SmallVector<Value>{};
    });
  }

  /// A read prefetch of the line holding buffer[entry, j, e] into L2 (locality 2: 0 was slower, 1 and 3 no
  /// better; bench/results/2026-11-27-softmax.md).
  void prefetchLine(Value buffer, Value entry, Value j, Value e) {
    b.create<memref::PrefetchOp>(loc, buffer, ValueRange{entry, j, e}, /*isWrite=*/false, /*localityHint=*/2,
                                 /*isDataCache=*/true);
  }

  /// While tile t of `tiles` (rows r0..r0+R) computes, a later item's (entry nextEntry, features from nextBase; the
  /// next one in the backward, the one after it in the forward) rows of the row-major operands and keys of the
  /// key-major ones in part `part` of `parts` of r0..r0+R (after the last tile's last part every remaining row
  /// and key) move to L2: at batch > 1 the kernels stream their operands from memory, and prefetches spread over
  /// the tiles, and over parts of a tile's work, keep that off the critical path (a tile's lines issued at once
  /// fill the miss queue and stall it: one burst per tile instead of four parts lost 5-13% at batch 32).
  void prefetchNext(Value hasNext, Value nextEntry, Value nextBase, Value t, Value tiles, Value r0, int64_t R,
                    int64_t part, int64_t parts, Value rows, Value M, ArrayRef<Value> rowReads,
                    ArrayRef<Value> keyReads) {
    L.when(hasNext, [&] {
      auto prefetch = [&](Value buffer, Value from, Value to) {
        L.nest({b.create<arith::SubIOp>(loc, to, from), L.idx(chunks)}, [&](ValueRange jc) {
          Value j = add(from, jc[0]);
          Value e = add(nextBase, b.create<arith::MulIOp>(loc, jc[1], L.idx(kLanes)));
          prefetchLine(buffer, nextEntry, j, e);
        });
      };
      Value p0 = add(r0, L.idx(part * R / parts)), p1 = add(r0, L.idx((part + 1) * R / parts));
      Value rowsFrom = b.create<arith::MinSIOp>(loc, p0, rows), rowsTo = b.create<arith::MinSIOp>(loc, p1, rows);
      Value keysFrom = b.create<arith::MinSIOp>(loc, p0, M), keysTo = b.create<arith::MinSIOp>(loc, p1, M);
      if (part + 1 == parts) {
        Value last = L.eqI(t, b.create<arith::SubIOp>(loc, tiles, L.idx(1)));
        rowsTo = L.select(last, rows, rowsTo);
        keysTo = L.select(last, M, keysTo);
      }
      for (Value buffer : keyReads)
        prefetch(buffer, keysFrom, keysTo);
      for (Value buffer : rowReads)
        prefetch(buffer, rowsFrom, rowsTo);
    });
  }

  /// The far half of the prefetching (prefetchNext is the near one): while item `head` of an entry's H computes
  /// (part `part` of `parts` of tile t of `tiles`), slice head / H of the next entry's read lines (its rows of
  /// `rowReads`, keys of `keyReads`, every head's features [0, D)) is prefetched, spread evenly over the item's
  /// tiles and parts: the next entry is read whole rows at a time, in address order, an entry ahead, where the
  /// near prefetches alone read 64 features of each of its rows per item. Lines that leave L2 before their item
  /// wait in L3 (a victim cache on the machines measured), and prefetchNext brings them back in time. Measured
  /// on the backward (bench/results/2026-11-28-entry-prefetch.md): 5-10% at batch 32; the forward, whose items
  /// are shorter, lost as much at n = 80 and does not use it.
  void prefetchNextEntry(Value hasNext, Value nextEntry, Value head, int64_t H, int64_t D, Value t, Value tiles,
                         int64_t part, int64_t parts, Value rows, Value M, ArrayRef<Value> rowReads,
                         ArrayRef<Value> keyReads) {
    L.when(hasNext, [&] {
      const int64_t perRow = D / kLanes; // lines of a row: D floats a row, 16 a line
      Value slices = b.create<arith::MulIOp>(loc, tiles, L.idx(parts));
      Value within = add(b.create<arith::MulIOp>(loc, t, L.idx(parts)), L.idx(part));
      Value slice = add(b.create<arith::MulIOp>(loc, head, slices), within);
      Value allSlices = b.create<arith::MulIOp>(loc, slices, L.idx(H));
      auto prefetch = [&](Value buffer, Value count) {
        Value lines = b.create<arith::MulIOp>(loc, count, L.idx(perRow));
        auto at = [&](Value s) {
          return b.create<arith::DivUIOp>(loc, b.create<arith::MulIOp>(loc, s, lines), allSlices);
        };
        loop(at(slice), at(add(slice, L.idx(1))), 1, {}, [&](Value l, ValueRange) {
          Value j = b.create<arith::DivUIOp>(loc, l, L.idx(perRow));
          Value e = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, l, L.idx(perRow)), L.idx(kLanes));
          prefetchLine(buffer, nextEntry, j, e);
          return SmallVector<Value>{};
        });
      };
      for (Value buffer : keyReads)
        prefetch(buffer, M);
      for (Value buffer : rowReads)
        prefetch(buffer, rows);
    });
  }

  /// Tile rows r0..r0+R (clamped to lastRow) of entry bi and their key ranges over keys [0, len): causal
  /// [0, min(len, i + 1)), anticausal [i, len), else [0, len); under the directional mask by the row's direction
  /// (R as causal, L as anticausal, S [0, len) less its own and the hidden keys (storeScores), skip none: [i, i)).
  /// With `rowLimit` (the backward) rows from rowLimit on are repeats that see no key (an empty range at row 0's
  /// start, so that the union stays the real rows').
  /// With `order` (directional mask, directionOrder's), tile slot s holds row order[s] instead of row s.
  Tile tileRows(Value bi, Value r0, int64_t R, Value lastRow, Value len, Value queryPositions, Value rowLimit,
                Value order = Value()) {
    Tile t;
    t.entry = bi;
    for (int64_t r = 0; r < R; ++r) {
      Value at = add(r0, L.idx(r));
      Value slot = b.create<arith::MinSIOp>(loc, at, lastRow);
      t.row.push_back(order ? L.toIndex(L.load(order, slot)) : slot);
      t.pos.push_back(queryPositions ? L.toIndex(L.load(queryPositions, bi)) : t.row[r]);
      const bool endsAtRow = mask == lm::MaskKind::causal || mask == lm::MaskKind::directional; // R rows: [0, i]
      Value causalHi = endsAtRow ? Value(b.create<arith::MinSIOp>(loc, len, add(t.pos[r], L.idx(1)))) : Value();
      Value lo = mask == lm::MaskKind::anticausal ? t.pos[r] : L.idx(0);
      Value hi = mask == lm::MaskKind::causal ? causalHi : len;
      if (mask == lm::MaskKind::directional) {
        Value dir = L.load(maskRows, {bi, t.pos[r], L.idx(0)});
        auto is = [&](int64_t code) { return L.cmp(arith::CmpIPredicate::eq, dir, L.i32c(code)); };
        lo = L.select(L.orI(is(1), is(3)), t.pos[r], L.idx(0));
        hi = L.select(is(0), causalHi, L.select(is(3), t.pos[r], len));
        t.ownKey.push_back(L.select(is(2), t.pos[r], L.idx(-1)));
      }
      if (rowLimit && r > 0) {
        Value valid = L.lt(at, rowLimit);
        t.valid.push_back(valid);
        lo = L.select(valid, lo, t.lo[0]);
        hi = L.select(valid, hi, t.lo[0]);
      } else if (rowLimit) {
        t.valid.push_back(Value()); // row r0 is always real
      }
      t.lo.push_back(lo);
      t.hi.push_back(hi);
    }
    auto [lo, hi] = unionRange(t, 0, R);
    t.from = lo, t.to = hi, t.from16 = roundDown(lo);
    t.allLo = t.lo[0], t.allHi = t.hi[0];
    for (int64_t r = 1; r < R; ++r) {
      t.allLo = b.create<arith::MaxSIOp>(loc, t.allLo, t.lo[r]);
      t.allHi = b.create<arith::MinSIOp>(loc, t.allHi, t.hi[r]);
    }
    return t;
  }

  /// directionOrder's scratch for `rows` rows when `mask` is directional (rows + 1 i32 slots), else null: no order,
  /// tile slot s holds row s.
  Value orderScratch(lm::MaskKind mask, Value rows) {
    if (mask != lm::MaskKind::directional)
      return Value();
    return b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic}, L.i32()),
                                     ValueRange{add(rows, L.idx(1))}, b.getI64IntegerAttr(64));
  }

  /// order[0..rows) = the rows of entry bi grouped by direction under the directional mask: R rows, then L, then S,
  /// then the rest, each group in row order (a stable counting sort; `order` has rows + 1 slots, the last one
  /// scratch). Tiles of one direction visit about half the keys (an R tile the keys up to its last row, an L tile
  /// from its first), where tiles of mixed rows visited them all; a row's result does not depend on its tile.
  void directionOrder(Value bi, Value rows, Value order) {
    Value count = L.idx(0);
    for (int64_t code = 0; code < 4; ++code) {
      count = loop(L.idx(0), rows, 1, {count}, [&](Value i, ValueRange acc) {
                Value dir = L.load(maskRows, {bi, i, L.idx(0)});
                Value match = code < 3 ? L.cmp(arith::CmpIPredicate::eq, dir, L.i32c(code))
                                       : L.cmp(arith::CmpIPredicate::ugt, dir, L.i32c(2));
                b.create<memref::StoreOp>(loc, b.create<arith::IndexCastOp>(loc, L.i32(), i), order, acc[0]);
                return SmallVector<Value>{L.select(match, add(acc[0], L.idx(1)), acc[0])};
              }).getResult(0);
    }
  }

  /// The union of the key ranges of rows first..first+count of the tile.
  std::pair<Value, Value> unionRange(const Tile &t, int64_t first, int64_t count) {
    Value l = t.lo[first], h = t.hi[first];
    for (int64_t r = first + 1; r < first + count; ++r) {
      l = b.create<arith::MinSIOp>(loc, l, t.lo[r]);
      h = b.create<arith::MaxSIOp>(loc, h, t.hi[r]);
    }
    return {l, h};
  }

  /// fn(first, count) for the tile's rows in groups of at most `size`, in order.
  void rowGroups(int64_t R, int64_t size, const std::function<void(int64_t, int64_t)> &fn) {
    for (int64_t first = 0; first < R; first += size)
      fn(first, std::min(size, R - first));
  }

  /// For each group of geo.scoreRows rows of the tile and each 16-key block jb of the tile's key range
  /// [from16, to): the group's row vectors sum_e a[bi, row_r, base + e] * t(e, jb..jb+16) (one accumulator per
  /// row, 4 partial chains per row when the tile has fewer than 4 rows; full blocks geo.scoreBlocks at a time when
  /// it has 4 or more), handed to use(jb, first, products) (first: the group's first row) in block order. A block
  /// whose lower (upper) half no row sees (the first block of an anticausal tile, the last of a causal one: 16-key
  /// blocks over 8-row tiles) is computed 8 lanes wide, its other half 0.
  void products(Value a, Value bi, Value base, const Tile &tile, Value t,
                const std::function<void(Value, int64_t, ArrayRef<Value>)> &use) {
    const int64_t chains = tile.row.size() >= 4 ? 1 : 4;
    const int64_t half = kLanes / 2;
    // The first block's lower half unseen: its upper half alone, the full blocks from the next.
    Value headHalf = L.andI(L.ge(b.create<arith::SubIOp>(loc, tile.from, tile.from16), L.idx(half)),
                            L.lt(tile.from, tile.to));
    Value first = L.select(headHalf, add(tile.from16, L.idx(kLanes)), tile.from16);
    // The last block's upper half unseen (1..8 keys past the full blocks): its lower half alone.
    Value span = b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, tile.to, first), L.idx(0));
    Value fullEnd = add(first, roundDown(span));
    Value rest = b.create<arith::SubIOp>(loc, add(first, span), fullEnd);
    Value tailHalf = L.andI(L.lt(L.idx(0), rest), L.le(rest, L.idx(half)));
    Value end = L.select(L.lt(L.idx(half), rest), add(fullEnd, L.idx(kLanes)), fullEnd);
    rowGroups(tile.row.size(), geo.scoreRows, [&](int64_t r0, int64_t R) {
      ArrayRef<Value> row = ArrayRef<Value>(tile.row).slice(r0, R);
      // `blocks` consecutive 16-key blocks from jb (several full blocks, chains == 1): one broadcast of q feeds
      // an FMA per block; each score is the same FMA chain over the features in order whatever the count.
      auto block = [&](Value jb, int64_t width, int64_t offset, int64_t blocks) {
        auto type = VectorType::get({width}, L.f32());
        Value zero = b.create<vector::BroadcastOp>(loc, type, L.f32c(0));
        Value rows = transposedRow(jb, L.idx(0)), lane = L.idx(offset);
        SmallVector<Value> zeros(R * blocks * chains, zero);
        auto dot = loop(L.idx(0), L.idx(dh), 4, zeros, [&](Value e0, ValueRange acc) {
          SmallVector<Value> next(acc.begin(), acc.end());
          for (int64_t u = 0; u < 4; ++u) {
            Value e = add(e0, L.idx(u));
            SmallVector<Value> kv;
            for (int64_t h = 0; h < blocks; ++h)
              kv.push_back(b.create<vector::LoadOp>(loc, type, t, ValueRange{add(rows, add(e, L.idx(h * dh))), lane}));
            for (int64_t r = 0; r < R; ++r) {
              Value qe = b.create<vector::BroadcastOp>(loc, type, L.load(a, {bi, row[r], add(base, e)}));
              for (int64_t h = 0; h < blocks; ++h) {
                int64_t slot = (r * blocks + h) * chains + u % chains;
                next[slot] = b.create<vector::FMAOp>(loc, qe, kv[h], next[slot]);
              }
            }
          }
          return next;
        });
        for (int64_t h = 0; h < blocks; ++h) {
          SmallVector<Value> s(R);
          for (int64_t r = 0; r < R; ++r) {
            int64_t slot = (r * blocks + h) * chains;
            s[r] = dot.getResult(slot);
            if (chains == 4)
              s[r] = b.create<arith::AddFOp>(
                  loc, b.create<arith::AddFOp>(loc, s[r], dot.getResult(slot + 1)),
                  b.create<arith::AddFOp>(loc, dot.getResult(slot + 2), dot.getResult(slot + 3)));
            if (width < kLanes)
              s[r] = b.create<vector::InsertStridedSliceOp>(loc, s[r], zeroV, ArrayRef<int64_t>{offset},
                                                            ArrayRef<int64_t>{1});
          }
          use(h ? add(jb, L.idx(h * kLanes)) : jb, r0, s);
        }
      };
      L.when(headHalf, [&] { block(tile.from16, half, half, 1); });
      const int64_t blocks = chains == 1 ? geo.scoreBlocks * std::max<int64_t>(1, geo.scoreRows / R) : 1;
      if (blocks > 1) {
        // Full blocks `blocks` at a time: one broadcast of q feeds `blocks` FMAs (a single block's R + 1 loads for
        // R FMAs kept the loop at the load ports of the two-FMA-port AVX-512 core).
        Value groupsEnd = add(first, roundDown(b.create<arith::SubIOp>(loc, end, first), blocks * kLanes));
        loop(first, groupsEnd, blocks * kLanes, {}, [&](Value jb, ValueRange) {
          block(jb, kLanes, 0, blocks);
          return SmallVector<Value>{};
        });
        loop(groupsEnd, end, kLanes, {}, [&](Value jb, ValueRange) {
          block(jb, kLanes, 0, 1);
          return SmallVector<Value>{};
        });
      } else {
        loop(first, end, kLanes, {}, [&](Value jb, ValueRange) {
          block(jb, kLanes, 0, 1);
          return SmallVector<Value>{};
        });
      }
      L.when(tailHalf, [&] { block(fullEnd, half, 0, 1); });
    });
  }

  /// The tile's scores into S: (a_r . t[:, j] [+ the relative term of PQ (relativeProducts), clip c]) * scale, the
  /// lanes a row cannot see -inf (storeScores); a = q and t = k^T for the scores of either form.
  void scores(Value a, Value bi, Value base, const Tile &tile, Value t, Value scale, Value PQ, int64_t clip, Value M16,
              Value S) {
    products(a, bi, base, tile, t, [&](Value jb, int64_t first, ArrayRef<Value> dots) {
      SmallVector<Value> s;
      for (int64_t r = 0; r < int64_t(dots.size()); ++r) {
        Value d = dots[r];
        if (PQ)
          d = b.create<arith::AddFOp>(loc, d, relativeBlock(PQ, first + r, tile.pos[first + r], jb, clip, M16));
        s.push_back(b.create<arith::MulFOp>(loc, d, scale));
      }
      storeScores(S, jb, first, s, tile);
    });
  }

  /// S[first + r, jb..jb+16) = s[r] for the rows of s, -inf in the lanes row first + r cannot see (outside its
  /// range, its own key under the diagonal mask, an S row's own and hidden keys under the directional one), tested
  /// only when the block is not fully visible to every row of the tile.
  void storeScores(Value S, Value jb, int64_t first, ArrayRef<Value> s, const Tile &t) {
    const int64_t R = s.size();
    Value jEnd = add(jb, L.idx(kLanes));
    Value full = L.andI(L.ge(jb, t.allLo), L.le(jEnd, t.allHi));
    if (mask == lm::MaskKind::diagonal) // the rows' own keys (contiguous) miss the block
      full = L.andI(full, L.orI(L.ge(t.pos[first], jEnd), L.lt(t.pos[first + R - 1], jb)));
    // Directional: an S row's hidden-key bits of the block (bits jb mod 32.. of word 1 + jb / 32; 0 for other
    // rows), and whether its own key is in the block.
    SmallVector<Value> hidden;
    if (mask == lm::MaskKind::directional) {
      Value word = add(L.idx(1), b.create<arith::DivUIOp>(loc, jb, L.idx(32)));
      Value shift = b.create<arith::IndexCastOp>(loc, L.i32(), b.create<arith::RemUIOp>(loc, jb, L.idx(32)));
      for (int64_t r = 0; r < R; ++r) {
        Value selective = L.ge(t.ownKey[first + r], L.idx(0));
        Value bits = b.create<arith::AndIOp>(
            loc, b.create<arith::ShRUIOp>(loc, L.load(maskRows, {t.entry, t.pos[first + r], word}), shift),
            L.i32c(0xFFFF));
        hidden.push_back(L.select(selective, bits, L.i32c(0)));
        Value ownOutside = L.orI(L.lt(t.ownKey[first + r], jb), L.ge(t.ownKey[first + r], jEnd));
        full = L.andI(full, L.andI(L.eqI(hidden[r], L.i32c(0)), ownOutside));
      }
    }
    auto test = b.create<scf::IfOp>(loc, full, /*withElse=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(test.thenBlock());
    for (int64_t r = 0; r < R; ++r)
      store(s[r], S, ValueRange{L.idx(first + r), jb});
    b.setInsertionPointToStart(test.elseBlock());
    Value j = add(bcast(jb), iota);
    for (int64_t r = 0; r < R; ++r) {
      Value visible = L.andI(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(t.lo[first + r])),
                             b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, bcast(t.hi[first + r])));
      if (mask == lm::MaskKind::diagonal)
        visible = L.andI(visible, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, bcast(t.pos[first + r])));
      if (mask == lm::MaskKind::directional) {
        auto i32v = VectorType::get({kLanes}, L.i32());
        Value lanes = b.create<arith::IndexCastOp>(loc, i32v, iota);
        Value bit = b.create<arith::AndIOp>(
            loc, b.create<arith::ShRUIOp>(loc, b.create<vector::BroadcastOp>(loc, i32v, hidden[r]), lanes),
            b.create<vector::BroadcastOp>(loc, i32v, L.i32c(1)));
        Value shown = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, bit,
                                              b.create<vector::BroadcastOp>(loc, i32v, L.i32c(0)));
        visible = L.andI(L.andI(visible, shown),
                         b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, bcast(t.ownKey[first + r])));
      }
      store(L.select(visible, s[r], negInfV), S, ValueRange{L.idx(first + r), jb});
    }
  }

  /// max(x, y) lane-wise as x86's maxps (no NaN test: a NaN score still reaches the output through its exp).
  Value greater(Value x, Value y) {
    return b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x, y), x, y);
  }

  /// Every lane the max (`sum` false) or the sum of x's lanes: a butterfly of 4 lane swaps. Its sums add in pairs
  /// in one fixed order (every lane gets the same bits); the max is exact.
  Value allLanes(Value x, bool sum) {
    for (int64_t w = kLanes / 2; w >= 1; w /= 2) {
      SmallVector<int64_t> swap(kLanes);
      for (int64_t l = 0; l < kLanes; ++l)
        swap[l] = l ^ w;
      Value y = b.create<vector::ShuffleOp>(loc, x, x, swap);
      x = sum ? Value(b.create<arith::AddFOp>(loc, x, y)) : greater(x, y);
    }
    return x;
  }

  /// e^x lane-wise for x <= 88 (the softmax's s - max <= 0), exactly 0 for x <= -88 and -inf: x = n ln 2 + r
  /// with n = round(x log2 e) (by adding 1.5 * 2^23), r in two parts of ln 2 (Cephes' split), e^r by Cephes'
  /// expf polynomial (about 1 ulp) and 2^n from n's bits (n = -127 gives 0). NaN stays NaN.
  Value expOf(Value x) {
    auto c = [&](float f) { return bcast(L.f32c(f)); };
    auto fma = [&](Value x, Value y, Value z) { return b.create<vector::FMAOp>(loc, x, y, z); };
    Value lowest = c(-88.0f);
    x = b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, x, lowest), lowest,
                                  x);
    Value magic = c(12582912.0f);
    Value t = fma(x, c(1.44269504088896341f), magic);
    Value n = b.create<arith::SubFOp>(loc, t, magic);
    Value r = fma(n, c(-0.693359375f), x);
    r = fma(n, c(2.12194440e-4f), r);
    Value p = c(1.9875691500e-4f);
    for (float k : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f, 1.0f,
                    1.0f})
      p = fma(p, r, c(k));
    auto i32 = VectorType::get({kLanes}, b.getI32Type());
    auto splat = [&](int32_t v) {
      return b.create<arith::ConstantOp>(loc, i32, DenseElementsAttr::get(i32, ArrayRef<int32_t>(v)));
    };
    Value bits = b.create<arith::ShLIOp>(loc, b.create<arith::BitcastOp>(loc, i32, t), splat(23));
    bits = b.create<arith::AddIOp>(loc, bits, splat(127 << 23));
    return b.create<arith::MulFOp>(loc, p, b.create<arith::BitcastOp>(loc, vt, bits));
  }

  /// Softmax numerators in place over S's blocks [from16, to): m_r = max_j S[r, j], p = e^(S - m_r) (0 where
  /// -inf; m = 0 for a row that sees no key); returns the R lane-wise sums of p (lanes by j mod 16, blocks in
  /// order). Rows go in groups of geo.scoreRows (each row's max and sum are its own).
  SmallVector<Value> exponentiate(Value S, int64_t R, Value from16, Value to) {
    SmallVector<Value> sums;
    rowGroups(R, geo.scoreRows, [&](int64_t r0, int64_t n) {
      SmallVector<Value> ninf(n, negInfV);
      auto maxima = loop(from16, to, kLanes, ninf, [&](Value jb, ValueRange mx) {
        SmallVector<Value> next;
        for (int64_t r = 0; r < n; ++r)
          next.push_back(greater(mx[r], load(S, ValueRange{L.idx(r0 + r), jb})));
        return next;
      });
      SmallVector<Value> mV(n);
      for (int64_t r = 0; r < n; ++r) {
        Value m = allLanes(maxima.getResult(r), /*sum=*/false);
        mV[r] = b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, m, negInfV),
                                          m, zeroV);
      }
      SmallVector<Value> zeros(n, zeroV);
      auto group = loop(from16, to, kLanes, zeros, [&](Value jb, ValueRange acc) {
        SmallVector<Value> next;
        for (int64_t r = 0; r < n; ++r) {
          Value p = expOf(b.create<arith::SubFOp>(loc, load(S, ValueRange{L.idx(r0 + r), jb}), mV[r]));
          store(p, S, ValueRange{L.idx(r0 + r), jb});
          next.push_back(b.create<arith::AddFOp>(loc, acc[r], p));
        }
        return next;
      });
      sums.append(group.getResults().begin(), group.getResults().end());
    });
    return sums;
  }

  /// 1 / l for the lane-wise sums l of a row's numerators (0 when the row saw no key), broadcast.
  Value inverse(Value sums) {
    Value l = allLanes(sums, /*sum=*/true);
    Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, zeroV);
    return b.create<arith::SelectOp>(loc, seen, b.create<arith::DivFOp>(loc, bcast(L.f32c(1)), l), zeroV);
  }

  /// packed [chunks M16, 16]: row c M16 + j = feature vector c of src[bi, j, base..base+dh) for the keys j < M,
  /// so that a pass over the keys of one feature vector (weightedRows) reads consecutive lines: in src they are a
  /// row (D floats, 2 KB at D = 512) apart, and every key's line of a vector falls in the same two sets of the L1.
  void packRows(Value src, Value bi, Value base, Value M, Value M16, Value packed) {
    SmallVector<Value> firstRows = packedFirstRows(M16, 0, chunks);
    loop(L.idx(0), M, 1, {}, [&](Value j, ValueRange) {
      for (int64_t c = 0; c < chunks; ++c)
        store(load(src, ValueRange{bi, j, chunk(base, c)}), packed, ValueRange{add(firstRows[c], j), L.idx(0)});
      return SmallVector<Value>{};
    });
  }
  Value packedScratch(Value M16) {
    return scratch({ShapedType::kDynamic, kLanes}, Value(b.create<arith::MulIOp>(loc, M16, L.idx(chunks))));
  }
  /// The packed rows of keys 0 of feature vectors c0..c0+n.
  SmallVector<Value> packedFirstRows(Value M16, int64_t c0, int64_t n) {
    SmallVector<Value> rows;
    for (int64_t c = c0; c < c0 + n; ++c)
      rows.push_back(b.create<arith::MulIOp>(loc, M16, L.idx(c)));
    return rows;
  }

  /// acc[r * nc + c] = sum_{j in [lo, hi)} W[r0 + r, j] * row j's feature vector c0 + c of `packed` (packRows,
  /// M16 keys a vector) for nr rows and nc feature vectors: one row vector load per nr FMAs (W = 0 adds exactly
  /// nothing).
  scf::ForOp weightedRows(Value W, int64_t r0, int64_t nr, Value packed, Value M16, int64_t c0, int64_t nc, Value lo,
                          Value hi) {
    SmallVector<Value> zeros(nr * nc, zeroV);
    SmallVector<Value> firstRows = packedFirstRows(M16, c0, nc);
    return loop(lo, hi, 1, zeros, [&](Value j, ValueRange a) {
      SmallVector<Value> next(a.begin(), a.end());
      SmallVector<Value> vj;
      for (int64_t c = 0; c < nc; ++c)
        vj.push_back(load(packed, ValueRange{add(firstRows[c], j), L.idx(0)}));
      for (int64_t r = 0; r < nr; ++r) {
        Value p = bcast(L.load(W, {L.idx(r0 + r), j}));
        for (int64_t c = 0; c < nc; ++c)
          next[r * nc + c] = b.create<vector::FMAOp>(loc, p, vj[c], next[r * nc + c]);
      }
      return next;
    });
  }

  /// weightedRows for one S row of the directional mask (entry bi, position pos, keys [0, len)): acc[c] = sum_j
  /// W[r, j] * row j's feature vector c0 + c of `packed` over the keys the row sees alone, in key order, found 32
  /// keys at a time from its hidden-key word (bits cleared from len on and at its own key) by counting trailing
  /// zeros. The keys skipped have W = 0 exactly, so every lane is the same chain of FMAs as weightedRows' over all
  /// of [0, len): the same bits, for the work of the visible keys alone (an S row hides a random subset). (Values
  /// are finite in a model; a non-finite value of a hidden key, which 0 * v turned into NaN, is not read.)
  SmallVector<Value> visibleWeightedRow(Value W, int64_t r, Value bi, Value pos, Value len, Value packed, Value M16,
                                        int64_t c0, int64_t nc) {
    SmallVector<Value> firstRows = packedFirstRows(M16, c0, nc);
    Value words = b.create<arith::DivUIOp>(loc, add(len, L.idx(31)), L.idx(32));
    Type i32 = L.i32();
    auto word32 = [&](Value index) { return b.create<arith::IndexCastOp>(loc, i32, index).getResult(); };
    Value allOnes = L.i32c(-1), zero32 = L.i32c(0), one32 = L.i32c(1);
    auto sums = loop(L.idx(0), words, 1, SmallVector<Value>(nc, zeroV), [&](Value w, ValueRange acc) {
      Value start = b.create<arith::MulIOp>(loc, w, L.idx(32));
      // Keys from len on: bits from len - start on cleared (none when the word is below len - 32).
      Value remaining = b.create<arith::SubIOp>(loc, len, start);
      Value below = b.create<arith::SubIOp>(
          loc, b.create<arith::ShLIOp>(loc, one32, word32(b.create<arith::MinSIOp>(loc, remaining, L.idx(31)))),
          one32);
      Value inLength = L.select(L.lt(remaining, L.idx(32)), below, allOnes);
      // Its own key: bit pos mod 32 of word pos / 32.
      Value own = L.select(L.eqI(b.create<arith::DivUIOp>(loc, pos, L.idx(32)), w),
                           b.create<arith::ShLIOp>(loc, one32, word32(b.create<arith::RemUIOp>(loc, pos, L.idx(32)))),
                           zero32);
      Value hidden = L.load(maskRows, {bi, pos, add(L.idx(1), w)});
      Value shown = b.create<arith::AndIOp>(
          loc, b.create<arith::XOrIOp>(loc, b.create<arith::OrIOp>(loc, hidden, own), allOnes), inLength);
      SmallVector<Type> types{i32};
      SmallVector<Value> init{shown};
      for (Value a : acc)
        types.push_back(a.getType()), init.push_back(a);
      auto keys = b.create<scf::WhileOp>(
          loc, types, init,
          [&](OpBuilder &, Location, ValueRange args) {
            b.create<scf::ConditionOp>(loc, L.cmp(arith::CmpIPredicate::ne, args[0], zero32), args);
          },
          [&](OpBuilder &, Location, ValueRange args) {
            Value bits = args[0];
            Value j = add(start, L.toIndex(b.create<math::CountTrailingZerosOp>(loc, bits)));
            SmallVector<Value> next{b.create<arith::AndIOp>(loc, bits, b.create<arith::SubIOp>(loc, bits, one32))};
            Value p = bcast(L.load(W, {L.idx(r), j}));
            for (int64_t c = 0; c < nc; ++c)
              next.push_back(b.create<vector::FMAOp>(
                  loc, p, load(packed, ValueRange{add(firstRows[c], j), L.idx(0)}), args[1 + c]));
            b.create<scf::YieldOp>(loc, next);
          });
      return SmallVector<Value>(keys.getResults().drop_front());
    });
    return SmallVector<Value>(sums.getResults());
  }

  // Shaw relative positions (clip c, T = 2c + 1 table rows, index t(i, j) = clamp(j - i, -c, c) + c) in the vector
  // forms: the q_r . rel[t] products per row (T of them, not one per key), read back per key block as a
  // contiguous run of a padded row, and the probabilities (or score gradients) summed per table row, so that
  // the table's side is a [rows, T] x [T, dh] product. Under a triangular mask a row's visible keys reach half the
  // table: causal t <= c, anticausal t >= c (tableRows); the other half is neither computed nor summed.

  /// The table rows [first, last] the mask's visible keys can reach.
  std::pair<int64_t, int64_t> tableRows(int64_t clip) const {
    if (mask == lm::MaskKind::causal)
      return {0, clip};
    if (mask == lm::MaskKind::anticausal)
      return {clip, 2 * clip};
    return {0, 2 * clip};
  }

  /// relT [dh, T16 + 16] = table [T, dh] transposed, zero from T (T16 = T rounded up to 16).
  void transposeTable(Value table, int64_t T, Value relT) {
    int64_t width = (T + kLanes - 1) / kLanes * kLanes + kLanes;
    L.nest({L.idx(dh), L.idx(width)}, [&](ValueRange et) {
      Value x = L.choose(L.lt(et[1], L.idx(T)), L.f32(), [&] { return L.load(table, {et[1], et[0]}); },
                         [&] { return L.f32c(0); });
      L.store(x, relT, {et[0], et[1]});
    });
  }

  /// Row r of PQ [R, 2 M16 + T16 + 16] holds a[bi, row_r] . rel[t] at column M16 + t for the table rows t of
  /// tableRows, the first one's product before them and the last one's after them: the relative score of row r
  /// (position pos_r) and a key j < M16 it sees is column j - pos_r + c + M16, so a key block reads 16 of them with
  /// one (unaligned) load (relativeBlock); the columns of keys the row does not see hold finite numbers.
  void relativeProducts(Value a, Value bi, Value base, ArrayRef<Value> row, Value relT, int64_t clip, Value M16,
                        Value PQ) {
    const int64_t R = row.size(), T = 2 * clip + 1;
    auto [first, last] = tableRows(clip);
    SmallVector<SmallVector<Value>> blocks; // [block][row]
    for (int64_t t0 = first; t0 <= last; t0 += kLanes) {
      blocks.emplace_back();
      rowGroups(R, geo.scoreRows, [&](int64_t r0, int64_t n) {
        SmallVector<Value> zeros(n, zeroV);
        auto dot = loop(L.idx(0), L.idx(dh), 1, zeros, [&](Value e, ValueRange acc) {
          Value kv = load(relT, ValueRange{e, L.idx(t0)});
          SmallVector<Value> next;
          for (int64_t r = 0; r < n; ++r)
            next.push_back(
                b.create<vector::FMAOp>(loc, bcast(L.load(a, {bi, row[r0 + r], add(base, e)})), kv, acc[r]));
          return next;
        });
        blocks.back().append(dot.getResults().begin(), dot.getResults().end());
      });
    }
    const int64_t lastBlock = (last - first) / kLanes, lastLane = (last - first) % kLanes;
    for (int64_t r = 0; r < R; ++r) {
      Value head = bcast(b.create<vector::ExtractOp>(loc, blocks[0][r], ArrayRef<int64_t>{0}));
      Value tail = bcast(b.create<vector::ExtractOp>(loc, blocks[lastBlock][r], ArrayRef<int64_t>{lastLane}));
      Value at = add(M16, L.idx(first));
      loop(L.idx(0), at, kLanes, {}, [&](Value u, ValueRange) { // may reach into the products: stored next
        store(head, PQ, ValueRange{L.idx(r), u});
        return SmallVector<Value>{};
      });
      for (size_t k = 0; k < blocks.size(); ++k)
        store(blocks[k][r], PQ, ValueRange{L.idx(r), add(at, L.idx(int64_t(k) * kLanes))});
      loop(add(M16, L.idx(last + 1)), add(add(M16, M16), L.idx(T)), kLanes, {}, [&](Value u, ValueRange) {
        store(tail, PQ, ValueRange{L.idx(r), u});
        return SmallVector<Value>{};
      });
    }
  }

  /// The relative scores of row r (position pos) for keys jb..jb+16 (relativeProducts' PQ).
  Value relativeBlock(Value PQ, int64_t r, Value pos, Value jb, int64_t clip, Value M16) {
    return load(PQ, ValueRange{L.idx(r), add(b.create<arith::SubIOp>(loc, jb, pos), add(M16, L.idx(clip)))});
  }

  /// Wt[r, t] = sum of W[r, j] over the keys j of [from16, to16) with t(pos_r, j) = t, for the table rows t of
  /// tableRows (W is 0 on the keys row r does not see): the interior t = 1..T-2 is one key each (masked loads of
  /// W's row), t = 0 and T - 1 the sums of W over j <= pos - c and j >= pos + c.
  void relativeWeights(Value W, ArrayRef<Value> pos, Value from16, Value to16, int64_t clip, Value Wt) {
    const int64_t R = pos.size(), T = 2 * clip + 1;
    auto [first, last] = tableRows(clip);
    const int64_t innerFirst = std::max<int64_t>(first, 1), innerLast = std::min(last, T - 2);
    auto i1 = VectorType::get({kLanes}, b.getI1Type());
    for (int64_t r = 0; r < R; ++r) {
      Value low = b.create<arith::SubIOp>(loc, pos[r], L.idx(clip));
      for (int64_t t0 = innerFirst; t0 <= innerLast; t0 += kLanes) {
        // Lanes t = t0.. of keys j = pos - c + t: those in [from16, to16) and t <= innerLast.
        Value j0 = add(low, L.idx(t0));
        Value j = add(bcast(j0), iota);
        Value in = L.andI(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(from16)),
                          b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, bcast(to16)));
        Value mask = b.create<arith::AndIOp>(
            loc, in, b.create<vector::CreateMaskOp>(loc, i1, ValueRange{L.idx(std::min(kLanes, innerLast - t0 + 1))}));
        Value x = b.create<vector::MaskedLoadOp>(loc, vt, W, ValueRange{L.idx(r), j0}, mask, zeroV);
        store(x, Wt, ValueRange{L.idx(r), L.idx(t0)});
      }
      const bool below = first == 0, above = last == T - 1; // the clamped ends this mask reaches
      Value high = add(pos[r], L.idx(clip));
      auto ends = loop(from16, to16, kLanes, {zeroV, zeroV}, [&](Value jb, ValueRange acc) {
        Value j = add(bcast(jb), iota), w = load(W, ValueRange{L.idx(r), jb});
        SmallVector<Value> next(acc.begin(), acc.end());
        if (below)
          next[0] = b.create<arith::AddFOp>(
              loc, acc[0],
              b.create<arith::SelectOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sle, j, bcast(low)),
                                        w, zeroV));
        if (above)
          next[1] = b.create<arith::AddFOp>(
              loc, acc[1],
              b.create<arith::SelectOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(high)),
                                        w, zeroV));
        return next;
      });
      for (auto [k, t, used] : {std::tuple{0, int64_t(0), below}, std::tuple{1, T - 1, above}})
        if (used) {
          Value sum =
              b.create<vector::ExtractOp>(loc, allLanes(ends.getResult(k), /*sum=*/true), ArrayRef<int64_t>{0});
          L.store(sum, Wt, {L.idx(r), L.idx(t)});
        }
    }
  }

  /// acc[r * nc + c] += sum_t Wt[r0 + r, t] * table[t, (c0 + c) 16..] over the table rows t of tableRows: nr rows,
  /// nc feature vectors.
  SmallVector<Value> relativeRows(Value Wt, int64_t r0, int64_t nr, Value table, int64_t clip, int64_t c0,
                                  int64_t nc, ValueRange acc) {
    auto [first, last] = tableRows(clip);
    auto sums = loop(L.idx(first), L.idx(last + 1), 1, acc, [&](Value t, ValueRange a) {
      SmallVector<Value> next(a.begin(), a.end());
      SmallVector<Value> rows;
      for (int64_t c = 0; c < nc; ++c)
        rows.push_back(load(table, ValueRange{t, L.idx((c0 + c) * kLanes)}));
      for (int64_t r = 0; r < nr; ++r) {
        Value w = bcast(L.load(Wt, {L.idx(r0 + r), t}));
        for (int64_t c = 0; c < nc; ++c)
          next[r * nc + c] = b.create<vector::FMAOp>(loc, w, rows[c], next[r * nc + c]);
      }
      return next;
    });
    return SmallVector<Value>(sums.getResults());
  }

  /// dst[slot, j] (+)= sum_r W[r, j] * src[bi, row_r] over the head's features (dst: [2, keys, dh] scratch) for
  /// keys j of [lo, hi): added to below `fresh`, stored from it (keys no earlier tile touched: no zeroing pass
  /// over dst); tiles of geo.gradKeys keys (then single keys) x geo.pvChunks feature vectors, the tile's rows in order.
  void keyUpdates(Value W, Value src, ArrayRef<Value> row, Value dst, Value slot, Value bi, Value base, Value lo,
                  Value hi, Value fresh) {
    const int64_t R = row.size();
    auto update = [&](Value j, int64_t keys, bool accumulate) {
      for (int64_t c0 = 0; c0 < chunks; c0 += geo.pvChunks) {
        int64_t nc = std::min(geo.pvChunks, chunks - c0);
        SmallVector<Value> acc(keys * nc, zeroV);
        for (int64_t r = 0; r < R; ++r) {
          SmallVector<Value> x;
          for (int64_t c = 0; c < nc; ++c)
            x.push_back(load(src, ValueRange{bi, row[r], chunk(base, c0 + c)}));
          for (int64_t u = 0; u < keys; ++u) {
            Value w = bcast(L.load(W, {L.idx(r), add(j, L.idx(u))}));
            for (int64_t c = 0; c < nc; ++c)
              acc[u * nc + c] = b.create<vector::FMAOp>(loc, w, x[c], acc[u * nc + c]);
          }
        }
        for (int64_t u = 0; u < keys; ++u)
          for (int64_t c = 0; c < nc; ++c) {
            SmallVector<Value> ivs{slot, add(j, L.idx(u)), L.idx((c0 + c) * kLanes)};
            store(accumulate ? b.create<arith::AddFOp>(loc, load(dst, ivs), acc[u * nc + c]) : acc[u * nc + c],
                  dst, ivs);
          }
      }
    };
    auto range = [&](Value from, Value to, bool accumulate) {
      Value tiled = add(from, roundDown(b.create<arith::SubIOp>(loc, to, from), geo.gradKeys));
      loop(from, tiled, geo.gradKeys, {}, [&](Value j, ValueRange) {
        update(j, geo.gradKeys, accumulate);
        return SmallVector<Value>{};
      });
      loop(tiled, to, 1, {}, [&](Value j, ValueRange) {
        update(j, 1, accumulate);
        return SmallVector<Value>{};
      });
    };
    Value split = b.create<arith::MinSIOp>(loc, b.create<arith::MaxSIOp>(loc, fresh, lo), hi);
    range(lo, split, true);
    range(split, hi, false);
  }
};

/// What a task body reads its operands from: the ctx fields (i64 addresses and sizes) of a task function.
struct TaskFields {
  OpBuilder &b;
  Location loc;
  Value ctx;
  int64_t width; ///< D, the last dimension of the [entries, rows, D] operands

  Value field(int64_t i) { return taskField(b, loc, ctx, i); }
  Value index(Value i64) { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), i64); }
  Value c64(int64_t v) { return b.create<LLVM::ConstantOp>(loc, b.getI64Type(), b.getI64IntegerAttr(v)); }
  /// [entries, rows, D] f32 at field `address`.
  Value matrix(int64_t address, Value entries, Value rows) {
    auto type = MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic, width}, b.getF32Type());
    return memrefAt(b, loc, field(address), {entries, rows, c64(width)},
                    {b.create<LLVM::MulOp>(loc, rows, c64(width)), c64(width), c64(1)}, type);
  }
  /// [entries] i32 at field `address`.
  Value ints(int64_t address, Value entries) {
    return memrefAt(b, loc, field(address), {entries}, {c64(1)},
                    MemRefType::get({ShapedType::kDynamic}, b.getI32Type()));
  }
  /// The directional rows [entries, rows, width] i32 (rows from a field) at field `address`.
  Value directionalRows(int64_t address, Value entries, Value rows, int64_t width) {
    return memrefAt(b, loc, field(address), {entries, rows, c64(width)},
                    {b.create<LLVM::MulOp>(loc, rows, c64(width)), c64(width), c64(1)},
                    MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic, width}, b.getI32Type()));
  }
  /// A row-major [rows, cols] f32 table (a relative-position table) at field `address`.
  Value table(int64_t address, int64_t rows, int64_t cols) {
    return memrefAt(b, loc, field(address), {c64(rows), c64(cols)}, {c64(cols), c64(1)},
                    MemRefType::get({rows, cols}, b.getF32Type()));
  }
};

/// The task function `name` over items [begin, end) (its arguments: ctx, begin, end), made on first use:
/// `body(fields, begin, end)` emits the items (it may point L.lengths at the task's lengths buffer; the kernel's
/// is restored after).
func::FuncOp getOrCreateTask(Operation *op, Loops &L, StringRef name, int64_t width,
                             const std::function<void(TaskFields &, Value, Value)> &body);

/// The scale's bits in hexadecimal, for task names.
uint32_t bitsOf(float scale);

/// Runs a vector form's (entry, head) items: split over the runtime's threads by `task()` when every operand is a
/// whole buffer (ctx: `addresses`, then B, query rows, keys) and the call has work enough to pay for it (at batch 1
/// the heads of one sentence would otherwise run on one core while the GEMMs around them use every core), else
/// inline by `emit(begin, end)`.
void runItems(Loops &L, ArrayRef<Value> operands, int64_t heads, int64_t width, Value rows, Value keys,
              ArrayRef<Value> addresses, const std::function<func::FuncOp()> &task,
              const std::function<void(Value, Value)> &emit);

/// The address of a buffer that may be absent (0 then).
Value addressOrZero(Loops &L, Value m);

/// The width 1 + W of an op's directional rows (its mask data), or 0 without them.
int64_t maskRowsWidth(Value maskData);

/// The row count N of directional rows [entries, N, 1 + W] as i64 (0 without them): a task field.
Value maskRowCount(Loops &L, Value maskRows);

/// Whether a call reading and writing `rowBuffers` [entries, rows, width] and `keyBuffers` [entries, keys, width]
/// f32 operands streams them from beyond the private caches of the threads it runs on
/// (lm_rt_private_cache_bytes): only then do its items prefetch their successor's operands. Below, the operands
/// stay in those caches from call to call (or from the projections that wrote them), and the prefetches cost
/// 2-4% of a batch-1 call for nothing (kernel_bench, causal n = 80).
Value streamsOperands(Loops &L, Value entries, Value rows, Value keys, int64_t width, int64_t rowBuffers,
                      int64_t keyBuffers);

} // namespace lmcc::codegen::attention

#endif // LMCC_CODEGEN_LMTOLOOPS_ATTENTIONVECTOR_H
