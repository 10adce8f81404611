// libFuzzer target: BERT WordPiece tokenization (runtime/lib/Tokenizer.cpp) of arbitrary bytes, cased and
// uncased, with a small vocabulary. A TokenizerError (invalid UTF-8) is the expected answer to bad input;
// anything else is a bug.
#include "runtime/lib/Tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {
const char *kVocab = "[PAD]\n[EOS]\n[UNK]\n[SOS]\n[MASK]\n[CLS]\n[SEP]\nthe\n##s\nlord\n##ing\na\nb\nc\n##a\n##b\n"
                     "\xe4\xb8\x80\n\xc3\xa9\n.\n,\n!\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const lmcc::Tokenizer cased = lmcc::Tokenizer::fromText(
      kVocab, "fuzz-vocab.txt", false, lmcc::Tokenizer::conventionalSpecials(kVocab, "fuzz-vocab.txt"));
  static const lmcc::Tokenizer uncased = lmcc::Tokenizer::fromText(
      kVocab, "fuzz-vocab.txt", true, lmcc::Tokenizer::conventionalSpecials(kVocab, "fuzz-vocab.txt"));
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  for (const lmcc::Tokenizer *t : {&cased, &uncased}) {
    try {
      for (int32_t id : t->encodeSentence(text, "fuzz"))
        (void)t->piece(id);
    } catch (const lmcc::TokenizerError &) {
    }
  }
  return 0;
}
