//===- Cache.h - The compiled-library cache of lmcc score/embed/train ---------===//
//
// $LMCC_CACHE_DIR (else $XDG_CACHE_HOME/lmcc, else ~/.cache/lmcc) holds one directory per compiled library:
//   <name>-<spec hash>-<pipeline tag>-<key>/   lib<name>.so, liblmrt.so, <name>.h, manifest.json
// <key> is a hash of everything else that changes the code: the lmcc binary and the liblmrt.so copied into the
// entry (path, size, mtime), the target CPU's LLVM name and features. manifest.json records the key's parts and a content hash (FNV-1a 64)
// of every file; an entry is used only when its files hash as recorded, and after dlopen only when the
// library's embedded spec hash is the spec's. A damaged entry (truncated, swapped, half-written) is removed
// and rebuilt with a one-line warning; entries are filled in a temporary directory and renamed into place.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "driver/Compile.h"
#include "frontend/Spec.h"

#include <string>

namespace lmcc::cli {

/// The cache directory (not created).
std::string cacheDir();

/// The path of lib<name>.so of a verified cache entry for (spec, options), compiled and filled first when
/// missing or damaged. `options.train == false` also accepts a --train entry (it scores the same way).
/// Throws std::runtime_error when compiling fails.
std::string cachedLibrary(const ModelSpec &spec, driver::LibraryOptions options);

/// Removes the cache entry holding `library` (after a failed post-load check), with a warning.
void discardEntry(const std::string &library, const std::string &why);

/// `lmcc cache list`: one line per entry (name, spec hash, pipeline, MB, ok or the damage); `lmcc cache
/// clean`: removes every entry and temporary. Returns the exit code.
int runCache(const std::string &action);

} // namespace lmcc::cli
