//===- Common.cpp - What the lmcc subcommands share -----------------------===//
#include "tools/lmcc/Common.h"
#include "runtime/weights/UniqueJson.h"

#include "runtime/train/Corpus.h"
#include "runtime/weights/ModelWeights.h"
#include "tools/lmcc/Cache.h"
#include "driver/TempDir.h"

#include <zlib.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace lmcc::cli {
namespace fs = std::filesystem;

std::string readInput(const std::string &path, const char *what) {
  const std::string name = path == "-" ? std::string("<stdin>") : path;
  std::ifstream file;
  if (path != "-") {
    std::error_code ec;
    if (fs::is_directory(path, ec))
      throw InputError(path + ": is a directory, not the " + what);
    file.open(path, std::ios::binary);
    if (!file)
      throw InputError(path + ": cannot open the " + what + ": " + std::strerror(errno));
  }
  std::istream &in = path == "-" ? std::cin : file;
  // Bounded as the line readers are: a line of at most 16 MiB, 4 GiB in all (/dev/zero or a binary file given by
  // mistake would otherwise fill the memory before any error).
  constexpr size_t kMaxLineBytes = size_t(16) << 20, kMaxBytes = size_t(4) << 30;
  std::string text;
  size_t lineStart = 0, lines = 1;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    const size_t from = text.size();
    text.append(chunk, size_t(in.gcount()));
    for (size_t at = text.find('\n', from); at != std::string::npos; at = text.find('\n', at + 1))
      lineStart = at + 1, ++lines;
    if (text.size() - lineStart > kMaxLineBytes)
      throw InputError(name + ":" + std::to_string(lines) + ": a line longer than 16 MiB (the " + what + ")");
    if (text.size() > kMaxBytes)
      throw InputError(name + ": larger than 4 GiB (the " + what + ")");
  }
  if (in.bad())
    throw InputError(name + ": read error (the " + what + ")");
  return text;
}

// --- LineReader ---------------------------------------------------------------------

namespace {
constexpr size_t kMaxLine = size_t(16) << 20;
constexpr unsigned kChunk = 1u << 16;
} // namespace

LineReader::LineReader(const std::string &path, const char *what)
    : name(path == "-" ? "<stdin>" : path), what(what) {
  int fd = 0;
  if (path == "-") {
    fd = ::dup(0);
  } else {
    std::error_code ec;
    if (fs::is_directory(path, ec))
      throw InputError(path + ": is a directory, not the " + what);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw InputError(path + ": cannot open the " + what + ": " + std::strerror(errno));
  }
  // zlib reads a file that is not gzip-compressed as it is.
  file = fd < 0 ? nullptr : ::gzdopen(fd, "rb");
  if (!file) {
    if (fd >= 0)
      ::close(fd);
    throw InputError(name + ": cannot read the " + what);
  }
  ::gzbuffer(static_cast<gzFile>(file), kChunk);
}

LineReader::~LineReader() {
  if (file)
    ::gzclose(static_cast<gzFile>(file));
}

bool LineReader::fill() {
  if (eof)
    return false;
  buffer.erase(0, pos);
  pos = 0;
  const size_t old = buffer.size();
  buffer.resize(old + kChunk);
  int n = ::gzread(static_cast<gzFile>(file), buffer.data() + old, kChunk);
  if (n < 0) {
    int code = 0;
    const char *msg = ::gzerror(static_cast<gzFile>(file), &code);
    throw InputError(name + ":" + std::to_string(lineNo + 1) + ": read error (the " + what +
                     "): " + (code == Z_ERRNO ? std::strerror(errno) : msg));
  }
  buffer.resize(old + size_t(n));
  if (n == 0) {
    eof = true;
    // zlib returns what it could decompress of a gzip stream that ends early, then reports Z_BUF_ERROR.
    int code = Z_OK;
    ::gzerror(static_cast<gzFile>(file), &code);
    if (code == Z_BUF_ERROR)
      throw InputError(name + ":" + std::to_string(lineNo + 1) + ": the gzip stream ends early (a truncated " +
                       what + "?)");
  }
  return n > 0;
}

