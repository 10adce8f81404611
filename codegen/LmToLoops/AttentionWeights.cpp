//===- AttentionWeights.cpp - The attention vector forms: softmax and weighted rows ===//
//
// VectorKernel's pieces after the scores (AttentionVector.h declares and documents them): the lane reductions and
// the vector exponential of the softmax, the products of a tile's row weights with key-major rows (p.v, dq), the
// relative-position terms and the backward's dK / dV updates.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/AttentionVector.h"

namespace lmcc::codegen::attention {

std::function<Value(Value, Value)> VectorKernel::combiner(bool sum) {
  return [this, sum](Value x, Value y) { return sum ? Value(b.create<arith::AddFOp>(loc, x, y)) : greater(x, y); };
}

Value VectorKernel::allLanes(Value x, bool sum) { return emitAcrossLanes(b, loc, x, combiner(sum)); }

SmallVector<Value> VectorKernel::acrossRows(ArrayRef<Value> xs, bool sum, const std::function<Value(Value)> &then) {
  return emitAcrossLanesOfEach(b, loc, xs, combiner(sum), then);
}

Value VectorKernel::expOf(Value x) { return emitVectorExp(b, loc, x); }

SmallVector<Value> VectorKernel::exponentiate(Value S, int64_t R, Value from16, Value to) {
  SmallVector<Value> sums;
  rowGroups(R, geo.scoreRows, [&](int64_t r0, int64_t n) {
    SmallVector<Value> ninf(n, negInfV);
    auto maxima = loop(from16, to, kLanes, ninf, [&](Value jb, ValueRange mx) {
      SmallVector<Value> next;
      for (int64_t r = 0; r < n; ++r)
        next.push_back(greater(mx[r], load(S, ValueRange{L.idx(r0 + r), jb})));
      return next;
    });
    SmallVector<Value> mV = acrossRows(SmallVector<Value>(maxima.getResults()), /*sum=*/false, [&](Value m) {
      return b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, m, negInfV), m,
                                       zeroV);
    });
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

scf::ForOp VectorKernel::weightedRows(Value W, int64_t r0, int64_t nr, Value packed, Value M16, int64_t c0, int64_t nc,
                                      Value lo, Value hi) {
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

SmallVector<Value> VectorKernel::visibleWeightedRows(Value W, int64_t r0, ArrayRef<Value> pos, Value bi, Value len,
                                                     Value packed, Value M16, int64_t c0, int64_t nc) {
  const int64_t nr = pos.size();
  SmallVector<Value> firstRows = packedFirstRows(M16, c0, nc);
  // The key loop's operands as views at their own addresses: each feature vector's packed rows and each row's
  // weights, so that a key's loads share one scaled index (a key's packed rows c0 M16 + j.. as one view's
  // indices cost a shift and an add each, the loop bound on its scalar instructions).
  Type i64 = b.getI64Type();
  auto asI64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, i64, index); };
  // `rows` x `width` floats (width 1: a vector) from float `offset` of the buffer at byte address `base`.
  auto viewAt = [&](Value base, Value offset, Value rows, int64_t width) {
    Value at = b.create<arith::AddIOp>(loc, base, b.create<arith::MulIOp>(loc, asI64(offset), L.i64c(4)));
    if (width == 1)
      return memrefAt(b, loc, at, {asI64(rows)}, {L.i64c(1)}, MemRefType::get({ShapedType::kDynamic}, L.f32()));
    return memrefAt(b, loc, at, {asI64(rows), L.i64c(width)}, {L.i64c(width), L.i64c(1)},
                    MemRefType::get({ShapedType::kDynamic, width}, L.f32()));
  };
  Value packedAt = L.address(packed), weightsAt = L.address(W), weightCols = b.create<memref::DimOp>(loc, W, 1);
  SmallVector<Value> vectors, weightRows;
  for (Value first : firstRows)
    vectors.push_back(viewAt(packedAt, b.create<arith::MulIOp>(loc, first, L.idx(kLanes)), M16, kLanes));
  for (int64_t r = 0; r < nr; ++r)
    weightRows.push_back(viewAt(weightsAt, b.create<arith::MulIOp>(loc, L.idx(r0 + r), weightCols), weightCols, 1));
  Value words = b.create<arith::DivUIOp>(loc, add(len, L.idx(31)), L.idx(32));
  Type i32 = L.i32();
  auto word32 = [&](Value index) { return b.create<arith::IndexCastOp>(loc, i32, index).getResult(); };
  Value allOnes = L.i32c(-1), zero32 = L.i32c(0), one32 = L.i32c(1);
  auto sums = loop(L.idx(0), words, 1, SmallVector<Value>(nr * nc, zeroV), [&](Value w, ValueRange acc) {
    Value start = b.create<arith::MulIOp>(loc, w, L.idx(32));
    // Keys from len on: bits from len - start on cleared (none when the word is below len - 32).
    Value remaining = b.create<arith::SubIOp>(loc, len, start);
    Value below = b.create<arith::SubIOp>(
        loc, b.create<arith::ShLIOp>(loc, one32, word32(b.create<arith::MinSIOp>(loc, remaining, L.idx(31)))), one32);
    Value inLength = L.select(L.lt(remaining, L.idx(32)), below, allOnes);
    // The keys of this word some row sees: per row its hidden-key word less its own key (bit pos mod 32 of word
    // pos / 32), within the length.
    Value anyShown = zero32;
    for (Value p : pos) {
      Value own =
          L.select(L.eqI(b.create<arith::DivUIOp>(loc, p, L.idx(32)), w),
                   b.create<arith::ShLIOp>(loc, one32, word32(b.create<arith::RemUIOp>(loc, p, L.idx(32)))), zero32);
      Value hidden = L.load(maskRows, {bi, p, add(L.idx(1), w)});
      Value seen = b.create<arith::XOrIOp>(loc, b.create<arith::OrIOp>(loc, hidden, own), allOnes);
      anyShown = b.create<arith::OrIOp>(loc, anyShown, seen);
    }
    Value shown = b.create<arith::AndIOp>(loc, anyShown, inLength);
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
          SmallVector<Value> v;
          for (int64_t c = 0; c < nc; ++c)
            v.push_back(load(vectors[c], ValueRange{j, L.idx(0)}));
          for (int64_t r = 0; r < nr; ++r) {
            Value p = bcast(L.load(weightRows[r], {j}));
            for (int64_t c = 0; c < nc; ++c)
              next.push_back(b.create<vector::FMAOp>(loc, p, v[c], args[1 + r * nc + c]));
          }
          b.create<scf::YieldOp>(loc, next);
        });
    return SmallVector<Value>(keys.getResults().drop_front());
  });
  return SmallVector<Value>(sums.getResults());
}

