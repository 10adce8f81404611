//===- Diformer.cpp - lm-to-loops: the Diformer decoder's rows and length head (issue 19) ===//
//
// lm.decoder_queries, lm.directional_targets and lm.length_logprob as loop nests, and the VJPs of the
// queries and of the length loss (lm-autodiff's) likewise. The directional mask
// itself is lowered with lm.attention (Attention.cpp, the key range of a row from its direction, hidden
// keys of S rows tested per key) and lm.mask_fill (Elementwise.cpp); both read the same [B, N, 1 + W]
// rows operand through Loops::directionalVisible. The meaning of every op is runtime/reference/Diformer.cpp.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// out[b, i] = direction[z] + (z == L ? r2l[n-1-i] : l2r[i]), z = rows[b, i, 0] (skip and padding rows: 0, l2r[i]).
struct DecoderQueriesLowering : LmLowering<lm::DecoderQueriesOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::DecoderQueriesOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value rows = L.in(op.getRows()), dir = L.in(op.getDirection()), l2r = L.in(op.getL2r()),
          r2l = L.in(op.getR2l()), out = L.alloc(op.getType());
    const int64_t D = op.getType().getDimSize(2);
    L.nest({L.B(), L.N()}, [&](ValueRange iv) {
      Value n = L.lengthOf(iv[0]), i = iv[1];
      Value z = L.load(rows, {iv[0], i, L.idx(0)});
      Value inside = L.lt(i, n);
      Value isL = L.andI(inside, L.cmp(arith::CmpIPredicate::eq, z, L.i32c(1)));
      Value isS = L.andI(inside, L.cmp(arith::CmpIPredicate::eq, z, L.i32c(2)));
      Value d = L.select(isL, L.idx(1), L.select(isS, L.idx(2), L.idx(0)));
      Value fromRight = b.create<arith::SubIOp>(loc, b.create<arith::SubIOp>(loc, n, L.idx(1)), i);
      Value pos = L.select(isL, fromRight, i);
      L.nest({L.idx(D)}, [&](ValueRange e) {
        Value p = L.choose(isL, L.f32(), [&] { return L.load(r2l, {pos, e[0]}); },
                           [&] { return L.load(l2r, {pos, e[0]}); });
        L.store(b.create<arith::AddFOp>(loc, L.load(dir, {d, e[0]}), p), out, {iv[0], i, e[0]});
      });
    });
    return L.set(op, out);
  }
};

/// out[b, i] = y_{i+1} (R), y_{i-1} (L), y_i (S), -1 (skip, i >= n, or a neighbour outside the target).
struct DirectionalTargetsLowering : LmLowering<lm::DirectionalTargetsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::DirectionalTargetsOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value tgt = L.in(op.getTargets()), rows = L.in(op.getRows()), out = L.alloc(op.getType());
    L.nest({L.B(), L.N()}, [&](ValueRange iv) {
      Value n = L.lengthOf(iv[0]), i = iv[1];
      Value z = L.load(rows, {iv[0], i, L.idx(0)});
      auto is = [&](int64_t code) { return L.cmp(arith::CmpIPredicate::eq, z, L.i32c(code)); };
      Value next = b.create<arith::AddIOp>(loc, i, L.idx(1)), prev = b.create<arith::SubIOp>(loc, i, L.idx(1));
      // The position read (as an i64 offset that may be -1 or n) and whether it names a target token.
      Value at = L.select(is(0), next, L.select(is(1), prev, i));
      Value valid = L.andI(L.lt(i, n), L.orI(L.andI(is(0), L.lt(next, n)),
                                            L.orI(L.andI(is(1), L.ge(i, L.idx(1))), is(2))));
      Value id = L.choose(valid, L.i32(), [&] { return L.load(tgt, {iv[0], at}); }, [&] { return L.i32c(-1); });
      L.store(id, out, iv);
    });
    return L.set(op, out);
  }
};

