//===- Attention.cpp - lm-to-loops: fused attention -------------------------===//
//
// lm.attention as a key-tiled online softmax with the mask as structure, and a vector form for head sizes
// that are multiples of 16 (no relative positions).
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

/// vector.shuffle masks interleaving the low (high) halves of two 16-lane vectors.
SmallVector<int64_t> interleaveMask(bool high) {
  SmallVector<int64_t> mask;
  for (int64_t l = 0; l < kLanes / 2; ++l) {
    mask.push_back(l + (high ? kLanes / 2 : 0));
    mask.push_back(l + (high ? kLanes / 2 : 0) + kLanes);
  }
  return mask;
}

/// The buffers of one vector-form attention, and its entry count B.
struct VectorOperands {
  Value q, k, v, out, queryPositions, entries;
};

/// lm.attention with vectors (no relative positions, no per-row mask data; head size a multiple of 16),
/// register-tiled like the GEMM.
/// Work items are the (entry, head) pairs, entry-major; items [begin, end) run here. Per item the head's keys
/// are transposed into kt [dh, M16] (16 x 16 blocks transposed in registers by four rounds of interleaves; M keys
/// rounded up to 16, zero tail). Query rows go in tiles of R = 8 rows
/// (R = 1 for single-query entries, lm-prune-rows), the last tile repeating the last row; a tile visits the
/// union of its rows' key ranges [lo, hi) (each row's range as in the scalar form below):
///   scores  S[r, j..j+16) = (sum_e q_re * kt[e, j..j+16)) * scale: one key vector load per R FMAs; lanes a row
///           cannot see (outside its range, or its own key under the diagonal mask) are -inf, tested only in
///           blocks that are not fully visible to every row of the tile;
///   softmax m_r = max_j S[r, j], p = e^(S - m_r) (vector exp; 0 where -inf), l_r = sum_j p (lanes by j mod 16,
///           blocks in order: the zero blocks outside a row's range change nothing, so a row's result does not
///           depend on its tile);
///   p.v     out_r = (sum_j p_rj v_j) / l_r over the tile's rows in groups of 4 x 64 features, one value
///           vector load per 4 FMAs (p_rj = 0 adds exactly nothing); zero when a row sees no key.
void emitVectorItems(lm::AttentionOp a, Loops &L, const VectorOperands &ops, Value begin, Value end) {
  auto &b = L.b;
  Location loc = L.loc;
  auto scratch = [&](ArrayRef<int64_t> shape, ValueRange dyn) -> Value {
    return b.create<memref::AllocOp>(loc, MemRefType::get(shape, L.f32()), dyn, b.getI64IntegerAttr(64));
  };

  Value q = ops.q, k = ops.k, v = ops.v, out = ops.out;
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, chunks = dh / kLanes;
  lm::MaskKind mask = a.getMask();
  auto vt = VectorType::get({kLanes}, L.f32());
  auto it = VectorType::get({kLanes}, b.getIndexType());
  auto bcast = [&](Value x) { return b.create<vector::BroadcastOp>(loc, isa<IndexType>(x.getType()) ? it : vt, x); };
  Value scale = bcast(L.f32c(a.getScale().convertToFloat()));
  Value negInf = L.f32c(-INFINITY), negInfV = bcast(negInf), zeroV = bcast(L.f32c(0));
  Value M = b.create<memref::DimOp>(loc, k, 1);
  auto roundDown = [&](Value x) {
    return b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, x, L.idx(kLanes)), L.idx(kLanes));
  };
  Value M16 = roundDown(b.create<arith::AddIOp>(loc, M, L.idx(kLanes - 1)));
  Value queryPositions = ops.queryPositions;
  const int64_t R = queryPositions ? 1 : kTileRows;
  Value kt = scratch({dh, ShapedType::kDynamic}, M16), S = scratch({R, ShapedType::kDynamic}, M16);
  SmallVector<int64_t> lanes(kLanes);
  for (int64_t l = 0; l < kLanes; ++l)
    lanes[l] = l;
  Value iota = b.create<arith::ConstantOp>(loc, it, DenseElementsAttr::get(it, ArrayRef<int64_t>(lanes)));
  Value rows = queryPositions ? L.idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
  Value tiles = b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, rows, L.idx(R - 1)), L.idx(R));
  SmallVector<int64_t> lowMask = interleaveMask(false), highMask = interleaveMask(true);

  // for loop [lb, ub) step `step` carrying `init`; body(iv, args) returns the next args.
  auto loop = [&](Value lb, Value ub, int64_t step, ValueRange init,
                  const std::function<SmallVector<Value>(Value, ValueRange)> &body) -> scf::ForOp {
    auto f = b.create<scf::ForOp>(loc, lb, ub, L.idx(step), init);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(f.getBody());
    SmallVector<Value> next = body(f.getInductionVar(), f.getRegionIterArgs());
    if (init.empty()) // the builder made the terminator
      return f;
    b.create<scf::YieldOp>(loc, next);
    return f;
  };

  Value items = b.create<arith::MulIOp>(loc, ops.entries, L.idx(H));
  loop(begin, end, 1, {}, [&](Value item, ValueRange) {
    Value bi = b.create<arith::DivUIOp>(loc, item, L.idx(H));
    Value base = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, item, L.idx(H)), L.idx(dh));
    auto feature = [&](Value e) { return b.create<arith::AddIOp>(loc, base, e); };
    // kt for this head (its slice of every key row read front to back): full blocks of 16 keys x 16 features
    // transposed in registers, the rest element by element, zeros up to M16.
    Value fullKeys = roundDown(M);
    loop(L.idx(0), fullKeys, kLanes, {}, [&](Value j0, ValueRange) {
      loop(L.idx(0), L.idx(dh), kLanes, {}, [&](Value e0, ValueRange) {
        SmallVector<Value> rowsV;
        for (int64_t r = 0; r < kLanes; ++r)
          rowsV.push_back(b.create<vector::LoadOp>(
              loc, vt, k, ValueRange{bi, b.create<arith::AddIOp>(loc, j0, L.idx(r)), feature(e0)}));
        for (int round = 0; round < 4; ++round) {
          SmallVector<Value> next;
          for (int64_t r = 0; r < kLanes / 2; ++r) {
            next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], lowMask));
            next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], highMask));
          }
          rowsV = next;
        }
        for (int64_t e = 0; e < kLanes; ++e)
          b.create<vector::StoreOp>(loc, rowsV[e], kt, ValueRange{b.create<arith::AddIOp>(loc, e0, L.idx(e)), j0});
        return SmallVector<Value>{};
      });
      return SmallVector<Value>{};
    });
    loop(fullKeys, M16, 1, {}, [&](Value j, ValueRange) {
      Value real = L.lt(j, M);
      L.nest({L.idx(dh)}, [&](ValueRange e) {
        Value x = L.choose(real, L.f32(), [&] { return L.load(k, {bi, j, feature(e[0])}); }, [&] { return L.f32c(0); });
        L.store(x, kt, {e[0], j});
      });
      return SmallVector<Value>{};
    });

    Value len = L.lengthOf(bi);
    Value lastRow = b.create<arith::SubIOp>(loc, rows, L.idx(1));
    Value nextItem = b.create<arith::AddIOp>(loc, item, L.idx(1));
    Value hasNext = L.lt(nextItem, items);
    Value nextEntry = b.create<arith::DivUIOp>(loc, nextItem, L.idx(H));
    Value nextBase = b.create<arith::MulIOp>(loc, b.create<arith::RemUIOp>(loc, nextItem, L.idx(H)), L.idx(dh));
    L.nest({tiles}, [&](ValueRange t) {
      Value r0 = b.create<arith::MulIOp>(loc, t[0], L.idx(R));
      // While this tile computes, the next item's rows r0..r0+R (and after the last tile every remaining key)
      // move to L2: at batch > 1 the kernel streams its operands from memory, and the prefetches spread over the
      // tiles keep that off the critical path.
      L.when(hasNext, [&] {
        auto prefetch = [&](Value buffer, Value from, Value to, bool write) {
          L.nest({b.create<arith::SubIOp>(loc, to, from), L.idx(chunks)}, [&](ValueRange jc) {
            Value j = b.create<arith::AddIOp>(loc, from, jc[0]);
            Value e = b.create<arith::AddIOp>(loc, nextBase, b.create<arith::MulIOp>(loc, jc[1], L.idx(kLanes)));
            b.create<memref::PrefetchOp>(loc, buffer, ValueRange{nextEntry, j, e}, write, /*localityHint=*/2,
                                         /*isDataCache=*/true);
          });
        };
        Value r1 = b.create<arith::AddIOp>(loc, r0, L.idx(R));
        Value rowsTo = b.create<arith::MinSIOp>(loc, r1, rows);
        Value last = L.eqI(t[0], b.create<arith::SubIOp>(loc, tiles, L.idx(1)));
        Value keysFrom = b.create<arith::MinSIOp>(loc, r0, M);
        Value keysTo = L.select(last, M, b.create<arith::MinSIOp>(loc, r1, M));
        prefetch(k, keysFrom, keysTo, false);
        prefetch(v, keysFrom, keysTo, false);
        prefetch(q, r0, rowsTo, false);
        prefetch(out, r0, rowsTo, true);
      });
      // The tile's rows (the last tile repeats the last row), their positions and key ranges.
      SmallVector<Value> row(R), pos(R), lo(R), hi(R);
      for (int64_t r = 0; r < R; ++r) {
        row[r] = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, r0, L.idx(r)), lastRow);
        pos[r] = queryPositions ? L.toIndex(L.load(queryPositions, bi)) : row[r];
        lo[r] = mask == lm::MaskKind::anticausal ? pos[r] : L.idx(0);
        hi[r] = mask == lm::MaskKind::causal
                    ? Value(b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, pos[r], L.idx(1))))
                    : len;
      }
      auto unionRange = [&](int64_t first, int64_t count) {
        Value l = lo[first], h = hi[first];
        for (int64_t r = first + 1; r < first + count; ++r) {
          l = b.create<arith::MinSIOp>(loc, l, lo[r]);
          h = b.create<arith::MaxSIOp>(loc, h, hi[r]);
        }
        return std::pair<Value, Value>(l, h);
      };
      auto [tileLo, tileHi] = unionRange(0, R);
      Value tileLo16 = roundDown(tileLo);
      // The tile's rows see every key of [allLo, allHi) (but their own under the diagonal mask).
      Value allLo = lo[0], allHi = hi[0];
      for (int64_t r = 1; r < R; ++r) {
        allLo = b.create<arith::MaxSIOp>(loc, allLo, lo[r]);
        allHi = b.create<arith::MinSIOp>(loc, allHi, hi[r]);
      }

      // Scores, one 16-key block at a time: R accumulators (4 partial chains per row when R = 1).
      const int64_t chains = R >= 4 ? 1 : 4;
      loop(tileLo16, tileHi, kLanes, {}, [&](Value jb, ValueRange) {
        SmallVector<Value> zeros(R * chains, zeroV);
        auto dot = loop(L.idx(0), L.idx(dh), 4, zeros, [&](Value e0, ValueRange acc) {
          SmallVector<Value> next(acc.begin(), acc.end());
          for (int64_t u = 0; u < 4; ++u) {
            Value e = b.create<arith::AddIOp>(loc, e0, L.idx(u));
            Value kv = b.create<vector::LoadOp>(loc, vt, kt, ValueRange{e, jb});
            for (int64_t r = 0; r < R; ++r) {
              Value qe = bcast(L.load(q, {bi, row[r], feature(e)}));
              int64_t slot = r * chains + u % chains;
              next[slot] = b.create<vector::FMAOp>(loc, qe, kv, next[slot]);
            }
          }
          return next;
        });
        SmallVector<Value> s(R);
        for (int64_t r = 0; r < R; ++r) {
          Value sum = dot.getResult(r * chains);
          if (chains == 4)
            sum = b.create<arith::AddFOp>(
                loc, b.create<arith::AddFOp>(loc, sum, dot.getResult(r * chains + 1)),
                b.create<arith::AddFOp>(loc, dot.getResult(r * chains + 2), dot.getResult(r * chains + 3)));
          s[r] = b.create<arith::MulFOp>(loc, sum, scale);
        }
        Value jEnd = b.create<arith::AddIOp>(loc, jb, L.idx(kLanes));
        Value full = L.andI(L.ge(jb, allLo), L.le(jEnd, allHi));
        if (mask == lm::MaskKind::diagonal) // rows' own keys pos[0]..pos[R-1] (contiguous) miss the block
          full = L.andI(full, L.orI(L.ge(pos[0], jEnd), L.lt(pos[R - 1], jb)));
        auto test = b.create<scf::IfOp>(loc, full, /*withElse=*/true);
        {
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPointToStart(test.thenBlock());
          for (int64_t r = 0; r < R; ++r)
            b.create<vector::StoreOp>(loc, s[r], S, ValueRange{L.idx(r), jb});
          b.setInsertionPointToStart(test.elseBlock());
          Value j = b.create<arith::AddIOp>(loc, bcast(jb), iota);
          for (int64_t r = 0; r < R; ++r) {
            Value visible = L.andI(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(lo[r])),
                                   b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, bcast(hi[r])));
            if (mask == lm::MaskKind::diagonal)
              visible = L.andI(visible, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, bcast(pos[r])));
            b.create<vector::StoreOp>(loc, L.select(visible, s[r], negInfV), S, ValueRange{L.idx(r), jb});
          }
        }
        return SmallVector<Value>{};
      });

      // Softmax: row maxima, then p = e^(s - m) in place and the row sums.
      SmallVector<Value> ninf(R, negInfV);
      auto maxima = loop(tileLo16, tileHi, kLanes, ninf, [&](Value jb, ValueRange mx) {
        SmallVector<Value> next;
        for (int64_t r = 0; r < R; ++r)
          next.push_back(b.create<arith::MaximumFOp>(
              loc, mx[r], b.create<vector::LoadOp>(loc, vt, S, ValueRange{L.idx(r), jb})));
        return next;
      });
      SmallVector<Value> mV(R);
      for (int64_t r = 0; r < R; ++r) {
        Value m = b.create<vector::ReductionOp>(loc, vector::CombiningKind::MAXIMUMF, maxima.getResult(r));
        // A row that sees no key: m = 0 keeps e^(-inf - m) = 0 (and its sum 0).
        m = L.select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, m, negInf), m, L.f32c(0));
        mV[r] = bcast(m);
      }
      SmallVector<Value> zerosR(R, zeroV);
      auto sums = loop(tileLo16, tileHi, kLanes, zerosR, [&](Value jb, ValueRange acc) {
        SmallVector<Value> next;
        for (int64_t r = 0; r < R; ++r) {
          Value p = b.create<math::ExpOp>(
              loc, b.create<arith::SubFOp>(loc, b.create<vector::LoadOp>(loc, vt, S, ValueRange{L.idx(r), jb}),
                                           mV[r]));
          b.create<vector::StoreOp>(loc, p, S, ValueRange{L.idx(r), jb});
          next.push_back(b.create<arith::AddFOp>(loc, acc[r], p));
        }
        return next;
      });

      // p.v in tiles of kPvRows rows x kPvChunks feature vectors over the group's key range.
      for (int64_t r0g = 0; r0g < R; r0g += kPvRows) {
        int64_t nr = std::min(kPvRows, R - r0g);
        auto [gLo, gHi] = unionRange(r0g, nr);
        SmallVector<Value> inv(nr);
        for (int64_t r = 0; r < nr; ++r) {
          Value l = b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, sums.getResult(r0g + r));
          Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, L.f32c(0));
          inv[r] = bcast(L.select(seen, b.create<arith::DivFOp>(loc, L.f32c(1), l), L.f32c(0)));
        }
        for (int64_t c0 = 0; c0 < chunks; c0 += kPvChunks) {
          int64_t nc = std::min(kPvChunks, chunks - c0);
          SmallVector<Value> zeros(nr * nc, zeroV);
          auto acc = loop(gLo, gHi, 1, zeros, [&](Value j, ValueRange a) {
            SmallVector<Value> next(a.begin(), a.end());
            SmallVector<Value> vj;
            for (int64_t c = 0; c < nc; ++c)
              vj.push_back(b.create<vector::LoadOp>(loc, vt, v, ValueRange{bi, j, feature(L.idx((c0 + c) * kLanes))}));
            for (int64_t r = 0; r < nr; ++r) {
              Value p = bcast(L.load(S, {L.idx(r0g + r), j}));
              for (int64_t c = 0; c < nc; ++c)
                next[r * nc + c] = b.create<vector::FMAOp>(loc, p, vj[c], next[r * nc + c]);
            }
            return next;
          });
          for (int64_t r = 0; r < nr; ++r)
            for (int64_t c = 0; c < nc; ++c)
              b.create<vector::StoreOp>(loc, b.create<arith::MulFOp>(loc, acc.getResult(r * nc + c), inv[r]), out,
                                        ValueRange{bi, row[r0g + r], feature(L.idx((c0 + c) * kLanes))});
        }
      }
    });
    return SmallVector<Value>{};
  });
}

