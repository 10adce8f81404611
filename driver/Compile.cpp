//===- Compile.cpp - The compile pipeline: spec -> lib<name>.so + <name>.h ---===//
//
// frontend (MLIRGen) -> lm IR -> optimization passes -> weight layout -> lm-to-loops
// (codegen/LmToLoops) -> LLVM dialect -> object code; plus a generated C glue file describing the weight layout
// and forwarding the public <name>_* functions to liblmrt; linked with the system C
// compiler driver into a shared library whose RUNPATH is $ORIGIN (it finds the
// liblmrt.so copied beside it) and whose SONAME is its absolute path, so a program
// built with `cc prog.c -I DIR -L DIR -l<name>` records where the library is and
// runs with no environment set (move DIR and relink, or set LD_LIBRARY_PATH).
//
//===----------------------------------------------------------------------===//
#include "driver/Compile.h"
#include "driver/TempDir.h"

#include "codegen/Emit/Facts.h"
#include "codegen/Emit/Header.h"
#include "codegen/Emit/Object.h"
#include "codegen/Layout/WeightLayout.h"
#include "codegen/Passes.h"
#include "dialect/LmDialect.h"
#include "frontend/MLIRGen.h"
#include "passes/Passes.h"
#include "runtime/weights/ModelWeights.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/raw_ostream.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace lmcc::driver {
namespace {

using codegen::shellQuote;

/// Runs a shell command; returns "" or its failure with the captured output.
std::string run(const std::string &command, const fs::path &logFile) {
  int status = std::system((command + " > " + shellQuote(logFile.string()) + " 2>&1").c_str());
  if (status == 0)
    return "";
  std::ifstream log(logFile);
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  return "command failed: " + command + "\n" + text;
}

/// DIR/<name>.pc: `PKG_CONFIG_PATH=DIR pkg-config --cflags --libs <name>`.
std::string packageConfig(const ModelSpec &spec, const fs::path &dir) {
  return "prefix=" + dir.string() + "\nlibdir=${prefix}\nincludedir=${prefix}\n\nName: " + spec.name +
         "\nDescription: lmcc-compiled model " + spec.name + " (family " + toString(spec.family) + ", spec hash " +
         specHash(spec) + ")\nVersion: 1.0.0" +
         "\nLibs: -L${libdir} -l" + spec.name + " -Wl,-rpath,${libdir}\nCflags: -I${includedir}\n";
}

/// DIR/<name>Config.cmake: `find_package(<name>)` with CMAKE_PREFIX_PATH (or <name>_DIR) = DIR gives the
/// imported target <name>::<name>.
std::string cmakeConfig(const ModelSpec &spec) {
  const std::string &n = spec.name;
  return "# lmcc-compiled model " + n + " (spec hash " + specHash(spec) + "): find_package(" + n +
         ") defines " + n + "::" + n + ".\nget_filename_component(_" + n +
         "_dir \"${CMAKE_CURRENT_LIST_DIR}\" ABSOLUTE)\nif(NOT TARGET " + n + "::" + n + ")\n  add_library(" + n +
         "::" + n + " SHARED IMPORTED)\n  set_target_properties(" + n + "::" + n +
         " PROPERTIES\n    IMPORTED_LOCATION \"${_" + n + "_dir}/lib" + n +
         ".so\"\n    INTERFACE_INCLUDE_DIRECTORIES \"${_" + n + "_dir}\")\nendif()\nset(" + n +
         "_FOUND TRUE)\n";
}

bool writeFile(const fs::path &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  return bool(out);
}

template <typename Op> bool dump(const std::string &dir, const char *name, Op op) {
  if (dir.empty())
    return true;
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  return writeFile(fs::path(dir) / name, text);
}

} // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildOptimizedModule(mlir::MLIRContext &context, const ModelSpec &spec,
                                                       const LibraryOptions &options, std::string *error) {
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModule(context, spec, options.train);
  if (!module) {
    *error = "internal error: the lm IR does not verify";
    return nullptr;
  }
  if (!options.dumpDir.empty()) {
    std::error_code ec;
    fs::create_directories(options.dumpDir, ec);
    if (ec || !fs::is_directory(options.dumpDir)) {
      *error = "--dump-ir " + options.dumpDir + ": cannot create the directory" +
               (ec ? ": " + ec.message() : std::string(" (a file of that name exists)"));
      return nullptr;
    }
  }
  int step = 0;
  auto stepName = [&](const std::string &what) {
    char prefix[8];
    std::snprintf(prefix, sizeof prefix, "%02d-", step++);
    return std::string(prefix) + what + ".mlir";
  };
  dump(options.dumpDir, stepName("lm").c_str(), *module);
  // The passes of `flags` but those disabled, one pass manager each (`add` given the others as disabled), each
  // result dumped; false (with *error) when one fails.
  auto runPipeline = [&](const std::vector<std::string> &flags,
                         void (*add)(mlir::OpPassManager &, const std::set<std::string> &)) {
    for (const std::string &flag : flags) {
      if (options.disabledPasses.count(flag))
        continue;
      std::set<std::string> others;
      for (const std::string &f : flags)
        if (f != flag)
          others.insert(f);
      mlir::PassManager pm(&context);
      add(pm, others);
      if (mlir::failed(pm.run(*module))) {
        *error = "pass " + flag + " failed";
        return false;
      }
      dump(options.dumpDir, stepName(flag).c_str(), *module);
    }
    return true;
  };
  // Training: differentiate the loss as the optimization passes left it (none with --naive), then (after the
  // attention re-fusion below) the training pipeline's passes.
  auto differentiate = [&]() -> mlir::OwningOpRef<mlir::ModuleOp> {
    if (!options.train)
      return std::move(module);
    mlir::PassManager pm(&context);
    pm.addPass(createLmAutodiff());
    if (mlir::failed(pm.run(*module))) {
      *error = "pass lm-autodiff failed";
      return nullptr;
    }
    dump(options.dumpDir, stepName("lm-autodiff").c_str(), *module);
    // [train] attention_dropout kept the loss's attention decomposed; lm-autodiff took the evaluating `loss`
    // entry's dropouts out, so validation gets the fused attention back (loss_grad's dropouts still stop it).
    if (spec.train.attentionDropout > 0 && !options.naive && !options.disabledPasses.count("lm-fuse-attention")) {
      mlir::PassManager refuse(&context);
      refuse.addPass(createLmFuseAttention());
      if (mlir::failed(refuse.run(*module))) {
        *error = "pass lm-fuse-attention failed after lm-autodiff";
        return nullptr;
      }
      dump(options.dumpDir, stepName("lm-fuse-attention").c_str(), *module);
    }
    if (!options.naive && !runPipeline(trainingPipeline(), addTrainingPasses))
      return nullptr;
    return std::move(module);
  };
  if (!options.naive && !runPipeline(defaultPipeline(), addOptimizationPasses))
    return nullptr;
  return differentiate();
}