/// The length head's forward for sentence bi: mean[D] = mean_{j < lengths[bi]} h[bi, j] (float sums, as the
/// reference), logits[C] = W mean; returns (max logit, sum of exp(logit - max)) in double.
std::pair<Value, Value> lengthHead(Loops &L, Value h, Value w, Value bi, Value mean, Value logits, int64_t D, int64_t C) {
  auto &b = L.b;
  Location loc = L.loc;
  Value len = L.lengthOf(bi);
  Value count = b.create<arith::SIToFPOp>(loc, L.f32(), L.load(L.lengths, bi));
  L.nest({L.idx(D)}, [&](ValueRange e) {
    Value sum = L.reduce(L.idx(0), len, L.f32c(0), [&](Value j, Value acc) {
      return b.create<arith::AddFOp>(loc, acc, L.load(h, {bi, j, e[0]}));
    });
    L.store(b.create<arith::DivFOp>(loc, sum, count), mean, e);
  });
  Value mx = L.reduce(L.idx(0), L.idx(C), L.f32c(-INFINITY), [&](Value ci, Value m) {
    Value dot = L.reduce(L.idx(0), L.idx(D), L.f32c(0), [&](Value e, Value acc) {
      return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, L.load(w, {ci, e}), L.load(mean, e)));
    });
    L.store(dot, logits, ci);
    return b.create<arith::MaximumFOp>(loc, m, dot);
  });
  Value mxD = L.toF64(mx);
  Value sum = L.reduce(L.idx(0), L.idx(C), L.f64c(0), [&](Value ci, Value acc) {
    return b.create<arith::AddFOp>(
        loc, acc, b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(logits, ci)), mxD)));
  });
  return {mxD, sum};
}

/// out[b] = log_softmax(W m_b)[target_lengths[b]], m_b = mean_{j < lengths[b]} h[b, j] (float sums like the
/// reference; the log-softmax in double); -inf for a target length outside [0, max_len). Without
/// target_lengths: out[b, c] = log_softmax(W m_b)[c] for every length c.
struct LengthLogprobLowering : LmLowering<lm::LengthLogprobOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LengthLogprobOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value h = L.in(op.getHidden()), w = L.in(op.getWeight());
    Value targets = op.getTargetLengths() ? L.in(op.getTargetLengths()) : Value();
    Value B = b.create<memref::DimOp>(loc, h, 0);
    Value out = L.alloc(op.getType(), {B});
    const int64_t D = L.typeOf(op.getHidden()).getDimSize(2), C = L.typeOf(op.getWeight()).getDimSize(0);
    Value mean = L.alloc(MemRefType::get({D}, L.f32())), logits = L.alloc(MemRefType::get({C}, L.f32()));
    L.nest({B}, [&](ValueRange bi) {
      auto [mxD, sum] = lengthHead(L, h, w, bi[0], mean, logits, D, C);
      Value lse = b.create<arith::AddFOp>(loc, mxD, b.create<math::LogOp>(loc, sum));
      auto logprob = [&](Value c) { return L.toF32(b.create<arith::SubFOp>(loc, L.toF64(L.load(logits, c)), lse)); };
      if (!targets) {
        L.nest({L.idx(C)}, [&](ValueRange c) { L.store(logprob(c[0]), out, {bi[0], c[0]}); });
        return;
      }
      Value t = L.toIndex(L.load(targets, bi[0]));
      Value inRange = L.andI(L.ge(t, L.idx(0)), L.lt(t, L.idx(C)));
      Value lp = L.choose(inRange, L.f32(), [&] { return logprob(t); }, [&] { return L.f32c(-INFINITY); });
      L.store(lp, out, bi[0]);
    });
    return L.set(op, out);
  }
};

/// d direction[z] += dy[b, i], d r2l[n-1-i] (L rows) or d l2r[i] += dy[b, i], over b and i < n in order.
struct DecoderQueriesGradLowering : LmLowering<lm::DecoderQueriesGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::DecoderQueriesGradOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value dy = L.in(op.getGrad()), rows = L.in(op.getRows());
    Value dDir = L.alloc(op.getDDirection().getType()), dL2R = L.alloc(op.getDL2r().getType()),
          dR2L = L.alloc(op.getDR2l().getType());
    const int64_t D = L.typeOf(op.getGrad()).getDimSize(2), P = L.typeOf(op.getDL2r()).getDimSize(0);
    L.nest({L.idx(3), L.idx(D)}, [&](ValueRange iv) { L.store(L.f32c(0), dDir, iv); });
    L.nest({L.idx(P), L.idx(D)}, [&](ValueRange iv) {
      L.store(L.f32c(0), dL2R, iv);
      L.store(L.f32c(0), dR2L, iv);
    });
    Value B = b.create<memref::DimOp>(loc, dy, 0), N = b.create<memref::DimOp>(loc, dy, 1);
    L.nest({B, N}, [&](ValueRange iv) {
      Value n = L.lengthOf(iv[0]), i = iv[1];
      L.when(L.lt(i, n), [&] {
        Value z = L.load(rows, {iv[0], i, L.idx(0)});
        Value isL = L.cmp(arith::CmpIPredicate::eq, z, L.i32c(1));
        Value isS = L.cmp(arith::CmpIPredicate::eq, z, L.i32c(2));
        Value d = L.select(isL, L.idx(1), L.select(isS, L.idx(2), L.idx(0)));
        Value fromRight = b.create<arith::SubIOp>(loc, b.create<arith::SubIOp>(loc, n, L.idx(1)), i);
        L.nest({L.idx(D)}, [&](ValueRange e) {
          Value g = L.load(dy, {iv[0], i, e[0]});
          L.store(b.create<arith::AddFOp>(loc, L.load(dDir, {d, e[0]}), g), dDir, {d, e[0]});
          L.when(isL, [&] {
            L.store(b.create<arith::AddFOp>(loc, L.load(dR2L, {fromRight, e[0]}), g), dR2L, {fromRight, e[0]});
          });
          L.when(L.notI(isL), [&] {
            L.store(b.create<arith::AddFOp>(loc, L.load(dL2R, {i, e[0]}), g), dL2R, {i, e[0]});
          });
        });
      });
    });
    return L.setAll(op, {dDir, dL2R, dR2L});
  }
};

