//===- WordVocab.cpp - A word-level vocabulary (issue 18: the paper's PTB setup) ===//
#include "runtime/lib/Tokenizer.h"

#include <algorithm>
#include <map>
#include <set>

namespace lmcc {

std::vector<std::string> buildWordVocab(const std::string &corpus, const std::string &path, int64_t size,
                                        bool lowercase, const std::vector<std::string> &specials) {
  // Words as the tokenizer splits them (steps 2-5), counted line by line (errors name the line).
  std::map<std::u32string, int64_t> counts = countWords(corpus, path, lowercase);
  std::vector<std::pair<std::u32string, int64_t>> ranked(counts.begin(), counts.end());
  // Most frequent first; ties by code points (the map's order), so the result is deterministic.
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto &a, const auto &b) { return a.second > b.second; });
  std::vector<std::string> vocab(specials.begin(), specials.end());
  std::set<std::string> seen(specials.begin(), specials.end());
  for (const auto &[word, count] : ranked) {
    if (int64_t(vocab.size()) >= size)
      break;
    std::string utf8;
    for (char32_t cp : word)
      Tokenizer::appendUtf8(utf8, cp);
    if (seen.insert(utf8).second)
      vocab.push_back(std::move(utf8));
  }
  return vocab;
}

} // namespace lmcc
