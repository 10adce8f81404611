//===- Elementwise.cpp - lm-to-loops: embeddings, elementwise ops, norms ----===//
//
// Embeddings and positions, elementwise ops, LayerNorm, softmax and log-softmax, head splitting and the ops of
// the decomposed attention (matmul, mask_fill, Shaw relative terms): one loop nest each over the result, with
// the reference executor's numerics (runtime/reference/Ops.cpp).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/bit.h"

#include <iterator>

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// out[b, t, :] = table[ids[b, t], :]
struct EmbedLowering : LmLowering<lm::EmbedOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::EmbedOp e, Loops &L) const override {
    Value table = L.in(e.getTable()), ids = L.in(e.getIds()), out = L.alloc(e.getType());
    auto s = L.sizes(e.getType());
    // Rows of 16-float vectors where the table's rows are contiguous, the rest element by element.
    constexpr int64_t kLanes = 16;
    int64_t D = e.getType().getDimSize(2);
    int64_t offset;
    SmallVector<int64_t> strides;
    auto tableType = llvm::cast<MemRefType>(table.getType());
    bool unit = succeeded(getStridesAndOffset(tableType, strides, offset)) && strides.back() == 1;
    const int64_t D16 = unit ? D / kLanes * kLanes : 0;
    auto v32 = VectorType::get({kLanes}, L.f32());
    L.nest({s[0], s[1]}, [&](ValueRange bt) {
      Value id = L.toIndex(L.load(ids, {bt[0], bt[1]}));
      auto blocks = L.b.create<scf::ForOp>(L.loc, L.idx(0), L.idx(D16), L.idx(kLanes));
      {
        OpBuilder::InsertionGuard guard(L.b);
        L.b.setInsertionPointToStart(blocks.getBody());
        Value c = blocks.getInductionVar();
        Value x = L.b.create<vector::LoadOp>(L.loc, v32, table, ValueRange{id, c});
        L.b.create<vector::StoreOp>(L.loc, x, out, ValueRange{bt[0], bt[1], c});
      }
      L.nest({L.idx(D - D16)}, [&](ValueRange cc) {
        Value c = L.b.create<arith::AddIOp>(L.loc, cc[0], L.idx(D16));
        L.store(L.load(table, {id, c}), out, {bt[0], bt[1], c});
      });
    });
    return L.set(e, out);
  }
};

/// out[b, t] = P[t]: the learned table, or P[t, c] = sin/cos(t / 10000^((c - c % 2) / D)) in double.
struct PositionsLowering : LmLowering<lm::PositionsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::PositionsOp p, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value out = L.alloc(p.getType());
    int64_t D = p.getType().getDimSize(2);
    if (Value tableT = p.getTable()) {
      Value table = L.in(tableT);
      L.nest(L.sizes(p.getType()), [&](ValueRange iv) { L.store(L.load(table, {iv[1], iv[2]}), out, iv); });
      return L.set(p, out);
    }
    L.nest(L.sizes(p.getType()), [&](ValueRange iv) {
      Value parity = b.create<arith::RemUIOp>(loc, iv[2], L.idx(2));
      Value even = b.create<arith::SubIOp>(loc, iv[2], parity);
      auto asF64 = [&](Value i) {
        return b.create<arith::SIToFPOp>(loc, L.f64(), b.create<arith::IndexCastOp>(loc, b.getI64Type(), i));
      };
      Value expo = b.create<arith::DivFOp>(loc, asF64(even), L.f64c(double(D)));
      Value denom = b.create<math::PowFOp>(loc, L.f64c(10000.0), expo);
      Value angle = b.create<arith::DivFOp>(loc, asF64(iv[1]), denom);
      Value isEven = L.eqI(parity, L.idx(0));
      Value v = L.select(isEven, b.create<math::SinOp>(loc, angle), b.create<math::CosOp>(loc, angle));
      L.store(L.toF32(v), out, iv);
    });
    return L.set(p, out);
  }
};

struct FillIdsLowering : LmLowering<lm::FillIdsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::FillIdsOp f, Loops &L) const override {
    Value out = L.alloc(f.getType());
    Value v = L.i32c(f.getValue());
    L.nest(L.sizes(f.getType()), [&](ValueRange iv) { L.store(v, out, iv); });
    return L.set(f, out);
  }
};

