//===- Linear.cpp - lm-to-loops: lm.linear and the generated GEMM functions ----===//
//
// lm.linear as a call of a generated GEMM over its load-time packed weight, split over the runtime's threads by
// panels (or of the runtime's Eigen GEMM), and the GEMM functions and kernel modules themselves; their bodies are
// Gemm.cpp's and GemmAmx.cpp's.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/GemmBody.h"
#include "codegen/LmToLoops/Lowering.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/AMX/AMXDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <algorithm>
#include <set>

using namespace mlir;

namespace lmcc::codegen {

static std::string gemmName(const char *prefix, int64_t n, int64_t k, bool withBias, GemmTile tile,
                            StringRef activation = {}) {
  return prefix + std::to_string(n) + "x" + std::to_string(k) + (withBias ? "_bias_" : "_") + tile.name() +
         (activation.empty() ? "" : "_" + activation.str());
}

/// A private function `name` of `inputs` -> () at the end of `module`, `b` at the start of its entry block.
static func::FuncOp newPrivateFunction(OpBuilder &b, ModuleOp module, StringRef name, TypeRange inputs) {
  b.setInsertionPointToEnd(module.getBody());
  auto fn = b.create<func::FuncOp>(b.getUnknownLoc(), name, b.getFunctionType(inputs, {}));
  fn.setPrivate();
  b.setInsertionPointToStart(fn.addEntryBlock());
  return fn;
}

func::FuncOp getOrCreateGemm(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                             StringRef activation) {
  assert(kPanel % tile.cols() == 0 && "a tile's columns divide the panel");
  const bool amx = tile.weights == GemmTile::Weights::Bf16Amx;
  assert((activation.empty() || !amx) && "the AMX kernel stores its tiles without an epilogue");
  std::string name = gemmName("lm_gemm_", n, k, withBias, tile, activation);
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Location loc = b.getUnknownLoc();
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type(), index = b.getIndexType();
  auto aType = MemRefType::get({dyn, amx ? amxInputPairs(k) : k}, f32);
  auto pType = MemRefType::get({dyn, kPanel}, f32, StridedLayoutAttr::get(ctx, dyn, {kPanel, 1}));
  auto biasType = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, dyn, {1}));
  auto cType = MemRefType::get({dyn, dyn}, f32);
  func::FuncOp fn = newPrivateFunction(b, module, name, {aType, pType, biasType, cType, index, index, index});
  Block *entry = &fn.getBody().front();
  GemmBody op;
  op.A = entry->getArgument(0), op.P = entry->getArgument(1), op.bias = entry->getArgument(2);
  op.C = entry->getArgument(3), op.pBegin = entry->getArgument(4), op.pEnd = entry->getArgument(5);
  op.cBase = entry->getArgument(6);
  op.n = n, op.k = k, op.withBias = withBias, op.activation = activation;
  op.N = b.create<arith::ConstantIndexOp>(loc, n);
  op.prefetch = prefetchesWeight(n, k, tile.bf16());
  if (amx)
    emitAmxGemmBody(b, loc, op);
  else
    emitGemmBody(b, loc, op, tile);
  b.create<func::ReturnOp>(loc);
  return fn;
}