namespace {
/// LLVM is not exception-safe: a std::bad_alloc thrown inside its passes unwound through the objects they were
/// updating (under ulimit -v, a crash in ~ScalarEvolution), its own allocation failures abort, and MLIR creates
/// operations with an unchecked malloc (a null dereference: lmcc's malloc covers that, tools/lmcc/OutOfMemory.cpp).
/// While a library compiles, running out of memory ends the process instead: a message, the temporary directories
/// removed, exit status 5 (lmcc's "out of memory").
std::atomic<int> compiling{0}; ///< live CompileOutOfMemory objects (compilingLibrary)

class CompileOutOfMemory {
public:
  CompileOutOfMemory() : previous_(std::set_new_handler(&exit)) {
    llvm::install_bad_alloc_error_handler([](void *, const char *, bool) { exit(); });
    // A thread LLVM or MLIR could not start (its stack not mapped: pthread_create's EAGAIN under ulimit -v) is a
    // fatal error to LLVM, which aborted; it is running out of memory here. Other fatal errors say what they
    // said before, then LLVM exits or aborts as before.
    llvm::install_fatal_error_handler([](void *, const char *reason, bool) {
      if (std::strstr(reason, "pthread_create failed"))
        exit();
      llvm::errs() << "LLVM ERROR: " << reason << "\n";
    });
    ++compiling;
  }
  ~CompileOutOfMemory() {
    --compiling;
    llvm::remove_fatal_error_handler();
    llvm::remove_bad_alloc_error_handler();
    std::set_new_handler(previous_);
  }
  CompileOutOfMemory(const CompileOutOfMemory &) = delete;
  CompileOutOfMemory &operator=(const CompileOutOfMemory &) = delete;

private:
  [[noreturn]] static void exit() { exitCompileOutOfMemory(); }
  std::new_handler previous_;
};
} // namespace

bool compilingLibrary() { return compiling.load(std::memory_order_relaxed) > 0; }