/// The name of the row task of an elementwise op: `key` (the op and every attribute its body reads) and the
/// row width.
std::string rowTaskName(StringRef key, Value buffer) {
  return ("lm_rows_" + key + "_c" + Twine(llvm::cast<MemRefType>(buffer.getType()).getShape().back())).str();
}

/// The bits of a float attribute, in hexadecimal (task names).
std::string bitsOf(double v) { return llvm::utohexstr(llvm::bit_cast<uint64_t>(v)); }

/// out = f(x) elementwise; `Fn(Loops &, Op, Value x) -> Value`, `Key(Op)` what Fn reads of the op (the row
/// task's name), `Cost` its operations per element (whether the rows are split over the threads).
template <typename Op, Value (*Fn)(Loops &, Op, Value), std::string (*Key)(Op), int64_t Cost>
struct UnaryLowering : LmLowering<Op> {
  using LmLowering<Op>::LmLowering;
  LogicalResult lower(Op op, Loops &L) const override {
    Value x = op->getOperand(0);
    Value src = L.in(x);
    auto sz = L.dims(src);
    Value out = L.alloc(llvm::cast<ShapedType>(op->getResult(0).getType()), sz);
    int64_t C = llvm::cast<ShapedType>(out.getType()).getShape().back();
    bool rows = L.forRows(rowTaskName(Key(op), out), {src, out}, {}, Cost, [&](ArrayRef<Value> m, ArrayRef<Value>, Value r) {
      L.nest({L.idx(C)}, [&](ValueRange c) { L.store(Fn(L, op, L.load(m[0], {r, c[0]})), m[1], {r, c[0]}); });
    });
    if (!rows)
      L.nest(sz, [&](ValueRange iv) { L.store(Fn(L, op, L.load(src, iv)), out, iv); });
    return L.set(op, out);
  }
};

Value scaleOf(Loops &L, lm::ScaleOp s, Value x) {
  return L.b.create<arith::MulFOp>(L.loc, x, L.f32c(s.getFactor().convertToFloat()));
}
std::string scaleKey(lm::ScaleOp s) { return "scale_" + bitsOf(s.getFactor().convertToDouble()); }
std::string geluKey(lm::GeluOp g) { return g.getApproximate() ? "gelu_tanh" : "gelu_erf"; }
std::string reluKey(lm::ReluOp) { return "relu"; }

Value geluOf(Loops &L, lm::GeluOp g, Value x) { return emitActivation(L.b, L.loc, lm::activationKind(g), x); }
Value reluOf(Loops &L, lm::ReluOp r, Value x) { return emitActivation(L.b, L.loc, lm::activationKind(r), x); }

struct AddLowering : LmLowering<lm::AddOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::AddOp a, Loops &L) const override {
    Value x = L.in(a.getLhs()), y = L.in(a.getRhs());
    auto sz = L.dims(x);
    Value out = L.alloc(a.getType(), sz);
    int64_t C = a.getType().getShape().back();
    bool rows = L.forRows(rowTaskName("add", out), {x, y, out}, {}, 1, [&](ArrayRef<Value> m, ArrayRef<Value>, Value r) {
      L.nest({L.idx(C)}, [&](ValueRange c) {
        L.store(L.b.create<arith::AddFOp>(L.loc, L.load(m[0], {r, c[0]}), L.load(m[1], {r, c[0]})), m[2], {r, c[0]});
      });
    });
    if (!rows)
      L.nest(sz, [&](ValueRange iv) {
        L.store(L.b.create<arith::AddFOp>(L.loc, L.load(x, iv), L.load(y, iv)), out, iv);
      });
    return L.set(a, out);
  }
};

