//===- Gemm.cpp - Generated GEMM microkernels over load-time packed weights -===//
//
// The weights of every linear layer are constants: the runtime packs them once at
// load time into panels of 64 output features ([ceil(N/64)][K][64], zero-padded),
// so the kernel streams B contiguously and never re-packs. The microkernel keeps a
// 5 x 64 tile of C in 20 vector<16xf32> registers across the whole K loop (scf.for
// iter_args), loads 4 vectors of B and broadcasts 5 scalars of A per k step: 20
// FMAs per 9 loads. Rows past a multiple of 5 use a 1 x 64 tile; the last partial
// panel is written with masked stores. DESIGN.md records the recipe.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Gemm.h"

#include "dialect/LmDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <set>

using namespace mlir;

namespace lmcc::codegen {

std::string packKey(Value weight) {
  if (auto w = weight.getDefiningOp<lm::WeightOp>())
    return "pack:" + w.getName().str();
  if (auto c = weight.getDefiningOp<lm::ConcatOp>()) {
    std::string key = "pack:";
    for (Value v : c.getInputs()) {
      auto w = v.getDefiningOp<lm::WeightOp>();
      if (!w)
        return "";
      key += (key.size() > 5 ? "|" : "") + w.getName().str();
    }
    return key;
  }
  return "";
}

std::vector<PackedWeight> packedWeights(ModuleOp lmModule) {
  std::vector<PackedWeight> out;
  std::set<std::string> seen;
  auto add = [&](Value weight) {
    std::string key = packKey(weight);
    auto type = llvm::cast<RankedTensorType>(weight.getType());
    if (key.empty() || type.getRank() != 2 || !seen.insert(key).second)
      return;
    PackedWeight p{key, {}, type.getDimSize(0), type.getDimSize(1)};
    if (auto w = weight.getDefiningOp<lm::WeightOp>())
      p.names.push_back(w.getName().str());
    else
      for (Value v : weight.getDefiningOp<lm::ConcatOp>().getInputs())
        p.names.push_back(v.getDefiningOp<lm::WeightOp>().getName().str());
    out.push_back(p);
  };
  lmModule.walk([&](Operation *op) {
    if (auto l = dyn_cast<lm::LinearOp>(op))
      add(l.getWeight());
    else if (auto t = dyn_cast<lm::TokenLogprobOp>(op))
      add(t.getWeight());
  });
  return out;
}

void emitPack(OpBuilder &b, Location loc, Value weight, Value packed, int64_t n, int64_t k) {
  Value zero = b.create<arith::ConstantIndexOp>(loc, 0), one = b.create<arith::ConstantIndexOp>(loc, 1);
  Value panels = b.create<arith::ConstantIndexOp>(loc, (n + kPanel - 1) / kPanel);
  Value kk = b.create<arith::ConstantIndexOp>(loc, k), width = b.create<arith::ConstantIndexOp>(loc, kPanel);
  Value nn = b.create<arith::ConstantIndexOp>(loc, n);
  Value fzero = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0));
  auto lp = b.create<scf::ForOp>(loc, zero, panels, one);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(lp.getBody());
  auto lk = b.create<scf::ForOp>(loc, zero, kk, one);
  b.setInsertionPointToStart(lk.getBody());
  auto lj = b.create<scf::ForOp>(loc, zero, width, one);
  b.setInsertionPointToStart(lj.getBody());
  Value p = lp.getInductionVar(), kv = lk.getInductionVar(), j = lj.getInductionVar();
  Value row = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, width), j);
  Value inside = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, row, nn);
  auto value = b.create<scf::IfOp>(loc, TypeRange{b.getF32Type()}, inside, true);
  {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(value.thenBlock());
    b.create<scf::YieldOp>(loc, ValueRange{b.create<memref::LoadOp>(loc, weight, ValueRange{row, kv})});
    b.setInsertionPointToStart(value.elseBlock());
    b.create<scf::YieldOp>(loc, ValueRange{fzero});
  }
  Value prow = b.create<arith::AddIOp>(loc, b.create<arith::MulIOp>(loc, p, kk), kv);
  b.create<memref::StoreOp>(loc, value.getResult(0), packed, ValueRange{prow, j});
}

