//===- Attention.cpp - lm-to-loops: fused attention -------------------------===//
//
// lm.attention as a key-tiled online softmax with the mask as structure, and a vector form for head sizes
// that are multiples of 16 (no relative positions); the vector form of its VJP, lm.attention_grad.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>

using namespace mlir;

namespace lmcc::codegen {
namespace {

constexpr int64_t kLanes = 16;   ///< f32 lanes of a 512-bit vector
constexpr int64_t kTileRows = 8; ///< query rows per score tile (one key vector load feeds kTileRows FMAs)
constexpr int64_t kPvRows = 4;   ///< query rows per p.v tile (kPvRows x 4 feature vectors of accumulators)
constexpr int64_t kPvChunks = 4; ///< feature vectors (of 16) per p.v tile
constexpr int64_t kGradKeys = 4; ///< keys per dK / dV tile of the backward (kGradKeys x 4 feature vectors)

/// vector.shuffle masks interleaving the low (high) halves of two 16-lane vectors.
SmallVector<int64_t> interleaveMask(bool high) {
  SmallVector<int64_t> mask;
  for (int64_t l = 0; l < kLanes / 2; ++l) {
    mask.push_back(l + (high ? kLanes / 2 : 0));
    mask.push_back(l + (high ? kLanes / 2 : 0) + kLanes);
  }
  return mask;
}

/// The rows of one tile of R query rows and the keys they see (the last tile repeats its last row).
struct Tile {
  SmallVector<Value> row, pos, lo, hi; ///< per row: the row, its position, its key range [lo, hi)
  SmallVector<Value> valid;            ///< per row (backward only): whether the row is a real one, not a repeat
  Value from, to, from16;              ///< the union of the rows' ranges, its start rounded down to 16
  Value allLo, allHi;                  ///< every row of the tile sees [allLo, allHi) (but its own key if diagonal)
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
  VectorType vt, it;
  Value negInf, negInfV, zeroV, iota;

  VectorKernel(Loops &L, int64_t dh, lm::MaskKind mask)
      : L(L), b(L.b), loc(L.loc), dh(dh), chunks(dh / kLanes), mask(mask), vt(VectorType::get({kLanes}, L.f32())),
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
  Value load(Value m, ValueRange ivs) { return b.create<vector::LoadOp>(loc, vt, m, ivs); }
  void store(Value x, Value m, ValueRange ivs) { b.create<vector::StoreOp>(loc, x, m, ivs); }
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

