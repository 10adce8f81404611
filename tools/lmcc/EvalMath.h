//===- EvalMath.h - The arithmetic of lmcc sts / blimp / rerank -----------===//
//
// Pure functions (no model): word spans of WordPiece sentences for word-level PLL, cosine similarity,
// Pearson and Spearman correlation, word edit distance for WER. Tested in tests/unit/EvalMathTest.cpp.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lmcc {
class Tokenizer;
}

namespace lmcc::cli {

/// For each piece i of `ids`, the index one past the last piece of the word that holds piece i. A piece whose
/// string starts with "##" continues the previous piece's word; bos, eos and the other specials are words of
/// their own (a "##" piece after one starts a word). Original PLL scores piece i alone (span i + 1); word-l2r
/// scores piece i with pieces [i, spans[i]) masked.
std::vector<int32_t> wordSpans(const Tokenizer &tok, const std::vector<int32_t> &ids);

/// True when every spans[i] == i + 1 (word-l2r equals original PLL on this sentence).
bool originalSpans(const std::vector<int32_t> &spans);

/// Cosine similarity of two vectors of equal size (0 when either is zero).
double cosine(const std::vector<float> &a, const std::vector<float> &b);

/// Pearson correlation of x and y (equal sizes, at least 2; NaN when either is constant).
double pearson(const std::vector<double> &x, const std::vector<double> &y);

/// Ranks 1..n, tied values getting the average of their ranks.
std::vector<double> averageRanks(const std::vector<double> &x);

/// Spearman correlation: Pearson of the average ranks.
double spearman(const std::vector<double> &x, const std::vector<double> &y);

/// Whitespace-separated words.
std::vector<std::string_view> splitWords(std::string_view text);

/// Levenshtein distance between two word sequences (substitutions, insertions, deletions cost 1).
int64_t wordEditDistance(const std::vector<std::string_view> &ref, const std::vector<std::string_view> &hyp);

} // namespace lmcc::cli
