//===- KernelGen.cpp - lm IR -> buffer-level loop nests ---------------------===//
//
// Lowers each `lm` op of the score/embed entry points to memref buffers and scf
// loop nests whose bounds and trip counts are the model's constants (d_model,
// heads, head size, vocabulary) except for batch B and sequence N, the only
// dynamic dimensions. The meaning of each op is the function of the same name in
// runtime/reference/Ops.cpp; numerics follow it (double accumulation in
// LayerNorm, softmax, log-softmax, pooling and scores).
//
// Dynamic dimensions: in every lm tensor type, the first `?` is the batch B and
// every further `?` is the sequence length N (keys included: self-attention).
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/KernelGen.h"

#include "codegen/LmToLoops/Gemm.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Verifier.h"

#include <cmath>
#include <functional>

using namespace mlir;

namespace lmcc::codegen {
namespace {

class KernelGen {
public:
  KernelGen(MLIRContext *ctx, const ModelSpec &spec, const std::map<std::string, int64_t> &offsets, GemmTile tile)
      : b(ctx), loc(b.getUnknownLoc()), spec(spec), offsets(offsets), tile(tile) {}

  OwningOpRef<ModuleOp> run(ModuleOp lm) {
    OwningOpRef<ModuleOp> out = ModuleOp::create(loc);
    outModule = *out;
    packed = packedWeights(lm);
    b.setInsertionPointToEnd(out->getBody());
    declareRuntime();
    for (StringRef entry : {"score", "embed"}) {
      auto fn = lm.lookupSymbol<func::FuncOp>(entry);
      if (!fn) {
        lm.emitError() << "lm module has no @" << entry << " entry point";
        return nullptr;
      }
      if (failed(kernel(fn, entry == "score")))
        return nullptr;
    }
    if (failed(initKernel(lm)))
      return nullptr;
    if (failed(verify(*out)))
      return nullptr;
    return out;
  }

  /// `attention_kernel(q, k, v [B, N, D], lengths [B], out [B, N, D])`: the lowering of
  /// the lm.attention op in `fn` (arguments q, k, v, lengths) alone, for kernel benchmarks.
  OwningOpRef<ModuleOp> attentionOnly(func::FuncOp fn, lm::AttentionOp attention) {
    OwningOpRef<ModuleOp> out = ModuleOp::create(loc);
    outModule = *out;
    b.setInsertionPointToEnd(out->getBody());
    auto type = MemRefType::get(llvm::cast<ShapedType>(attention.getType()).getShape(), f32());
    auto m1i = MemRefType::get({ShapedType::kDynamic}, i32());
    auto kfn = b.create<func::FuncOp>(loc, "attention_kernel", b.getFunctionType({type, type, type, m1i, type}, {}));
    kfn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    Block *entry = kfn.addEntryBlock();
    b.setInsertionPointToStart(entry);
    for (unsigned i = 0; i < 4; ++i)
      buffers[fn.getArgument(i)] = entry->getArgument(i);
    lengths = entry->getArgument(3);
    B = b.create<memref::DimOp>(loc, entry->getArgument(0), 0);
    N = b.create<memref::DimOp>(loc, entry->getArgument(0), 1);
    scopes.emplace_back();
    if (failed(lowerAttention(attention)))
      return nullptr;
    b.create<memref::CopyOp>(loc, in(attention.getResult()), entry->getArgument(4));
    closeScope();
    b.create<func::ReturnOp>(loc);
    if (failed(verify(*out)))
      return nullptr;
    return out;
  }

private:
  // --- constants and types ---------------------------------------------------
  Value idx(int64_t v) { return b.create<arith::ConstantIndexOp>(loc, v); }
  Value f32c(double v) { return b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(float(v))); }
  Value f64c(double v) { return b.create<arith::ConstantOp>(loc, b.getF64FloatAttr(v)); }
  Value i32c(int64_t v) { return b.create<arith::ConstantOp>(loc, b.getI32IntegerAttr(int32_t(v))); }
  Value i64c(int64_t v) { return b.create<arith::ConstantOp>(loc, b.getI64IntegerAttr(v)); }
  Type f32() { return b.getF32Type(); }
  Type f64() { return b.getF64Type(); }
  Type i32() { return b.getI32Type(); }

  /// Runtime sizes of a tensor type: first `?` = B, later `?` = N.
  SmallVector<Value> sizes(ShapedType t) {
    SmallVector<Value> out;
    bool seenBatch = false;
    for (int64_t d : t.getShape()) {
      if (ShapedType::isDynamic(d)) {
        out.push_back(seenBatch ? N : B);
        seenBatch = true;
      } else {
        out.push_back(idx(d));
      }
    }
    return out;
  }

  /// A fresh buffer for a tensor value, freed at the end of the current scope.
  Value alloc(ShapedType t) {
    SmallVector<Value> dyn;
    SmallVector<Value> all = sizes(t);
    for (auto [i, d] : llvm::enumerate(t.getShape()))
      if (ShapedType::isDynamic(d))
        dyn.push_back(all[i]);
    auto type = MemRefType::get(t.getShape(), t.getElementType());
    Value m = b.create<memref::AllocOp>(loc, type, dyn, b.getI64IntegerAttr(64));
    scopes.back().push_back(m);
    return m;
  }

  // --- loops -----------------------------------------------------------------
  /// for i0 < ubs[0], i1 < ubs[1], ...: body(ivs). The builder ends after the nest.
  void nest(ArrayRef<Value> ubs, const std::function<void(ValueRange)> &body) {
    OpBuilder::InsertionGuard guard(b);
    SmallVector<Value> ivs;
    Value zero = idx(0), one = idx(1);
    for (Value ub : ubs) {
      auto loop = b.create<scf::ForOp>(loc, zero, ub, one);
      b.setInsertionPointToStart(loop.getBody());
      ivs.push_back(loop.getInductionVar());
    }
    body(ivs);
  }

  /// acc = init; for i in [lb, ub): acc = step(i, acc); returns acc.
  Value reduce(Value lb, Value ub, Value init, const std::function<Value(Value, Value)> &step) {
    auto loop = b.create<scf::ForOp>(loc, lb, ub, idx(1), ValueRange{init});
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value next = step(loop.getInductionVar(), loop.getRegionIterArgs()[0]);
      b.create<scf::YieldOp>(loc, next);
    }
    return loop.getResult(0);
  }