  /// t [dh, M16] = features base..base+dh of src[bi, 0..M) transposed, zeros from M: full blocks of 16 rows x 16
  /// features transposed in registers by four rounds of interleaves, the rest element by element.
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
        for (int64_t e = 0; e < kLanes; ++e)
          store(rowsV[e], t, ValueRange{add(e0, L.idx(e)), j0});
        return SmallVector<Value>{};
      });
      return SmallVector<Value>{};
    });
    loop(fullKeys, M16, 1, {}, [&](Value j, ValueRange) {
      Value real = L.lt(j, M);
      L.nest({L.idx(dh)}, [&](ValueRange e) {
        Value x = L.choose(real, L.f32(), [&] { return L.load(src, {bi, j, add(base, e[0])}); },
                           [&] { return L.f32c(0); });
        L.store(x, t, {e[0], j});
      });
      return SmallVector<Value>{};
    });
  }

  /// While tile t of `tiles` (rows r0..r0+R) computes, the next item's (entry nextEntry, features from nextBase)
  /// rows r0..r0+R of the row-major operands and keys r0..r0+R of the key-major ones (after the last tile every
  /// remaining row and key) move to L2: at batch > 1 the kernels stream their operands from memory, and the
  /// prefetches spread over the tiles keep that off the critical path.
  void prefetchNext(Value hasNext, Value nextEntry, Value nextBase, Value t, Value tiles, Value r0, int64_t R,
                    Value rows, Value M, ArrayRef<Value> rowReads, ArrayRef<Value> rowWrites,
                    ArrayRef<Value> keyReads, ArrayRef<Value> keyWrites) {
    L.when(hasNext, [&] {
      auto prefetch = [&](Value buffer, Value from, Value to, bool write) {
        L.nest({b.create<arith::SubIOp>(loc, to, from), L.idx(chunks)}, [&](ValueRange jc) {
          Value j = add(from, jc[0]);
          Value e = add(nextBase, b.create<arith::MulIOp>(loc, jc[1], L.idx(kLanes)));
          b.create<memref::PrefetchOp>(loc, buffer, ValueRange{nextEntry, j, e}, write, /*localityHint=*/2,
                                       /*isDataCache=*/true);
        });
      };
      Value r1 = add(r0, L.idx(R));
      Value last = L.eqI(t, b.create<arith::SubIOp>(loc, tiles, L.idx(1)));
      Value rowsFrom = b.create<arith::MinSIOp>(loc, r0, rows);
      Value rowsTo = L.select(last, rows, b.create<arith::MinSIOp>(loc, r1, rows));
      Value keysFrom = b.create<arith::MinSIOp>(loc, r0, M);
      Value keysTo = L.select(last, M, b.create<arith::MinSIOp>(loc, r1, M));
      for (Value buffer : keyReads)
        prefetch(buffer, keysFrom, keysTo, false);
      for (Value buffer : keyWrites)
        prefetch(buffer, keysFrom, keysTo, true);
      for (Value buffer : rowReads)
        prefetch(buffer, rowsFrom, rowsTo, false);
      for (Value buffer : rowWrites)
        prefetch(buffer, rowsFrom, rowsTo, true);
    });
  }

  /// Tile rows r0..r0+R (clamped to lastRow) of entry bi and their key ranges over keys [0, len): causal
  /// [0, min(len, i + 1)), anticausal [i, len), else [0, len). With `rowLimit` (the backward) rows from rowLimit on
  /// are repeats that see no key (an empty range at row 0's start, so that the union stays the real rows').
  Tile tileRows(Value bi, Value r0, int64_t R, Value lastRow, Value len, Value queryPositions, Value rowLimit) {
    Tile t;
    for (int64_t r = 0; r < R; ++r) {
      Value at = add(r0, L.idx(r));
      t.row.push_back(b.create<arith::MinSIOp>(loc, at, lastRow));
      t.pos.push_back(queryPositions ? L.toIndex(L.load(queryPositions, bi)) : t.row[r]);
      Value lo = mask == lm::MaskKind::anticausal ? t.pos[r] : L.idx(0);
      Value hi = mask == lm::MaskKind::causal
                     ? Value(b.create<arith::MinSIOp>(loc, len, add(t.pos[r], L.idx(1))))
                     : len;
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

  /// The union of the key ranges of rows first..first+count of the tile.
  std::pair<Value, Value> unionRange(const Tile &t, int64_t first, int64_t count) {
    Value l = t.lo[first], h = t.hi[first];
    for (int64_t r = first + 1; r < first + count; ++r) {
      l = b.create<arith::MinSIOp>(loc, l, t.lo[r]);
      h = b.create<arith::MaxSIOp>(loc, h, t.hi[r]);
    }
    return {l, h};
  }

  /// For each 16-key block jb of the tile's key range [from16, to): the row vectors
  /// sum_e a[bi, row_r, base + e] * t[e, jb..jb+16) (R accumulators, 4 partial chains per row when R = 1), handed
  /// to use(jb, products). A block whose lower (upper) half no row sees (the first block of an anticausal tile,
  /// the last of a causal one: 16-key blocks over 8-row tiles) is computed 8 lanes wide, its other half 0.
  void products(Value a, Value bi, Value base, const Tile &tile, Value t,
                const std::function<void(Value, ArrayRef<Value>)> &use) {
    ArrayRef<Value> row = tile.row;
    const int64_t R = row.size(), chains = R >= 4 ? 1 : 4;
    auto block = [&](Value jb, int64_t width, int64_t offset) {
      auto type = VectorType::get({width}, L.f32());
      Value zero = b.create<vector::BroadcastOp>(loc, type, L.f32c(0));
      Value from = add(jb, L.idx(offset));
      SmallVector<Value> zeros(R * chains, zero);
      auto dot = loop(L.idx(0), L.idx(dh), 4, zeros, [&](Value e0, ValueRange acc) {
        SmallVector<Value> next(acc.begin(), acc.end());
        for (int64_t u = 0; u < 4; ++u) {
          Value e = add(e0, L.idx(u));
          Value kv = b.create<vector::LoadOp>(loc, type, t, ValueRange{e, from});
          for (int64_t r = 0; r < R; ++r) {
            Value qe = b.create<vector::BroadcastOp>(loc, type, L.load(a, {bi, row[r], add(base, e)}));
            int64_t slot = r * chains + u % chains;
            next[slot] = b.create<vector::FMAOp>(loc, qe, kv, next[slot]);
          }
        }
        return next;
      });
      SmallVector<Value> s(R);
      for (int64_t r = 0; r < R; ++r) {
        s[r] = dot.getResult(r * chains);
        if (chains == 4)
          s[r] = b.create<arith::AddFOp>(
              loc, b.create<arith::AddFOp>(loc, s[r], dot.getResult(r * chains + 1)),
              b.create<arith::AddFOp>(loc, dot.getResult(r * chains + 2), dot.getResult(r * chains + 3)));
        if (width < kLanes)
          s[r] = b.create<vector::InsertStridedSliceOp>(loc, s[r], zeroV, ArrayRef<int64_t>{offset},
                                                        ArrayRef<int64_t>{1});
      }
      use(jb, s);
    };
    const int64_t half = kLanes / 2;
    // The first block's lower half unseen: its upper half alone, the full blocks from the next.
    Value headHalf = L.andI(L.ge(b.create<arith::SubIOp>(loc, tile.from, tile.from16), L.idx(half)),
                            L.lt(tile.from, tile.to));
    L.when(headHalf, [&] { block(tile.from16, half, half); });
    Value first = L.select(headHalf, add(tile.from16, L.idx(kLanes)), tile.from16);
    // The last block's upper half unseen (1..8 keys past the full blocks): its lower half alone.
    Value span = b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, tile.to, first), L.idx(0));
    Value fullEnd = add(first, roundDown(span));
    Value rest = b.create<arith::SubIOp>(loc, add(first, span), fullEnd);
    Value tailHalf = L.andI(L.lt(L.idx(0), rest), L.le(rest, L.idx(half)));
    Value end = L.select(L.lt(L.idx(half), rest), add(fullEnd, L.idx(kLanes)), fullEnd);
    loop(first, end, kLanes, {}, [&](Value jb, ValueRange) {
      block(jb, kLanes, 0);
      return SmallVector<Value>{};
    });
    L.when(tailHalf, [&] { block(fullEnd, half, 0); });
  }

  /// S[r, jb..jb+16) = s[r], -inf in the lanes row r cannot see (outside its range, or its own key under the
  /// diagonal mask), tested only when the block is not fully visible to every row of the tile.
  void storeScores(Value S, Value jb, ArrayRef<Value> s, const Tile &t) {
    const int64_t R = s.size();
    Value jEnd = add(jb, L.idx(kLanes));
    Value full = L.andI(L.ge(jb, t.allLo), L.le(jEnd, t.allHi));
    if (mask == lm::MaskKind::diagonal) // rows' own keys pos[0]..pos[R-1] (contiguous) miss the block
      full = L.andI(full, L.orI(L.ge(t.pos[0], jEnd), L.lt(t.pos[R - 1], jb)));
    auto test = b.create<scf::IfOp>(loc, full, /*withElse=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(test.thenBlock());
    for (int64_t r = 0; r < R; ++r)
      store(s[r], S, ValueRange{L.idx(r), jb});
    b.setInsertionPointToStart(test.elseBlock());
    Value j = add(bcast(jb), iota);
    for (int64_t r = 0; r < R; ++r) {
      Value visible = L.andI(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(t.lo[r])),
                             b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, bcast(t.hi[r])));
      if (mask == lm::MaskKind::diagonal)
        visible = L.andI(visible, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, bcast(t.pos[r])));
      store(L.select(visible, s[r], negInfV), S, ValueRange{L.idx(r), jb});
    }
  }

  /// Softmax numerators in place over S's blocks [from16, to): m_r = max_j S[r, j], p = e^(S - m_r) (0 where
  /// -inf; m = 0 for a row that sees no key); returns the R lane-wise sums of p (lanes by j mod 16, blocks in
  /// order).
  SmallVector<Value> exponentiate(Value S, int64_t R, Value from16, Value to) {
    SmallVector<Value> ninf(R, negInfV);
    auto maxima = loop(from16, to, kLanes, ninf, [&](Value jb, ValueRange mx) {
      SmallVector<Value> next;
      for (int64_t r = 0; r < R; ++r)
        next.push_back(b.create<arith::MaximumFOp>(loc, mx[r], load(S, ValueRange{L.idx(r), jb})));
      return next;
    });
    SmallVector<Value> mV(R);
    for (int64_t r = 0; r < R; ++r) {
      Value m = b.create<vector::ReductionOp>(loc, vector::CombiningKind::MAXIMUMF, maxima.getResult(r));
      m = L.select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, m, negInf), m, L.f32c(0));
      mV[r] = bcast(m);
    }
    SmallVector<Value> zerosR(R, zeroV);
    auto sums = loop(from16, to, kLanes, zerosR, [&](Value jb, ValueRange acc) {
      SmallVector<Value> next;
      for (int64_t r = 0; r < R; ++r) {
        Value p = b.create<math::ExpOp>(
            loc, b.create<arith::SubFOp>(loc, load(S, ValueRange{L.idx(r), jb}), mV[r]));
        store(p, S, ValueRange{L.idx(r), jb});
        next.push_back(b.create<arith::AddFOp>(loc, acc[r], p));
      }
      return next;
    });
    return SmallVector<Value>(sums.getResults());
  }

  /// 1 / l for the lane-wise sums l of a row's numerators (0 when the row saw no key), broadcast.
  Value inverse(Value sums) {
    Value l = b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, sums);
    Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, L.f32c(0));
    return bcast(L.select(seen, b.create<arith::DivFOp>(loc, L.f32c(1), l), L.f32c(0)));
  }

  /// acc[r * nc + c] = sum_{j in [lo, hi)} W[r0 + r, j] * src[bi, j, base + (c0 + c) 16] for nr rows and nc
  /// feature vectors: one src vector load per nr FMAs (W = 0 adds exactly nothing).
  scf::ForOp weightedRows(Value W, int64_t r0, int64_t nr, Value src, Value bi, Value base, int64_t c0, int64_t nc,
                          Value lo, Value hi) {
    SmallVector<Value> zeros(nr * nc, zeroV);
    return loop(lo, hi, 1, zeros, [&](Value j, ValueRange a) {
      SmallVector<Value> next(a.begin(), a.end());
      SmallVector<Value> vj;
      for (int64_t c = 0; c < nc; ++c)
        vj.push_back(load(src, ValueRange{bi, j, chunk(base, c0 + c)}));
      for (int64_t r = 0; r < nr; ++r) {
        Value p = bcast(L.load(W, {L.idx(r0 + r), j}));
        for (int64_t c = 0; c < nc; ++c)
          next[r * nc + c] = b.create<vector::FMAOp>(loc, p, vj[c], next[r * nc + c]);
      }
      return next;
    });
  }

  /// dst[bi, j] (+)= sum_r W[r, j] * src[bi, row_r] over the head's features for keys j of [lo, hi): added to
  /// below `fresh`, stored from it (keys no earlier tile touched: no zeroing pass over dst); tiles of kGradKeys
  /// keys (then single keys) x 4 feature vectors, the tile's rows in order.
  void keyUpdates(Value W, Value src, ArrayRef<Value> row, Value dst, Value bi, Value base, Value lo, Value hi,
                  Value fresh) {
    const int64_t R = row.size();
    auto update = [&](Value j, int64_t keys, bool accumulate) {
      for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks) {
        int64_t nc = std::min(kPvChunks, chunks - c0);
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
            SmallVector<Value> ivs{bi, add(j, L.idx(u)), chunk(base, c0 + c)};
            store(accumulate ? b.create<arith::AddFOp>(loc, load(dst, ivs), acc[u * nc + c]) : acc[u * nc + c],
                  dst, ivs);
          }
      }
    };
    auto range = [&](Value from, Value to, bool accumulate) {
      Value tiled = add(from, roundDown(b.create<arith::SubIOp>(loc, to, from), kGradKeys));
      loop(from, tiled, kGradKeys, {}, [&](Value j, ValueRange) {
        update(j, kGradKeys, accumulate);
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

/// The buffers of one vector-form attention, and its entry count B.
struct VectorOperands {
  Value q, k, v, out, queryPositions, entries;
};

/// lm.attention with vectors (no relative positions, no per-row mask data; head size a multiple of 16),
/// register-tiled like the GEMM.
/// Work items are the (entry, head) pairs, entry-major; items [begin, end) run here. Per item the head's keys
/// are transposed into kt [dh, M16] (M keys rounded up to 16, zero tail). Query rows go in tiles of R = 8 rows
/// (R = 1 for single-query entries, lm-prune-rows), the last tile repeating the last row; a tile visits the
/// union of its rows' key ranges [lo, hi) (each row's range as in the scalar form below):
///   scores  S[r, j..j+16) = (sum_e q_re * kt[e, j..j+16)) * scale: one key vector load per R FMAs; lanes a row
///           cannot see are -inf, tested only in blocks that are not fully visible to every row of the tile;
///   softmax m_r = max_j S[r, j], p = e^(S - m_r) (vector exp; 0 where -inf), l_r = sum_j p (lanes by j mod 16,
///           blocks in order: the zero blocks outside a row's range change nothing, so a row's result does not
///           depend on its tile);
///   p.v     out_r = (sum_j p_rj v_j) / l_r over the tile's rows in groups of 4 x 64 features, one value
///           vector load per 4 FMAs (p_rj = 0 adds exactly nothing); zero when a row sees no key.
void emitVectorItems(lm::AttentionOp a, Loops &L, const VectorOperands &ops, Value begin, Value end) {
  auto &b = L.b;
  Location loc = L.loc;
  Value q = ops.q, k = ops.k, v = ops.v, out = ops.out;
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, chunks = dh / kLanes;
  VectorKernel K(L, dh, a.getMask());
  Value scale = K.bcast(L.f32c(a.getScale().convertToFloat()));
  Value M = b.create<memref::DimOp>(loc, k, 1);
  Value M16 = K.roundDown(K.add(M, L.idx(kLanes - 1)));
  Value queryPositions = ops.queryPositions;
  const int64_t R = queryPositions ? 1 : kTileRows;
  Value kt = K.scratch({dh, ShapedType::kDynamic}, M16), S = K.scratch({R, ShapedType::kDynamic}, M16);
  Value rows = queryPositions ? L.idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
  Value tiles = b.create<arith::DivUIOp>(loc, K.add(rows, L.idx(R - 1)), L.idx(R));

  Value items = b.create<arith::MulIOp>(loc, ops.entries, L.idx(H));
  K.loop(begin, end, 1, {}, [&](Value item, ValueRange) {
    Value bi = b.create<arith::DivUIOp>(loc, item, L.idx(H));
    Value base = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, item, L.idx(H)), L.idx(dh));
    K.transpose(k, bi, base, M, M16, kt);

    Value len = L.lengthOf(bi);
    Value lastRow = b.create<arith::SubIOp>(loc, rows, L.idx(1));
    Value nextItem = K.add(item, L.idx(1));
    Value hasNext = L.lt(nextItem, items);
    Value nextEntry = b.create<arith::DivUIOp>(loc, nextItem, L.idx(H));
    Value nextBase = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, nextItem, L.idx(H)), L.idx(dh));
    L.nest({tiles}, [&](ValueRange t) {
      Value r0 = b.create<arith::MulIOp>(loc, t[0], L.idx(R));
      K.prefetchNext(hasNext, nextEntry, nextBase, t[0], tiles, r0, R, rows, M, {q}, {out}, {k, v}, {});
      Tile tile = K.tileRows(bi, r0, R, lastRow, len, queryPositions, Value());
      K.products(q, bi, base, tile, kt, [&](Value jb, ArrayRef<Value> dots) {
        SmallVector<Value> s;
        for (Value d : dots)
          s.push_back(b.create<arith::MulFOp>(loc, d, scale));
        K.storeScores(S, jb, s, tile);
      });
      SmallVector<Value> sums = K.exponentiate(S, R, tile.from16, tile.to);
      // p.v in tiles of kPvRows rows x kPvChunks feature vectors over the group's key range.
      for (int64_t r0g = 0; r0g < R; r0g += kPvRows) {
        int64_t nr = std::min(kPvRows, R - r0g);
        auto [gLo, gHi] = K.unionRange(tile, r0g, nr);
        SmallVector<Value> inv(nr);
        for (int64_t r = 0; r < nr; ++r)
          inv[r] = K.inverse(sums[r0g + r]);
        for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks) {
          int64_t nc = std::min(kPvChunks, chunks - c0);
          auto acc = K.weightedRows(S, r0g, nr, v, bi, base, c0, nc, gLo, gHi);
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = 0; c < nc; ++c)
              K.store(b.create<arith::MulFOp>(loc, acc.getResult(r * nc + c), inv[r]), out,
                      ValueRange{bi, tile.row[r0g + r], K.chunk(base, c0 + c)});
        }
      }
    });
    return SmallVector<Value>{};
  });
}

/// The buffers of one vector-form attention backward, its query lengths (or null: the keys') and entry count.
struct GradOperands {
  Value dO, q, k, v, dq, dk, dv, queryLengths, entries;
};

/// lm.attention_grad in the vector form (the forward's conditions, a mask of none, causal, anticausal or
/// diagonal), per (entry, head) item [begin, end): n = min(query length, rows) differentiated rows, m = min(length,
/// keys) keys; dq of rows n.. zeroed; keys and values transposed (kt, vt); then per tile of R = 8 rows (rows past
/// n repeat row n - 1 and see no key):
///   P   = the forward's probabilities, recomputed as it computes them (scores, exp, 1 / l),
///   dP  = dO_r . v_j as the scores (one vt vector load per R FMAs),
///   D_r = sum_j P_rj dP_rj, dS = P (dP - D) scale (0 where P is),
///   dq_r = sum_j dS_rj k_j (as the forward's p.v; stored for real rows only),
///   dk_j += sum_r dS_rj q_r, dv_j += sum_r P_rj dO_r over the tile's keys (4 keys x 64 features a tile; stored,
///        not added, for keys no earlier tile touched: the touched keys are a prefix [0, touched) under every
///        mask here, carried over the tiles), and after the tiles dk, dv of the keys none touched zeroed;
/// the next item's operands are prefetched over the tiles as in the forward.
/// Every output of an item is written by that item alone, in a fixed order: the same bits for any thread count.
void emitVectorGradItems(lm::AttentionGradOp a, Loops &L, const GradOperands &ops, Value begin, Value end) {
  auto &b = L.b;
  Location loc = L.loc;
  int64_t D = llvm::cast<ShapedType>(a.getQuery().getType()).getDimSize(2), H = a.getHeads(), dh = D / H;
  int64_t chunks = dh / kLanes;
  VectorKernel K(L, dh, a.getMask());
  Value scale = K.bcast(L.f32c(a.getScale().convertToFloat()));
  Value M = b.create<memref::DimOp>(loc, ops.k, 1);
  Value M16 = K.roundDown(K.add(M, L.idx(kLanes - 1)));
  const int64_t R = kTileRows;
  int64_t dyn = ShapedType::kDynamic;
  Value kt = K.scratch({dh, dyn}, M16), vt = K.scratch({dh, dyn}, M16);
  Value S = K.scratch({R, dyn}, M16), G = K.scratch({R, dyn}, M16);
  Value rows = b.create<memref::DimOp>(loc, ops.q, 1);
  Value items = b.create<arith::MulIOp>(loc, ops.entries, L.idx(H));

  K.loop(begin, end, 1, {}, [&](Value item, ValueRange) {
    Value bi = b.create<arith::DivUIOp>(loc, item, L.idx(H));
    Value base = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, item, L.idx(H)), L.idx(dh));
    Value len = L.lengthOf(bi);
    Value m = b.create<arith::MinSIOp>(loc, len, M);
    Value n = b.create<arith::MinSIOp>(loc, ops.queryLengths ? L.toIndex(L.load(ops.queryLengths, bi)) : len, rows);
    L.nest({b.create<arith::SubIOp>(loc, rows, n), L.idx(chunks)}, [&](ValueRange ic) {
      K.store(K.zeroV, ops.dq, ValueRange{bi, K.add(n, ic[0]), K.add(base, b.create<arith::MulIOp>(
                                                                              loc, ic[1], L.idx(kLanes)))});
    });
    K.transpose(ops.k, bi, base, M, M16, kt);
    K.transpose(ops.v, bi, base, M, M16, vt);
    Value tiles = b.create<arith::DivUIOp>(loc, K.add(n, L.idx(R - 1)), L.idx(R));
    Value lastRow = b.create<arith::SubIOp>(loc, n, L.idx(1));
    Value nextItem = K.add(item, L.idx(1));
    Value hasNext = L.lt(nextItem, items);
    Value nextEntry = b.create<arith::DivUIOp>(loc, nextItem, L.idx(H));
    Value nextBase = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, nextItem, L.idx(H)), L.idx(dh));
    // Carried over the tiles: the keys [0, touched) the tiles so far wrote into dk and dv.
    auto tileLoop = K.loop(L.idx(0), tiles, 1, ValueRange{L.idx(0)}, [&](Value t, ValueRange carried) {
      Value touched = carried[0];
      Value r0 = b.create<arith::MulIOp>(loc, t, L.idx(R));
      K.prefetchNext(hasNext, nextEntry, nextBase, t, tiles, r0, R, rows, M, {ops.q, ops.dO}, {ops.dq},
                     {ops.k, ops.v}, {ops.dk, ops.dv});
      Tile tile = K.tileRows(bi, r0, R, lastRow, m, Value(), n);
      K.products(ops.q, bi, base, tile, kt, [&](Value jb, ArrayRef<Value> dots) {
        SmallVector<Value> s;
        for (Value d : dots)
          s.push_back(b.create<arith::MulFOp>(loc, d, scale));
        K.storeScores(S, jb, s, tile);
      });
      SmallVector<Value> sums = K.exponentiate(S, R, tile.from16, tile.to);
      SmallVector<Value> inv;
      for (int64_t r = 0; r < R; ++r)
        inv.push_back(K.inverse(sums[r]));
      K.products(ops.dO, bi, base, tile, vt, [&](Value jb, ArrayRef<Value> dp) {
        for (int64_t r = 0; r < R; ++r)
          K.store(dp[r], G, ValueRange{L.idx(r), jb});
      });
      // P = p / l in place, and D_r = sum_j P_rj dP_rj.
      SmallVector<Value> zerosR(R, K.zeroV);
      auto dots = K.loop(tile.from16, tile.to, kLanes, zerosR, [&](Value jb, ValueRange acc) {
        SmallVector<Value> next;
        for (int64_t r = 0; r < R; ++r) {
          Value p = b.create<arith::MulFOp>(loc, K.load(S, ValueRange{L.idx(r), jb}), inv[r]);
          K.store(p, S, ValueRange{L.idx(r), jb});
          next.push_back(b.create<vector::FMAOp>(loc, p, K.load(G, ValueRange{L.idx(r), jb}), acc[r]));
        }
        return next;
      });
      SmallVector<Value> Dr;
      for (int64_t r = 0; r < R; ++r)
        Dr.push_back(K.bcast(b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, dots.getResult(r))));
      // dS = P (dP - D) scale in place of dP.
      K.loop(tile.from16, tile.to, kLanes, {}, [&](Value jb, ValueRange) {
        for (int64_t r = 0; r < R; ++r) {
          Value dp = b.create<arith::SubFOp>(loc, K.load(G, ValueRange{L.idx(r), jb}), Dr[r]);
          Value ds = b.create<arith::MulFOp>(
              loc, b.create<arith::MulFOp>(loc, K.load(S, ValueRange{L.idx(r), jb}), dp), scale);
          K.store(ds, G, ValueRange{L.idx(r), jb});
        }
        return SmallVector<Value>{};
      });
      // dq of the real rows, in tiles of kPvRows rows x kPvChunks feature vectors.
      for (int64_t r0g = 0; r0g < R; r0g += kPvRows) {
        auto [gLo, gHi] = K.unionRange(tile, r0g, kPvRows);
        for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks) {
          int64_t nc = std::min(kPvChunks, chunks - c0);
          auto acc = K.weightedRows(G, r0g, kPvRows, ops.k, bi, base, c0, nc, gLo, gHi);
          for (int64_t r = 0; r < kPvRows; ++r) {
            auto write = [&] {
              for (int64_t c = 0; c < nc; ++c)
                K.store(acc.getResult(r * nc + c), ops.dq, ValueRange{bi, tile.row[r0g + r], K.chunk(base, c0 + c)});
            };
            if (Value valid = tile.valid[r0g + r])
              L.when(valid, write);
            else
              write();
          }
        }
      }
      // From the tile's first key rounded down to 4 (the keys before it get nothing: 0 in P and dS).
      Value keysFrom = K.roundDown(tile.from, kGradKeys);
      K.keyUpdates(G, ops.q, tile.row, ops.dk, bi, base, keysFrom, tile.to, touched);
      K.keyUpdates(S, ops.dO, tile.row, ops.dv, bi, base, keysFrom, tile.to, touched);
      return SmallVector<Value>{b.create<arith::MaxSIOp>(loc, touched, tile.to)};
    });
    // Keys no tile saw (padding, and past the last row's under the causal mask) get 0.
    L.nest({b.create<arith::SubIOp>(loc, M, tileLoop.getResult(0)), L.idx(chunks)}, [&](ValueRange jc) {
      Value j = K.add(tileLoop.getResult(0), jc[0]);
      Value e = K.add(base, b.create<arith::MulIOp>(loc, jc[1], L.idx(kLanes)));
      K.store(K.zeroV, ops.dk, ValueRange{bi, j, e});
      K.store(K.zeroV, ops.dv, ValueRange{bi, j, e});
    });
    return SmallVector<Value>{};
  });
}

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
};

/// The task function `name` over items [begin, end) (its arguments: ctx, begin, end), made on first use:
/// `body(fields, begin, end)` emits the items (it may point L.lengths at the task's lengths buffer; the kernel's
/// is restored after).
func::FuncOp getOrCreateTask(Operation *op, Loops &L, StringRef name, int64_t width,
                             const std::function<void(TaskFields &, Value, Value)> &body) {
  auto module = op->getParentOfType<ModuleOp>();
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  auto &b = L.b;
  OpBuilder::InsertionGuard guard(b);
  func::FuncOp task = createTask(b, module, name);
  Block *entry = &task.getBody().front();
  b.setInsertionPointToStart(entry);
  TaskFields fields{b, L.loc, entry->getArgument(0), width};
  Value kernelLengths = L.lengths;
  body(fields, fields.index(entry->getArgument(1)), fields.index(entry->getArgument(2)));
  L.lengths = kernelLengths;
  b.create<func::ReturnOp>(L.loc);
  return task;
}

/// The scale's bits in hexadecimal, for task names.
uint32_t bitsOf(float scale) {
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  return bits;
}

/// The vector form's task: items [begin, end) of the operands whose addresses and sizes are in ctx (q, k, v,
/// out, lengths, query positions or 0, entries B, query rows, keys M). One per (mask, heads, width, scale).
func::FuncOp getOrCreateVectorTask(lm::AttentionOp a, Loops &L) {
  int64_t D = a.getType().getDimSize(2), H = a.getHeads();
  bool positions = bool(a.getQueryPositions());
  std::string name = llvm::formatv("lm_attention_task_{0}_h{1}_d{2}_s{3:x}{4}", lm::stringifyMaskKind(a.getMask()),
                                   H, D, bitsOf(a.getScale().convertToFloat()), positions ? "_positions" : "");
  return getOrCreateTask(a, L, name, D, [&](TaskFields &f, Value begin, Value end) {
    Value entries = f.field(6), rows = f.field(7), keys = f.field(8);
    VectorOperands ops{f.matrix(0, entries, rows), f.matrix(1, entries, keys), f.matrix(2, entries, keys),
                       f.matrix(3, entries, rows), positions ? f.ints(5, entries) : Value(), f.index(entries)};
    L.lengths = f.ints(4, entries);
    emitVectorItems(a, L, ops, begin, end);
  });
}

/// Runs a vector form's (entry, head) items: split over the runtime's threads by `task()` when every operand is a
/// whole buffer (ctx: `addresses`, then B, query rows, keys) and the call has work enough to pay for it (at batch 1
/// the heads of one sentence would otherwise run on one core while the GEMMs around them use every core), else
/// inline by `emit(begin, end)`.
void runItems(Loops &L, ArrayRef<Value> operands, int64_t heads, int64_t width, Value rows, Value keys,
              ArrayRef<Value> addresses, const std::function<func::FuncOp()> &task,
              const std::function<void(Value, Value)> &emit) {
  auto &b = L.b;
  Location loc = L.loc;
  Value items = b.create<arith::MulIOp>(loc, L.B, L.idx(heads));
  auto whole = [](Value m) { return !m || llvm::cast<MemRefType>(m.getType()).getLayout().isIdentity(); };
  if (!llvm::all_of(operands, whole)) {
    emit(L.idx(0), items);
    return;
  }
  auto i64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
  // Query rows x keys x width multiply-adds of every entry: below 2^16 (a few microseconds) the call stays on
  // this thread.
  Value work = b.create<arith::MulIOp>(
      loc, b.create<arith::MulIOp>(loc, L.B, b.create<arith::MulIOp>(loc, rows, keys)), L.idx(width));
  SmallVector<Value> fields(addresses.begin(), addresses.end());
  fields.append({i64(L.B), i64(rows), i64(keys)});
  L.parallelFor(task(), items, fields, L.lt(work, L.idx(1 << 16)));
}

/// The address of a buffer that may be absent (0 then).
Value addressOrZero(Loops &L, Value m) { return m ? L.address(m) : L.i64c(0); }

/// The vector form over every (entry, head) item (runItems).
LogicalResult lowerVector(lm::AttentionOp a, Loops &L) {
  L.lengths = L.in(a.getLengths());
  Value q = L.in(a.getQuery()), k = L.in(a.getKey()), v = L.in(a.getValue()), out = L.alloc(a.getType());
  Value queryPositions = a.getQueryPositions() ? L.in(a.getQueryPositions()) : Value();
  VectorOperands ops{q, k, v, out, queryPositions, L.B};
  Value rows = L.b.create<memref::DimOp>(L.loc, q, 1), keys = L.b.create<memref::DimOp>(L.loc, k, 1);
  runItems(L, {q, k, v, L.lengths, queryPositions}, a.getHeads(), a.getType().getDimSize(2), rows, keys,
           {L.address(q), L.address(k), L.address(v), L.address(out), L.address(L.lengths),
            addressOrZero(L, queryPositions)},
           [&] { return getOrCreateVectorTask(a, L); },
           [&](Value begin, Value end) { emitVectorItems(a, L, ops, begin, end); });
  return L.set(a, out);
}

/// The backward's task: items [begin, end) of the operands whose addresses and sizes are in ctx (dO, q, k, v,
/// dq, dk, dv, lengths, query lengths or 0, entries B, query rows, keys M). One per (mask, heads, width, scale).
func::FuncOp getOrCreateGradTask(lm::AttentionGradOp a, Loops &L) {
  int64_t D = llvm::cast<ShapedType>(a.getQuery().getType()).getDimSize(2), H = a.getHeads();
  bool queryLengths = bool(a.getQueryLengths());
  std::string name = llvm::formatv("lm_attention_grad_task_{0}_h{1}_d{2}_s{3:x}{4}",
                                   lm::stringifyMaskKind(a.getMask()), H, D, bitsOf(a.getScale().convertToFloat()),
                                   queryLengths ? "_query_lengths" : "");
  return getOrCreateTask(a, L, name, D, [&](TaskFields &f, Value begin, Value end) {
    Value entries = f.field(9), rows = f.field(10), keys = f.field(11);
    GradOperands ops{f.matrix(0, entries, rows), f.matrix(1, entries, rows), f.matrix(2, entries, keys),
                     f.matrix(3, entries, keys), f.matrix(4, entries, rows), f.matrix(5, entries, keys),
                     f.matrix(6, entries, keys), queryLengths ? f.ints(8, entries) : Value(), f.index(entries)};
    L.lengths = f.ints(7, entries);
    emitVectorGradItems(a, L, ops, begin, end);
  });
}

} // namespace

bool hasVectorAttentionGrad(lm::AttentionGradOp op) {
  lm::MaskKind mask = op.getMask();
  int64_t D = llvm::cast<ShapedType>(op.getQuery().getType()).getDimSize(2), heads = op.getHeads();
  return !op.getRelKey() && !op.getMaskData() && D % heads == 0 && (D / heads) % kLanes == 0 &&
         (mask == lm::MaskKind::none || mask == lm::MaskKind::causal || mask == lm::MaskKind::anticausal ||
          mask == lm::MaskKind::diagonal);
}

LogicalResult lowerVectorAttentionGrad(lm::AttentionGradOp op, Loops &L) {
  L.lengths = L.in(op.getLengths());
  Value dO = L.in(op.getGrad()), q = L.in(op.getQuery()), k = L.in(op.getKey()), v = L.in(op.getValue());
  Value queryLengths = op.getQueryLengths() ? L.in(op.getQueryLengths()) : Value();
  // Sized from the operands: a cross-attention's keys [B, M, D] are another sequence than its queries.
  Value dq = L.alloc(op.getDQuery().getType(), L.dims(q)), dk = L.alloc(op.getDKey().getType(), L.dims(k)),
        dv = L.alloc(op.getDValue().getType(), L.dims(v));
  GradOperands ops{dO, q, k, v, dq, dk, dv, queryLengths, L.B};
  Value rows = L.b.create<memref::DimOp>(L.loc, q, 1), keys = L.b.create<memref::DimOp>(L.loc, k, 1);
  runItems(L, {dO, q, k, v, L.lengths, queryLengths}, op.getHeads(),
           llvm::cast<ShapedType>(op.getQuery().getType()).getDimSize(2), rows, keys,
           {L.address(dO), L.address(q), L.address(k), L.address(v), L.address(dq), L.address(dk), L.address(dv),
            L.address(L.lengths), addressOrZero(L, queryLengths)},
           [&] { return getOrCreateGradTask(op, L); },
           [&](Value begin, Value end) { emitVectorGradItems(op, L, ops, begin, end); });
  return L.setAll(op, {dq, dk, dv});
}

namespace {

/// Fused attention: for every (sentence, head, query row) an online softmax over
/// key tiles of kKeyTile keys (flash-style). The mask is structure, not data:
///   causal keys [0, min(len, i+1)), anticausal [i, len), none/diagonal [0, len),
/// so tiles the mask hides are never visited and visited tiles need no mask test;
/// the diagonal mask only knocks out key i in the one tile that holds it. Per tile:
///   s_j = (q_i . k_j [+ q_i . relK[r_ij]]) * scale, m' = max(m, max_j s_j),
///   l = l e^(m - m') + sum_j e^(s_j - m'), acc = acc e^(m - m') + sum_j e^(s_j - m') (v_j [+ relV[r_ij]]),
/// and out_i = acc / l (zero when no key is visible). Scores exist for one tile only.
LogicalResult lowerScalar(lm::AttentionOp a, Loops &L) {
  auto &b = L.b;
  Location loc = L.loc;
  L.lengths = L.in(a.getLengths());

  constexpr int64_t kKeyTile = 32;
  Value q = L.in(a.getQuery()), k = L.in(a.getKey()), v = L.in(a.getValue()), out = L.alloc(a.getType());
  Value relK = a.getRelKey() ? L.in(a.getRelKey()) : Value(), relV = a.getRelValue() ? L.in(a.getRelValue()) : Value();
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, clip = a.getClip();
  lm::MaskKind mask = a.getMask();
  Value scale = L.f32c(a.getScale().convertToFloat());
  Value scores = L.alloc(MemRefType::get({kKeyTile}, L.f32()));
  Value acc = L.alloc(MemRefType::get({dh}, L.f32()));
  Value negInf = L.f32c(-INFINITY);
  // Single-query rows (lm-prune-rows): row 0 of entry c sits at position query_positions[c].
  Value queryPositions = a.getQueryPositions() ? L.in(a.getQueryPositions()) : Value();
  Value rows = a.getMaskData() ? L.in(a.getMaskData()) : Value(); // the directional mask's rows
  Value queryRows = queryPositions ? L.idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
  L.nest({L.B, L.idx(H), queryRows}, [&](ValueRange iv) {
    Value bi = iv[0], h = iv[1], row = iv[2];
    Value i =
        queryPositions ? Value(b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(queryPositions, bi))) : row;
    Value len = L.lengthOf(bi);
    Value base = b.create<arith::MulIOp>(loc, h, L.idx(dh));
    auto feature = [&](Value e) { return b.create<arith::AddIOp>(loc, base, e); };
    Value lo = L.idx(0), hi = len;
    if (mask == lm::MaskKind::causal)
      hi = b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, i, L.idx(1)));
    if (mask == lm::MaskKind::anticausal)
      lo = i;
    if (mask == lm::MaskKind::directional) { // R: [0, i]; L: [i, len); S: [0, len) less hidden keys; skip: none
      Value dir = L.load(rows, {bi, i, L.idx(0)});
      auto is = [&](int64_t code) { return L.cmp(arith::CmpIPredicate::eq, dir, L.i32c(code)); };
      hi = L.select(is(0), b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, i, L.idx(1))),
                    L.select(is(3), L.idx(0), len));
      lo = L.select(is(1), i, L.idx(0));
    }
    L.nest({L.idx(dh)}, [&](ValueRange e) { L.store(L.f32c(0), acc, e); });
    auto tiles = b.create<scf::ForOp>(loc, lo, hi, L.idx(kKeyTile), ValueRange{negInf, L.f32c(0)});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(tiles.getBody());
      Value kt = tiles.getInductionVar(), m = tiles.getRegionIterArgs()[0], l = tiles.getRegionIterArgs()[1];
      Value tileLen = b.create<arith::MinSIOp>(loc, L.idx(kKeyTile), b.create<arith::SubIOp>(loc, hi, kt));
      // Scores of this tile, and their max.
      Value tileMax = L.reduce(L.idx(0), tileLen, negInf, [&](Value jj, Value mx) {
        Value j = b.create<arith::AddIOp>(loc, kt, jj);
        Value dot = L.reduce(L.idx(0), L.idx(dh), L.f32c(0), [&](Value e, Value sum) {
          Value qe = L.load(q, {bi, row, feature(e)});
          Value x = b.create<arith::MulFOp>(loc, qe, L.load(k, {bi, j, feature(e)}));
          if (relK)
            x = b.create<arith::AddFOp>(
                loc, x, b.create<arith::MulFOp>(loc, qe, L.load(relK, {L.relativeIndex(i, j, clip), e})));
          return b.create<arith::AddFOp>(loc, sum, x);
        });
        Value sj = b.create<arith::MulFOp>(loc, dot, scale);
        if (mask == lm::MaskKind::diagonal)
          sj = L.select(L.eqI(j, i), negInf, sj); // only the tile holding key i has a hit
        if (mask == lm::MaskKind::directional) // S rows: key i and the hidden keys
          sj = L.select(L.directionalVisible(rows, bi, i, j, len), sj, negInf);
        L.store(sj, scores, jj);
        return b.create<arith::MaximumFOp>(loc, mx, sj);
      });
      Value mNew = b.create<arith::MaximumFOp>(loc, m, tileMax);
      Value anyVisible = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, mNew, negInf);
      auto update = b.create<scf::IfOp>(loc, TypeRange{L.f32(), L.f32()}, anyVisible, /*withElse=*/true);
      {
        OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(update.thenBlock());
        Value corr = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, m, mNew)); // e^(-inf) = 0
        L.nest({L.idx(dh)}, [&](ValueRange e) { L.store(b.create<arith::MulFOp>(loc, L.load(acc, e), corr), acc, e); });
        Value tileSum = L.reduce(L.idx(0), tileLen, L.f32c(0), [&](Value jj, Value sum) {
          Value j = b.create<arith::AddIOp>(loc, kt, jj);
          Value p = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.load(scores, jj), mNew));
          L.nest({L.idx(dh)}, [&](ValueRange e) {
            Value vj = L.load(v, {bi, j, feature(e[0])});
            if (relV)
              vj = b.create<arith::AddFOp>(loc, vj, L.load(relV, {L.relativeIndex(i, j, clip), e[0]}));
            L.store(b.create<arith::AddFOp>(loc, L.load(acc, e), b.create<arith::MulFOp>(loc, p, vj)), acc, e);
          });
          return b.create<arith::AddFOp>(loc, sum, p);
        });
        Value lNew = b.create<arith::AddFOp>(loc, b.create<arith::MulFOp>(loc, l, corr), tileSum);
        b.create<scf::YieldOp>(loc, ValueRange{mNew, lNew});
        b.setInsertionPointToStart(update.elseBlock());
        b.create<scf::YieldOp>(loc, ValueRange{m, l});
      }
      b.create<scf::YieldOp>(loc, update.getResults());
    }
    Value l = tiles.getResult(1);
    Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, L.f32c(0));
    Value inv = L.select(seen, b.create<arith::DivFOp>(loc, L.f32c(1), l), L.f32c(0));
    L.nest({L.idx(dh)}, [&](ValueRange e) {
      L.store(b.create<arith::MulFOp>(loc, L.load(acc, e), inv), out, {bi, row, feature(e[0])});
    });
  });
  return L.set(a, out);
}

