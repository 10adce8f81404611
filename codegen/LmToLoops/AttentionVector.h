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
  /// The 512-bit score groups: a tile's first block whose lower 8 keys no row of it sees, and its last block whose
  /// upper 8 keys none sees, go on steps of their own at 8 lanes (VectorKernel::products). Worth it where a 256-bit
  /// FMA costs half a 512-bit one (targets that split 512-bit operations: targetSplitsWideVectors); elsewhere such
  /// a block costs as much as a full one in a group. The 256-bit geometry's one-block steps always take half blocks.
  bool halfBlocks = false;
  /// 256-bit: the keys' (and the backward's values') 16 x 16 blocks are transposed as four 8 x 8 blocks of
  /// 8-lane shuffles that are each one AVX instruction (unpcklps / unpckhps, shufps, a 128-bit lane move: 24 an
  /// 8 x 8 block). LLVM lowered the 16-lane interleaves of the 512-bit transpose to ~900 instructions a block on
  /// AVX2 (11.6% of the causal forward's samples at n 128 on a Zen 3). The same moves of the same floats.
  bool eightLaneTranspose = false;
  /// 512-bit (32 registers): 8 rows x 2 blocks of scores (16 accumulators), p.v 4 rows x 4 vectors (16), dK / dV
  /// 4 keys x 4 vectors (16). 256-bit (16 registers, two per vector): 4 rows x 1 block, 4 rows x 1 vector, 4 keys
  /// x 1 vector (8 registers of accumulators each, the 8 independent FMA chains two ports of latency 4 need).
  static Geometry forTarget(int64_t bits, bool halfBlocks);
  /// Whether an 8-lane vector operation costs half a 16-lane one: on 256-bit targets (a 16-lane operation is two)
  /// and on 512-bit ones that split them (halfBlocks).
  bool halfVectorsCheaper() const { return halfBlocks || eightLaneTranspose; }
};
constexpr Geometry kWideGeometry{8, 2, 4, 4, 4}, kNarrowGeometry{4, 1, 4, 1, 4};
// The backward's dq tiles (AttentionGrad.cpp) take pvRows rows at a time and the score groups scoreRows: both
// split a tile's rows evenly.
static_assert(kTileRows % kWideGeometry.pvRows == 0 && kTileRows % kNarrowGeometry.pvRows == 0 &&
              kTileRows % kWideGeometry.scoreRows == 0 && kTileRows % kNarrowGeometry.scoreRows == 0);
