//===- NGram.cpp - lm-to-loops: the n-gram heads (issue 18) -------------------===//
//
// lm.wdr_conjugate and lm.ngram_ensemble as loop nests; lm.ngram_loss and its VJP as one call per head
// of the runtime's n-gram head kernels (runtime/lib/TrainKernels.cpp: lm.token_loss on the targets
// shifted by j-1, weighted w_1 = 1/2, w_j = 1/(2(n-1)), the gradient seeded with w_j / T). The meaning of
// every op is runtime/reference/NGram.cpp.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// The objective's weight of head j (1-based): 1/2 for the main head, 1/(2(n-1)) for each other.
double headWeight(int64_t j, int64_t n) { return j == 1 ? 0.5 : 0.5 / double(n - 1); }

/// Binomial coefficient C(n, k) (small n: the heads' count).
int64_t binomial(int64_t n, int64_t k) {
  int64_t c = 1;
  for (int64_t i = 1; i <= k; ++i)
    c = c * (n - k + i) / i;
  return c;
}

/// out[b, s] = sum_{i=1..j-1, s+j-i < L_b} (-1)^(i+1) C(j-1, i) W[ids[b, s+j-i]], summed in order of i.
struct WdrConjugateLowering : LmLowering<lm::WdrConjugateOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::WdrConjugateOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    Value table = L.in(op.getTable()), ids = L.in(op.getIds()), out = L.alloc(op.getType());
    const int64_t j = op.getHead();
    L.nest(L.sizes(op.getType()), [&](ValueRange iv) {
      Value len = L.lengthOf(iv[0]);
      Value acc = L.f32c(0);
      for (int64_t i = 1; i < j; ++i) {
        const double coef = (i % 2 ? 1.0 : -1.0) * double(binomial(j - 1, i));
        Value pos = b.create<arith::AddIOp>(loc, iv[1], L.idx(j - i));
        Value valid = L.lt(pos, len);
        Value safe = L.select(valid, pos, L.idx(0));
        Value id = L.toIndex(L.load(ids, {iv[0], safe}));
        Value term = b.create<arith::MulFOp>(loc, L.f32c(coef), L.load(table, {id, iv[2]}));
        acc = L.select(valid, b.create<arith::AddFOp>(loc, acc, term), acc);
      }
      L.store(acc, out, iv);
    });
    return L.set(op, out);
  }
};

/// out[b, p] = (1-lambda) u_1[p-1] + c sum_j (p >= j ? u_j[p-j] : u_1[p-1]) on 1 <= p < L_b, else 0.
struct NgramEnsembleLowering : LmLowering<lm::NgramEnsembleOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::NgramEnsembleOp op, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    L.lengths = L.in(op.getLengths());
    SmallVector<Value> heads;
    for (Value h : op.getHeads())
      heads.push_back(L.in(h));
    const int64_t n = int64_t(heads.size());
    const double lambda = op.getLambda().convertToDouble();
    Value out = L.alloc(op.getType());
    L.nest(L.sizes(op.getType()), [&](ValueRange iv) {
      Value p = iv[1];
      Value valid = L.andI(L.ge(p, L.idx(1)), L.lt(p, L.lengthOf(iv[0])));
      Value prev = L.select(valid, b.create<arith::SubIOp>(loc, p, L.idx(1)), L.idx(0));
      Value main = L.load(heads[0], {iv[0], prev, iv[2]});
      Value acc = b.create<arith::MulFOp>(loc, L.f32c(1.0 - lambda), main);
      for (int64_t j = 2; j <= n; ++j) {
        Value reached = L.ge(p, L.idx(j));
        Value row = L.select(reached, b.create<arith::SubIOp>(loc, p, L.idx(j)), L.idx(0));
        Value term = L.select(reached, L.load(heads[j - 1], {iv[0], row, iv[2]}), main);
        acc = b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, L.f32c(lambda / double(n - 1)), term));
      }
      L.store(L.select(valid, acc, L.f32c(0)), out, iv);
    });
    return L.set(op, out);
  }
};

/// The common arguments of lm_rt_ngram_head_loss / _grad up to the sizes.
struct HeadCall {
  Loops &L;
  SmallVector<Value> args;
  void ptr(Value buffer) {
    args.push_back(buffer ? L.pointer(buffer)
                          : L.b.create<LLVM::ZeroOp>(L.loc, LLVM::LLVMPointerType::get(L.b.getContext())).getResult());
  }
  void sizes(int64_t D, int64_t V) {
    for (Value v : {L.B(), L.N()})
      args.push_back(L.b.create<arith::IndexCastOp>(L.loc, L.b.getI64Type(), v));
    args.push_back(L.i64c(D));
    args.push_back(L.i64c(V));
  }
  /// Head u's operands (u, W, bias or NULL, targets, lengths), then `lse` when given, then the sizes.
  template <typename Op> void head(Op op, Value u, Value lse = Value()) {
    for (Value v : {u, Value(op.getWeight())})
      ptr(L.in(v));
    ptr(op.getBias() ? L.in(op.getBias()) : Value());
    for (Value v : {op.getTargets(), op.getLengths()})
      ptr(L.in(v));
    if (lse)
      ptr(L.in(lse));
    auto w = op.getWeight().getType();
    sizes(w.getDimSize(1), w.getDimSize(0));
  }
  /// Head j's (1-based of n) smoothing, shift, weight and first flag.
  void headTerms(double smoothing, int64_t j, int64_t n) {
    args.append({L.f64c(smoothing), L.i64c(j - 1), L.f64c(headWeight(j, n)), L.i32c(j == 1)});
  }
};

