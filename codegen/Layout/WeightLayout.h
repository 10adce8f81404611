//===- WeightLayout.h - The one flat weight layout of a compiled model ------===//
//
// A compiled model reads every weight from one flat, aligned float buffer. This is
// the single description of that buffer, computed once from the optimized `lm` IR
// (computeWeightLayout) and read by the lowering (views at static offsets), the C
// glue (the runtime loader's tensor table), the header and --stats. Order:
//   1. loaded tensors: every lm.weight, in the order the IR first names them; the
//      tensors an lm.concat stacks lie back to back (no padding) so the stack is one view;
//   2. folded tables (lm-fold-constants): one [max_len, width] table per lm.fold function,
//      written by the init kernel at load time;
//   3. packed GEMM weights (--gemm=generated): the panel layout of codegen/LmToLoops/Gemm.h,
//      written by the init kernel from the loaded tensors.
// Every entry not stacked after its predecessor starts at a multiple of kAlignFloats.
// Plain C++ except computeWeightLayout (codegen/Layout/WeightLayoutIR.cpp).
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/lib/lmrt.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace mlir {
class ModuleOp;
} // namespace mlir

namespace lmcc::codegen {

/// Bytes of alignment of every tensor: the runtime's (runtime/lib/lmrt.h), which allocates the buffer.
constexpr int64_t kAlignBytes = LM_WEIGHT_ALIGNMENT;
constexpr int64_t kAlignFloats = kAlignBytes / 4;
/// Panel width of packed GEMM weights: output features are grouped 64 at a time.
constexpr int64_t kPanel = 64;
/// Depth of a packed panel: k rows of 64 floats, or with bf16 weights ceil(k / 2) rows of 64 32-bit words, each
/// holding the bf16 pair (W[j][2i], W[j][2i + 1]) (the low half first; zero past k).
inline int64_t packedDepth(int64_t k, bool bf16) { return bf16 ? (k + 1) / 2 : k; }
/// Rows of the packed form of W [n, k]: ceil(n / 64) panels of packedDepth(k) rows of 64 words.
inline int64_t packedRows(int64_t n, int64_t k, bool bf16 = false) {
  return (n + kPanel - 1) / kPanel * packedDepth(k, bf16);
}

/// Name and shape of one tensor of the layout.
struct LayoutTensor {
  std::string name;
  std::vector<int64_t> shape;
};

/// Elements of `t`; throws std::invalid_argument on a negative dimension or a count past 2^62.
int64_t numelOf(const LayoutTensor &t);

/// Offsets (in floats) of `tensors` laid out in order, each rounded up to kAlignFloats unless
/// named in `stacked` (then it follows its predecessor with no padding). *totalFloats (when
/// non-null) receives the buffer size, a multiple of kAlignFloats. Throws std::invalid_argument on a
/// negative dimension or a buffer past 2^62 floats.
std::vector<int64_t> layoutOffsets(const std::vector<LayoutTensor> &tensors, int64_t *totalFloats,
                                   const std::set<std::string> &stacked = {});

struct WeightLayout {
  enum class Kind { Loaded, Folded, Packed };
  struct Entry {
    LayoutTensor tensor;
    Kind kind;
    int64_t offset; ///< floats from the start of the buffer
    /// Packed: the loaded tensors it packs (several when stacked), and the GEMM's [n, k].
    std::vector<std::string> sources;
    int64_t n = 0, k = 0;
  };
  std::vector<Entry> entries;
  int64_t totalFloats = 0;
  bool bf16 = false; ///< packed GEMM weights hold bf16 pairs (--weights-dtype bf16)

  /// The entry named `name` (a canonical weight name, an lm.fold function's name, or a packKey), or null.
  const Entry *find(const std::string &name) const;
  /// The tensors the runtime loads from safetensors (Kind::Loaded), in layout order.
  std::vector<LayoutTensor> loadedTensors() const;
  std::vector<int64_t> loadedOffsets() const;
};

/// The layout of an optimized lm module. `packGemmWeights`: lay out the panel form of every weight an
/// lm.linear / lm.token_logprob multiplies by (--gemm=generated), as bf16 pairs with `bf16`. Folded tables have
/// max_len rows (lm.model).
WeightLayout computeWeightLayout(mlir::ModuleOp module, bool packGemmWeights, bool bf16 = false);

/// The key under which the packed form of a weight is laid out: "pack:" + its tensor names joined by '|'.
std::string packKey(const std::vector<std::string> &names);

} // namespace lmcc::codegen