bool LineReader::next(std::string &line) {
  size_t scan = pos;
  for (;;) {
    size_t nl = buffer.find('\n', scan);
    if (nl != std::string::npos) {
      line.assign(buffer, pos, nl - pos);
      pos = nl + 1;
      break;
    }
    const size_t unread = buffer.size() - pos;
    if (unread > kMaxLine)
      throw InputError(name + ":" + std::to_string(lineNo + 1) + ": line longer than 16 MiB (is the " + what +
                       " a text file?)");
    if (!fill()) {
      if (pos >= buffer.size())
        return false;
      line.assign(buffer, pos, std::string::npos); // the last line, without a newline
      pos = buffer.size();
      break;
    }
    scan = unread; // fill() moved the unread data to the front
  }
  ++lineNo;
  if (!line.empty() && line.back() == '\r')
    line.pop_back();
  return true;
}

// --- Sentences ----------------------------------------------------------------------

std::vector<int32_t> encodeIds(std::string_view line, const std::string &where, const ModelSpec &spec) {
  std::vector<int32_t> ids = train::parseIdLine(line, where, spec.dims.vocab);
  if (ids.empty())
    throw InputError(where + ": empty line (every line must hold one sentence)");
  if (int64_t(ids.size()) > spec.dims.maxLen)
    throw InputError(where + ": sentence of " + std::to_string(ids.size()) + " tokens is longer than max_len = " +
                     std::to_string(spec.dims.maxLen));
  return ids;
}

std::vector<int32_t> encodeText(std::string_view line, const std::string &where, const ModelSpec &spec,
                                const Tokenizer &tok, bool truncate) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encodeSentence(line, where);
  } catch (const TokenizerError &e) {
    throw InputError(e.what());
  }
  if (int64_t(ids.size()) > spec.dims.maxLen) {
    if (!truncate)
      throw InputError(where + ": sentence of " + std::to_string(ids.size()) + " tokens (with bos and eos) is " +
                       "longer than max_len = " + std::to_string(spec.dims.maxLen) + " (--truncate cuts it)");
    ids.resize(size_t(spec.dims.maxLen));
    ids.back() = int32_t(spec.tokens.eos);
  }
  return ids;
}

Tokenizer loadTokenizer(const ModelSpec &spec) {
  if (!spec.tokenizer)
    throw SpecError(spec.sourcePath, "tokenizer",
                    "text input needs a [tokenizer] table (vocab = \"vocab.txt\", lowercase = true)");
  const TokenizerSpec &t = *spec.tokenizer;
  SpecialIds ids;
  ids.pad = int32_t(spec.tokens.pad), ids.eos = int32_t(spec.tokens.eos), ids.unk = int32_t(spec.tokens.unk);
  ids.bos = int32_t(spec.tokens.bos), ids.mask = int32_t(spec.tokens.mask);
  Tokenizer tok = [&] {
    try {
      return Tokenizer::fromFile(t.vocabPath, t.lowercase, ids);
    } catch (const TokenizerError &e) {
      throw InputError(std::string(e.what()) + " (the vocabulary of " + spec.where("tokenizer.vocab") + ")");
    }
  }();
  if (int64_t(tok.size()) > spec.dims.vocab)
    throw SpecError(spec.where("tokenizer.vocab"), "tokenizer.vocab",
                    t.vocabPath + " has " + std::to_string(tok.size()) + " tokens, more than [dims] vocab = " +
                        std::to_string(spec.dims.vocab));
  const std::tuple<const char *, const std::string *, int64_t> named[] = {{"pad", &t.pad, spec.tokens.pad},
                                                                          {"eos", &t.eos, spec.tokens.eos},
                                                                          {"unk", &t.unk, spec.tokens.unk},
                                                                          {"bos", &t.bos, spec.tokens.bos},
                                                                          {"mask", &t.mask, spec.tokens.mask}};
  for (auto [key, str, id] : named) {
    if (str->empty())
      continue;
    int32_t found = tok.find(*str);
    std::string field = std::string("tokenizer.") + key;
    if (found < 0)
      throw SpecError(spec.where(field), field, "\"" + *str + "\" is not in the vocabulary " + t.vocabPath);
    if (found != id)
      throw SpecError(spec.where(field), field,
                      "\"" + *str + "\" is id " + std::to_string(found) + " (line " + std::to_string(found + 1) +
                          " of " + t.vocabPath + ") but [tokens] " + key + " = " + std::to_string(id));
  }
  return tok;
}