/// The vector form's task: items [begin, end) of the operands whose addresses and sizes are in ctx (q, k, v,
/// out, lengths, query positions or 0, entries B, query rows, keys M). One per (mask, heads, width, scale).
func::FuncOp getOrCreateVectorTask(lm::AttentionOp a, Loops &L) {
  int64_t D = a.getType().getDimSize(2), H = a.getHeads();
  float scale = a.getScale().convertToFloat();
  uint32_t scaleBits;
  std::memcpy(&scaleBits, &scale, sizeof scaleBits);
  bool positions = bool(a.getQueryPositions());
  std::string name = llvm::formatv("lm_attention_task_{0}_h{1}_d{2}_s{3:x}{4}", lm::stringifyMaskKind(a.getMask()),
                                   H, D, scaleBits, positions ? "_positions" : "");
  auto module = a->getParentOfType<ModuleOp>();
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  auto &b = L.b;
  Location loc = L.loc;
  OpBuilder::InsertionGuard guard(b);
  func::FuncOp task = createTask(b, module, name);
  Block *entry = &task.getBody().front();
  b.setInsertionPointToStart(entry);
  auto field = [&](int64_t i) { return taskField(b, loc, entry->getArgument(0), i); };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, b.getI64Type(), b.getI64IntegerAttr(v)); };
  auto mul = [&](Value x, Value y) -> Value { return b.create<LLVM::MulOp>(loc, x, y); };
  auto index = [&](Value i64) -> Value { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), i64); };
  int64_t dyn = ShapedType::kDynamic;
  auto rows3 = MemRefType::get({dyn, dyn, D}, L.f32()), ints = MemRefType::get({dyn}, L.i32());
  Value entries = field(6), rows = field(7), keys = field(8);
  auto matrix = [&](Value address, Value n) {
    return memrefAt(b, loc, address, {entries, n, c64(D)}, {mul(n, c64(D)), c64(D), c64(1)}, rows3);
  };
  VectorOperands ops{matrix(field(0), rows), matrix(field(1), keys), matrix(field(2), keys), matrix(field(3), rows),
                     Value(), index(entries)};
  Value lengths = memrefAt(b, loc, field(4), {entries}, {c64(1)}, ints);
  if (positions)
    ops.queryPositions = memrefAt(b, loc, field(5), {entries}, {c64(1)}, ints);
  Value kernelLengths = L.lengths;
  L.lengths = lengths;
  emitVectorItems(a, L, ops, index(entry->getArgument(1)), index(entry->getArgument(2)));
  L.lengths = kernelLengths;
  b.create<func::ReturnOp>(loc);
  return task;
}

