//===- AttentionGrad.cpp - lm-to-loops: the attention backward's vector form ---===//
//
// lm.attention_grad in the vector form of the forward (AttentionVector.h): register-tiled dP, dQ, dK and dV per
// (entry, head) item, split over threads, the same bits for any thread count. Other attention backwards call
// the runtime's kernel (Backward.cpp).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/AttentionVector.h"

#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

namespace lmcc::codegen {
using namespace attention;
namespace {

/// The buffers of one vector-form attention backward, its query lengths (or null: the keys') and entry count; with
/// relative positions the tables and the items' table gradients ([2 items, T, dh]: item i's rel_k gradient at 2i,
/// its rel_v gradient at 2i + 1), else null; the directional rows or null.
struct GradOperands {
  Value dO, q, k, v, dq, dk, dv, queryLengths, entries, relK, relV, relGrads, maskRows;
};

/// lm.attention_grad in the vector form (the forward's conditions: head size a multiple of 16), per (entry, head)
/// item [begin, end): n = min(query length, rows) differentiated rows, m = min(length,
/// keys) keys; dq of rows n.. zeroed; keys and values transposed (kt, vt); then per tile of R = 8 rows (under the
/// directional mask the rows [0, n) grouped by direction: VectorKernel::directionOrder; rows past
/// n repeat row n - 1 and see no key):
///   P   = the forward's probabilities, recomputed as it computes them (scores, exp, 1 / l),
///   dP  = dO_r . v_j as the scores (one vt vector load per R FMAs),
///   D_r = sum_j P_rj dP_rj, dS = P (dP - D) scale (0 where P is),
///   dq_r = sum_j dS_rj k_j (as the forward's p.v; stored for real rows only),
///   dk_j += sum_r dS_rj q_r, dv_j += sum_r P_rj dO_r over the tile's keys (4 keys x 64 features a tile; stored,
///        not added, for keys no earlier tile touched: the touched keys are a prefix [0, touched), carried over
///        the tiles; under the directional mask a tile's keys may start past it, and the keys between are
///        zeroed) into the item's slot (item mod 2) of a [2, keys, dh] scratch, and
///   the item before's dk, dv out of the other slot, keys [t M / tiles, (t + 1) M / tiles) in tile t (touched
///        keys from the scratch, the others 0): its writes spread over this item's work, not in a burst after its
///        own (the task's last item writes its own after the items; an item with no tiles the one before's at
///        once);
/// the next item's operands are prefetched over the tiles (and, a share per item, the next entry's read operands
/// whole: prefetchNextEntry) and dq, dk, dv stored nontemporally when streaming (as the forward's output). Measured
/// in bench/results/2026-11-28-entry-prefetch.md. Every output element is written once, from the values its own
/// item computed in a fixed order: the same bits for any thread count.
/// With Shaw relative positions (clip c, T = 2c + 1) the scores and dP gain their relative terms as in the
/// forward (relativeProducts of q with rel_k and of dO with rel_v), P and dS are summed per table row (P_t, dS_t:
/// relativeWeights), dq_r gains sum_t dS_rt rel_k[t], and the item's table gradients sum_r dS_rt q_r and
/// sum_r P_rt dO_r are stored over its first tile and added over the others (keyUpdates into relGrads); the
/// caller sums the items' in item order.
void emitVectorGradItems(lm::AttentionGradOp a, Loops &L, const GradOperands &ops, Value begin, Value end) {
  auto &b = L.b;
  Location loc = L.loc;
  int64_t D = llvm::cast<ShapedType>(a.getQuery().getType()).getDimSize(2), H = a.getHeads(), dh = D / H;
  int64_t chunks = dh / kLanes;
  VectorKernel K(L, dh, a.getMask(), ops.maskRows);
  Value scale = K.bcast(L.f32c(a.getScale().convertToFloat()));
  Value M = b.create<memref::DimOp>(loc, ops.k, 1);
  Value M16 = K.roundDown(K.add(M, L.idx(kLanes - 1)));
  const int64_t R = kTileRows;
  int64_t dyn = ShapedType::kDynamic;
  Value kt = K.transposedScratch(M16), vt = K.transposedScratch(M16);
  Value kp = K.packedScratch(M16);
  Value S = K.scratch({R, dyn}, M16), G = K.scratch({R, dyn}, M16);
  // dk and dv of the item (slot item mod 2) accumulated over its tiles, and of the item before (the other slot),
  // written out over this item's tiles.
  Value dkItems = K.scratch({2, dyn, dh}, M16), dvItems = K.scratch({2, dyn, dh}, M16);
  const bool relative = bool(ops.relK);
  const int64_t clip = a.getClip(), T = 2 * clip + 1, T16 = (T + kLanes - 1) / kLanes * kLanes;
  Value relKt, relVt, PQ, GQ, PT, GT;
  if (relative) {
    // rel_k^T, rel_v^T [dh, T16 + 16], P_t and dS_t [R, T16 + 16], the padded relative scores and dP terms
    // [R, 2 M16 + T16 + 16], in one block.
    Value width = K.add(K.add(M16, M16), L.idx(T16 + kLanes));
    SmallVector<Value> views = K.scratchViews(
        {{dh, T16 + kLanes}, {dh, T16 + kLanes}, {R, T16 + kLanes}, {R, T16 + kLanes}, {R, dyn}, {R, dyn}},
        {width, width});
    relKt = views[0], relVt = views[1], PT = views[2], GT = views[3], PQ = views[4], GQ = views[5];
    K.transposeTable(ops.relK, T, relKt);
    K.transposeTable(ops.relV, T, relVt);
  }
  Value rows = b.create<memref::DimOp>(loc, ops.q, 1);
  Value items = b.create<arith::MulIOp>(loc, ops.entries, L.idx(H));
  // Directional mask: tiles of rows of one direction, as in the forward (VectorKernel::directionOrder).
  Value order = K.orderScratch(a.getMask(), rows);
  Value streams = streamsOperands(L, ops.entries, rows, M, D, /*q, dO, dq*/ 3, /*k, v, dk, dv*/ 4);
  Value nontemporal = K.nontemporalRows(streams, ops.dq);
  Value nontemporalDk = K.nontemporalRows(streams, ops.dk);
  Value nontemporalKeys = L.andI(nontemporalDk, K.nontemporalRows(streams, ops.dv));
  // Keys [from, to) of item `item`'s dk and dv (in scratch slot item mod 2) out: the keys its tiles touched
  // (`touched`) from the scratch, the others (padding, past the last row's under the causal mask) 0.
  auto writeKeys = [&](Value item, Value touched, Value from, Value to) {
    Value slot = b.create<arith::RemUIOp>(loc, item, L.idx(2));
    Value bi = b.create<arith::DivUIOp>(loc, item, L.idx(H));
    Value base = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, item, L.idx(H)), L.idx(dh));
    K.storeStreaming(nontemporalKeys, [&](bool nt) {
      K.loop(from, to, 1, {}, [&](Value j, ValueRange) {
        Value seen = L.lt(j, touched);
        for (auto [scratch, out] : {std::pair{dkItems, ops.dk}, std::pair{dvItems, ops.dv}})
          for (int64_t c = 0; c < chunks; ++c) {
            Value x = K.load(scratch, ValueRange{slot, j, L.idx(c * kLanes)});
            K.store(b.create<arith::SelectOp>(loc, seen, x, K.zeroV), out, ValueRange{bi, j, K.chunk(base, c)}, nt);
          }
        return SmallVector<Value>{};
      });
    });
  };
  Value zero = L.idx(0);
  // Carried: the keys the item before's tiles touched.
  auto itemLoop = K.loop(begin, end, 1, ValueRange{zero}, [&](Value item, ValueRange carriedItems) {
    Value before = b.create<arith::SubIOp>(loc, item, L.idx(1)), touchedBefore = carriedItems[0];
    Value hasBefore = L.lt(begin, item);
    Value slot = b.create<arith::RemUIOp>(loc, item, L.idx(2));
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
    K.packRows(ops.k, bi, base, M, M16, kp);
    if (order) // the differentiated rows [0, n) only
      K.directionOrder(bi, n, order);
    Value tiles = b.create<arith::DivUIOp>(loc, K.add(n, L.idx(R - 1)), L.idx(R));
    Value lastRow = b.create<arith::SubIOp>(loc, n, L.idx(1));
    // An item without tiles (an empty entry) has zero table gradients.
    if (relative)
      L.when(L.eqI(tiles, zero), [&] {
        Value first = b.create<arith::MulIOp>(loc, item, L.idx(2));
        L.nest({L.idx(2), L.idx(T), L.idx(chunks)}, [&](ValueRange sti) {
          K.store(K.zeroV, ops.relGrads,
                  ValueRange{K.add(first, sti[0]), sti[1], b.create<arith::MulIOp>(loc, sti[2], L.idx(kLanes))});
        });
      });
    Value nextItem = K.add(item, L.idx(1));
    Value hasNext = L.andI(streams, L.lt(nextItem, items));
    Value head = b.create<arith::RemUIOp>(loc, item, L.idx(H));
    Value hasNextEntry = L.andI(streams, L.lt(K.add(bi, L.idx(1)), ops.entries));
    Value nextEntry = b.create<arith::DivUIOp>(loc, nextItem, L.idx(H));
    Value nextBase = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, nextItem, L.idx(H)), L.idx(dh));
    // Carried over the tiles: the keys [0, touched) the tiles so far wrote into the slot's dk and dv.
    auto tileLoop = K.loop(L.idx(0), tiles, 1, ValueRange{L.idx(0)}, [&](Value t, ValueRange carried) {
      Value touched = carried[0];
      Value r0 = b.create<arith::MulIOp>(loc, t, L.idx(R));
      // The next item's lines in four parts: before the scores, dP, dq and the key updates (its dq rows need
      // none: stored nontemporally when streaming, into the runtime's 64-byte aligned buffers), and with them the
      // item's share of the next entry's q, dO, k and v rows (whole rows, every head: its reads an entry ahead,
      // in address order; 5-10% off the batch-32 backward, bench/results/2026-11-28-entry-prefetch.md).
      auto prefetch = [&](int64_t part) {
        K.prefetchNextEntry(hasNextEntry, K.add(bi, L.idx(1)), head, H, D, t, tiles, part, 4, rows, M,
                            {ops.q, ops.dO}, {ops.k, ops.v});
        K.prefetchNext(hasNext, nextEntry, nextBase, t, tiles, r0, R, part, 4, rows, M, {ops.q, ops.dO},
                       {ops.k, ops.v});
      };
      prefetch(0);
      Tile tile = K.tileRows(bi, r0, R, lastRow, m, Value(), n, order);
      if (relative) {
        K.relativeProducts(ops.q, bi, base, tile.row, relKt, clip, M16, PQ);
        K.relativeProducts(ops.dO, bi, base, tile.row, relVt, clip, M16, GQ);
      }
      K.scores(ops.q, bi, base, tile, kt, scale, PQ, clip, M16, S);
      SmallVector<Value> sums = K.exponentiate(S, R, tile.from16, tile.to);
      SmallVector<Value> inv = K.inverses(sums);
      prefetch(1);
      K.products(ops.dO, bi, base, tile, vt, [&](Value jb, int64_t first, ArrayRef<Value> dp) {
        for (int64_t r = 0; r < int64_t(dp.size()); ++r) {
          Value d = dp[r];
          if (relative)
            d = b.create<arith::AddFOp>(loc, d,
                                        K.relativeBlock(GQ, first + r, tile.pos[first + r], jb, clip, M16));
          K.store(d, G, ValueRange{L.idx(first + r), jb});
        }
      });
      // P = p / l in place, and D_r = sum_j P_rj dP_rj (rows in groups of geo.scoreRows).
      SmallVector<Value> Dr;
      K.rowGroups(R, K.geo.scoreRows, [&](int64_t r0, int64_t n) {
        SmallVector<Value> zeros(n, K.zeroV);
        auto dots = K.loop(tile.from16, tile.to, kLanes, zeros, [&](Value jb, ValueRange acc) {
          SmallVector<Value> next;
          for (int64_t r = r0; r < r0 + n; ++r) {
            Value p = b.create<arith::MulFOp>(loc, K.load(S, ValueRange{L.idx(r), jb}), inv[r]);
            K.store(p, S, ValueRange{L.idx(r), jb});
            next.push_back(b.create<vector::FMAOp>(loc, p, K.load(G, ValueRange{L.idx(r), jb}), acc[r - r0]));
          }
          return next;
        });
        Dr.append(K.acrossRows(SmallVector<Value>(dots.getResults()), /*sum=*/true));
      });
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
      Value to16 = K.roundDown(K.add(tile.to, L.idx(kLanes - 1)));
      if (relative) {
        K.relativeWeights(S, tile.pos, tile.from16, to16, clip, PT);
        K.relativeWeights(G, tile.pos, tile.from16, to16, clip, GT);
      }
      // dq of the real rows, in tiles of pvRows rows x pvChunks feature vectors (nontemporal when streaming).
      prefetch(2);
      const int64_t pvRows = K.geo.pvRows, pvChunks = K.geo.pvChunks;
      for (int64_t c0 = 0; c0 < chunks; c0 += pvChunks) { // feature vectors outer: their packed rows stay in the L1
        int64_t nc = std::min(pvChunks, chunks - c0);
        SmallVector<Value> cols;
        for (int64_t c = 0; c < nc; ++c)
          cols.push_back(K.chunk(base, c0 + c));
        for (int64_t r0g = 0; r0g < R; r0g += pvRows) {
          auto [gLo, gHi] = K.unionRange(tile, r0g, pvRows);
          SmallVector<Value> acc(K.weightedRows(G, r0g, pvRows, kp, M16, c0, nc, gLo, gHi).getResults());
          if (relative)
            acc = K.relativeRows(GT, r0g, pvRows, ops.relK, clip, c0, nc, acc);
          K.storeStreaming(nontemporal, [&](bool nt) {
            for (int64_t r = 0; r < pvRows; ++r) {
              auto write = [&] {
                for (int64_t c = 0; c < nc; ++c)
                  K.store(acc[r * nc + c], ops.dq, ValueRange{bi, tile.row[r0g + r], cols[c]}, nt);
              };
              if (Value valid = tile.valid[r0g + r])
                L.when(valid, write);
              else
                write();
            }
          });
        }
      }
      prefetch(3);
      // From the tile's first key rounded down to 4 (the keys before it get nothing: 0 in P and dS).
      Value keysFrom = K.roundDown(tile.from, K.geo.gradKeys);
      if (a.getMask() == lm::MaskKind::directional) // keys [touched, keysFrom) no tile sees so far: 0
        K.loop(touched, keysFrom, 1, {}, [&](Value j, ValueRange) {
          for (Value scratch : {dkItems, dvItems})
            for (int64_t c = 0; c < chunks; ++c)
              K.store(K.zeroV, scratch, ValueRange{slot, j, L.idx(c * kLanes)});
          return SmallVector<Value>{};
        });
      K.keyUpdates(G, ops.q, tile.row, dkItems, slot, bi, base, keysFrom, tile.to, touched);
      K.keyUpdates(S, ops.dO, tile.row, dvItems, slot, bi, base, keysFrom, tile.to, touched);
      if (relative) { // the item's table gradients (the rows tableRows reaches): stored by its first tile, added by
                      // the others
        auto [first, last] = K.tableRows(clip);
        Value from = L.idx(first), to = L.idx(last + 1);
        Value fresh = L.select(L.eqI(t, zero), from, L.idx(T));
        Value pair = b.create<arith::MulIOp>(loc, item, L.idx(2));
        K.keyUpdates(GT, ops.q, tile.row, ops.relGrads, pair, bi, base, from, to, fresh);
        K.keyUpdates(PT, ops.dO, tile.row, ops.relGrads, K.add(pair, L.idx(1)), bi, base, from, to, fresh);
      }
      // The item before's keys [t M / tiles, (t + 1) M / tiles) out.
      L.when(hasBefore, [&] {
        Value from = b.create<arith::DivUIOp>(loc, b.create<arith::MulIOp>(loc, t, M), tiles);
        Value to = b.create<arith::DivUIOp>(loc, b.create<arith::MulIOp>(loc, K.add(t, L.idx(1)), M), tiles);
        writeKeys(before, touchedBefore, from, to);
      });
      return SmallVector<Value>{b.create<arith::MaxSIOp>(loc, touched, tile.to)};
    });
    // No tiles (an empty entry): the item before's keys all out here.
    L.when(L.andI(hasBefore, L.eqI(tiles, zero)), [&] { writeKeys(before, touchedBefore, zero, M); });
    return SmallVector<Value>{tileLoop.getResult(0)};
  });
  // The last item's keys.
  L.when(L.lt(begin, end),
         [&] { writeKeys(b.create<arith::SubIOp>(loc, end, L.idx(1)), itemLoop.getResult(0), zero, M); });
  K.fenceStreaming(L.orI(nontemporal, nontemporalKeys));
}

