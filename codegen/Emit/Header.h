//===- Header.h - The generated C header, C glue and weight layout ---------===//
//
// `lmcc compile SPEC -o DIR` writes DIR/<name>.h (generateHeader) and builds
// DIR/lib<name>.so from the compiled kernels plus a generated C file
// (generateGlue) that describes the model to the runtime (lm_model_desc in
// runtime/lib/lmrt.h) and forwards <name>_load/_score/_embed/_free to lm_rt_*.
// Plain C++: no MLIR, nothing from the frontend.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "codegen/Layout/WeightLayout.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace lmcc::codegen {

/// What the header and the glue say about a model, read off the lm IR's module attributes
/// (lm.model, lm.family, lm.spec_hash; readModelFacts in codegen/Emit/Facts.cpp).
struct ModelFacts {
  std::string name, family, specHash;
  int64_t vocab = 0, maxLen = 0, dModel = 0, heads = 0, dFF = 0, layers = 0;
  int64_t pad = 0, unk = 0, bos = 0, eos = 0, mask = 0;
  /// Compiled with --train: the optimizer settings of lm_train_desc (runtime/lib/lmrt.h), from the
  /// spec's [train]; the library then has the loss kernels and the header the training functions.
  struct Train {
    int optimizer = 0, schedule = 0; ///< lm_train_desc codes
    double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0, clipNorm = 0, labelSmoothing = 0;
    int64_t warmupSteps = 0, steps = 0, seed = 0;
    int64_t numParams = 0; ///< floats of all parameters (<NAME>_N_PARAMS, the packed gradient's size)
  };
  std::optional<Train> train;
  bool hasScore = true; ///< false for an encoder-only model (no @score entry: <name>_score returns an error)
  bool scoreSpans = false; ///< mask-and-predict scoring: the score kernel takes spans (lm_span_score_kernel)
  bool pairs = false;      ///< Diformer: the score kernel scores source/target pairs (lm_pair_score_kernel)
  bool decoding = false;   ///< Diformer: the encode, token_kv, decode and step kernels of lm_rt_translate
  int64_t kvWidth = 0;     ///< Diformer: features of a token's cached decoder keys/values (token_kv's result)
  bool hasEmbed = true;    ///< false for the Diformer (no embed entry: <name>_embed returns an error)
  /// Mask-and-predict embedding: the embed kernel takes spans and returns the states [B, N, D], which the runtime
  /// pools (lm_span_embed_kernel, ABI 10) by embedPool (0 mean less embedExclude, 1 mean_all, 2 cls) and
  /// embedNormalize.
  bool embedStates = false;
  int embedPool = 0;
  bool embedNormalize = false;
  std::vector<int32_t> embedExclude;
  double lengthLoss = 0;   ///< the Diformer's length-loss weight (lm.length_loss of its pair loss)
  bool amx = false;        ///< the kernels use AMX tiles (bf16 weights on a CPU with AMX-BF16)
  /// Memory model of the entry points (codegen/Stats.h memoryModel), index n = 0..maxLen; empty: none.
  std::vector<int64_t> scoreSentenceBytes, scoreCopyBytes, embedSentenceBytes, embedCopyBytes;
  std::vector<int64_t> scoreThreadBytes, embedThreadBytes; ///< the memory model's per-thread term (ABI 8)
};

/// The public C header `<name>.h` (C99 and C++17, extern "C"): dimension macros,
/// <name>_load/_score/_embed/_free, lm_last_error, lm_set_num_threads and, for C++,
/// RAII wrappers in namespace <name>. Headers of different models can be included
/// in one translation unit. `embedWeights` only changes the documentation and the
/// <NAME>_EMBEDDED_WEIGHTS macro (1 when <name>_load accepts a NULL path).
std::string generateHeader(const ModelFacts &model, bool embedWeights = false);

/// The C glue source compiled into lib<name>.so. It includes "lmrt.h", declares the
/// kernels `_mlir_ciface_<name>_score_kernel` / `_mlir_ciface_<name>_embed_kernel`,
/// holds the tensor table (names and shapes from `tensors`, offsets from `offsets`)
/// and the lm_model_desc, and defines the header's functions plus
/// `const lm_model_desc *<name>_descriptor(void)`. With `embedWeights` the descriptor
/// points at `extern const float <name>_embedded_weights[]` (defined by the kernels'
/// object file) and <name>_load accepts a NULL path.
/// Throws std::invalid_argument when the tables disagree or the name would collide
/// with the runtime's symbols.
std::string generateGlue(const ModelFacts &model, const std::vector<LayoutTensor> &tensors,
                         const std::vector<int64_t> &offsets, int64_t totalFloats, bool embedWeights);

} // namespace lmcc::codegen
