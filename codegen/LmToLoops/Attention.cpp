//===- Attention.cpp - lm-to-loops: fused attention -------------------------===//
//
// lm.attention as a key-tiled online softmax with the mask as structure, and a vector form for head sizes
// that are multiples of 16 (no relative positions).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

constexpr int64_t kLanes = 16; ///< f32 lanes of a 512-bit vector

/// lm.attention with vectors (no relative positions; head size a multiple of 16).
/// Per (entry, head) the head's keys are transposed into kt [dh, M16] (M keys rounded up
/// to 16, zero tail). Per query row i with visible keys [lo, hi) (the mask's range, as
/// in the scalar form below):
///   s[j..j+16) = (sum_e q_ie * kt[e, j..j+16)) * scale: dh broadcast FMAs per 16 keys,
///                lanes outside [lo, hi) (and key i under the diagonal mask) set to -inf;
///   m = max_j s_j, p_j = e^(s_j - m) (vector exp), l = sum_j p_j;
///   out_i = (sum_j p_j v_j) / l, dh/16 vector FMAs per key; zero when no key is visible.
LogicalResult lowerVector(lm::AttentionOp a, Loops &L) {
  auto &b = L.b;
  Location loc = L.loc;
  L.lengths = L.in(a.getLengths());
  auto scratch = [&](ArrayRef<int64_t> shape, ValueRange dyn) -> Value {
    return b.create<memref::AllocOp>(loc, MemRefType::get(shape, L.f32()), dyn, b.getI64IntegerAttr(64));
  };

  Value q = L.in(a.getQuery()), k = L.in(a.getKey()), v = L.in(a.getValue()), out = L.alloc(a.getType());
  int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, chunks = dh / kLanes;
  lm::MaskKind mask = a.getMask();
  auto vt = VectorType::get({kLanes}, L.f32());
  Value scale = b.create<vector::BroadcastOp>(loc, vt, L.f32c(a.getScale().convertToFloat()));
  Value negInf = L.f32c(-INFINITY), negInfV = b.create<vector::BroadcastOp>(loc, vt, negInf);
  Value zeroV = b.create<vector::BroadcastOp>(loc, vt, L.f32c(0));
  Value M = b.create<memref::DimOp>(loc, k, 1);
  Value M16 = b.create<arith::MulIOp>(
      loc, b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, M, L.idx(kLanes - 1)), L.idx(kLanes)),
      L.idx(kLanes));
  Value kt = scratch({dh, ShapedType::kDynamic}, M16), scores = scratch({ShapedType::kDynamic}, M16);
  SmallVector<int64_t> lanes(kLanes);
  for (int64_t l = 0; l < kLanes; ++l)
    lanes[l] = l;
  auto it = VectorType::get({kLanes}, b.getIndexType());
  Value iota = b.create<arith::ConstantOp>(loc, it, DenseElementsAttr::get(it, ArrayRef<int64_t>(lanes)));
  Value queryPositions = a.getQueryPositions() ? L.in(a.getQueryPositions()) : Value();
  Value rows = queryPositions ? L.idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
  L.nest({L.B, L.idx(H)}, [&](ValueRange iv) {
    Value bi = iv[0], base = b.create<arith::MulIOp>(loc, iv[1], L.idx(dh));
    auto feature = [&](Value e) { return b.create<arith::AddIOp>(loc, base, e); };
    L.nest({M, L.idx(dh)}, [&](ValueRange je) {
      Value j = je[0], e = je[1];
      L.store(L.load(k, {bi, j, feature(e)}), kt, {e, j});
    });
    auto tail = b.create<scf::ForOp>(loc, M, M16, L.idx(1)); // zero keys up to the next 16
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(tail.getBody());
      L.nest({L.idx(dh)}, [&](ValueRange e) { L.store(L.f32c(0), kt, {e[0], tail.getInductionVar()}); });
    }
    Value len = L.lengthOf(bi);
    L.nest({rows}, [&](ValueRange r) {
      Value row = r[0];
      Value i =
          queryPositions ? Value(b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(queryPositions, bi))) : row;
      Value lo = L.idx(0), hi = len;
      if (mask == lm::MaskKind::causal)
        hi = b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, i, L.idx(1)));
      if (mask == lm::MaskKind::anticausal)
        lo = i;
      Value lo16 = b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, lo, L.idx(kLanes)), L.idx(kLanes));
      Value loV = b.create<vector::BroadcastOp>(loc, iota.getType(), lo);
      Value hiV = b.create<vector::BroadcastOp>(loc, iota.getType(), hi);
      Value iV = b.create<vector::BroadcastOp>(loc, iota.getType(), i);
      // Scores of 16 keys at a time, and their running max.
      auto blocks = b.create<scf::ForOp>(loc, lo16, hi, L.idx(kLanes), ValueRange{negInfV});
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(blocks.getBody());
        Value jb = blocks.getInductionVar();
        // Four independent FMA chains (features e, e+1, e+2, e+3) hide the FMA latency.
        auto dot = b.create<scf::ForOp>(loc, L.idx(0), L.idx(dh), L.idx(4), ValueRange{zeroV, zeroV, zeroV, zeroV});
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(dot.getBody());
          SmallVector<Value> next;
          for (int64_t u = 0; u < 4; ++u) {
            Value e = b.create<arith::AddIOp>(loc, dot.getInductionVar(), L.idx(u));
            Value qe = b.create<vector::BroadcastOp>(loc, vt, L.load(q, {bi, row, feature(e)}));
            Value kv = b.create<vector::LoadOp>(loc, vt, kt, ValueRange{e, jb});
            next.push_back(b.create<vector::FMAOp>(loc, qe, kv, dot.getRegionIterArgs()[u]));
          }
          b.create<scf::YieldOp>(loc, next);
        }
        Value sum = b.create<arith::AddFOp>(loc, b.create<arith::AddFOp>(loc, dot.getResult(0), dot.getResult(1)),
                                            b.create<arith::AddFOp>(loc, dot.getResult(2), dot.getResult(3)));
        Value s = b.create<arith::MulFOp>(loc, sum, scale);
        Value j = b.create<arith::AddIOp>(loc, b.create<vector::BroadcastOp>(loc, iota.getType(), jb), iota);
        Value visible = b.create<arith::AndIOp>(loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, loV),
                                                b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, hiV));
        if (mask == lm::MaskKind::diagonal)
          visible =
              b.create<arith::AndIOp>(loc, visible, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, iV));
        s = b.create<arith::SelectOp>(loc, visible, s, negInfV);
        b.create<vector::StoreOp>(loc, s, scores, ValueRange{jb});
        b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::MaximumFOp>(loc, blocks.getRegionIterArgs()[0], s)});
      }
      Value m = b.create<vector::ReductionOp>(loc, vector::CombiningKind::MAXIMUMF, blocks.getResult(0));
      Value anyVisible = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, m, negInf);
      auto body = b.create<scf::IfOp>(loc, anyVisible, /*withElseRegion=*/true);
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(body.thenBlock());
        Value mV = b.create<vector::BroadcastOp>(loc, vt, m);
        auto sums = b.create<scf::ForOp>(loc, lo16, hi, L.idx(kLanes), ValueRange{zeroV});
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(sums.getBody());
          Value jb = sums.getInductionVar();
          Value p = b.create<math::ExpOp>(
              loc, b.create<arith::SubFOp>(loc, b.create<vector::LoadOp>(loc, vt, scores, ValueRange{jb}), mV));
          b.create<vector::StoreOp>(loc, p, scores, ValueRange{jb});
          b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::AddFOp>(loc, sums.getRegionIterArgs()[0], p)});
        }
        Value l = b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, sums.getResult(0));
        SmallVector<Value> zeros(chunks, zeroV);
        auto acc = b.create<scf::ForOp>(loc, lo, hi, L.idx(1), zeros);
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(acc.getBody());
          Value j = acc.getInductionVar();
          Value p = b.create<vector::BroadcastOp>(loc, vt, L.load(scores, j));
          SmallVector<Value> next;
          for (int64_t c = 0; c < chunks; ++c) {
            Value vj = b.create<vector::LoadOp>(loc, vt, v, ValueRange{bi, j, feature(L.idx(c * kLanes))});
            next.push_back(b.create<vector::FMAOp>(loc, p, vj, acc.getRegionIterArgs()[c]));
          }
          b.create<scf::YieldOp>(loc, next);
        }
        Value inv = b.create<vector::BroadcastOp>(loc, vt, b.create<arith::DivFOp>(loc, L.f32c(1), l));
        for (int64_t c = 0; c < chunks; ++c)
          b.create<vector::StoreOp>(loc, b.create<arith::MulFOp>(loc, acc.getResult(c), inv), out,
                                    ValueRange{bi, row, feature(L.idx(c * kLanes))});
        b.setInsertionPointToStart(body.elseBlock());
        for (int64_t c = 0; c < chunks; ++c)
          b.create<vector::StoreOp>(loc, zeroV, out, ValueRange{bi, row, feature(L.idx(c * kLanes))});
      }
    });
  });
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
  L.nest({L.B, L.idx(H), queryPositions ? L.idx(1) : L.N}, [&](ValueRange iv) {
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
    if (a.getMaskData())
      return a.emitOpError("masks with per-row data (directional, explicit) have no CPU lowering yet");
    int64_t heads = a.getHeads(), width = a.getType().getDimSize(2);
    if (!a.getRelKey() && (width / heads) % kLanes == 0)
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
  return module;
}

} // namespace lmcc::codegen
