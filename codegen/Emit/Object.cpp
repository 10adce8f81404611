//===- Object.cpp - Loop-level IR -> LLVM -> object code ----------------------===//
#include "codegen/Emit/Object.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/AMX/AMXToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/OptBisect.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <unistd.h>

using namespace mlir;

namespace lmcc::codegen {

LogicalResult lowerToLLVMDialect(ModuleOp module) {
  // f32 exp, erf, tanh, log... become inline polynomials (MLIR's approximations, about 1-2 ulp)
  // instead of libm calls: vector<16xf32> ones stay vectors (attention), and scalar loops
  // around them become vectorizable by LLVM (GELU, log-softmax).
  RewritePatternSet approximations(module.getContext());
  populateMathPolynomialApproximationPatterns(approximations);
  if (failed(applyPatternsAndFoldGreedily(module, std::move(approximations))))
    return failure();
  // The conversions that work function by function run nested on func.func, so MLIR runs them over the
  // functions on its thread pool (the module-anchored ones, which add declarations, at module level between them).
  PassManager pm(module.getContext());
  OpPassManager &functions = pm.nest<func::FuncOp>();
  functions.addPass(createConvertSCFToCFPass());
  functions.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  ConvertVectorToLLVMPassOptions vectorOptions;
  vectorOptions.amx = true; // the bf16 GEMM's AMX tiles (Gemm.cpp); nothing else uses the AMX dialect
  OpPassManager &vectors = pm.nest<func::FuncOp>();
  vectors.addPass(createConvertVectorToLLVMPass(vectorOptions));
  vectors.addPass(memref::createExpandStridedMetadataPass());
  vectors.addPass(createLowerAffinePass()); // collapse_shape/reinterpret_cast index math
  // Temporaries come from the runtime's per-thread workspace cache (lmrt.h), not malloc.
  FinalizeMemRefToLLVMConversionPassOptions memrefOptions;
  memrefOptions.useGenericFunctions = true;
  pm.addPass(createFinalizeMemRefToLLVMConversionPass(memrefOptions));
  OpPassManager &scalars = pm.nest<func::FuncOp>();
  scalars.addPass(createArithToLLVMConversionPass());
  scalars.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.nest<LLVM::LLVMFuncOp>().addPass(createCanonicalizerPass());
  if (failed(pm.run(module)))
    return failure();
  // vector.store has no alignment attribute in MLIR 19 and lowers with its element's (4 bytes), and LLVM splits
  // under-aligned nontemporal vector stores into scalar ones: lm-to-loops emits nontemporal stores only at
  // vector-aligned addresses (AttentionVector.h), so they get the vector's alignment here.
  module.walk([](LLVM::StoreOp store) {
    if (auto vt = dyn_cast<VectorType>(store.getValue().getType()); vt && store.getNontemporal())
      store.setAlignment(vt.getNumElements() * vt.getElementTypeBitWidth() / 8);
  });
  return success();
}

/// Whether the target CPU (empty = this host) has every one of `features` (LLVM names, e.g. "avx512f").
static bool targetHas(const std::string &cpu, std::initializer_list<const char *> features) {
  if (cpu.empty()) {
    auto host = llvm::sys::getHostCPUFeatures();
    return llvm::all_of(features, [&](const char *f) {
      auto it = host.find(f);
      return it != host.end() && it->second;
    });
  }
  llvm::InitializeNativeTarget();
  std::string triple = llvm::sys::getDefaultTargetTriple(), error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return false;
  std::unique_ptr<llvm::MCSubtargetInfo> info(target->createMCSubtargetInfo(triple, cpu, ""));
  std::string wanted;
  for (const char *f : features)
    wanted += std::string(wanted.empty() ? "+" : ",+") + f;
  return info && info->isCPUStringValid(cpu) && info->checkFeatures(wanted);
}

int64_t targetVectorBits(const std::string &cpu) { return targetHas(cpu, {"avx512f"}) ? 512 : 256; }

bool targetSplitsWideVectors(const std::string &cpu) {
  const std::string name = cpu.empty() ? llvm::sys::getHostCPUName().str() : cpu;
  return targetVectorBits(cpu) == 512 && name == "znver4";
}

bool targetHasBf16Dot(const std::string &cpu) { return targetHas(cpu, {"avx512f", "avx512bf16"}); }

bool targetHasAmx(const std::string &cpu) { return targetHas(cpu, {"avx512f", "avx512bf16", "amx-tile", "amx-bf16"}); }

Bf16Kernel targetBf16Kernel(const std::string &cpu) {
  if (targetHasAmx(cpu))
    return Bf16Kernel::Amx;
  if (!targetHasBf16Dot(cpu))
    return Bf16Kernel::Widen;
  const std::string name = cpu.empty() ? llvm::sys::getHostCPUName().str() : cpu;
  static const char *const halfRate[] = {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                                         "diamondrapids"};
  return llvm::is_contained(halfRate, name) ? Bf16Kernel::Widen : Bf16Kernel::Dot;
}

int64_t hostL1Ways() {
  const long ways = ::sysconf(_SC_LEVEL1_DCACHE_ASSOC);
  return ways > 0 ? ways : 0;
}

namespace {

/// Skips LLVM 19's X86 Domain Reassignment pass (GPR -> AVX-512 mask register closures). Its closure search is
/// superlinear in a function's size (fixed in LLVM 20, llvm/llvm-project#108108): on the naive pipeline's large
/// entry functions it took most of the compile (30 s of 37 s for a 106k-instruction decode entry; the whole
/// naive training library of a tiny Diformer took 9 minutes). Measured on every bundled model, fp32 --train and
/// bf16, the optimized pipeline's object code is the same instruction for instruction with and without the pass
/// (bench/results/2026-12-01-compile-time.md), so skipping it costs nothing there.
class SkipDomainReassignment final : public llvm::OptPassGate {
public:
  bool shouldRunPass(const llvm::StringRef pass, llvm::StringRef) override {
    return pass != "X86 Domain Reassignment Pass" && pass != "x86-domain-reassignment";
  }
  bool isEnabled() const override { return true; }
};

} // namespace

std::string emitObject(ModuleOp module, const std::string &path, const ObjectOptions &options) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::InitializeNativeTargetAsmParser();
  registerBuiltinDialectTranslation(*module.getContext());
  registerLLVMDialectTranslation(*module.getContext());
  registerAMXDialectTranslation(*module.getContext());