/// (x - mean) / sqrt(var + eps) * g + b over the last axis, mean and variance in double. The sums run over
/// 16 features at a time in 16 double lanes (lane l adds features l, l + 16, ...; the lanes then in order, then
/// the features past the last multiple of 16 one by one): 16 independent chains instead of one, whose add latency
/// bound the norm (a 512-feature row took 2 x 512 dependent double adds).
struct LayerNormLowering : LmLowering<lm::LayerNormOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LayerNormOp n, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value x = L.in(n.getInput()), g = L.in(n.getGamma()), beta = L.in(n.getBeta()), out = L.alloc(n.getType());
    auto s = L.sizes(n.getType());
    int64_t C = n.getType().getShape().back();
    double eps = n.getEpsilon().convertToDouble();
    constexpr int64_t kLanes = 16;
    auto v32 = VectorType::get({kLanes}, L.f32()), v64 = VectorType::get({kLanes}, L.f64());
    // One row: x, g, beta, out and the row's indices `at(c)` of feature c; the first vectorEnd features in
    // vectors (x row-major).
    auto normRow = [&](Value x, Value g, Value beta, Value out, const std::function<SmallVector<Value>(Value)> &at,
                       int64_t vectorEnd) {
      // sum over c of term(x[c] as double), term acting on doubles or on vectors of them.
      auto rowSum = [&](const std::function<Value(Value)> &term) -> Value {
        Value total = L.f64c(0);
        if (vectorEnd > 0) {
          Value zero = b.create<arith::ConstantOp>(loc, v64, DenseElementsAttr::get(v64, 0.0));
          auto lanes = b.create<scf::ForOp>(loc, L.idx(0), L.idx(vectorEnd), L.idx(kLanes), ValueRange{zero});
          {
            OpBuilder::InsertionGuard guard(b);
            b.setInsertionPointToStart(lanes.getBody());
            Value xv = b.create<arith::ExtFOp>(
                loc, v64, b.create<vector::LoadOp>(loc, v32, x, at(lanes.getInductionVar())).getResult());
            b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::AddFOp>(loc, lanes.getRegionIterArgs()[0], term(xv))});
          }
          total = b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, lanes.getResult(0));
        }
        return L.reduce(L.idx(vectorEnd), L.idx(C), total, [&](Value c, Value acc) {
          return b.create<arith::AddFOp>(loc, acc, term(L.toF64(L.load(x, at(c)))));
        });
      };
      Value mean = b.create<arith::DivFOp>(loc, rowSum([](Value v) { return v; }), L.f64c(double(C)));
      Value meanV = b.create<vector::BroadcastOp>(loc, v64, mean);
      Value sq = rowSum([&](Value v) -> Value {
        Value d = b.create<arith::SubFOp>(loc, v, isa<VectorType>(v.getType()) ? meanV : mean);
        return b.create<arith::MulFOp>(loc, d, d);
      });
      Value var = b.create<arith::DivFOp>(loc, sq, L.f64c(double(C)));
      Value inv = b.create<arith::DivFOp>(
          loc, L.f64c(1), b.create<math::SqrtOp>(loc, b.create<arith::AddFOp>(loc, var, L.f64c(eps))));
      L.nest({L.idx(C)}, [&](ValueRange c) {
        Value norm =
            L.toF32(b.create<arith::MulFOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(x, at(c[0]))), mean), inv));
        Value y = b.create<arith::AddFOp>(loc, b.create<arith::MulFOp>(loc, norm, L.load(g, c[0])), L.load(beta, c[0]));
        L.store(y, out, at(c[0]));
      });
    };
    std::string key = "layernorm_" + bitsOf(eps);
    bool rows = L.forRows(rowTaskName(key, out), {x, out}, {g, beta}, 8, [&](ArrayRef<Value> m, ArrayRef<Value> v, Value r) {
      normRow(m[0], v[0], v[1], m[1], [&](Value c) { return SmallVector<Value>{r, c}; }, C / kLanes * kLanes);
    });
    if (!rows) {
      const int64_t vectorEnd = llvm::cast<MemRefType>(x.getType()).getLayout().isIdentity() ? C / kLanes * kLanes : 0;
      SmallVector<Value> lead(s.begin(), s.end() - 1);
      L.nest(lead, [&](ValueRange iv) {
        normRow(x, g, beta, out, [&](Value c) {
          SmallVector<Value> i(iv.begin(), iv.end());
          i.push_back(c);
          return i;
        }, vectorEnd);
      });
    }
    return L.set(n, out);
  }
};

/// out[b, h, t, e] = in[b, t, h*dh + e]
struct SplitHeadsLowering : LmLowering<lm::SplitHeadsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SplitHeadsOp s, Loops &L) const override {
    Value x = L.in(s.getInput());
    int64_t dh = s.getType().getDimSize(3);
    auto in = L.dims(x);
    SmallVector<Value> sz = {in[0], L.idx(s.getType().getDimSize(1)), in[1], L.idx(dh)};
    Value out = L.alloc(s.getType(), sz);
    L.outlined("split_heads", {x, out}, [&](ArrayRef<Value> p) {
      L.nest(L.dims(p[1]), [&](ValueRange iv) {
        Value c = L.b.create<arith::AddIOp>(L.loc, L.b.create<arith::MulIOp>(L.loc, iv[1], L.idx(dh)), iv[3]);
        L.store(L.load(p[0], {iv[0], iv[2], c}), p[1], iv);
      });
    });
    return L.set(s, out);
  }
};

