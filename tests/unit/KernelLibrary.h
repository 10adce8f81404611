// A unit test's generated kernels as a shared library: a module lowered to LLVM, emitted for this host, linked
// into a per-process temporary directory and loaded. Shared by the kernel tests (GemmTest, AttentionStreamTest).
#ifndef LMCC_TESTS_UNIT_KERNELLIBRARY_H
#define LMCC_TESTS_UNIT_KERNELLIBRARY_H

#include "codegen/Emit/Object.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

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

  /// A memref<?xf32> descriptor (the C interface of the kernels).
  struct Buffer1D {
    float *allocated, *aligned;
    int64_t offset, size, stride;
  };
  /// Kernel `name`, a function (memref<?xf32> in, memref<?xf32> out), on x: its out, as long as x (NaN where the
  /// kernel wrote nothing; a gtest failure when the kernel is missing).
  std::vector<float> runOnVector(const std::string &name, std::vector<float> x) const {
    auto kernel = symbol<void (*)(Buffer1D *, Buffer1D *)>(name);
    EXPECT_NE(kernel, nullptr) << name;
    std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
    Buffer1D in{x.data(), x.data(), 0, int64_t(x.size()), 1}, out{y.data(), y.data(), 0, int64_t(y.size()), 1};
    if (kernel)
      kernel(&in, &out);
    return y;
  }
};

/// A fixture whose kernels, written with the builder into one module by `add` (the arith, func, math, memref, scf,
/// vector and LLVM dialects loaded), are built into one library (call under ASSERT_NO_FATAL_FAILURE in SetUp).
class KernelTest : public ::testing::Test {
protected:
  void buildKernels(const std::string &name, const std::function<void(mlir::OpBuilder &, mlir::ModuleOp)> &add) {
    context.loadDialect<mlir::arith::ArithDialect, mlir::func::FuncDialect, mlir::math::MathDialect,
                        mlir::memref::MemRefDialect, mlir::scf::SCFDialect, mlir::vector::VectorDialect,
                        mlir::LLVM::LLVMDialect>();
    mlir::OpBuilder b(&context);
    module = mlir::ModuleOp::create(b.getUnknownLoc());
    add(b, *module);
    ASSERT_NO_FATAL_FAILURE(library.build(*module, name));
  }
  mlir::MLIRContext context;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  KernelLibrary library;
};

} // namespace lmcc::test

#endif // LMCC_TESTS_UNIT_KERNELLIBRARY_H
