//===- Attention.cpp - lm-to-loops: fused attention -------------------------===//
//
// lm.attention as a key-tiled online softmax with the mask as structure, and a vector form for head sizes
// that are multiples of 16 (its pieces in AttentionVector.h, its VJP in AttentionGrad.cpp).
//
//===----------------------------------------------------------------------===//
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/AttentionVector.h"
#include "codegen/LmToLoops/Scratch.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>

using namespace mlir;

namespace lmcc::codegen {

namespace attention {

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

uint32_t bitsOf(float scale) {
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  return bits;
}

void runItems(Loops &L, ArrayRef<Value> operands, int64_t heads, int64_t width, Value rows, Value keys,
              ArrayRef<Value> addresses, const std::function<func::FuncOp()> &task,
              const std::function<void(Value, Value)> &emit) {
  auto &b = L.b;
  Location loc = L.loc;
  Value items = b.create<arith::MulIOp>(loc, L.B(), L.idx(heads));
  // Whole buffers, or static row-major views at an offset (a relative table in the weight buffer).
  auto whole = [](Value m) { return !m || Loops::readableAtAddress(llvm::cast<MemRefType>(m.getType())); };
  if (!llvm::all_of(operands, whole)) {
    emit(L.idx(0), items);
    return;
  }
  auto i64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
  // Query rows x keys x width multiply-adds of every entry: below 2^16 (a few microseconds) the call stays on
  // this thread.
  Value work = b.create<arith::MulIOp>(
      loc, b.create<arith::MulIOp>(loc, L.B(), b.create<arith::MulIOp>(loc, rows, keys)), L.idx(width));
  SmallVector<Value> fields(addresses.begin(), addresses.end());
  fields.append({i64(L.B()), i64(rows), i64(keys)});
  L.parallelFor(task(), items, fields, L.lt(work, L.idx(1 << 16)));
}

Value addressOrZero(Loops &L, Value m) { return m ? L.address(m) : L.i64c(0); }

int64_t maskRowsWidth(Value maskData) {
  return maskData ? llvm::cast<ShapedType>(maskData.getType()).getDimSize(2) : 0;
}

Value maskRowCount(Loops &L, Value maskRows) {
  if (!maskRows)
    return L.i64c(0);
  return L.b.create<arith::IndexCastOp>(L.loc, L.b.getI64Type(), L.b.create<memref::DimOp>(L.loc, maskRows, 1));
}

Value streamsOperands(Loops &L, Value entries, Value rows, Value keys, int64_t width, int64_t rowBuffers,
                      int64_t keyBuffers) {
  auto &b = L.b;
  Location loc = L.loc;
  Value perEntry = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, rows, L.idx(rowBuffers)),
                                           b.create<arith::MulIOp>(loc, keys, L.idx(keyBuffers)));
  Value bytes = b.create<arith::MulIOp>(loc, b.create<arith::MulIOp>(loc, entries, perEntry),
                                        L.idx(width * int64_t(sizeof(float))));
  Value cache = b.create<func::CallOp>(loc, "lm_rt_private_cache_bytes", TypeRange{b.getI64Type()}, ValueRange{})
                    .getResult(0);
  return L.lt(L.toIndex(cache), bytes);
}

} // namespace attention

using namespace attention;