  SkipDomainReassignment gate; // outlives the context that refers to it
  llvm::LLVMContext llvmContext;
  llvmContext.setOptPassGate(gate);
  std::unique_ptr<llvm::Module> llvmModule = translateModuleToLLVMIR(module, llvmContext);
  if (!llvmModule)
    return "cannot translate the kernels to LLVM IR";

  std::string triple = llvm::sys::getDefaultTargetTriple();
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return "no LLVM target for " + triple + ": " + error;
  std::string cpu = options.cpu.empty() ? llvm::sys::getHostCPUName().str() : options.cpu;
  std::string features;
  if (options.cpu.empty())
    for (auto &feature : llvm::sys::getHostCPUFeatures())
      features += (features.empty() ? "" : ",") + std::string(feature.second ? "+" : "-") + feature.first().str();
  llvm::TargetOptions targetOptions;
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, cpu, features, targetOptions, llvm::Reloc::PIC_, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!machine)
    return "cannot create a target machine for CPU '" + cpu + "'";
  if (!options.cpu.empty() && !machine->getMCSubtargetInfo()->isCPUStringValid(cpu))
    return "unknown CPU '" + cpu + "' for " + triple + " (try `llc -mcpu=help`)";
  llvmModule->setDataLayout(machine->createDataLayout());
  llvmModule->setTargetTriple(triple);

  // Two models' objects define the same kernel names; internal ones cannot collide (two static archives link into
  // one program) nor be interposed (two shared libraries in one process each run their own), and O3 may inline or
  // drop them.
  if (!options.exportPrefix.empty()) {
    auto internalize = [&](llvm::GlobalValue &value) {
      if (!value.isDeclaration() && !value.getName().starts_with(options.exportPrefix))
        value.setLinkage(llvm::GlobalValue::InternalLinkage);
    };
    for (llvm::Function &fn : *llvmModule)
      internalize(fn);
    for (llvm::GlobalVariable &global : llvmModule->globals())
      internalize(global);
  }

  if (!options.embeddedWeightsFile.empty()) {
    // The weights go into .rodata straight from the file: no 100 MB constant
    // ever passes through LLVM's optimizer.
    const std::string &sym = options.embeddedSymbol;
    llvmModule->appendModuleInlineAsm(".section .rodata\n.globl " + sym + "\n.type " + sym +
                                      ",@object\n.balign 64\n" + sym + ":\n.incbin \"" +
                                      options.embeddedWeightsFile + "\"\n.text\n");
  }

  // O3 over the whole module, tuned for the target.
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder builder(machine.get());
  builder.registerModuleAnalyses(mam);
  builder.registerCGSCCAnalyses(cgam);
  builder.registerFunctionAnalyses(fam);
  builder.registerLoopAnalyses(lam);
  builder.crossRegisterProxies(lam, fam, cgam, mam);
  builder.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(*llvmModule, mam);

  std::error_code ec;
  llvm::raw_fd_ostream out(path, ec, llvm::sys::fs::OF_None);
  if (ec)
    return path + ": " + ec.message();
  llvm::legacy::PassManager codegen;
  if (machine->addPassesToEmitFile(codegen, out, nullptr, llvm::CodeGenFileType::ObjectFile))
    return "the target cannot emit object files";
  codegen.run(*llvmModule);
  out.flush();
  return "";
}

std::string shellQuote(const std::string &s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string cCompiler() {
  const char *cc = std::getenv("CC");
  return cc && *cc ? cc : "cc";
}

std::string emitKernelLibrary(ModuleOp module, const std::string &path) {
  if (failed(lowerToLLVMDialect(module)))
    return "lowering the kernel module to the LLVM dialect failed";
  const std::string object = path + ".o", partial = path + ".tmp";
  if (std::string err = emitObject(module, object, {}); !err.empty())
    return err;
  const std::string cc = cCompiler();
  const int status =
      std::system((cc + " -shared -o " + shellQuote(partial) + " " + shellQuote(object) + " -lm").c_str());
  std::error_code ec;
  std::filesystem::remove(object, ec);
  if (status != 0) {
    std::filesystem::remove(partial, ec);
    return "cannot link " + path + " (" + cc + " -shared failed)";
  }
  std::filesystem::rename(partial, path, ec);
  return ec ? path + ": " + ec.message() : "";
}

} // namespace lmcc::codegen
