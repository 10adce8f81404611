//===- Backward.cpp - lm-to-loops: the training loss and the backward ops ------===//
//
// lm.token_loss, lm.cross_entropy and the backward ops of lm-autodiff (dialect/LmOps.td,
// "Training") lower to calls of the runtime's training kernels (runtime/lib/TrainKernels.cpp:
// loops compiled for the host's ISA level, deterministic for any thread count; those with GEMMs
// get the library's generated training GEMM, Gemm.h getOrCreateTrainGemm, as a function pointer)
// on the ops' buffers; lm.param_grad copies a weight's gradient into its slot of the entry
// point's gradient buffer (the last argument of `<model>_loss_grad_kernel`). lm.attention_grad in
// the vector form is generated (Attention.cpp); the rest of it calls lm_rt_attention_grad.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"
#include "runtime/lib/TrainKernels.h"

using namespace mlir;

namespace lmcc::codegen {

void declareTrainingRuntime(OpBuilder &b, Location loc) {
  auto ptr = LLVM::LLVMPointerType::get(b.getContext());
  Type i64 = b.getI64Type(), i32 = b.getI32Type(), f64 = b.getF64Type(), f32 = b.getF32Type();
  auto declare = [&](StringRef name, ArrayRef<Type> args) {
    b.create<func::FuncOp>(loc, name, b.getFunctionType(args, {})).setPrivate();
  };
  // The kernels running GEMMs end with the library's training GEMM: (lm_rt_gemm_fn, column-slice width).
  declare("lm_rt_token_loss", {ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, ptr, ptr, ptr, i64});
  declare("lm_rt_token_loss_grad", {ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, i32, ptr, ptr, ptr, ptr, i64});
  declare("lm_rt_token_loss_and_grad",
          {ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64});
  declare("lm_rt_ngram_head_loss", {ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, i64, f64, i32, ptr, ptr, ptr, i64});
  declare("lm_rt_ngram_head_loss_and_grad",
          {ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, i64, f64, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64});
  declare("lm_rt_ngram_head_grad",
          {ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, f64, i64, f64, i32, ptr, ptr, ptr, ptr, i64});
  declare("lm_rt_linear_grad", {ptr, ptr, ptr, i64, i64, i64, ptr, ptr, ptr, ptr, i64});
  declare("lm_rt_layer_norm_grad", {ptr, ptr, ptr, i64, i64, f64, ptr, ptr, ptr});
  declare("lm_rt_activation_grad", {ptr, ptr, i64, i32, ptr});
  declare("lm_rt_attention_grad", {ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, i32, f32,
                                   ptr, ptr, ptr, ptr, ptr});
  declare("lm_rt_relative_scores_grad", {ptr, ptr, ptr, i64, i64, i64, i64, i64, ptr, ptr});
  declare("lm_rt_relative_values_grad", {ptr, ptr, ptr, i64, i64, i64, i64, i64, ptr, ptr});
  declare("lm_rt_embed_grad", {ptr, ptr, ptr, i64, i64, i64, i64, ptr});
  declare("lm_rt_embed_grad_add", {ptr, ptr, ptr, i64, i64, i64, i64, ptr});
  declare("lm_rt_positions_grad", {ptr, ptr, i64, i64, i64, i64, ptr});
  declare("lm_rt_cross_entropy", {ptr, ptr, ptr, i64, i64, i64, f64, ptr});
  declare("lm_rt_cross_entropy_grad", {ptr, ptr, i64, i64, i64, f64, i32, ptr});
  declare("lm_rt_softmax_grad", {ptr, ptr, i64, i64, i32, ptr});
  declare("lm_rt_dropout", {ptr, ptr, i64, i64, i64, f64, i64, ptr});
  declare("lm_rt_dropout_heads", {ptr, ptr, i64, i64, i64, i64, f64, i64, ptr});
  declare("lm_rt_dropout_rows", {ptr, ptr, ptr, i64, i64, i64, f64, i64, ptr});
}

SmallVector<TrainGemmDepth, 2> lossHeadGemmDepths(ShapedType weight, bool backward) {
  const int64_t vocab = weight.getDimSize(0), d = weight.getDimSize(1);
  // logits = h W_tile^T (depth d, a tile of weight rows); dh += G_tile W_tile (depth and lda the tile, d columns:
  // the tiles of a vocabulary no wider than one tile are narrower than its lda).
  SmallVector<TrainGemmDepth, 2> depths{TrainGemmDepth::forWeight(d, std::min<int64_t>(vocab, LMRT_LOSS_VOCAB_TILE))};
  if (backward && vocab > LMRT_LOSS_VOCAB_TILE)
    depths.push_back(TrainGemmDepth::forWeight(LMRT_LOSS_VOCAB_TILE, d));
  return depths;
}

namespace {

/// The temporary (memref.alloc) `buffer` is, through the casts to the generic layout of converted tensors; else null.
memref::AllocOp temporaryOf(Value buffer) {
  while (auto cast = buffer.getDefiningOp<memref::CastOp>())
    buffer = cast.getSource();
  return buffer.getDefiningOp<memref::AllocOp>();
}

/// The runtime call of one op: pointers of buffers, sizes as i64, attributes as constants.
struct Call {
  Loops &L;
  SmallVector<Value> args;

