//===- Safetensors.cpp - Safetensors reading and writing ------------------===//
//
// File layout (https://github.com/huggingface/safetensors):
//   u64 little-endian N | N bytes of UTF-8 JSON header | data section
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) plus an optional "__metadata__" object of
// string -> string.
//
// The reader treats the file as untrusted input: every length and offset is checked
// with overflow-safe arithmetic before anything is allocated or read, so a corrupt or
// hostile file yields a WeightError, never a crash or an out-of-bounds read.
//
//===----------------------------------------------------------------------===//

#include "runtime/weights/Safetensors.h"

#include "runtime/weights/Format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace lmcc {

namespace {

using nlohmann::json;

/// Headers larger than this are rejected as absurd (the reference implementation
/// uses the same limit).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
/// The data section starts at a multiple of this (safetensors convention).
constexpr uint64_t kDataAlignment = 8;
/// Tensor data is read and decoded in chunks of at most this many bytes.
constexpr uint64_t kReadChunkBytes = 1ull << 20;

[[noreturn]] void headerError(const std::string &path, const std::string &what) {
  throw WeightError(path + ": header: " + what);
}

[[noreturn]] void tensorError(const std::string &path, const std::string &name,
                              const std::string &what) {
  throw WeightError(path + ": tensor " + quoted(name) + ": " + what);
}

/// Overflow-checked a * b; false on overflow.
bool mulU64(uint64_t a, uint64_t b, uint64_t &out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a)
    return false;
  out = a * b;
  return true;
}

enum class DType { F16, BF16, F32, F64, Integer };

/// The supported dtypes and their element sizes; false for any other name.
bool parseDType(const std::string &name, DType &dtype, uint64_t &itemSize) {
  if (name == "F32") { dtype = DType::F32; itemSize = 4; return true; }
  if (name == "F16") { dtype = DType::F16; itemSize = 2; return true; }
  if (name == "BF16") { dtype = DType::BF16; itemSize = 2; return true; }
  if (name == "F64") { dtype = DType::F64; itemSize = 8; return true; }
  // Integer and boolean buffers (e.g. Hugging Face's embeddings.position_ids): validated, not loaded.
  static const std::pair<const char *, uint64_t> integers[] = {{"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                               {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},
                                                               {"BOOL", 1}};
  for (auto [n, size] : integers)
    if (name == n) {
      dtype = DType::Integer;
      itemSize = size;
      return true;
    }
  return false;
}

float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t floatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

/// IEEE 754 binary16 -> binary32 (exact; subnormals, infinities and NaNs kept).
float halfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exactly representable in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) // infinity (mantissa 0) or NaN (payload kept)
    return bitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return bitsToFloat(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

/// binary64 -> binary32 with IEEE round-to-nearest overflow to infinity made
/// explicit (an out-of-range conversion is undefined behaviour in C++).
float doubleToFloat(double d) {
  if (std::isfinite(d) && std::fabs(d) > static_cast<double>(FLT_MAX)) {
    // Values from FLT_MAX + half an ulp upward round to infinity.
    const bool toInfinity = std::fabs(d) >= 0x1.ffffffp+127;
    const float magnitude = toInfinity ? std::numeric_limits<float>::infinity() : FLT_MAX;
    return d < 0 ? -magnitude : magnitude;
  }
  return static_cast<float>(d);
}

uint64_t loadLE(const unsigned char *p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes; ++i)
    v |= uint64_t(p[i]) << (8 * i);
  return v;
}

/// Decodes `count` little-endian elements of `dtype` from `bytes` into `out`.
void decode(DType dtype, const unsigned char *bytes, size_t count, float *out) {
  switch (dtype) {
  case DType::F32:
    for (size_t i = 0; i < count; ++i)
      out[i] = bitsToFloat(static_cast<uint32_t>(loadLE(bytes + 4 * i, 4)));
    break;
  case DType::F16:
    for (size_t i = 0; i < count; ++i)
      out[i] = halfToFloat(static_cast<uint16_t>(loadLE(bytes + 2 * i, 2)));
    break;
  case DType::BF16:
    for (size_t i = 0; i < count; ++i)
      out[i] = bitsToFloat(static_cast<uint32_t>(loadLE(bytes + 2 * i, 2)) << 16);
    break;
  case DType::F64:
    for (size_t i = 0; i < count; ++i) {
      const uint64_t bits = loadLE(bytes + 8 * i, 8);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      out[i] = doubleToFloat(d);
    }
    break;
  }
}