struct AttentionLowering : LmLowering<lm::AttentionOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::AttentionOp a, Loops &L) const override {
    if (a.getMask() == lm::MaskKind::Explicit)
      return a.emitOpError("explicit masks have no CPU lowering yet");
    int64_t heads = a.getHeads(), width = a.getType().getDimSize(2);
    if (!a.getRelKey() && !a.getMaskData() && (width / heads) % kLanes == 0)
      return lowerVector(a, L);
    return lowerScalar(a, L);
  }
};

} // namespace

void populateAttentionPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<AttentionLowering>(converter, patterns.getContext(), context);
}

namespace {

/// Lowers the kernel module's lm ops by `populate`'s patterns alone (the argument casts fold away); the kernel
/// writes its output arguments directly (in a model the next op reads the buffer; a copy would be benchmark
/// overhead): each copy's source buffer becomes its argument.
OwningOpRef<ModuleOp> lowerKernelModule(MLIRContext &context, OwningOpRef<ModuleOp> module,
                                        void (*populate)(TypeConverter &, RewritePatternSet &,
                                                         const LoweringContext &)) {
  TypeConverter converter;
  ConversionTarget target(context);
  configureLowering(converter, target);
  const WeightLayout noWeights;
  LoweringContext lowering;
  lowering.layout = &noWeights;
  RewritePatternSet patterns(&context);
  populate(converter, patterns, lowering);
  if (failed(applyPartialConversion(*module, target, std::move(patterns))))
    return nullptr;
  foldCastPairs(*module);
  module->walk([&](memref::CopyOp copy) {
    if (auto alloc = copy.getSource().getDefiningOp<memref::AllocOp>();
        alloc && alloc.getType() == copy.getTarget().getType()) {
      alloc.getResult().replaceAllUsesWith(copy.getTarget());
      copy.erase();
      alloc.erase();
    }
  });
  deallocateAfterLastUse(*module);
  return module;
}

/// An empty module for a kernel (the dialects loaded, lm_rt_parallel_for declared), the builder at its end.
OwningOpRef<ModuleOp> kernelModule(MLIRContext &context, OpBuilder &b) {
  context.loadDialect<lm::LmDialect, arith::ArithDialect, func::FuncDialect, math::MathDialect, memref::MemRefDialect,
                      scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect>();
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto ptr = LLVM::LLVMPointerType::get(&context);
  b.create<func::FuncOp>(loc, "lm_rt_parallel_for", b.getFunctionType({b.getI64Type(), ptr, ptr}, {})).setPrivate();
  return module;
}

} // namespace

