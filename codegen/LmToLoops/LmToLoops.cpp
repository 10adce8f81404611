//===- LmToLoops.cpp - The lm-to-loops conversion pass ----------------------===//
//
// Dialect conversion of a whole lm module into CPU kernels: a type converter (tensor -> memref), the
// entry-point and lm.fold function signatures, the op patterns of each family (Lowering.h), then the
// init kernel and the deallocation of every buffer after its last use in the block that allocates it.
//
//===----------------------------------------------------------------------===//
#include "codegen/Emit/Object.h"
#include "codegen/LmToLoops/Lowering.h"
#include "codegen/Passes.h"

#include "mlir/IR/Verifier.h"

namespace lmcc {
#define GEN_PASS_DEF_LMTOLOOPS
#include "codegen/Passes.h.inc"
} // namespace lmcc

using namespace mlir;

namespace lmcc::codegen {
namespace {

/// `score` / `embed` -> `<model>_<entry>_kernel(weights, ids, lengths, outputs...)` (results become output
/// buffers the entry's last ops write); an lm.fold function -> `(weights, ids)` writing its table.
struct FuncLowering : OpConversionPattern<func::FuncOp> {
  FuncLowering(TypeConverter &converter, MLIRContext *ctx, std::string model)
      : OpConversionPattern(converter, ctx), model(std::move(model)) {}

  LogicalResult matchAndRewrite(func::FuncOp fn, OpAdaptor, ConversionPatternRewriter &rewriter) const override {
    auto *dialect = getContext()->getLoadedDialect<lm::LmDialect>();
    bool fold = dialect->getFoldAttrHelper().isAttrPresent(fn);
    TypeConverter::SignatureConversion conversion(fn.getNumArguments());
    conversion.addInputs({MemRefType::get({ShapedType::kDynamic}, rewriter.getF32Type())});
    for (auto [i, type] : llvm::enumerate(fn.getArgumentTypes()))
      conversion.addInputs(i, {getTypeConverter()->convertType(type)});
    if (!fold)
      for (Type type : fn.getResultTypes())
        conversion.addInputs({getTypeConverter()->convertType(type)});
    // The training entry with gradients also takes the gradient buffer (the weight buffer's layout).
    auto method = dialect->getMethodAttrHelper().getAttr(fn);
    if (method && (method.getValue() == "loss_grad" || method.getValue() == "pair_loss_grad"))
      conversion.addInputs({MemRefType::get({ShapedType::kDynamic}, rewriter.getF32Type())});
    std::string name = fold ? fn.getSymName().str() : model + "_" + fn.getSymName().str() + "_kernel";
    auto kernel = rewriter.create<func::FuncOp>(fn.getLoc(), name,
                                                rewriter.getFunctionType(conversion.getConvertedTypes(), {}));
    // Loops::outputs() finds the output buffers after the weights and this many inputs.
    kernel->setAttr("lmcc.num_inputs", rewriter.getI64IntegerAttr(fn.getNumArguments()));
    if (fold) {
      kernel.setPrivate();
      dialect->getFoldAttrHelper().setAttr(kernel, rewriter.getUnitAttr());
    } else {
      kernel->setAttr("llvm.emit_c_interface", rewriter.getUnitAttr());
      if (method) // the return and lm.param_grad lowerings read it
        dialect->getMethodAttrHelper().setAttr(kernel, method);
    }
    rewriter.inlineRegionBefore(fn.getBody(), kernel.getBody(), kernel.end());
    rewriter.applySignatureConversion(&kernel.getBody().front(), conversion, getTypeConverter());
    rewriter.eraseOp(fn);
    return success();
  }

  std::string model;
};

/// An entry point's results go to its output arguments (copied unless written there in place). An lm.fold
/// function copies its [1, max_len, W] result into its table in the weight buffer.
struct ReturnLowering : OpConversionPattern<func::ReturnOp> {
  ReturnLowering(TypeConverter &converter, MLIRContext *ctx, const LoweringContext &context)
      : OpConversionPattern(converter, ctx), context(context) {}