void exitCompileOutOfMemory() { exitOutOfMemory("lmcc: error: out of memory while compiling the library"); }

std::string compileLibrary(const ModelSpec &spec, const LibraryOptions &options, CompileReport *report) {
  const CompileOutOfMemory outOfMemory;
  if (spec.family == Family::Diformer && options.train &&
      (spec.train.dropout > 0 || spec.train.attentionDropout > 0 || spec.train.labelSmoothing > 0))
    return "family \"diformer\": the directional objective has no dropout and no label smoothing (as the "
           "reference executor); set [train] dropout, attention_dropout and label_smoothing to 0";
  if (options.train && !spec.mlm)
    return "[head] mlm = false: an encoder-only model has no output head to train (training needs mlm = true)";

  // -o DIR creates at most DIR itself. Everything is built in a temporary directory beside DIR (inside it
  // when the parent is not writable), removed on every exit path, and moved into DIR file by file at the end.
  std::error_code ec;
  fs::path out = fs::path(options.outputDir).lexically_normal();
  if (out.has_filename() == false && out.has_parent_path())
    out = out.parent_path();
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::exists(out)) {
    if (!fs::is_directory(parent))
      return options.outputDir + ": the parent directory " + parent.string() +
             " does not exist (-o creates only the last level)";
    if (!fs::create_directory(out, ec) && ec)
      return options.outputDir + ": cannot create: " + ec.message();
  } else if (!fs::is_directory(out)) {
    return options.outputDir + ": exists and is not a directory";
  }
  // A compile killed with SIGKILL (no handler runs) leaves its .lmcc-build-<name>-<pid>; swept here once that
  // process is gone (kill(pid, 0) fails with ESRCH), so that such leftovers do not accumulate.
  const std::string workPrefix = ".lmcc-build-" + spec.name + "-";
  for (const fs::path &where : {parent, out}) {
    std::error_code it;
    for (const auto &e : fs::directory_iterator(where, it)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(workPrefix, 0) != 0 || n.size() == workPrefix.size() ||
          n.find_first_not_of("0123456789", workPrefix.size()) != std::string::npos)
        continue;
      const long pid = std::strtol(n.c_str() + workPrefix.size(), nullptr, 10);
      if (pid > 0 && pid != long(::getpid()) && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH)
        fs::remove_all(e.path(), ec);
    }
  }
  std::unique_ptr<TempDir> workDir;
  const std::string workName = workPrefix + std::to_string(::getpid());
  for (const fs::path &where : {parent, out}) {
    try {
      workDir = std::make_unique<TempDir>(where / workName);
      break;
    } catch (const fs::filesystem_error &) {
    }
  }
  if (!workDir)
    return options.outputDir + ": cannot create a temporary build directory beside or inside it";
  const fs::path work = workDir->path();

  // Weights: validated now when given; flattened into the kernel layout when embedded.
  // IR: lm -> loops -> LLVM dialect -> object.
  mlir::MLIRContext context;
  std::string diagnostics;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    diagnostics += d.str() + "\n";
    return mlir::success();
  });
  std::string error;
  mlir::OwningOpRef<mlir::ModuleOp> lm = buildOptimizedModule(context, spec, options, &error);
  if (!lm)
    return error + "\n" + diagnostics;
  if (options.gemm != "generated" && options.gemm != "eigen")
    return "--gemm " + options.gemm + ": expected generated or eigen";
  if (options.weightsDtype != "f32" && options.weightsDtype != "bf16")
    return "--weights-dtype " + options.weightsDtype + ": expected f32 or bf16";
  const bool bf16 = options.weightsDtype == "bf16";
  if (bf16 && options.gemm != "generated")
    return "--weights-dtype bf16 needs --gemm generated (the Eigen GEMM reads fp32 weights)";
  const bool diformer = spec.family == Family::Diformer; // scores source/target pairs; no embed entry
  for (const char *entry : {"score", "embed"})
    if (!lm->lookupSymbol<mlir::func::FuncOp>(entry) && (spec.mlm || std::string(entry) != "score") &&
        !(diformer && std::string(entry) == "embed"))
      return std::string("internal error: the lm module has no @") + entry + " entry point";
  if (report)
    report->stats = codegen::countStats(*lm, options.statsN > 0 ? options.statsN : 1);
  // The one weight layout: the lowering, the glue and the embedded weights read it.
  codegen::WeightLayout layout = codegen::computeWeightLayout(*lm, options.gemm == "generated", bf16);
  mlir::FailureOr<codegen::ModelFacts> facts = codegen::readModelFacts(*lm);
  if (mlir::failed(facts))
    return "internal error: the lm IR does not describe the model\n" + diagnostics;
  const std::vector<codegen::LayoutTensor> tensors = layout.loadedTensors();
  const std::vector<int64_t> offsets = layout.loadedOffsets();
  // The target's bf16 GEMM: AMX tiles where it has them (their rounded input copies count in the memory model).
  const codegen::Bf16Kernel bf16Kernel = codegen::targetBf16Kernel(options.cpu);
  const bool amx = bf16Kernel == codegen::Bf16Kernel::Amx;
  // (The Diformer's pair scoring runs in fixed chunks of pairs: no memory model, no windows.)
  const bool generatedGemm = options.gemm == "generated";
  codegen::MemoryModel scoreMemory = diformer ? codegen::MemoryModel()
                                              : codegen::memoryModel(*lm, "score", spec.dims.maxLen, bf16 && amx,
                                                                     generatedGemm);
  codegen::MemoryModel embedMemory = codegen::memoryModel(*lm, "embed", spec.dims.maxLen, bf16 && amx, generatedGemm);
  facts->scoreSentenceBytes = std::move(scoreMemory.perSentence), facts->scoreCopyBytes = std::move(scoreMemory.perCopy);
  facts->embedSentenceBytes = std::move(embedMemory.perSentence), facts->embedCopyBytes = std::move(embedMemory.perCopy);
  facts->scoreThreadBytes = std::move(scoreMemory.perThread), facts->embedThreadBytes = std::move(embedMemory.perThread);
  if (options.train) {
    const TrainOptions &t = spec.train;
    codegen::ModelFacts::Train train;
    train.optimizer = t.optimizer == OptimizerKind::AdamW ? 0 : t.optimizer == OptimizerKind::Adam ? 1 : 2;
    train.schedule = t.schedule == Schedule::Linear ? 0 : t.schedule == Schedule::Constant ? 1 : 2;
    train.lr = t.lr, train.beta1 = t.beta1, train.beta2 = t.beta2, train.eps = t.eps;
    train.weightDecay = t.weightDecay, train.clipNorm = t.clipNorm, train.labelSmoothing = t.labelSmoothing;
    train.warmupSteps = t.warmupSteps, train.steps = t.steps, train.seed = t.seed;
    for (const codegen::LayoutTensor &tensor : tensors)
      train.numParams += codegen::numelOf(tensor);
    facts->train = train;
  }

  codegen::ObjectOptions objectOptions;
  objectOptions.cpu = options.cpu;
  if (!options.weightsPath.empty()) {
    WeightSet weights = loadModelWeights(options.weightsPath, spec); // throws WeightError
    if (options.embedWeights) {
      std::vector<float> flat(layout.totalFloats, 0.0f);
      for (size_t i = 0; i < tensors.size(); ++i) {
        const Tensor &t = weights.get(tensors[i].name);
        std::copy(t.data.begin(), t.data.end(), flat.begin() + offsets[i]);
      }
      fs::path bin = work / "weights.bin";
      std::ofstream f(bin, std::ios::binary);
      f.write(reinterpret_cast<const char *>(flat.data()), std::streamsize(flat.size() * sizeof(float)));
      if (!f)
        return bin.string() + ": cannot write";
      objectOptions.embeddedWeightsFile = fs::absolute(bin).string();
      objectOptions.embeddedSymbol = spec.name + "_embedded_weights";
    }
  } else if (options.embedWeights) {
    return "--embed-weights needs --weights";
  }

  // lm -> loops (lm-to-loops, with this layout) -> LLVM dialect -> object.
  LmToLoopsOptions lowering;
  lowering.gemm = options.gemm;
  lowering.vectorBits = codegen::targetVectorBits(options.cpu);
  lowering.weightsDtype = options.weightsDtype;
  lowering.bf16Dot = amx ? "amx" : bf16Kernel == codegen::Bf16Kernel::Dot ? "yes" : "no";
  // A named CPU's L1 is unknown here unless stated: its tile for every weight.
  lowering.l1Ways = options.l1Ways ? options.l1Ways : options.cpu.empty() ? 0 : -1;
  lowering.halfBlocks = codegen::targetSplitsWideVectors(options.cpu) ? "yes" : "no";
  facts->amx = bf16 && amx; // the loader asks the OS for AMX tile state
  mlir::PassManager pm(&context);
  pm.addPass(createLmToLoops(lowering, layout));
  if (mlir::failed(pm.run(*lm)))
    return "cannot lower the model to loops:\n" + diagnostics;
  dump(options.dumpDir, "90-loops.mlir", *lm);
  if (mlir::failed(codegen::lowerToLLVMDialect(*lm)))
    return "cannot lower the kernels to the LLVM dialect:\n" + diagnostics;
  dump(options.dumpDir, "91-llvm.mlir", *lm);
  fs::path kernels = work / "kernels.o";
  // Only what the glue calls leaves the object: the kernels' names (fold_0, lm_gemm_*) are the same in every model,
  // and exported ones made a second model in one process run the first-loaded one's constant folds, and two models'
  // static archives fail to link together (tests/cli/compile.test).
  objectOptions.exportPrefix = "_mlir_ciface_" + spec.name + "_";
  if (std::string err = codegen::emitObject(*lm, kernels.string(), objectOptions); !err.empty())
    return err;

  // Glue + link.
  fs::path runtimeDir(options.runtimeDir);
  for (const char *file : {"liblmrt.so", "lmrt.h"})
    if (!fs::exists(runtimeDir / file))
      return "runtime file " + (runtimeDir / file).string() + " not found";
  fs::copy_file(runtimeDir / "lmrt.h", work / "lmrt.h", fs::copy_options::overwrite_existing, ec);
  if (!ec)
    fs::copy_file(runtimeDir / "liblmrt.so", work / "liblmrt.so", fs::copy_options::overwrite_existing, ec);
  if (ec)
    return "cannot copy the runtime into " + work.string() + ": " + ec.message();
  fs::path glue = work / "glue.c";
  if (!writeFile(glue, codegen::generateGlue(*facts, tensors, offsets, layout.totalFloats, options.embedWeights)))
    return glue.string() + ": cannot write";
  const std::string cc = codegen::cCompiler();
  fs::path glueObj = work / "glue.o", log = work / "log.txt";
  if (std::string err = run(cc + " -std=c99 -O2 -fPIC -c " + shellQuote(glue.string()) + " -I " +
                                shellQuote(work.string()) + " -o " + shellQuote(glueObj.string()),
                            log);
      !err.empty())
    return err;
  const std::string lib = "lib" + spec.name + ".so", header = spec.name + ".h";
  const fs::path absOut = fs::absolute(out).lexically_normal();
  if (std::string err = run(
          cc + " -shared -o " + shellQuote((work / lib).string()) + " " + shellQuote(kernels.string()) + " " +
              shellQuote(glueObj.string()) + " " + shellQuote((work / "liblmrt.so").string()) +
              // liblmrt by path (its SONAME goes into DT_NEEDED), no -L into the build directory:
              // -lm must find the system's libm even when the model is named m.
              " -lm -Wl,-soname," + shellQuote((absOut / lib).string()) + " '-Wl,-rpath,$ORIGIN' -Wl,--no-undefined",
          log);
      !err.empty())
    return err;
  std::vector<std::string> files = {"liblmrt.so"}; // moved into DIR in this order, the header last
  if (options.staticArchive) {
    std::string archive = "lib" + spec.name + ".a";
    if (std::string err = run("ar rcs " + shellQuote((work / archive).string()) + " " + shellQuote(kernels.string()) +
                                  " " + shellQuote(glueObj.string()),
                              log);
        !err.empty())
      return err;
    files.push_back(archive);
  }
  files.push_back(lib);
  const std::string pc = spec.name + ".pc", cmake = spec.name + "Config.cmake";
  if (!writeFile(work / pc, packageConfig(spec, absOut)) || !writeFile(work / cmake, cmakeConfig(spec)))
    return work.string() + ": cannot write the package files";
  files.push_back(pc);
  files.push_back(cmake);
  if (!writeFile(work / header, codegen::generateHeader(*facts, options.embedWeights)))
    return (work / header).string() + ": cannot write";
  // A reader never sees the new library beside the old header: the old header goes first.
  fs::remove(out / header, ec);
  files.push_back(header);
  for (const std::string &file : files) {
    fs::rename(work / file, out / file, ec);
    if (ec)
      return (out / file).string() + ": cannot move into place: " + ec.message();
  }
  return ""; // the TempDir removes the intermediate files
}

} // namespace lmcc::driver
