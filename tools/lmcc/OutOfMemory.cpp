//===- OutOfMemory.cpp - lmcc's malloc: running out while compiling ends the process cleanly -===//
//
// MLIR allocates every operation with a plain malloc whose result it does not test (mlir::Operation::create):
// under `ulimit -v` a compile that ran out of memory there died of SIGSEGV (tests/cli/out-of-memory.test, 300 MB),
// where running out anywhere else ends with lmcc's "out of memory while compiling the library" (exit 5: the new
// handler and LLVM's bad-alloc handler, driver/Compile.cpp). lmcc's executable therefore defines malloc, calloc and
// realloc over glibc's own (__libc_*): while a library compiles (driver::compilingLibrary), a failed allocation
// ends the process the same way; otherwise the result goes back unchanged. Not under the sanitizers, whose
// runtimes own these symbols.
//
//===----------------------------------------------------------------------===//
#include "driver/TempDir.h"

#include <cstddef>
#include <cstdlib> // glibc's features.h: __GLIBC__

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define LMCC_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LMCC_SANITIZED 1
#endif

#if defined(__GLIBC__) && !defined(LMCC_SANITIZED)
extern "C" {
void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *p, size_t size);
}

namespace {
void *checked(void *p, bool asked) {
  if (!p && asked && lmcc::driver::compilingLibrary())
    lmcc::driver::exitCompileOutOfMemory();
  return p;
}
} // namespace

extern "C" {
void *malloc(size_t size) { return checked(__libc_malloc(size), size != 0); }
void *calloc(size_t count, size_t size) { return checked(__libc_calloc(count, size), count != 0 && size != 0); }
void *realloc(void *p, size_t size) { return checked(__libc_realloc(p, size), size != 0); }
}
#endif