  LogicalResult matchAndRewrite(func::ReturnOp ret, OpAdaptor adaptor,
                                ConversionPatternRewriter &rewriter) const override {
    auto fn = ret->getParentOfType<func::FuncOp>();
    auto *dialect = getContext()->getLoadedDialect<lm::LmDialect>();
    if (!dialect->getFoldAttrHelper().isAttrPresent(fn)) {
      // An entry's results are its output arguments: ops that write an output in place (lm.sentence_score,
      // lm.mean_pool) return that argument; any other result was computed into a buffer of its own and is copied.
      Loops L(rewriter, ret, adaptor.getOperands(), context);
      SmallVector<Value> outputs = L.outputs();
      for (auto [k, result] : llvm::enumerate(adaptor.getOperands())) {
        if (result == outputs[k])
          continue;
        auto type = llvm::cast<MemRefType>(result.getType());
        SmallVector<Value> sizes;
        for (int64_t d = 0; d < type.getRank(); ++d)
          sizes.push_back(b(L, result, d));
        L.nest(sizes, [&](ValueRange iv) { L.store(L.load(result, iv), outputs[k], iv); });
      }
    } else {
      const WeightLayout::Entry *entry = context.layout->find(fn.getSymName().str());
      if (!entry)
        return fn.emitOpError("has no table in the weight layout");
      Loops L(rewriter, ret, adaptor.getOperands(), context);
      Value result = adaptor.getOperands()[0];
      Value table = L.weightView(entry->offset, entry->tensor.shape);
      L.nest({L.idx(entry->tensor.shape[0]), L.idx(entry->tensor.shape[1])},
             [&](ValueRange iv) { L.store(L.load(result, {L.idx(0), iv[0], iv[1]}), table, iv); });
    }
    rewriter.replaceOpWithNewOp<func::ReturnOp>(ret);
    return success();
  }

  static Value b(Loops &L, Value buffer, int64_t dim) { return L.b.create<memref::DimOp>(L.loc, buffer, dim); }

  const LoweringContext &context;
};

} // namespace

/// The last op of the allocating block that may touch `buffer`: a use of the buffer or of anything derived
/// from it (views, extracted addresses and the integers and pointers computed from them, not its sizes or the
/// values loaded from it, a memref an address
/// was stored into (the GEMM task's ctx array), the results of a region whose terminator yields one), found
/// through nested regions. Pointers handed to the runtime are integers, so only this closure sees them.
static Operation *lastUser(memref::AllocOp alloc) {
  Block *block = alloc->getBlock();
  Operation *last = alloc;
  SmallVector<Value> work = {alloc.getResult()};
  llvm::DenseSet<Value> seen(work.begin(), work.end());
  auto push = [&](Value v) {
    if (seen.insert(v).second)
      work.push_back(v);
  };
  while (!work.empty()) {
    Value v = work.pop_back_val();
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      Operation *ancestor = block->findAncestorOpInBlock(*user);
      if (!ancestor)
        continue;
      if (last->isBeforeInBlock(ancestor))
        last = ancestor;
      // Sizes and loaded values are data, not the buffer: following them would reach every later loop bound.
      if (!isa<memref::DimOp, memref::LoadOp, vector::LoadOp, vector::TransferReadOp, vector::MaskedLoadOp>(user))
        for (Value r : user->getResults())
          push(r);
      if (auto store = dyn_cast<memref::StoreOp>(user); store && use.getOperandNumber() == 0)
        push(store.getMemref());
      if (user->hasTrait<OpTrait::IsTerminator>() && user->getParentOp())
        for (Value r : user->getParentOp()->getResults())
          push(r);
    }
  }
  return last;
}

/// Frees every buffer right after its last use in the block that allocates it (kernels return nothing, so no
/// buffer escapes): a call's peak is that of its live temporaries, not the sum of all of them, which is what
/// codegen/Stats.h's memory model counts and the runtime's workspace limit relies on.
void deallocateAfterLastUse(ModuleOp module) {
  module.walk([](memref::AllocOp alloc) {
    for (Operation *user : alloc->getUsers())
      if (isa<memref::DeallocOp>(user))
        return;
    Operation *last = lastUser(alloc);
    OpBuilder b(alloc->getContext());
    if (last->hasTrait<OpTrait::IsTerminator>())
      b.setInsertionPoint(last);
    else
      b.setInsertionPointAfter(last);
    b.create<memref::DeallocOp>(alloc.getLoc(), alloc.getResult());
  });
}