namespace {

/// The buffers of one vector-form attention, its entry count B, its relative tables and directional rows (or null).
struct VectorOperands {
  Value q, k, v, out, queryPositions, entries, relK, relV, maskRows;
};

/// lm.attention with vectors (head size a multiple of 16), register-tiled like the GEMM.
/// Work items are the (entry, head) pairs, entry-major; items [begin, end) run here. Per item the head's keys
/// are transposed into kt (16-key blocks of [dh, 16], M keys rounded up to 16, zero tail) and its values packed
/// per feature vector (VectorKernel::packRows). Query rows go in tiles of R = 8 rows (4 under the directional mask,
/// 1 for single-query entries, lm-prune-rows: forwardTileRows), the last tile repeating the last row; a tile visits
/// the union of its rows' key ranges [lo, hi) (each row's range as in the scalar form below):
///   scores  S[r, j..j+16) = (sum_e q_re * k_(j..j+16),e) * scale: one key vector load per 4-8 FMAs; lanes a row
///           cannot see are -inf, tested only in blocks that are not fully visible to every row of the tile (under
///           the directional mask each row's range follows its direction, and a block with an S row's own key or
///           one of its hidden keys, 16 bits of one word, is tested);
///   softmax m_r = max_j S[r, j], p = e^(S - m_r) (vector exp; 0 where -inf), l_r = sum_j p (lanes by j mod 16,
///           blocks in order: the zero blocks outside a row's range change nothing, so a row's result does not
///           depend on its tile);
///   p.v     out_r = (sum_j p_rj v_j) / l_r over the tile's rows in groups of 4 x 64 (4 x 16 on 256-bit
///           targets) features, one value vector load per 4 FMAs (p_rj = 0 adds exactly nothing); zero when a row
///           sees no key. A directional tile of S rows goes two rows at a time over the keys either row sees
///           (visibleWeightedRows: the same chains less their zero terms). When the operands exceed the threads'
///           L2 the rows are stored nontemporally (no read for ownership) and the q, k, v lines of the item after
///           next are prefetched over the tiles (two items ahead: 1.04-1.05x on the triangular masks at n 128
///           batch 32 over one ahead, level at n 80; bench/results/2026-12-01-directional.md).
/// With Shaw relative positions (clip c, T = 2c + 1) a tile also computes its rows' T products q_r . rel_k[t]
/// (relativeProducts) and adds each score's one (S = (q.k + q.rel_k[t(i, j)]) scale); after the softmax the
/// numerators are summed per table row (relativeWeights: P_t) and out_r gains sum_t P_rt rel_v[t] before the
/// division by l_r.
void emitVectorItems(lm::AttentionOp a, Loops &L, const VectorOperands &ops, Value begin, Value end) {
  auto &b = L.b;
  Location loc = L.loc;
  Value q = ops.q, k = ops.k, v = ops.v, out = ops.out;
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, chunks = dh / kLanes;
  VectorKernel K(L, dh, a.getMask(), ops.maskRows);
  Value scale = K.bcast(L.f32c(a.getScale().convertToFloat()));
  Value M = b.create<memref::DimOp>(loc, k, 1);
  Value M16 = K.roundDown(K.add(M, L.idx(kLanes - 1)));
  Value queryPositions = ops.queryPositions;
  const int64_t R = forwardTileRows(bool(queryPositions), a.getMask() == lm::MaskKind::directional);
  Value kt = K.transposedScratch(M16), S = K.scratch({R, ShapedType::kDynamic}, M16);
  Value vp = K.packedScratch(M16);
  const bool relative = bool(ops.relK);
  const int64_t clip = a.getClip(), T = 2 * clip + 1, T16 = (T + kLanes - 1) / kLanes * kLanes;
  Value relKt, PQ, PT;
  if (relative) {
    // relK^T [dh, T16 + 16], P_t [R, T16 + 16] and the padded relative scores [R, 2 M16 + T16 + 16] in one block.
    Value width = K.add(K.add(M16, M16), L.idx(T16 + kLanes));
    SmallVector<Value> views =
        K.scratchViews({{dh, T16 + kLanes}, {R, T16 + kLanes}, {R, ShapedType::kDynamic}}, {width});
    relKt = views[0], PT = views[1], PQ = views[2];
    K.transposeTable(ops.relK, T, relKt);
  }
  Value rows = queryPositions ? L.idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
  Value tiles = b.create<arith::DivUIOp>(loc, K.add(rows, L.idx(R - 1)), L.idx(R));
  // Directional mask: tiles of rows of one direction (VectorKernel::directionOrder).
  Value order = queryPositions ? Value() : K.orderScratch(a.getMask(), rows);

  Value items = b.create<arith::MulIOp>(loc, ops.entries, L.idx(H));
  Value streams = streamsOperands(L, ops.entries, rows, M, D, /*q, out*/ 2, /*k, v*/ 2);
  Value nontemporal = K.nontemporalRows(streams, out);
  K.loop(begin, end, 1, {}, [&](Value item, ValueRange) {
    Value bi = b.create<arith::DivUIOp>(loc, item, L.idx(H));
    Value base = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, item, L.idx(H)), L.idx(dh));
    K.transpose(k, bi, base, M, M16, kt);
    K.packRows(v, bi, base, M, M16, vp);
    if (order)
      K.directionOrder(bi, rows, order);

    Value len = L.lengthOf(bi);
    Value lastRow = b.create<arith::SubIOp>(loc, rows, L.idx(1));
    Value aheadItem = K.add(item, L.idx(2));
    Value hasAhead = L.andI(streams, L.lt(aheadItem, items));
    Value aheadEntry = b.create<arith::DivUIOp>(loc, aheadItem, L.idx(H));
    Value aheadBase = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, aheadItem, L.idx(H)), L.idx(dh));
    L.nest({tiles}, [&](ValueRange t) {
      Value r0 = b.create<arith::MulIOp>(loc, t[0], L.idx(R));
      // The q, k and v lines of the item after next in parts: before the scores, the softmax and each p.v row
      // group (its output rows need none: stored nontemporally when streaming, into the runtime's 64-byte aligned
      // buffers).
      const int64_t pvRows = K.geo.pvRows, pvChunks = K.geo.pvChunks;
      const int64_t parts = 2 + (R + pvRows - 1) / pvRows;
      auto prefetch = [&](int64_t part) {
        K.prefetchNext(hasAhead, aheadEntry, aheadBase, t[0], tiles, r0, R, part, parts, rows, M, {q}, {k, v});
      };
      prefetch(0);
      Tile tile = K.tileRows(bi, r0, R, lastRow, len, queryPositions, Value(), order);
      if (relative)
        K.relativeProducts(q, bi, base, tile.row, relKt, clip, M16, PQ);
      K.scores(q, bi, base, tile, kt, scale, PQ, clip, M16, S);
      prefetch(1);
      SmallVector<Value> sums = K.exponentiate(S, R, tile.from16, tile.to);
      if (relative)
        K.relativeWeights(S, tile.pos, tile.from16, K.roundDown(K.add(tile.to, L.idx(kLanes - 1))), clip, PT);
      SmallVector<Value> inv = K.inverses(sums);
      // out_r = acc_r / l_r (+ the relative values' share), stored.
      auto finish = [&](SmallVector<Value> acc, int64_t r0g, int64_t nr, int64_t c0, int64_t nc) {
        if (relative)
          acc = K.relativeRows(PT, r0g, nr, ops.relV, clip, c0, nc, acc);
        SmallVector<Value> rowsOut, cols;
        for (int64_t c = 0; c < nc; ++c)
          cols.push_back(K.chunk(base, c0 + c));
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t c = 0; c < nc; ++c)
            rowsOut.push_back(b.create<arith::MulFOp>(loc, acc[r * nc + c], inv[r0g + r]));
        // Streaming (the operands exceed the threads' L2): past the caches, the lines are not read first.
        K.storeStreaming(nontemporal, [&](bool nt) {
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = 0; c < nc; ++c)
              K.store(rowsOut[r * nc + c], out, ValueRange{bi, tile.row[r0g + r], cols[c]}, nt);
        });
      };
      // p.v in tiles of pvRows rows x pvChunks feature vectors over the group's key range, feature vectors outer
      // (each one's packed rows stay in the L1 for every row group).
      auto dense = [&] {
        for (int64_t c0 = 0; c0 < chunks; c0 += pvChunks) {
          int64_t nc = std::min(pvChunks, chunks - c0);
          for (int64_t r0g = 0; r0g < R; r0g += pvRows) {
            if (c0 == 0)
              prefetch(2 + r0g / pvRows);
            int64_t nr = std::min(pvRows, R - r0g);
            auto [gLo, gHi] = K.unionRange(tile, r0g, nr);
            finish(SmallVector<Value>(K.weightedRows(S, r0g, nr, vp, M16, c0, nc, gLo, gHi).getResults()), r0g, nr,
                   c0, nc);
          }
        }
      };
      if (a.getMask() != lm::MaskKind::directional) {
        dense();
        return;
      }
      // Directional: a tile of S rows (each hides a random subset of the keys) two rows at a time over the keys
      // either row sees (visibleWeightedRows: the same bits), 4 feature vectors at a time (8 FMA chains a step).
      Value selective = L.ge(tile.ownKey[0], L.idx(0));
      for (int64_t r = 1; r < R; ++r)
        selective = L.andI(selective, L.ge(tile.ownKey[r], L.idx(0)));
      auto split = b.create<scf::IfOp>(loc, selective, /*withElse=*/true);
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(split.thenBlock());
      const int64_t sparseChunks = std::min<int64_t>(chunks, 4);
      constexpr int64_t kPairRows = 2;
      for (int64_t r = 0; r < R; r += kPairRows) {
        if (r % pvRows == 0)
          prefetch(2 + r / pvRows);
        const int64_t nr = std::min(kPairRows, R - r);
        ArrayRef<Value> pos = ArrayRef<Value>(tile.pos).slice(r, nr);
        for (int64_t c0 = 0; c0 < chunks; c0 += sparseChunks) {
          int64_t nc = std::min(sparseChunks, chunks - c0);
          finish(K.visibleWeightedRows(S, r, pos, bi, len, vp, M16, c0, nc), r, nr, c0, nc);
        }
      }
      b.setInsertionPointToStart(split.elseBlock());
      dense();
    });
    return SmallVector<Value>{};
  });
  K.fenceStreaming(nontemporal);
}

