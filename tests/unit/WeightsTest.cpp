//===- WeightsTest.cpp - Safetensors I/O and spec-aware model weights -----===//
//
// Covers runtime/weights: the safetensors reader and writer (round trip, F16/BF16/F64
// conversion, every kind of malformed file, a small deterministic fuzz), the
// canonical tensor list, Hugging Face BERT import, validation and seeded init.
// Specs are built in code; files live in a fresh mkdtemp directory per test.
//
//===----------------------------------------------------------------------===//

#include "runtime/weights/ModelWeights.h"
#include "runtime/weights/WeightNames.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <sstream>

using namespace lmcc;

namespace {

// --- Byte-level helpers for hand-built files ----------------------------------

void appendLE(std::string &out, uint64_t v, unsigned bytes) {
  for (unsigned i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string f32Bytes(const std::vector<float> &values) {
  std::string out;
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    appendLE(out, bits, 4);
  }
  return out;
}

std::string u16Bytes(const std::vector<uint16_t> &values) {
  std::string out;
  for (uint16_t v : values)
    appendLE(out, v, 2);
  return out;
}

std::string f64Bytes(const std::vector<double> &values) {
  std::string out;
  for (double d : values) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    appendLE(out, bits, 8);
  }
  return out;
}

/// A whole file: 8-byte little-endian header length, header text, data.
std::string fileBytes(const std::string &header, const std::string &data) {
  std::string out;
  appendLE(out, header.size(), 8);
  return out + header + data;
}

std::string shapeJson(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// One header entry, `"name":{...}`.
std::string entryJson(const std::string &name, const std::string &dtype,
                      const std::vector<int64_t> &shape, uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shapeJson(shape) +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

/// A tensor as raw bytes of some dtype, for building files the writer cannot produce.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// A well-formed file holding `tensors` back to back.
std::string rawFile(const std::vector<RawTensor> &tensors) {
  std::string header = "{", data;
  for (const RawTensor &t : tensors) {
    if (header.size() > 1)
      header += ",";
    header += entryJson(t.name, t.dtype, t.shape, data.size(), data.size() + t.bytes.size());
    data += t.bytes;
  }
  return fileBytes(header + "}", data);
}

/// Every tensor of `w` as an F32 raw tensor.
std::vector<RawTensor> rawTensors(const WeightSet &w) {
  std::vector<RawTensor> out;
  for (const auto &[name, t] : w.tensors)
    out.push_back({name, "F32", t.shape, f32Bytes(t.data)});
  return out;
}

float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool bitwiseEqual(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool bitwiseEqual(const WeightSet &a, const WeightSet &b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size())
    return false;
  for (const auto &[name, t] : a.tensors) {
    if (!b.has(name) || b.get(name).shape != t.shape || !bitwiseEqual(b.get(name).data, t.data))
      return false;
  }
  return true;
}

// --- Specs ---------------------------------------------------------------------

/// A tiny BERT-like spec: learned positions, embedding norm, post-norm, head
/// transform, tied output, head bias.
ModelSpec tinySpec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.family = Family::BiLM;
  spec.dims.vocab = 13;
  spec.dims.maxLen = 6;
  spec.dims.dModel = 8;
  spec.dims.heads = 2;
  spec.dims.dFF = 12;
  spec.dims.layers = 2;
  spec.position = PositionKind::Learned;
  spec.embeddingNorm = true;
  spec.norm = NormPlacement::Post;
  spec.headTransform = true;
  spec.tied = true;
  spec.headBias = true;
  return spec;
}

Tensor filled(std::vector<int64_t> shape, float value) {
  Tensor t;
  t.shape = std::move(shape);
  t.data.assign(static_cast<size_t>(t.numel()), value);
  return t;
}

// --- Fixture -------------------------------------------------------------------

class WeightsTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "lmcc-weights-XXXXXX").string();
    ASSERT_NE(mkdtemp(&pattern[0]), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string path(const std::string &name) const { return (dir_ / name).string(); }

  /// Writes `bytes` to a fresh file in the temp directory and returns its path.
  std::string writeFile(const std::string &name, const std::string &bytes) {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return p;
  }

  std::string readFile(const std::string &p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  /// Runs `f`, expecting a WeightError whose message contains every one of `parts`.
  void expectError(const std::function<void()> &f, const std::vector<std::string> &parts) {
    try {
      f();
      ADD_FAILURE() << "no WeightError thrown (expected one mentioning '" << parts.at(0) << "')";
    } catch (const WeightError &e) {
      const std::string message = e.what();
      for (const std::string &part : parts)
        EXPECT_NE(message.find(part), std::string::npos)
            << "message lacks '" << part << "': " << message;
    } catch (const std::exception &e) {
      ADD_FAILURE() << "not a WeightError: " << e.what();
    }
  }

  /// Writes `bytes` and expects readSafetensors to fail mentioning `parts` (and the path).
  void expectReadError(const std::string &bytes, std::vector<std::string> parts) {
    const std::string p = writeFile("bad.safetensors", bytes);
    parts.push_back(p);
    expectError([&] { readSafetensors(p); }, parts);
  }

  std::filesystem::path dir_;
};

// === Safetensors: round trip and layout =========================================

TEST_F(WeightsTest, RoundTripPreservesTensorsAndMetadata) {
  WeightSet w;
  w.tensors["b.matrix"] = {{2, 3}, {1.f, -2.f, 3.5f, -0.f, 1e-40f, 3.4e38f}};
  w.tensors["a.scalar"] = {{}, {42.f}};
  w.tensors["c.empty"] = {{0, 4}, {}};
  w.tensors["d.vec"] = {{5}, {0.1f, 0.2f, 0.3f, std::nextafter(1.f, 2.f), -7.f}};
  w.metadata = {{"name", "round"}, {"format", "lmcc"}};
  const std::string p = path("w.safetensors");
  writeSafetensors(p, w);
  const WeightSet r = readSafetensors(p);
  EXPECT_TRUE(bitwiseEqual(w, r));
  EXPECT_EQ(r.get("a.scalar").numel(), 1);
  EXPECT_EQ(r.get("c.empty").numel(), 0);
}

TEST_F(WeightsTest, WrittenLayoutIsAlignedSortedAndContiguous) {
  WeightSet w;
  w.tensors["zeta"] = {{3}, {1.f, 2.f, 3.f}};
  w.tensors["alpha"] = {{1, 1}, {4.f}};
  w.metadata = {{"k", "v"}};
  const std::string p = path("w.safetensors");
  writeSafetensors(p, w);
  const std::string bytes = readFile(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 4 * 4) << "data must be contiguous F32";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_NE(header.find("\"__metadata__\":{\"k\":\"v\"}"), std::string::npos) << header;
  EXPECT_LT(header.find("\"alpha\""), header.find("\"zeta\"")) << "keys must be sorted";
  EXPECT_NE(header.find("\"dtype\":\"F32\""), std::string::npos);
  // Data in name order: alpha first.
  EXPECT_EQ(bytes.substr(8 + n, 4), f32Bytes({4.f}));
}

TEST_F(WeightsTest, NoMetadataKeyWhenMetadataIsEmpty) {
  WeightSet w;
  w.tensors["x"] = {{2}, {1.f, 2.f}};
  const std::string p = path("w.safetensors");
  writeSafetensors(p, w);
  EXPECT_EQ(readFile(p).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(readSafetensors(p).metadata.empty());
}

TEST_F(WeightsTest, WriterRejectsInconsistentTensorsAndUnwritablePaths) {
  WeightSet w;
  w.tensors["bad.shape"] = {{2, 3}, {1.f, 2.f}};
  expectError([&] { writeSafetensors(path("w.safetensors"), w); },
              {"'bad.shape'", "[2, 3]", "6 elements"});
  WeightSet ok;
  ok.tensors["x"] = {{1}, {1.f}};
  expectError([&] { writeSafetensors(path("no/such/dir/w.safetensors"), ok); },
              {"cannot open for writing"});
}

TEST_F(WeightsTest, GetNamesTheMissingTensor) {
  WeightSet w;
  EXPECT_FALSE(w.has("nope"));
  expectError([&] { w.get("nope"); }, {"'nope'", "not found"});
}

TEST_F(WeightsTest, ReaderToleratesHeaderPaddingAndGapsAndZeroSizedTensors) {
  // Trailing spaces in the header, an unused gap between tensors, empty tensors at
  // any offset (they overlap nothing), extra entry keys ignored.
  const std::string header = "{" + entryJson("a", "F32", {1}, 8, 12) + "," +
                             entryJson("e1", "F32", {0}, 8, 8) + "," +
                             entryJson("e2", "F16", {3, 0}, 9, 9) + "," +
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                             "\"extra\":true}}       ";
  const std::string data = f32Bytes({5.f, -1.f, 7.f});
  const WeightSet w = readSafetensors(writeFile("w.safetensors", fileBytes(header, data)));
  ASSERT_EQ(w.tensors.size(), 4u);
  EXPECT_EQ(w.get("a").data, std::vector<float>{7.f});
  EXPECT_EQ(w.get("b").data, std::vector<float>{5.f});
  EXPECT_EQ(w.get("e2").shape, (std::vector<int64_t>{3, 0}));
}

// === Safetensors: dtype conversion ==============================================

TEST_F(WeightsTest, F16IsConvertedExactlyIncludingSubnormals) {
  const std::vector<uint16_t> bits = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF,
                                      0x8000, 0x3555, 0x7C00, 0xFC00, 0x7E00, 0x8001};
  const WeightSet w = readSafetensors(
      writeFile("f16.safetensors", rawFile({{"h", "F16", {3, 4}, u16Bytes(bits)}})));
  const std::vector<float> &d = w.get("h").data;
  ASSERT_EQ(d.size(), 12u);
  EXPECT_EQ(w.get("h").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], -2.0f);
  EXPECT_EQ(d[2], std::ldexp(1.0f, -24)); // smallest subnormal
  EXPECT_EQ(d[3], std::ldexp(1023.0f, -24)); // largest subnormal
  EXPECT_EQ(d[4], std::ldexp(1.0f, -14)); // smallest normal
  EXPECT_EQ(d[5], 65504.0f);
  EXPECT_EQ(d[6], 0.0f);
  EXPECT_TRUE(std::signbit(d[6]));
  EXPECT_EQ(d[7], 0.333251953125f);
  EXPECT_EQ(d[8], std::numeric_limits<float>::infinity());
  EXPECT_EQ(d[9], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(d[10]));
  EXPECT_EQ(d[11], -std::ldexp(1.0f, -24));
}

TEST_F(WeightsTest, BF16IsConvertedExactly) {
  const std::vector<uint16_t> bits = {0x3F80, 0xC040, 0x4049, 0x0001, 0x7F80, 0xFF80, 0x7FC0};
  const WeightSet w = readSafetensors(
      writeFile("bf16.safetensors", rawFile({{"b", "BF16", {7}, u16Bytes(bits)}})));
  const std::vector<float> &d = w.get("b").data;
  ASSERT_EQ(d.size(), 7u);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], -3.0f);
  EXPECT_EQ(d[2], 3.140625f);
  EXPECT_EQ(d[3], bitsToFloat(0x00010000)); // a float subnormal, 2^-133
  EXPECT_EQ(d[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(d[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(d[5], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(d[6]));
}

TEST_F(WeightsTest, F64IsRoundedToFloat) {
  const WeightSet w = readSafetensors(writeFile(
      "f64.safetensors", rawFile({{"d", "F64", {4}, f64Bytes({1.5, 0.1, 1e300, -1e300})}})));
  const std::vector<float> &d = w.get("d").data;
  EXPECT_EQ(d[0], 1.5f);
  EXPECT_EQ(d[1], 0.1f);
  EXPECT_EQ(d[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(d[3], -std::numeric_limits<float>::infinity());
}

TEST_F(WeightsTest, F16InfinityIsRejectedByValidation) {
  const ModelSpec spec = tinySpec();
  const WeightSet init = initWeights(spec, 7);
  std::vector<RawTensor> raw = rawTensors(init);
  // layers.0.attn_norm.bias [8] stored as F16: zeros, subnormals, and an infinity.
  const std::vector<uint16_t> bias = {0x0000, 0x0001, 0x8001, 0x7C00, 0, 0, 0, 0};
  for (RawTensor &t : raw)
    if (t.name == "layers.0.attn_norm.bias")
      t = {t.name, "F16", {8}, u16Bytes(bias)};
  const std::string p = writeFile("inf.safetensors", rawFile(raw));
  const WeightSet read = readSafetensors(p);
  EXPECT_EQ(read.get("layers.0.attn_norm.bias").data[1], std::ldexp(1.0f, -24));
  expectError([&] { loadModelWeights(p, spec); },
              {p, "'layers.0.attn_norm.bias'", "non-finite", "inf", "index 3"});

  // Without the infinity the mixed-dtype file loads (subnormals are finite).
  const std::vector<uint16_t> finite = {0x0000, 0x0001, 0x8001, 0x03FF, 0, 0, 0, 0};
  for (RawTensor &t : raw)
    if (t.name == "layers.0.attn_norm.bias")
      t.bytes = u16Bytes(finite);
  EXPECT_NO_THROW(loadModelWeights(writeFile("ok.safetensors", rawFile(raw)), spec));
}

// === Safetensors: malformed files ===============================================

TEST_F(WeightsTest, MissingFileAndDirectoryAreErrors) {
  const std::string p = path("missing.safetensors");
  expectError([&] { readSafetensors(p); }, {p, "cannot open"});
  expectError([&] { readSafetensors(dir_.string()); }, {dir_.string()});
}

TEST_F(WeightsTest, TruncatedFileIsAnError) {
  for (size_t n = 0; n < 8; ++n)
    expectReadError(std::string(n, '\x01'), {"header", "too short"});
}

TEST_F(WeightsTest, TruncatedHeaderIsAnError) {
  const std::string good = rawFile({{"t", "F32", {2}, f32Bytes({1.f, 2.f})}});
  const std::string header = good.substr(8, good.size() - 16);
  // Cut inside the header: the declared length exceeds the file.
  expectReadError(good.substr(0, 8 + header.size() / 2), {"header", "larger than"});
}

TEST_F(WeightsTest, AbsurdHeaderLengthIsAnError) {
  std::string bytes;
  appendLE(bytes, uint64_t(1) << 62, 8);
  expectReadError(bytes + "{}", {"header", "absurd"});
  bytes.clear();
  appendLE(bytes, std::numeric_limits<uint64_t>::max(), 8);
  expectReadError(bytes + "{}", {"header", "absurd"});
}

TEST_F(WeightsTest, HeaderMustBeAJsonObject) {
  expectReadError(fileBytes("{\"t\": {\"dtype\": \"F32\",", ""), {"header", "not valid JSON"});
  expectReadError(fileBytes("", ""), {"header", "not valid JSON"});
  expectReadError(fileBytes("{} trailing", ""), {"header", "not valid JSON"});
  expectReadError(fileBytes("{\"t\":\"\xff\xfe\"}", ""), {"header", "not valid JSON"});
  expectReadError(fileBytes("[1, 2]", ""), {"header", "not a JSON object"});
  expectReadError(fileBytes("\"text\"", ""), {"header", "not a JSON object"});
}

TEST_F(WeightsTest, EmptyHeaderObjectIsAnEmptySet) {
  const WeightSet w = readSafetensors(writeFile("e.safetensors", fileBytes("{}      ", "")));
  EXPECT_TRUE(w.tensors.empty());
  EXPECT_TRUE(w.metadata.empty());
}

TEST_F(WeightsTest, EntryMustBeAnObjectWithTypedFields) {
  const std::string data = f32Bytes({1.f, 2.f});
  auto withEntry = [&](const std::string &entry) {
    return fileBytes("{\"my.tensor\":" + entry + "}", data);
  };
  expectReadError(withEntry("5"), {"'my.tensor'", "not a JSON object"});
  expectReadError(withEntry("[1,2]"), {"'my.tensor'", "not a JSON object"});
  expectReadError(withEntry("{\"shape\":[2],\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "missing 'dtype'"});
  expectReadError(withEntry("{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "'dtype'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "missing 'shape'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "'shape'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "non-integer"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "non-integer"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[-2,-1],\"data_offsets\":[0,8]}"),
                  {"'my.tensor'", "negative dimension -2"});
  expectReadError(
      withEntry("{\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,8]}"),
      {"'my.tensor'", "too large"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2]}"),
                  {"'my.tensor'", "missing 'data_offsets'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}"),
                  {"'my.tensor'", "'data_offsets'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}"),
                  {"'my.tensor'", "'data_offsets'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}"),
                  {"'my.tensor'", "'data_offsets'"});
  expectReadError(withEntry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{}}"),
                  {"'my.tensor'", "'data_offsets'"});
}

TEST_F(WeightsTest, UnsupportedDtypeIsNamed) {
  for (const std::string dtype : {"F8_E4M3", "f32", ""}) {
    expectReadError(rawFile({{"ids", dtype, {1}, std::string(8, '\0')}}),
                    {"'ids'", "unsupported dtype '" + dtype + "'"});
  }
  // Integer buffers (Hugging Face's position_ids) are checked but not loaded; validation rejects them.
  for (auto [dtype, bytes] : {std::pair<std::string, size_t>{"I64", 8}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}}) {
    const WeightSet w = readSafetensors(writeFile("int.safetensors", rawFile({{"ids", dtype, {1}, std::string(bytes, '\0')}})));
    EXPECT_TRUE(w.tensors.empty());
    EXPECT_EQ(w.integerTensors.at("ids"), dtype);
  }
  expectReadError(rawFile({{"ids", "I8", {1}, std::string(8, '\0')}}), {"'ids'", "data_offsets span 8 bytes"});
}

TEST_F(WeightsTest, OffsetsMustBeOrderedAndInsideTheDataSection) {
  const std::string data = f32Bytes({1.f, 2.f, 3.f});
  expectReadError(fileBytes("{" + entryJson("w", "F32", {1}, 8, 4) + "}", data),
                  {"'w'", "begin 8 is after end 4"});
  expectReadError(fileBytes("{" + entryJson("w", "F32", {2}, 8, 16) + "}", data),
                  {"'w'", "beyond the data section (12 bytes)"});
  expectReadError(fileBytes("{" + entryJson("w", "F32", {1}, 18446744073709551611ull,
                                            18446744073709551615ull) +
                                "}",
                            data),
                  {"'w'", "beyond the data section"});
}

TEST_F(WeightsTest, TruncatedDataIsAnError) {
  const std::string good =
      rawFile({{"first", "F32", {2}, f32Bytes({1.f, 2.f})},
               {"second", "F32", {3}, f32Bytes({3.f, 4.f, 5.f})}});
  expectReadError(good.substr(0, good.size() - 1), {"'second'", "beyond the data section"});
}

TEST_F(WeightsTest, SizeMismatchIsAnError) {
  const std::string data = f32Bytes({1.f, 2.f, 3.f, 4.f});
  expectReadError(fileBytes("{" + entryJson("m", "F32", {2, 2}, 0, 12) + "}", data),
                  {"'m'", "12 bytes", "needs 16"});
  expectReadError(fileBytes("{" + entryJson("h", "F16", {3}, 0, 8) + "}", data),
                  {"'h'", "8 bytes", "needs 6"});
  // Products that overflow 64 bits must be caught, not wrapped into a match.
  expectReadError(
      fileBytes("{" + entryJson("huge", "F32", {4294967296, 4294967296, 4}, 0, 16) + "}", data),
      {"'huge'", "too many elements"});
  expectReadError(
      fileBytes("{" + entryJson("wrap", "F32", {4611686018427387904}, 0, 0) + "}", data),
      {"'wrap'", "needs more"});
}

TEST_F(WeightsTest, OverlappingTensorsAreNamed) {
  const std::string data = f32Bytes({1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  expectReadError(fileBytes("{" + entryJson("alpha", "F32", {4}, 0, 16) + "," +
                                entryJson("beta", "F32", {2}, 8, 16) + "}",
                            data),
                  {"'alpha'", "'beta'", "overlap"});
  // An overlap with an earlier, longer range is found past a range in between.
  expectReadError(fileBytes("{" + entryJson("long", "F32", {6}, 0, 24) + "," +
                                entryJson("mid", "F32", {1}, 4, 8) + "}",
                            data),
                  {"'long'", "'mid'", "overlap"});
  // Identical ranges overlap too.
  expectReadError(fileBytes("{" + entryJson("x", "F32", {1}, 4, 8) + "," +
                                entryJson("y", "F32", {1}, 4, 8) + "}",
                            data),
                  {"'x'", "'y'", "overlap"});
}

TEST_F(WeightsTest, DuplicateNamesAreAnError) {
  const std::string data = f32Bytes({1.f, 2.f});
  expectReadError(fileBytes("{" + entryJson("twice", "F32", {1}, 0, 4) + "," +
                                entryJson("twice", "F32", {1}, 4, 8) + "}",
                            data),
                  {"'twice'", "twice"});
}

TEST_F(WeightsTest, MetadataMustMapStringsToStrings) {
  const std::string data = f32Bytes({1.f});
  const std::string t = entryJson("t", "F32", {1}, 0, 4);
  const WeightSet w = readSafetensors(writeFile(
      "m.safetensors",
      fileBytes("{\"__metadata__\":{\"format\":\"pt\",\"x\":\"\"}," + t + "}", data)));
  EXPECT_EQ(w.metadata.at("format"), "pt");
  EXPECT_EQ(w.metadata.at("x"), "");
  EXPECT_EQ(w.tensors.size(), 1u);
  expectReadError(fileBytes("{\"__metadata__\":{\"epoch\":3}," + t + "}", data),
                  {"header", "'epoch'", "not a string"});
  expectReadError(fileBytes("{\"__metadata__\":[\"a\"]," + t + "}", data),
                  {"header", "__metadata__"});
}

TEST_F(WeightsTest, FuzzedFilesNeverCrash) {
  WeightSet w;
  w.tensors["a"] = {{2, 3}, {1, 2, 3, 4, 5, 6}};
  w.tensors["b"] = {{4}, {7, 8, 9, 10}};
  w.metadata = {{"name", "fuzz"}};
  const std::string p = path("seed.safetensors");
  writeSafetensors(p, w);
  std::string seed = readFile(p);
  // Also a mixed-dtype seed, so the F16/BF16 paths get mutated too.
  const std::string seed2 = rawFile({{"h", "F16", {2}, u16Bytes({0x3C00, 0x7C00})},
                                     {"g", "BF16", {1, 2}, u16Bytes({0x3F80, 0x0001})}});

  size_t accepted = 0, rejected = 0;
  auto attempt = [&](const std::string &bytes) {
    const std::string fp = writeFile("fuzz.safetensors", bytes);
    try {
      const WeightSet r = readSafetensors(fp);
      for (const auto &[name, t] : r.tensors) // anything accepted is self-consistent
        ASSERT_EQ(static_cast<uint64_t>(t.numel()), t.data.size()) << name;
      ++accepted;
    } catch (const WeightError &) {
      ++rejected;
    } catch (const std::exception &e) {
      FAIL() << "non-WeightError exception: " << e.what();
    }
  };
  for (size_t n = 0; n <= seed.size(); ++n) // every truncation
    attempt(seed.substr(0, n));
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = (i % 2) ? seed : seed2;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the length and header (where parsing happens), sometimes the data.
      const size_t limit = (rng() % 4) ? std::min<size_t>(bytes.size(), 120) : bytes.size();
      const size_t at = rng() % limit;
      const int mode = static_cast<int>(rng() % 3);
      if (mode == 0)
        bytes[at] = static_cast<char>(rng() & 0xff);
      else if (mode == 1)
        bytes[at] = "0123456789-.e[]{}\",: "[rng() % 21];
      else
        bytes.erase(at, 1);
    }
    attempt(bytes);
  }
  EXPECT_GT(rejected, 0u);
  EXPECT_GT(accepted, 0u);
}

// === Canonical tensor list =======================================================

TEST(WeightNames, SpellTheCanonicalNames) {
  // The names are a contract (DESIGN.md, safetensors files): spelled out here on purpose.
  namespace n = names;
  EXPECT_EQ(n::embedToken(), "embed.token");
  EXPECT_EQ(n::embedPosition(), "embed.position");
  EXPECT_EQ(n::weight(n::embedNorm()), "embed.norm.weight");
  EXPECT_EQ(n::bias(n::embedNorm()), "embed.norm.bias");
  const std::string layer = n::layer(11);
  EXPECT_EQ(layer, "layers.11");
  EXPECT_EQ(n::layer(std::string("11")), layer);
  const std::string attn = n::attn(layer);
  EXPECT_EQ(n::weight(n::q(attn)), "layers.11.attn.q.weight");
  EXPECT_EQ(n::bias(n::k(attn)), "layers.11.attn.k.bias");
  EXPECT_EQ(n::weight(n::v(attn)), "layers.11.attn.v.weight");
  EXPECT_EQ(n::bias(n::o(attn)), "layers.11.attn.o.bias");
  EXPECT_EQ(n::relK(attn), "layers.11.attn.rel_k");
  EXPECT_EQ(n::relV(attn), "layers.11.attn.rel_v");
  EXPECT_EQ(n::weight(n::attnNorm(layer)), "layers.11.attn_norm.weight");
  EXPECT_EQ(n::weight(n::ffnIn(n::ffn(layer))), "layers.11.ffn.in.weight");
  EXPECT_EQ(n::bias(n::ffnOut(n::ffn(layer))), "layers.11.ffn.out.bias");
  EXPECT_EQ(n::bias(n::ffnNorm(layer)), "layers.11.ffn_norm.bias");
  EXPECT_EQ(n::weight(n::finalNorm()), "final_norm.weight");
  EXPECT_EQ(n::bias(n::headTransform()), "head.transform.bias");
  EXPECT_EQ(n::weight(n::headNorm()), "head.norm.weight");
  EXPECT_EQ(n::headOutputWeight(), "head.output.weight");
  EXPECT_EQ(n::headBias(), "head.bias");
  EXPECT_EQ(n::weight(n::ffnIn(n::ngramHead(2))), "ngram.heads.2.in.weight");
  EXPECT_EQ(n::weight(n::q(n::attn(n::encoderLayer(0)))), "encoder.layers.0.attn.q.weight");
  EXPECT_EQ(n::relK(n::attn(n::decoderLayer(1))), "decoder.layers.1.attn.rel_k");
  EXPECT_EQ(n::bias(n::o(n::cross(n::decoderLayer(1)))), "decoder.layers.1.cross.o.bias");
  EXPECT_EQ(n::weight(n::crossNorm(n::decoderLayer(1))), "decoder.layers.1.cross_norm.weight");
  EXPECT_EQ(n::decoderDirection(), "decoder.direction");
}

TEST_F(WeightsTest, ExpectedTensorsForTheDefaultBertLayout) {
  const ModelSpec spec = tinySpec();
  const std::vector<TensorInfo> list = expectedTensors(spec);
  // embed: token, position, norm x2 = 4; per layer 16; head: transform x2, norm x2, bias.
  EXPECT_EQ(list.size(), 4u + 2 * 16 + 5);
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(list.front().name, "embed.token");
  EXPECT_EQ(list.front().shape, (std::vector<int64_t>{13, 8}));
  std::set<std::string> names;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorInfo &t : list) {
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
    shapes[t.name] = t.shape;
  }
  using S = std::vector<int64_t>;
  EXPECT_EQ(shapes.at("embed.position"), (S{6, 8}));
  EXPECT_EQ(shapes.at("embed.norm.weight"), (S{8}));
  EXPECT_EQ(shapes.at("layers.1.attn.o.weight"), (S{8, 8}));
  EXPECT_EQ(shapes.at("layers.1.attn.v.bias"), (S{8}));
  EXPECT_EQ(shapes.at("layers.0.ffn.in.weight"), (S{12, 8}));
  EXPECT_EQ(shapes.at("layers.0.ffn.in.bias"), (S{12}));
  EXPECT_EQ(shapes.at("layers.0.ffn.out.weight"), (S{8, 12}));
  EXPECT_EQ(shapes.at("layers.0.ffn.out.bias"), (S{8}));
  EXPECT_EQ(shapes.at("layers.1.ffn_norm.bias"), (S{8}));
  EXPECT_EQ(shapes.at("layers.0.attn_norm.weight"), (S{8}));
  EXPECT_EQ(shapes.at("head.transform.weight"), (S{8, 8}));
  EXPECT_EQ(shapes.at("head.norm.bias"), (S{8}));
  EXPECT_EQ(shapes.at("head.bias"), (S{13}));
  EXPECT_EQ(shapes.count("head.output.weight"), 0u);
  EXPECT_EQ(shapes.count("final_norm.weight"), 0u);
  EXPECT_EQ(shapes.count("layers.2.attn.q.weight"), 0u);
  EXPECT_EQ(expectedTensors(spec).size(), list.size()) << "stable";
}

TEST_F(WeightsTest, ExpectedTensorCountsFollowTheSpecOptions) {
  const size_t base = expectedTensors(tinySpec()).size();
  auto count = [](const std::function<void(ModelSpec &)> &edit) {
    ModelSpec spec = tinySpec();
    edit(spec);
    return expectedTensors(spec);
  };
  auto has = [](const std::vector<TensorInfo> &list, const std::string &name) {
    for (const TensorInfo &t : list)
      if (t.name == name)
        return true;
    return false;
  };

  auto untied = count([](ModelSpec &s) { s.tied = false; });
  EXPECT_EQ(untied.size(), base + 1);
  EXPECT_TRUE(has(untied, "head.output.weight"));

  auto pre = count([](ModelSpec &s) { s.norm = NormPlacement::Pre; });
  EXPECT_EQ(pre.size(), base + 2);
  EXPECT_TRUE(has(pre, "final_norm.weight") && has(pre, "final_norm.bias"));

  auto noTransform = count([](ModelSpec &s) { s.headTransform = false; });
  EXPECT_EQ(noTransform.size(), base - 4);
  EXPECT_FALSE(has(noTransform, "head.transform.weight") || has(noTransform, "head.norm.weight"));

  auto minimal = count([](ModelSpec &s) {
    s.tied = false;
    s.norm = NormPlacement::Pre;
    s.headTransform = false;
    s.headBias = false;
    s.embeddingNorm = false;
    s.position = PositionKind::Sinusoidal;
  });
  EXPECT_EQ(minimal.size(), base + 1 + 2 - 4 - 1 - 2 - 1);
  EXPECT_FALSE(has(minimal, "embed.position") || has(minimal, "embed.norm.weight") ||
               has(minimal, "head.bias"));

  auto relative = count([](ModelSpec &s) { s.relativePositions = 2; });
  EXPECT_EQ(relative.size(), base + 2 * 2);
  for (const TensorInfo &t : relative) {
    if (t.name == "layers.1.attn.rel_k" || t.name == "layers.1.attn.rel_v") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{5, 4})); // [2k+1, D/heads]
    }
  }
  EXPECT_TRUE(has(relative, "layers.0.attn.rel_v"));

  auto oneLayer = count([](ModelSpec &s) { s.dims.layers = 1; });
  EXPECT_EQ(oneLayer.size(), base - 16);
}

