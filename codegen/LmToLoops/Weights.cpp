//===- Weights.cpp - lm-to-loops: weights, stacks, folded tables, init kernel ===//
//
// Every weight is a view at its static offset in the flat weight buffer (codegen/Layout/WeightLayout.h);
// a stack of weights the layout put back to back is one view. lm-fold-constants' tables are computed at
// load time by `<model>_init_kernel`, which also packs the GEMM weights.
//
//===----------------------------------------------------------------------===//
#include "codegen/LmToLoops/Lowering.h"

using namespace mlir;

namespace lmcc::codegen {
namespace {

struct WeightLowering : LmLowering<lm::WeightOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::WeightOp w, Loops &L) const override {
    const WeightLayout::Entry *entry = context.layout->find(w.getName().str());
    if (!entry)
      return w.emitOpError("names a tensor the weight layout does not have: ") << w.getName();
    return L.set(w, L.weightView(entry->offset, w.getType().getShape()));
  }
};

/// Stacked weights: a view when the layout put the operands back to back (it does for every stack whose
/// tensors no earlier stack took), else a copy.
struct ConcatLowering : LmLowering<lm::ConcatOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::ConcatOp c, Loops &L) const override {
    auto t = c.getType();
    int64_t expected = -1, first = -1;
    bool contiguous = true;
    for (const std::string &name : weightNames(c.getResult())) {
      const WeightLayout::Entry *e = context.layout->find(name);
      if (!e || (expected >= 0 && e->offset != expected)) {
        contiguous = false;
        break;
      }
      if (first < 0)
        first = e->offset;
      expected = e->offset + numelOf(e->tensor);
    }
    if (contiguous && first >= 0)
      return L.set(c, L.weightView(first, t.getShape()));
    Value out = L.alloc(t);
    int64_t row = 0;
    for (Value v : c.getInputs()) {
      Value src = L.in(v);
      auto vt = L.typeOf(v);
      L.nest(L.sizes(vt), [&](ValueRange iv) {
        SmallVector<Value> to(iv.begin(), iv.end());
        to[0] = L.b.create<arith::AddIOp>(L.loc, iv[0], L.idx(row));
        L.store(L.load(src, iv), out, to);
      });
      row += vt.getDimSize(0);
    }
    return L.set(c, out);
  }
};

/// out[b, t] = table[t]: the table was computed at load time by the init kernel.
struct FoldedRowsLowering : LmLowering<lm::FoldedRowsOp> {
  using LmLowering::LmLowering;
  LogicalResult lower(lm::FoldedRowsOp f, Loops &L) const override {
    const WeightLayout::Entry *entry = context.layout->find(f.getTable().str());
    if (!entry)
      return f.emitOpError("reads a table the weight layout does not have");
    Value table = L.weightView(entry->offset, entry->tensor.shape);
    Value out = L.alloc(f.getType());
    L.nest(L.sizes(f.getType()), [&](ValueRange iv) { L.store(L.load(table, {iv[1], iv[2]}), out, iv); });
    return L.set(f, out);
  }
};

/// The pack of the [n, k] weights for `tile`: `lm_pack_<n>x<k>_<tile>(weights, from, to)` packs the weight at offset
/// `from` of the flat buffer into its panels at `to` (emitPack). One function per (n, k, tile), never inlined, called
/// once per weight: the init kernel holds one copy of the pack's unrolled transposes per shape, not one per weight
/// (a tiny Diformer's 47 GEMM weights made its init kernel 31% of the library's machine code).
func::FuncOp getOrCreatePack(OpBuilder &b, ModuleOp module, int64_t n, int64_t k, GemmTile tile) {
  return getOrCreateNoInline(
      b, module, "lm_pack_" + std::to_string(n) + "x" + std::to_string(k) + "_" + tile.name(),
      {MemRefType::get({ShapedType::kDynamic}, b.getF32Type()), b.getIndexType(), b.getIndexType()},
      [&](ValueRange args) {
        Location loc = module.getLoc();
        emitPack(b, loc, weightView(b, loc, args[0], args[1], {n, k}),
                 weightView(b, loc, args[0], args[2], {packedRows(n, k, tile.bf16()), kPanel}), n, k, tile);
      });
}

} // namespace

void populateWeightPatterns(TypeConverter &converter, RewritePatternSet &patterns, const LoweringContext &context) {
  patterns.add<WeightLowering, ConcatLowering, FoldedRowsLowering>(converter, patterns.getContext(), context);
}

LogicalResult buildInitKernel(ModuleOp module, const LoweringContext &context, StringRef name, int64_t padId) {
  OpBuilder b(module.getContext());
  Location loc = module.getLoc();
  b.setInsertionPointToEnd(module.getBody());
  auto dyn = ShapedType::kDynamic;
  auto kfn = b.create<func::FuncOp>(loc, (name + "_init_kernel").str(),
                                    b.getFunctionType({MemRefType::get({dyn}, b.getF32Type())}, {}));
  kfn->setAttr("llvm.emit_c_interface", b.getUnitAttr());
  Block *entry = kfn.addEntryBlock();
  b.setInsertionPointToStart(entry);
  Value weights = entry->getArgument(0);
  // Pack every GEMM weight into its panel layout (once per load), before the folds, whose linear layers
  // read the packed form.
  for (const WeightLayout::Entry &p : context.layout->entries) {
    if (p.kind != WeightLayout::Kind::Packed)
      continue;
    const WeightLayout::Entry *src = context.layout->find(p.sources.front());
    func::FuncOp pack = getOrCreatePack(b, module, p.n, p.k, context.tileFor(p.k));
    b.create<func::CallOp>(loc, pack,
                           ValueRange{weights, b.create<arith::ConstantIndexOp>(loc, src->offset),
                                      b.create<arith::ConstantIndexOp>(loc, p.offset)});
  }
  // Every lowered lm.fold function, on one sentence of max_len pad ids: it writes its own table.
  auto *dialect = module.getContext()->getLoadedDialect<lm::LmDialect>();
  for (auto fold : llvm::to_vector(module.getOps<func::FuncOp>())) {
    if (!dialect->getFoldAttrHelper().isAttrPresent(fold))
      continue;
    Value ids = b.create<memref::AllocOp>(loc, MemRefType::get({1, context.maxLen}, b.getI32Type()), ValueRange{},
                                          b.getI64IntegerAttr(64));
    Value pad = b.create<arith::ConstantOp>(loc, b.getI32IntegerAttr(int32_t(padId)));
    Value zero = b.create<arith::ConstantIndexOp>(loc, 0), one = b.create<arith::ConstantIndexOp>(loc, 1);
    auto loop = b.create<scf::ForOp>(loc, zero, b.create<arith::ConstantIndexOp>(loc, context.maxLen), one);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      b.create<memref::StoreOp>(loc, pad, ids, ValueRange{zero, loop.getInductionVar()});
    }
    Value idsDyn = b.create<memref::CastOp>(loc, MemRefType::get({dyn, dyn}, b.getI32Type()), ids);
    b.create<func::CallOp>(loc, fold, ValueRange{weights, idsDyn});
    b.create<memref::DeallocOp>(loc, ids);
  }
  b.create<func::ReturnOp>(loc);
  return success();
}

} // namespace lmcc::codegen