  /// if (cond) then(); — no results.
  void when(Value cond, const std::function<void()> &then) {
    auto op = b.create<scf::IfOp>(loc, cond, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    then();
  }

  /// cond ? then() : otherwise() as a value, only the taken branch executes.
  Value choose(Value cond, Type type, const std::function<Value()> &then, const std::function<Value()> &otherwise) {
    auto op = b.create<scf::IfOp>(loc, TypeRange{type}, cond, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(op.thenBlock());
      b.create<scf::YieldOp>(loc, then());
      b.setInsertionPointToStart(op.elseBlock());
      b.create<scf::YieldOp>(loc, otherwise());
    }
    return op.getResult(0);
  }

  Value load(Value m, ValueRange ivs) { return b.create<memref::LoadOp>(loc, m, ivs); }
  void store(Value v, Value m, ValueRange ivs) { b.create<memref::StoreOp>(loc, v, m, ivs); }
  Value lengthOf(Value b_) { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(lengths, b_)); }
  Value lt(Value x, Value y) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, x, y); }
  Value le(Value x, Value y) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sle, x, y); }
  Value ge(Value x, Value y) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, x, y); }
  Value ne(Value x, Value y) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, x, y); }
  Value eqI(Value x, Value y) { return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, x, y); }
  Value andI(Value x, Value y) { return b.create<arith::AndIOp>(loc, x, y); }
  Value orI(Value x, Value y) { return b.create<arith::OrIOp>(loc, x, y); }
  Value select(Value c, Value x, Value y) { return b.create<arith::SelectOp>(loc, c, x, y); }
  Value toF64(Value x) { return b.create<arith::ExtFOp>(loc, f64(), x); }
  Value toF32(Value x) { return b.create<arith::TruncFOp>(loc, f32(), x); }

  /// The buffer's aligned base address (+ its static view offset) as an i64.
  Value address(Value m) {
    Value base = b.create<memref::ExtractAlignedPointerAsIndexOp>(loc, m);
    Value addr = b.create<arith::IndexCastOp>(loc, b.getI64Type(), base);
    auto it = viewOffset.find(m);
    if (it != viewOffset.end() && it->second)
      addr = b.create<arith::AddIOp>(loc, addr, i64c(it->second * 4));
    return addr;
  }

  /// The buffer's aligned base address (+ `offsetFloats` floats) as an LLVM pointer.
  Value pointer(Value m) {
    Value base = b.create<memref::ExtractAlignedPointerAsIndexOp>(loc, m);
    Value addr = b.create<arith::IndexCastOp>(loc, b.getI64Type(), base);
    auto it = viewOffset.find(m);
    if (it != viewOffset.end() && it->second)
      addr = b.create<arith::AddIOp>(loc, addr, i64c(it->second * 4));
    return b.create<LLVM::IntToPtrOp>(loc, LLVM::LLVMPointerType::get(b.getContext()), addr);
  }

  void declareRuntime() {
    auto ptr = LLVM::LLVMPointerType::get(b.getContext());
    Type i64 = b.getI64Type();
    auto type = b.getFunctionType({i64, i64, i64, ptr, i64, ptr, i64, ptr, ptr, i64}, {});
    auto fn = b.create<func::FuncOp>(loc, "lm_rt_sgemm_nt", type);
    fn.setPrivate();
    auto parallel = b.create<func::FuncOp>(loc, "lm_rt_parallel_for", b.getFunctionType({i64, ptr, ptr}, {}));
    parallel.setPrivate();
  }

  // --- entry points ----------------------------------------------------------
  LogicalResult kernel(func::FuncOp fn, bool score) {
    auto dyn = ShapedType::kDynamic;
    auto m1f = MemRefType::get({dyn}, f32()), m2f = MemRefType::get({dyn, dyn}, f32());
    auto m1i = MemRefType::get({dyn}, i32()), m2i = MemRefType::get({dyn, dyn}, i32());
    SmallVector<Type> args = {m1f, m2i, m1i};
    if (score)
      args.append({m2f, m1f, m1i});
    else
      args.push_back(m2f);
    std::string name = spec.name + (score ? "_score_kernel" : "_embed_kernel");
    OpBuilder::InsertionGuard guard(b);
    auto kfn = b.create<func::FuncOp>(loc, name, b.getFunctionType(args, {}));
    kfn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    Block *entry = kfn.addEntryBlock();
    b.setInsertionPointToStart(entry);
    weights = entry->getArgument(0);
    Value ids = entry->getArgument(1);
    lengths = entry->getArgument(2);
    outputs.assign(entry->getArguments().begin() + 3, entry->getArguments().end());
    B = b.create<memref::DimOp>(loc, ids, 0);
    N = b.create<memref::DimOp>(loc, ids, 1);
    buffers.clear();
    viewOffset.clear();
    buffers[fn.getArgument(0)] = ids;
    buffers[fn.getArgument(1)] = lengths;
    scopes.emplace_back();
    for (Operation &op : fn.getBody().front().without_terminator())
      if (failed(lower(&op)))
        return failure();
    closeScope();
    b.create<func::ReturnOp>(loc);
    return success();
  }

  /// `<name>_init_kernel(weights)`: evaluates every `lm.fold` function on positions
  /// 0..max_len-1 (one sentence of pad ids: only positions matter) and stores the
  /// result into its table in the weight buffer. The runtime calls it once per load.
  LogicalResult initKernel(ModuleOp lm) {
    auto dyn = ShapedType::kDynamic;
    OpBuilder::InsertionGuard guard(b);
    auto kfn = b.create<func::FuncOp>(loc, spec.name + "_init_kernel",
                                      b.getFunctionType({MemRefType::get({dyn}, f32())}, {}));
    kfn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    Block *entry = kfn.addEntryBlock();
    b.setInsertionPointToStart(entry);
    weights = entry->getArgument(0);
    outputs.clear();
    buffers.clear();
    viewOffset.clear();
    B = idx(1);
    N = idx(spec.dims.maxLen);
    scopes.emplace_back();
    // Pack every GEMM weight into its panel layout (once per load), before the folds, whose
    // linear layers read the packed form.
    for (const PackedWeight &p : packed) {
      auto dst = offsets.find(p.key);
      auto src = offsets.find(p.names.front());
      if (dst == offsets.end() || src == offsets.end())
        continue;
      emitPack(b, loc, tableView(src->second, {p.n, p.k}), tableView(dst->second, {packedRows(p.n, p.k), kPanel}),
               p.n, p.k, tile);
    }
    for (auto fold : lm.getOps<func::FuncOp>()) {
      if (!fold->hasAttr("lm.fold"))
        continue;
      auto it = offsets.find(fold.getSymName().str());
      if (it == offsets.end())
        return fold.emitOpError("has no table in the weight layout");
      Value ids = b.create<memref::AllocOp>(loc, MemRefType::get({1, spec.dims.maxLen}, i32()), ValueRange{},
                                            b.getI64IntegerAttr(64));
      scopes.back().push_back(ids);
      nest({B, N}, [&](ValueRange iv) { store(i32c(spec.tokens.pad), ids, iv); });
      lengths = b.create<memref::AllocOp>(loc, MemRefType::get({1}, i32()), ValueRange{}, b.getI64IntegerAttr(64));
      scopes.back().push_back(lengths);
      store(i32c(spec.dims.maxLen), lengths, idx(0));
      Value idsDyn = b.create<memref::CastOp>(loc, MemRefType::get({dyn, dyn}, i32()), ids);
      buffers[fold.getArgument(0)] = idsDyn;
      for (Operation &op : fold.getBody().front().without_terminator())
        if (failed(lower(&op)))
          return failure();
      Value result = in(fold.getBody().front().getTerminator()->getOperand(0));
      int64_t width = llvm::cast<ShapedType>(fold.getResultTypes()[0]).getDimSize(2);
      Value table = tableView(it->second, {spec.dims.maxLen, width});
      nest({N, idx(width)}, [&](ValueRange iv) { store(load(result, {idx(0), iv[0], iv[1]}), table, iv); });
    }
    closeScope();
    b.create<func::ReturnOp>(loc);
    return success();
  }

  /// A [rows, cols] view of the weight buffer at a float offset.
  Value tableView(int64_t offset, ArrayRef<int64_t> shape) {
    SmallVector<int64_t> strides = {shape[1], 1};
    auto type = MemRefType::get(shape, f32(), StridedLayoutAttr::get(b.getContext(), offset, strides));
    Value view = b.create<memref::ReinterpretCastOp>(loc, type, weights, offset, shape, strides);
    viewOffset[view] = offset;
    return view;
  }

  void closeScope() {
    for (Value m : scopes.back())
      b.create<memref::DeallocOp>(loc, m);
    scopes.pop_back();
  }

  Value in(Value tensor) { return buffers.lookup(tensor); }
  ShapedType typeOf(Value v) { return llvm::cast<ShapedType>(v.getType()); }

  // --- ops -------------------------------------------------------------------
  LogicalResult lower(Operation *op) {
    if (auto w = dyn_cast<lm::WeightOp>(op))
      return lowerWeight(w);
    if (auto e = dyn_cast<lm::EmbedOp>(op)) {
      // out[b, t, :] = table[ids[b, t], :]
      Value table = in(e.getTable()), ids = in(e.getIds()), out = alloc(e.getType());
      auto s = sizes(e.getType());
      nest(s, [&](ValueRange iv) {
        Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(ids, {iv[0], iv[1]}));
        store(load(table, {id, iv[2]}), out, iv);
      });
      return set(e, out);
    }
    if (auto p = dyn_cast<lm::PositionsOp>(op))
      return lowerPositions(p);
    if (auto f = dyn_cast<lm::FillIdsOp>(op)) {
      Value out = alloc(f.getType());
      Value v = i32c(f.getValue());
      nest(sizes(f.getType()), [&](ValueRange iv) { store(v, out, iv); });
      return set(f, out);
    }
    if (auto a = dyn_cast<lm::AddOp>(op))
      return elementwise2(a, a.getLhs(), a.getRhs(), [&](Value x, Value y) { return b.create<arith::AddFOp>(loc, x, y); });
    if (auto s = dyn_cast<lm::ScaleOp>(op)) {
      Value k = f32c(s.getFactor().convertToFloat());
      return elementwise1(s, s.getInput(), [&](Value x) { return b.create<arith::MulFOp>(loc, x, k); });
    }
    if (auto g = dyn_cast<lm::GeluOp>(op))
      return elementwise1(g, g.getInput(), [&](Value x) { return gelu(x, g.getApproximate()); });
    if (auto r = dyn_cast<lm::ReluOp>(op))
      return elementwise1(r, r.getInput(), [&](Value x) {
        Value zero = f32c(0);
        return select(b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, x, zero), x, zero);
      });
    if (auto l = dyn_cast<lm::LinearOp>(op))
      return lowerLinear(l);
    if (auto n = dyn_cast<lm::LayerNormOp>(op))
      return lowerLayerNorm(n);
    if (auto s = dyn_cast<lm::SplitHeadsOp>(op)) {
      // out[b, h, t, e] = in[b, t, h*dh + e]
      Value x = in(s.getInput()), out = alloc(s.getType());
      int64_t dh = s.getType().getDimSize(3);
      nest(sizes(s.getType()), [&](ValueRange iv) {
        Value c = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, iv[1], idx(dh)), iv[3]);
        store(load(x, {iv[0], iv[2], c}), out, iv);
      });
      return set(s, out);
    }
    if (auto m = dyn_cast<lm::MergeHeadsOp>(op)) {
      // out[b, t, h*dh + e] = in[b, h, t, e]
      Value x = in(m.getInput()), out = alloc(m.getType());
      auto xt = typeOf(m.getInput());
      nest(sizes(xt), [&](ValueRange iv) {
        Value c = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, iv[1], idx(xt.getDimSize(3))), iv[3]);
        store(load(x, iv), out, {iv[0], iv[2], c});
      });
      return set(m, out);
    }
    if (auto m = dyn_cast<lm::MatmulOp>(op))
      return lowerMatmul(m);
    if (auto m = dyn_cast<lm::MaskFillOp>(op))
      return lowerMaskFill(m);
    if (auto s = dyn_cast<lm::SoftmaxOp>(op))
      return lowerSoftmax(s);
    if (auto r = dyn_cast<lm::RelativeScoresOp>(op))
      return lowerRelativeScores(r);
    if (auto r = dyn_cast<lm::RelativeValuesOp>(op))
      return lowerRelativeValues(r);
    if (auto l = dyn_cast<lm::LogSoftmaxOp>(op))
      return lowerLogSoftmax(l);
    if (auto g = dyn_cast<lm::GatherOp>(op))
      return lowerGather(g);
    if (auto s = dyn_cast<lm::SentenceScoreOp>(op))
      return lowerSentenceScore(s);
    if (auto m = dyn_cast<lm::MeanPoolOp>(op))
      return lowerMeanPool(m);
    if (auto m = dyn_cast<lm::MaskAndPredictOp>(op))
      return lowerMaskAndPredict(m);
    if (auto a = dyn_cast<lm::AttentionOp>(op))
      return lowerAttention(a);
    if (auto t = dyn_cast<lm::TokenLogprobOp>(op))
      return lowerTokenLogprob(t);
    if (auto m = dyn_cast<lm::MaskedBatchOp>(op))
      return lowerMaskedBatch(m);
    if (auto c = dyn_cast<lm::ConcatOp>(op))
      return lowerConcat(c);
    if (auto f = dyn_cast<lm::FoldedRowsOp>(op)) {
      // out[b, t] = table[t]: the table was computed at load time by the init kernel.
      auto it = offsets.find(f.getTable().str());
      if (it == offsets.end())
        return f.emitOpError("reads a table the weight layout does not have");
      int64_t width = f.getType().getDimSize(2);
      Value table = tableView(it->second, {spec.dims.maxLen, width});
      Value out = alloc(f.getType());
      nest(sizes(f.getType()), [&](ValueRange iv) { store(load(table, {iv[1], iv[2]}), out, iv); });
      return set(f, out);
    }
    if (auto sl = dyn_cast<lm::SliceFeaturesOp>(op)) {
      // out[..., f] = x[..., offset + f]
      Value x = in(sl.getInput()), out = alloc(sl.getType());
      int64_t offset = sl.getOffset();
      nest(sizes(sl.getType()), [&](ValueRange iv) {
        SmallVector<Value> from(iv.begin(), iv.end());
        from.back() = b.create<arith::AddIOp>(loc, from.back(), idx(offset));
        store(load(x, from), out, iv);
      });
      return set(sl, out);
    }
    if (auto sp = dyn_cast<lm::SpliceCopiesOp>(op)) {
      // out[c, t] = t == positions[c] ? masked[owner(c), t] : sentence[owner(c), t]
      Value sentence = in(sp.getSentence()), masked = in(sp.getMasked()), positions = in(sp.getPositions());
      Value out = alloc(sp.getType());
      nest(sizes(sp.getType()), [&](ValueRange iv) {
        Value owner = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(copyOwner, iv[0]));
        Value at = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(positions, iv[0]));
        SmallVector<Value> from(iv.begin(), iv.end());
        from[0] = owner;
        Value v = select(eqI(iv[1], at), load(masked, from), load(sentence, from));
        store(v, out, iv);
      });
      return set(sp, out);
    }
    if (auto t = dyn_cast<lm::TakeRowOp>(op)) {
      // out[c, 0, ...] = x[c, positions[c], ...]
      Value x = in(t.getInput()), positions = in(t.getPositions()), out = alloc(typeOf(t.getResult()));
      nest(sizes(typeOf(t.getResult())), [&](ValueRange iv) {
        SmallVector<Value> at(iv.begin(), iv.end());
        at[1] = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(positions, iv[0]));
        store(load(x, at), out, iv);
      });
      return set(t, out);
    }
    return op->emitOpError("has no CPU lowering yet");
  }

  LogicalResult set(Operation *op, Value buffer) {
    buffers[op->getResult(0)] = buffer;
    return success();
  }

  LogicalResult lowerWeight(lm::WeightOp w) {
    auto it = offsets.find(w.getName().str());
    if (it == offsets.end())
      return w.emitOpError("names a tensor the weight layout does not have: ") << w.getName();
    auto t = w.getType();
    SmallVector<int64_t> strides(t.getRank(), 1);
    for (int64_t i = t.getRank() - 2; i >= 0; --i)
      strides[i] = strides[i + 1] * t.getDimSize(i + 1);
    auto layout = StridedLayoutAttr::get(b.getContext(), it->second, strides);
    auto type = MemRefType::get(t.getShape(), f32(), layout);
    Value view = b.create<memref::ReinterpretCastOp>(loc, type, weights, it->second, t.getShape(), strides);
    viewOffset[view] = it->second;
    return set(w, view);
  }

  /// Stacked weights: a view when the operands lie back to back in the flat weight
  /// buffer (lmcc lays concatenated weights out that way), else a copy.
  LogicalResult lowerConcat(lm::ConcatOp c) {
    auto t = c.getType();
    bool contiguous = true;
    int64_t expected = -1;
    for (Value v : c.getInputs()) {
      auto it = viewOffset.find(in(v));
      if (it == viewOffset.end() || (expected >= 0 && it->second != expected)) {
        contiguous = false;
        break;
      }
      expected = it->second + llvm::cast<ShapedType>(v.getType()).getNumElements();
    }
    if (contiguous) {
      int64_t offset = viewOffset.lookup(in(c.getInputs()[0]));
      SmallVector<int64_t> strides(t.getRank(), 1);
      for (int64_t i = t.getRank() - 2; i >= 0; --i)
        strides[i] = strides[i + 1] * t.getDimSize(i + 1);
      auto type = MemRefType::get(t.getShape(), f32(), StridedLayoutAttr::get(b.getContext(), offset, strides));
      Value view = b.create<memref::ReinterpretCastOp>(loc, type, weights, offset, t.getShape(), strides);
      viewOffset[view] = offset;
      return set(c, view);
    }
    Value out = alloc(t);
    int64_t row = 0;
    for (Value v : c.getInputs()) {
      Value src = in(v);
      auto vt = llvm::cast<ShapedType>(v.getType());
      nest(sizes(vt), [&](ValueRange iv) {
        SmallVector<Value> to(iv.begin(), iv.end());
        to[0] = b.create<arith::AddIOp>(loc, iv[0], idx(row));
        store(load(src, iv), out, to);
      });
      row += vt.getDimSize(0);
    }
    return set(c, out);
  }

  LogicalResult lowerPositions(lm::PositionsOp p) {
    Value out = alloc(p.getType());
    int64_t D = p.getType().getDimSize(2);
    if (Value tableT = p.getTable()) {
      Value table = in(tableT);
      nest(sizes(p.getType()), [&](ValueRange iv) { store(load(table, {iv[1], iv[2]}), out, iv); });
    } else {
      // P[t, c] = sin/cos(t / 10000^((c - c % 2) / D)), in double, rounded to float.
      nest(sizes(p.getType()), [&](ValueRange iv) {
        Value two = idx(2);
        Value parity = b.create<arith::RemUIOp>(loc, iv[2], two);
        Value even = b.create<arith::SubIOp>(loc, iv[2], parity);
        auto asF64 = [&](Value i) {
          return b.create<arith::SIToFPOp>(loc, f64(), b.create<arith::IndexCastOp>(loc, b.getI64Type(), i));
        };
        Value expo = b.create<arith::DivFOp>(loc, asF64(even), f64c(double(D)));
        Value denom = b.create<math::PowFOp>(loc, f64c(10000.0), expo);
        Value angle = b.create<arith::DivFOp>(loc, asF64(iv[1]), denom);
        Value isEven = eqI(parity, idx(0));
        Value v = select(isEven, b.create<math::SinOp>(loc, angle), b.create<math::CosOp>(loc, angle));
        store(toF32(v), out, iv);
      });
    }
    return set(p, out);
  }

  LogicalResult elementwise1(Operation *op, Value x, const std::function<Value(Value)> &f) {
    Value src = in(x), out = alloc(typeOf(op->getResult(0)));
    nest(sizes(typeOf(x)), [&](ValueRange iv) { store(f(load(src, iv)), out, iv); });
    return set(op, out);
  }

  LogicalResult elementwise2(Operation *op, Value x, Value y, const std::function<Value(Value, Value)> &f) {
    Value a = in(x), c = in(y), out = alloc(typeOf(op->getResult(0)));
    nest(sizes(typeOf(x)), [&](ValueRange iv) { store(f(load(a, iv), load(c, iv)), out, iv); });
    return set(op, out);
  }

  /// gelu(x) = x * 0.5 * (1 + erf(x / sqrt 2)); tanh form 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))).
  Value gelu(Value x, bool approximate) {
    if (!approximate) {
      Value e = b.create<math::ErfOp>(loc, b.create<arith::DivFOp>(loc, x, f32c(std::sqrt(2.0f))));
      Value half = b.create<arith::MulFOp>(loc, x, f32c(0.5));
      return b.create<arith::MulFOp>(loc, half, b.create<arith::AddFOp>(loc, f32c(1), e));
    }
    Value x3 = b.create<arith::MulFOp>(loc, b.create<arith::MulFOp>(loc, x, x), x);
    Value inner = b.create<arith::AddFOp>(loc, x, b.create<arith::MulFOp>(loc, f32c(0.044715f), x3));
    Value t = b.create<math::TanhOp>(loc, b.create<arith::MulFOp>(loc, f32c(std::sqrt(2.0f / float(M_PI))), inner));
    Value half = b.create<arith::MulFOp>(loc, f32c(0.5), x);
    return b.create<arith::MulFOp>(loc, half, b.create<arith::AddFOp>(loc, f32c(1), t));
  }

  /// Whether `weight` has a load-time packed form (not with --gemm=eigen).
  bool isPacked(Value weight) {
    std::string key = packKey(weight);
    return !key.empty() && offsets.count(key);
  }

  /// The generated GEMM of the packed `weight` [n, k] on panels [first, first + panels), split over
  /// the runtime's threads (lm_rt_parallel_for): out[rows, cols] gets columns first*64... of the
  /// product. The task rebuilds its operands from the 8 addresses and sizes of a ctx array.
  void parallelGemm(Value weight, int64_t n, int64_t k, Value inputAddress, Value rows, Value bias, Value outAddress,
                    Value cols, Value first, Value panels) {
    func::FuncOp task = getOrCreateGemmTask(outModule, n, k, bool(bias), tile);
    Value biasAddress = bias ? address(in(bias)) : i64c(0);
    Value ctx = b.create<memref::AllocaOp>(loc, MemRefType::get({8}, b.getI64Type()));
    auto i64 = [&](Value index) { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
    Value fields[8] = {inputAddress, i64(rows),
                       address(tableView(offsets.find(packKey(weight))->second, {packedRows(n, k), kPanel})),
                       i64c(packedRows(n, k)), biasAddress, outAddress, cols, i64(first)};
    for (int i = 0; i < 8; ++i)
      store(fields[i], ctx, idx(i));
    auto ptrType = LLVM::LLVMPointerType::get(b.getContext());
    Value ctxPtr = b.create<LLVM::IntToPtrOp>(loc, ptrType, address(ctx));
    Value fn = b.create<func::ConstantOp>(loc, task.getFunctionType(), SymbolRefAttr::get(task));
    Value fnPtr = b.create<UnrealizedConversionCastOp>(loc, TypeRange{ptrType}, fn).getResult(0);
    b.create<func::CallOp>(loc, "lm_rt_parallel_for", TypeRange{}, ValueRange{i64(panels), fnPtr, ctxPtr});
  }

  /// y[rows, out] = x[rows, in] W[out, in]^T + bias: the generated GEMM over the
  /// load-time packed weight, or the runtime's Eigen GEMM (--gemm=eigen).
  LogicalResult lowerLinear(lm::LinearOp l) {
    {
      auto wt = typeOf(l.getWeight());
      int64_t n = wt.getDimSize(0), k = wt.getDimSize(1);
      if (isPacked(l.getWeight())) {
        Value out = alloc(l.getType());
        auto sz = sizes(typeOf(l.getInput()));
        Value rows = idx(1);
        for (size_t i = 0; i + 1 < sz.size(); ++i)
          rows = b.create<arith::MulIOp>(loc, rows, sz[i]);
        parallelGemm(l.getWeight(), n, k, address(in(l.getInput())), rows, l.getBias(), address(out), i64c(n),
                     idx(0), idx((n + kPanel - 1) / kPanel));
        return set(l, out);
      }
    }
    auto xt = typeOf(l.getInput());
    auto wt = typeOf(l.getWeight());
    Value out = alloc(l.getType());
    auto s = sizes(xt);
    Value rows = idx(1);
    for (size_t i = 0; i + 1 < s.size(); ++i)
      rows = b.create<arith::MulIOp>(loc, rows, s[i]);
    Value m = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
    int64_t outF = wt.getDimSize(0), inF = wt.getDimSize(1);
    Value bias = l.getBias() ? pointer(in(l.getBias()))
                             : Value(b.create<LLVM::ZeroOp>(loc, LLVM::LLVMPointerType::get(b.getContext())));
    b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                           ValueRange{m, i64c(outF), i64c(inF), pointer(in(l.getInput())), i64c(inF),
                                      pointer(in(l.getWeight())), i64c(inF), bias, pointer(out), i64c(outF)});
    return set(l, out);
  }

  LogicalResult lowerLayerNorm(lm::LayerNormOp n) {
    Value x = in(n.getInput()), g = in(n.getGamma()), beta = in(n.getBeta()), out = alloc(n.getType());
    auto s = sizes(n.getType());
    int64_t C = n.getType().getShape().back();
    double eps = n.getEpsilon().convertToDouble();
    SmallVector<Value> rows(s.begin(), s.end() - 1);
    nest(rows, [&](ValueRange iv) {
      auto at = [&](Value c) {
        SmallVector<Value> i(iv.begin(), iv.end());
        i.push_back(c);
        return i;
      };
      Value sum = reduce(idx(0), idx(C), f64c(0), [&](Value c, Value acc) {
        return b.create<arith::AddFOp>(loc, acc, toF64(load(x, at(c))));
      });
      Value mean = b.create<arith::DivFOp>(loc, sum, f64c(double(C)));
      Value sq = reduce(idx(0), idx(C), f64c(0), [&](Value c, Value acc) {
        Value d = b.create<arith::SubFOp>(loc, toF64(load(x, at(c))), mean);
        return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, d, d));
      });
      Value var = b.create<arith::DivFOp>(loc, sq, f64c(double(C)));
      Value inv = b.create<arith::DivFOp>(loc, f64c(1), b.create<math::SqrtOp>(loc, b.create<arith::AddFOp>(loc, var, f64c(eps))));
      nest({idx(C)}, [&](ValueRange c) {
        Value norm = toF32(b.create<arith::MulFOp>(loc, b.create<arith::SubFOp>(loc, toF64(load(x, at(c[0]))), mean), inv));
        Value y = b.create<arith::AddFOp>(loc, b.create<arith::MulFOp>(loc, norm, load(g, c[0])), load(beta, c[0]));
        store(y, out, at(c[0]));
      });
    });
    return set(n, out);
  }

  LogicalResult lowerMatmul(lm::MatmulOp m) {
    auto at = typeOf(m.getLhs());
    if (at.getRank() != 4)
      return m.emitOpError("CPU lowering handles [B, H, M, K] operands only");
    Value lhs = in(m.getLhs()), rhs = in(m.getRhs()), out = alloc(m.getType());
    bool t = m.getTransposeRhs();
    Value K = sizes(at)[3];
    nest(sizes(m.getType()), [&](ValueRange iv) {
      Value acc = reduce(idx(0), K, f32c(0), [&](Value k, Value acc) {
        Value a = load(lhs, {iv[0], iv[1], iv[2], k});
        Value c = t ? load(rhs, {iv[0], iv[1], iv[3], k}) : load(rhs, {iv[0], iv[1], k, iv[3]});
        return b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, a, c));
      });
      store(acc, out, iv);
    });
    return set(m, out);
  }

  /// Key j visible to query i: j < length and the mask kind's predicate.
  Value visible(lm::MaskKind kind, Value i, Value j, Value length) {
    Value v = lt(j, length);
    switch (kind) {
    case lm::MaskKind::none: return v;
    case lm::MaskKind::causal: return andI(v, le(j, i));
    case lm::MaskKind::anticausal: return andI(v, ge(j, i));
    case lm::MaskKind::diagonal: return andI(v, ne(j, i));
    default: return Value();
    }
  }

  LogicalResult lowerMaskFill(lm::MaskFillOp m) {
    if (m.getMaskData())
      return m.emitOpError("masks with per-row data (directional, explicit) have no CPU lowering yet");
    Value s = in(m.getScores()), out = alloc(m.getType());
    Value negInf = f32c(-INFINITY);
    nest(sizes(m.getType()), [&](ValueRange iv) {
      Value vis = visible(m.getMask(), iv[2], iv[3], lengthOf(iv[0]));
      store(select(vis, load(s, iv), negInf), out, iv);
    });
    return set(m, out);
  }

  /// Row-wise max of the last axis.
  Value rowMax(Value x, SmallVector<Value> row, Value C) {
    return reduce(idx(0), C, f32c(-INFINITY), [&](Value c, Value acc) {
      row.push_back(c);
      Value v = load(x, row);
      row.pop_back();
      return b.create<arith::MaximumFOp>(loc, acc, v);
    });
  }

  LogicalResult lowerSoftmax(lm::SoftmaxOp s) {
    // p_j = exp(x_j - max) / sum_k exp(x_k - max) in double; a row of -inf gives zeros.
    Value x = in(s.getInput()), out = alloc(s.getType());
    auto sz = sizes(s.getType());
    Value C = sz.back();
    SmallVector<Value> rows(sz.begin(), sz.end() - 1);
    nest(rows, [&](ValueRange iv) {
      SmallVector<Value> row(iv.begin(), iv.end());
      Value max = rowMax(x, row, C);
      Value maxD = toF64(max);
      Value allMasked = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, max, f32c(-INFINITY));
      Value sum = reduce(idx(0), C, f64c(0), [&](Value c, Value acc) {
        row.push_back(c);
        Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, toF64(load(x, row)), maxD));
        row.pop_back();
        return b.create<arith::AddFOp>(loc, acc, e);
      });
      nest({C}, [&](ValueRange c) {
        row.push_back(c[0]);
        Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, toF64(load(x, row)), maxD));
        Value p = toF32(b.create<arith::DivFOp>(loc, e, sum));
        store(select(allMasked, f32c(0), p), out, row);
        row.pop_back();
      });
    });
    return set(s, out);
  }

  LogicalResult lowerLogSoftmax(lm::LogSoftmaxOp l) {
    // y_j = x_j - (max + log sum_k exp(x_k - max)), in double.
    Value x = in(l.getInput()), out = alloc(l.getType());
    auto sz = sizes(l.getType());
    Value C = sz.back();
    SmallVector<Value> rows(sz.begin(), sz.end() - 1);
    nest(rows, [&](ValueRange iv) {
      SmallVector<Value> row(iv.begin(), iv.end());
      Value maxD = toF64(rowMax(x, row, C));
      Value sum = reduce(idx(0), C, f64c(0), [&](Value c, Value acc) {
        row.push_back(c);
        Value e = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, toF64(load(x, row)), maxD));
        row.pop_back();
        return b.create<arith::AddFOp>(loc, acc, e);
      });
      Value lse = b.create<arith::AddFOp>(loc, maxD, b.create<math::LogOp>(loc, sum));
      nest({C}, [&](ValueRange c) {
        row.push_back(c[0]);
        store(toF32(b.create<arith::SubFOp>(loc, toF64(load(x, row)), lse)), out, row);
        row.pop_back();
      });
    });
    return set(l, out);
  }

  Value relativeIndex(Value i, Value j, int64_t k) {
    Value d = b.create<arith::SubIOp>(loc, j, i);
    d = b.create<arith::MaxSIOp>(loc, d, idx(-k));
    d = b.create<arith::MinSIOp>(loc, d, idx(k));
    return b.create<arith::AddIOp>(loc, d, idx(k));
  }

  LogicalResult lowerRelativeScores(lm::RelativeScoresOp r) {
    // out[b,h,i,j] = q[b,h,i] . rel[clip(j - i) + k]
    Value q = in(r.getQuery()), rel = in(r.getRel()), out = alloc(r.getType());
    int64_t dh = typeOf(r.getQuery()).getDimSize(3), k = r.getClip();
    nest(sizes(r.getType()), [&](ValueRange iv) {
      Value ri = relativeIndex(iv[2], iv[3], k);
      Value acc = reduce(idx(0), idx(dh), f32c(0), [&](Value e, Value acc) {
        return b.create<arith::AddFOp>(
            loc, acc, b.create<arith::MulFOp>(loc, load(q, {iv[0], iv[1], iv[2], e}), load(rel, {ri, e})));
      });
      store(acc, out, iv);
    });
    return set(r, out);
  }

  LogicalResult lowerRelativeValues(lm::RelativeValuesOp r) {
    // out[b,h,i,e] = sum_j p[b,h,i,j] rel[clip(j - i) + k, e]
    Value p = in(r.getProbs()), rel = in(r.getRel()), out = alloc(r.getType());
    int64_t k = r.getClip();
    Value M = sizes(typeOf(r.getProbs()))[3];
    nest(sizes(r.getType()), [&](ValueRange iv) {
      Value acc = reduce(idx(0), M, f32c(0), [&](Value j, Value acc) {
        Value ri = relativeIndex(iv[2], j, k);
        return b.create<arith::AddFOp>(
            loc, acc, b.create<arith::MulFOp>(loc, load(p, {iv[0], iv[1], iv[2], j}), load(rel, {ri, iv[3]})));
      });
      store(acc, out, iv);
    });
    return set(r, out);
  }

  LogicalResult lowerGather(lm::GatherOp g) {
    // out[b, t] = lp[b, t - shift, ids[b, t]] for shift <= t < length, else 0
    Value lp = in(g.getLogprobs()), ids = in(g.getTargets()), out = alloc(g.getType());
    int64_t shift = g.getShift();
    nest(sizes(g.getType()), [&](ValueRange iv) {
      Value valid = andI(ge(iv[1], idx(shift)), lt(iv[1], lengthOf(iv[0])));
      Value v = choose(
          valid, f32(),
          [&] {
            Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(ids, {iv[0], iv[1]}));
            return load(lp, {iv[0], b.create<arith::SubIOp>(loc, iv[1], idx(shift)), id});
          },
          [&] { return f32c(0); });
      store(v, out, iv);
    });
    return set(g, out);
  }

  Value isOneOf(Value id, ArrayRef<int32_t> tokens) {
    Value hit = b.create<arith::ConstantOp>(loc, b.getBoolAttr(false));
    for (int32_t t : tokens)
      hit = orI(hit, eqI(id, i32c(t)));
    return hit;
  }

  LogicalResult lowerSentenceScore(lm::SentenceScoreOp s) {
    if (outputs.size() != 3)
      return s.emitOpError("appears outside the score entry point");
    Value lp = in(s.getLogprobs()), ids = in(s.getIds());
    Value tokenLp = outputs[0], scores = outputs[1], nScored = outputs[2];
    int64_t first = s.getFirst();
    SmallVector<int32_t> skip(s.getSkip());
    nest({B}, [&](ValueRange bi) {
      Value len = lengthOf(bi[0]);
      auto loop = b.create<scf::ForOp>(loc, idx(0), N, idx(1), ValueRange{f64c(0), i32c(0)});
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(loop.getBody());
        Value t = loop.getInductionVar();
        Value id = load(ids, {bi[0], t});
        Value keep = andI(andI(ge(t, idx(first)), lt(t, len)),
                          b.create<arith::XOrIOp>(loc, isOneOf(id, skip),
                                                  b.create<arith::ConstantOp>(loc, b.getBoolAttr(true))));
        Value v = select(keep, load(lp, {bi[0], t}), f32c(0));
        store(v, tokenLp, {bi[0], t});
        Value acc = b.create<arith::AddFOp>(loc, loop.getRegionIterArgs()[0], toF64(v));
        Value cnt = b.create<arith::AddIOp>(loc, loop.getRegionIterArgs()[1],
                                            b.create<arith::ExtUIOp>(loc, i32(), keep));
        b.create<scf::YieldOp>(loc, ValueRange{acc, cnt});
      }
      store(toF32(loop.getResult(0)), scores, bi[0]);
      store(loop.getResult(1), nScored, bi[0]);
    });
    return success();
  }

  LogicalResult lowerMeanPool(lm::MeanPoolOp m) {
    if (outputs.size() != 1)
      return m.emitOpError("appears outside the embed entry point");
    Value h = in(m.getHidden()), ids = in(m.getIds()), out = outputs[0];
    SmallVector<int32_t> exclude(m.getExclude());
    int64_t D = m.getType().getDimSize(1);
    nest({B}, [&](ValueRange bi) {
      Value len = lengthOf(bi[0]);
      auto excluded = [&](Value t) { return isOneOf(load(ids, {bi[0], t}), exclude); };
      Value kept = reduce(idx(0), len, i32c(0), [&](Value t, Value acc) {
        Value keep = b.create<arith::XOrIOp>(loc, excluded(t), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true)));
        return b.create<arith::AddIOp>(loc, acc, b.create<arith::ExtUIOp>(loc, i32(), keep));
      });
      Value anyKept = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sgt, kept, i32c(0));
      Value lenI32 = load(lengths, bi[0]);
      Value count = select(anyKept, kept, lenI32);
      Value countF = b.create<arith::SIToFPOp>(loc, f64(), count);
      nest({idx(D)}, [&](ValueRange c) {
        Value sum = reduce(idx(0), len, f64c(0), [&](Value t, Value acc) {
          Value use = orI(b.create<arith::XOrIOp>(loc, anyKept, b.create<arith::ConstantOp>(loc, b.getBoolAttr(true))),
                          b.create<arith::XOrIOp>(loc, excluded(t), b.create<arith::ConstantOp>(loc, b.getBoolAttr(true))));
          Value v = select(use, toF64(load(h, {bi[0], t, c[0]})), f64c(0));
          return b.create<arith::AddFOp>(loc, acc, v);
        });
        store(toF32(b.create<arith::DivFOp>(loc, sum, countF)), out, {bi[0], c[0]});
      });
    });
    return success();
  }

  static constexpr int64_t kLanes = 16; ///< f32 lanes of a 512-bit vector

  /// lm.attention with vectors (no relative positions; head size a multiple of 16).
  /// Per (entry, head) the head's keys are transposed into kt [dh, M16] (M keys rounded up
  /// to 16, zero tail). Per query row i with visible keys [lo, hi) (the mask's range, as
  /// in the scalar form below):
  ///   s[j..j+16) = (sum_e q_ie * kt[e, j..j+16)) * scale: dh broadcast FMAs per 16 keys,
  ///                lanes outside [lo, hi) (and key i under the diagonal mask) set to -inf;
  ///   m = max_j s_j, p_j = e^(s_j - m) (vector exp), l = sum_j p_j;
  ///   out_i = (sum_j p_j v_j) / l, dh/16 vector FMAs per key; zero when no key is visible.
  LogicalResult lowerAttentionVector(lm::AttentionOp a) {
    Value q = in(a.getQuery()), k = in(a.getKey()), v = in(a.getValue()), out = alloc(a.getType());
    int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, chunks = dh / kLanes;
    lm::MaskKind mask = a.getMask();
    auto vt = VectorType::get({kLanes}, f32());
    Value scale = b.create<vector::BroadcastOp>(loc, vt, f32c(a.getScale().convertToFloat()));
    Value negInf = f32c(-INFINITY), negInfV = b.create<vector::BroadcastOp>(loc, vt, negInf);
    Value zeroV = b.create<vector::BroadcastOp>(loc, vt, f32c(0));
    Value M = b.create<memref::DimOp>(loc, k, 1);
    Value M16 = b.create<arith::MulIOp>(
        loc, b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, M, idx(kLanes - 1)), idx(kLanes)), idx(kLanes));
    auto scratch = [&](ArrayRef<int64_t> shape, ValueRange dyn) {
      Value m = b.create<memref::AllocOp>(loc, MemRefType::get(shape, f32()), dyn, b.getI64IntegerAttr(64));
      scopes.back().push_back(m);
      return m;
    };
    Value kt = scratch({dh, ShapedType::kDynamic}, M16), scores = scratch({ShapedType::kDynamic}, M16);
    SmallVector<int64_t> lanes(kLanes);
    for (int64_t l = 0; l < kLanes; ++l)
      lanes[l] = l;
    auto it = VectorType::get({kLanes}, b.getIndexType());
    Value iota = b.create<arith::ConstantOp>(loc, it, DenseElementsAttr::get(it, ArrayRef<int64_t>(lanes)));
    Value queryPositions = a.getQueryPositions() ? in(a.getQueryPositions()) : Value();
    Value rows = queryPositions ? idx(1) : Value(b.create<memref::DimOp>(loc, q, 1));
    nest({B, idx(H)}, [&](ValueRange iv) {
      Value bi = iv[0], base = b.create<arith::MulIOp>(loc, iv[1], idx(dh));
      auto feature = [&](Value e) { return b.create<arith::AddIOp>(loc, base, e); };
      nest({M, idx(dh)}, [&](ValueRange je) {
        Value j = je[0], e = je[1];
        store(load(k, {bi, j, feature(e)}), kt, {e, j});
      });
      auto tail = b.create<scf::ForOp>(loc, M, M16, idx(1)); // zero keys up to the next 16
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(tail.getBody());
        nest({idx(dh)}, [&](ValueRange e) { store(f32c(0), kt, {e[0], tail.getInductionVar()}); });
      }
      Value len = lengthOf(bi);
      nest({rows}, [&](ValueRange r) {
        Value row = r[0];
        Value i = queryPositions ? Value(b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(queryPositions, bi)))
                                 : row;
        Value lo = idx(0), hi = len;
        if (mask == lm::MaskKind::causal)
          hi = b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, i, idx(1)));
        if (mask == lm::MaskKind::anticausal)
          lo = i;
        Value lo16 = b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, lo, idx(kLanes)), idx(kLanes));
        Value loV = b.create<vector::BroadcastOp>(loc, iota.getType(), lo);
        Value hiV = b.create<vector::BroadcastOp>(loc, iota.getType(), hi);
        Value iV = b.create<vector::BroadcastOp>(loc, iota.getType(), i);
        // Scores of 16 keys at a time, and their running max.
        auto blocks = b.create<scf::ForOp>(loc, lo16, hi, idx(kLanes), ValueRange{negInfV});
        {
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPointToStart(blocks.getBody());
          Value jb = blocks.getInductionVar();
          // Four independent FMA chains (features e, e+1, e+2, e+3) hide the FMA latency.
          auto dot = b.create<scf::ForOp>(loc, idx(0), idx(dh), idx(4), ValueRange{zeroV, zeroV, zeroV, zeroV});
          {
            OpBuilder::InsertionGuard g2(b);
            b.setInsertionPointToStart(dot.getBody());
            SmallVector<Value> next;
            for (int64_t u = 0; u < 4; ++u) {
              Value e = b.create<arith::AddIOp>(loc, dot.getInductionVar(), idx(u));
              Value qe = b.create<vector::BroadcastOp>(loc, vt, load(q, {bi, row, feature(e)}));
              Value kv = b.create<vector::LoadOp>(loc, vt, kt, ValueRange{e, jb});
              next.push_back(b.create<vector::FMAOp>(loc, qe, kv, dot.getRegionIterArgs()[u]));
            }
            b.create<scf::YieldOp>(loc, next);
          }
          Value sum = b.create<arith::AddFOp>(loc, b.create<arith::AddFOp>(loc, dot.getResult(0), dot.getResult(1)),
                                              b.create<arith::AddFOp>(loc, dot.getResult(2), dot.getResult(3)));
          Value s = b.create<arith::MulFOp>(loc, sum, scale);
          Value j = b.create<arith::AddIOp>(loc, b.create<vector::BroadcastOp>(loc, iota.getType(), jb), iota);
          Value visible = b.create<arith::AndIOp>(
              loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, j, loV),
              b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, j, hiV));
          if (mask == lm::MaskKind::diagonal)
            visible = b.create<arith::AndIOp>(loc, visible, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, j, iV));
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
          auto sums = b.create<scf::ForOp>(loc, lo16, hi, idx(kLanes), ValueRange{zeroV});
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
          auto acc = b.create<scf::ForOp>(loc, lo, hi, idx(1), zeros);
          {
            OpBuilder::InsertionGuard g2(b);
            b.setInsertionPointToStart(acc.getBody());
            Value j = acc.getInductionVar();
            Value p = b.create<vector::BroadcastOp>(loc, vt, load(scores, j));
            SmallVector<Value> next;
            for (int64_t c = 0; c < chunks; ++c) {
              Value vj = b.create<vector::LoadOp>(loc, vt, v, ValueRange{bi, j, feature(idx(c * kLanes))});
              next.push_back(b.create<vector::FMAOp>(loc, p, vj, acc.getRegionIterArgs()[c]));
            }
            b.create<scf::YieldOp>(loc, next);
          }
          Value inv = b.create<vector::BroadcastOp>(loc, vt, b.create<arith::DivFOp>(loc, f32c(1), l));
          for (int64_t c = 0; c < chunks; ++c)
            b.create<vector::StoreOp>(loc, b.create<arith::MulFOp>(loc, acc.getResult(c), inv), out,
                                      ValueRange{bi, row, feature(idx(c * kLanes))});
          b.setInsertionPointToStart(body.elseBlock());
          for (int64_t c = 0; c < chunks; ++c)
            b.create<vector::StoreOp>(loc, zeroV, out, ValueRange{bi, row, feature(idx(c * kLanes))});
        }
      });
    });
    return set(a, out);
  }

  /// Fused attention: for every (sentence, head, query row) an online softmax over
  /// key tiles of kKeyTile keys (flash-style). The mask is structure, not data:
  ///   causal keys [0, min(len, i+1)), anticausal [i, len), none/diagonal [0, len),
  /// so tiles the mask hides are never visited and visited tiles need no mask test;
  /// the diagonal mask only knocks out key i in the one tile that holds it. Per tile:
  ///   s_j = (q_i . k_j [+ q_i . relK[r_ij]]) * scale, m' = max(m, max_j s_j),
  ///   l = l e^(m - m') + sum_j e^(s_j - m'), acc = acc e^(m - m') + sum_j e^(s_j - m') (v_j [+ relV[r_ij]]),
  /// and out_i = acc / l (zero when no key is visible). Scores exist for one tile only.
  LogicalResult lowerAttention(lm::AttentionOp a) {
    if (a.getMaskData())
      return a.emitOpError("masks with per-row data (directional, explicit) have no CPU lowering yet");
    int64_t heads = a.getHeads(), width = a.getType().getDimSize(2);
    if (!a.getRelKey() && (width / heads) % kLanes == 0)
      return lowerAttentionVector(a);
    constexpr int64_t kKeyTile = 32;
    Value q = in(a.getQuery()), k = in(a.getKey()), v = in(a.getValue()), out = alloc(a.getType());
    Value relK = a.getRelKey() ? in(a.getRelKey()) : Value(), relV = a.getRelValue() ? in(a.getRelValue()) : Value();
    int64_t D = a.getType().getDimSize(2), H = a.getHeads(), dh = D / H, clip = a.getClip();
    lm::MaskKind mask = a.getMask();
    Value scale = f32c(a.getScale().convertToFloat());
    Value scores = alloc(MemRefType::get({kKeyTile}, f32()));
    Value acc = alloc(MemRefType::get({dh}, f32()));
    Value negInf = f32c(-INFINITY);
    // Single-query rows (lm-prune-rows): row 0 of entry c sits at position query_positions[c].
    Value queryPositions = a.getQueryPositions() ? in(a.getQueryPositions()) : Value();
    nest({B, idx(H), queryPositions ? idx(1) : N}, [&](ValueRange iv) {
      Value bi = iv[0], h = iv[1], row = iv[2];
      Value i = queryPositions ? Value(b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(queryPositions, bi))) : row;
      Value len = lengthOf(bi);
      Value base = b.create<arith::MulIOp>(loc, h, idx(dh));
      auto feature = [&](Value e) { return b.create<arith::AddIOp>(loc, base, e); };
      Value lo = idx(0), hi = len;
      if (mask == lm::MaskKind::causal)
        hi = b.create<arith::MinSIOp>(loc, len, b.create<arith::AddIOp>(loc, i, idx(1)));
      if (mask == lm::MaskKind::anticausal)
        lo = i;
      nest({idx(dh)}, [&](ValueRange e) { store(f32c(0), acc, e); });
      auto tiles = b.create<scf::ForOp>(loc, lo, hi, idx(kKeyTile), ValueRange{negInf, f32c(0)});
      {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(tiles.getBody());
        Value kt = tiles.getInductionVar(), m = tiles.getRegionIterArgs()[0], l = tiles.getRegionIterArgs()[1];
        Value tileLen = b.create<arith::MinSIOp>(loc, idx(kKeyTile), b.create<arith::SubIOp>(loc, hi, kt));
        // Scores of this tile, and their max.
        Value tileMax = reduce(idx(0), tileLen, negInf, [&](Value jj, Value mx) {
          Value j = b.create<arith::AddIOp>(loc, kt, jj);
          Value dot = reduce(idx(0), idx(dh), f32c(0), [&](Value e, Value sum) {
            Value qe = load(q, {bi, row, feature(e)});
            Value x = b.create<arith::MulFOp>(loc, qe, load(k, {bi, j, feature(e)}));
            if (relK)
              x = b.create<arith::AddFOp>(loc, x, b.create<arith::MulFOp>(loc, qe, load(relK, {relativeIndex(i, j, clip), e})));
            return b.create<arith::AddFOp>(loc, sum, x);
          });
          Value sj = b.create<arith::MulFOp>(loc, dot, scale);
          if (mask == lm::MaskKind::diagonal)
            sj = select(eqI(j, i), negInf, sj); // only the tile holding key i has a hit
          store(sj, scores, jj);
          return b.create<arith::MaximumFOp>(loc, mx, sj);
        });
        Value mNew = b.create<arith::MaximumFOp>(loc, m, tileMax);
        Value anyVisible = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, mNew, negInf);
        auto update = b.create<scf::IfOp>(loc, TypeRange{f32(), f32()}, anyVisible, /*withElse=*/true);
        {
          OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(update.thenBlock());
          Value corr = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, m, mNew)); // e^(-inf) = 0
          nest({idx(dh)}, [&](ValueRange e) { store(b.create<arith::MulFOp>(loc, load(acc, e), corr), acc, e); });
          Value tileSum = reduce(idx(0), tileLen, f32c(0), [&](Value jj, Value sum) {
            Value j = b.create<arith::AddIOp>(loc, kt, jj);
            Value p = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, load(scores, jj), mNew));
            nest({idx(dh)}, [&](ValueRange e) {
              Value vj = load(v, {bi, j, feature(e[0])});
              if (relV)
                vj = b.create<arith::AddFOp>(loc, vj, load(relV, {relativeIndex(i, j, clip), e[0]}));
              store(b.create<arith::AddFOp>(loc, load(acc, e), b.create<arith::MulFOp>(loc, p, vj)), acc, e);
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
      Value seen = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT, l, f32c(0));
      Value inv = select(seen, b.create<arith::DivFOp>(loc, f32c(1), l), f32c(0));
      nest({idx(dh)}, [&](ValueRange e) {
        store(b.create<arith::MulFOp>(loc, load(acc, e), inv), out, {bi, row, feature(e[0])});
      });
    });
    return set(a, out);
  }

  /// Fused vocabulary projection + log-softmax + gather, streamed over vocabulary
  /// tiles of kVocabTile columns: each tile's logits come from the runtime GEMM into
  /// a [rows, kVocabTile] buffer; per row a running max m and sum s (in double,
  /// rescaled as the max grows) and the target's logit are kept, and
  /// out[b, t] = logit[b, t - shift, ids[b, t]] - (m + log s). The [rows, V] logits never exist.
  LogicalResult lowerTokenLogprob(lm::TokenLogprobOp t) {
    constexpr int64_t kVocabTile = 2048;
    auto ht = typeOf(t.getHidden());
    int64_t D = ht.getDimSize(2), V = typeOf(t.getWeight()).getDimSize(0), shift = t.getShift();
    Value h = in(t.getHidden()), ids = in(t.getTargets()), out = alloc(t.getType());
    // Rows are (entry, position) pairs of the hidden states: [R0, R1, D] (R1 is N, or 1 when pruned).
    auto hs = sizes(ht);
    Value R0 = hs[0], R1 = hs[1];
    Value rows = b.create<arith::MulIOp>(loc, R0, R1);
    Value logits = b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic, kVocabTile}, f32()),
                                             ValueRange{rows}, b.getI64IntegerAttr(64));
    scopes.back().push_back(logits);
    auto rowBuffer = [&](Type elem) {
      Value m = b.create<memref::AllocOp>(loc, MemRefType::get({ShapedType::kDynamic}, elem), ValueRange{rows},
                                          b.getI64IntegerAttr(64));
      scopes.back().push_back(m);
      return m;
    };
    Value maxBuf = rowBuffer(f64()), sumBuf = rowBuffer(f64()), targetBuf = rowBuffer(f32());
    nest({rows}, [&](ValueRange r) {
      store(f64c(-INFINITY), maxBuf, r);
      store(f64c(0), sumBuf, r);
      store(f32c(0), targetBuf, r);
    });
    // Row r = (b, p) holds hidden position p; its target is ids[b, p + shift] when that exists.
    auto targetOf = [&](Value r) {
      Value bi = b.create<arith::DivUIOp>(loc, r, R1), p = b.create<arith::RemUIOp>(loc, r, R1);
      Value pt = b.create<arith::AddIOp>(loc, p, idx(shift));
      Value exists = lt(pt, R1);
      Value safe = select(exists, pt, idx(0));
      Value id = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(ids, {bi, safe}));
      return std::pair<Value, Value>{exists, id};
    };
    bool packedWeight = isPacked(t.getWeight());
    Value hPtr = pointer(h), wPtr = pointer(in(t.getWeight()));
    Value biasPtr = t.getBias() ? pointer(in(t.getBias())) : Value();
    Value logitsPtr = pointer(logits);
    Value m64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
    auto ptrType = LLVM::LLVMPointerType::get(b.getContext());
    auto offsetPtr = [&](Value p, Value elements) {
      return b.create<LLVM::GEPOp>(loc, ptrType, f32(), p, ValueRange{elements});
    };
    nest({idx((V + kVocabTile - 1) / kVocabTile)}, [&](ValueRange tile) {
      Value vt = b.create<arith::MulIOp>(loc, tile[0], idx(kVocabTile));
      Value tv = b.create<arith::MinSIOp>(loc, idx(kVocabTile), b.create<arith::SubIOp>(loc, idx(V), vt));
      Value vt64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), vt);
      Value tv64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), tv);
      Value wTile = offsetPtr(wPtr, b.create<arith::MulIOp>(loc, vt64, i64c(D)));
      Value biasTile = biasPtr ? Value(offsetPtr(biasPtr, vt64)) : Value(b.create<LLVM::ZeroOp>(loc, ptrType));
      if (packedWeight) {
        Value pBegin = b.create<arith::MulIOp>(loc, tile[0], idx(kVocabTile / kPanel));
        Value pEnd = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, pBegin, idx(kVocabTile / kPanel)),
                                              idx((V + kPanel - 1) / kPanel));
        parallelGemm(t.getWeight(), V, D, address(h), rows, t.getBias(), address(logits), i64c(kVocabTile), pBegin,
                     b.create<arith::SubIOp>(loc, pEnd, pBegin));
      } else {
        b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                               ValueRange{m64, tv64, i64c(D), hPtr, i64c(D), wTile, i64c(D), biasTile, logitsPtr,
                                          i64c(kVocabTile)});
      }
      nest({rows}, [&](ValueRange r) {
        // 16 columns at a time, then the tile's last tv % 16 columns one by one. The max is
        // exact in f32; the exponentials of one tile are summed in 16 f32 lanes (at most 128
        // terms each), the tiles in double.
        auto vec = VectorType::get({kLanes}, f32());
        Value tv16 = b.create<arith::MulIOp>(loc, b.create<arith::DivUIOp>(loc, tv, idx(kLanes)), idx(kLanes));
        auto vectorLoop = [&](Value init, const std::function<Value(Value, Value)> &step) {
          auto loop = b.create<scf::ForOp>(loc, idx(0), tv16, idx(kLanes), ValueRange{init});
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPointToStart(loop.getBody());
          Value x = b.create<vector::LoadOp>(loc, vec, logits, ValueRange{r[0], loop.getInductionVar()});
          b.create<scf::YieldOp>(loc, step(x, loop.getRegionIterArgs()[0]));
          return loop.getResult(0);
        };
        Value vmax = vectorLoop(b.create<vector::BroadcastOp>(loc, vec, f32c(-INFINITY)),
                                [&](Value x, Value mx) { return b.create<arith::MaximumFOp>(loc, mx, x); });
        Value tileMax = reduce(tv16, tv, toF64(b.create<vector::ReductionOp>(loc, vector::CombiningKind::MAXIMUMF, vmax)),
                               [&](Value c, Value mx) {
                                 return b.create<arith::MaximumFOp>(loc, mx, toF64(load(logits, {r[0], c})));
                               });
        Value m = load(maxBuf, r), mNew = b.create<arith::MaximumFOp>(loc, m, tileMax);
        Value mNewV = b.create<vector::BroadcastOp>(loc, vec, b.create<arith::TruncFOp>(loc, f32(), mNew));
        Value vsum = vectorLoop(b.create<vector::BroadcastOp>(loc, vec, f32c(0)), [&](Value x, Value acc) {
          return b.create<arith::AddFOp>(loc, acc, b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, x, mNewV)));
        });
        Value sum = reduce(tv16, tv, toF64(b.create<vector::ReductionOp>(loc, vector::CombiningKind::ADD, vsum)),
                           [&](Value c, Value acc) {
                             return b.create<arith::AddFOp>(
                                 loc, acc,
                                 b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, toF64(load(logits, {r[0], c})), mNew)));
                           });
        Value corr = b.create<math::ExpOp>(loc, b.create<arith::SubFOp>(loc, m, mNew));
        store(b.create<arith::AddFOp>(loc, b.create<arith::MulFOp>(loc, load(sumBuf, r), corr), sum), sumBuf, r);
        store(mNew, maxBuf, r);
        auto [exists, id] = targetOf(r[0]);
        Value inTile = andI(exists, andI(ge(id, vt), lt(id, b.create<arith::AddIOp>(loc, vt, tv))));
        when(inTile, [&] { store(load(logits, {r[0], b.create<arith::SubIOp>(loc, id, vt)}), targetBuf, r); });
      });
    });
    nest({R0, R1}, [&](ValueRange iv) {
      Value valid = andI(ge(iv[1], idx(shift)), lt(iv[1], lengthOf(iv[0])));
      Value v = choose(
          valid, f32(),
          [&] {
            Value r = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, iv[0], R1),
                                              b.create<arith::SubIOp>(loc, iv[1], idx(shift)));
            Value lse = b.create<arith::AddFOp>(loc, load(maxBuf, r), b.create<math::LogOp>(loc, load(sumBuf, r)));
            return toF32(b.create<arith::SubFOp>(loc, toF64(load(targetBuf, r)), lse));
          },
          [&] { return f32c(0); });
      store(v, out, iv);
    });
    return set(t, out);
  }

  /// Batched mask-and-predict: build the C = sum(lengths) masked copies (copy c =
  /// sentence b with position i masked), run the body once with batch C, then
  /// scatter row i (or row 0 when the body was pruned to one row) of copy c to
  /// result[b, i]. Inside the body the batch dimension is C and lengths are per copy.
  LogicalResult lowerMaskedBatch(lm::MaskedBatchOp m) {
    Value ids = in(m.getIds()), lens = in(m.getLengths());
    Value total = reduce(idx(0), B, idx(0), [&](Value bi, Value acc) { return b.create<arith::AddIOp>(loc, acc, lengthOf(bi)); });
    auto dyn = ShapedType::kDynamic;
    auto newBuffer = [&](ArrayRef<int64_t> shape, ValueRange dynSizes) {
      Value buf = b.create<memref::AllocOp>(loc, MemRefType::get(shape, i32()), dynSizes, b.getI64IntegerAttr(64));
      scopes.back().push_back(buf);
      return buf;
    };
    Value copies = newBuffer({dyn, dyn}, {total, N}), targets = newBuffer({dyn, dyn}, {total, N});
    Value copyLengths = newBuffer({dyn}, {total}), positions = newBuffer({dyn}, {total}), owner = newBuffer({dyn}, {total});
    Value mask = i32c(m.getMaskToken());
    // Copies of sentence b occupy [offset(b), offset(b) + len(b)).
    reduce(idx(0), B, idx(0), [&](Value bi, Value offset) {
      Value len = lengthOf(bi);
      nest({len}, [&](ValueRange pos) {
        Value c = b.create<arith::AddIOp>(loc, offset, pos[0]);
        nest({N}, [&](ValueRange t) {
          Value id = load(ids, {bi, t[0]});
          store(select(eqI(t[0], pos[0]), mask, id), copies, {c, t[0]});
          store(id, targets, {c, t[0]});
        });
        store(load(lens, bi), copyLengths, c);
        store(b.create<arith::IndexCastOp>(loc, i32(), pos[0]), positions, c);
        store(b.create<arith::IndexCastOp>(loc, i32(), bi), owner, c);
      });
      return b.create<arith::AddIOp>(loc, offset, len);
    });
    Value out = alloc(m.getType());
    auto outSizes = sizes(m.getType());
    nest(outSizes, [&](ValueRange iv) { store(f32c(0), out, iv); });

    Block &body = m.getBody().front();
    Value savedB = B, savedLengths = lengths, savedOwner = copyOwner;
    B = total;
    lengths = copyLengths;
    copyOwner = owner;
    scopes.emplace_back();
    buffers[body.getArgument(0)] = copies;
    buffers[body.getArgument(1)] = copyLengths;
    buffers[body.getArgument(2)] = targets;
    buffers[body.getArgument(3)] = positions;
    for (Operation &op : body.without_terminator())
      if (failed(lower(&op)))
        return failure();
    auto yield = cast<lm::YieldOp>(body.getTerminator());
    Value y = in(yield.getValue());
    bool pruned = typeOf(yield.getValue()).getDimSize(1) == 1;
    SmallVector<Value> rest(outSizes.begin() + 2, outSizes.end());
    nest({total}, [&](ValueRange c) {
      Value bi = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(owner, c));
      Value i = b.create<arith::IndexCastOp>(loc, b.getIndexType(), load(positions, c));
      nest(rest, [&](ValueRange r) {
        SmallVector<Value> from = {c[0], pruned ? idx(0) : i}, to = {bi, i};
        from.append(r.begin(), r.end());
        to.append(r.begin(), r.end());
        store(load(y, from), out, to);
      });
    });
    closeScope();
    B = savedB;
    lengths = savedLengths;
    copyOwner = savedOwner;
    return set(m, out);
  }

  /// Naive mask-and-predict: for each position i, run the body on the ids with
  /// column i masked (where i < length) and keep row i of its result.
  LogicalResult lowerMaskAndPredict(lm::MaskAndPredictOp m) {
    Value ids = in(m.getIds()), out = alloc(m.getType());
    auto outSizes = sizes(m.getType());
    nest(outSizes, [&](ValueRange iv) { store(f32c(0), out, iv); });
    Value mask = i32c(m.getMaskToken());
    Block &body = m.getBody().front();
    auto yield = cast<lm::YieldOp>(body.getTerminator());
    LogicalResult status = success();
    nest({N}, [&](ValueRange pos) {
      Value i = pos[0];
      scopes.emplace_back();
      Value masked = alloc(typeOf(m.getIds()));
      nest({B, N}, [&](ValueRange iv) {
        Value v = load(ids, iv);
        Value hit = andI(eqI(iv[1], i), lt(i, lengthOf(iv[0])));
        store(select(hit, mask, v), masked, iv);
      });
      buffers[body.getArgument(0)] = masked;
      for (Operation &op : body.without_terminator())
        if (failed(lower(&op))) {
          status = failure();
          return;
        }
      Value y = in(yield.getValue());
      SmallVector<Value> rest(outSizes.begin() + 2, outSizes.end());
      nest({B}, [&](ValueRange bi) {
        when(lt(i, lengthOf(bi[0])), [&] {
          nest(rest, [&](ValueRange r) {
            SmallVector<Value> at = {bi[0], i};
            at.append(r.begin(), r.end());
            store(load(y, at), out, at);
          });
        });
      });
      closeScope();
    });
    if (failed(status))
      return failure();
    return set(m, out);
  }

  OpBuilder b;
  Location loc;
  const ModelSpec &spec;
  const std::map<std::string, int64_t> &offsets;
  GemmTile tile; ///< register tile of the generated GEMMs, chosen for the target
  // per kernel
  Value weights, lengths, B, N;
  Value copyOwner; ///< inside lm.masked_batch: the sentence of every copy [C] (i32)
  ModuleOp outModule;
  std::vector<PackedWeight> packed;
  SmallVector<Value> outputs;
  DenseMap<Value, Value> buffers;
  DenseMap<Value, int64_t> viewOffset;
  SmallVector<SmallVector<Value>> scopes;
};

} // namespace