/// The vector form over every (entry, head) item: split over the runtime's threads by a task when the operands
/// are whole buffers and the call has work enough to pay for it (at batch 1 the heads of one sentence would
/// otherwise run on one core while the GEMMs around them use every core), else inline.
LogicalResult lowerVector(lm::AttentionOp a, Loops &L) {
  auto &b = L.b;
  Location loc = L.loc;
  L.lengths = L.in(a.getLengths());
  Value q = L.in(a.getQuery()), k = L.in(a.getKey()), v = L.in(a.getValue()), out = L.alloc(a.getType());
  Value queryPositions = a.getQueryPositions() ? L.in(a.getQueryPositions()) : Value();
  VectorOperands ops{q, k, v, out, queryPositions, L.B};
  Value items = b.create<arith::MulIOp>(loc, L.B, L.idx(a.getHeads()));
  auto whole = [](Value m) { return llvm::cast<MemRefType>(m.getType()).getLayout().isIdentity(); };
  if (!whole(q) || !whole(k) || !whole(v) || !whole(L.lengths) || (queryPositions && !whole(queryPositions))) {
    emitVectorItems(a, L, ops, L.idx(0), items);
    return L.set(a, out);
  }
  func::FuncOp task = getOrCreateVectorTask(a, L);
  auto i64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
  Value rows = b.create<memref::DimOp>(loc, q, 1), keys = b.create<memref::DimOp>(loc, k, 1);
  // Query rows x keys x width multiply-adds of every entry: below 2^16 (a few microseconds) the call stays on
  // this thread.
  Value work = b.create<arith::MulIOp>(
      loc, b.create<arith::MulIOp>(loc, L.B, b.create<arith::MulIOp>(loc, rows, keys)),
      L.idx(a.getType().getDimSize(2)));
  Value serial = L.lt(work, L.idx(1 << 16));
  L.parallelFor(task, items,
                {L.address(q), L.address(k), L.address(v), L.address(out), L.address(L.lengths),
                 queryPositions ? L.address(queryPositions) : L.i64c(0), i64(L.B), i64(rows), i64(keys)},
                serial);
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

OwningOpRef<ModuleOp> buildAttentionModule(MLIRContext &context, lm::MaskKind mask, int64_t heads, int64_t dModel) {
  context.loadDialect<lm::LmDialect, arith::ArithDialect, func::FuncDialect, math::MathDialect, memref::MemRefDialect,
                      scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect>();
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto ptr = LLVM::LLVMPointerType::get(&context);
  b.create<func::FuncOp>(loc, "lm_rt_parallel_for", b.getFunctionType({b.getI64Type(), ptr, ptr}, {})).setPrivate();
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
  // The model lowering's attention pattern alone; the argument casts fold away.
  TypeConverter converter;
  ConversionTarget target(context);
  configureLowering(converter, target);
  const WeightLayout noWeights;
  LoweringContext lowering;
  lowering.layout = &noWeights;
  RewritePatternSet patterns(&context);
  populateAttentionPatterns(converter, patterns, lowering);
  if (failed(applyPartialConversion(*module, target, std::move(patterns))))
    return nullptr;
  foldCastPairs(*module);
  // The kernel writes its output argument directly (in a model the next op reads the buffer; a copy would be
  // benchmark overhead): the copy's source buffer becomes the argument.
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

} // namespace lmcc::codegen
