//===- Philox.h - Philox4x32-10 and the draws built on it (header-only, spec-free) ===//
//
// A counter-based generator: every draw is a pure function of (key, counter), so training's random
// choices (masked objective, dropout) do not depend on the thread count or on the order of calls.
// liblmrt (dropout masks), the objectives and the reference executor all use this one definition.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <array>
#include <cstdint>

namespace lmcc::train {

/// Philox4x32-10: 10 rounds of the Philox S-box over `counter` with `key` (bumped by the Weyl
/// constants 0x9E3779B9, 0xBB67AE85 before rounds 2..10). Random123's philox4x32_R(10, ...).
inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0], p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

/// Dropout's mask: element (sentence b, row t, feature c) of dropout site `site` at training step `step`
/// is kept iff u >= rate, u = w0 * 2^-32 with w = philox4x32({t, c, b, step}, {seed, 0xD0000000 | site}).
/// ([train] seed < 2^32, so the key never equals the objectives' (seed, 0).) Kept elements are scaled by
/// 1 / (1 - rate). Sites: 0 the embedding output, 1 the first query when it is not the embedding output
/// (T-TA), 2 + 2i layer i's attention output, 3 + 2i layer i's FFN output (each before its residual),
/// 2^20 + i layer i's attention probabilities [B, H, N, M] ([train] attention_dropout), whose element
/// (b, h, i, j) is (sentence b H + h, row i, feature j).
inline bool dropoutKeep(uint64_t seed, uint64_t step, uint32_t site, uint32_t b, uint32_t t, uint32_t c, double rate) {
  const std::array<uint32_t, 4> w = philox4x32({t, c, b, static_cast<uint32_t>(step)},
                                               {static_cast<uint32_t>(seed), 0xD0000000u | site});
  return static_cast<double>(w[0]) * (1.0 / 4294967296.0) >= rate;
}

/// The dropout site of layer `layer`'s attention probabilities ([train] attention_dropout): 2^20 + layer.
constexpr uint32_t kAttentionDropoutSites = 1u << 20;
inline uint32_t attentionDropoutSite(int64_t layer) { return kAttentionDropoutSites + static_cast<uint32_t>(layer); }

} // namespace lmcc::train