/// A training GEMM body (the lm_rt_gemm_fn signature) named `name`: depth K from the call (`k` dynamic) or `k`
/// (the caller checked K == lda == k), reading A from copies of its row blocks when `copyA` (a run-time depth's caller
/// always asks for them).
static func::FuncOp trainGemmBody(ModuleOp module, StringRef name, GemmTile tile, int64_t k, bool prefetch,
                                  bool copyA) {
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  Location loc = b.getUnknownLoc();
  int64_t dyn = ShapedType::kDynamic;
  Type i64 = b.getI64Type(), f32 = b.getF32Type();
  auto ptr = LLVM::LLVMPointerType::get(ctx);
  // (A, lda, M, K, P, C, ldc, N, pBegin, pEnd, accumulate): lmrt.h's lm_rt_gemm_fn.
  func::FuncOp fn = newPrivateFunction(b, module, name, {ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64});
  Block *entry = &fn.getBody().front();
  auto arg = [&](int i) { return entry->getArgument(i); };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
  auto address = [&](Value p) -> Value { return b.create<LLVM::PtrToIntOp>(loc, i64, p); };
  auto toIndex = [&](Value v) -> Value { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), v); };
  auto rowMajor = MemRefType::get({dyn, dyn}, f32, StridedLayoutAttr::get(ctx, 0, {dyn, 1}));
  const bool dynamicK = k == dyn;
  Value K = dynamicK ? arg(3) : c64(k);
  Value panels = b.create<LLVM::UDivOp>(loc, i64, b.create<LLVM::AddOp>(loc, i64, arg(7), c64(kPanel - 1)), c64(kPanel));
  Value pRows = b.create<LLVM::MulOp>(loc, i64, panels, K);
  GemmBody op;
  op.A = dynamicK ? memrefAt(b, loc, address(arg(0)), {arg(2), K}, {arg(1), c64(1)}, rowMajor)
                  : memrefAt(b, loc, address(arg(0)), {arg(2), K}, {K, c64(1)}, MemRefType::get({dyn, k}, f32));
  op.P = memrefAt(b, loc, address(arg(4)), {pRows, c64(kPanel)}, {c64(kPanel), c64(1)},
                  MemRefType::get({dyn, kPanel}, f32, StridedLayoutAttr::get(ctx, dyn, {kPanel, 1})));
  op.C = memrefAt(b, loc, address(arg(5)), {arg(2), arg(7)}, {arg(6), c64(1)}, rowMajor);
  op.pBegin = toIndex(arg(8)), op.pEnd = toIndex(arg(9));
  op.cBase = b.create<arith::ConstantIndexOp>(loc, 0);
  op.N = toIndex(arg(7)), op.K = toIndex(K);
  op.accumulate = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, arg(10), c64(0));
  op.n = dyn, op.k = k, op.withBias = false, op.prefetch = prefetch, op.copyA = copyA;
  emitGemmBody(b, loc, op, tile);
  b.create<func::ReturnOp>(loc);
  return fn;
}