// --- Output -------------------------------------------------------------------------

std::string jsonString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

void appendNumber(std::string &out, double v, const std::string &what) {
  if (!std::isfinite(v))
    throw InputError("non-finite " + what + " (check the weights)");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  out += buf;
}

nlohmann::json parseJson(const std::string &text, const std::string &where) {
  try {
    return parseUniqueJson(text);
  } catch (const nlohmann::json::exception &e) { // syntax, or a number out of range (1e400)
    throw InputError(where + ": invalid JSON: " + e.what());
  } catch (const DuplicateJsonKey &e) {
    throw InputError(where + ": " + e.what());
  }
}

void writeStdout(const std::string &text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    throw InputError(std::string("cannot write the output to stdout: ") + std::strerror(errno ? errno : EIO));
}

Progress::Progress(const char *what)
    : what(what), enabled(::isatty(2)), start(std::chrono::steady_clock::now()), last(start) {}

Progress::~Progress() {
  if (enabled && done > 0) {
    draw();
    std::fputc('\n', stderr);
  }
}

void Progress::add(int64_t lines) {
  done += lines;
  if (!enabled)
    return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last >= std::chrono::milliseconds(200)) {
    last = now;
    draw();
  }
}

void Progress::draw() {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "\r%lld %s, %.0f/s, %.1f s ", (long long)done, what, s > 0 ? double(done) / s : 0.0, s);
  std::fflush(stderr);
}

// --- Running the model --------------------------------------------------------------

void throwCallStatus(int status, const std::string &message) {
  if (status == LM_ERR_MEMORY)
    throw ResourceError(message);
  throw InputError(message);
}

void setRuntime(const Options &o) {
  lm_set_num_threads(o.threads);
  lm_set_workspace_limit(o.maxMemoryMB << 20);
}

void throwRuntimeStatus(int status, const std::vector<std::string> &rows) {
  std::string message = lm_last_error();
  if (status == LM_ERR_MEMORY)
    throw ResourceError(message);
  if (status == LM_ERR_INTERNAL)
    throw std::runtime_error(message);
  // lmrt.cpp's "<entry>: non-finite result for batch row R (...)" becomes "<input>: <entry>: non-finite result (...)".
  const std::string marker = " for batch row ";
  if (const size_t at = message.find(marker); status == LM_ERR_NONFINITE && at != std::string::npos) {
    size_t end = at + marker.size();
    size_t row = 0;
    while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end])))
      row = row * 10 + size_t(message[end++] - '0');
    if (end > at + marker.size() && row < rows.size())
      message = rows[row] + ": " + message.substr(0, at) + message.substr(end);
  }
  throw InputError(message);
}

Padded::Padded(const std::vector<std::vector<int32_t>> &sentences) {
  for (const auto &s : sentences)
    stride = std::max<int32_t>(stride, int32_t(s.size()));
  ids.assign(sentences.size() * stride, 0);
  for (size_t b = 0; b < sentences.size(); ++b) {
    std::copy(sentences[b].begin(), sentences[b].end(), ids.begin() + b * stride);
    lengths.push_back(int32_t(sentences[b].size()));
  }
}

std::string runtimeDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path().parent_path() / "lib").string();
}

void applyPipelineFlags(const Options &o, driver::LibraryOptions &options) {
  options.naive = o.naive;
  options.gemm = o.gemm;
  options.weightsDtype = o.weightsDtype;
  options.train = o.train;
  for (const auto &[flag, off] : o.noPass)
    if (off)
      options.disabledPasses.insert(flag);
}