/// out[b, t, h*dh + e] = in[b, h, t, e]
struct MergeHeadsLowering : LmLowering<lm::MergeHeadsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MergeHeadsOp m, Loops &L) const override {
    Value x = L.in(m.getInput());
    auto xt = llvm::cast<ShapedType>(m.getInput().getType());
    auto sz = L.dims(x);
    Value out = L.alloc(m.getType(), {sz[0], sz[2], L.idx(m.getType().getDimSize(2))});
    L.outlined("merge_heads", {x, out}, [&](ArrayRef<Value> p) {
      L.nest(L.dims(p[0]), [&](ValueRange iv) {
        Value c =
            L.b.create<arith::AddIOp>(L.loc, L.b.create<arith::MulIOp>(L.loc, iv[1], L.idx(xt.getDimSize(3))), iv[3]);
        L.store(L.load(p[0], iv), p[1], {iv[0], iv[2], c});
      });
    });
    return L.set(m, out);
  }
};

/// out[b, h, i, j] = sum_k lhs[b, h, i, k] rhs[b, h, k, j] (rhs[b, h, j, k] when transposed).
struct MatmulLowering : LmLowering<lm::MatmulOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MatmulOp m, Loops &L) const override {
    auto at = llvm::cast<ShapedType>(m.getLhs().getType());
    if (at.getRank() != 4)
      return m.emitOpError("CPU lowering handles [B, H, M, K] operands only");
    Value lhs = L.in(m.getLhs()), rhs = L.in(m.getRhs());
    bool t = m.getTransposeRhs(), tl = m.getTransposeLhs();
    auto ls = L.dims(lhs), rs = L.dims(rhs);
    SmallVector<Value> sz = {ls[0], ls[1], ls[tl ? 3 : 2], rs[t ? 2 : 3]};
    Value out = L.alloc(m.getType(), sz);
    L.outlined(std::string("matmul") + (tl ? "_tl" : "") + (t ? "_t" : ""), {lhs, rhs, out}, [&](ArrayRef<Value> p) {
      Value K = L.dims(p[0])[tl ? 2 : 3];
      L.nest(L.dims(p[2]), [&](ValueRange iv) {
        Value acc = L.reduce(L.idx(0), K, L.f32c(0), [&](Value k, Value acc) {
          Value a = tl ? L.load(p[0], {iv[0], iv[1], k, iv[2]}) : L.load(p[0], {iv[0], iv[1], iv[2], k});
          Value c = t ? L.load(p[1], {iv[0], iv[1], iv[3], k}) : L.load(p[1], {iv[0], iv[1], k, iv[3]});
          return L.b.create<arith::AddFOp>(L.loc, acc, L.b.create<arith::MulFOp>(L.loc, a, c));
        });
        L.store(acc, p[2], iv);
      });
    });
    return L.set(m, out);
  }
};

/// Key j visible to query i: j < length and the mask kind's predicate (runtime/reference: keyVisible).
Value visible(Loops &L, lm::MaskKind kind, Value i, Value j, Value length) {
  Value v = L.lt(j, length);
  switch (kind) {
  case lm::MaskKind::none: return v;
  case lm::MaskKind::causal: return L.andI(v, L.le(j, i));
  case lm::MaskKind::anticausal: return L.andI(v, L.ge(j, i));
  case lm::MaskKind::diagonal: return L.andI(v, L.ne(j, i));
  default: return Value();
  }
}

