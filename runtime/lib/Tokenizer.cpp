//===- Tokenizer.cpp - BERT WordPiece tokenization on utf8proc -------------===//
#include "runtime/lib/Tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace lmcc {
namespace {

/// Rust's char::is_whitespace (the White_Space property): Zs plus these controls and separators.
bool isWhitespace(char32_t c) {
  if (c == 0x09 || c == 0x0A || c == 0x0B || c == 0x0C || c == 0x0D || c == 0x85 || c == 0x2028 || c == 0x2029)
    return true;
  return utf8proc_category(int32_t(c)) == UTF8PROC_CATEGORY_ZS;
}

/// How `tokenizers` classifies a code point where its Unicode tables (the unicode_categories crate, older than
/// Unicode 12) disagree with utf8proc's current ones: generated from `tokenizers` itself by
/// tests/golden/tokenizer/make_unicode_compat.py, sorted by code point.
struct CompatClass {
  char32_t cp;
  bool control, mark, punct;
};
constexpr CompatClass kCompat[] = {
#include "runtime/lib/TokenizerCompat.inc"
};

/// The `tokenizers` classification of `c` where it differs from utf8proc's, else null.
const CompatClass *compat(char32_t c) {
  if (c < kCompat[0].cp) // ASCII and most of Latin: no entry (and no search on the common path)
    return nullptr;
  const CompatClass *it = std::lower_bound(std::begin(kCompat), std::end(kCompat), c,
                                           [](const CompatClass &e, char32_t v) { return e.cp < v; });
  return it != std::end(kCompat) && it->cp == c ? it : nullptr;
}

/// BertNormalizer's is_control: the "other" categories Cc, Cf, Co, Cs except tab, newline and carriage
/// return. Unassigned code points (Cn) are kept, as `tokenizers` keeps them (they become unk).
bool isControl(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r')
    return false;
  if (const CompatClass *e = compat(c))
    return e->control;
  switch (utf8proc_category(int32_t(c))) {
  case UTF8PROC_CATEGORY_CC:
  case UTF8PROC_CATEGORY_CF:
  case UTF8PROC_CATEGORY_CO:
  case UTF8PROC_CATEGORY_CS:
    return true;
  default:
    return false;
  }
}

/// The CJK Unified Ideographs blocks BERT splits around (as the original BERT and `tokenizers`).
bool isChinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/// BertPreTokenizer's punctuation: ASCII punctuation or a Unicode P* category.
bool isPunctuation(char32_t c) {
  if (c < 128)
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  if (const CompatClass *e = compat(c))
    return e->punct;
  switch (utf8proc_category(int32_t(c))) {
  case UTF8PROC_CATEGORY_PC:
  case UTF8PROC_CATEGORY_PD:
  case UTF8PROC_CATEGORY_PS:
  case UTF8PROC_CATEGORY_PE:
  case UTF8PROC_CATEGORY_PI:
  case UTF8PROC_CATEGORY_PF:
  case UTF8PROC_CATEGORY_PO:
    return true;
  default:
    return false;
  }
}

/// A non-spacing mark (Mn), which the accent strip drops.
bool isNonspacingMark(char32_t c) {
  if (const CompatClass *e = compat(c))
    return e->mark;
  return utf8proc_category(int32_t(c)) == UTF8PROC_CATEGORY_MN;
}

/// Canonical decomposition (NFD) of a code point sequence: full decomposition, then the canonical
/// ordering of combining marks.
std::u32string nfd(const std::u32string &in) {
  std::u32string out;
  out.reserve(in.size());
  utf8proc_int32_t buf[32];
  for (char32_t c : in) {
    int boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(int32_t(c), buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (n < 0 || n > 32) { // cannot happen for valid scalar values; keep the character
      out.push_back(c);
      continue;
    }
    for (utf8proc_ssize_t i = 0; i < n; ++i)
      out.push_back(char32_t(buf[i]));
  }
  // Canonical ordering: stable sort of every run of non-starters by combining class.
  auto ccc = [](char32_t c) { return utf8proc_get_property(int32_t(c))->combining_class; };
  for (size_t i = 0; i < out.size();) {
    if (ccc(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && ccc(out[j]) != 0)
      ++j;
    std::stable_sort(out.begin() + i, out.begin() + j, [&](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  return out;
}

/// Rust's char::to_lowercase: the simple mapping, except U+0130 (the only unconditional
/// multi-character lowercase mapping in SpecialCasing.txt).
void appendLower(std::u32string &out, char32_t c) {
  if (c == 0x130) {
    out.push_back(U'i');
    out.push_back(0x307);
    return;
  }
  out.push_back(char32_t(utf8proc_tolower(int32_t(c))));
}

std::string readFile(const std::string &path, const char *what) {
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw TokenizerError(path + ": is a directory, not a " + what);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw TokenizerError(path + ": cannot open the " + what);
  // At most 256 MiB (BERT's vocabulary is 0.2 MiB): /dev/zero or a mistaken corpus would fill the memory.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, size_t(in.gcount()));
    if (text.size() > (size_t(256) << 20))
      throw TokenizerError(path + ": larger than 256 MiB: not a " + std::string(what));
  }
  return text;
}

/// The vocabulary's lines (a final newline does not start a line; "\r\n" accepted).
std::vector<std::string> vocabLines(const std::string &text, const std::string &path) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    lines.push_back(std::move(line));
    if (lines.size() > size_t(INT32_MAX))
      throw TokenizerError(path + ": more than 2^31 - 1 lines: not a vocabulary");
  }
  return lines;
}

} // namespace

std::u32string Tokenizer::decodeUtf8(std::string_view text, const std::string &where, size_t byteBase) {
  std::u32string out;
  out.reserve(text.size());
  const auto *p = reinterpret_cast<const utf8proc_uint8_t *>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p + i, utf8proc_ssize_t(text.size() - i), &cp);
    if (n <= 0 || cp < 0)
      throw TokenizerError(where + ": invalid UTF-8 at byte " + std::to_string(byteBase + i) + " (0x" +
                           [&] {
                             char buf[8];
                             std::snprintf(buf, sizeof buf, "%02X", unsigned(p[i]));
                             return std::string(buf);
                           }() +
                           ")");
    out.push_back(char32_t(cp));
    i += size_t(n);
  }
  return out;
}