func::FuncOp getOrCreateGemm(ModuleOp module, int64_t n, int64_t k, bool withBias) {
  std::string name = "lm_gemm_" + std::to_string(n) + "x" + std::to_string(k) + (withBias ? "_bias" : "");
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module.getBody());
  Location loc = b.getUnknownLoc();
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type(), index = b.getIndexType();
  auto aType = MemRefType::get({dyn, k}, f32);
  auto pType = MemRefType::get({dyn, kPanel}, f32, StridedLayoutAttr::get(ctx, dyn, {kPanel, 1}));
  auto biasType = MemRefType::get({dyn}, f32, StridedLayoutAttr::get(ctx, dyn, {1}));
  auto cType = MemRefType::get({dyn, dyn}, f32);
  auto fn =
      b.create<func::FuncOp>(loc, name, b.getFunctionType({aType, pType, biasType, cType, index, index, index}, {}));
  fn.setPrivate();
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  Value A = entry->getArgument(0), P = entry->getArgument(1), bias = entry->getArgument(2), C = entry->getArgument(3);
  Value pBegin = entry->getArgument(4), pEnd = entry->getArgument(5), cBase = entry->getArgument(6);
  auto cidx = [&](int64_t v) -> Value { return b.create<arith::ConstantIndexOp>(loc, v); };
  auto vec = VectorType::get({16}, f32);
  Value zeroVec = b.create<arith::ConstantOp>(loc, vec, DenseElementsAttr::get(vec, 0.0f));
  Value M = b.create<memref::DimOp>(loc, A, 0);

  // Software prefetch pays off when the packed weight does not fit in the L2 cache.
  bool prefetch = packedRows(n, k) * kPanel * 4 > (int64_t(1) << 20);
  Value lastRow = b.create<arith::SubIOp>(loc, b.create<memref::DimOp>(loc, P, 0), cidx(1));
  // One R x 64 tile at rows [m0, m0 + R) of panel p.
  auto tile = [&](int64_t R, Value m0, Value p) {
    SmallVector<Value> init(R * 4, zeroVec);
    Value pk = b.create<arith::MulIOp>(loc, p, cidx(k));
    auto loop = b.create<scf::ForOp>(loc, cidx(0), cidx(k), cidx(1), init);
    {
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(loop.getBody());
      Value kv = loop.getInductionVar();
      Value prow = b.create<arith::AddIOp>(loc, pk, kv);
      if (prefetch) {
        // The panel two ahead, same k: streamed from memory when W is larger than the caches
        // (the vocabulary projection). Rows past the end are clamped to the last one.
        Value ahead = b.create<arith::MinSIOp>(loc, b.create<arith::AddIOp>(loc, prow, cidx(2 * k)), lastRow);
        b.create<memref::PrefetchOp>(loc, P, ValueRange{ahead, cidx(0)}, /*isWrite=*/false, /*localityHint=*/3,
                                     /*isDataCache=*/true);
      }
      SmallVector<Value> bv;
      for (int64_t j = 0; j < 4; ++j)
        bv.push_back(b.create<vector::LoadOp>(loc, vec, P, ValueRange{prow, cidx(16 * j)}));
      SmallVector<Value> next;
      for (int64_t r = 0; r < R; ++r) {
        Value a = b.create<memref::LoadOp>(loc, A, ValueRange{b.create<arith::AddIOp>(loc, m0, cidx(r)), kv});
        Value av = b.create<vector::BroadcastOp>(loc, vec, a);
        for (int64_t j = 0; j < 4; ++j)
          next.push_back(b.create<vector::FMAOp>(loc, av, bv[j], loop.getRegionIterArgs()[r * 4 + j]));
      }
      b.create<scf::YieldOp>(loc, next);
    }
    Value colW = b.create<arith::MulIOp>(loc, p, cidx(kPanel));
    Value colC = b.create<arith::MulIOp>(loc, b.create<arith::SubIOp>(loc, p, cBase), cidx(kPanel));
    for (int64_t j = 0; j < 4; ++j) {
      Value col = b.create<arith::AddIOp>(loc, colW, cidx(16 * j));
      Value valid = b.create<arith::SubIOp>(loc, cidx(n), col);
      Value mask = b.create<vector::CreateMaskOp>(loc, VectorType::get({16}, b.getI1Type()), ValueRange{valid});
      Value biasVec = withBias ? Value(b.create<vector::MaskedLoadOp>(loc, vec, bias, ValueRange{col}, mask, zeroVec))
                               : zeroVec;
      Value outCol = b.create<arith::AddIOp>(loc, colC, cidx(16 * j));
      for (int64_t r = 0; r < R; ++r) {
        Value v = b.create<arith::AddFOp>(loc, loop.getResult(r * 4 + j), biasVec);
        b.create<vector::MaskedStoreOp>(loc, C, ValueRange{b.create<arith::AddIOp>(loc, m0, cidx(r)), outCol}, mask, v);
      }
    }
  };

  auto panels = b.create<scf::ForOp>(loc, pBegin, pEnd, cidx(1));
  {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(panels.getBody());
    Value p = panels.getInductionVar();
    auto rows = b.create<scf::ForOp>(loc, cidx(0), M, cidx(5));
    b.setInsertionPointToStart(rows.getBody());
    Value m0 = rows.getInductionVar();
    Value rest = b.create<arith::SubIOp>(loc, M, m0);
    Value full = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, rest, cidx(5));
    auto branch = b.create<scf::IfOp>(loc, full, /*withElse=*/true);
    b.setInsertionPointToStart(branch.thenBlock());
    tile(5, m0, p);
    b.setInsertionPointToStart(branch.elseBlock());
    auto single = b.create<scf::ForOp>(loc, cidx(0), rest, cidx(1));
    b.setInsertionPointToStart(single.getBody());
    tile(1, b.create<arith::AddIOp>(loc, m0, single.getInductionVar()), p);
  }
  b.create<func::ReturnOp>(loc);
  return fn;
}