inline Geometry Geometry::forTarget(int64_t bits, bool halfBlocks) {
  Geometry g = bits >= 512 ? kWideGeometry : kNarrowGeometry;
  g.halfBlocks = bits >= 512 && halfBlocks;
  g.eightLaneTranspose = bits < 512;
  return g;
}

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
        geo(Geometry::forTarget(L.context.tile.lanes * 32, L.context.halfBlocks)), vt(VectorType::get({kLanes}, L.f32())),
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
  SmallVector<Value> scratchViews(ArrayRef<SmallVector<int64_t>> shapes, ValueRange dyn);
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
                  const std::function<SmallVector<Value>(Value, ValueRange)> &body);

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

  /// t (transposedScratch) = features base..base+dh of src[bi, 0..M) transposed, zeros from M: blocks of 16 rows x
  /// 16 features transposed in registers (by four rounds of 16-lane interleaves, or with geo.eightLaneTranspose as
  /// four 8 x 8 blocks: transposeBlock8), the last M mod 16 rows a block whose rows from M are zeros.
  void transpose(Value src, Value bi, Value base, Value M, Value M16, Value t);
  /// The transpose of 8 vectors of 8 floats (rows[r] lane c -> result[c] lane r) in 24 two-input shuffles whose
  /// masks are those of single AVX instructions: unpcklps / unpckhps, shufps, and the 128-bit lane selects.
  SmallVector<Value> transposeBlock8(ArrayRef<Value> rows);

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
                    ArrayRef<Value> keyReads);

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
                         ArrayRef<Value> keyReads);

  /// Tile rows r0..r0+R (clamped to lastRow) of entry bi and their key ranges over keys [0, len): causal
  /// [0, min(len, i + 1)), anticausal [i, len), else [0, len); under the directional mask by the row's direction
  /// (R as causal, L as anticausal, S [0, len) less its own and the hidden keys (storeScores), skip none: [i, i)).
  /// With `rowLimit` (the backward) rows from rowLimit on are repeats that see no key (an empty range at row 0's
  /// start, so that the union stays the real rows').
  /// With `order` (directional mask, directionOrder's), tile slot s holds row order[s] instead of row s.
  Tile tileRows(Value bi, Value r0, int64_t R, Value lastRow, Value len, Value queryPositions, Value rowLimit,
                Value order = Value());

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
  void directionOrder(Value bi, Value rows, Value order);

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
  /// row, 4 partial chains per row when the tile has fewer than 4 rows), handed to use(jb, first, products) (first:
  /// the group's first row), each step's blocks in order. With geo.scoreBlocks * (scoreRows / rows) > 1 blocks a
  /// step (512 bits, 4 or more rows) every block is 16 keys wide and the blocks left after the groups go in one step,
  /// with the last group when they are at most half a group; otherwise one block a step, and a block whose lower
  /// (upper) half no row sees (the first block of an anticausal tile, the last of a causal one: 16-key blocks over
  /// 8-row tiles) is computed 8 lanes wide, its other half 0.
  void products(Value a, Value bi, Value base, const Tile &tile, Value t,
                const std::function<void(Value, int64_t, ArrayRef<Value>)> &use);

  /// The tile's scores into S: (a_r . t[:, j] [+ the relative term of PQ (relativeProducts), clip c]) * scale, the
  /// lanes a row cannot see -inf (storeScores); a = q and t = k^T for the scores of either form.
  void scores(Value a, Value bi, Value base, const Tile &tile, Value t, Value scale, Value PQ, int64_t clip, Value M16,
              Value S);

  /// S[first + r, jb..jb+16) = s[r] for the rows of s, -inf in the lanes row first + r cannot see (outside its
  /// range, its own key under the diagonal mask, an S row's own and hidden keys under the directional one), tested
  /// only when the block is not fully visible to every row of the tile.
  void storeScores(Value S, Value jb, int64_t first, ArrayRef<Value> s, const Tile &t);

  /// max(x, y) lane-wise as x86's maxps (no NaN test: a NaN score still reaches the output through its exp).
  Value greater(Value x, Value y) { return emitGreater(b, loc, x, y); }

  /// The sum (add) or the max (greater) of two vectors, as the lane reductions below combine them.
  std::function<Value(Value, Value)> combiner(bool sum);

  /// Every lane the max (`sum` false) or the sum of x's lanes: a butterfly of 4 lane swaps. Its sums add in pairs
  /// in one fixed order (every lane gets the same bits); the max is exact.
  Value allLanes(Value x, bool sum);

  /// allLanes of every x of xs at once, each then `then` lane-wise (when given), each broadcast
  /// (emitAcrossLanesOfEach: the same bits, 8 rows in 23 operations instead of 64, `then` once for 16 rows).
  SmallVector<Value> acrossRows(ArrayRef<Value> xs, bool sum, const std::function<Value(Value)> &then = {});

  /// e^x lane-wise: emitVectorExp (Lowering.h).
  Value expOf(Value x);

  /// Softmax numerators in place over S's blocks [from16, to): m_r = max_j S[r, j], p = e^(S - m_r) (0 where
  /// -inf; m = 0 for a row that sees no key); returns the R lane-wise sums of p (lanes by j mod 16, blocks in
  /// order). Rows go in groups of geo.scoreRows (each row's max and sum are its own).
  SmallVector<Value> exponentiate(Value S, int64_t R, Value from16, Value to);

  /// Per row 1 / l for the lane-wise sums l of the row's numerators (0 when the row saw no key), broadcast.
  SmallVector<Value> inverses(ArrayRef<Value> sums) {
    return acrossRows(sums, /*sum=*/true, [&](Value l) {
      Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, zeroV);
      return b.create<arith::SelectOp>(loc, seen, b.create<arith::DivFOp>(loc, bcast(L.f32c(1)), l), zeroV);
    });
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
                          Value hi);

  /// weightedRows for S rows r0..r0+n of the directional mask (n = pos.size(), their positions; entry bi, keys
  /// [0, len)): acc[r * nc + c] = sum_j W[r0 + r, j] * row j's feature vector c0 + c of `packed` over the keys one
  /// of the rows sees, in key order, found 32 keys at a time from the rows' hidden-key words (bits cleared from len
  /// on and at each row's own key, the rows' visible bits or-ed) by counting trailing zeros. A key skipped has
  /// W = 0 exactly for every row, and so does a key another row of the group sees, so every lane is the same chain
  /// of FMAs as weightedRows' over all of [0, len): the same bits, for the work of the keys the group sees (an S
  /// row hides a random subset). Two rows a group: 8 FMA chains where one row has 4 (a single row's loop waited on
  /// the FMA latency), each value vector loaded once for both, over about 3/4 of the keys where the two rows
  /// apart visited 2 x 1/2. (Values are finite in a model; a non-finite value of a key no row of the group sees,
  /// which 0 * v turned into NaN, is not read.)
  SmallVector<Value> visibleWeightedRows(Value W, int64_t r0, ArrayRef<Value> pos, Value bi, Value len, Value packed,
                                         Value M16, int64_t c0, int64_t nc);

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
                        Value PQ);

  /// The relative scores of row r (position pos) for keys jb..jb+16 (relativeProducts' PQ).
  Value relativeBlock(Value PQ, int64_t r, Value pos, Value jb, int64_t clip, Value M16) {
    return load(PQ, ValueRange{L.idx(r), add(b.create<arith::SubIOp>(loc, jb, pos), add(M16, L.idx(clip)))});
  }

  /// Wt[r, t] = sum of W[r, j] over the keys j of [from16, to16) with t(pos_r, j) = t, for the table rows t of
  /// tableRows (W is 0 on the keys row r does not see): the interior t = 1..T-2 is one key each (masked loads of
  /// W's row), t = 0 and T - 1 the sums of W over j <= pos - c and j >= pos + c.
  void relativeWeights(Value W, ArrayRef<Value> pos, Value from16, Value to16, int64_t clip, Value Wt);

  /// acc[r * nc + c] += sum_t Wt[r0 + r, t] * table[t, (c0 + c) 16..] over the table rows t of tableRows: nr rows,
  /// nc feature vectors.
  SmallVector<Value> relativeRows(Value Wt, int64_t r0, int64_t nr, Value table, int64_t clip, int64_t c0,
                                  int64_t nc, ValueRange acc);

  /// dst[slot, j] (+)= sum_r W[r, j] * src[bi, row_r] over the head's features (dst: [2, keys, dh] scratch) for
  /// keys j of [lo, hi): added to below `fresh`, stored from it (keys no earlier tile touched: no zeroing pass
  /// over dst); tiles of geo.gradKeys keys (then single keys) x geo.pvChunks feature vectors, the tile's rows in order.
  void keyUpdates(Value W, Value src, ArrayRef<Value> row, Value dst, Value slot, Value bi, Value base, Value lo,
                  Value hi, Value fresh);
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