/// The backward's task: items [begin, end) of the operands whose addresses and sizes are in ctx (dO, q, k, v,
/// dq, dk, dv, lengths, query lengths or 0, the relative tables and the items' table gradients or 0, the
/// directional rows and their row count or 0, entries B, query rows, keys M). One per (mask, heads, width, scale,
/// query lengths, clip, rows' width).
func::FuncOp getOrCreateGradTask(lm::AttentionGradOp a, Loops &L) {
  int64_t D = llvm::cast<ShapedType>(a.getQuery().getType()).getDimSize(2), H = a.getHeads();
  int64_t words = maskRowsWidth(a.getMaskData());
  bool queryLengths = bool(a.getQueryLengths()), relative = bool(a.getRelKey());
  std::string name = llvm::formatv("lm_attention_grad_task_{0}_h{1}_d{2}_s{3:x}{4}{5}{6}",
                                   lm::stringifyMaskKind(a.getMask()), H, D, bitsOf(a.getScale().convertToFloat()),
                                   queryLengths ? "_query_lengths" : "",
                                   relative ? llvm::formatv("_rel{0}", a.getClip()).str() : std::string(),
                                   words ? llvm::formatv("_w{0}", words).str() : std::string());
  return getOrCreateTask(a, L, name, D, [&](TaskFields &f, Value begin, Value end) {
    Value entries = f.field(14), rows = f.field(15), keys = f.field(16);
    int64_t T = 2 * int64_t(a.getClip()) + 1, dh = D / H;
    // The items' table gradients: [2 B H, T, dh].
    Value relGrads = relative ? memrefAt(f.b, f.loc, f.field(11),
                                         {f.b.create<LLVM::MulOp>(f.loc, entries, f.c64(2 * H)), f.c64(T), f.c64(dh)},
                                         {f.c64(T * dh), f.c64(dh), f.c64(1)},
                                         MemRefType::get({ShapedType::kDynamic, T, dh}, f.b.getF32Type()))
                              : Value();
    GradOperands ops{f.matrix(0, entries, rows), f.matrix(1, entries, rows), f.matrix(2, entries, keys),
                     f.matrix(3, entries, keys), f.matrix(4, entries, rows), f.matrix(5, entries, keys),
                     f.matrix(6, entries, keys), queryLengths ? f.ints(8, entries) : Value(), f.index(entries),
                     relative ? f.table(9, T, dh) : Value(), relative ? f.table(10, T, dh) : Value(), relGrads,
                     words ? f.directionalRows(12, entries, f.field(13), words) : Value()};
    L.lengths = f.ints(7, entries);
    emitVectorGradItems(a, L, ops, begin, end);
  });
}

} // namespace