func::FuncOp getOrCreateGemmTask(ModuleOp module, int64_t n, int64_t k, bool withBias) {
  std::string name = "lm_gemm_task_" + std::to_string(n) + "x" + std::to_string(k) + (withBias ? "_bias" : "");
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  func::FuncOp gemm = getOrCreateGemm(module, n, k, withBias);
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  b.setInsertionPointToEnd(module.getBody());
  Location loc = b.getUnknownLoc();
  auto ptr = LLVM::LLVMPointerType::get(ctx);
  Type i64 = b.getI64Type();
  auto fn = b.create<func::FuncOp>(loc, name, b.getFunctionType({ptr, i64, i64}, {}));
  fn.setPrivate();
  Block *entry = fn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto slot = [&](int64_t i) -> Value {
    Value at = b.create<LLVM::GEPOp>(loc, ptr, i64, entry->getArgument(0), ArrayRef<LLVM::GEPArg>{i});
    return b.create<LLVM::LoadOp>(loc, i64, at);
  };
  auto c64 = [&](int64_t v) -> Value { return b.create<LLVM::ConstantOp>(loc, i64, b.getI64IntegerAttr(v)); };
  // A memref descriptor {allocated, aligned, offset 0, sizes, strides} viewed as `type`.
  auto descriptor = [&](Value address, ArrayRef<Value> sizes, ArrayRef<Value> strides, Type type) -> Value {
    int64_t rank = sizes.size();
    auto array = LLVM::LLVMArrayType::get(i64, rank);
    auto structType = LLVM::LLVMStructType::getLiteral(ctx, {ptr, ptr, i64, array, array});
    Value p = b.create<LLVM::IntToPtrOp>(loc, ptr, address);
    Value d = b.create<LLVM::UndefOp>(loc, structType);
    d = b.create<LLVM::InsertValueOp>(loc, d, p, ArrayRef<int64_t>{0});
    d = b.create<LLVM::InsertValueOp>(loc, d, p, ArrayRef<int64_t>{1});
    d = b.create<LLVM::InsertValueOp>(loc, d, c64(0), ArrayRef<int64_t>{2});
    for (int64_t i = 0; i < rank; ++i) {
      d = b.create<LLVM::InsertValueOp>(loc, d, sizes[i], ArrayRef<int64_t>{3, i});
      d = b.create<LLVM::InsertValueOp>(loc, d, strides[i], ArrayRef<int64_t>{4, i});
    }
    return b.create<UnrealizedConversionCastOp>(loc, type, d).getResult(0);
  };
  auto types = gemm.getArgumentTypes();
  Value M = slot(1), cols = slot(6);
  Value A = descriptor(slot(0), {M, c64(k)}, {c64(k), c64(1)}, types[0]);
  Value P = descriptor(slot(2), {slot(3), c64(kPanel)}, {c64(kPanel), c64(1)}, types[1]);
  Value bias = descriptor(slot(4), {c64(n)}, {c64(1)}, types[2]);
  Value C = descriptor(slot(5), {M, cols}, {cols, c64(1)}, types[3]);
  // Pieces [begin, end) count from panel slot(7), which is C's column 0.
  Value first = slot(7);
  Value begin = b.create<arith::IndexCastOp>(loc, b.getIndexType(),
                                             b.create<LLVM::AddOp>(loc, i64, first, entry->getArgument(1)));
  Value end = b.create<arith::IndexCastOp>(loc, b.getIndexType(),
                                           b.create<LLVM::AddOp>(loc, i64, first, entry->getArgument(2)));
  Value base = b.create<arith::IndexCastOp>(loc, b.getIndexType(), first);
  b.create<func::CallOp>(loc, gemm, ValueRange{A, P, bias, C, begin, end, base});
  b.create<func::ReturnOp>(loc);
  return fn;
}

