//===- Scratch.h - What the lowerings allocate beyond their ops' results ----===//
//
// The buffers a lowering allocates for itself while an op runs (besides the op's result), as formulas shared by
// the lowering and the memory model (Stats.cpp), so that what a kernel allocates and what the runtime plans for
// are one count. Every kernel allocation is 64-byte aligned, which MLIR's lowering of memref.alloc makes by asking
// for 64 bytes more than the buffer (allocationBytes).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <cstdint>

namespace lmcc::codegen {

/// Bytes a kernel allocation of `bytes` asks the runtime for (`_mlir_memref_to_llvm_alloc`): memref.alloc
/// {alignment = 64} is lowered to a request of the size plus the alignment, the pointer then aligned within it.
/// None for an empty buffer, in the memory model: a term of it (Stats.h) counts only what has a size there.
constexpr int64_t kAllocationAlignment = 64;
inline int64_t allocationBytes(int64_t bytes) { return bytes > 0 ? bytes + kAllocationAlignment : 0; }

namespace logprob {

constexpr int64_t kChunk = 512;     ///< vocabulary columns per work item (8 GEMM panels)
constexpr int64_t kChunkRows = 128; ///< rows per work item

/// Vocabulary chunks of a head over V words.
inline int64_t chunks(int64_t vocab) { return (vocab + kChunk - 1) / kChunk; }
/// Columns of a row of the logits scratch: a chunk, or the whole vocabulary rounded up to 16 when it is smaller.
inline int64_t scratchWidth(int64_t vocab) { return std::min(kChunk, (vocab + 15) / 16 * 16); }
/// Bytes of a logits scratch of `rows` rows (a work item's, or with the runtime's GEMM the op's).
inline int64_t logitsBytes(int64_t vocab, int64_t rows) { return allocationBytes(rows * scratchWidth(vocab) * 4); }
/// Bytes lm.token_logprob allocates while it runs over `rows` rows of hidden states: each row's chunk maxima (f32)
/// and exponential sums (f64), its target's logit (f32), and the rows' logits of one chunk (f32, scratchWidth
/// columns). The logits are one [rows, width] buffer with the runtime's GEMM (`--gemm eigen`); with the generated
/// GEMM each work item has its own of at most kChunkRows rows, so the count is exact for up to kChunkRows rows on
/// one thread and an upper bound of one thread's for more (with T threads up to T items' logits are live: the memory
/// model's thread term, Stats.h, counts the others).
inline int64_t scratchBytes(int64_t vocab, int64_t rows) {
  return allocationBytes(rows * chunks(vocab) * 4) + allocationBytes(rows * chunks(vocab) * 8) +
         allocationBytes(rows * 4) + logitsBytes(vocab, rows);
}

} // namespace logprob

namespace attention {

constexpr int64_t kTileRows = 8; ///< query rows per tile of the vector form (their scores, softmax and p.v together)
/// Query rows per tile of the forward under the directional mask: its tiles gather rows of one direction from
/// across the sentence, and the fewer rows share a tile's key range, the fewer keys a row visits past its own.
constexpr int64_t kDirectionalTileRows = 4;
/// Query rows per tile of lm.attention's vector form (1 with query positions: one row per entry).
inline int64_t forwardTileRows(bool queryPositions, bool directional) {
  return queryPositions ? 1 : directional ? kDirectionalTileRows : kTileRows;
}
constexpr int64_t kKeyTile = 32; ///< keys per tile of the scalar form (head sizes not a multiple of 16)

/// Bytes lm.attention allocates while it runs on one thread, `dh` its head size, `keys` the key count, `rows` the
/// query rows: the vector form (dh a multiple of 16) transposes a head's keys and packs its values, M16 = keys
/// rounded up to 16, into [M16, dh] each, and keeps a tile's scores [R, M16] (R = forwardTileRows); with relative
/// positions (`clip` > 0) a block of dh x (T16 + 16) + R x (T16 + 16) + R x (2 M16 + T16 + 16) floats (T16 = 2 clip +
/// 1 rounded up to 16); with the directional mask over whole rows (no query positions) the rows' order (rows + 1
/// int32). The scalar form keeps one key tile's scores and a row's accumulator.
inline int64_t scratchBytes(int64_t dh, int64_t keys, int64_t rows, bool queryPositions, int64_t clip,
                            bool directional) {
  if (dh % 16)
    return allocationBytes(kKeyTile * 4) + allocationBytes(dh * 4);
  const int64_t M16 = (keys + 15) / 16 * 16, R = forwardTileRows(queryPositions, directional);
  int64_t bytes = 2 * allocationBytes(M16 * dh * 4) + allocationBytes(R * M16 * 4);
  if (clip > 0) {
    const int64_t T16 = (2 * clip + 1 + 15) / 16 * 16;
    bytes += allocationBytes((dh * (T16 + 16) + R * (T16 + 16) + R * (2 * M16 + T16 + 16)) * 4);
  }
  if (directional && !queryPositions)
    bytes += allocationBytes((rows + 1) * 4);
  return bytes;
}

} // namespace attention
} // namespace lmcc::codegen