  Call &ptr(Value buffer) {
    args.push_back(buffer ? L.pointer(buffer) : L.b.create<LLVM::ZeroOp>(L.loc, LLVM::LLVMPointerType::get(L.b.getContext())).getResult());
    return *this;
  }
  Call &i64(Value index) {
    args.push_back(L.b.create<arith::IndexCastOp>(L.loc, L.b.getI64Type(), index));
    return *this;
  }
  Call &i64(int64_t v) {
    args.push_back(L.i64c(v));
    return *this;
  }
  Call &i32(int64_t v) {
    args.push_back(L.i32c(v));
    return *this;
  }
  Call &f64(double v) {
    args.push_back(L.f64c(v));
    return *this;
  }
  Call &f32(double v) {
    args.push_back(L.f32c(v));
    return *this;
  }
  Call &gemm(ArrayRef<TrainGemmDepth> depths) {
    args.append(L.trainGemm(depths));
    return *this;
  }
  void emit(StringRef name) { L.b.create<func::CallOp>(L.loc, name, TypeRange{}, args); }
};

/// Product of the sizes of all but the last axis (the rows of a row-major tensor).
Value rowsOf(Loops &L, ShapedType t) {
  SmallVector<Value> s = L.sizes(t);
  Value rows = L.idx(1);
  for (size_t i = 0; i + 1 < s.size(); ++i)
    rows = L.b.create<arith::MulIOp>(L.loc, rows, s[i]);
  return rows;
}

int64_t lastDim(Value v) { return llvm::cast<ShapedType>(v.getType()).getShape().back(); }

/// The loss head's operands as the token-loss kernels take them first: h, W, bias (or NULL), targets, lengths.
template <typename Op> Call &headOperands(Call &c, Op op) {
  return c.ptr(c.L.in(op.getHidden()))
      .ptr(c.L.in(op.getWeight()))
      .ptr(op.getBias() ? c.L.in(op.getBias()) : Value())
      .ptr(c.L.in(op.getTargets()))
      .ptr(c.L.in(op.getLengths()));
}

/// B, N, D, V and the smoothing, as the token-loss kernels take them.
template <typename Op> Call &headSizes(Call &c, Op op) {
  auto w = op.getWeight().getType();
  return c.i64(c.L.B()).i64(c.L.N()).i64(w.getDimSize(1)).i64(w.getDimSize(0)).f64(op.getSmoothing().convertToDouble());
}

struct TokenLossLowering : LmLowering<lm::TokenLossOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TokenLossOp op, Loops &L) const override {
    Value ce = L.alloc(op.getLoss().getType()), lse = L.alloc(op.getLse().getType());
    Call call{L};
    headSizes(headOperands(call, op), op)
        .ptr(ce)
        .ptr(lse)
        .gemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/false))
        .emit("lm_rt_token_loss");
    return L.setAll(op, {ce, lse});
  }
};