namespace {

struct LmToLoopsPass : lmcc::impl::LmToLoopsBase<LmToLoopsPass> {
  using LmToLoopsBase::LmToLoopsBase;
  const WeightLayout *givenLayout = nullptr;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    auto *dialect = ctx->getLoadedDialect<lm::LmDialect>();
    lm::ModelAttr model = dialect ? dialect->getModelAttrHelper().getAttr(module) : lm::ModelAttr();
    if (!model) {
      module.emitError("lm-to-loops needs the module attribute lm.model (set by lmcc's MLIRGen)");
      return signalPassFailure();
    }
    if (gemm != "generated" && gemm != "eigen") {
      module.emitError("lm-to-loops: gemm must be generated or eigen, got ") << gemm;
      return signalPassFailure();
    }
    if ((weightsDtype != "f32" && weightsDtype != "bf16") || (bf16Dot != "amx" && bf16Dot != "yes" && bf16Dot != "no" && bf16Dot != "host")) {
      module.emitError("lm-to-loops: weights-dtype must be f32 or bf16 and bf16-dot amx, yes, no or host");
      return signalPassFailure();
    }
    if (l1Ways < -1 || l1Ways > 64) {
      module.emitError("lm-to-loops: l1-ways must be a number of ways (1 to 64), 0 (this host's) or -1 (unknown), got ")
          << int64_t(l1Ways);
      return signalPassFailure();
    }
    if (halfBlocks != "yes" && halfBlocks != "no" && halfBlocks != "host") {
      module.emitError("lm-to-loops: half-blocks must be yes, no or host, got ") << halfBlocks;
      return signalPassFailure();
    }
    if (vectorBits != 0 && vectorBits != 256 && vectorBits != 512) {
      module.emitError("lm-to-loops: vector-bits must be 512 (AVX-512), 256 (AVX2) or 0 (this host's), got ")
          << int64_t(vectorBits);
      return signalPassFailure();
    }
    bool bf16 = weightsDtype == "bf16";
    if (bf16 && gemm != "generated") {
      module.emitError("lm-to-loops: bf16 weights need the generated GEMM");
      return signalPassFailure();
    }
    WeightLayout computed;
    if (!givenLayout)
      computed = computeWeightLayout(module, gemm == "generated", bf16);
    else if (givenLayout->bf16 != bf16) {
      module.emitError("lm-to-loops: the weight layout's packed dtype differs from weights-dtype");
      return signalPassFailure();
    }
    LoweringContext context;
    context.layout = givenLayout ? givenLayout : &computed;
    context.generatedGemm = gemm == "generated";
    const Bf16Kernel kernel = bf16Dot == "host" ? targetBf16Kernel("")
                              : bf16Dot == "amx" ? Bf16Kernel::Amx
                              : bf16Dot == "yes" ? Bf16Kernel::Dot
                                                 : Bf16Kernel::Widen;
    context.tile = GemmTile::forTarget(vectorBits ? vectorBits : targetVectorBits(""), bf16,
                                       kernel != Bf16Kernel::Widen, kernel == Bf16Kernel::Amx);
    context.l1Ways = l1Ways == 0 ? hostL1Ways() : l1Ways == -1 ? 0 : int64_t(l1Ways);
    context.halfBlocks = halfBlocks == "host" ? targetSplitsWideVectors("") : halfBlocks == "yes";
    context.maxLen = model.getMaxLen();

    // Only the entry points (score, embed, the Diformer's decoding entries and, when built, the training entries)
    // and the folds are compiled.
    for (auto fn : llvm::to_vector(module.getOps<func::FuncOp>())) {
      auto method = dialect->getMethodAttrHelper().getAttr(fn);
      bool kept = method && (method.getValue() == "loss" || method.getValue() == "loss_grad" ||
                             method.getValue() == "pair_loss" || method.getValue() == "pair_loss_grad" ||
                             method.getValue() == "pair_encode" || method.getValue() == "pair_token_kv" ||
                             method.getValue() == "pair_decode" || method.getValue() == "pair_step");
      if (fn.getSymName() != "score" && fn.getSymName() != "embed" && !kept &&
          !dialect->getFoldAttrHelper().isAttrPresent(fn))
        fn.erase();
    }
    // The runtime calls every kernel with its own batch (and length): an argument whose leading dimension is
    // static cannot take it.
    for (auto fn : module.getOps<func::FuncOp>())
      for (auto [i, type] : llvm::enumerate(fn.getArgumentTypes()))
        if (auto t = llvm::dyn_cast<RankedTensorType>(type); t && !t.isDynamicDim(0)) {
          fn.emitError() << "lm-to-loops: argument #" << i << " of @" << fn.getSymName() << " has the type " << t
                         << ", whose leading (batch) dimension is static: kernels run over any batch, so write it `?`";
          return signalPassFailure();
        }
    declareRuntime(module, context);

