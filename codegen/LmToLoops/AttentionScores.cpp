//===- AttentionScores.cpp - The attention vector forms: keys, tiles, scores ----===//
//
// VectorKernel's pieces up to the scores (AttentionVector.h declares and documents them): the keys transposed,
// the prefetches of the next item, a tile's rows and key ranges, the directional mask's row order and the
// register-tiled score products with their mask.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/AttentionVector.h"

namespace lmcc::codegen::attention {

SmallVector<Value> VectorKernel::scratchViews(ArrayRef<SmallVector<int64_t>> shapes, ValueRange dyn) {
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

scf::ForOp VectorKernel::loop(Value lb, Value ub, int64_t step, ValueRange init,
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

SmallVector<Value> VectorKernel::transposeBlock8(ArrayRef<Value> rows) {
  auto shuffle = [&](Value x, Value y, ArrayRef<int64_t> mask) -> Value {
    return b.create<vector::ShuffleOp>(loc, x, y, mask);
  };
  // Pairs of rows interleaved within 128-bit lanes: t[2p] = (r0_0 r1_0 r0_1 r1_1 | r0_4 r1_4 r0_5 r1_5) for rows
  // 2p, 2p + 1, t[2p + 1] the same of lanes 2, 3 | 6, 7 (unpcklps, unpckhps).
  SmallVector<Value> t, s, out(8);
  for (int64_t p = 0; p < 4; ++p) {
    t.push_back(shuffle(rows[2 * p], rows[2 * p + 1], {0, 8, 1, 9, 4, 12, 5, 13}));
    t.push_back(shuffle(rows[2 * p], rows[2 * p + 1], {2, 10, 3, 11, 6, 14, 7, 15}));
  }
  // Four rows' lane c | c + 4 (shufps): s[4q + c] for rows 4q..4q+3, c = 0..3.
  for (int64_t q = 0; q < 2; ++q)
    for (int64_t c = 0; c < 4; ++c) {
      Value x = t[4 * q + c / 2], y = t[4 * q + 2 + c / 2];
      s.push_back(c % 2 ? shuffle(x, y, {2, 3, 10, 11, 6, 7, 14, 15}) : shuffle(x, y, {0, 1, 8, 9, 4, 5, 12, 13}));
    }
  // Lane c of all 8 rows: the low 128-bit halves of rows 0..3's and 4..7's (c < 4), or the high ones.
  for (int64_t c = 0; c < 4; ++c) {
    out[c] = shuffle(s[c], s[4 + c], {0, 1, 2, 3, 8, 9, 10, 11});
    out[c + 4] = shuffle(s[c], s[4 + c], {4, 5, 6, 7, 12, 13, 14, 15});
  }
  return out;
}

void VectorKernel::transpose(Value src, Value bi, Value base, Value M, Value M16, Value t) {
  SmallVector<int64_t> lowMask = interleaveMask(false), highMask = interleaveMask(true);
  // Row r of the block of keys from j0: `type`'s features from e of key j0 + r; in the `tail` block (the last 1-15
  // keys) zeros from key M on (read at the last key, then replaced).
  auto rowAt = [&](Value j0, int64_t r, Value e, VectorType type, bool tail) -> Value {
    Value j = add(j0, L.idx(r));
    if (!tail)
      return b.create<vector::LoadOp>(loc, type, src, ValueRange{bi, j, e});
    Value safe = b.create<arith::MinSIOp>(loc, j, b.create<arith::SubIOp>(loc, M, L.idx(1)));
    Value x = b.create<vector::LoadOp>(loc, type, src, ValueRange{bi, safe, e});
    Value zero = b.create<arith::ConstantOp>(loc, type, DenseElementsAttr::get(type, 0.0f));
    return b.create<arith::SelectOp>(loc, L.lt(j, M), x, zero);
  };
  // The 16 x 16 block of keys j0.. and features e0.. of the head into t.
  auto block = [&](Value j0, Value e0, bool tail) {
    Value row0 = transposedRow(j0, e0);
    if (geo.eightLaneTranspose) {
      // Block (I, J): keys j0 + 8I.., features e0 + 8J..; its transpose's row f is feature e0 + 8J + f of those 8
      // keys: lanes 8I.. of t's row row0 + 8J + f.
      auto half = VectorType::get({kLanes / 2}, L.f32());
      for (int64_t I = 0; I < 2; ++I)
        for (int64_t J = 0; J < 2; ++J) {
          SmallVector<Value> rows;
          for (int64_t r = 0; r < kLanes / 2; ++r)
            rows.push_back(rowAt(j0, 8 * I + r, add(base, add(e0, L.idx(8 * J))), half, tail));
          SmallVector<Value> cols = transposeBlock8(rows);
          for (int64_t f = 0; f < kLanes / 2; ++f)
            b.create<vector::StoreOp>(loc, cols[f], t, ValueRange{add(row0, L.idx(8 * J + f)), L.idx(8 * I)});
        }
      return;
    }
    SmallVector<Value> rowsV;
    for (int64_t r = 0; r < kLanes; ++r)
      rowsV.push_back(rowAt(j0, r, add(base, e0), vt, tail));
    for (int round = 0; round < 4; ++round) {
      SmallVector<Value> next;
      for (int64_t r = 0; r < kLanes / 2; ++r) {
        next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], lowMask));
        next.push_back(b.create<vector::ShuffleOp>(loc, rowsV[r], rowsV[r + kLanes / 2], highMask));
      }
      rowsV = next;
    }
    for (int64_t e = 0; e < kLanes; ++e)
      store(rowsV[e], t, ValueRange{add(row0, L.idx(e)), L.idx(0)});
  };
  auto features = [&](Value j0, bool tail) {
    loop(L.idx(0), L.idx(dh), kLanes, {}, [&](Value e0, ValueRange) {
      block(j0, e0, tail);
      return SmallVector<Value>{};
    });
  };
  Value fullKeys = roundDown(M);
  loop(L.idx(0), fullKeys, kLanes, {}, [&](Value j0, ValueRange) {
    features(j0, /*tail=*/false);
    return SmallVector<Value>{};
  });
  // The last M mod 16 keys as one more block (they were copied one float at a time, a branch each; at n = 20, a
  // 4-key tail, the kernels ran 1.08x faster so, median of 20: bench/results/2026-12-07-zen3.md).
  L.when(L.lt(fullKeys, M16), [&] { features(fullKeys, /*tail=*/true); });
}

