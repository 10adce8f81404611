//===- Internal.h - liblmrt internals shared by its source files (not installed) ===//
#pragma once

#include "runtime/lib/lmrt.h"
#include "runtime/train/FunctionRef.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

struct lm_model {
  const lm_model_desc *desc = nullptr;
  float *weights = nullptr; ///< desc->total_floats floats, 64-byte aligned
  void *owned = nullptr;    ///< what lm_rt_free releases (null when the embedded weights are used in place)
};

namespace lmrt::detail {
struct FreeDeleter {
  void operator()(void *p) const noexcept { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;
/// n floats (uninitialized), LM_WEIGHT_ALIGNMENT-aligned: the weight buffer and the trainer's gradient (which the
/// kernels write in the weights' layout). Throws std::bad_alloc.
FloatBuffer allocateFloats(int64_t n);

/// A kernel temporary of `size` bytes from this thread's workspace cache (as _mlir_memref_to_llvm_aligned_alloc),
/// or null where that would fail the call (past its workspace limit, or the system has none): for temporaries a
/// kernel can do without. Freed with _mlir_memref_to_llvm_free.
void *tryAllocateTemporary(uint64_t alignment, uint64_t size);

/// MLIR's C interface descriptors of dense row-major buffers (what the compiled kernels take).
inline lm_memref1f memref1(float *p, int64_t n) { return {p, p, 0, {n}, {1}}; }
inline lm_memref1i memref1(int32_t *p, int64_t n) { return {p, p, 0, {n}, {1}}; }
inline lm_memref2f memref2(float *p, int64_t rows, int64_t cols) { return {p, p, 0, {rows, cols}, {cols, 1}}; }
inline lm_memref2i memref2(int32_t *p, int64_t rows, int64_t cols) { return {p, p, 0, {rows, cols}, {cols, 1}}; }
inline lm_memref3f memref3(float *p, int64_t a, int64_t b, int64_t c) { return {p, p, 0, {a, b, c}, {b * c, c, 1}}; }
inline lm_memref3i memref3(int32_t *p, int64_t a, int64_t b, int64_t c) { return {p, p, 0, {a, b, c}, {b * c, c, 1}}; }

/// A descriptor tensor's shape and element count.
inline std::vector<int64_t> descShape(const lm_tensor_desc &t) { return std::vector<int64_t>(t.shape, t.shape + t.rank); }
inline int64_t descNumel(const lm_tensor_desc &t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.rank; ++d)
    n *= t.shape[d];
  return n;
}

/// Source/target pairs packed for the Diformer's kernels: ids padded with pad_id, rows [rows, n, 1 + W]
/// (direction, hidden-key bits; padding rows skip).
struct PairBatch {
  int64_t rows = 0, ms = 0, n = 0, width = 0;
  std::vector<int32_t> src, tgt, srcLen, tgtLen, rowData;
  lm_memref2i srcRef() { return memref2(src.data(), rows, ms); }
  lm_memref2i tgtRef() { return memref2(tgt.data(), rows, n); }
  lm_memref1i srcLenRef() { return memref1(srcLen.data(), rows); }
  lm_memref1i tgtLenRef() { return memref1(tgtLen.data(), rows); }
  lm_memref3i rowsRef() { return memref3(rowData.data(), rows, n, width); }
};
/// lm_rt_score_pairs's argument checks (model, pointers, lengths, ids, bos/eos, directions, hidden keys).
void checkPairInputs(const lm_model *m, const int32_t *src, const int32_t *srcLengths, int32_t srcStride,
                     const int32_t *tgt, const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs,
                     const uint32_t *hidden, int32_t batch);
/// Pairs [b0, b0 + rows) of checked inputs into `p`, whose buffers are reused (a steady-state call allocates
/// nothing).
void packPairs(PairBatch &p, const lm_model_desc *d, const int32_t *src, const int32_t *srcLengths, int32_t srcStride,
               const int32_t *tgt, const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs,
               const uint32_t *hidden, int64_t b0, int64_t rows);

/// Throw an argument / internal error that guardedCall turns into its status code and message.
[[noreturn]] void argument(std::string message);
[[noreturn]] void internal(std::string message);
[[noreturn]] void nonFiniteResult(std::string message); ///< LM_ERR_NONFINITE
/// How runKernel holds a call to the workspace limit (lm_set_workspace_limit).
enum class Bound {
  Planned,   ///< the caller cut the call into pieces under the limit with the library's memory model (scoring)
  Held,      ///< no memory model (training, translation): a temporary that would take the call's kernel
             ///< temporaries past the limit ends it with LM_ERR_MEMORY, as one the system refuses does
  Unbounded, ///< the load-time folding of the weights (once per model)
};
/// Calls a generated entry point (`kernel`): a kernel temporary the system cannot allocate (or, Bound::Held, one
/// over the workspace limit), on this thread or in the call's parallel tasks, ends the call with an LM_ERR_MEMORY
/// naming `entry` (thrown, for guardedCall) and frees the temporaries it held, instead of a write through a null
/// pointer.
void runKernel(const char *entry, lmcc::FunctionRef<void()> kernel, Bound bound);
/// Runs `body`, converting whatever it throws into a status code and lm_last_error().
int guardedCall(lmcc::FunctionRef<void()> body) noexcept;
/// The model, ids and lengths checks of lm_rt_score (ids in the vocabulary, 1 <= length <= max_len, stride).
void checkModelInputs(const lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride);
} // namespace lmrt::detail