/// The length loss's VJP, seed d length_logprob[b] = -weight / B: dlogit = seed (onehot(n_b) - softmax),
/// dW += dlogit m_b^T, d hidden[b, j] = W^T dlogit / lengths[b] for j < lengths[b] (0 elsewhere).
struct LengthLossGradLowering : LmLowering<lm::LengthLossGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LengthLossGradOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value h = L.in(op.getHidden()), w = L.in(op.getWeight()), targets = L.in(op.getTargetLengths());
    auto hs = L.dims(h);
    Value dh = L.alloc(op.getDHidden().getType(), hs), dW = L.alloc(op.getDWeight().getType());
    const int64_t D = L.typeOf(op.getHidden()).getDimSize(2), C = L.typeOf(op.getWeight()).getDimSize(0);
    Value mean = L.alloc(MemRefType::get({D}, L.f32())), logits = L.alloc(MemRefType::get({C}, L.f32())),
          dlogit = L.alloc(MemRefType::get({C}, L.f32()));
    L.nest({L.idx(C), L.idx(D)}, [&](ValueRange iv) { L.store(L.f32c(0), dW, iv); });
    Value Bf = b.create<arith::UIToFPOp>(loc, L.f64(), b.create<arith::IndexCastOp>(loc, b.getI64Type(), hs[0]));
    Value seed = b.create<arith::DivFOp>(loc, L.f64c(-op.getLossWeight().convertToDouble()), Bf);
    L.nest({hs[0]}, [&](ValueRange bi) {
      Value len = L.lengthOf(bi[0]);
      Value count = b.create<arith::SIToFPOp>(loc, L.f32(), L.load(L.lengths, bi[0]));
      auto [mxD, sum] = lengthHead(L, h, w, bi[0], mean, logits, D, C); // the forward again
      Value t = L.toIndex(L.load(targets, bi[0]));
      L.nest({L.idx(C)}, [&](ValueRange ci) {
        Value p = b.create<arith::DivFOp>(
            loc, b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(logits, ci)), mxD)), sum);
        Value hot = L.select(L.eqI(ci[0], t), L.f64c(1), L.f64c(0));
        Value g = L.toF32(b.create<arith::MulFOp>(loc, seed, b.create<arith::SubFOp>(loc, hot, p)));
        L.store(g, dlogit, ci);
        L.nest({L.idx(D)}, [&](ValueRange e) {
          L.store(b.create<arith::AddFOp>(loc, L.load(dW, {ci[0], e[0]}),
                                          b.create<arith::MulFOp>(loc, g, L.load(mean, e))),
                  dW, {ci[0], e[0]});
        });
      });
      L.nest({L.idx(D)}, [&](ValueRange e) {
        Value dm = L.reduce(L.idx(0), L.idx(C), L.f32c(0), [&](Value ci, Value acc) {
          return b.create<arith::AddFOp>(loc, acc,
                                         b.create<arith::MulFOp>(loc, L.load(w, {ci, e[0]}), L.load(dlogit, ci)));
        });
        Value share = b.create<arith::DivFOp>(loc, dm, count);
        L.nest({hs[1]}, [&](ValueRange j) {
          L.store(L.select(L.lt(j[0], len), share, L.f32c(0)), dh, {bi[0], j[0], e[0]});
        });
      });
    });
    return L.setAll(op, {dh, dW});
  }
};

} // namespace

void populateDiformerPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<DecoderQueriesLowering, DirectionalTargetsLowering, LengthLogprobLowering, DecoderQueriesGradLowering,
               LengthLossGradLowering>(
      converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