OwningOpRef<ModuleOp> buildAttentionModule(MLIRContext &context, lm::MaskKind mask, int64_t heads, int64_t dModel) {
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = kernelModule(context, b);
  int64_t dyn = ShapedType::kDynamic;
  auto t3 = RankedTensorType::get({dyn, dyn, dModel}, b.getF32Type());
  auto t1 = RankedTensorType::get({dyn}, b.getI32Type());
  auto m3 = bufferType(t3), m1 = bufferType(t1);
  auto fn = b.create<func::FuncOp>(loc, "attention_kernel", b.getFunctionType({m3, m3, m3, m1, m3}, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto tensor = [&](Value m, Type t) { return b.create<UnrealizedConversionCastOp>(loc, t, m).getResult(0); };
  auto attention =
      b.create<lm::AttentionOp>(loc, t3, tensor(entry->getArgument(0), t3), tensor(entry->getArgument(1), t3),
                                tensor(entry->getArgument(2), t3), tensor(entry->getArgument(3), t1), Value(), Value(),
                                Value(), Value(), b.getI64IntegerAttr(heads), lm::MaskKindAttr::get(&context, mask),
                                b.getF32FloatAttr(1.0f / std::sqrt(float(dModel / heads))), b.getI64IntegerAttr(0));
  Value result = b.create<UnrealizedConversionCastOp>(loc, m3, attention.getResult()).getResult(0);
  b.create<memref::CopyOp>(loc, result, entry->getArgument(4));
  b.create<func::ReturnOp>(loc);
  return lowerKernelModule(context, std::move(module), populateAttentionPatterns);
}

OwningOpRef<ModuleOp> buildAttentionGradModule(MLIRContext &context, lm::MaskKind mask, int64_t heads,
                                               int64_t dModel) {
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = kernelModule(context, b);
  declareTrainingRuntime(b, loc);
  int64_t dyn = ShapedType::kDynamic;
  auto t3 = RankedTensorType::get({dyn, dyn, dModel}, b.getF32Type());
  auto t1 = RankedTensorType::get({dyn}, b.getI32Type());
  auto m3 = bufferType(t3), m1 = bufferType(t1);
  auto fn = b.create<func::FuncOp>(loc, "attention_grad_kernel",
                                   b.getFunctionType({m3, m3, m3, m3, m1, m3, m3, m3}, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto tensor = [&](Value m, Type t) { return b.create<UnrealizedConversionCastOp>(loc, t, m).getResult(0); };
  auto arg = [&](int i) { return entry->getArgument(i); };
  auto grad = b.create<lm::AttentionGradOp>(
      loc, TypeRange{t3, t3, t3}, tensor(arg(0), t3), tensor(arg(1), t3), tensor(arg(2), t3), tensor(arg(3), t3),
      tensor(arg(4), t1), Value(), Value(), Value(), Value(), b.getI64IntegerAttr(heads),
      lm::MaskKindAttr::get(&context, mask), b.getF32FloatAttr(1.0f / std::sqrt(float(dModel / heads))),
      b.getI64IntegerAttr(0));
  for (int i = 0; i < 3; ++i)
    b.create<memref::CopyOp>(loc, b.create<UnrealizedConversionCastOp>(loc, m3, grad->getResult(i)).getResult(0),
                             arg(5 + i));
  b.create<func::ReturnOp>(loc);
  return lowerKernelModule(context, std::move(module), populateBackwardPatterns);
}

} // namespace lmcc::codegen
