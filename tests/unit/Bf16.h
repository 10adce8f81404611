// Rounding to bf16 for the tests of --weights-dtype bf16 (the kernels' rule: round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>

namespace lmcc::test {

/// x rounded to the nearest bf16 number (ties to even), as a float.
inline float roundToBf16(float x) {
  uint32_t w;
  std::memcpy(&w, &x, 4);
  w = (w + 0x7fffu + ((w >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &w, 4);
  return x;
}

} // namespace lmcc::test