struct MaskFillLowering : LmLowering<lm::MaskFillOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::MaskFillOp m, Loops &L) const override {
    if (m.getMask() == lm::MaskKind::Explicit)
      return m.emitOpError("explicit masks have no CPU lowering yet");
    L.lengths = L.in(m.getLengths());
    Value s = L.in(m.getScores()), data = m.getMaskData() ? L.in(m.getMaskData()) : Value();
    auto sz = L.dims(s);
    Value out = L.alloc(m.getType(), sz);
    SmallVector<Value> args{s, L.lengths, out};
    if (data)
      args.push_back(data);
    L.outlined(("mask_fill_" + lm::stringifyMaskKind(m.getMask())).str(), args, [&](ArrayRef<Value> p) {
      L.lengths = p[1];
      Value negInf = L.f32c(-INFINITY);
      L.nest(L.dims(p[0]), [&](ValueRange iv) {
        Value vis = m.getMask() == lm::MaskKind::directional
                        ? L.directionalVisible(p[3], iv[0], iv[2], iv[3], L.lengthOf(iv[0]))
                        : visible(L, m.getMask(), iv[2], iv[3], L.lengthOf(iv[0]));
        L.store(L.select(vis, L.load(p[0], iv), negInf), p[2], iv);
      });
    });
    return L.set(m, out);
  }
};

/// p_j = exp(x_j - max) / sum_k exp(x_k - max) in double; a row of -inf gives zeros.
struct SoftmaxLowering : LmLowering<lm::SoftmaxOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SoftmaxOp s, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value input = L.in(s.getInput());
    Value output = L.alloc(s.getType(), L.dims(input));
    L.outlined("softmax", {input, output}, [&](ArrayRef<Value> params) {
      Value x = params[0], out = params[1];
      auto sz = L.dims(x);
      Value C = sz.back();
      SmallVector<Value> rows(sz.begin(), sz.end() - 1);
      L.nest(rows, [&](ValueRange iv) {
        SmallVector<Value> row(iv.begin(), iv.end());
        Value max = L.rowMax(x, row, C);
        Value maxD = L.toF64(max);
        Value allMasked = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, max, L.f32c(-INFINITY));
        Value sum = L.reduce(L.idx(0), C, L.f64c(0), [&](Value c, Value acc) {
          row.push_back(c);
          Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(x, row)), maxD));
          row.pop_back();
          return b.create<arith::AddFOp>(loc, acc, e);
        });
        L.nest({C}, [&](ValueRange c) {
          row.push_back(c[0]);
          Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(x, row)), maxD));
          Value p = L.toF32(b.create<arith::DivFOp>(loc, e, sum));
          L.store(L.select(allMasked, L.f32c(0), p), out, row);
          row.pop_back();
        });
      });
    });
    return L.set(s, output);
  }
};

/// y_j = x_j - (max + log sum_k exp(x_k - max)), in double.
struct LogSoftmaxLowering : LmLowering<lm::LogSoftmaxOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LogSoftmaxOp l, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    Value x = L.in(l.getInput()), out = L.alloc(l.getType());
    auto sz = L.sizes(l.getType());
    Value C = sz.back();
    SmallVector<Value> rows(sz.begin(), sz.end() - 1);
    L.nest(rows, [&](ValueRange iv) {
      SmallVector<Value> row(iv.begin(), iv.end());
      Value maxD = L.toF64(L.rowMax(x, row, C));
      Value sum = L.reduce(L.idx(0), C, L.f64c(0), [&](Value c, Value acc) {
        row.push_back(c);
        Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, L.toF64(L.load(x, row)), maxD));
        row.pop_back();
        return b.create<arith::AddFOp>(loc, acc, e);
      });
      Value lse = b.create<arith::AddFOp>(loc, maxD, b.create<math::LogOp>(loc, sum));
      L.nest({C}, [&](ValueRange c) {
        row.push_back(c[0]);
        L.store(L.toF32(b.create<arith::SubFOp>(loc, L.toF64(L.load(x, row)), lse)), out, row);
        row.pop_back();
      });
    });
    return L.set(l, out);
  }
};