TEST_F(WeightsTest, DiformerNeedsItsStacks) {
  { // Diformer (issue 19) has weights once its stacks are sized.
    ModelSpec spec = tinySpec();
    spec.family = Family::Diformer;
    expectError([&] { expectedTensors(spec); }, {"family diformer", "encoder/decoder sizes"});
    spec.diformer = DiformerOptions{StackDims{1, 2, 8}, StackDims{2, 1, 6}, 0.1};
    spec.relativePositions = 2;
    std::vector<TensorInfo> list = expectedTensors(spec);
    auto has = [&](const std::string &n) {
      return std::any_of(list.begin(), list.end(), [&](const TensorInfo &t) { return t.name == n; });
    };
    EXPECT_TRUE(has("length.weight") && has("decoder.direction") && has("decoder.position.r2l") &&
                has("decoder.layers.1.attn.rel_k") && has("decoder.layers.1.cross.o.bias") &&
                has("encoder.layers.0.ffn.in.weight"));
    EXPECT_FALSE(has("encoder.layers.0.attn.rel_k") || has("decoder.layers.0.cross.rel_k"));
    EXPECT_FALSE(has("encoder.final_norm.weight") || has("decoder.final_norm.weight") || has("final_norm.weight"));
    EXPECT_NO_THROW(initWeights(spec, 1));
    // Pre-norm blocks: one final norm after each stack, nothing else changes.
    const size_t post = list.size();
    spec.norm = NormPlacement::Pre;
    list = expectedTensors(spec);
    EXPECT_EQ(list.size(), post + 4);
    EXPECT_TRUE(has("encoder.final_norm.weight") && has("encoder.final_norm.bias") &&
                has("decoder.final_norm.weight") && has("decoder.final_norm.bias"));
    EXPECT_FALSE(has("final_norm.weight"));
  }
  for (Family f : {Family::UniLM, Family::BiLM, Family::TTA}) {
    ModelSpec spec = tinySpec();
    spec.family = f;
    EXPECT_NO_THROW(expectedTensors(spec));
  }
}

