//===- Logprob.cpp - lm-to-loops: the log-probability head and sentence outputs ===//
//
// lm.token_logprob streamed over vocabulary tiles (the [rows, V] logits never exist), lm.gather, and the
// ops that write an entry point's outputs: lm.sentence_score (score) and lm.mean_pool (embed).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

constexpr int64_t kLanes = 16; ///< f32 lanes of a 512-bit vector

/// Fused vocabulary projection + log-softmax + gather, streamed over vocabulary
/// tiles of kVocabTile columns: each tile's logits come from the GEMM into
/// a [rows, kVocabTile] buffer; per row a running max m and sum s (in double,
/// rescaled as the max grows) and the target's logit are kept, and
/// out[b, t] = logit[b, t - shift, ids[b, t]] - (m + log s). The [rows, V] logits never exist.
struct TokenLogprobLowering : LmLowering<lm::TokenLogprobOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TokenLogprobOp t, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(t.getLengths());

    constexpr int64_t kVocabTile = 2048;
    auto ht = L.typeOf(t.getHidden());
    int64_t D = ht.getDimSize(2), V = L.typeOf(t.getWeight()).getDimSize(0), shift = t.getShift();
    Value h = L.in(t.getHidden()), ids = L.in(t.getTargets()), out = L.alloc(t.getType());
    // Rows are (entry, position) pairs of the hidden states: [R0, R1, D] (R1 is L.N, or 1 when pruned).
    auto hs = L.sizes(ht);
    Value R0 = hs[0], R1 = hs[1];
    Value rows = b.create<arith::MulIOp>(loc, R0, R1);
    Value logits = b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic, kVocabTile}, L.f32()),
                                             ValueRange{rows}, b.getI64IntegerAttr(64));
    auto rowBuffer = [&](Type elem) {
      Value m = b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic}, elem), ValueRange{rows},
                                          b.getI64IntegerAttr(64));
      return m;
    };
    Value maxBuf = rowBuffer(L.f64()), sumBuf = rowBuffer(L.f64()), targetBuf = rowBuffer(L.f32());
    L.nest({rows}, [&](ValueRange r) {
      L.store(L.f64c(-INFINITY), maxBuf, r);
      L.store(L.f64c(0), sumBuf, r);
      L.store(L.f32c(0), targetBuf, r);
    });
    // Row r = (b, p) holds hidden position p; its target is ids[b, p + shift] when that exists.
    auto targetOf = [&](Value ids, Value R1, Value r) {
      Value bi = b.create<arith::DivUIOp>(loc, r, R1), p = b.create<arith::RemUIOp>(loc, r, R1);
      Value pt = b.create<arith::AddIOp>(loc, p, L.idx(shift));
      Value exists = L.lt(pt, R1);
      Value safe = L.select(exists, pt, L.idx(0));
      Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(ids, {bi, safe}));
      return std::pair<Value, Value>{exists, id};
    };
    bool packedWeight = L.isPacked(t.getWeight());
    Value hPtr = L.pointer(h), wPtr = L.pointer(L.in(t.getWeight()));
    Value biasPtr = t.getBias() ? L.pointer(L.in(t.getBias())) : Value();
    Value logitsPtr = L.pointer(logits);
    Value m64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
    auto ptrType = LLVM::LLVMPointerType::get(b.getContext());
    auto offsetPtr = [&](Value p, Value elements) {
      return b.create<LLVM::GEPOp>(loc, ptrType, L.f32(), p, ValueRange{elements});
    };
    // The AMX kernel's rounded rows, once for every vocabulary tile.
    Loops::GemmInput hIn = packedWeight ? L.gemmInput(L.address(h), rows, D) : Loops::GemmInput{};
    L.nest({L.idx((V + kVocabTile - 1) / kVocabTile)}, [&](ValueRange tile) {
      Value vt = b.create<arith::MulIOp>(loc, tile[0], L.idx(kVocabTile));
      Value tv = b.create<arith::MinSIOp>(loc, L.idx(kVocabTile), b.create<arith::SubIOp>(loc, L.idx(V), vt));
      Value vt64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), vt);
      Value tv64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), tv);
      Value wTile = offsetPtr(wPtr, b.create<arith::MulIOp>(loc, vt64, L.i64c(D)));
      Value biasTile = biasPtr ? Value(offsetPtr(biasPtr, vt64)) : Value(b.create<LLVM::ZeroOp>(loc, ptrType));
      if (packedWeight) {
        Value pBegin = b.create<arith::MulIOp>(loc, tile[0], L.idx(kVocabTile / kPanel));
        Value pEnd = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, pBegin, L.idx(kVocabTile / kPanel)),
                                              L.idx((V + kPanel - 1) / kPanel));
        L.parallelGemm(t.getWeight(), V, D, hIn.address, rows, t.getBias(), L.address(logits), L.i64c(kVocabTile),
                       pBegin, b.create<arith::SubIOp>(loc, pEnd, pBegin));
      } else {
        b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                               ValueRange{m64, tv64, L.i64c(D), hPtr, L.i64c(D), wTile, L.i64c(D), biasTile, logitsPtr,
                                          L.i64c(kVocabTile)});
      }
      // Per row: the tile's max, its exponentials' sum and the target's logit, in a row task (the rows split
      // over the threads when the tile is large enough; every row computed the same way whatever the split).
      auto rowStep = [&](Value logits, Value maxBuf, Value sumBuf, Value targetBuf, Value ids, Value vt, Value tv,
                         Value R1, Value r) {
        // 16 columns at a time, then the tile's last tv % 16 columns one by one. The max is
        // exact in f32; the exponentials of one tile are summed in 16 f32 lanes (at most 128
        // terms each), the tiles in double.
        auto vec = VectorType::get({kLanes}, L.f32());
        Value tv16 = b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, tv, L.idx(kLanes)), L.idx(kLanes));
        auto vectorLoop = [&](Value init, const std::function<Value(Value, Value)> &step) {
          auto loop = b.create<scf::ForOp>(loc, L.idx(0), tv16, L.idx(kLanes), ValueRange{init});
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPointToStart(loop.getBody());
          Value x = b.create<vector::LoadOp>(loc, vec, logits, ValueRange{r, loop.getInductionVar()});
          b.create<scf::YieldOp>(loc, step(x, loop.getRegionIterArgs()[0]));
          return loop.getResult(0);
        };
        Value vmax = vectorLoop(b.create<vector::BroadcastOp>(loc, vec, L.f32c(-INFINITY)),
                                [&](Value x, Value mx) { return b.create<arith::MaximumFOp>(loc, mx, x); });
        Value tileMax =
            L.reduce(tv16, tv, L.toF64(b.create<vector::ReductionOp>(loc, vector::CombiningKind::MAXIMUMF, vmax)),
                     [&](Value c, Value mx) {
                       return b.create<arith::MaximumFOp>(loc, mx, L.toF64(L.load(logits, {r, c})));
                     });
        Value m = L.load(maxBuf, r), mNew = b.create<arith::MaximumFOp>(loc, m, tileMax);
        Value mNewV = b.create<vector::BroadcastOp>(loc, vec, b.create<arith::TruncFOp>(loc, L.f32(), mNew));
        Value vsum = vectorLoop(b.create<vector::BroadcastOp>(loc, vec, L.f32c(0)), [&](Value x, Value acc) {
          return b.create<arith::AddFOp>(loc, acc, b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, x, mNewV)));
        });
        Value sum = L.reduce(
            tv16, tv, L.toF64(b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, vsum)),
            [&](Value c, Value acc) {
              return b.create<arith::AddFOp>(
                  loc, acc,
                  b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(logits, {r, c})), mNew)));
            });
        Value corr = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, m, mNew));
        L.store(b.create<arith::AddFOp>(loc, b.create<arith::MulFOp>(loc, L.load(sumBuf, r), corr), sum), sumBuf, r);
        L.store(mNew, maxBuf, r);
        auto [exists, id] = targetOf(ids, R1, r);
        Value inTile = L.andI(exists, L.andI(L.ge(id, vt), L.lt(id, b.create<arith::AddIOp>(loc, vt, tv))));
        L.when(inTile, [&] { L.store(L.load(logits, {r, b.create<arith::SubIOp>(loc, id, vt)}), targetBuf, r); });
      };
      SmallVector<Loops::TaskView> views;
      for (Value m : {logits, maxBuf, sumBuf, targetBuf, ids})
        if (std::optional<Loops::TaskView> v = L.taskView(m))
          views.push_back(*v);
      if (views.size() < 5) { // ids a strided view: the rows on this thread
        L.nest({rows}, [&](ValueRange r) { rowStep(logits, maxBuf, sumBuf, targetBuf, ids, vt, tv, R1, r[0]); });
        return;
      }
      Value work = b.create<arith::MulIOp>(loc, rows, b.create<arith::MulIOp>(loc, tv, L.idx(8)));
      L.rowTask(("lm_logprob_rows_shift" + Twine(shift) + "_v" + Twine(kVocabTile)).str(),
                views, {vt, tv, R1}, rows,
                work, [&](ArrayRef<Value> v, ArrayRef<Value> x, Value r) {
                  rowStep(v[0], v[1], v[2], v[3], v[4], x[0], x[1], x[2], r);
                });
    });
    L.release(hIn);
    L.nest({R0, R1}, [&](ValueRange iv) {
      Value valid = L.andI(L.andI(L.ge(iv[1], L.idx(shift)), L.lt(iv[1], L.lengthOf(iv[0]))),
                           L.cmp(arith::CmpIPredicate::sge, L.load(ids, {iv[0], iv[1]}), L.i32c(0)));
      Value v = L.choose(
          valid, L.f32(),
          [&] {
            Value r = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, iv[0], R1),
                                              b.create<arith::SubIOp>(loc, iv[1], L.idx(shift)));
            Value lse = b.create<arith::AddFOp>(loc, L.load(maxBuf, r), b.create<math::LogOp>(loc, L.load(sumBuf, r)));
            return L.toF32(b.create<arith::SubFOp>(loc, L.toF64(L.load(targetBuf, r)), lse));
          },
          [&] { return L.f32c(0); });
      L.store(v, out, iv);
    });
    return L.set(t, out);
  }
};

