//===- TempDir.h - A temporary directory removed on every exit path -----------===//
//
// lmcc compile builds into a temporary directory and moves complete files into place; the library cache
// fills a temporary directory and renames it. TempDir removes its directory when it goes out of scope
// (returns, exceptions) and, while it lives, when the process gets SIGINT, SIGTERM or SIGHUP: the handler
// removes every live TempDir (fork + execve of rm -rf, both async-signal-safe), then dies of the signal
// with the default action, so the exit status still says which signal it was.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <filesystem>
#include <string>

namespace lmcc::driver {

class TempDir {
public:
  /// Creates `path` (its parent must exist); throws std::filesystem::filesystem_error on failure.
  explicit TempDir(std::filesystem::path path);
  ~TempDir();
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  const std::filesystem::path &path() const { return path_; }
  /// Keeps the directory (it was renamed into place): nothing is removed.
  void release();

private:
  std::filesystem::path path_;
  int slot_ = -1;
};

/// Writes `message` (and a newline) to stderr, removes every live TempDir and ends the process with exit status
/// 5 (lmcc's "out of memory"), without unwinding: what running out of memory inside LLVM, which is not
/// exception-safe, leaves to do (driver/Compile.cpp).
[[noreturn]] void exitOutOfMemory(const char *message);

/// Whether a library is being compiled (compileLibrary's out-of-memory handling is installed): lmcc's malloc
/// (tools/lmcc/OutOfMemory.cpp) then ends the process with exitCompileOutOfMemory when an allocation fails.
bool compilingLibrary();

/// exitOutOfMemory with compileLibrary's message ("out of memory while compiling the library").
[[noreturn]] void exitCompileOutOfMemory();

} // namespace lmcc::driver