func::FuncOp getOrCreateTrainGemm(ModuleOp module, GemmTile tile, int64_t l1Ways, ArrayRef<TrainGemmDepth> depths,
                                  StringRef name) {
  tile.weights = GemmTile::Weights::F32;
  // The run-time depth body prefetches whatever the weight's size (its size is not known here).
  func::FuncOp any = trainGemmBody(module, "lm_train_gemm_any_" + tile.name(), tile, ShapedType::kDynamic,
                                   /*prefetch=*/true, /*copyA=*/true);
  // The depths in order, each once (prefetching if any of its entries does: the widest weight's rule).
  std::vector<TrainGemmDepth> sorted;
  for (const TrainGemmDepth &d : depths)
    if (d.k >= TrainGemmDepth::kMinDepth)
      sorted.push_back(d);
  std::sort(sorted.begin(), sorted.end());
  std::vector<TrainGemmDepth> merged;
  for (const TrainGemmDepth &d : sorted)
    if (!merged.empty() && merged.back().k == d.k)
      merged.back().prefetch |= d.prefetch;
    else
      merged.push_back(d);
  sorted = std::move(merged);
  if (sorted.empty() && name.empty())
    return any;
  // A static depth whose rows overflow the L1 sets they share copies A as the run-time body does (suffix c): the
  // inference GEMM takes the 5 x 64 tile there instead (GemmTile::forDepth), but the runtime calls one training GEMM
  // for every product of a model. Depth 2048 at 600-2048 rows on a Zen 4 (8-way L1, 12 x 32): 1.06-1.39x
  // (bench/results/2026-12-08-train-copy.md).
  auto copies = [&](const TrainGemmDepth &d) { return GemmTile::rowsOverflowL1Sets(d.k, tile.rows, l1Ways); };
  auto suffix = [&](const TrainGemmDepth &d) {
    return "_k" + std::to_string(d.k) + (d.prefetch ? "p" : "") + (copies(d) ? "c" : "");
  };
  std::string fnName = name.str();
  if (fnName.empty()) {
    fnName = "lm_train_gemm_" + tile.name() + "_for";
    for (const TrainGemmDepth &d : sorted)
      fnName += suffix(d);
  }
  if (auto existing = module.lookupSymbol<func::FuncOp>(fnName))
    return existing;
  OpBuilder b(module.getContext());
  Location loc = b.getUnknownLoc();
  Type i64 = b.getI64Type();
  func::FuncOp fn = newPrivateFunction(b, module, fnName, any.getArgumentTypes());
  Block *entry = &fn.getBody().front();
  SmallVector<Value> args(entry->getArguments());
  Value lda = args[1], K = args[3];
  // The depth equal to K and lda, if one is.
  for (const TrainGemmDepth &d : sorted) {
    func::FuncOp body =
        trainGemmBody(module, "lm_train_gemm_" + tile.name() + suffix(d), tile, d.k, d.prefetch, copies(d));
    Value k = b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(d.k));
    Value match = b.create<LLVM::AndOp>(loc, b.create<LLVM::ICmpOp>(loc, LLVM::ICmpPredicate::eq, K, k),
                                        b.create<LLVM::ICmpOp>(loc, LLVM::ICmpPredicate::eq, lda, k));
    auto branch = b.create<scf::IfOp>(loc, match, /*withElseRegion=*/true);
    b.setInsertionPointToStart(branch.thenBlock());
    b.create<func::CallOp>(loc, body, args);
    b.setInsertionPointToStart(branch.elseBlock());
  }
  b.create<func::CallOp>(loc, any, args);
  b.setInsertionPointToEnd(entry);
  b.create<func::ReturnOp>(loc);
  return fn;
}

/// The task function over pieces [begin, end) of one GEMM call (the fields: A, M, P, P's rows, bias, C, C's columns,
/// the call's first panel, its panel count, the row unit). By panels: panels first + begin .. first + end of every
/// row, C's column 0 at panel `first`. By rows: rows [begin * unit, min(end * unit, M)) of every panel of the call,
/// A and C offset to the first of them.
static func::FuncOp getOrCreateSplitTask(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                         StringRef activation, bool byRows) {
  std::string name = gemmName(byRows ? "lm_gemm_rows_task_" : "lm_gemm_task_", n, k, withBias, tile, activation);
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  func::FuncOp gemm = getOrCreateGemm(module, n, k, withBias, tile, activation);
  OpBuilder b(module.getContext());
  func::FuncOp fn = createTask(b, module, name);
  Block *entry = &fn.getBody().front();
  b.setInsertionPointToStart(entry);
  Location loc = b.getUnknownLoc();
  Type i64 = b.getI64Type();
  auto slot = [&](int64_t i) { return taskField(b, loc, entry->getArgument(0), i); };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
  auto mul = [&](Value x, Value y) -> Value { return b.create<LLVM::MulOp>(loc, i64, x, y); };
  auto add = [&](Value x, Value y) -> Value { return b.create<LLVM::AddOp>(loc, i64, x, y); };
  auto index = [&](Value v) -> Value { return b.create<arith::IndexCastOp>(loc, b.getIndexType(), v); };
  auto types = gemm.getArgumentTypes();
  Value begin = entry->getArgument(1), end = entry->getArgument(2);
  Value M = slot(1), cols = slot(6), first = slot(7), r0 = c64(0);
  Value panelBegin = add(first, begin), panelEnd = add(first, end);
  if (byRows) {
    Value unit = slot(9);
    r0 = mul(begin, unit);
    M = b.create<LLVM::SubOp>(loc, i64, b.create<LLVM::SMinOp>(loc, i64, mul(end, unit), M), r0);
    panelBegin = first, panelEnd = add(first, slot(8));
  }
  const int64_t aCols = llvm::cast<MemRefType>(types[0]).getDimSize(1); // k, or the AMX kernel's pairs
  auto descriptor = [&](Value address, ArrayRef<Value> sizes, ArrayRef<Value> strides, Type type) {
    return memrefAt(b, loc, address, sizes, strides, llvm::cast<MemRefType>(type));
  };
  Value A = descriptor(add(slot(0), mul(r0, c64(4 * aCols))), {M, c64(aCols)}, {c64(aCols), c64(1)}, types[0]);
  Value P = descriptor(slot(2), {slot(3), c64(kPanel)}, {c64(kPanel), c64(1)}, types[1]);
  Value bias = descriptor(slot(4), {c64(n)}, {c64(1)}, types[2]);
  Value C = descriptor(add(slot(5), mul(r0, mul(cols, c64(4)))), {M, cols}, {cols, c64(1)}, types[3]);
  b.create<func::CallOp>(loc, gemm, ValueRange{A, P, bias, C, index(panelBegin), index(panelEnd), index(first)});
  b.create<func::ReturnOp>(loc);
  return fn;
}