void VectorKernel::prefetchNext(Value hasNext, Value nextEntry, Value nextBase, Value t, Value tiles, Value r0,
                                int64_t R, int64_t part, int64_t parts, Value rows, Value M, ArrayRef<Value> rowReads,
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

void VectorKernel::prefetchNextEntry(Value hasNext, Value nextEntry, Value head, int64_t H, int64_t D, Value t,
                                     Value tiles, int64_t part, int64_t parts, Value rows, Value M,
                                     ArrayRef<Value> rowReads, ArrayRef<Value> keyReads) {
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

Tile VectorKernel::tileRows(Value bi, Value r0, int64_t R, Value lastRow, Value len, Value queryPositions,
                            Value rowLimit, Value order) {
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

void VectorKernel::directionOrder(Value bi, Value rows, Value order) {
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

void VectorKernel::products(Value a, Value bi, Value base, const Tile &tile, Value t,
                            const std::function<void(Value, int64_t, ArrayRef<Value>)> &use) {
  const int64_t chains = tile.row.size() >= 4 ? 1 : 4;
  const int64_t half = kLanes / 2;
  // Blocks a step: several at 512 bits with 4 or more rows a group (every group of a tile has the same rows:
  // kTileRows % scoreRows == 0).
  const int64_t groupRows = std::min<int64_t>(geo.scoreRows, tile.row.size());
  const int64_t G = chains == 1 ? geo.scoreBlocks * std::max<int64_t>(1, geo.scoreRows / groupRows) : 1;
  // One block a step: the first block's lower half unseen: its upper half alone, the full blocks from the next;
  // the last block's upper half unseen (1..8 keys past the full blocks): its lower half alone.
  // Several (512 bits only): every block of [from16, to) 16 keys wide (a half block's 8 unseen keys cost no
  // instruction more on a core with full 512-bit units, and storeScores masks them as before; where the target
  // splits 512-bit operations, Geometry::halfBlocks, the first and last blocks with 8 keys no row sees are half
  // blocks on steps of their own, as above, the full blocks between), G at a time (a single block's R + 1 loads for
  // R FMAs kept the loop at the load ports of the two-FMA-port AVX-512 core), then the rem < G left in one step,
  // with the last group when rem is at most half a group (at most 24 accumulators): a group's chains over one block
  // alone are at most the 8 FMAs in flight two ports of latency 4 need, and 8 of them ran at two thirds of the
  // pairs' rate (bench/results/2026-12-06-score-steps.md). Half steps keep one chain a row: with groups of 8 rows
  // the 8 FMAs in flight; 4 rows (the directional tiles) would give half of them, at the cost of a full block.
  const bool halves = G == 1 || (geo.halfBlocks && groupRows >= 8);
  Value headHalf, first = tile.from16, fullEnd, tailHalf, end, nonEmpty;
  if (halves) {
    nonEmpty = L.lt(tile.from, tile.to);
    headHalf = L.andI(L.ge(b.create<arith::SubIOp>(loc, tile.from, tile.from16), L.idx(half)), nonEmpty);
    first = L.select(headHalf, add(tile.from16, L.idx(kLanes)), tile.from16);
  }
  Value rem, peel, lastGroup, leftAt;
  if (G == 1) {
    Value span = b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, tile.to, first), L.idx(0));
    fullEnd = add(first, roundDown(span));
    Value rest = b.create<arith::SubIOp>(loc, add(first, span), fullEnd);
    tailHalf = L.andI(L.lt(L.idx(0), rest), L.le(rest, L.idx(half)));
    end = L.select(L.lt(L.idx(half), rest), add(fullEnd, L.idx(kLanes)), fullEnd);
  } else {
    Value to16 = roundDown(add(tile.to, L.idx(kLanes - 1)));
    fullEnd = to16;
    if (halves) {
      tailHalf = L.andI(L.ge(b.create<arith::SubIOp>(loc, to16, tile.to), L.idx(half)), nonEmpty);
      fullEnd = L.select(tailHalf, b.create<arith::SubIOp>(loc, to16, L.idx(kLanes)), to16);
    }
    Value covered = b.create<arith::MaxSIOp>(loc, b.create<arith::SubIOp>(loc, fullEnd, first), L.idx(0));
    Value count = b.create<arith::DivUIOp>(loc, covered, L.idx(kLanes));
    Value groups = b.create<arith::DivUIOp>(loc, count, L.idx(G));
    rem = b.create<arith::RemUIOp>(loc, count, L.idx(G));
    peel = L.andI(L.andI(L.ge(groups, L.idx(1)), L.ge(rem, L.idx(1))), L.le(add(rem, rem), L.idx(G)));
    Value looped = L.select(peel, b.create<arith::SubIOp>(loc, groups, L.idx(1)), groups);
    lastGroup = add(first, b.create<arith::MulIOp>(loc, looped, L.idx(G * kLanes)));
    leftAt = add(first, b.create<arith::MulIOp>(loc, groups, L.idx(G * kLanes)));
  }
  rowGroups(tile.row.size(), geo.scoreRows, [&](int64_t r0, int64_t R) {
    ArrayRef<Value> row = ArrayRef<Value>(tile.row).slice(r0, R);
    // One step: blocks starting at `at` (`width` keys each from lane `offset`) in one pass over the features. One
    // broadcast of q feeds an FMA per block; each score is the same FMA chain over the features in order whatever
    // the step holds.
    auto step = [&](ArrayRef<Value> at, int64_t width, int64_t offset) {
      const int64_t n = at.size();
      auto type = VectorType::get({width}, L.f32());
      SmallVector<Value> rows;
      for (Value jb : at)
        rows.push_back(transposedRow(jb, L.idx(0)));
      SmallVector<Value> zeros(R * n * chains, b.create<vector::BroadcastOp>(loc, type, L.f32c(0)));
      auto dot = loop(L.idx(0), L.idx(dh), 4, zeros, [&](Value e0, ValueRange acc) {
        SmallVector<Value> next(acc.begin(), acc.end());
        for (int64_t u = 0; u < 4; ++u) {
          Value e = add(e0, L.idx(u));
          SmallVector<Value> kv;
          for (int64_t h = 0; h < n; ++h)
            kv.push_back(b.create<vector::LoadOp>(loc, type, t, ValueRange{add(rows[h], e), L.idx(offset)}));
          for (int64_t r = 0; r < R; ++r) {
            Value qe = b.create<vector::BroadcastOp>(loc, type, L.load(a, {bi, row[r], add(base, e)}));
            for (int64_t h = 0; h < n; ++h) {
              int64_t slot = (r * n + h) * chains + u % chains;
              next[slot] = b.create<vector::FMAOp>(loc, qe, kv[h], next[slot]);
            }
          }
        }
        return next;
      });
      for (int64_t h = 0; h < n; ++h) {
        SmallVector<Value> s(R);
        for (int64_t r = 0; r < R; ++r) {
          int64_t slot = (r * n + h) * chains;
          s[r] = dot.getResult(slot);
          if (chains == 4)
            s[r] =
                b.create<arith::AddFOp>(loc, b.create<arith::AddFOp>(loc, s[r], dot.getResult(slot + 1)),
                                        b.create<arith::AddFOp>(loc, dot.getResult(slot + 2), dot.getResult(slot + 3)));
          if (width < kLanes)
            s[r] = b.create<vector::InsertStridedSliceOp>(loc, s[r], zeroV, ArrayRef<int64_t>{offset},
                                                          ArrayRef<int64_t>{1});
        }
        use(at[h], r0, s);
      }
    };
    // `count` full blocks from jb.
    auto blocksFrom = [&](Value jb, int64_t count) {
      SmallVector<Value> at{jb};
      for (int64_t h = 1; h < count; ++h)
        at.push_back(add(jb, L.idx(h * kLanes)));
      step(at, kLanes, 0);
    };
    if (G == 1) {
      L.when(headHalf, [&] { step({tile.from16}, half, half); });
      loop(first, end, kLanes, {}, [&](Value jb, ValueRange) {
        blocksFrom(jb, 1);
        return SmallVector<Value>{};
      });
      L.when(tailHalf, [&] { step({fullEnd}, half, 0); });
      return;
    }
    if (halves) {
      L.when(headHalf, [&] { step({tile.from16}, half, half); });
      L.when(tailHalf, [&] { step({fullEnd}, half, 0); });
    }
    loop(first, lastGroup, G * kLanes, {}, [&](Value jb, ValueRange) {
      blocksFrom(jb, G);
      return SmallVector<Value>{};
    });
    SmallVector<int64_t> ks;
    for (int64_t k = 1; k < G; ++k)
      ks.push_back(k);
    auto cases = b.create<scf::IndexSwitchOp>(loc, TypeRange{}, rem, ks, ks.size());
    OpBuilder::InsertionGuard guard(b);
    auto caseBody = [&](Region &r) {
      b.setInsertionPointToStart(&r.emplaceBlock());
      b.create<scf::YieldOp>(loc);
      b.setInsertionPointToStart(&r.front());
    };
    caseBody(cases.getDefaultRegion());
    for (auto [k, r] : llvm::zip(ks, cases.getCaseRegions())) {
      caseBody(r);
      if (2 * k > G) {
        blocksFrom(leftAt, k);
        continue;
      }
      auto withGroup = b.create<scf::IfOp>(loc, peel, /*withElse=*/true);
      b.setInsertionPointToStart(withGroup.thenBlock());
      blocksFrom(lastGroup, G + k);
      b.setInsertionPointToStart(withGroup.elseBlock());
      blocksFrom(leftAt, k);
    }
  });
}

void VectorKernel::scores(Value a, Value bi, Value base, const Tile &tile, Value t, Value scale, Value PQ, int64_t clip,
                          Value M16, Value S) {
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

void VectorKernel::storeScores(Value S, Value jb, int64_t first, ArrayRef<Value> s, const Tile &t) {
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

} // namespace lmcc::codegen::attention
