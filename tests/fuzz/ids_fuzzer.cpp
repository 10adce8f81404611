// libFuzzer target: the token-id reader of lmcc score --ids / lmcc train --ids (runtime/train/Corpus.cpp:
// parseIdLine, readCorpus, then hold-out and batching of what was read). A CorpusError is the expected
// answer to bad input; anything else is a bug.
#include "runtime/train/Corpus.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lmcc::train::CorpusLimits limits;
  limits.maxLen = 16, limits.vocab = 1000, limits.bos = 3, limits.eos = 1;
  limits.dropLong = size % 2;
  auto encode = [](std::string_view line, const std::string &where) {
    return lmcc::train::parseIdLine(line, where, 1000);
  };
  try {
    lmcc::train::Corpus c =
        lmcc::train::readCorpus(std::string_view(reinterpret_cast<const char *>(data), size), "fuzz.txt", encode, limits);
    (void)lmcc::train::epochBatches(c.sentences, 64, 1, 0);
    (void)lmcc::train::fixedBatches(c.sentences, 7);
    (void)lmcc::train::corpusHash(c.sentences);
  } catch (const lmcc::train::CorpusError &) {
  }
  return 0;
}