/// The vector form's task: items [begin, end) of the operands whose addresses and sizes are in ctx (q, k, v,
/// out, lengths, query positions or 0, relative key and value tables or 0, directional rows and their row count
/// or 0, entries B, query rows, keys M). One per (mask, heads, width, scale, positions, clip, rows' width).
func::FuncOp getOrCreateVectorTask(lm::AttentionOp a, Loops &L) {
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), words = maskRowsWidth(a.getMaskData());
  bool positions = bool(a.getQueryPositions()), relative = bool(a.getRelKey());
  std::string name = llvm::formatv("lm_attention_task_{0}_h{1}_d{2}_s{3:x}{4}{5}{6}",
                                   lm::stringifyMaskKind(a.getMask()), H, D, bitsOf(a.getScale().convertToFloat()),
                                   positions ? "_positions" : "",
                                   relative ? llvm::formatv("_rel{0}", a.getClip()).str() : std::string(),
                                   words ? llvm::formatv("_w{0}", words).str() : std::string());
  return getOrCreateTask(a, L, name, D, [&](TaskFields &f, Value begin, Value end) {
    Value entries = f.field(10), rows = f.field(11), keys = f.field(12);
    int64_t T = 2 * int64_t(a.getClip()) + 1, dh = D / H;
    VectorOperands ops{f.matrix(0, entries, rows),
                       f.matrix(1, entries, keys),
                       f.matrix(2, entries, keys),
                       f.matrix(3, entries, rows),
                       positions ? f.ints(5, entries) : Value(),
                       f.index(entries),
                       relative ? f.table(6, T, dh) : Value(),
                       relative ? f.table(7, T, dh) : Value(),
                       words ? f.directionalRows(8, entries, f.field(9), words) : Value()};
    L.lengths = f.ints(4, entries);
    emitVectorItems(a, L, ops, begin, end);
  });
}

