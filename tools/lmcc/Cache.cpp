//===- Cache.cpp - The compiled-library cache of lmcc score/embed/train -------===//
#include "tools/lmcc/Cache.h"
#include "tools/lmcc/Common.h"

#include "driver/TempDir.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/TargetParser/Host.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <vector>

namespace lmcc::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t fnv(uint64_t h, const char *data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// FNV-1a 64 of a file's bytes; "" when it cannot be read.
std::string fileHash(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return "";
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h = fnv(h, buf.data(), static_cast<size_t>(in.gcount()));
  }
  return in.bad() ? "" : hex(h);
}

/// path:size:mtime (nanoseconds) of a file, "" when it cannot be read.
std::string fileIdentity(const std::string &path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return "";
  return path + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

/// What, besides the spec and the pipeline, changes the compiled code: this lmcc binary, the liblmrt.so an entry
/// gets a copy of (rebuilt alone, it changes the numbers without changing lmcc), and the host CPU.
const json &keyParts(const driver::LibraryOptions &options) {
  static const json parts = [&] {
    json parts;
    std::error_code ec;
    parts["lmcc"] = fileIdentity(fs::read_symlink("/proc/self/exe", ec).string());
    parts["lmrt"] = fileIdentity((fs::path(options.runtimeDir) / "liblmrt.so").string());
    parts["cpu"] = llvm::sys::getHostCPUName().str();
    std::vector<std::string> features;
    for (const auto &f : llvm::sys::getHostCPUFeatures())
      if (f.getValue())
        features.push_back(f.getKey().str());
    std::sort(features.begin(), features.end());
    std::string joined;
    for (const std::string &f : features)
      joined += (joined.empty() ? "" : ",") + f;
    parts["features"] = joined;
    return parts;
  }(); // computed once a process: every lookup and fill asks for it
  return parts;
}

std::string pipelineTag(const driver::LibraryOptions &options) {
  if (options.naive)
    return "naive-" + options.gemm + (options.weightsDtype == "bf16" ? "-bf16" : "") + (options.train ? "-train" : "");
  std::string tag = "opt-" + options.gemm + (options.weightsDtype == "bf16" ? "-bf16" : "");
  for (const std::string &flag : options.disabledPasses)
    tag += "-no" + flag.substr(2);
  return options.train ? tag + "-train" : tag;
}

/// The entry directory of (spec, options).
fs::path entryDir(const fs::path &cache, const ModelSpec &spec, const driver::LibraryOptions &options) {
  const std::string key = keyParts(options).dump();
  return cache / (spec.name + "-" + specHash(spec) + "-" + pipelineTag(options) + "-" +
                  hex(fnv(0xcbf29ce484222325ull, key.data(), key.size())).substr(0, 12));
}

/// "" when the entry's files hash as its manifest records, else what is wrong.
std::string damage(const fs::path &dir) {
  json manifest;
  try {
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(dir / "manifest.json", ec);
    if (fs::exists(status) && (!fs::is_regular_file(status) || fs::file_size(dir / "manifest.json", ec) > (1u << 20)))
      return "manifest.json is not a regular file of at most 1 MiB";
    std::ifstream in(dir / "manifest.json");
    if (!in)
      return "no manifest.json";
    manifest = json::parse(in);
    // The library and the runtime must both be recorded: a manifest that lists fewer files (edited, or from
    // another version) would leave a file unchecked that dlopen then maps.
    const json &files = manifest.at("files");
    for (const std::string required : {"lib" + manifest.at("spec").get<std::string>() + ".so", std::string("liblmrt.so")})
      if (!files.is_object() || !files.contains(required))
        return "manifest.json does not record " + required;
    for (const auto &[file, hash] : files.items()) {
      // The entry's own regular files only: a name with a path in it, or a link (to /dev/zero, say, which hashed
      // forever), is damage, not something to read.
      std::error_code ec;
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        return "manifest.json names a file outside the entry (" + file + ")";
      if (!fs::is_regular_file(fs::symlink_status(dir / file, ec)))
        return file + " is not a regular file";
      const std::string actual = fileHash(dir / file);
      if (actual.empty())
        return file + " is missing or unreadable";
      if (actual != hash.get<std::string>())
        return file + " does not match its recorded content hash";
    }
  } catch (const std::exception &) {
    return "manifest.json is not a cache manifest (unreadable, or fields missing or of the wrong type)";
  }
  return "";
}

void warn(const fs::path &dir, const std::string &why) {
  std::fprintf(stderr, "lmcc: cache entry %s: %s; rebuilding it\n", dir.c_str(), why.c_str());
}

} // namespace

std::string cacheDir() {
  const char *env = std::getenv("LMCC_CACHE_DIR");
  const char *xdg = std::getenv("XDG_CACHE_HOME");
  const char *home = std::getenv("HOME");
  return (env && *env ? fs::path(env)
          : xdg && *xdg ? fs::path(xdg) / "lmcc"
                        : fs::path(home && *home ? home : "/tmp") / ".cache" / "lmcc")
      .string();
}

