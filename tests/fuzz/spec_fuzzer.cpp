// libFuzzer target: the spec parser and validator (frontend/Spec.cpp) on arbitrary TOML text. A SpecError is
// the expected answer to bad input; anything else (a crash, a sanitizer report, another exception) is a bug.
#include "frontend/Spec.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try {
    lmcc::ModelSpec spec = lmcc::parseSpec(std::string(reinterpret_cast<const char *>(data), size), "fuzz.toml");
    (void)lmcc::toToml(spec);
    (void)lmcc::specHash(spec);
  } catch (const lmcc::SpecError &) {
  }
  return 0;
}