    TypeConverter converter;
    ConversionTarget target(*ctx);
    configureLowering(converter, target);
    RewritePatternSet patterns(ctx);
    patterns.add<FuncLowering>(converter, ctx, model.getName().str());
    patterns.add<ReturnLowering>(converter, ctx, context);
    populateElementwisePatterns(converter, patterns, context);
    populateAttentionPatterns(converter, patterns, context);
    populateLogprobPatterns(converter, patterns, context);
    populateMaskedBatchPatterns(converter, patterns, context);
    populateRowsPatterns(converter, patterns, context);
    populateGemmPatterns(converter, patterns, context);
    populateWeightPatterns(converter, patterns, context);
    populateBackwardPatterns(converter, patterns, context);
    populateNGramPatterns(converter, patterns, context);
    populateDiformerPatterns(converter, patterns, context);
    if (failed(applyPartialConversion(module, target, std::move(patterns))) || context.missingSizes)
      return signalPassFailure();
    foldCastPairs(module);
    writeGradientsInPlace(module, *context.layout);
    if (failed(buildInitKernel(module, context, model.getName(), model.getPad())))
      return signalPassFailure();
    deallocateAfterLastUse(module);
  }

  /// The runtime functions kernels call, and the generated GEMM of every packed weight (created before the
  /// conversion so that patterns only look them up).
  void declareRuntime(ModuleOp module, const LoweringContext &context) {
    OpBuilder b(module.getBodyRegion());
    Location loc = module.getLoc();
    auto ptr = LLVM::LLVMPointerType::get(b.getContext());
    Type i64 = b.getI64Type();
    b.create<func::FuncOp>(loc, "lm_rt_sgemm_nt", b.getFunctionType({i64, i64, i64, ptr, i64, ptr, i64, ptr, ptr, i64}, {}))
        .setPrivate();
    b.create<func::FuncOp>(loc, "lm_rt_parallel_for", b.getFunctionType({i64, ptr, ptr}, {})).setPrivate();
    b.create<func::FuncOp>(loc, "lm_rt_private_cache_bytes", b.getFunctionType({}, {i64})).setPrivate();
    declareTrainingRuntime(b, loc);
    if (!context.generatedGemm)
      return;
    module.walk([&](Operation *op) {
      Value weight, bias;
      StringRef activation;
      if (auto l = dyn_cast<lm::LinearOp>(op))
        weight = l.getWeight(), bias = l.getBias(),
        activation = kernelActivation(context.tile, l.getActivation().value_or(""));
      else if (auto t = dyn_cast<lm::TokenLogprobOp>(op))
        weight = t.getWeight(), bias = t.getBias();
      else
        return;
      std::vector<std::string> names = weightNames(weight);
      if (names.empty() || !context.layout->find(packKey(names)))
        return;
      auto type = llvm::cast<ShapedType>(weight.getType());
      const GemmTile tile = context.tileFor(type.getDimSize(1));
      getOrCreateGemmTask(module, type.getDimSize(0), type.getDimSize(1), bool(bias), tile, activation);
      if (isa<lm::LinearOp>(op) && tile.weights != GemmTile::Weights::Bf16Amx)
        getOrCreateGemmRowTask(module, type.getDimSize(0), type.getDimSize(1), bool(bias), tile, activation);
    });
  }
};

} // namespace
} // namespace lmcc::codegen

std::unique_ptr<mlir::Pass> lmcc::createLmToLoops(const LmToLoopsOptions &options,
                                                  const codegen::WeightLayout &layout) {
  auto pass = std::make_unique<codegen::LmToLoopsPass>(options);
  pass->givenLayout = &layout;
  return pass;
}