std::string cachedLibrary(const ModelSpec &spec, driver::LibraryOptions options) {
  const fs::path cache = cacheDir();
  const std::string libName = "lib" + spec.name + ".so";
  const fs::path dir = entryDir(cache, spec, options);
  std::error_code statusError;
  if (const fs::file_status status = fs::symlink_status(dir, statusError); fs::exists(status)) {
    // A symbolic link (dangling ones included, which fs::exists(dir) does not see) is no entry lmcc made: removed
    // (the link, not its target) and refilled, as a damaged entry is.
    if (std::string why = fs::is_symlink(status) ? "a symbolic link, not a cache entry" : damage(dir); why.empty())
      return (dir / libName).string();
    else {
      warn(dir, why);
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  }
  if (!options.train) { // a library compiled with --train (after lmcc train) scores and embeds the same way
    driver::LibraryOptions trained = options;
    trained.train = true;
    const fs::path alt = entryDir(cache, spec, trained);
    if (fs::exists(alt) && damage(alt).empty())
      return (alt / libName).string();
  }
  std::error_code ec;
  fs::create_directories(cache, ec);
  if (ec || !fs::is_directory(cache))
    throw InputError(cache.string() + ": cannot create the cache directory (LMCC_CACHE_DIR, XDG_CACHE_HOME): " +
                     (ec ? ec.message() : std::string("not a directory")));
  // Filled in a private directory (removed on any failure or signal), then renamed into place: concurrent
  // lmcc runs are safe, and an interrupted fill leaves no entry.
  driver::TempDir tmp(cache / (".tmp-" + spec.name + "-" + std::to_string(::getpid())));
  options.outputDir = (tmp.path() / "out").string();
  if (std::string err = driver::compileLibrary(spec, options); !err.empty())
    throw std::runtime_error("compiling " + spec.name + ": " + err);
  const fs::path out = tmp.path() / "out";
  json manifest;
  manifest["spec"] = spec.name;
  manifest["spec_hash"] = specHash(spec);
  manifest["pipeline"] = pipelineTag(options);
  manifest["key"] = keyParts(options);
  for (const std::string file : {libName, std::string("liblmrt.so")})
    manifest["files"][file] = fileHash(out / file);
  {
    std::ofstream m(out / "manifest.json");
    m << manifest.dump(1) << "\n";
    if (!m)
      throw std::runtime_error((out / "manifest.json").string() + ": cannot write");
  }
  fs::rename(out, dir, ec);
  if (ec && !(fs::exists(dir) && damage(dir).empty())) // another process filled it first: fine
    throw std::runtime_error(dir.string() + ": cannot fill the cache entry: " + ec.message());
  return (dir / libName).string();
}

void discardEntry(const std::string &library, const std::string &why) {
  const fs::path dir = fs::path(library).parent_path();
  warn(dir, why);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

int runCache(const std::string &action) {
  const fs::path cache = cacheDir();
  if (!fs::is_directory(cache)) {
    if (action == "list")
      std::printf("%s: empty (no cache directory)\n", cache.c_str());
    return 0;
  }
  std::vector<fs::path> entries;
  for (const auto &e : fs::directory_iterator(cache))
    if (e.is_directory() || e.is_symlink())
      entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  if (action == "clean") {
    // Only what lmcc put there: entries (a manifest.json inside) and its temporaries (.tmp-*). Anything else in
    // the directory (a mistaken LMCC_CACHE_DIR=$HOME) is left alone.
    uintmax_t removed = 0, left = 0;
    for (const fs::path &p : entries) {
      std::error_code ec;
      if (p.filename().string().rfind(".tmp-", 0) == 0 || fs::is_regular_file(p / "manifest.json", ec))
        removed += fs::remove_all(p, ec) > 0;
      else
        ++left;
    }
    std::printf("removed %ju cache entries from %s\n", removed, cache.c_str());
    if (left)
      std::printf("left %ju directories that are not lmcc cache entries (no manifest.json)\n", left);
    return 0;
  }
  std::printf("%s\n", cache.c_str());
  for (const fs::path &p : entries) {
    const std::string name = p.filename().string();
    if (name.rfind(".tmp-", 0) == 0) {
      std::printf("  %s  (a temporary of a running or killed lmcc)\n", name.c_str());
      continue;
    }
    if (fs::is_symlink(p)) {
      std::printf("  %s  (a symbolic link, not a cache entry: replaced when its model is next compiled)\n",
                  name.c_str());
      continue;
    }
    uintmax_t bytes = 0;
    std::error_code ec;
    for (const auto &f : fs::recursive_directory_iterator(p, ec))
      if (f.is_regular_file())
        bytes += f.file_size(ec);
    const std::string why = damage(p);
    std::printf("  %s  %.1f MB  %s\n", name.c_str(), double(bytes) / 1e6, why.empty() ? "ok" : why.c_str());
  }
  return 0;
}

} // namespace lmcc::cli