/// The vector form over every (entry, head) item (runItems).
LogicalResult lowerVector(lm::AttentionOp a, Loops &L) {
  L.lengths = L.in(a.getLengths());
  Value q = L.in(a.getQuery()), k = L.in(a.getKey()), v = L.in(a.getValue()), out = L.alloc(a.getType());
  Value queryPositions = a.getQueryPositions() ? L.in(a.getQueryPositions()) : Value();
  Value relK = a.getRelKey() ? L.in(a.getRelKey()) : Value(), relV = a.getRelValue() ? L.in(a.getRelValue()) : Value();
  Value maskRows = a.getMaskData() ? L.in(a.getMaskData()) : Value();
  VectorOperands ops{q, k, v, out, queryPositions, L.B(), relK, relV, maskRows};
  Value rows = L.b.create<memref::DimOp>(L.loc, q, 1), keys = L.b.create<memref::DimOp>(L.loc, k, 1);
  runItems(L, {q, k, v, L.lengths, queryPositions, relK, relV, maskRows}, a.getHeads(), a.getType().getDimSize(2),
           rows, keys,
           {L.address(q), L.address(k), L.address(v), L.address(out), L.address(L.lengths),
            addressOrZero(L, queryPositions), addressOrZero(L, relK), addressOrZero(L, relV),
            addressOrZero(L, maskRows), maskRowCount(L, maskRows)},
           [&] { return getOrCreateVectorTask(a, L); },
           [&](Value begin, Value end) { emitVectorItems(a, L, ops, begin, end); });
  return L.set(a, out);
}

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

  using attention::kKeyTile;
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
  L.nest({L.B(), L.idx(H), queryRows}, [&](ValueRange iv) {
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
    if ((width / heads) % kLanes == 0)
      return lowerVector(a, L);
    return lowerScalar(a, L);
  }
};

} // namespace

void populateAttentionPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<AttentionLowering>(converter, patterns.getContext(), context);
}

namespace {

/// Lowers the kernel module's lm ops by `populate`'s patterns alone, for `kernelTarget` (the argument casts fold
/// away); the kernel writes its output arguments directly (in a model the next op reads the buffer; a
/// copy would be benchmark overhead): each copy's source buffer becomes its argument.
OwningOpRef<ModuleOp> lowerKernelModule(MLIRContext &context, OwningOpRef<ModuleOp> module,
                                        void (*populate)(TypeConverter &, RewritePatternSet &,
                                                         const LoweringContext &),
                                        KernelTarget kernelTarget) {
  TypeConverter converter;
  ConversionTarget target(context);
  configureLowering(converter, target);
  const WeightLayout noWeights;
  LoweringContext lowering;
  lowering.layout = &noWeights;
  lowering.tile = GemmTile::forVectorBits(kernelTarget.vectorBits ? kernelTarget.vectorBits : targetVectorBits(""));
  lowering.halfBlocks = kernelTarget.splitsWideVectors.value_or(targetSplitsWideVectors(""));
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
  b.create<func::FuncOp>(loc, "lm_rt_private_cache_bytes", b.getFunctionType({}, {b.getI64Type()})).setPrivate();
  return module;
}

} // namespace