TEST_F(WeightsTest, NGramHeads) {
  // Issue 18: as uniLM plus ngram.heads.{j}.{in,out} for j = 2..n, in [d_hidden, d], out [d, d_hidden].
  ModelSpec spec = tinySpec();
  spec.family = Family::NGram;
  spec.headTransform = false;
  spec.ngram = NGramOptions{};
  spec.ngram->n = 3;
  spec.ngram->dHidden = 5;
  const int64_t D = spec.dims.dModel;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorInfo &t : expectedTensors(spec))
    shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.count("ngram.heads.1.in.weight"), 0u);
  EXPECT_EQ(shapes.count("ngram.heads.4.in.weight"), 0u);
  for (int j : {2, 3}) {
    const std::string h = "ngram.heads." + std::to_string(j);
    EXPECT_EQ(shapes[h + ".in.weight"], (std::vector<int64_t>{5, D}));
    EXPECT_EQ(shapes[h + ".in.bias"], (std::vector<int64_t>{5}));
    EXPECT_EQ(shapes[h + ".out.weight"], (std::vector<int64_t>{D, 5}));
    EXPECT_EQ(shapes[h + ".out.bias"], (std::vector<int64_t>{D}));
  }
  EXPECT_NO_THROW(validateWeights(initWeights(spec, 1), spec, "w.safetensors"));
}