struct TokenLossGradLowering : LmLowering<lm::TokenLossGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TokenLossGradOp op, Loops &L) const override {
    Value dh = L.alloc(op.getDHidden().getType()), dW = L.alloc(op.getDWeight().getType()),
          db = L.alloc(op.getDBias().getType());
    Call call{L};
    headSizes(headOperands(call, op).ptr(L.in(op.getLse())), op)
        .i32(op.getPerLength() ? 1 : 0)
        .ptr(dh)
        .ptr(dW)
        .ptr(op.getDBias().use_empty() ? Value() : db)
        .gemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/true))
        .emit("lm_rt_token_loss_grad");
    return L.setAll(op, {dh, dW, db});
  }
};

struct TokenLossAndGradLowering : LmLowering<lm::TokenLossAndGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::TokenLossAndGradOp op, Loops &L) const override {
    Value ce = L.alloc(op.getLoss().getType()), lse = L.alloc(op.getLse().getType());
    Value dh = L.alloc(op.getDHidden().getType()), dW = L.alloc(op.getDWeight().getType()),
          db = L.alloc(op.getDBias().getType());
    Call call{L};
    headSizes(headOperands(call, op), op)
        .i32(op.getPerLength() ? 1 : 0)
        .i64(kKeptLogitsBytes)
        .ptr(ce)
        .ptr(lse)
        .ptr(dh)
        .ptr(dW)
        .ptr(op.getDBias().use_empty() ? Value() : db)
        .gemm(lossHeadGemmDepths(op.getWeight().getType(), /*backward=*/true))
        .emit("lm_rt_token_loss_and_grad");
    return L.setAll(op, {ce, lse, dh, dW, db});
  }
};

struct CrossEntropyLowering : LmLowering<lm::CrossEntropyOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::CrossEntropyOp op, Loops &L) const override {
    Value ce = L.alloc(op.getType());
    Call{L}
        .ptr(L.in(op.getLogprobs()))
        .ptr(L.in(op.getTargets()))
        .ptr(L.in(op.getLengths()))
        .i64(L.B())
        .i64(L.N())
        .i64(lastDim(op.getLogprobs()))
        .f64(op.getSmoothing().convertToDouble())
        .ptr(ce)
        .emit("lm_rt_cross_entropy");
    return L.set(op, ce);
  }
};

struct CrossEntropyGradLowering : LmLowering<lm::CrossEntropyGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::CrossEntropyGradOp op, Loops &L) const override {
    Value dlp = L.alloc(op.getType());
    Call{L}
        .ptr(L.in(op.getTargets()))
        .ptr(L.in(op.getLengths()))
        .i64(L.B())
        .i64(L.N())
        .i64(lastDim(op.getResult()))
        .f64(op.getSmoothing().convertToDouble())
        .i32(op.getPerLength() ? 1 : 0)
        .ptr(dlp)
        .emit("lm_rt_cross_entropy_grad");
    return L.set(op, dlp);
  }
};

template <typename Op, int Logarithmic> struct SoftmaxGradLowering : LmLowering<Op> {
  using LmLowering<Op>::LmLowering;
  LogicalResult lower(Op op, Loops &L) const override {
    // Sized from the operand (a cross-attention's probabilities [B, H, N, M] have M != N).
    SmallVector<Value> sz = L.dims(L.in(op.getGrad()));
    Value dx = L.alloc(op.getType(), sz), rows = L.idx(1);
    for (size_t i = 0; i + 1 < sz.size(); ++i)
      rows = L.b.create<arith::MulIOp>(L.loc, rows, sz[i]);
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getOutput()))
        .i64(rows)
        .i64(sz.back())
        .i32(Logarithmic)
        .ptr(dx)
        .emit("lm_rt_softmax_grad");
    return L.set(op, dx);
  }
};