OwningOpRef<ModuleOp> buildAttentionModule(MLIRContext &context, lm::MaskKind mask, int64_t heads, int64_t dModel,
                                           int64_t clip, int64_t rowWords, KernelTarget target) {
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = kernelModule(context, b);
  int64_t dyn = ShapedType::kDynamic;
  auto t3 = RankedTensorType::get({dyn, dyn, dModel}, b.getF32Type());
  auto t1 = RankedTensorType::get({dyn}, b.getI32Type());
  auto t2 = RankedTensorType::get({2 * clip + 1, dModel / heads}, b.getF32Type());
  auto tRows = RankedTensorType::get({dyn, dyn, rowWords}, b.getI32Type());
  auto m3 = bufferType(t3), m1 = bufferType(t1), m2 = bufferType(t2);
  SmallVector<Type> args{m3, m3, m3, m1};
  const int rel = rowWords > 0 ? 5 : 4; // the first relative table's argument
  if (rowWords > 0)
    args.push_back(bufferType(tRows));
  if (clip > 0)
    args.append({m2, m2});
  args.push_back(m3);
  auto fn = b.create<func::FuncOp>(loc, "attention_kernel", b.getFunctionType(args, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto tensor = [&](Value m, Type t) { return b.create<UnrealizedConversionCastOp>(loc, t, m).getResult(0); };
  Value rows = rowWords > 0 ? tensor(entry->getArgument(4), tRows) : Value();
  Value relK = clip > 0 ? tensor(entry->getArgument(rel), t2) : Value();
  Value relV = clip > 0 ? tensor(entry->getArgument(rel + 1), t2) : Value();
  auto attention =
      b.create<lm::AttentionOp>(loc, t3, tensor(entry->getArgument(0), t3), tensor(entry->getArgument(1), t3),
                                tensor(entry->getArgument(2), t3), tensor(entry->getArgument(3), t1), rows, relK,
                                relV, Value(), b.getI64IntegerAttr(heads), lm::MaskKindAttr::get(&context, mask),
                                b.getF32FloatAttr(1.0f / std::sqrt(float(dModel / heads))), b.getI64IntegerAttr(clip));
  Value result = b.create<UnrealizedConversionCastOp>(loc, m3, attention.getResult()).getResult(0);
  b.create<memref::CopyOp>(loc, result, entry->getArgument(args.size() - 1));
  b.create<func::ReturnOp>(loc);
  return lowerKernelModule(context, std::move(module), populateAttentionPatterns, target);
}

OwningOpRef<ModuleOp> buildAttentionGradModule(MLIRContext &context, lm::MaskKind mask, int64_t heads, int64_t dModel,
                                               int64_t clip, int64_t rowWords, KernelTarget target) {
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = kernelModule(context, b);
  declareTrainingRuntime(b, loc);
  int64_t dyn = ShapedType::kDynamic;
  auto t3 = RankedTensorType::get({dyn, dyn, dModel}, b.getF32Type());
  auto t1 = RankedTensorType::get({dyn}, b.getI32Type());
  auto t2 = RankedTensorType::get({2 * clip + 1, dModel / heads}, b.getF32Type());
  auto tRows = RankedTensorType::get({dyn, dyn, rowWords}, b.getI32Type());
  auto m3 = bufferType(t3), m1 = bufferType(t1), m2 = bufferType(t2);
  const bool relative = clip > 0;
  // (dO, q, k, v, lengths[, rows][, rel_k, rel_v], dq, dk, dv[, drel_k, drel_v])
  SmallVector<Type> args{m3, m3, m3, m3, m1};
  const int rel = rowWords > 0 ? 6 : 5; // the first relative table's argument
  if (rowWords > 0)
    args.push_back(bufferType(tRows));
  if (relative)
    args.append({m2, m2});
  args.append({m3, m3, m3});
  if (relative)
    args.append({m2, m2});
  auto fn = b.create<func::FuncOp>(loc, "attention_grad_kernel", b.getFunctionType(args, {}));
  fn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto tensor = [&](Value m, Type t) { return b.create<UnrealizedConversionCastOp>(loc, t, m).getResult(0); };
  auto arg = [&](int i) { return entry->getArgument(i); };
  SmallVector<Type> results{t3, t3, t3};
  if (relative)
    results.append({t2, t2});
  auto grad = b.create<lm::AttentionGradOp>(
      loc, results, tensor(arg(0), t3), tensor(arg(1), t3), tensor(arg(2), t3), tensor(arg(3), t3),
      tensor(arg(4), t1), rowWords > 0 ? tensor(arg(5), tRows) : Value(), Value(),
      relative ? tensor(arg(rel), t2) : Value(), relative ? tensor(arg(rel + 1), t2) : Value(),
      b.getI64IntegerAttr(heads), lm::MaskKindAttr::get(&context, mask),
      b.getF32FloatAttr(1.0f / std::sqrt(float(dModel / heads))), b.getI64IntegerAttr(clip));
  const int first = rel + (relative ? 2 : 0);
  for (int i = 0; i < int(results.size()); ++i)
    b.create<memref::CopyOp>(
        loc, b.create<UnrealizedConversionCastOp>(loc, i < 3 ? m3 : m2, grad->getResult(i)).getResult(0),
        arg(first + i));
  b.create<func::ReturnOp>(loc);
  return lowerKernelModule(context, std::move(module), populateBackwardPatterns, target);
}

} // namespace lmcc::codegen