// === Validation ==================================================================

TEST_F(WeightsTest, ValidateAcceptsInitializedWeights) {
  const ModelSpec spec = tinySpec();
  EXPECT_NO_THROW(validateWeights(initWeights(spec, 1), spec, "mem"));
}

TEST_F(WeightsTest, ValidateReportsMissingTensor) {
  const ModelSpec spec = tinySpec();
  WeightSet w = initWeights(spec, 1);
  w.tensors.erase("layers.1.ffn.out.bias");
  expectError([&] { validateWeights(w, spec, "model.safetensors"); },
              {"model.safetensors", "'layers.1.ffn.out.bias'", "missing", "[8]"});
}

TEST_F(WeightsTest, ValidateReportsUnexpectedTensor) {
  const ModelSpec spec = tinySpec();
  WeightSet w = initWeights(spec, 1);
  w.tensors["layers.2.attn.q.weight"] = filled({8, 8}, 0.f);
  expectError([&] { validateWeights(w, spec, "f"); },
              {"'layers.2.attn.q.weight'", "unexpected"});
  w.tensors.erase("layers.2.attn.q.weight");
  w.tensors["head.output.weight"] = filled({13, 8}, 0.f);
  expectError([&] { validateWeights(w, spec, "f"); },
              {"'head.output.weight'", "unexpected", "ties"});
}