LogicalResult replaceResults(Loops &L, Operation *op, ArrayRef<Value> buffers) {
  SmallVector<Value> values;
  for (auto [result, buffer] : llvm::zip(op->getResults(), buffers)) {
    auto want = bufferType(llvm::cast<RankedTensorType>(result.getType()));
    values.push_back(buffer.getType() == want ? buffer : L.b.create<memref::CastOp>(L.loc, want, buffer).getResult());
  }
  L.b.replaceOp(op, values);
  return success();
}

struct NgramLossLowering : LmLowering<lm::NgramLossOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::NgramLossOp op, Loops &L) const override {
    const int64_t n = int64_t(op.getHeads().size());
    SmallVector<Value> results{L.alloc(op.getLoss().getType())};
    for (int64_t j = 1; j <= n; ++j) {
      Value lse = L.alloc(llvm::cast<ShapedType>(op.getLse()[j - 1].getType()));
      HeadCall c{L};
      c.head(op, op.getHeads()[j - 1]);
      c.headTerms(op.getSmoothing().convertToDouble(), j, n);
      c.ptr(results[0]);
      c.ptr(lse);
      c.args.append(L.trainGemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/false)));
      L.b.create<func::CallOp>(L.loc, "lm_rt_ngram_head_loss", TypeRange{}, c.args);
      results.push_back(lse);
    }
    return replaceResults(L, op, results);
  }
};

struct NgramLossGradLowering : LmLowering<lm::NgramLossGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::NgramLossGradOp op, Loops &L) const override {
    const int64_t n = int64_t(op.getHeads().size());
    SmallVector<Value> results;
    for (Value du : op.getDHeads())
      results.push_back(L.alloc(llvm::cast<ShapedType>(du.getType())));
    Value dW = L.alloc(op.getDWeight().getType()), db = L.alloc(op.getDBias().getType());
    for (int64_t j = 1; j <= n; ++j) {
      HeadCall c{L};
      c.head(op, op.getHeads()[j - 1], op.getLse()[j - 1]);
      c.headTerms(op.getSmoothing().convertToDouble(), j, n);
      c.ptr(results[j - 1]);
      c.ptr(dW);
      c.ptr(op.getDBias().use_empty() ? Value() : db);
      c.args.append(L.trainGemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/true)));
      L.b.create<func::CallOp>(L.loc, "lm_rt_ngram_head_grad", TypeRange{}, c.args);
    }
    results.append({dW, db});
    return replaceResults(L, op, results);
  }
};

struct NgramLossAndGradLowering : LmLowering<lm::NgramLossAndGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::NgramLossAndGradOp op, Loops &L) const override {
    const int64_t n = int64_t(op.getHeads().size());
    Value total = L.alloc(op.getLoss().getType());
    SmallVector<Value> lse, dHeads;
    for (int64_t j = 0; j < n; ++j) {
      lse.push_back(L.alloc(llvm::cast<ShapedType>(op.getLse()[j].getType())));
      dHeads.push_back(L.alloc(llvm::cast<ShapedType>(op.getDHeads()[j].getType())));
    }
    Value dW = L.alloc(op.getDWeight().getType()), db = L.alloc(op.getDBias().getType());
    // Head by head, forward then backward (the sums over heads in head order, as the pair's).
    for (int64_t j = 1; j <= n; ++j) {
      HeadCall c{L};
      c.head(op, op.getHeads()[j - 1]);
      c.headTerms(op.getSmoothing().convertToDouble(), j, n);
      c.args.push_back(L.i64c(kKeptLogitsBytes));
      c.ptr(total);
      c.ptr(lse[j - 1]);
      c.ptr(dHeads[j - 1]);
      c.ptr(dW);
      c.ptr(op.getDBias().use_empty() ? Value() : db);
      c.args.append(L.trainGemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/true)));
      L.b.create<func::CallOp>(L.loc, "lm_rt_ngram_head_loss_and_grad", TypeRange{}, c.args);
    }
    SmallVector<Value> results{total};
    llvm::append_range(results, lse);
    llvm::append_range(results, dHeads);
    results.append({dW, db});
    return replaceResults(L, op, results);
  }
};

} // namespace

void populateNGramPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<WdrConjugateLowering, NgramEnsembleLowering, NgramLossLowering, NgramLossGradLowering,
               NgramLossAndGradLowering>(
      converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