/// out[b,h,i,j] = q[b,h,i] . rel[clip(j - i) + k]
struct RelativeScoresLowering : LmLowering<lm::RelativeScoresOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::RelativeScoresOp r, Loops &L) const override {
    Value q = L.in(r.getQuery()), rel = L.in(r.getRel());
    int64_t dh = llvm::cast<ShapedType>(r.getQuery().getType()).getDimSize(3), k = r.getClip();
    auto qs = L.dims(q);
    SmallVector<Value> sz = {qs[0], qs[1], qs[2], L.dims(L.in(r.getKeys()))[2]};
    Value out = L.alloc(r.getType(), sz);
    L.outlined(("relative_scores_k" + Twine(k)).str(), {q, rel, out}, [&](ArrayRef<Value> p) {
      L.nest(L.dims(p[2]), [&](ValueRange iv) {
        Value ri = L.relativeIndex(iv[2], iv[3], k);
        Value acc = L.reduce(L.idx(0), L.idx(dh), L.f32c(0), [&](Value e, Value acc) {
          return L.b.create<arith::AddFOp>(
              L.loc, acc,
              L.b.create<arith::MulFOp>(L.loc, L.load(p[0], {iv[0], iv[1], iv[2], e}), L.load(p[1], {ri, e})));
        });
        L.store(acc, p[2], iv);
      });
    });
    return L.set(r, out);
  }
};

/// out[b,h,i,e] = sum_j p[b,h,i,j] rel[clip(j - i) + k, e]
struct RelativeValuesLowering : LmLowering<lm::RelativeValuesOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::RelativeValuesOp r, Loops &L) const override {
    Value p = L.in(r.getProbs()), rel = L.in(r.getRel());
    int64_t k = r.getClip();
    auto ps = L.dims(p);
    SmallVector<Value> sz = {ps[0], ps[1], ps[2], L.idx(r.getType().getDimSize(3))};
    Value out = L.alloc(r.getType(), sz);
    L.outlined(("relative_values_k" + Twine(k)).str(), {p, rel, out}, [&](ArrayRef<Value> params) {
      Value probs = params[0], table = params[1], result = params[2];
      Value M = L.dims(probs)[3];
      L.nest(L.dims(result), [&](ValueRange iv) {
        Value acc = L.reduce(L.idx(0), M, L.f32c(0), [&](Value j, Value acc) {
          Value ri = L.relativeIndex(iv[2], j, k);
          return L.b.create<arith::AddFOp>(L.loc, acc,
                                           L.b.create<arith::MulFOp>(L.loc, L.load(probs, {iv[0], iv[1], iv[2], j}),
                                                                     L.load(table, {ri, iv[3]})));
        });
        L.store(acc, result, iv);
      });
    });
    return L.set(r, out);
  }
};

/// out[..., f] = x[..., offset + f]
struct SliceFeaturesLowering : LmLowering<lm::SliceFeaturesOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::SliceFeaturesOp sl, Loops &L) const override {
    Value x = L.in(sl.getInput()), out = L.alloc(sl.getType());
    int64_t offset = sl.getOffset();
    L.nest(L.sizes(sl.getType()), [&](ValueRange iv) {
      SmallVector<Value> from(iv.begin(), iv.end());
      from.back() = L.b.create<arith::AddIOp>(L.loc, from.back(), L.idx(offset));
      L.store(L.load(x, from), out, iv);
    });
    return L.set(sl, out);
  }
};

} // namespace

void populateElementwisePatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<EmbedLowering, PositionsLowering, FillIdsLowering, AddLowering, UnaryLowering<lm::ScaleOp, scaleOf, scaleKey, 1>,
               UnaryLowering<lm::GeluOp, geluOf, geluKey, 24>, UnaryLowering<lm::ReluOp, reluOf, reluKey, 1>, LayerNormLowering,
               SplitHeadsLowering, MergeHeadsLowering, MatmulLowering, MaskFillLowering, SoftmaxLowering,
               LogSoftmaxLowering, RelativeScoresLowering, RelativeValuesLowering, SliceFeaturesLowering>(
      converter, patterns.getContext(), context);
}

void emitActivationInPlace(Loops &L, StringRef kind, Value buffer) {
  int64_t C = llvm::cast<ShapedType>(buffer.getType()).getShape().back();
  auto apply = [&](Value m, ValueRange iv) { L.store(emitActivation(L.b, L.loc, kind, L.load(m, iv)), m, iv); };
  if (!L.forRows(rowTaskName(("inplace_" + kind).str(), buffer), {buffer}, {}, kind == "relu" ? 1 : 24,
                 [&](ArrayRef<Value> m, ArrayRef<Value>, Value r) {
                   L.nest({L.idx(C)}, [&](ValueRange c) { apply(m[0], {r, c[0]}); });
                 }))
    L.nest(L.dims(buffer), [&](ValueRange iv) { apply(buffer, iv); });
}