TEST_F(WeightsTest, ValidateReportsWrongShape) {
  const ModelSpec spec = tinySpec();
  WeightSet w = initWeights(spec, 1);
  w.tensors["embed.token"] = filled({14, 8}, 0.f);
  expectError([&] { validateWeights(w, spec, "f"); },
              {"'embed.token'", "expected [13, 8], got [14, 8]"});
  w = initWeights(spec, 1);
  w.tensors["layers.0.ffn.in.weight"] = filled({8, 12}, 0.f); // transposed
  expectError([&] { validateWeights(w, spec, "f"); },
              {"'layers.0.ffn.in.weight'", "expected [12, 8], got [8, 12]"});
  w = initWeights(spec, 1);
  w.tensors["head.bias"].data.pop_back(); // shape right, data short
  expectError([&] { validateWeights(w, spec, "f"); }, {"'head.bias'", "12 values"});
}

TEST_F(WeightsTest, ValidateReportsNonFiniteValues) {
  const ModelSpec spec = tinySpec();
  WeightSet w = initWeights(spec, 1);
  w.tensors["embed.position"].data[7] = std::nanf("");
  expectError([&] { validateWeights(w, spec, "f"); },
              {"'embed.position'", "non-finite", "nan", "index 7"});
  w = initWeights(spec, 1);
  w.tensors["head.norm.weight"].data[0] = -std::numeric_limits<float>::infinity();
  expectError([&] { validateWeights(w, spec, "f"); }, {"'head.norm.weight'", "-inf", "index 0"});
}

