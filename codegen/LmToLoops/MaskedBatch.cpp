//===- MaskedBatch.cpp - lm-to-loops: mask-and-predict, batched and naive ---===//
//
// lm.masked_batch builds the C = sum(lengths) masked copies, runs its body once on them (the body's ops are
// inlined and converted by their own patterns) and scatters the kept rows; lm.mask_and_predict runs its
// body once per position inside a loop. lm.take_row and lm.splice_copies are the ops lm-prune-rows and
// lm-share-first-layer put inside a masked batch.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// Where copy (b, pos) masks up to: min(spans[b, pos], len) with spans, pos + 1 without; it exists when that
/// end is past pos (pos < len is the caller's).
struct CopySpan {
  Value end, exists;
};
CopySpan copySpan(Loops &L, Value spans, Value bi, Value pos, Value len) {
  Value next = L.b.create<arith::AddIOp>(L.loc, pos, L.idx(1));
  if (!spans)
    return {next, L.b.create<arith::ConstantOp>(L.loc, L.b.getBoolAttr(true))};
  Value end = L.toIndex(L.load(spans, {bi, pos}));
  end = L.select(L.lt(end, len), end, len);
  return {end, L.lt(pos, end)};
}

/// Batched mask-and-predict: copy c = sentence b with positions [i, e) masked, for the copies of sentence b
/// in order of i; the body runs once with batch C; row i (or row 0 when the body was pruned to one row) of
/// copy c goes to result[b, i]. Rows past a length or without a copy are zero.
struct MaskedBatchLowering : LmLowering<lm::MaskedBatchOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MaskedBatchOp m, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value ids = L.in(m.getIds()), lens = L.in(m.getLengths());
    Value spans = m.getSpans() ? L.in(m.getSpans()) : Value();
    L.lengths = lens;
    auto one = [&](Value exists) { return L.select(exists, L.idx(1), L.idx(0)); };
    Value total = L.reduce(L.idx(0), L.B(), L.idx(0), [&](Value bi, Value acc) {
      Value len = L.lengthOf(bi);
      if (!spans)
        return b.create<arith::AddIOp>(loc, acc, len).getResult();
      return L.reduce(L.idx(0), len, acc, [&](Value pos, Value n) {
        return b.create<arith::AddIOp>(loc, n, one(copySpan(L, spans, bi, pos, len).exists)).getResult();
      });
    });
    auto dyn = ShapedType::kDynamic;
    auto newBuffer = [&](ArrayRef<int64_t> shape, ValueRange dynSizes) -> Value {
      return b.create<memref::AllocOp>(loc, MemRefType::get(shape, L.i32()), dynSizes, b.getI64IntegerAttr(64));
    };
    Value copies = newBuffer({dyn, dyn}, {total, L.N()}), targets = newBuffer({dyn, dyn}, {total, L.N()});
    Value copyLengths = newBuffer({dyn}, {total}), positions = newBuffer({dyn}, {total}), owner = newBuffer({dyn}, {total});
    Value ends = newBuffer({dyn}, {total});
    Value mask = L.i32c(m.getMaskToken());
    auto toI32 = [&](Value v) { return b.create<arith::IndexCastOp>(loc, L.i32(), v); };
    L.reduce(L.idx(0), L.B(), L.idx(0), [&](Value bi, Value offset) {
      Value len = L.lengthOf(bi);
      return L.reduce(L.idx(0), len, offset, [&](Value pos, Value c) {
        CopySpan span = copySpan(L, spans, bi, pos, len);
        L.when(span.exists, [&] {
          L.nest({L.N()}, [&](ValueRange t) {
            Value id = L.load(ids, {bi, t[0]});
            Value masked = L.andI(L.ge(t[0], pos), L.lt(t[0], span.end));
            L.store(L.select(masked, mask, id), copies, {c, t[0]});
            L.store(id, targets, {c, t[0]});
          });
          L.store(L.load(lens, bi), copyLengths, c);
          L.store(toI32(pos), positions, c);
          L.store(toI32(bi), owner, c);
          L.store(toI32(span.end), ends, c);
        });
        return b.create<arith::AddIOp>(loc, c, one(span.exists)).getResult();
      });
    });
    Value out = L.alloc(m.getType());
    auto outSizes = L.sizes(m.getType());
    L.nest(outSizes, [&](ValueRange iv) { L.store(L.f32c(0), out, iv); });

    // The body, inlined here with its arguments bound to the copies' buffers.
    Block &body = m.getBody().front();
    auto yield = cast<lm::YieldOp>(body.getTerminator());
    Value yielded = yield.getValue();
    bool pruned = L.typeOf(yielded).getDimSize(1) == 1;
    b.inlineBlockBefore(&body, m, ValueRange{copies, copyLengths, targets, positions, owner, ends});
    Value y = b.getRemappedValue(yielded);
    b.eraseOp(yield);
    SmallVector<Value> rest(outSizes.begin() + 2, outSizes.end());
    L.nest({total}, [&](ValueRange c) {
      Value bi = L.toIndex(L.load(owner, c));
      Value i = L.toIndex(L.load(positions, c));
      L.nest(rest, [&](ValueRange r) {
        SmallVector<Value> from = {c[0], pruned ? L.idx(0) : i}, to = {bi, i};
        from.append(r.begin(), r.end());
        to.append(r.begin(), r.end());
        L.store(L.load(y, from), out, to);
      });
    });
    return L.set(m, out);
  }
};