struct LinearGradLowering : LmLowering<lm::LinearGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LinearGradOp op, Loops &L) const override {
    Value dx = L.alloc(op.getDInput().getType()), dW = L.alloc(op.getDWeight().getType()),
          db = L.alloc(op.getDBias().getType());
    auto w = op.getWeight().getType();
    // dx = dy W: depth and lda `out` (the training GEMM's static depth; no dx, no such product).
    const TrainGemmDepth dxDepth = TrainGemmDepth::forWeight(w.getDimSize(0), w.getDimSize(1));
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getInput()))
        .ptr(L.in(op.getWeight()))
        .i64(rowsOf(L, op.getGrad().getType()))
        .i64(w.getDimSize(1))
        .i64(w.getDimSize(0))
        .ptr(op.getDInput().use_empty() ? Value() : dx)
        .ptr(dW)
        .ptr(op.getDBias().use_empty() ? Value() : db)
        .gemm(op.getDInput().use_empty() ? ArrayRef<TrainGemmDepth>() : ArrayRef<TrainGemmDepth>(dxDepth))
        .emit("lm_rt_linear_grad");
    return L.setAll(op, {dx, dW, db});
  }
};

struct LayerNormGradLowering : LmLowering<lm::LayerNormGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LayerNormGradOp op, Loops &L) const override {
    Value dx = L.alloc(op.getDInput().getType()), dg = L.alloc(op.getDGamma().getType()),
          db = L.alloc(op.getDBeta().getType());
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getInput()))
        .ptr(L.in(op.getGamma()))
        .i64(rowsOf(L, op.getGrad().getType()))
        .i64(lastDim(op.getInput()))
        .f64(op.getEpsilon().convertToDouble())
        .ptr(dx)
        .ptr(dg)
        .ptr(db)
        .emit("lm_rt_layer_norm_grad");
    return L.setAll(op, {dx, dg, db});
  }
};

struct ActivationGradLowering : LmLowering<lm::ActivationGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::ActivationGradOp op, Loops &L) const override {
    Value dx = L.alloc(op.getType());
    int kind = op.getKind() == "relu" ? LMRT_ACT_RELU : op.getKind() == "gelu" ? LMRT_ACT_GELU : LMRT_ACT_GELU_TANH;
    Value n = L.b.create<arith::MulIOp>(L.loc, rowsOf(L, op.getType()), L.idx(lastDim(op.getInput())));
    Call{L}.ptr(L.in(op.getGrad())).ptr(L.in(op.getInput())).i64(n).i32(kind).ptr(dx).emit("lm_rt_activation_grad");
    return L.set(op, dx);
  }
};

struct AttentionGradLowering : LmLowering<lm::AttentionGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::AttentionGradOp op, Loops &L) const override {
    if (hasVectorAttentionGrad(op))
      return lowerVectorAttentionGrad(op, L);
    int mask;
    switch (op.getMask()) {
    case lm::MaskKind::none: mask = LMRT_MASK_NONE; break;
    case lm::MaskKind::causal: mask = LMRT_MASK_CAUSAL; break;
    case lm::MaskKind::anticausal: mask = LMRT_MASK_ANTICAUSAL; break;
    case lm::MaskKind::diagonal: mask = LMRT_MASK_DIAGONAL; break;
    case lm::MaskKind::directional: mask = LMRT_MASK_DIRECTIONAL; break;
    default: return op.emitOpError("explicit masks have no CPU backward yet");
    }
    Value rows = op.getMaskData() ? L.in(op.getMaskData()) : Value();
    const int64_t rowWidth = rows ? L.typeOf(op.getMaskData()).getDimSize(2) : 0;
    // Sized from the operands: a cross-attention's keys [B, M, D] are another sequence than its queries.
    Value dq = L.alloc(op.getDQuery().getType(), L.dims(L.in(op.getQuery()))),
          dk = L.alloc(op.getDKey().getType(), L.dims(L.in(op.getKey()))),
          dv = L.alloc(op.getDValue().getType(), L.dims(L.in(op.getValue())));
    bool rel = bool(op.getRelKey());
    Value dRelK = rel ? L.alloc(L.typeOf(op.getDRelative()[0])) : Value();
    Value dRelV = rel ? L.alloc(L.typeOf(op.getDRelative()[1])) : Value();
    Value M = L.b.create<memref::DimOp>(L.loc, L.in(op.getKey()), 1);
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getQuery()))
        .ptr(L.in(op.getKey()))
        .ptr(L.in(op.getValue()))
        .ptr(L.in(op.getLengths()))
        .ptr(op.getQueryLengths() ? L.in(op.getQueryLengths()) : Value())
        .ptr(rows)
        .i64(rowWidth)
        .ptr(rel ? L.in(op.getRelKey()) : Value())
        .ptr(rel ? L.in(op.getRelValue()) : Value())
        .i64(int64_t(op.getClip()))
        .i64(L.B())
        .i64(L.N())
        .i64(M)
        .i64(lastDim(op.getQuery()))
        .i64(int64_t(op.getHeads()))
        .i32(mask)
        .f32(op.getScale().convertToFloat())
        .ptr(dq)
        .ptr(dk)
        .ptr(dv)
        .ptr(dRelK)
        .ptr(dRelV)
        .emit("lm_rt_attention_grad");
    if (rel)
      return L.setAll(op, {dq, dk, dv, dRelK, dRelV});
    return L.setAll(op, {dq, dk, dv});
  }
};