/// One validated header entry.
struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::string dtypeName;
  uint64_t itemSize = 4;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t begin = 0, end = 0;
};

/// Reads a JSON integer that must be >= 0 into `out`; false when it is not one.
/// (Non-negative integers parse as unsigned, but "-0" parses as a signed zero.)
bool nonNegativeInteger(const json &value, uint64_t &out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

/// Validates one tensor entry of the header against a data section of `dataSize` bytes.
Entry parseEntry(const std::string &path, const std::string &name, const json &value,
                 uint64_t dataSize) {
  Entry e;
  e.name = name;
  if (!value.is_object())
    tensorError(path, name, std::string("entry is not a JSON object but ") + value.type_name());

  // dtype
  auto dtypeIt = value.find("dtype");
  if (dtypeIt == value.end())
    tensorError(path, name, "missing 'dtype'");
  if (!dtypeIt->is_string())
    tensorError(path, name, "'dtype' is not a string");
  const std::string dtypeName = dtypeIt->get<std::string>();
  if (!parseDType(dtypeName, e.dtype, e.itemSize))
    tensorError(path, name,
                "unsupported dtype " + quoted(dtypeName) + " (supported: F32, F16, BF16, F64; integer buffers are skipped)");
  e.dtypeName = dtypeName;

  // shape
  auto shapeIt = value.find("shape");
  if (shapeIt == value.end())
    tensorError(path, name, "missing 'shape'");
  if (!shapeIt->is_array())
    tensorError(path, name, "'shape' is not an array");
  bool overflow = false, hasZero = false;
  uint64_t numel = 1;
  for (const json &dim : *shapeIt) {
    if (!dim.is_number_integer())
      tensorError(path, name, "'shape' holds a non-integer dimension");
    uint64_t d = 0;
    if (!nonNegativeInteger(dim, d))
      tensorError(path, name, "negative dimension " + std::to_string(dim.get<int64_t>()) +
                                  " in 'shape'");
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      tensorError(path, name, "dimension " + std::to_string(d) + " in 'shape' is too large");
    e.shape.push_back(static_cast<int64_t>(d));
    hasZero |= d == 0;
    overflow |= !mulU64(numel, d, numel);
  }
  // A zero dimension makes the tensor empty whatever the other dimensions are.
  if (hasZero)
    numel = 0;
  else if (overflow ||
           numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    tensorError(path, name, "shape " + shapeString(e.shape) + " has too many elements");
  e.numel = numel;

  // data_offsets
  auto offsetsIt = value.find("data_offsets");
  if (offsetsIt == value.end())
    tensorError(path, name, "missing 'data_offsets'");
  if (!offsetsIt->is_array() || offsetsIt->size() != 2 ||
      !nonNegativeInteger((*offsetsIt)[0], e.begin) ||
      !nonNegativeInteger((*offsetsIt)[1], e.end))
    tensorError(path, name, "'data_offsets' is not an array of two non-negative integers");
  if (e.begin > e.end)
    tensorError(path, name, "data_offsets begin " + std::to_string(e.begin) +
                                " is after end " + std::to_string(e.end));
  if (e.end > dataSize)
    tensorError(path, name, "data_offsets end " + std::to_string(e.end) +
                                " is beyond the data section (" + std::to_string(dataSize) +
                                " bytes)");
  uint64_t expectedBytes = 0;
  if (!mulU64(e.numel, e.itemSize, expectedBytes) || expectedBytes != e.end - e.begin)
    tensorError(path, name,
                "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but " +
                    dtypeName + " shape " + shapeString(e.shape) + " needs " +
                    (expectedBytes == 0 && e.numel != 0 ? std::string("more")
                                                        : std::to_string(expectedBytes)));
  return e;
}

/// Rejects tensors whose byte ranges overlap, naming both. Empty ranges overlap nothing.
void checkOverlaps(const std::string &path, std::vector<const Entry *> entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry *a, const Entry *b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  const Entry *furthest = nullptr; // the non-empty range seen so far ending last
  for (const Entry *e : entries) {
    if (e->begin == e->end)
      continue;
    if (furthest && e->begin < furthest->end)
      tensorError(path, e->name,
                  "bytes [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                      ") overlap tensor " + quoted(furthest->name) + " at [" +
                      std::to_string(furthest->begin) + ", " + std::to_string(furthest->end) +
                      ")");
    if (!furthest || e->end > furthest->end)
      furthest = e;
  }
}

/// Parses the header JSON, rejecting duplicate top-level names (nlohmann would keep
/// the last one silently).
json parseHeaderJson(const std::string &path, const std::string &text) {
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t onEvent = [&](int depth, json::parse_event_t event, json &parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty() &&
        parsed.is_string() && !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  // nlohmann's lexer ends the input at a NUL byte (`{...}\0garbage` parsed as `{...}`); the format pads the header
  // with spaces, and safetensors itself refuses a NUL.
  if (const size_t at = text.find('\0'); at != std::string::npos)
    headerError(path, "a NUL byte at header offset " + std::to_string(at) + " (the header is JSON text, padded with "
                      "spaces)");
  json header;
  try {
    header = json::parse(text.begin(), text.end(), onEvent);
  } catch (const json::exception &e) {
    headerError(path, std::string("not valid JSON: ") + e.what());
  }
  if (!header.is_object())
    headerError(path, std::string("not a JSON object but ") + header.type_name());
  if (!duplicate.empty())
    tensorError(path, duplicate, "appears twice in the header");
  return header;
}

WeightSet readImpl(const std::string &path) {
  // The reader seeks (the file's size bounds the header and every tensor), so only a regular file will do; a FIFO
  // was opened, and waited for a writer forever.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    throw WeightError(path + ": cannot read: is a directory");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw WeightError(path + ": cannot read: not a regular file (a pipe or device; weights are read with seeks)");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw WeightError(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff endPos = in.tellg();
  if (!in || endPos < 0)
    throw WeightError(path + ": cannot determine the file size");
  const uint64_t fileSize = static_cast<uint64_t>(endPos);
  in.seekg(0, std::ios::beg);

  // Header length.
  if (fileSize < 8)
    headerError(path, "file too short (" + std::to_string(fileSize) +
                          " bytes) to hold the 8-byte header length");
  unsigned char lengthBytes[8];
  if (!in.read(reinterpret_cast<char *>(lengthBytes), 8))
    headerError(path, "cannot read the header length");
  const uint64_t headerSize = loadLE(lengthBytes, 8);
  if (headerSize > kMaxHeaderBytes)
    headerError(path, "header length " + std::to_string(headerSize) + " is absurd (limit " +
                          std::to_string(kMaxHeaderBytes) + " bytes)");
  if (headerSize > fileSize - 8)
    headerError(path, "header length " + std::to_string(headerSize) +
                          " is larger than the rest of the file (" +
                          std::to_string(fileSize - 8) + " bytes)");

  // Header JSON.
  std::string headerText(static_cast<size_t>(headerSize), '\0');
  if (headerSize && !in.read(&headerText[0], static_cast<std::streamsize>(headerSize)))
    headerError(path, "cannot read the header (file truncated while reading?)");
  const json header = parseHeaderJson(path, headerText);
  headerText.clear();
  headerText.shrink_to_fit();

  // Validate every entry before reading any data.
  const uint64_t dataStart = 8 + headerSize;
  const uint64_t dataSize = fileSize - dataStart;
  WeightSet result;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        headerError(path, "'__metadata__' is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          headerError(path, "'__metadata__' value " + quoted(m.key()) + " is not a string");
        result.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parseEntry(path, it.key(), *it, dataSize));
  }
  std::vector<const Entry *> byOffset;
  for (const Entry &e : entries)
    byOffset.push_back(&e);
  checkOverlaps(path, byOffset);

  // Read and convert, in file order for sequential I/O.
  std::sort(byOffset.begin(), byOffset.end(),
            [](const Entry *a, const Entry *b) { return a->begin < b->begin; });
  std::vector<unsigned char> chunk;
  for (const Entry *e : byOffset) {
    if (e->dtype == DType::Integer) {
      result.integerTensors[e->name] = e->dtypeName;
      continue;
    }
    Tensor t;
    t.shape = e->shape;
    // numel * itemSize == end - begin <= file size, so this allocation is bounded
    // by the file size.
    t.data.resize(static_cast<size_t>(e->numel));
    in.seekg(static_cast<std::streamoff>(dataStart + e->begin), std::ios::beg);
    const uint64_t elementsPerChunk = kReadChunkBytes / e->itemSize;
    for (uint64_t done = 0; done < e->numel;) {
      const uint64_t count = std::min(elementsPerChunk, e->numel - done);
      chunk.resize(static_cast<size_t>(count * e->itemSize));
      if (!in.read(reinterpret_cast<char *>(chunk.data()),
                   static_cast<std::streamsize>(chunk.size())))
        tensorError(path, e->name, "cannot read the data (file truncated while reading?)");
      decode(e->dtype, chunk.data(), static_cast<size_t>(count), t.data.data() + done);
      done += count;
    }
    result.tensors.emplace(e->name, std::move(t));
  }
  return result;
}

void storeLE(std::string &out, uint64_t v, unsigned bytes) {
  for (unsigned i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

} // namespace

int64_t Tensor::numel() const {
  // Unsigned arithmetic: a nonsensical in-memory shape wraps instead of being
  // undefined behaviour (shapes read from files are checked not to overflow).
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

const Tensor &WeightSet::get(const std::string &name) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw WeightError("tensor " + quoted(name) + ": not found");
  return it->second;
}

WeightSet readSafetensors(const std::string &path) {
  try {
    return readImpl(path);
  } catch (const json::exception &e) {
    // Not expected (types are checked before every access); kept so that no
    // library exception escapes.
    throw WeightError(path + ": header: " + e.what());
  }
}

void writeSafetensors(const std::string &path, const WeightSet &weights) {
  // Header: nlohmann's default object is a std::map, so keys come out sorted.
  json header = json::object();
  uint64_t offset = 0;
  for (const auto &[name, tensor] : weights.tensors) {
    if (name == "__metadata__")
      tensorError(path, name, "the name is reserved for the metadata");
    uint64_t numel = 1;
    for (int64_t d : tensor.shape) {
      if (d < 0)
        tensorError(path, name, "negative dimension in shape " + shapeString(tensor.shape));
      if (!mulU64(numel, static_cast<uint64_t>(d), numel))
        tensorError(path, name, "shape " + shapeString(tensor.shape) + " has too many elements");
    }
    if (numel != tensor.data.size())
      tensorError(path, name, "shape " + shapeString(tensor.shape) + " has " +
                                  std::to_string(numel) + " elements but the data has " +
                                  std::to_string(tensor.data.size()));
    const uint64_t bytes = numel * 4;
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!weights.metadata.empty())
    header["__metadata__"] = weights.metadata;

  std::string headerText;
  try {
    headerText = header.dump();
  } catch (const json::exception &e) { // invalid UTF-8 in a name or metadata
    throw WeightError(path + ": header: cannot encode: " + e.what());
  }
  // Pad with spaces so that the data section starts 8-byte aligned.
  while ((8 + headerText.size()) % kDataAlignment != 0)
    headerText.push_back(' ');

  // The rename below would replace whatever `path` is: refuse anything but a regular file (a device such as
  // /dev/null or /dev/full, a directory, a FIFO), so that `-o /dev/full` is an error, not a new regular file.
  if (struct stat st; ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw WeightError(path + ": exists and is not a regular file (weights are written to a temporary file "
                                 "and renamed over the path)");
  // Written to a temporary name in the same directory, then renamed: a reader never sees half a file.
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  struct Cleanup {
    const std::string &file;
    bool done = false;
    ~Cleanup() {
      if (!done)
        std::remove(file.c_str());
    }
  } cleanup{tmp};
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out)
    throw WeightError(path + ": cannot open for writing: " + std::strerror(errno));
  std::string prefix;
  storeLE(prefix, headerText.size(), 8);
  out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
  out.write(headerText.data(), static_cast<std::streamsize>(headerText.size()));
  std::string buffer;
  for (const auto &[name, tensor] : weights.tensors) {
    (void)name;
    buffer.clear();
    buffer.reserve(tensor.data.size() * 4);
    for (float f : tensor.data)
      storeLE(buffer, floatToBits(f), 4);
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  }
  out.flush();
  if (!out)
    throw WeightError(path + ": write failed: " + std::strerror(errno));
  out.close();
  if (!out)
    throw WeightError(path + ": write failed when closing: " + std::strerror(errno));
  // Flushed to the disk before the rename, so that a crash after it cannot leave a renamed empty file.
  if (int fd = ::open(tmp.c_str(), O_RDONLY); fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0)
      ::close(fd);
    throw WeightError(path + ": cannot flush to the disk: " + std::strerror(err));
  } else {
    ::close(fd);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw WeightError(path + ": cannot rename the temporary file into place: " + std::strerror(errno));
  cleanup.done = true;
}

} // namespace lmcc