void Tokenizer::appendUtf8(std::string &out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(int32_t(cp), buf);
  out.append(reinterpret_cast<const char *>(buf), size_t(n));
}

std::vector<std::u32string> Tokenizer::splitWords(const std::u32string &cps, bool lowercase) {
  // Clean-up and CJK spacing.
  std::u32string clean;
  clean.reserve(cps.size());
  for (char32_t c : cps) {
    if (c == 0 || c == 0xFFFD || isControl(c))
      continue;
    if (isWhitespace(c)) {
      clean.push_back(U' ');
    } else if (isChinese(c)) {
      clean.push_back(U' ');
      clean.push_back(c);
      clean.push_back(U' ');
    } else {
      clean.push_back(c);
    }
  }
  if (lowercase) { // strip accents (NFD, drop Mn), then lowercase
    std::u32string decomposed = nfd(clean), lowered;
    lowered.reserve(decomposed.size());
    for (char32_t c : decomposed)
      if (!isNonspacingMark(c))
        appendLower(lowered, c);
    clean = std::move(lowered);
  }
  // Pre-tokenization: split on whitespace, isolate punctuation.
  std::vector<std::u32string> words;
  std::u32string current;
  for (char32_t c : clean) {
    if (isWhitespace(c)) {
      if (!current.empty())
        words.push_back(std::move(current)), current.clear();
    } else if (isPunctuation(c)) {
      if (!current.empty())
        words.push_back(std::move(current)), current.clear();
      words.push_back(std::u32string(1, c));
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty())
    words.push_back(std::move(current));
  return words;
}

std::vector<std::u32string> Tokenizer::words(const std::u32string &cps) const { return splitWords(cps, lower); }

void Tokenizer::wordPiece(const std::u32string &word, std::vector<int32_t> &out) const {
  constexpr size_t kMaxChars = 100;
  if (word.size() > kMaxChars) {
    out.push_back(special.unk);
    return;
  }
  // Byte offsets of every character boundary.
  std::string bytes;
  std::vector<size_t> offset{0};
  for (char32_t c : word) {
    appendUtf8(bytes, c);
    offset.push_back(bytes.size());
  }
  size_t mark = out.size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    int32_t found = -1;
    size_t end = word.size();
    for (; end > start; --end) {
      candidate.assign(start ? "##" : "");
      candidate.append(bytes, offset[start], offset[end] - offset[start]);
      auto it = ids.find(candidate);
      if (it != ids.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {
      out.resize(mark);
      out.push_back(special.unk);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const std::string &where) const {
  std::vector<int32_t> out;
  // Special token strings are matched in the raw text first (leftmost, longest at a position).
  size_t segment = 0;
  auto flush = [&](size_t end) {
    if (end > segment) {
      std::u32string cps = decodeUtf8(text.substr(segment, end - segment), where, segment);
      for (const std::u32string &w : words(cps))
        wordPiece(w, out);
    }
  };
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int32_t> *match = nullptr;
    for (const auto &s : specialStrings) // longest first
      if (text.compare(i, s.first.size(), s.first) == 0) {
        match = &s;
        break;
      }
    if (!match) {
      ++i;
      continue;
    }
    flush(i);
    out.push_back(match->second);
    i += match->first.size();
    segment = i;
  }
  flush(text.size());
  return out;
}

std::vector<int32_t> Tokenizer::encodeSentence(std::string_view text, const std::string &where) const {
  std::vector<int32_t> ids = encode(text, where);
  ids.insert(ids.begin(), special.bos);
  ids.push_back(special.eos);
  return ids;
}

const std::string &Tokenizer::piece(int32_t id) const {
  static const std::string empty;
  return id >= 0 && id < size() ? pieces[size_t(id)] : empty;
}

int32_t Tokenizer::find(std::string_view p) const {
  auto it = ids.find(std::string(p));
  return it == ids.end() ? -1 : it->second;
}

std::string Tokenizer::readVocabulary(const std::string &path) { return readFile(path, "vocabulary"); }

Tokenizer Tokenizer::fromFile(const std::string &path, bool lowercase, const SpecialIds &specials) {
  return fromText(readVocabulary(path), path, lowercase, specials);
}

Tokenizer Tokenizer::fromText(const std::string &text, const std::string &path, bool lowercase,
                              const SpecialIds &specials) {
  Tokenizer t;
  t.lower = lowercase;
  t.special = specials;
  t.pieces = vocabLines(text, path);
  if (t.pieces.empty())
    throw TokenizerError(path + ": empty vocabulary");
  t.ids.reserve(t.pieces.size());
  for (size_t i = 0; i < t.pieces.size(); ++i) {
    const std::string &p = t.pieces[i];
    std::string where = path + ":" + std::to_string(i + 1);
    if (p.empty())
      throw TokenizerError(where + ": empty line (every line must hold one token)");
    decodeUtf8(p, where);
    for (char c : p)
      if (c == ' ' || c == '\t')
        throw TokenizerError(where + ": token \"" + p + "\" contains whitespace, which no word ever does");
    auto [it, inserted] = t.ids.emplace(p, int32_t(i));
    if (!inserted)
      throw TokenizerError(where + ": duplicate token \"" + p + "\" (first on line " + std::to_string(it->second + 1) +
                           ")");
  }
  const std::pair<const char *, int32_t> named[] = {
      {"pad", specials.pad}, {"eos", specials.eos}, {"unk", specials.unk}, {"bos", specials.bos}, {"mask", specials.mask}};
  for (auto [name, id] : named) {
    if (id < 0 || id >= t.size())
      throw TokenizerError(path + ": the " + std::string(name) + " token id " + std::to_string(id) +
                           " is outside the vocabulary's " + std::to_string(t.size()) + " lines");
    t.specialStrings.emplace_back(t.pieces[size_t(id)], id);
  }
  std::stable_sort(t.specialStrings.begin(), t.specialStrings.end(),
                   [](const auto &a, const auto &b) { return a.first.size() > b.first.size(); });
  return t;
}

SpecialIds Tokenizer::conventionalSpecials(const std::string &vocabText, const std::string &path) {
  std::vector<std::string> lines = vocabLines(vocabText, path);
  auto find = [&](std::initializer_list<const char *> names, const char *role) {
    for (const char *name : names)
      for (size_t i = 0; i < lines.size(); ++i)
        if (lines[i] == name)
          return int32_t(i);
    std::string list;
    for (const char *name : names)
      list += (list.empty() ? "" : " or ") + std::string(name);
    throw TokenizerError(path + ": no " + role + " token (" + list + ") in the vocabulary");
  };
  SpecialIds s;
  s.pad = find({"[PAD]"}, "padding");
  s.unk = find({"[UNK]"}, "unknown");
  s.bos = find({"[SOS]", "[CLS]"}, "sentence start");
  s.eos = find({"[EOS]", "[SEP]"}, "sentence end");
  s.mask = find({"[MASK]"}, "mask");
  return s;
}

// --- Vocabulary builder -----------------------------------------------------------

std::map<std::u32string, int64_t> countWords(const std::string &corpus, const std::string &path, bool lowercase) {
  std::map<std::u32string, int64_t> counts;
  size_t pos = 0;
  int64_t lineNo = 0;
  while (pos < corpus.size()) {
    size_t end = corpus.find('\n', pos);
    if (end == std::string::npos)
      end = corpus.size();
    ++lineNo;
    std::u32string cps = Tokenizer::decodeUtf8(std::string_view(corpus).substr(pos, end - pos),
                                               path + ":" + std::to_string(lineNo), 0);
    for (std::u32string &w : Tokenizer::splitWords(cps, lowercase))
      if (w.size() <= 100) // longer words are unk anyway
        ++counts[std::move(w)];
    pos = end + 1;
  }
  return counts;
}

std::vector<std::string> buildWordPieceVocab(const std::string &corpus, const std::string &path, int64_t size,
                                             bool lowercase, const std::vector<std::string> &specials) {
  std::map<std::u32string, int64_t> counts = countWords(corpus, path, lowercase);

  std::vector<std::string> vocab;
  std::set<std::string> seen;
  auto add = [&](const std::string &p) {
    if (seen.insert(p).second)
      vocab.push_back(p);
  };
  for (const std::string &s : specials)
    add(s);

  // Symbols are strings ("##" on non-initial ones). Words as symbol-id sequences.
  std::vector<std::string> symbols;
  std::map<std::string, int32_t> symbolId;
  auto symbol = [&](const std::string &s) {
    auto [it, inserted] = symbolId.emplace(s, int32_t(symbols.size()));
    if (inserted)
      symbols.push_back(s);
    return it->second;
  };
  struct Word {
    std::vector<int32_t> parts;
    int64_t count;
  };
  std::vector<Word> words;
  std::set<char32_t> alphabet;
  for (const auto &[w, count] : counts) {
    Word word{{}, count};
    for (size_t i = 0; i < w.size(); ++i) {
      std::string s = i ? "##" : "";
      Tokenizer::appendUtf8(s, w[i]);
      word.parts.push_back(symbol(s));
      alphabet.insert(w[i]);
    }
    words.push_back(std::move(word));
  }
  for (char32_t c : alphabet) { // every character alone and as a continuation
    std::string s;
    Tokenizer::appendUtf8(s, c);
    add(s);
    add("##" + s);
  }

  // Merges: pair counts kept up to date incrementally; the best pair is the most frequent,
  // ties broken by the pair's strings (deterministic, independent of hash order).
  using Pair = std::pair<int32_t, int32_t>;
  std::map<Pair, int64_t> pairCount;
  std::map<Pair, std::set<size_t>> where;
  for (size_t wi = 0; wi < words.size(); ++wi)
    for (size_t i = 0; i + 1 < words[wi].parts.size(); ++i) {
      Pair p{words[wi].parts[i], words[wi].parts[i + 1]};
      pairCount[p] += words[wi].count;
      where[p].insert(wi);
    }
  auto better = [&](const Pair &a, int64_t ca, const Pair &b, int64_t cb) {
    if (ca != cb)
      return ca > cb;
    const std::string &a1 = symbols[size_t(a.first)], &b1 = symbols[size_t(b.first)];
    if (a1 != b1)
      return a1 < b1;
    return symbols[size_t(a.second)] < symbols[size_t(b.second)];
  };
  // Lazy max-heap of (count, pair): stale entries (count changed since pushed) are skipped.
  using Entry = std::pair<int64_t, Pair>;
  auto heapLess = [&](const Entry &a, const Entry &b) { return better(b.second, b.first, a.second, a.first); };
  std::vector<Entry> heap;
  auto push = [&](const Pair &p) {
    auto it = pairCount.find(p);
    if (it != pairCount.end() && it->second >= 2) {
      heap.emplace_back(it->second, p);
      std::push_heap(heap.begin(), heap.end(), heapLess);
    }
  };
  for (const auto &[p, c] : pairCount)
    push(p);
  while (int64_t(vocab.size()) < size) {
    bool found = false;
    Pair top{};
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), heapLess);
      Entry e = heap.back();
      heap.pop_back();
      auto it = pairCount.find(e.second);
      if (it != pairCount.end() && it->second == e.first) {
        top = e.second, found = true;
        break;
      }
    }
    if (!found)
      break;
    const Pair *best = &top;
    Pair merge = *best;
    std::string second = symbols[size_t(merge.second)];
    std::string merged = symbols[size_t(merge.first)] + second.substr(2);
    int32_t mergedId = symbol(merged);
    add(merged);
    // Each word holding the pair: its non-overlapping occurrences merged left to right. Only the pairs that touch a
    // merged position change (the others are the same neighbours before and after), so only those are counted
    // out and in: a merge costs its occurrences, not the lengths of the words holding them (100-letter words
    // made every merge recount whole words). `where` may name words that no longer hold a pair (entries are
    // not removed); such a word has no occurrence and is left as it is.
    const std::set<size_t> affected = std::move(where[merge]);
    where.erase(merge);
    std::set<Pair> touched;
    std::vector<int32_t> parts;
    std::vector<char> fresh; // parts[k] is a merged symbol made by this merge
    for (size_t wi : affected) {
      Word &w = words[wi];
      const std::vector<int32_t> &old = w.parts;
      parts.clear(), fresh.clear();
      std::vector<char> gone(old.size(), 0); // old[i] is part of a merged occurrence
      for (size_t i = 0; i < old.size(); ++i) {
        if (i + 1 < old.size() && old[i] == merge.first && old[i + 1] == merge.second) {
          parts.push_back(mergedId), fresh.push_back(1);
          gone[i] = gone[i + 1] = 1;
          ++i;
        } else {
          parts.push_back(old[i]), fresh.push_back(0);
        }
      }
      if (parts.size() == old.size())
        continue;
      for (size_t i = 0; i + 1 < old.size(); ++i)
        if (gone[i] || gone[i + 1]) {
          Pair p{old[i], old[i + 1]};
          if (p == merge)
            continue; // its count is erased below
          if ((pairCount[p] -= w.count) == 0)
            pairCount.erase(p);
          touched.insert(p);
        }
      for (size_t k = 0; k + 1 < parts.size(); ++k)
        if (fresh[k] || fresh[k + 1]) {
          Pair p{parts[k], parts[k + 1]};
          pairCount[p] += w.count;
          where[p].insert(wi);
          touched.insert(p);
        }
      w.parts = parts;
    }
    pairCount.erase(merge);
    touched.erase(merge);
    for (const Pair &p : touched)
      push(p);
  }
  return vocab;
}

} // namespace lmcc