func::FuncOp getOrCreateGemmTask(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                 StringRef activation) {
  return getOrCreateSplitTask(module, n, k, withBias, tile, activation, /*byRows=*/false);
}

func::FuncOp getOrCreateGemmRowTask(ModuleOp module, int64_t n, int64_t k, bool withBias, GemmTile tile,
                                    StringRef activation) {
  return getOrCreateSplitTask(module, n, k, withBias, tile, activation, /*byRows=*/true);
}

OwningOpRef<ModuleOp> buildGemmModule(MLIRContext &context, const std::vector<std::pair<int64_t, int64_t>> &shapes,
                                      const std::vector<GemmTile> &tiles,
                                      const std::vector<TrainGemmDepth> &trainDepths, int64_t l1Ways) {
  context.loadDialect<amx::AMXDialect, arith::ArithDialect, func::FuncDialect, memref::MemRefDialect, scf::SCFDialect,
                      vector::VectorDialect, LLVM::LLVMDialect>();
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type();
  auto pDyn = MemRefType::get({dyn, kPanel}, f32);
  for (auto [n, k] : shapes)
    for (GemmTile tile : tiles) {
      std::string suffix = std::to_string(n) + "x" + std::to_string(k) + "_" + tile.name();
      b.setInsertionPointToEnd(module->getBody());
      auto pack = b.create<func::FuncOp>(loc, "lm_bench_pack_" + suffix,
                                         b.getFunctionType({MemRefType::get({n, k}, f32), pDyn}, {}));
      pack->setAttr("llvm.emit_c_interface", b.getUnitAttr());
      b.setInsertionPointToStart(pack.addEntryBlock());
      emitPack(b, loc, pack.getArgument(0), pack.getArgument(1), n, k, tile);
      b.create<func::ReturnOp>(loc);
      for (bool withBias : {false, true}) {
        if (withBias && !tile.bf16())
          continue; // (the fp32 kernel's bias epilogue is the widening kernel's, which GemmBf16 checks)
        func::FuncOp gemm = getOrCreateGemm(*module, n, k, withBias, tile);
        b.setInsertionPointToEnd(module->getBody());
        SmallVector<Type> inputs = {MemRefType::get({dyn, k}, f32), pDyn};
        if (withBias)
          inputs.push_back(MemRefType::get({n}, f32));
        inputs.push_back(MemRefType::get({dyn, dyn}, f32));
        auto run = b.create<func::FuncOp>(loc, (withBias ? "lm_bench_gemm_bias_" : "lm_bench_gemm_") + suffix,
                                          b.getFunctionType(inputs, {}));
        run->setAttr("llvm.emit_c_interface", b.getUnitAttr());
        b.setInsertionPointToStart(run.addEntryBlock());
        auto pType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[1]);
        auto biasType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[2]);
        Value p = b.create<memref::CastOp>(loc, pType, run.getArgument(1));
        Value bias = b.create<memref::CastOp>(
            loc, biasType,
            withBias ? run.getArgument(2) : Value(b.create<memref::AllocaOp>(loc, MemRefType::get({1}, f32))));
        Value zero = b.create<arith::ConstantIndexOp>(loc, 0);
        Value panels = b.create<arith::ConstantIndexOp>(loc, (n + kPanel - 1) / kPanel);
        Value a = run.getArgument(0), pairs;
        if (tile.weights == GemmTile::Weights::Bf16Amx) { // as Loops::gemmInput: A rounded to pairs first
          Value M = b.create<memref::DimOp>(loc, a, 0);
          auto pairsType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[0]);
          pairs = emitRoundToPairs(b, loc, a, k);
          const int64_t width = pairsType.getDimSize(1);
          auto c = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
          a = b.create<memref::ReinterpretCastOp>(loc, pairsType, pairs, c(0), ValueRange{M, c(width)},
                                                  ValueRange{c(width), c(1)});
        }
        b.create<func::CallOp>(loc, gemm, ValueRange{a, p, bias, run.getArguments().back(), zero, panels, zero});
        if (pairs)
          b.create<memref::DeallocOp>(loc, pairs);
        b.create<func::ReturnOp>(loc);
      }
    }
  for (GemmTile tile : tiles)
    if (!tile.bf16()) {
      getOrCreateTrainGemm(*module, tile, l1Ways, trainDepths, "lm_train_gemm_" + tile.name()).setPublic();
      getOrCreateTrainGemm(*module, tile, l1Ways).setPublic();
    }
  return module;
}