/// Naive mask-and-predict: for each position i, run the body on the ids with columns [i, e) masked (where
/// sentence b has a copy at i) and keep row i of its result. The body's buffers live for one iteration.
struct MaskAndPredictLowering : LmLowering<lm::MaskAndPredictOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MaskAndPredictOp m, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value ids = L.in(m.getIds());
    Value spans = m.getSpans() ? L.in(m.getSpans()) : Value();
    L.lengths = L.in(m.getLengths());
    Value out = L.alloc(m.getType());
    auto outSizes = L.sizes(m.getType());
    L.nest(outSizes, [&](ValueRange iv) { L.store(L.f32c(0), out, iv); });
    Value mask = L.i32c(m.getMaskToken());
    Block &body = m.getBody().front();
    auto yield = cast<lm::YieldOp>(body.getTerminator());
    Value yielded = yield.getValue();
    auto loop = b.create<scf::ForOp>(loc, L.idx(0), L.N(), L.idx(1));
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(loop.getBody()->getTerminator());
      Value i = loop.getInductionVar();
      // Sentence b has a copy at i when i < length and its span ends past i.
      auto spanOf = [&](Value bi) {
        Value len = L.lengthOf(bi);
        return L.choose(L.lt(i, len), b.getIndexType(), [&] { return copySpan(L, spans, bi, i, len).end; },
                        [&] { return i; });
      };
      Value masked = L.alloc(L.typeOf(m.getIds()));
      L.nest({L.B()}, [&](ValueRange bi) {
        Value end = spanOf(bi[0]);
        L.nest({L.N()}, [&](ValueRange t) {
          Value v = L.load(ids, {bi[0], t[0]});
          Value hit = L.andI(L.ge(t[0], i), L.lt(t[0], end));
          L.store(L.select(hit, mask, v), masked, {bi[0], t[0]});
        });
      });
      b.inlineBlockBefore(&body, loop.getBody(), loop.getBody()->getTerminator()->getIterator(), ValueRange{masked});
      Value y = b.getRemappedValue(yielded);
      b.eraseOp(yield);
      SmallVector<Value> rest(outSizes.begin() + 2, outSizes.end());
      L.nest({L.B()}, [&](ValueRange bi) {
        L.when(L.lt(i, spanOf(bi[0])), [&] {
          L.nest(rest, [&](ValueRange r) {
            SmallVector<Value> at = {bi[0], i};
            at.append(r.begin(), r.end());
            L.store(L.load(y, at), out, at);
          });
        });
      });
    }
    return L.set(m, out);
  }
};

/// out[c, 0, ...] = x[c, positions[c], ...]
struct TakeRowLowering : LmLowering<lm::TakeRowOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TakeRowOp t, Loops &L) const override {
    Value x = L.in(t.getInput()), positions = L.in(t.getPositions());
    Value out = L.alloc(L.typeOf(t.getResult()));
    L.nest(L.sizes(L.typeOf(t.getResult())), [&](ValueRange iv) {
      SmallVector<Value> at(iv.begin(), iv.end());
      at[1] = L.toIndex(L.load(positions, iv[0]));
      L.store(L.load(x, at), out, iv);
    });
    return L.set(t, out);
  }
};

/// out[c, t] = positions[c] <= t < ends[c] ? masked[owners[c], t] : sentence[owners[c], t]: per copy its owner and
/// span read once, per row one branch, then the row's features copied from the one source. Tested per element (the
/// three index loads inside the feature loop, which LLVM cannot hoist past the stores), the splice was a scalar loop
/// and half of biLM PLL's entry body, 2% of the call (perf, n = 40 batch 4, 2026-12-05).
struct SpliceCopiesLowering : LmLowering<lm::SpliceCopiesOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SpliceCopiesOp sp, Loops &L) const override {
    auto &b = L.b;
    Value sentence = L.in(sp.getSentence()), masked = L.in(sp.getMasked());
    Value positions = L.in(sp.getPositions()), owners = L.in(sp.getOwners()), ends = L.in(sp.getEnds());
    // The leading size here is the copies' count: read it off `positions` [C] (sentence and masked are [B, N, ...]).
    SmallVector<Value> sizes = L.sizes(sp.getType());
    sizes[0] = b.create<memref::DimOp>(L.loc, positions, 0);
    Value out = L.alloc(sp.getType(), sizes);
    SmallVector<Value> rest(sizes.begin() + 2, sizes.end());
    L.nest({sizes[0]}, [&](ValueRange c) {
      Value owner = L.toIndex(L.load(owners, c[0]));
      Value first = L.toIndex(L.load(positions, c[0])), end = L.toIndex(L.load(ends, c[0]));
      L.nest({sizes[1]}, [&](ValueRange t) {
        auto copyRow = [&](Value source) {
          L.nest(rest, [&](ValueRange r) {
            SmallVector<Value> to{c[0], t[0]}, from{owner, t[0]};
            to.append(r.begin(), r.end());
            from.append(r.begin(), r.end());
            L.store(L.load(source, from), out, to);
          });
        };
        auto inSpan = b.create<scf::IfOp>(L.loc, L.andI(L.ge(t[0], first), L.lt(t[0], end)), /*withElse=*/true);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(inSpan.thenBlock());
        copyRow(masked);
        b.setInsertionPointToStart(inSpan.elseBlock());
        copyRow(sentence);
      });
    });
    return L.set(sp, out);
  }
};

} // namespace

void populateMaskedBatchPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<MaskedBatchLowering, MaskAndPredictLowering, TakeRowLowering, SpliceCopiesLowering>(
      converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