/// out[b, t] = lp[b, t - shift, ids[b, t]] for shift <= t < length and ids[b, t] >= 0, else 0
struct GatherLowering : LmLowering<lm::GatherOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::GatherOp g, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(g.getLengths());
    Value lp = L.in(g.getLogprobs()), ids = L.in(g.getTargets()), out = L.alloc(g.getType());
    int64_t shift = g.getShift();
    L.nest(L.sizes(g.getType()), [&](ValueRange iv) {
      Value valid = L.andI(L.andI(L.ge(iv[1], L.idx(shift)), L.lt(iv[1], L.lengthOf(iv[0]))),
                           L.cmp(arith::CmpIPredicate::sge, L.load(ids, {iv[0], iv[1]}), L.i32c(0)));
      Value v = L.choose(
          valid, L.f32(),
          [&] {
            Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), L.load(ids, {iv[0], iv[1]}));
            return L.load(lp, {iv[0], b.create<arith::SubIOp>(loc, iv[1], L.idx(shift)), id});
          },
          [&] { return L.f32c(0); });
      L.store(v, out, iv);
    });
    return L.set(g, out);
  }
};

/// token_logprobs, score and n_scored of the score entry point, written into its output buffers.
struct SentenceScoreLowering : LmLowering<lm::SentenceScoreOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SentenceScoreOp s, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(s.getLengths());

    auto outputs = L.outputs();
    if (outputs.size() < 3) // (a Diformer score also returns the length log-probabilities after these)
      return s.emitOpError("appears outside the score entry point");
    Value lp = L.in(s.getLogprobs()), ids = L.in(s.getIds());
    Value tokenLp = outputs[0], scores = outputs[1], nScored = outputs[2];
    int64_t first = s.getFirst();
    SmallVector<int32_t> skip(s.getSkip());
    L.nest({L.B}, [&](ValueRange bi) {
      Value len = L.lengthOf(bi[0]);
      auto loop = b.create<scf::ForOp>(loc, L.idx(0), L.N, L.idx(1), ValueRange{L.f64c(0), L.i32c(0)});
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(loop.getBody());
        Value t = loop.getInductionVar();
        Value id = L.load(ids, {bi[0], t});
        Value keep = L.andI(
            L.andI(L.ge(t, L.idx(first)), L.lt(t, len)),
            b.create<arith::XOrIOp>(loc, L.isOneOf(id, skip), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true))));
        Value v = L.select(keep, L.load(lp, {bi[0], t}), L.f32c(0));
        L.store(v, tokenLp, {bi[0], t});
        Value acc = b.create<arith::AddFOp>(loc, loop.getRegionIterArgs()[0], L.toF64(v));
        Value cnt =
            b.create<arith::AddIOp>(loc, loop.getRegionIterArgs()[1], b.create<arith::ExtUIOp>(loc, L.i32(), keep));
        b.create<scf::YieldOp>(loc, ValueRange{acc, cnt});
      }
      L.store(L.toF32(loop.getResult(0)), scores, bi[0]);
      L.store(loop.getResult(1), nScored, bi[0]);
    });
    L.b.replaceOp(s, ArrayRef<Value>(outputs).take_front(3));
    return success();
  }
};

