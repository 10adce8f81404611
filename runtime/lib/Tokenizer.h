//===- Tokenizer.h - BERT WordPiece tokenization (BertTokenizerFast-exact) ---===//
//
// Text -> token ids as Hugging Face's `BertTokenizerFast` (the `tokenizers` library's BertNormalizer,
// BertPreTokenizer and WordPiece model) computes them for the same vocabulary and casing:
//   1. the special token strings (pad, unk, bos, eos, mask) are matched in the raw text first
//      (leftmost-longest, as HF's added special tokens: never normalized or split);
//   2. clean-up: U+0000, U+FFFD and "other" characters (Cc, Cf, Co, Cs; not \t \n \r; Cn is kept) are
//      dropped, every White_Space character becomes ' ';
//   3. CJK ideographs get a space on either side;
//   4. lowercase only: NFD, nonspacing marks (Mn) dropped, then full lowercase (U+0130 -> "i\u0307");
//   5. words = runs between whitespace, each punctuation character (ASCII punctuation or Unicode P*)
//      on its own;
//   6. WordPiece: greedy longest match, continuation pieces prefixed "##"; a word of more than 100
//      characters, or one with an unmatched suffix, becomes the unk token.
// Unicode properties come from utf8proc. Spec-free and MLIR-free: liblmrt's lm_tokenize* C API and
// the lmcc CLI both use it. Every error is a TokenizerError naming the file and line or byte offset.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <stdexcept>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lmcc {

struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Ids of the special tokens (each a line of the vocabulary).
struct SpecialIds {
  int32_t pad = 0, eos = 1, unk = 2, bos = 3, mask = 4;
};

class Tokenizer {
public:
  /// Reads a WordPiece vocabulary (one token a line, id = line number - 1; a final newline does not
  /// start a line; "\r\n" line ends accepted). Empty lines, duplicate tokens, invalid UTF-8 and
  /// files over 2^31 lines are errors naming `path:line`.
  static Tokenizer fromFile(const std::string &path, bool lowercase, const SpecialIds &specials);
  /// The text of a vocabulary file (at most 256 MiB; a directory or an unreadable file is a TokenizerError).
  static std::string readVocabulary(const std::string &path);
  /// Same, from the vocabulary text; `path` only names it in messages.
  static Tokenizer fromText(const std::string &text, const std::string &path, bool lowercase,
                            const SpecialIds &specials);
  /// Special ids found by their usual strings: pad "[PAD]", unk "[UNK]", bos "[SOS]" (else "[CLS]"),
  /// eos "[EOS]" (else "[SEP]"), mask "[MASK]". Throws when one is missing.
  static SpecialIds conventionalSpecials(const std::string &vocabText, const std::string &path);

  /// The ids of `text` without bos/eos. Invalid UTF-8 throws, naming `where` and the byte offset.
  std::vector<int32_t> encode(std::string_view text, const std::string &where = "text") const;
  /// bos + encode(text) + eos.
  std::vector<int32_t> encodeSentence(std::string_view text, const std::string &where = "text") const;

  /// The vocabulary entry of `id` (empty when out of range).
  const std::string &piece(int32_t id) const;
  /// The id of a vocabulary entry, or -1.
  int32_t find(std::string_view piece) const;
  int32_t size() const { return int32_t(pieces.size()); }
  bool lowercase() const { return lower; }
  const SpecialIds &specials() const { return special; }

  /// The normalization and pre-tokenization steps (2-5 above): the words of a text segment.
  /// Exposed for the vocabulary builder. `cps` are code points (validated).
  std::vector<std::u32string> words(const std::u32string &cps) const;
  /// Decodes UTF-8, throwing TokenizerError("<where>: invalid UTF-8 at byte N") on malformed input.
  static std::u32string decodeUtf8(std::string_view text, const std::string &where, size_t byteBase = 0);
  static void appendUtf8(std::string &out, char32_t cp);
  /// Steps 2-5 as a free function (no vocabulary needed).
  static std::vector<std::u32string> splitWords(const std::u32string &cps, bool lowercase);

private:
  void wordPiece(const std::u32string &word, std::vector<int32_t> &out) const;

  std::vector<std::string> pieces;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::pair<std::string, int32_t>> specialStrings; // matched in raw text, longest first
  SpecialIds special;
  bool lower = true;
};

/// Builds a WordPiece vocabulary from a corpus (one or more lines of UTF-8 text), deterministically:
/// the words (steps 2-5, with the given casing) are counted, then byte-pair merges over characters,
/// continuation pieces prefixed "##", are learned most frequent pair first (ties: the smaller pair
/// by code points) until the vocabulary has `size` entries or no pair occurs twice. The vocabulary
/// holds `specials` first (in the given order), then every character of the corpus (alone and as
/// "##c"), then the merged pieces in the order learned.
/// Every word of `corpus` (one text a line) as the tokenizer splits it, with its count; words over 100 code
/// points are left out (the tokenizer's unk). Invalid UTF-8 throws TokenizerError naming `path:line`.
std::map<std::u32string, int64_t> countWords(const std::string &corpus, const std::string &path, bool lowercase);

std::vector<std::string> buildWordPieceVocab(const std::string &corpus, const std::string &path, int64_t size,
                                             bool lowercase, const std::vector<std::string> &specials);

/// A word-level vocabulary (WordVocab.cpp): `specials` first, then the most frequent words of the corpus
/// (steps 2-5 above; ties: the smaller word by code points) up to `size` entries in all. With it the
/// tokenizer maps every other word to unk (no "##" pieces exist), as the paper's PTB setup does.
std::vector<std::string> buildWordVocab(const std::string &corpus, const std::string &path, int64_t size,
                                        bool lowercase, const std::vector<std::string> &specials);

} // namespace lmcc