/// A constant of `type` (f32 or i32, or a vector of them) with every element `v`.
static Value splat(OpBuilder &b, Location loc, Type type, double v) {
  Type element = getElementTypeOrSelf(type);
  TypedAttr scalar = isa<FloatType>(element) ? TypedAttr(b.getFloatAttr(element, v))
                                              : TypedAttr(b.getIntegerAttr(element, int64_t(v)));
  if (auto vt = dyn_cast<VectorType>(type))
    return b.create<arith::ConstantOp>(loc, vt, DenseElementsAttr::get(vt, scalar));
  return b.create<arith::ConstantOp>(loc, scalar);
}

Value emitVectorExp(OpBuilder &b, Location loc, Value x) {
  Type type = x.getType();
  auto c = [&](float f) { return splat(b, loc, type, f); };
  // vector.fma (llvm.fmuladd: fused on every FMA target) as the attention kernels always had, math.fma on scalars.
  auto fma = [&](Value x, Value y, Value z) -> Value {
    if (isa<VectorType>(type))
      return b.create<vector::FMAOp>(loc, x, y, z);
    return b.create<math::FmaOp>(loc, x, y, z);
  };
  Value lowest = c(-88.0f);
  x = b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, x, lowest), lowest, x);
  Value magic = c(12582912.0f);
  Value t = fma(x, c(1.44269504088896341f), magic);
  Value n = b.create<arith::SubFOp>(loc, t, magic);
  Value r = fma(n, c(-0.693359375f), x);
  r = fma(n, c(2.12194440e-4f), r);
  Value p = c(1.9875691500e-4f);
  for (float k : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f, 1.0f, 1.0f})
    p = fma(p, r, c(k));
  Type i32 = b.getI32Type();
  if (auto vt = dyn_cast<VectorType>(type))
    i32 = VectorType::get(vt.getShape(), i32);
  Value bits = b.create<arith::ShLIOp>(loc, b.create<arith::BitcastOp>(loc, i32, t), splat(b, loc, i32, 23));
  bits = b.create<arith::AddIOp>(loc, bits, splat(b, loc, i32, 127 << 23));
  return b.create<arith::MulFOp>(loc, p, b.create<arith::BitcastOp>(loc, type, bits));
}

Value emitGreater(OpBuilder &b, Location loc, Value x, Value y) {
  return b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x, y), x, y);
}

Value emitAcrossLanes(OpBuilder &b, Location loc, Value x, const std::function<Value(Value, Value)> &combine) {
  const int64_t lanes = llvm::cast<VectorType>(x.getType()).getNumElements();
  for (int64_t w = lanes / 2; w >= 1; w /= 2) {
    SmallVector<int64_t> swap(lanes);
    for (int64_t l = 0; l < lanes; ++l)
      swap[l] = l ^ w;
    x = combine(x, b.create<vector::ShuffleOp>(loc, x, x, swap));
  }
  return x;
}

SmallVector<Value> emitAcrossLanesOfEach(OpBuilder &b, Location loc, ArrayRef<Value> xs,
                                         const std::function<Value(Value, Value)> &combine,
                                         const std::function<Value(Value)> &then) {
  if (xs.empty())
    return {};
  const int64_t lanes = llvm::cast<VectorType>(xs[0].getType()).getNumElements();
  // The merged vectors, and per lane the index (into xs) of the vector whose butterfly the lane carries.
  SmallVector<Value> vs(xs.begin(), xs.end());
  SmallVector<SmallVector<int64_t>> owner;
  for (size_t r = 0; r < xs.size(); ++r)
    owner.push_back(SmallVector<int64_t>(lanes, int64_t(r)));
  for (int64_t w = lanes / 2; w >= 1; w /= 2) {
    SmallVector<Value> next;
    SmallVector<SmallVector<int64_t>> nextOwner;
    for (size_t i = 0; i < vs.size(); i += 2) {
      Value P = vs[i];
      if (i + 1 == vs.size()) { // no partner: the butterfly's own step
        SmallVector<int64_t> swap(lanes);
        for (int64_t l = 0; l < lanes; ++l)
          swap[l] = l ^ w;
        next.push_back(combine(P, b.create<vector::ShuffleOp>(loc, P, P, swap)));
        nextOwner.push_back(owner[i]);
        continue;
      }
      // The lower w lanes of each group of 2w take P's step, the upper w Q's.
      SmallVector<int64_t> own(lanes), other(lanes), merged(lanes);
      for (int64_t l = 0; l < lanes; ++l) {
        bool low = l % (2 * w) < w;
        own[l] = low ? l : lanes + l;
        other[l] = low ? l + w : lanes + l - w;
        merged[l] = low ? owner[i][l] : owner[i + 1][l];
      }
      Value Q = vs[i + 1];
      Value mine = b.create<vector::ShuffleOp>(loc, P, Q, own);
      next.push_back(combine(mine, b.create<vector::ShuffleOp>(loc, P, Q, other)));
      nextOwner.push_back(merged);
    }
    vs = std::move(next);
    owner = std::move(nextOwner);
  }
  SmallVector<Value> out(xs.size());
  for (auto [v, owners] : llvm::zip(vs, owner)) {
    Value done = then ? then(v) : v;
    if (llvm::all_equal(owners)) { // never merged (a lone vector): every lane is its butterfly's already
      out[owners[0]] = done;
      continue;
    }
    for (int64_t l = 0; l < lanes; ++l)
      if (!out[owners[l]])
        out[owners[l]] = b.create<vector::ShuffleOp>(loc, done, done, SmallVector<int64_t>(lanes, l));
  }
  return out;
}