/// The embed entry point's output: the mean of h over valid, non-excluded positions (all valid ones when none is left).
struct MeanPoolLowering : LmLowering<lm::MeanPoolOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MeanPoolOp m, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(m.getLengths());

    auto outputs = L.outputs();
    if (outputs.size() != 1)
      return m.emitOpError("appears outside the embed entry point");
    Value h = L.in(m.getHidden()), ids = L.in(m.getIds()), out = outputs[0];
    SmallVector<int32_t> exclude(m.getExclude());
    int64_t D = m.getType().getDimSize(1);
    // x / max(||x||_2, 1e-12) over row b of out, in double (as the reference executor).
    auto normalizeRow = [&](Value row) {
      Value sq = L.reduce(L.idx(0), L.idx(D), L.f64c(0), [&](Value c, Value acc) {
        Value v = L.toF64(L.load(out, {row, c}));
        return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, v, v));
      });
      Value norm = b.create<arith::MaximumFOp>(loc, b.create<math::SqrtOp>(loc, sq), L.f64c(1e-12));
      L.nest({L.idx(D)}, [&](ValueRange c) {
        Value v = L.toF64(L.load(out, {row, c[0]}));
        L.store(L.toF32(b.create<arith::DivFOp>(loc, v, norm)), out, {row, c[0]});
      });
    };
    if (m.getCls()) { // row 0 of every sentence
      L.nest({L.B}, [&](ValueRange bi) {
        L.nest({L.idx(D)}, [&](ValueRange c) { L.store(L.load(h, {bi[0], L.idx(0), c[0]}), out, {bi[0], c[0]}); });
        if (m.getNormalize())
          normalizeRow(bi[0]);
      });
      L.b.replaceOp(m, outputs);
      return success();
    }
    L.nest({L.B}, [&](ValueRange bi) {
      Value len = L.lengthOf(bi[0]);
      auto excluded = [&](Value t) { return L.isOneOf(L.load(ids, {bi[0], t}), exclude); };
      Value kept = L.reduce(L.idx(0), len, L.i32c(0), [&](Value t, Value acc) {
        Value keep = b.create<arith::XOrIOp>(loc, excluded(t), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true)));
        return b.create<arith::AddIOp>(loc, acc, b.create<arith::ExtUIOp>(loc, L.i32(), keep));
      });
      Value anyKept = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sgt, kept, L.i32c(0));
      Value lenI32 = L.load(L.lengths, bi[0]);
      Value count = L.select(anyKept, kept, lenI32);
      Value countF = b.create<arith::SIToFPOp>(loc, L.f64(), count);
      // Token t counts when it is kept, or when no token is.
      auto use = [&](Value t) {
        return L.orI(L.notI(anyKept), L.notI(excluded(t)));
      };
      // Features 0..D16 in 16 double lanes (feature c's sum over t in order, as one by one), the rest one by one.
      const int64_t D16 = llvm::cast<MemRefType>(h.getType()).getLayout().isIdentity() ? D / kLanes * kLanes : 0;
      auto v32 = VectorType::get({kLanes}, L.f32()), v64 = VectorType::get({kLanes}, L.f64());
      Value zero64 = b.create<arith::ConstantOp>(loc, v64, DenseElementsAttr::get(v64, 0.0));
      Value countV = b.create<vector::BroadcastOp>(loc, v64, countF);
      auto blocks = b.create<scf::ForOp>(loc, L.idx(0), L.idx(D16), L.idx(kLanes));
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(blocks.getBody());
        Value c0 = blocks.getInductionVar();
        auto sums = b.create<scf::ForOp>(loc, L.idx(0), len, L.idx(1), ValueRange{zero64});
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(sums.getBody());
          Value t = sums.getInductionVar();
          Value x = b.create<arith::ExtFOp>(loc, v64,
                                            b.create<vector::LoadOp>(loc, v32, h, ValueRange{bi[0], t, c0}).getResult());
          Value v = L.select(use(t), x, zero64);
          b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::AddFOp>(loc, sums.getRegionIterArgs()[0], v)});
        }
        Value mean = b.create<arith::TruncFOp>(loc, v32, b.create<arith::DivFOp>(loc, sums.getResult(0), countV));
        b.create<vector::StoreOp>(loc, mean, out, ValueRange{bi[0], c0});
      }
      L.nest({L.idx(D - D16)}, [&](ValueRange cc) {
        Value c = b.create<arith::AddIOp>(loc, cc[0], L.idx(D16));
        Value sum = L.reduce(L.idx(0), len, L.f64c(0), [&](Value t, Value acc) {
          Value v = L.select(use(t), L.toF64(L.load(h, {bi[0], t, c})), L.f64c(0));
          return b.create<arith::AddFOp>(loc, acc, v);
        });
        L.store(L.toF32(b.create<arith::DivFOp>(loc, sum, countF)), out, {bi[0], c});
      });
      if (m.getNormalize())
        normalizeRow(bi[0]);
    });
    L.b.replaceOp(m, outputs);
    return success();
  }
};

} // namespace

void populateLogprobPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<TokenLogprobLowering, GatherLowering, SentenceScoreLowering, MeanPoolLowering>(
      converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
