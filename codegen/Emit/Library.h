//===- Library.h - AOT: spec -> lib<name>.so + <name>.h ----------------------===//
#pragma once

#include "frontend/Spec.h"

#include <string>

namespace lmcc::codegen {

struct LibraryOptions {
  std::string outputDir;
  std::string weightsPath;   ///< validated at compile time when set; required with embedWeights
  bool embedWeights = false; ///< bake the weights into the library (`_load(NULL, ...)`)
  bool staticArchive = false;
  std::string cpu;           ///< empty = host
  std::string runtimeDir;    ///< where liblmrt.so and lmrt.h are (build/lib or the install's lib)
  std::string dumpDir;       ///< when set, writes lm.mlir, loops.mlir, llvm.mlir there
};

/// Compiles `spec` into outputDir: lib<name>.so (+ lib<name>.a), <name>.h and a copy
/// of liblmrt.so found through RUNPATH $ORIGIN. Returns "" or an error message.
std::string compileLibrary(const ModelSpec &spec, const LibraryOptions &options);

} // namespace lmcc::codegen
