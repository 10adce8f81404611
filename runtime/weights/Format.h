//===- Format.h - How names, shapes and values appear in messages ---------===//
//
// Shared by safetensors I/O, model weights, the reference executor and liblmrt,
// so that every WeightError and lm_last_error() message formats the same way.
// Spec-free (liblmrt compiles it).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lmcc {

/// A name as it appears in messages: quoted, and shortened when a hostile file uses
/// an enormous one: 'NAME', or 'FIRST 200 BYTES...' (N bytes).
std::string quoted(const std::string &name);

/// "[d0, d1, ...]"; past 16 dimensions "[d0, ..., d15, ... (N dims)]".
std::string shapeString(const std::vector<int64_t> &shape);

/// "nan", "inf", "-inf", or std::to_string(v) for a finite value.
std::string valueString(float v);

} // namespace lmcc
