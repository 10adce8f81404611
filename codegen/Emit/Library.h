//===- Library.h - AOT: spec -> lib<name>.so + <name>.h ----------------------===//
#pragma once

#include "frontend/Spec.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <set>
#include <string>

namespace lmcc::codegen {

struct LibraryOptions {
  std::string outputDir;
  std::string weightsPath;   ///< validated at compile time when set; required with embedWeights
  bool embedWeights = false; ///< bake the weights into the library (`_load(NULL, ...)`)
  bool staticArchive = false;
  std::string cpu;           ///< empty = host
  std::string runtimeDir;    ///< where liblmrt.so and lmrt.h are (build/lib or the install's lib)
  std::string dumpDir;       ///< when set, writes the IR after every pass and lowering step there
  bool naive = false;        ///< run no optimization pass
  std::string gemm = "generated"; ///< "generated" (load-time packed, vector microkernel) or "eigen" (runtime call)
  std::set<std::string> disabledPasses; ///< pass flags to drop from the default pipeline
};

/// Builds the model's lm IR and runs the optimization pipeline `options` asks for
/// (dumping after every pass when options.dumpDir is set). Returns null with the
/// diagnostics in *error on failure.
mlir::OwningOpRef<mlir::ModuleOp> buildOptimizedModule(mlir::MLIRContext &context, const ModelSpec &spec,
                                                       const LibraryOptions &options, std::string *error);

/// Compiles `spec` into outputDir: lib<name>.so (+ lib<name>.a), <name>.h and a copy
/// of liblmrt.so found through RUNPATH $ORIGIN. Returns "" or an error message.
std::string compileLibrary(const ModelSpec &spec, const LibraryOptions &options);

} // namespace lmcc::codegen
