//===- Header.h - The generated C header, C glue and weight layout ---------===//
//
// `lmcc compile SPEC -o DIR` writes DIR/<name>.h (generateHeader) and builds
// DIR/lib<name>.so from the compiled kernels plus a generated C file
// (generateGlue) that describes the model to the runtime (lm_model_desc in
// runtime/lib/lmrt.h) and forwards <name>_load/_score/_embed/_free to lm_rt_*.
// Plain C++: no MLIR.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/weights/Safetensors.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace lmcc::codegen {

/// Float alignment of every tensor in the flat weight buffer (16 floats = 64 bytes).
constexpr int64_t kWeightAlignFloats = 16;

/// The flat weight layout shared by the kernels and the runtime: tensor i starts at
/// offsets[i] (in floats), each offset rounded up to a multiple of kWeightAlignFloats,
/// tensors in the given order. *totalFloats (when non-null) receives the buffer size,
/// also a multiple of kWeightAlignFloats. The kernel codegen uses this same function.
std::vector<int64_t> weightOffsets(const std::vector<TensorInfo> &tensors, int64_t *totalFloats);
/// The same, except that tensors named in `packed` follow the previous tensor with no
/// padding (weights stacked by lm.concat must lie back to back to be one view).
std::vector<int64_t> weightOffsets(const std::vector<TensorInfo> &tensors, int64_t *totalFloats,
                                   const std::set<std::string> &packed);

/// The public C header `<name>.h` (C99 and C++17, extern "C"): dimension macros,
/// <name>_load/_score/_embed/_free, lm_last_error, lm_set_num_threads and, for C++,
/// RAII wrappers in namespace <name>. Headers of different models can be included
/// in one translation unit. `embedWeights` only changes the documentation and the
/// <NAME>_EMBEDDED_WEIGHTS macro (1 when <name>_load accepts a NULL path).
std::string generateHeader(const ModelSpec &spec, bool embedWeights = false);

/// The C glue source compiled into lib<name>.so. It includes "lmrt.h", declares the
/// kernels `_mlir_ciface_<name>_score_kernel` / `_mlir_ciface_<name>_embed_kernel`,
/// holds the tensor table (names and shapes from `tensors`, offsets from `offsets`)
/// and the lm_model_desc, and defines the header's functions plus
/// `const lm_model_desc *<name>_descriptor(void)`. With `embedWeights` the descriptor
/// points at `extern const float <name>_embedded_weights[]` (defined by the kernels'
/// object file) and <name>_load accepts a NULL path.
/// Throws std::invalid_argument when the tables disagree or the name would collide
/// with the runtime's symbols.
std::string generateGlue(const ModelSpec &spec, const std::vector<TensorInfo> &tensors,
                         const std::vector<int64_t> &offsets, int64_t totalFloats, bool embedWeights);

} // namespace lmcc::codegen