/// [B, H, N, M] scores / probabilities and [B, H, N, dh] head tensors: B*H pieces of N rows.
template <typename Op> struct RelativeGradLowering : LmLowering<Op> {
  using LmLowering<Op>::LmLowering;
  LogicalResult lower(Op op, Loops &L) const override {
    constexpr bool scores = std::is_same_v<Op, lm::RelativeScoresGradOp>;
    Value d0 = L.alloc(L.typeOf(op->getResult(0))), d1 = L.alloc(L.typeOf(op->getResult(1)));
    Value square = scores ? op->getOperand(0) : op->getOperand(1); // the [B, H, N, M] operand
    Value sq = L.in(square);
    Value H = L.b.create<memref::DimOp>(L.loc, sq, 1), N = L.b.create<memref::DimOp>(L.loc, sq, 2),
          M = L.b.create<memref::DimOp>(L.loc, sq, 3);
    Value BH = L.b.create<arith::MulIOp>(L.loc, L.b.create<memref::DimOp>(L.loc, sq, 0), H);
    auto rel = llvm::cast<ShapedType>(op->getOperand(2).getType());
    Call{L}
        .ptr(L.in(op->getOperand(0)))
        .ptr(L.in(op->getOperand(1)))
        .ptr(L.in(op->getOperand(2)))
        .i64(BH)
        .i64(N)
        .i64(M)
        .i64(rel.getDimSize(1))
        .i64(int64_t(op.getClip()))
        .ptr(d0)
        .ptr(d1)
        .emit(scores ? "lm_rt_relative_scores_grad" : "lm_rt_relative_values_grad");
    return L.setAll(op, {d0, d1});
  }
};

/// lm.dropout outside training is the identity (its input buffer); in training, and lm.dropout_grad, the
/// runtime applies the mask (lm_rt_dropout on [B, N, C], lm_rt_dropout_heads on [B, H, N, M] probabilities).
/// Both need the batch lengths: the entry's (argument 3 of the training kernels).
template <typename Op> struct DropoutLowering : LmLowering<Op> {
  using LmLowering<Op>::LmLowering;
  LogicalResult lower(Op op, Loops &L) const override {
    Value x = L.in(op->getOperand(0));
    if constexpr (std::is_same_v<Op, lm::DropoutOp>)
      if (!op.getTraining())
        return L.set(op, x);
    auto fn = op->template getParentOfType<func::FuncOp>();
    if (fn.getNumArguments() < 4)
      return op.emitOpError("a training dropout lowers inside a training entry (weights, inputs, targets, lengths, ...)");
    Value out = L.alloc(L.typeOf(op->getResult(0)));
    const bool probabilities = llvm::cast<ShapedType>(op->getOperand(0).getType()).getRank() == 4;
    Call call{L};
    call.ptr(x).ptr(fn.getArgument(3));
    Value rows = op.getRows() ? L.in(op.getRows()) : Value();
    if (rows) // packed rows [B, T, C] (lm-prune-loss-rows)
      call.ptr(rows);
    if (probabilities) {
      for (int64_t axis = 0; axis < 4; ++axis)
        call.i64(Value(L.b.create<memref::DimOp>(L.loc, x, axis)));
    } else {
      call.i64(L.B()).i64(L.N()).i64(lastDim(op->getOperand(0)));
    }
    call.f64(op.getRate().convertToDouble()).i64(int64_t(op.getSite())).ptr(out);
    call.emit(rows ? "lm_rt_dropout_rows" : probabilities ? "lm_rt_dropout_heads" : "lm_rt_dropout");
    return L.set(op, out);
  }
};