void VectorKernel::relativeProducts(Value a, Value bi, Value base, ArrayRef<Value> row, Value relT, int64_t clip,
                                    Value M16, Value PQ) {
  const int64_t R = row.size(), T = 2 * clip + 1;
  auto [first, last] = tableRows(clip);
  SmallVector<SmallVector<Value>> blocks; // [block][row]
  for (int64_t t0 = first; t0 <= last; t0 += kLanes) {
    // A last block of at most 8 table rows (T = 2c + 1 = 33 for the Diformer's c = 16: the lone t = 32, or t = 16
    // under a triangular mask) takes 8 lanes where they cost half: the same FMA chain per lane.
    const VectorType type =
        last - t0 < kLanes / 2 && geo.halfVectorsCheaper() ? VectorType::get({kLanes / 2}, L.f32()) : vt;
    Value zero = b.create<arith::ConstantOp>(loc, type, DenseElementsAttr::get(type, 0.0f));
    blocks.emplace_back();
    rowGroups(R, geo.scoreRows, [&](int64_t r0, int64_t n) {
      SmallVector<Value> zeros(n, zero);
      auto dot = loop(L.idx(0), L.idx(dh), 1, zeros, [&](Value e, ValueRange acc) {
        Value kv = b.create<vector::LoadOp>(loc, type, relT, ValueRange{e, L.idx(t0)});
        SmallVector<Value> next;
        for (int64_t r = 0; r < n; ++r) {
          Value qe = b.create<vector::BroadcastOp>(loc, type, L.load(a, {bi, row[r0 + r], add(base, e)}));
          next.push_back(b.create<vector::FMAOp>(loc, qe, kv, acc[r]));
        }
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

void VectorKernel::relativeWeights(Value W, ArrayRef<Value> pos, Value from16, Value to16, int64_t clip, Value Wt) {
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
            b.create<arith::SelectOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sle, j, bcast(low)), w,
                                      zeroV));
      if (above)
        next[1] = b.create<arith::AddFOp>(
            loc, acc[1],
            b.create<arith::SelectOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, bcast(high)), w,
                                      zeroV));
      return next;
    });
    for (auto [k, t, used] : {std::tuple{0, int64_t(0), below}, std::tuple{1, T - 1, above}})
      if (used) {
        Value sum = b.create<vector::ExtractOp>(loc, allLanes(ends.getResult(k), /*sum=*/true), ArrayRef<int64_t>{0});
        L.store(sum, Wt, {L.idx(r), L.idx(t)});
      }
  }
}

SmallVector<Value> VectorKernel::relativeRows(Value Wt, int64_t r0, int64_t nr, Value table, int64_t clip, int64_t c0,
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

void VectorKernel::keyUpdates(Value W, Value src, ArrayRef<Value> row, Value dst, Value slot, Value bi, Value base,
                              Value lo, Value hi, Value fresh) {
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
          store(accumulate ? b.create<arith::AddFOp>(loc, load(dst, ivs), acc[u * nc + c]) : acc[u * nc + c], dst, ivs);
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

} // namespace lmcc::codegen::attention