TEST_F(WeightsTest, LoadModelWeightsRoundTripsAndNamesTheFile) {
  const ModelSpec spec = tinySpec();
  const WeightSet w = initWeights(spec, 99);
  const std::string p = path("model.safetensors");
  writeSafetensors(p, w);
  EXPECT_TRUE(bitwiseEqual(loadModelWeights(p, spec), w));

  ModelSpec other = tinySpec();
  other.dims.dFF = 16;
  expectError([&] { loadModelWeights(p, other); },
              {p, "'layers.0.ffn.in.weight'", "expected [16, 8], got [12, 8]"});
  ModelSpec untied = tinySpec();
  untied.tied = false;
  expectError([&] { loadModelWeights(p, untied); }, {p, "'head.output.weight'", "missing"});
}

// === Initialization ==============================================================

TEST_F(WeightsTest, InitIsDeterministicPerSeed) {
  const ModelSpec spec = tinySpec();
  const WeightSet a = initWeights(spec, 1234), b = initWeights(spec, 1234);
  const WeightSet c = initWeights(spec, 1235);
  EXPECT_TRUE(bitwiseEqual(a, b));
  EXPECT_FALSE(bitwiseEqual(a.get("embed.token").data, c.get("embed.token").data));
  EXPECT_FALSE(bitwiseEqual(a.get("layers.1.ffn.out.weight").data,
                            c.get("layers.1.ffn.out.weight").data));
  // Different tensors draw different values.
  EXPECT_FALSE(bitwiseEqual(a.get("layers.0.attn.q.weight").data,
                            a.get("layers.0.attn.k.weight").data));
}

TEST_F(WeightsTest, InitValuesArePinned) {
  // mt19937_64 and the Box-Muller transform are fully specified, so these values are
  // the same on every platform; a change here changes every seeded model.
  const WeightSet w = initWeights(tinySpec(), 42);
  const std::vector<float> &e = w.get("embed.token").data;
  ASSERT_GE(e.size(), 3u);
  uint32_t bits[3];
  for (int i = 0; i < 3; ++i)
    std::memcpy(&bits[i], &e[i], 4);
  EXPECT_EQ(bits[0], 0xBC1DAF77u) << e[0]; // -0.0096243536
  EXPECT_EQ(bits[1], 0xBC3C43A5u) << e[1]; // -0.0114907371
  EXPECT_EQ(bits[2], 0x3C2210B3u) << e[2]; //  0.0098916767
}

TEST_F(WeightsTest, InitFollowsBertConventions) {
  ModelSpec spec = tinySpec();
  spec.dims.vocab = 1000;
  spec.dims.dModel = 64;
  spec.dims.heads = 4;
  spec.tied = false;
  spec.norm = NormPlacement::Pre;
  spec.relativePositions = 3;
  const WeightSet w = initWeights(spec, 5);
  EXPECT_NO_THROW(validateWeights(w, spec, "init"));
  EXPECT_EQ(w.metadata.at("name"), "tiny");
  EXPECT_EQ(w.metadata.at("format"), "lmcc");
  EXPECT_EQ(w.metadata.at("spec_hash"), specHash(spec));

  double sum = 0, sumSq = 0;
  size_t n = 0;
  for (const auto &[name, t] : w.tensors) {
    const bool isNorm = name.find("norm.") != std::string::npos;
    const bool isBias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    for (float v : t.data) {
      if (isNorm && !isBias) {
        ASSERT_EQ(v, 1.0f) << name;
      } else if (isBias) {
        ASSERT_EQ(v, 0.0f) << name;
      } else {
        ASSERT_LE(std::fabs(v), 0.04f) << name;
        sum += v;
        sumSq += double(v) * v;
        ++n;
      }
    }
  }
  ASSERT_GT(n, 100000u);
  const double mean = sum / n, stddev = std::sqrt(sumSq / n - mean * mean);
  // N(0, 0.02) truncated at 2 sigma has standard deviation 0.02 * 0.8796.
  EXPECT_NEAR(mean, 0.0, 3e-4);
  EXPECT_NEAR(stddev, 0.02 * 0.8796, 0.02 * 0.8796 * 0.02);
  EXPECT_EQ(w.get("head.bias").data, std::vector<float>(1000, 0.0f));
  for (const char *name : {"embed.position", "head.output.weight", "layers.0.attn.rel_k"}) {
    const std::vector<float> &d = w.get(name).data;
    EXPECT_NE(*std::max_element(d.begin(), d.end()), 0.0f) << name;
  }
}

// === Hugging Face BERT import ===================================================

/// A tiny fake BertForMaskedLM state dict for tinySpec(): every tensor filled with
/// a value unique to its name (its index), so the renaming can be checked.
struct FakeBert {
  WeightSet set;
  std::map<std::string, float> tag; // HF name -> fill value
  int64_t positionRows = 9;         // > max_len 6: must be cut