/// lm.embed_grad: lm_rt_embed_grad into a fresh buffer; with `into`, lm_rt_embed_grad_add into acc's buffer where
/// the op is its only use and it is a temporary of its own (else into a copy of it).
struct EmbedGradLowering : LmLowering<lm::EmbedGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::EmbedGradOp op, Loops &L) const override {
    auto t = op.getType();
    Value out;
    if (Value into = op.getInto()) {
      out = L.in(into);
      if (!into.hasOneUse() || !temporaryOf(out)) {
        Value acc = out;
        out = L.alloc(t);
        L.b.create<memref::CopyOp>(L.loc, acc, out);
      }
    } else {
      out = L.alloc(t);
    }
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getIds()))
        .ptr(L.in(op.getLengths()))
        .i64(L.B())
        .i64(L.N())
        .i64(t.getDimSize(1))
        .i64(t.getDimSize(0))
        .ptr(out)
        .emit(op.getInto() ? "lm_rt_embed_grad_add" : "lm_rt_embed_grad");
    return L.set(op, out);
  }
};

struct PositionsGradLowering : LmLowering<lm::PositionsGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::PositionsGradOp op, Loops &L) const override {
    Value out = L.alloc(op.getType());
    auto t = op.getType();
    Call{L}
        .ptr(L.in(op.getGrad()))
        .ptr(L.in(op.getLengths()))
        .i64(L.B())
        .i64(L.N())
        .i64(t.getDimSize(1))
        .i64(t.getDimSize(0))
        .ptr(out)
        .emit("lm_rt_positions_grad");
    return L.set(op, out);
  }
};

/// Marks the copies of weight gradients into their slots, for writeGradientsInPlace.
constexpr StringLiteral kParamGradCopy = "lmcc.param_grad";

/// Copies the gradient into the weight's slot of the gradient buffer (the entry's last argument): a memref.copy
/// (a memcpy) marked for writeGradientsInPlace, which makes the gradient's own buffer the slot where it can.
struct ParamGradLowering : LmLowering<lm::ParamGradOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::ParamGradOp op, Loops &L) const override {
    const WeightLayout::Entry *entry = context.layout->find(op.getName().str());
    if (!entry)
      return op.emitOpError("weight '") << op.getName() << "' has no slot in the weight layout";
    auto fn = op->getParentOfType<func::FuncOp>();
    Value slot = weightView(L.b, L.loc, fn.getArguments().back(), entry->offset, op.getGrad().getType().getShape());
    L.b.create<memref::CopyOp>(L.loc, L.in(op.getGrad()), slot)->setAttr(kParamGradCopy, L.b.getUnitAttr());
    L.b.eraseOp(op);
    return success();
  }
};

/// The address (i64) `offset` floats into the buffer `m` (its aligned pointer, which for an entry's argument is
/// where its data starts).
Value addressAt(OpBuilder &b, Location loc, Value m, int64_t offset) {
  Value base = b.create<memref::ExtractAlignedPointerAsIndexOp>(loc, m);
  Value address = b.create<arith::IndexCastOp>(loc, b.getI64Type(), base);
  return b.create<arith::AddIOp>(loc, address,
                                 b.create<arith::ConstantOp>(loc, b.getI64IntegerAttr(offset * int64_t(sizeof(float)))));
}

/// Whether the buffer `v` (or a view of it, followed through casts and views) is used after `copy`, in its block,
/// by anything but a load, or where the block cannot order it.
bool usedAfter(Value v, Operation *copy) {
  for (Operation *user : v.getUsers()) {
    if (auto view = dyn_cast<ViewLikeOpInterface>(user); view && view.getViewSource() == v) {
      if (usedAfter(user->getResult(0), copy))
        return true;
      continue;
    }
    Operation *at = copy->getBlock()->findAncestorOpInBlock(*user);
    if (!at)
      return true;
    if (copy->isBeforeInBlock(at) && !isa<memref::LoadOp, vector::LoadOp, vector::MaskedLoadOp, vector::TransferReadOp,
                                           memref::DimOp>(user))
      return true;
  }
  return false;
}

} // namespace

