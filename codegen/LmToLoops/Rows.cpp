//===- Rows.cpp - lm-to-loops: the rows a training loss predicts --------------===//
//
// lm.target_rows, lm.gather_rows and lm.scatter_rows, the ops lm-prune-loss-rows puts in a training loss: the
// positions with a target per sentence (their count T known only here, at run time), those rows of a [B, N, ...]
// tensor packed into [B, T, ...], and the packed rows put back in place with zeros elsewhere. Row copies: a few
// [B, T, D] tensors a training step.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// rows[b, j] / row_targets[b, j]: the j-th t < min(lengths[b], N) with targets[b, t] >= 0 and its target, -1
/// after the sentence's count; T = max(1, the largest count).
struct TargetRowsLowering : LmLowering<lm::TargetRowsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TargetRowsOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value targets = L.in(op.getTargets()), lengths = L.in(op.getLengths());
    Value B = b.create<memref::DimOp>(loc, targets, 0), N = b.create<memref::DimOp>(loc, targets, 1);
    Value zero = L.idx(0), one = L.idx(1), none = L.i32c(-1);
    auto end = [&](Value bi) { return b.create<arith::MinSIOp>(loc, L.toIndex(L.load(lengths, bi)), N); };
    auto hasTarget = [&](Value y) { return L.ge(y, L.i32c(0)); };
    Value T = L.reduce(zero, B, one, [&](Value bi, Value most) {
      Value count = L.reduce(zero, end(bi), zero, [&](Value t, Value c) {
        return L.select(hasTarget(L.load(targets, {bi, t})), b.create<arith::AddIOp>(loc, c, one), c);
      });
      return b.create<arith::MaxSIOp>(loc, most, count);
    });
    Value rows = L.alloc(L.typeOf(op.getRows()), {B, T}), rowTargets = L.alloc(L.typeOf(op.getRowTargets()), {B, T});
    L.nest({B}, [&](ValueRange bi) {
      Value count = L.reduce(zero, end(bi[0]), zero, [&](Value t, Value j) {
        Value y = L.load(targets, {bi[0], t});
        Value has = hasTarget(y);
        L.when(has, [&] {
          L.store(b.create<arith::IndexCastOp>(loc, L.i32(), t), rows, {bi[0], j});
          L.store(y, rowTargets, {bi[0], j});
        });
        return L.select(has, b.create<arith::AddIOp>(loc, j, one), j);
      });
      L.nest({b.create<arith::SubIOp>(loc, T, count)}, [&](ValueRange k) {
        Value j = b.create<arith::AddIOp>(loc, count, k[0]);
        L.store(none, rows, {bi[0], j});
        L.store(none, rowTargets, {bi[0], j});
      });
    });
    return L.setAll(op, {rows, rowTargets});
  }
};

/// rows[b, j] as an index, and whether it names a row of the [B, N, ...] side (padding -1 does not).
std::pair<Value, Value> rowAt(Loops &L, Value rows, Value bi, Value j, Value N) {
  Value r = L.load(rows, {bi, j});
  Value index = L.toIndex(r);
  return {index, L.andI(L.ge(r, L.i32c(0)), L.lt(index, N))};
}

/// Copies row `from` of `src` to row `to` of `dst` (entry bi, the features `rest`).
void copyRow(Loops &L, Value src, Value dst, Value bi, Value from, Value to, ArrayRef<Value> rest) {
  L.nest(rest, [&](ValueRange f) {
    SmallVector<Value> at{bi, from}, into{bi, to};
    at.append(f.begin(), f.end());
    into.append(f.begin(), f.end());
    L.store(L.load(src, at), dst, into);
  });
}

/// out[b, j, ...] = x[b, rows[b, j], ...], zeros where rows[b, j] names no row.
struct GatherRowsLowering : LmLowering<lm::GatherRowsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::GatherRowsOp op, Loops &L) const override {
    Value x = L.in(op.getInput()), rows = L.in(op.getRows());
    SmallVector<Value> sizes = L.dims(x);
    Value N = sizes[1];
    sizes[1] = L.b.create<memref::DimOp>(L.loc, rows, 1);
    Value out = L.alloc(L.typeOf(op.getResult()), sizes);
    SmallVector<Value> rest(sizes.begin() + 2, sizes.end());
    Value zero = L.f32c(0);
    L.nest({sizes[0], sizes[1]}, [&](ValueRange bj) {
      auto [r, exists] = rowAt(L, rows, bj[0], bj[1], N);
      auto branch = L.b.create<scf::IfOp>(L.loc, exists, /*withElseRegion=*/true);
      OpBuilder::InsertionGuard guard(L.b);
      L.b.setInsertionPointToStart(branch.thenBlock());
      copyRow(L, x, out, bj[0], r, bj[1], rest);
      L.b.setInsertionPointToStart(branch.elseBlock());
      L.nest(rest, [&](ValueRange f) {
        SmallVector<Value> into{bj[0], bj[1]};
        into.append(f.begin(), f.end());
        L.store(zero, out, into);
      });
    });
    return L.set(op, out);
  }
};

/// out[b, rows[b, j], ...] = x[b, j, ...], zeros at the other rows of [B, N, ...] (N = like's dim 1).
struct ScatterRowsLowering : LmLowering<lm::ScatterRowsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::ScatterRowsOp op, Loops &L) const override {
    Value x = L.in(op.getInput()), rows = L.in(op.getRows()), like = L.in(op.getLike());
    SmallVector<Value> sizes = L.dims(x);
    Value T = sizes[1];
    sizes[1] = L.b.create<memref::DimOp>(L.loc, like, 1);
    Value out = L.alloc(L.typeOf(op.getResult()), sizes);
    Value zero = L.f32c(0);
    L.nest(sizes, [&](ValueRange at) { L.store(zero, out, at); });
    SmallVector<Value> rest(sizes.begin() + 2, sizes.end());
    L.nest({sizes[0], T}, [&](ValueRange bj) {
      auto [r, exists] = rowAt(L, rows, bj[0], bj[1], sizes[1]);
      L.when(exists, [&] { copyRow(L, x, out, bj[0], bj[1], r, rest); });
    });
    return L.set(op, out);
  }
};

} // namespace

void populateRowsPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<TargetRowsLowering, GatherRowsLowering, ScatterRowsLowering>(converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