namespace {
/// A verified cached library of `spec` for this lmcc binary and CPU (tools/lmcc/Cache.h), compiled on first use.
std::string cachedLibraryFor(const ModelSpec &spec, const Options &o) {
  driver::LibraryOptions options;
  applyPipelineFlags(o, options);
  options.runtimeDir = runtimeDir();
  return cachedLibrary(spec, options);
}
} // namespace

CompiledModel::CompiledModel(const ModelSpec &spec, const Options &o, const std::string &weightsPath) {
  const std::string &weights = weightsPath.empty() ? o.weights : weightsPath;
  // A cache entry that verified may still be another spec's library under this name (swapped in with
  // its manifest): its embedded spec hash tells. Such an entry is discarded and rebuilt once.
  const lm_model_desc *(*descriptor)() = nullptr;
  std::string lib;
  for (int attempt = 0; attempt < 2 && !descriptor; ++attempt) {
    lib = cachedLibraryFor(spec, o);
    handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why = handle ? "" : std::string("dlopen failed: ") + ::dlerror();
    if (handle) {
      descriptor = reinterpret_cast<const lm_model_desc *(*)()>(::dlsym(handle, (spec.name + "_descriptor").c_str()));
      if (!descriptor)
        why = "no " + spec.name + "_descriptor";
      else if (!descriptor()->spec_hash || specHash(spec) != descriptor()->spec_hash)
        why = "its embedded spec hash is not the spec's", descriptor = nullptr;
      if (!descriptor)
        ::dlclose(std::exchange(handle, nullptr));
    }
    if (!descriptor) {
      if (attempt == 1)
        throw std::runtime_error("cannot load " + lib + ": " + why);
      discardEntry(lib, why);
    }
  }
  std::string path = weights;
  WeightSet raw = readSafetensors(weights);
  fs::path converted;
  if (isHuggingFaceBert(raw)) { // the runtime reads canonical names: convert once
    converted = fs::temp_directory_path() / ("lmcc-" + std::to_string(::getpid()) + ".safetensors");
    writeSafetensors(converted.string(), importHuggingFaceBert(raw, spec, weights));
    path = converted.string();
  }
  int status = lm_rt_load(descriptor(), path.c_str(), &model);
  if (!converted.empty())
    fs::remove(converted);
  if (status == LM_ERR_MEMORY) // not the weights' fault: exit 5, as every out of memory
    throw ResourceError(path + ": " + lm_last_error());
  if (status != LM_OK)
    throw InputError(lm_last_error());
}

CompiledModel::~CompiledModel() {
  if (model)
    lm_rt_free(model);
}

WeightSet unpackGradient(const lm_model_desc *d, const std::vector<float> &packed) {
  WeightSet out;
  for (int32_t i = 0; i < d->num_tensors; ++i) {
    const char *name = nullptr;
    int64_t offset = 0, count = 0;
    lm_rt_param_info(d, i, &name, &offset, &count);
    Tensor t;
    t.shape.assign(d->tensors[i].shape, d->tensors[i].shape + d->tensors[i].rank);
    t.data.assign(packed.begin() + offset, packed.begin() + offset + count);
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

void writeWeightsFile(const std::string &path, const WeightSet &weights) {
  namespace fs = std::filesystem;
  requireReplaceable(path);
  const fs::path target(path);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::unique_ptr<driver::TempDir> tmp;
  try {
    tmp = std::make_unique<driver::TempDir>(parent / (".lmcc-write-" + std::to_string(::getpid())));
  } catch (const fs::filesystem_error &e) {
    throw InputError(path + ": cannot write beside it (a temporary directory in " + parent.string() +
                     "): " + e.code().message());
  }
  const fs::path file = tmp->path() / "weights.safetensors";
  try {
    writeSafetensors(file.string(), weights);
  } catch (const WeightError &e) { // named by the temporary file: say the path asked for
    std::string reason = e.what();
    if (reason.rfind(file.string() + ": ", 0) == 0)
      reason.erase(0, file.string().size() + 2);
    throw InputError(path + ": " + reason);
  }
  if (std::rename(file.c_str(), path.c_str()) != 0)
    throw InputError(path + ": cannot rename the written file into place: " + std::strerror(errno));
}

} // namespace lmcc::cli