  explicit FakeBert(const ModelSpec &spec, bool prefix = true, int64_t rows = 9)
      : positionRows(rows) {
    const int64_t V = spec.dims.vocab, D = spec.dims.dModel, F = spec.dims.dFF;
    const std::string b = prefix ? "bert." : "";
    add(b + "embeddings.word_embeddings.weight", {V, D});
    add(b + "embeddings.LayerNorm.gamma", {D}); // TF-era names
    add(b + "embeddings.LayerNorm.beta", {D});
    add(b + "embeddings.position_ids", {1, rows});
    // Position table: value r * 100 + c; token types: row 0 = 0.5 (c + 1), row 1 = 1000.
    Tensor pos = filled({rows, D}, 0.f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < D; ++c)
        pos.data[r * D + c] = float(r * 100 + c);
    set.tensors[b + "embeddings.position_embeddings.weight"] = pos;
    Tensor types = filled({2, D}, 1000.f);
    for (int64_t c = 0; c < D; ++c)
      types.data[c] = 0.5f * float(c + 1);
    set.tensors[b + "embeddings.token_type_embeddings.weight"] = types;
    for (int64_t i = 0; i < spec.dims.layers; ++i) {
      const std::string l = b + "encoder.layer." + std::to_string(i) + ".";
      for (const char *p : {"attention.self.query.", "attention.self.key.",
                            "attention.self.value.", "attention.output.dense."}) {
        add(l + p + "weight", {D, D});
        add(l + p + "bias", {D});
      }
      add(l + "attention.output.LayerNorm.weight", {D});
      add(l + "attention.output.LayerNorm.bias", {D});
      add(l + "intermediate.dense.weight", {F, D});
      add(l + "intermediate.dense.bias", {F});
      add(l + "output.dense.weight", {D, F});
      add(l + "output.dense.bias", {D});
      add(l + "output.LayerNorm.weight", {D});
      add(l + "output.LayerNorm.bias", {D});
    }
    add(b + "pooler.dense.weight", {D, D});
    add(b + "pooler.dense.bias", {D});
    add("cls.predictions.transform.dense.weight", {D, D});
    add("cls.predictions.transform.dense.bias", {D});
    add("cls.predictions.transform.LayerNorm.weight", {D});
    add("cls.predictions.transform.LayerNorm.bias", {D});
    add("cls.predictions.bias", {V});
    set.tensors["cls.predictions.decoder.bias"] = set.tensors["cls.predictions.bias"];
    // A tied checkpoint's decoder weight is the word embeddings (an untied one its own matrix).
    if (spec.tied)
      set.tensors["cls.predictions.decoder.weight"] = set.tensors[b + "embeddings.word_embeddings.weight"];
    else
      add("cls.predictions.decoder.weight", {V, D});
    add("cls.seq_relationship.weight", {2, D});
    add("cls.seq_relationship.bias", {2});
  }

  void add(const std::string &name, std::vector<int64_t> shape) {
    const float value = float(tag.size() + 1) / 64.f;
    tag[name] = value;
    set.tensors[name] = filled(std::move(shape), value);
  }
};

TEST_F(WeightsTest, DetectsHuggingFaceNames) {
  const ModelSpec spec = tinySpec();
  EXPECT_TRUE(isHuggingFaceBert(FakeBert(spec).set));
  EXPECT_TRUE(isHuggingFaceBert(FakeBert(spec, /*prefix=*/false).set));
  EXPECT_FALSE(isHuggingFaceBert(initWeights(spec, 1)));
  EXPECT_FALSE(isHuggingFaceBert(WeightSet{}));
}

TEST_F(WeightsTest, ImportsHuggingFaceBert) {
  const ModelSpec spec = tinySpec();
  const FakeBert hf(spec);
  const WeightSet w = importHuggingFaceBert(hf.set, spec, "hf.safetensors");
  EXPECT_NO_THROW(validateWeights(w, spec, "hf.safetensors"));

  auto expectFrom = [&](const std::string &canonical, const std::string &hfName) {
    ASSERT_TRUE(w.has(canonical)) << canonical;
    EXPECT_EQ(w.get(canonical).data, hf.set.get(hfName).data) << canonical << " <- " << hfName;
  };
  expectFrom("embed.token", "bert.embeddings.word_embeddings.weight");
  expectFrom("embed.norm.weight", "bert.embeddings.LayerNorm.gamma");
  expectFrom("embed.norm.bias", "bert.embeddings.LayerNorm.beta");
  expectFrom("layers.1.attn.q.weight", "bert.encoder.layer.1.attention.self.query.weight");
  expectFrom("layers.1.attn.k.bias", "bert.encoder.layer.1.attention.self.key.bias");
  expectFrom("layers.0.attn.v.weight", "bert.encoder.layer.0.attention.self.value.weight");
  expectFrom("layers.0.attn.o.bias", "bert.encoder.layer.0.attention.output.dense.bias");
  expectFrom("layers.0.attn_norm.weight",
             "bert.encoder.layer.0.attention.output.LayerNorm.weight");
  expectFrom("layers.1.ffn.in.weight", "bert.encoder.layer.1.intermediate.dense.weight");
  expectFrom("layers.1.ffn.out.bias", "bert.encoder.layer.1.output.dense.bias");
  expectFrom("layers.1.ffn_norm.bias", "bert.encoder.layer.1.output.LayerNorm.bias");
  expectFrom("head.transform.weight", "cls.predictions.transform.dense.weight");
  expectFrom("head.norm.bias", "cls.predictions.transform.LayerNorm.bias");
  expectFrom("head.bias", "cls.predictions.bias");
  EXPECT_FALSE(w.has("head.output.weight")) << "tied: the decoder weight is ignored";

  // Position table cut to max_len, token-type row 0 folded into every row.
  const Tensor &pos = w.get("embed.position");
  ASSERT_EQ(pos.shape, (std::vector<int64_t>{6, 8}));
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 8; ++c)
      EXPECT_EQ(pos.data[r * 8 + c], float(r * 100 + c) + 0.5f * float(c + 1)) << r << "," << c;
}

TEST_F(WeightsTest, ImportAcceptsNamesWithoutBertPrefixAndExactPositionTable) {
  const ModelSpec spec = tinySpec();
  const WeightSet withPrefix = importHuggingFaceBert(FakeBert(spec).set, spec, "a");
  const WeightSet without =
      importHuggingFaceBert(FakeBert(spec, /*prefix=*/false).set, spec, "b");
  EXPECT_TRUE(bitwiseEqual(withPrefix, without));
  const WeightSet exact = importHuggingFaceBert(FakeBert(spec, true, /*rows=*/6).set, spec, "c");
  EXPECT_TRUE(bitwiseEqual(exact.get("embed.position").data, withPrefix.get("embed.position").data));
}

// Under a tied spec the decoder weight is dropped only when it is the word embeddings: another matrix would make
// the scores silently another model's.
TEST_F(WeightsTest, ImportRefusesAnUntiedDecoderUnderATiedSpec) {
  ModelSpec spec = tinySpec();
  FakeBert hf(spec);
  hf.set.tensors["cls.predictions.decoder.weight"].data[3] += 1.0f;
  expectError([&] { importHuggingFaceBert(hf.set, spec, "hf"); },
                    {"'cls.predictions.decoder.weight'", "differs from the word embeddings", "tied = false"});
}

