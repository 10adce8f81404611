// libFuzzer target: the safetensors reader (runtime/weights/Safetensors.cpp) on arbitrary bytes. A
// WeightError is the expected answer to a malformed file; anything else is a bug.
#include "runtime/weights/Safetensors.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const std::string path = "/tmp/lmcc-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    lmcc::WeightSet w = lmcc::readSafetensors(path);
    (void)w;
  } catch (const lmcc::WeightError &) {
  }
  return 0;
}