OwningOpRef<ModuleOp> lowerToLoops(ModuleOp lmModule, const ModelSpec &spec,
                                   const std::map<std::string, int64_t> &weightOffsets, GemmTile tile) {
  MLIRContext *ctx = lmModule.getContext();
  ctx->loadDialect<arith::ArithDialect, func::FuncDialect, math::MathDialect, memref::MemRefDialect,
                   scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect>();
  return KernelGen(ctx, spec, weightOffsets, tile).run(lmModule);
}

OwningOpRef<ModuleOp> buildAttentionModule(MLIRContext &context, lm::MaskKind mask, int64_t heads, int64_t dModel) {
  context.loadDialect<lm::LmDialect, arith::ArithDialect, func::FuncDialect, math::MathDialect,
                      memref::MemRefDialect, scf::SCFDialect, vector::VectorDialect, LLVM::LLVMDialect>();
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> lmModule = ModuleOp::create(loc);
  b.setInsertionPointToEnd(lmModule->getBody());
  int64_t dyn = ShapedType::kDynamic;
  auto t3 = RankedTensorType::get({dyn, dyn, dModel}, b.getF32Type());
  auto t1 = RankedTensorType::get({dyn}, b.getI32Type());
  auto fn = b.create<func::FuncOp>(loc, "attention", b.getFunctionType({t3, t3, t3, t1}, {t3}));
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto attention = b.create<lm::AttentionOp>(
      loc, t3, entry->getArgument(0), entry->getArgument(1), entry->getArgument(2), entry->getArgument(3), Value(),
      Value(), Value(), Value(), b.getI64IntegerAttr(heads), lm::MaskKindAttr::get(&context, mask),
      b.getF32FloatAttr(1.0f / std::sqrt(float(dModel / heads))), b.getI64IntegerAttr(0));
  b.create<func::ReturnOp>(loc, attention.getResult());
  static const ModelSpec noSpec;
  static const std::map<std::string, int64_t> noOffsets;
  return KernelGen(&context, noSpec, noOffsets, GemmTile::forVectorBits(512)).attentionOnly(fn, attention);
}

} // namespace lmcc::codegen
