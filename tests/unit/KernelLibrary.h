// A unit test's generated kernels as a shared library: a module lowered to LLVM, emitted for this host, linked
// into a per-process temporary directory and loaded. Shared by the kernel tests (GemmTest, AttentionStreamTest).
#ifndef LMCC_TESTS_UNIT_KERNELLIBRARY_H
#define LMCC_TESTS_UNIT_KERNELLIBRARY_H

#include "codegen/Emit/Object.h"

#include "mlir/IR/BuiltinOps.h"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lmcc::test {

struct KernelLibrary {
  void *handle = nullptr;
  std::filesystem::path dir;
  KernelLibrary() = default;
  KernelLibrary(const KernelLibrary &) = delete;
  KernelLibrary &operator=(const KernelLibrary &) = delete;
  ~KernelLibrary() { close(); }

  /// Lowers `module` and loads it as lib<name>.so (gtest assertions: call under ASSERT_NO_FATAL_FAILURE).
  void build(mlir::ModuleOp module, const std::string &name) {
    dir = std::filesystem::temp_directory_path() / ("lmcc-" + name + "-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string library = (dir / ("lib" + name + ".so")).string();
    ASSERT_EQ(lmcc::codegen::emitKernelLibrary(module, library), "");
    handle = ::dlopen(library.c_str(), RTLD_NOW);
    ASSERT_NE(handle, nullptr) << ::dlerror();
  }
  void close() {
    if (handle)
      ::dlclose(handle);
    handle = nullptr;
    if (!dir.empty())
      std::filesystem::remove_all(dir);
    dir.clear();
  }
  /// The C interface of the kernel function `name` (null when missing).
  template <typename Fn> Fn symbol(const std::string &name) const {
    return reinterpret_cast<Fn>(::dlsym(handle, ("_mlir_ciface_" + name).c_str()));
  }
};

} // namespace lmcc::test

#endif // LMCC_TESTS_UNIT_KERNELLIBRARY_H