OwningOpRef<ModuleOp> buildGemmModule(MLIRContext &context, const std::vector<std::pair<int64_t, int64_t>> &shapes) {
  context.loadDialect<arith::ArithDialect, func::FuncDialect, memref::MemRefDialect, scf::SCFDialect,
                      vector::VectorDialect>();
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  int64_t dyn = ShapedType::kDynamic;
  Type f32 = b.getF32Type();
  for (auto [n, k] : shapes) {
    func::FuncOp gemm = getOrCreateGemm(*module, n, k, /*withBias=*/false);
    std::string suffix = std::to_string(n) + "x" + std::to_string(k);
    auto pDyn = MemRefType::get({dyn, kPanel}, f32);
    b.setInsertionPointToEnd(module->getBody());
    auto pack = b.create<func::FuncOp>(loc, "lm_bench_pack_" + suffix,
                                       b.getFunctionType({MemRefType::get({n, k}, f32), pDyn}, {}));
    pack->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    b.setInsertionPointToStart(pack.addEntryBlock());
    emitPack(b, loc, pack.getArgument(0), pack.getArgument(1), n, k);
    b.create<func::ReturnOp>(loc);
    b.setInsertionPointToEnd(module->getBody());
    auto run = b.create<func::FuncOp>(
        loc, "lm_bench_gemm_" + suffix,
        b.getFunctionType({MemRefType::get({dyn, k}, f32), pDyn, MemRefType::get({dyn, dyn}, f32)}, {}));
    run->setAttr("llvm.emit_c_interface", b.getUnitAttr());
    b.setInsertionPointToStart(run.addEntryBlock());
    auto pType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[1]);
    auto biasType = llvm::cast<MemRefType>(gemm.getArgumentTypes()[2]);
    Value p = b.create<memref::CastOp>(loc, pType, run.getArgument(1));
    Value unused = b.create<memref::AllocaOp>(loc, MemRefType::get({1}, f32));
    Value bias = b.create<memref::CastOp>(loc, biasType, unused);
    Value zero = b.create<arith::ConstantIndexOp>(loc, 0);
    Value panels = b.create<arith::ConstantIndexOp>(loc, (n + kPanel - 1) / kPanel);
    b.create<func::CallOp>(loc, gemm, ValueRange{run.getArgument(0), p, bias, run.getArgument(2), zero, panels, zero});
    b.create<func::ReturnOp>(loc);
  }
  return module;
}

} // namespace lmcc::codegen