namespace {

/// y[rows, out] = x[rows, in] W[out, in]^T + bias: the generated GEMM over the load-time packed weight
/// (split over the runtime's threads by panels), or the runtime's Eigen GEMM (--gemm=eigen). An `activation` is
/// the generated GEMM's epilogue, or a pass over y in place where the product has none (AMX, Eigen).
struct LinearLowering : LmLowering<lm::LinearOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::LinearOp l, Loops &L) const override {
    auto &b = L.b;
    Location loc = L.loc;
    auto wt = L.typeOf(l.getWeight());
    int64_t n = wt.getDimSize(0), k = wt.getDimSize(1);
    Value out = L.alloc(l.getType());
    auto sizes = L.sizes(L.typeOf(l.getInput()));
    Value rows = L.idx(1); // every dim but the features
    for (size_t i = 0; i + 1 < sizes.size(); ++i)
      rows = b.create<arith::MulIOp>(loc, rows, sizes[i]);
    const StringRef activation = l.getActivation().value_or("");
    if (L.isPacked(l.getWeight())) {
      Loops::GemmInput input = L.gemmInput(L.address(L.in(l.getInput())), rows, k);
      const StringRef inKernel = kernelActivation(L.context.tile, activation);
      L.parallelGemm(l.getWeight(), n, k, input.address, rows, l.getBias(), L.address(out), L.i64c(n), L.idx(0),
                     L.idx((n + kPanel - 1) / kPanel), inKernel);
      L.release(input);
      if (inKernel != activation)
        emitActivationInPlace(L, activation, out);
      return L.set(l, out);
    }
    Value m = b.create<arith::IndexCastOp>(loc, b.getI64Type(), rows);
    Value bias = l.getBias() ? L.pointer(L.in(l.getBias()))
                             : Value(b.create<LLVM::ZeroOp>(loc, LLVM::LLVMPointerType::get(b.getContext())));
    b.create<func::CallOp>(loc, "lm_rt_sgemm_nt", TypeRange{},
                           ValueRange{m, L.i64c(n), L.i64c(k), L.pointer(L.in(l.getInput())), L.i64c(k),
                                      L.pointer(L.in(l.getWeight())), L.i64c(k), bias, L.pointer(out), L.i64c(n)});
    if (!activation.empty())
      emitActivationInPlace(L, activation, out);
    return L.set(l, out);
  }
};

} // namespace

void populateGemmPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<LinearLowering>(converter, patterns.getContext(), context);
}

} // namespace lmcc::codegen