TEST_F(WeightsTest, ImportMapsTheDecoderWhenUntied) {
  ModelSpec spec = tinySpec();
  spec.tied = false;
  FakeBert hf(spec);
  hf.set.tensors.erase("cls.predictions.bias"); // the decoder.bias alias alone suffices
  const WeightSet w = importHuggingFaceBert(hf.set, spec, "hf");
  EXPECT_NO_THROW(validateWeights(w, spec, "hf"));
  EXPECT_EQ(w.get("head.output.weight").data,
            hf.set.get("cls.predictions.decoder.weight").data);
  EXPECT_EQ(w.get("head.bias").data, hf.set.get("cls.predictions.decoder.bias").data);
}

// The imported set is checked against the spec where the checkpoint's names are known: errors name the file the
// user gave and the Hugging Face tensor beside the canonical one.
TEST_F(WeightsTest, ImportChecksTheResultNamingTheCheckpointsTensor) {
  const ModelSpec spec = tinySpec();
  FakeBert shape(spec);
  shape.set.tensors["bert.encoder.layer.1.output.LayerNorm.bias"] = filled({3}, 0.f);
  expectError([&] { importHuggingFaceBert(shape.set, spec, "mine.safetensors"); },
              {"mine.safetensors: tensor 'layers.1.ffn_norm.bias' (Hugging Face "
               "'bert.encoder.layer.1.output.LayerNorm.bias'):"});
  FakeBert nan(spec);
  nan.set.tensors["bert.encoder.layer.0.intermediate.dense.bias"].data[2] = NAN;
  expectError([&] { importHuggingFaceBert(nan.set, spec, "mine.safetensors"); },
              {"mine.safetensors", "'bert.encoder.layer.0.intermediate.dense.bias'", "non-finite"});
}

TEST_F(WeightsTest, ImportRejectsAShortPositionTable) {
  const ModelSpec spec = tinySpec();
  const FakeBert hf(spec, true, /*rows=*/5);
  expectError([&] { importHuggingFaceBert(hf.set, spec, "short.safetensors"); },
              {"short.safetensors", "'bert.embeddings.position_embeddings.weight'", "5 rows",
               "max_len is 6"});
}

TEST_F(WeightsTest, ImportRejectsUnknownAndConflictingNames) {
  const ModelSpec spec = tinySpec();
  FakeBert hf(spec);
  hf.set.tensors["bert.encoder.layer.0.attention.self.query.extra"] = filled({1}, 0.f);
  expectError([&] { importHuggingFaceBert(hf.set, spec, "hf"); },
              {"'bert.encoder.layer.0.attention.self.query.extra'", "not a Hugging Face"});

  FakeBert other(spec);
  other.set.tensors["bert.encoder.layer.01.output.dense.bias"] = filled({8}, 0.f);
  other.set.tensors["bert.cls.predictions.bias"] = filled({13}, 0.f);
  expectError([&] { importHuggingFaceBert(other.set, spec, "hf"); },
              {"'bert.cls.predictions.bias'", "'bert.encoder.layer.01.output.dense.bias'",
               "1 more unknown"});

  FakeBert dup(spec);
  dup.set.tensors["embeddings.word_embeddings.weight"] = filled({13, 8}, 0.f);
  expectError([&] { importHuggingFaceBert(dup.set, spec, "hf"); },
              {"'embed.token'", "word_embeddings"});

  FakeBert bias(spec);
  bias.set.tensors["cls.predictions.decoder.bias"].data[0] = 5.f;
  expectError([&] { importHuggingFaceBert(bias.set, spec, "hf"); },
              {"'cls.predictions.decoder.bias'", "differs"});

  ModelSpec sinusoidal = tinySpec();
  sinusoidal.position = PositionKind::Sinusoidal;
  expectError([&] { importHuggingFaceBert(FakeBert(sinusoidal).set, sinusoidal, "hf"); },
              {"'bert.embeddings.position_embeddings.weight'", "learned"});

  FakeBert types(spec);
  types.set.tensors["bert.embeddings.token_type_embeddings.weight"] = filled({2, 7}, 0.f);
  expectError([&] { importHuggingFaceBert(types.set, spec, "hf"); },
              {"'bert.embeddings.token_type_embeddings.weight'", "[2, 7]"});
}

TEST_F(WeightsTest, ImportedCheckpointMissingATensorFailsValidation) {
  const ModelSpec spec = tinySpec();
  FakeBert hf(spec);
  hf.set.tensors.erase("bert.encoder.layer.1.intermediate.dense.bias");
  expectError([&] { importHuggingFaceBert(hf.set, spec, "hf"); }, {"hf: tensor 'layers.1.ffn.in.bias'", "missing"});
}

TEST_F(WeightsTest, LoadModelWeightsImportsHuggingFaceFiles) {
  const ModelSpec spec = tinySpec();
  const FakeBert hf(spec);
  const std::string p = path("pytorch_model.safetensors");
  writeSafetensors(p, hf.set);
  const WeightSet loaded = loadModelWeights(p, spec);
  EXPECT_TRUE(bitwiseEqual(loaded, importHuggingFaceBert(hf.set, spec, p)));
  EXPECT_TRUE(loaded.has("embed.position"));
}

} // namespace

// A BertModel checkpoint (no "bert." prefix, no MLM head, an I64 position_ids buffer) for an encoder-only
// spec; the MLM head of a BertForMaskedLM file is ignored by such a spec; integer tensors that are not
// buffers are rejected by name.
TEST_F(WeightsTest, ImportsBertModelForEncoderOnlySpecs) {
  ModelSpec spec = tinySpec();
  spec.mlm = false;
  FakeBert hf(spec, /*prefix=*/false);
  for (auto it = hf.set.tensors.begin(); it != hf.set.tensors.end();)
    it = it->first.rfind("cls.", 0) == 0 || it->first.find("position_ids") != std::string::npos
             ? hf.set.tensors.erase(it)
             : std::next(it);
  hf.set.integerTensors["embeddings.position_ids"] = "I64";
  WeightSet w = importHuggingFaceBert(hf.set, spec, "model.safetensors");
  validateWeights(w, spec, "model.safetensors");
  EXPECT_FALSE(w.has("head.bias"));
  EXPECT_EQ(expectedTensors(spec).size() + 5, expectedTensors(tinySpec()).size()); // no transform, norm (2 each), bias

  const FakeBert mlm(spec); // with cls.predictions.*: ignored for mlm = false
  validateWeights(importHuggingFaceBert(mlm.set, spec, "mlm.safetensors"), spec, "mlm.safetensors");

  hf.set.integerTensors["encoder.layer.0.output.dense.weight"] = "I32";
  expectError([&] { importHuggingFaceBert(hf.set, spec, "model.safetensors"); },
              {"model.safetensors", "'encoder.layer.0.output.dense.weight'", "integer dtype 'I32'"});
  WeightSet canonical = initWeights(spec, 1);
  canonical.integerTensors["embed.token"] = "I64";
  expectError([&] { validateWeights(canonical, spec, "c.safetensors"); },
              {"c.safetensors", "'embed.token'", "integer dtype 'I64': model weights are floating point"});
}