void writeGradientsInPlace(ModuleOp module, const WeightLayout &layout) {
  module.walk([&](func::FuncOp fn) {
    SmallVector<memref::CopyOp> copies;
    fn.walk([&](memref::CopyOp copy) {
      if (copy->hasAttr(kParamGradCopy))
        copies.push_back(copy);
    });
    if (copies.empty())
      return;
    Value grads;
    std::set<int64_t> written;
    for (memref::CopyOp copy : copies) {
      copy->removeAttr(kParamGradCopy);
      auto slot = copy.getTarget().getDefiningOp<memref::ReinterpretCastOp>();
      grads = slot.getSource();
      const int64_t offset = slot.getStaticOffsets()[0];
      written.insert(offset);
      // The gradient's buffer becomes the slot when it is a temporary of the copy's block that nothing but loads
      // touches after the copy (a later write would change the slot): its producer then writes the slot, and the
      // copy, the temporary and its peak go.
      memref::AllocOp alloc = temporaryOf(copy.getSource());
      if (!alloc || alloc->getBlock() != copy->getBlock() || !alloc.getType().getLayout().isIdentity() ||
          !alloc.getType().hasStaticShape())
        continue;
      if (usedAfter(alloc, copy))
        continue;
      OpBuilder b(alloc);
      MemRefType type = alloc.getType();
      SmallVector<Value> sizes, strides;
      int64_t stride = 1;
      for (int64_t d = type.getRank() - 1; d >= 0; --d) {
        sizes.insert(sizes.begin(), b.create<arith::ConstantOp>(alloc.getLoc(), b.getI64IntegerAttr(type.getDimSize(d))));
        strides.insert(strides.begin(), b.create<arith::ConstantOp>(alloc.getLoc(), b.getI64IntegerAttr(stride)));
        stride *= type.getDimSize(d);
      }
      Value view = memrefAt(b, alloc.getLoc(), addressAt(b, alloc.getLoc(), grads, offset), sizes, strides, type);
      copy.erase();
      alloc.replaceAllUsesWith(view);
      alloc.erase();
      if (slot->use_empty())
        slot.erase();
    }
    // Every tensor's slot is written: those the loss does not reach (no lm.param_grad) are zeroed first thing.
    OpBuilder b = OpBuilder::atBlockBegin(&fn.getBody().front());
    Location loc = fn.getLoc();
    for (const WeightLayout::Entry &e : layout.entries) {
      const int64_t bytes = numelOf(e.tensor) * int64_t(sizeof(float));
      if (e.kind != WeightLayout::Kind::Loaded || written.count(e.offset) || bytes == 0)
        continue;
      Value p = b.create<LLVM::IntToPtrOp>(loc, LLVM::LLVMPointerType::get(b.getContext()), addressAt(b, loc, grads, e.offset));
      b.create<LLVM::MemsetOp>(loc, p, b.create<LLVM::ConstantOp>(loc, b.getI8Type(), b.getI8IntegerAttr(0)),
                               b.create<LLVM::ConstantOp>(loc, b.getI64Type(), b.getI64IntegerAttr(bytes)), false);
    }
  });
}

void populateBackwardPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<TokenLossLowering, TokenLossGradLowering, TokenLossAndGradLowering, CrossEntropyLowering,
               CrossEntropyGradLowering,
               SoftmaxGradLowering<lm::SoftmaxGradOp, 0>, SoftmaxGradLowering<lm::LogSoftmaxGradOp, 1>,
               LinearGradLowering, LayerNormGradLowering, ActivationGradLowering, AttentionGradLowering,
               EmbedGradLowering, PositionsGradLowering, ParamGradLowering,
               RelativeGradLowering<lm::RelativeScoresGradOp>, RelativeGradLowering<lm::RelativeValuesGradOp>,
               DropoutLowering<lm::DropoutOp>, DropoutLowering<lm::DropoutGradOp>>(converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
