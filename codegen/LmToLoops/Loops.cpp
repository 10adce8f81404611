//===- Loops.cpp - Builder helpers shared by the lm-to-loops patterns -------===//
#include "codegen/LmToLoops/Lowering.h"

#include "mlir/Dialect/Utils/StaticValueUtils.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/xxhash.h"

using namespace mlir;

namespace lmcc::codegen {

MemRefType bufferType(RankedTensorType type) {
  if (!type.hasStaticShape())
    return MemRefType::get(type.getShape(), type.getElementType());
  SmallVector<int64_t> strides(type.getRank(), 1);
  for (int64_t i = type.getRank() - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * type.getDimSize(i + 1);
  auto layout = StridedLayoutAttr::get(type.getContext(), ShapedType::kDynamic, strides);
  return MemRefType::get(type.getShape(), type.getElementType(), layout);
}

void configureLowering(TypeConverter &converter, ConversionTarget &target) {
  converter.addConversion([](Type t) { return t; });
  converter.addConversion([](RankedTensorType t) -> Type { return bufferType(t); });
  // A region op (lm.masked_batch, lm.mask_and_predict) reads its body's yielded buffer before the body's ops are
  // converted: a cast stands in for it until then, and foldCastPairs removes the pair afterwards.
  auto cast = [](OpBuilder &b, Type type, ValueRange inputs, Location loc) -> std::optional<Value> {
    return b.create<UnrealizedConversionCastOp>(loc, type, inputs).getResult(0);
  };
  converter.addSourceMaterialization(cast);
  converter.addTargetMaterialization(cast);
  auto hasTensors = [](TypeRange types) { return llvm::any_of(types, [](Type t) { return isa<TensorType>(t); }); };
  target.addLegalDialect<arith::ArithDialect, math::MathDialect, memref::MemRefDialect, scf::SCFDialect,
                         vector::VectorDialect, LLVM::LLVMDialect>();
  target.addLegalOp<UnrealizedConversionCastOp, func::CallOp, func::ConstantOp>();
  target.addIllegalDialect<lm::LmDialect>();
  target.addDynamicallyLegalOp<func::FuncOp>([=](func::FuncOp fn) {
    return !hasTensors(fn.getArgumentTypes()) && !hasTensors(fn.getResultTypes());
  });
  target.addDynamicallyLegalOp<func::ReturnOp>([](func::ReturnOp ret) { return ret.getNumOperands() == 0; });
}

Loops::Loops(ConversionPatternRewriter &rewriter, Operation *op, ValueRange operands, const LoweringContext &context)
    : b(rewriter), loc(op->getLoc()), context(context), op(op), operands(operands) {
  // B and N from the first operand buffers that have them (first `?` = B, second = N).
  for (Value v : operands) {
    auto type = llvm::dyn_cast<MemRefType>(v.getType());
    if (!type)
      continue;
    int seen = 0;
    for (int64_t i = 0; i < type.getRank(); ++i) {
      if (!ShapedType::isDynamic(type.getDimSize(i)))
        continue;
      if (seen == 0 && !B_)
        B_ = b.create<memref::DimOp>(loc, v, i);
      if (seen == 1 && !N_)
        N_ = b.create<memref::DimOp>(loc, v, i);
      ++seen;
    }
  }
}

Value Loops::in(Value original) const {
  for (unsigned i = 0; i < op->getNumOperands(); ++i)
    if (op->getOperand(i) == original)
      return operands[i];
  return Value();
}

LogicalResult Loops::set(Operation *original, Value buffer) {
  auto want = bufferType(llvm::cast<RankedTensorType>(original->getResult(0).getType()));
  if (buffer.getType() != want)
    buffer = b.create<memref::CastOp>(loc, want, buffer);
  b.replaceOp(original, buffer);
  return success();
}

LogicalResult Loops::setAll(Operation *original, ArrayRef<Value> buffers) {
  SmallVector<Value> values;
  for (auto [result, buffer] : llvm::zip(original->getResults(), buffers)) {
    auto want = bufferType(llvm::cast<RankedTensorType>(result.getType()));
    values.push_back(buffer.getType() == want ? buffer : b.create<memref::CastOp>(loc, want, buffer).getResult());
  }
  b.replaceOp(original, values);
  return success();
}

SmallVector<Value> Loops::sizes(ShapedType t) {
  SmallVector<Value> out;
  bool seenBatch = false;
  for (int64_t d : t.getShape()) {
    if (ShapedType::isDynamic(d)) {
      out.push_back(seenBatch ? N() : B());
      seenBatch = true;
    } else {
      out.push_back(idx(d));
    }
  }
  return out;
}

SmallVector<Value> Loops::dims(Value buffer) {
  auto type = llvm::cast<ShapedType>(buffer.getType());
  SmallVector<Value> out;
  for (int64_t i = 0; i < type.getRank(); ++i)
    out.push_back(type.isDynamicDim(i) ? Value(b.create<memref::DimOp>(loc, buffer, i)) : idx(type.getDimSize(i)));
  return out;
}

Value Loops::missingSize(StringRef what) {
  op->emitError() << "lm-to-loops takes the " << what
                  << " from a dynamic (`?`) dimension of the op's operands, and they have none: kernels run over any "
                     "batch and sequence length, so write those dimensions `?`";
  context.missingSizes = true;
  return idx(1);
}

Value Loops::alloc(ShapedType t) { return alloc(t, sizes(t)); }

Value Loops::alloc(ShapedType t, ArrayRef<Value> all) {
  SmallVector<Value> dyn;
  for (auto [i, d] : llvm::enumerate(t.getShape()))
    if (ShapedType::isDynamic(d))
      dyn.push_back(all[i]);
  auto type = MemRefType::get(t.getShape(), t.getElementType());
  return b.create<memref::AllocOp>(loc, type, dyn, b.getI64IntegerAttr(64));
}

void Loops::nest(ArrayRef<Value> ubs, const std::function<void(ValueRange)> &body) {
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

Value Loops::reduce(Value lb, Value ub, Value init, const std::function<Value(Value, Value)> &step) {
  auto loop = b.create<scf::ForOp>(loc, lb, ub, idx(1), ValueRange{init});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value next = step(loop.getInductionVar(), loop.getRegionIterArgs()[0]);
    b.create<scf::YieldOp>(loc, next);
  }
  return loop.getResult(0);
}

void Loops::when(Value cond, const std::function<void()> &then) {
  auto ifOp = b.create<scf::IfOp>(loc, cond, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifOp.thenBlock());
  then();
}

Value Loops::choose(Value cond, Type type, const std::function<Value()> &then, const std::function<Value()> &otherwise) {
  auto ifOp = b.create<scf::IfOp>(loc, TypeRange{type}, cond, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<scf::YieldOp>(loc, then());
    b.setInsertionPointToStart(ifOp.elseBlock());
    b.create<scf::YieldOp>(loc, otherwise());
  }
  return ifOp.getResult(0);
}

Value Loops::isOneOf(Value id, ArrayRef<int32_t> tokens) {
  Value hit = b.create<arith::ConstantOp>(loc, b.getBoolAttr(false));
  for (int32_t t : tokens)
    hit = orI(hit, eqI(id, i32c(t)));
  return hit;
}

Value Loops::directionalVisible(Value rows, Value bi, Value i, Value j, Value length) {
  Value dir = load(rows, {bi, i, idx(0)});
  auto is = [&](int64_t code) { return cmp(arith::CmpIPredicate::eq, dir, i32c(code)); };
  Value word = load(rows, {bi, i, b.create<arith::AddIOp>(loc, idx(1), b.create<arith::DivUIOp>(loc, j, idx(32)))});
  Value shift = b.create<arith::IndexCastOp>(loc, i32(), b.create<arith::RemUIOp>(loc, j, idx(32)));
  Value bit = b.create<arith::AndIOp>(loc, b.create<arith::ShRUIOp>(loc, word, shift), i32c(1));
  Value shown = cmp(arith::CmpIPredicate::eq, bit, i32c(0));
  Value v = orI(orI(andI(is(0), le(j, i)), andI(is(1), ge(j, i))), andI(is(2), andI(ne(j, i), shown)));
  return andI(lt(j, length), v);
}

Value Loops::relativeIndex(Value i, Value j, int64_t k) {
  Value d = b.create<arith::SubIOp>(loc, j, i);
  d = b.create<arith::MaxSIOp>(loc, d, idx(-k));
  d = b.create<arith::MinSIOp>(loc, d, idx(k));
  return b.create<arith::AddIOp>(loc, d, idx(k));
}

Value Loops::rowMax(Value x, SmallVector<Value> row, Value C) {
  return reduce(idx(0), C, f32c(-INFINITY), [&](Value c, Value acc) {
    row.push_back(c);
    Value v = load(x, row);
    row.pop_back();
    return b.create<arith::MaximumFOp>(loc, acc, v);
  });
}

Value Loops::address(Value m) {
  Value base = b.create<memref::ExtractAlignedPointerAsIndexOp>(loc, m);
  Value addr = b.create<arith::IndexCastOp>(loc, b.getI64Type(), base);
  auto type = llvm::cast<MemRefType>(m.getType());
  int64_t offset = 0;
  SmallVector<int64_t> strides;
  if (failed(getStridesAndOffset(type, strides, offset)) || offset != 0) {
    // A view into the weight buffer: add its offset (static or read from the descriptor) in bytes.
    auto metadata = b.create<memref::ExtractStridedMetadataOp>(loc, m);
    Value elements = b.create<arith::IndexCastOp>(loc, b.getI64Type(), metadata.getOffset());
    addr = b.create<arith::AddIOp>(loc, addr, b.create<arith::MulIOp>(loc, elements, i64c(4)));
  }
  return addr;
}

Value Loops::pointer(Value m) {
  return b.create<LLVM::IntToPtrOp>(loc, LLVM::LLVMPointerType::get(b.getContext()), address(m));
}

Value Loops::weights() {
  Operation *fn = op->getParentOfType<func::FuncOp>();
  return llvm::cast<func::FuncOp>(fn).getArgument(0);
}

Value weightView(OpBuilder &b, Location loc, Value weights, OpFoldResult offset, ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  const int64_t layoutOffset = getConstantIntValue(offset).value_or(ShapedType::kDynamic);
  auto type = MemRefType::get(shape, b.getF32Type(), StridedLayoutAttr::get(b.getContext(), layoutOffset, strides));
  return b.create<memref::ReinterpretCastOp>(loc, type, weights, offset, getAsIndexOpFoldResult(b.getContext(), shape),
                                             getAsIndexOpFoldResult(b.getContext(), strides));
}

func::FuncOp getOrCreateNoInline(OpBuilder &b, ModuleOp module, StringRef name, TypeRange inputs,
                                 const std::function<void(ValueRange)> &body) {
  if (auto existing = module.lookupSymbol<func::FuncOp>(name)) {
    assert(existing.getFunctionType().getInputs() == inputs && "one name, two signatures");
    return existing;
  }
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(module.getBody());
  auto fn = b.create<func::FuncOp>(module.getLoc(), name, b.getFunctionType(inputs, {}));
  fn.setPrivate();
  fn->setAttr("no_inline", b.getUnitAttr());
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  body(entry->getArguments());
  b.create<func::ReturnOp>(module.getLoc());
  return fn;
}

Value Loops::weightView(int64_t offset, ArrayRef<int64_t> shape) {
  return codegen::weightView(b, loc, weights(), offset, shape);
}

SmallVector<Value> Loops::outputs() {
  auto fn = op->getParentOfType<func::FuncOp>();
  auto inputs = fn->getAttrOfType<IntegerAttr>("lmcc.num_inputs");
  return SmallVector<Value>(fn.getArguments().drop_front(1 + (inputs ? inputs.getInt() : 2)));
}

std::vector<std::string> weightNames(Value weight) {
  if (auto w = weight.getDefiningOp<lm::WeightOp>())
    return {w.getName().str()};
  std::vector<std::string> names;
  if (auto c = weight.getDefiningOp<lm::ConcatOp>())
    for (Value v : c.getInputs()) {
      auto w = v.getDefiningOp<lm::WeightOp>();
      if (!w)
        return {};
      names.push_back(w.getName().str());
    }
  return names;
}

const WeightLayout::Entry *Loops::packed(Value weight) const {
  if (!context.generatedGemm)
    return nullptr;
  std::vector<std::string> names = weightNames(weight);
  return names.empty() ? nullptr : context.layout->find(packKey(names));
}

void Loops::parallelGemm(Value weight, int64_t n, int64_t k, Value inputAddress, Value rows, Value bias,
                         Value outAddress, Value cols, Value first, Value panels, StringRef activation) {
  auto module = op->getParentOfType<ModuleOp>();
  const GemmTile tile = context.tileFor(k);
  func::FuncOp task = getOrCreateGemmTask(module, n, k, bool(bias), tile, activation);
  Value biasAddress = bias ? address(in(bias)) : i64c(0);
  auto i64 = [&](Value index) { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
  const int64_t packedRowCount = packedRows(n, k, tile.bf16());
  SmallVector<Value> fields{inputAddress, i64(rows), address(weightView(packed(weight)->offset, {packedRowCount, kPanel})),
                            i64c(packedRowCount), biasAddress, outAddress, cols, i64(first)};
  if (tile.weights == GemmTile::Weights::Bf16Amx) { // (its input rows come padded to 32: split by panels only)
    parallelFor(task, panels, fields);
    return;
  }
  // At least twice as many rows as columns (and 16 tiles of them): about 16 pieces of rows (getOrCreateGemmRowTask),
  // so that each thread reads its rows of A once. Split by panels, each of the (4 x threads) pieces read all of A
  // again: with A beyond the caches (biLM PLL at n = 80 and 128, 6400 and 16384 rows a sentence) two threads ran
  // 1.09-1.10x slower so (bench/results/2026-12-05-gemm-rows.md); level where A stays in L3.
  Value many = b.create<arith::AndIOp>(
      loc, b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, rows, b.create<arith::MulIOp>(loc, panels, idx(2 * kPanel))),
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::uge, rows, idx(16 * tile.rows)));
  auto split = b.create<scf::IfOp>(loc, many, /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(split.thenBlock());
  auto ceilDiv = [&](Value x, Value y) {
    return b.create<arith::DivUIOp>(loc, b.create<arith::AddIOp>(loc, x, b.create<arith::SubIOp>(loc, y, idx(1))), y);
  };
  Value unit = b.create<arith::MulIOp>(loc, ceilDiv(ceilDiv(rows, idx(16)), idx(tile.rows)), idx(tile.rows));
  SmallVector<Value> rowFields(fields);
  rowFields.push_back(i64(panels));
  rowFields.push_back(i64(unit));
  parallelFor(getOrCreateGemmRowTask(module, n, k, bool(bias), tile, activation), ceilDiv(rows, unit), rowFields);
  b.setInsertionPointToStart(split.elseBlock());
  parallelFor(task, panels, fields);
}

Loops::GemmInput Loops::gemmInput(Value inputAddress, Value rows, int64_t k) {
  if (context.tile.weights != GemmTile::Weights::Bf16Amx)
    return {inputAddress, Value()};
  Value rows64 = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
  Value A = memrefAt(b, loc, inputAddress, {rows64, i64c(k)}, {i64c(k), i64c(1)},
                     MemRefType::get({ShapedType::kDynamic, k}, f32()));
  Value pairs = emitRoundToPairs(b, loc, A, k);
  return {address(pairs), pairs};
}

void Loops::parallelFor(func::FuncOp task, Value count, ArrayRef<Value> fields, Value serial) {
  Value ctx = b.create<memref::AllocaOp>(loc, MemRefType::get({int64_t(fields.size())}, b.getI64Type()));
  for (auto [i, field] : llvm::enumerate(fields))
    store(field, ctx, idx(i));
  auto ptrType = LLVM::LLVMPointerType::get(b.getContext());
  Value ctxPtr = b.create<LLVM::IntToPtrOp>(loc, ptrType, address(ctx));
  Value fnPtr = functionPointer(task);
  if (isa<IndexType>(count.getType()))
    count = b.create<arith::IndexCastOp>(loc, b.getI64Type(), count);
  if (!serial) {
    b.create<func::CallOp>(loc, "lm_rt_parallel_for", TypeRange{}, ValueRange{count, fnPtr, ctxPtr});
    return;
  }
  auto choice = b.create<scf::IfOp>(loc, serial, /*withElse=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(choice.thenBlock());
  b.create<func::CallOp>(loc, task, ValueRange{ctxPtr, i64c(0), count});
  b.setInsertionPointToStart(choice.elseBlock());
  b.create<func::CallOp>(loc, "lm_rt_parallel_for", TypeRange{}, ValueRange{count, fnPtr, ctxPtr});
}

bool Loops::readableAtAddress(MemRefType type) {
  if (type.getLayout().isIdentity())
    return true;
  int64_t offset;
  SmallVector<int64_t> strides;
  if (!type.hasStaticShape() || failed(getStridesAndOffset(type, strides, offset)))
    return false;
  auto identity = MemRefType::get(type.getShape(), type.getElementType());
  SmallVector<int64_t> rowMajor;
  int64_t offsetIgnored;
  return succeeded(getStridesAndOffset(identity, rowMajor, offsetIgnored)) && rowMajor == strides;
}

std::optional<Loops::TaskView> Loops::taskView(Value buffer) {
  auto type = llvm::cast<MemRefType>(buffer.getType());
  if (type.getLayout().isIdentity()) {
    TaskView view{buffer, type, {}};
    SmallVector<Value> all = dims(buffer);
    for (int64_t i = 0; i < type.getRank(); ++i)
      if (type.isDynamicDim(i))
        view.sizes.push_back(all[i]);
    return view;
  }
  if (!readableAtAddress(type))
    return std::nullopt;
  return TaskView{buffer, MemRefType::get(type.getShape(), type.getElementType()), {}};
}

void Loops::rowTask(StringRef name, ArrayRef<TaskView> views, ArrayRef<Value> scalars, Value count, Value work,
                    const std::function<void(ArrayRef<Value>, ArrayRef<Value>, Value)> &body) {
  auto module = op->getParentOfType<ModuleOp>();
  func::FuncOp task = module.lookupSymbol<func::FuncOp>(name);
  if (!task) {
    OpBuilder::InsertionGuard guard(b);
    task = createTask(b, module, name);
    Block *entry = &task.getBody().front();
    b.setInsertionPointToStart(entry);
    Value ctx = entry->getArgument(0);
    Type i64 = b.getI64Type();
    int64_t field = 0;
    auto next = [&] { return taskField(b, loc, ctx, field++); };
    auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
    SmallVector<Value> taskViews, taskScalars;
    for (const TaskView &v : views) {
      Value address = next();
      SmallVector<Value> sizes, strides(v.type.getRank());
      for (int64_t d : v.type.getShape())
        sizes.push_back(ShapedType::isDynamic(d) ? next() : c64(d));
      Value stride = c64(1);
      for (int64_t i = v.type.getRank() - 1; i >= 0; --i) {
        strides[i] = stride;
        stride = b.create<LLVM::MulOp>(loc, stride, sizes[i]);
      }
      taskViews.push_back(memrefAt(b, loc, address, sizes, strides, v.type));
    }
    for (size_t i = 0; i < scalars.size(); ++i)
      taskScalars.push_back(b.create<arith::IndexCastOp>(loc, b.getIndexType(), next()));
    Value begin = b.create<arith::IndexCastOp>(loc, b.getIndexType(), entry->getArgument(1));
    Value end = b.create<arith::IndexCastOp>(loc, b.getIndexType(), entry->getArgument(2));
    auto loop = b.create<scf::ForOp>(loc, begin, end, idx(1));
    b.setInsertionPointToStart(loop.getBody());
    body(taskViews, taskScalars, loop.getInductionVar());
    b.setInsertionPointAfter(loop);
    b.create<func::ReturnOp>(loc);
  }
  auto i64 = [&](Value index) -> Value { return b.create<arith::IndexCastOp>(loc, b.getI64Type(), index); };
  SmallVector<Value> fields;
  for (const TaskView &v : views) {
    fields.push_back(address(v.buffer));
    for (Value size : v.sizes)
      fields.push_back(i64(size));
  }
  for (Value scalar : scalars)
    fields.push_back(i64(scalar));
  parallelFor(task, count, fields, lt(work, idx(1 << 17)));
}

void Loops::outlined(StringRef kind, ArrayRef<Value> args, const std::function<void(ArrayRef<Value>)> &body) {
  SmallVector<Type> types;
  std::string signature;
  llvm::raw_string_ostream os(signature);
  for (Value a : args) {
    types.push_back(a.getType());
    os << a.getType() << ";";
  }
  const std::string name = ("lm_" + kind + "_" + llvm::utohexstr(llvm::xxh3_64bits(signature))).str();
  func::FuncOp fn = getOrCreateNoInline(b, op->getParentOfType<ModuleOp>(), name, types, [&](ValueRange params) {
    Value callerLengths = lengths;
    body(SmallVector<Value>(params));
    lengths = callerLengths;
  });
  b.create<func::CallOp>(loc, fn, args);
}

bool Loops::forRows(StringRef name, ArrayRef<Value> buffers, ArrayRef<Value> vectors, int64_t cost,
                    const std::function<void(ArrayRef<Value>, ArrayRef<Value>, Value)> &body) {
  auto rowMajor = [](Value m) {
    auto type = llvm::cast<MemRefType>(m.getType());
    return type.getLayout().isIdentity() && type.getRank() >= 1 && !type.isDynamicDim(type.getRank() - 1);
  };
  auto flat = [](Value m) { return llvm::cast<MemRefType>(m.getType()).getRank() == 1; };
  if (!llvm::all_of(buffers, rowMajor) || !llvm::all_of(vectors, flat))
    return false;
  SmallVector<TaskView> views;
  SmallVector<Value> shape = dims(buffers[0]);
  Value rows = idx(1);
  for (size_t i = 0; i + 1 < shape.size(); ++i)
    rows = b.create<arith::MulIOp>(loc, rows, shape[i]);
  for (Value m : buffers) {
    auto type = llvm::cast<MemRefType>(m.getType());
    views.push_back({m, MemRefType::get({ShapedType::kDynamic, type.getShape().back()}, type.getElementType()), {rows}});
  }
  for (Value m : vectors) {
    std::optional<TaskView> v = taskView(m);
    if (!v)
      return false;
    views.push_back(*v);
  }
  int64_t cols = llvm::cast<MemRefType>(buffers[0].getType()).getShape().back();
  rowTask(name, views, {}, rows, b.create<arith::MulIOp>(loc, rows, idx(cols * cost)),
          [&](ArrayRef<Value> all, ArrayRef<Value>, Value r) {
            body(all.take_front(buffers.size()), all.drop_front(buffers.size()), r);
          });
  return true;
}

Value Loops::functionPointer(func::FuncOp fn) {
  Value f = b.create<func::ConstantOp>(loc, fn.getFunctionType(), SymbolRefAttr::get(fn));
  return b.create<UnrealizedConversionCastOp>(loc, TypeRange{LLVM::LLVMPointerType::get(b.getContext())}, f)
      .getResult(0);
}

SmallVector<Value, 2> Loops::trainGemm(ArrayRef<TrainGemmDepth> depths) {
  func::FuncOp gemm = getOrCreateTrainGemm(op->getParentOfType<ModuleOp>(), context.tile, context.l1Ways, depths);
  return {functionPointer(gemm), i64c(context.tile.cols())};
}

func::FuncOp createTask(OpBuilder &b, ModuleOp module, StringRef name) {
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(module.getBody());
  auto ptr = LLVM::LLVMPointerType::get(b.getContext());
  auto fn = b.create<func::FuncOp>(module.getLoc(), name, b.getFunctionType({ptr, b.getI64Type(), b.getI64Type()}, {}));
  fn.setPrivate();
  fn.addEntryBlock();
  return fn;
}

Value taskField(OpBuilder &b, Location loc, Value ctx, int64_t i) {
  auto ptr = LLVM::LLVMPointerType::get(b.getContext());
  Value at = b.create<LLVM::GEPOp>(loc, ptr, b.getI64Type(), ctx, ArrayRef<LLVM::GEPArg>{int32_t(i)});
  return b.create<LLVM::LoadOp>(loc, b.getI64Type(), at);
}

Value memrefAt(OpBuilder &b, Location loc, Value address, ArrayRef<Value> sizes, ArrayRef<Value> strides,
               MemRefType type) {
  Type i64 = b.getI64Type();
  auto ptr = LLVM::LLVMPointerType::get(b.getContext());
  int64_t rank = sizes.size();
  auto array = LLVM::LLVMArrayType::get(i64, rank);
  auto structType = LLVM::LLVMStructType::getLiteral(b.getContext(), {ptr, ptr, i64, array, array});
  Value p = b.create<LLVM::IntToPtrOp>(loc, ptr, address);
  Value d = b.create<LLVM::UndefOp>(loc, structType);
  d = b.create<LLVM::InsertValueOp>(loc, d, p, ArrayRef<int64_t>{0});
  d = b.create<LLVM::InsertValueOp>(loc, d, p, ArrayRef<int64_t>{1});
  d = b.create<LLVM::InsertValueOp>(loc, d, b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(0)),
                                    ArrayRef<int64_t>{2});
  for (int64_t i = 0; i < rank; ++i) {
    d = b.create<LLVM::InsertValueOp>(loc, d, sizes[i], ArrayRef<int64_t>{3, i});
    d = b.create<LLVM::InsertValueOp>(loc, d, strides[i], ArrayRef<int64_t>{4, i});
  }
  return b.create<UnrealizedConversionCastOp>(loc, type, d).getResult(0);
}

/// memref -> tensor -> memref cast chains left by the conversion become the memref itself.
void foldCastPairs(ModuleOp module) {
  module.walk([](UnrealizedConversionCastOp cast) {
    if (cast->getNumOperands() != 1 || cast->getNumResults() != 1)
      return;
    auto inner = cast->getOperand(0).getDefiningOp<UnrealizedConversionCastOp>();
    if (inner && inner->getNumOperands() == 1 && inner->getOperand(0).getType() == cast.getResult(0).getType())
      cast.getResult(0).replaceAllUsesWith(inner->getOperand(0));
  });
  // Erase dead casts, users first (a walk visits producers before their users).
  SmallVector<UnrealizedConversionCastOp> casts;
  module.walk([&](UnrealizedConversionCastOp cast) { casts.push_back(cast); });
  for (UnrealizedConversionCastOp cast : llvm::reverse(casts))
    if (cast->use_empty())
      cast->erase();
}

} // namespace lmcc::codegen