Value emitActivation(OpBuilder &b, Location loc, StringRef kind, Value x) {
  Type type = x.getType();
  auto c = [&](float v) { return splat(b, loc, type, v); };
  if (kind == "relu")
    return b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x, c(0)), x, c(0));
  if (kind == "gelu") {
    // x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 = x s / 2 without a division (MLIR's erf is a ratio of polynomials, and
    // x / sqrt 2 another: two vdivps per 16 values) and without cancelling 1 + erf for x < 0: with
    // e = erfc(|x| / sqrt 2) = exp(|x| R(|x|)) (R: a least-squares fit of degree 10 on Chebyshev nodes of
    // [0, 5.54], scripts/fit-gelu.py), s = 2 - e for x > 0 and e otherwise; e = 0 from |x| = 5.54, where
    // erfc(|x| / sqrt 2) < 1.8e-8 (NaN stays NaN). Against x Phi(x) in double on [-8, 8] (ActivationTest): within
    // 2 ulp for x >= 0, 5 ulp for -2 < x < 0 and 35 ulp of the tiny values below (MLIR's erf: 2.7, 63 and all bits
    // lost to 1 + erf there).
    static constexpr float kR[] = {-0.79788518f,     -0.318304062f,     -0.0363543071f,  0.00480929669f,
                                   1.98722173e-05f,  -0.000213851104f,  6.33841701e-05f, -1.06930347e-05f,
                                   1.12652992e-06f,  -6.9036389e-08f,   1.88385685e-09f};
    constexpr float kLast = 5.54f;
    Value a = b.create<math::AbsFOp>(loc, x);
    Value m = b.create<arith::MinimumFOp>(loc, a, c(kLast));
    Value r = c(kR[std::size(kR) - 1]);
    for (size_t k = std::size(kR) - 1; k-- > 0;)
      r = b.create<math::FmaOp>(loc, r, m, c(kR[k]));
    Value e = emitVectorExp(b, loc, b.create<arith::MulFOp>(loc, m, r));
    e = b.create<arith::SelectOp>(loc, b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, a, c(kLast)), e, c(0));
    Value positive = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x, c(0));
    Value s = b.create<arith::SelectOp>(loc, positive, b.create<arith::SubFOp>(loc, c(2), e), e);
    return b.create<arith::MulFOp>(loc, b.create<arith::MulFOp>(loc, x, c(0.5)), s);
  }
  assert(kind == "gelu_tanh" && "an activation lm.linear's verifier accepts");
  Value x3 = b.create<arith::MulFOp>(loc, b.create<arith::MulFOp>(loc, x, x), x);
  Value inner = b.create<arith::AddFOp>(loc, x, b.create<arith::MulFOp>(loc, c(0.044715f), x3));
  Value t = b.create<math::TanhOp>(loc, b.create<arith::MulFOp>(loc, c(std::sqrt(2.0f / float(M_PI))), inner));
  Value half = b.create<arith::MulFOp>(loc, c(0.5), x);
  return b.create<arith::MulFOp>(loc, half, b.create<arith::AddFOp>(loc, c(1), t));
}

} // namespace lmcc::codegen