bool hasVectorAttentionGrad(lm::AttentionGradOp op) {
  lm::MaskKind mask = op.getMask();
  int64_t D = llvm::cast<ShapedType>(op.getQuery().getType()).getDimSize(2), heads = op.getHeads();
  return D % heads == 0 && (D / heads) % kLanes == 0 && mask != lm::MaskKind::Explicit;
}

LogicalResult lowerVectorAttentionGrad(lm::AttentionGradOp op, Loops &L) {
  auto &b = L.b;
  Location loc = L.loc;
  L.lengths = L.in(op.getLengths());
  Value dO = L.in(op.getGrad()), q = L.in(op.getQuery()), k = L.in(op.getKey()), v = L.in(op.getValue());
  Value queryLengths = op.getQueryLengths() ? L.in(op.getQueryLengths()) : Value();
  // Sized from the operands: a cross-attention's keys [B, M, D] are another sequence than its queries.
  Value dq = L.alloc(op.getDQuery().getType(), L.dims(q)), dk = L.alloc(op.getDKey().getType(), L.dims(k)),
        dv = L.alloc(op.getDValue().getType(), L.dims(v));
  const bool relative = bool(op.getRelKey());
  const int64_t H = op.getHeads(), D = llvm::cast<ShapedType>(op.getQuery().getType()).getDimSize(2), dh = D / H;
  const int64_t T = 2 * int64_t(op.getClip()) + 1;
  Value relK = relative ? L.in(op.getRelKey()) : Value(), relV = relative ? L.in(op.getRelValue()) : Value();
  // The items' table gradients [2 B H, T, dh], summed in item order below: the same bits for any thread count.
  Value relGrads = relative ? L.alloc(MemRefType::get({ShapedType::kDynamic, T, dh}, L.f32()),
                                      {b.create<arith::MulIOp>(loc, L.B(), L.idx(2 * H))})
                            : Value();
  Value maskRows = op.getMaskData() ? L.in(op.getMaskData()) : Value();
  GradOperands ops{dO, q, k, v, dq, dk, dv, queryLengths, L.B(), relK, relV, relGrads, maskRows};
  Value rows = b.create<memref::DimOp>(loc, q, 1), keys = b.create<memref::DimOp>(loc, k, 1);
  runItems(L, {dO, q, k, v, L.lengths, queryLengths, relK, relV, maskRows}, H, D, rows, keys,
           {L.address(dO), L.address(q), L.address(k), L.address(v), L.address(dq), L.address(dk), L.address(dv),
            L.address(L.lengths), addressOrZero(L, queryLengths), addressOrZero(L, relK), addressOrZero(L, relV),
            addressOrZero(L, relGrads), addressOrZero(L, maskRows), maskRowCount(L, maskRows)},
           [&] { return getOrCreateGradTask(op, L); },
           [&](Value begin, Value end) { emitVectorGradItems(op, L, ops, begin, end); });
  if (!relative)
    return L.setAll(op, {dq, dk, dv});
  Value dRelK = L.alloc(L.typeOf(op.getDRelative()[0])), dRelV = L.alloc(L.typeOf(op.getDRelative()[1]));
  VectorKernel K(L, dh, op.getMask());
  Value items = b.create<arith::MulIOp>(loc, L.B(), L.idx(H));
  auto [first, last] = K.tableRows(op.getClip()); // the other table rows get nothing under this mask
  for (auto [which, out] : {std::pair{int64_t(0), dRelK}, std::pair{int64_t(1), dRelV}})
    L.nest({L.idx(T), L.idx(dh / kLanes)}, [&](ValueRange tc) {
      Value e = b.create<arith::MulIOp>(loc, tc[1], L.idx(kLanes));
      Value reached = L.andI(L.ge(tc[0], L.idx(first)), L.le(tc[0], L.idx(last)));
      auto sum = K.loop(L.idx(0), L.select(reached, items, L.idx(0)), 1, {K.zeroV}, [&](Value item, ValueRange acc) {
        Value slice = K.add(b.create<arith::MulIOp>(loc, item, L.idx(2)), L.idx(which));
        return SmallVector<Value>{
            b.create<arith::AddFOp>(loc, acc[0], K.load(relGrads, ValueRange{slice, tc[0], e}))};
      });
      K.store(sum.getResult(0), out, ValueRange{tc[0], e});
    });
  return L.setAll(op, {dq, dk, dv, dRelK, dRelV});
}

} // namespace lmcc::codegen
