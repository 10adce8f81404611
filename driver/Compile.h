//===- Compile.h - The compile pipeline: spec -> lib<name>.so + <name>.h -----===//
//
// The driver: the one place that runs frontend -> passes -> codegen -> link. lmcc and the tests call it;
// codegen/ knows nothing of specs or of the optimization passes.
//
#pragma once

#include "codegen/Stats.h"
#include "frontend/Spec.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <set>
#include <string>

namespace lmcc::driver {

struct LibraryOptions {
  std::string outputDir;
  std::string weightsPath;   ///< validated at compile time when set; required with embedWeights
  bool embedWeights = false; ///< bake the weights into the library (`_load(NULL, ...)`)
  bool staticArchive = false;
  std::string cpu;           ///< empty = host
  int64_t l1Ways = 0;        ///< ways of the target's L1 data cache (GemmTile::forDepth); 0: the host's for the host,
                             ///< unknown for a named cpu (its tile for every weight)
  std::string runtimeDir;    ///< where liblmrt.so and lmrt.h are (build/lib or the install's lib)
  std::string dumpDir;       ///< when set, writes the IR after every pass and lowering step there
  bool naive = false;        ///< run no optimization pass
  std::string gemm = "generated"; ///< "generated" (load-time packed, vector microkernel) or "eigen" (runtime call)
  std::string weightsDtype = "f32"; ///< "bf16": the GEMM weights packed as bf16 pairs (generated GEMM only)
  std::set<std::string> disabledPasses; ///< pass flags to drop from the default pipeline
  int64_t statsN = 0;        ///< with a CompileReport: count FLOPs and temporaries for n tokens
  bool train = false;        ///< also compile the training entries `loss` and `loss_grad` (lm-autodiff)
};

/// What compileLibrary measured on the way (the optimized module it compiled).
struct CompileReport {
  std::vector<codegen::EntryStats> stats;
};

/// Builds the model's lm IR and runs the optimization pipeline `options` asks for
/// (dumping after every pass when options.dumpDir is set). Returns null with the
/// diagnostics in *error on failure.
mlir::OwningOpRef<mlir::ModuleOp> buildOptimizedModule(mlir::MLIRContext &context, const ModelSpec &spec,
                                                       const LibraryOptions &options, std::string *error);

/// Compiles `spec` into outputDir: lib<name>.so (+ lib<name>.a), <name>.h and a copy
/// of liblmrt.so found through RUNPATH $ORIGIN. Returns "" or an error message.
/// With `report`, also counts the optimized module's FLOPs and temporaries (--stats) from the same run.
std::string compileLibrary(const ModelSpec &spec, const LibraryOptions &options, CompileReport *report = nullptr);

} // namespace lmcc::driver
