//===- Corpus.cpp - The data pipeline of `lmcc train --data` -------------------===//
#include "runtime/train/Corpus.h"

#include "runtime/train/Objectives.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <tuple>

namespace lmcc::train {

std::optional<long long> parseDecimal(const std::string &token) {
  const size_t digitsFrom = !token.empty() && token[0] == '-' ? 1 : 0;
  if (token.size() <= digitsFrom || token.find_first_not_of("0123456789", digitsFrom) != std::string::npos)
    return std::nullopt;
  errno = 0;
  const long long value = std::strtoll(token.c_str(), nullptr, 10);
  if (errno == ERANGE)
    return std::nullopt;
  return value;
}

std::vector<int32_t> parseIdLine(std::string_view line, const std::string &where, int64_t vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  int64_t column = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t')
      ++j;
    const std::string token(line.substr(i, j - i));
    ++column;
    // A negative id ('-' and digits, "-0" too) is reported as outside the vocabulary.
    const std::optional<long long> value = parseDecimal(token);
    const std::string at = where + ": token " + std::to_string(column);
    if (!value) {                                                 // also a NUL byte inside the token
      std::string shown;                                          // control bytes shown as \xNN
      for (unsigned char c : token.substr(0, 40)) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        shown += c < 0x20 || c == 0x7f ? std::string(buf) : std::string(1, char(c));
      }
      throw CorpusError(at + " '" + shown + (token.size() > 40 ? "...'" : "'") + " is not an integer token id");
    }
    if (token[0] == '-' || *value >= vocab)
      throw CorpusError(at + " (id " + token + ") is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(*value));
    i = j;
  }
  return ids;
}

Corpus readCorpus(std::string_view text, const std::string &name, const LineEncoder &encode,
                  const CorpusLimits &limits) {
  Corpus c;
  size_t pos = 0;
  int64_t lineNo = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    std::string_view line = text.substr(pos, (end == std::string_view::npos ? text.size() : end) - pos);
    pos = end == std::string_view::npos ? text.size() : end + 1;
    ++lineNo;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      ++c.emptyLines;
      continue;
    }
    const std::string where = name + ":" + std::to_string(lineNo);
    std::vector<int32_t> ids = encode(line, where);
    for (size_t t = 0; t < ids.size(); ++t)
      if (ids[t] < 0 || ids[t] >= limits.vocab)
        throw CorpusError(where + ": token " + std::to_string(t + 1) + " (id " + std::to_string(ids[t]) +
                          ") is outside the vocabulary [0, " + std::to_string(limits.vocab) + ")");
    if (static_cast<int64_t>(ids.size()) > limits.maxLen) {
      if (limits.dropLong) {
        ++c.droppedLong;
        continue;
      }
      const bool endsInEos = ids.back() == limits.eos;
      ids.resize(static_cast<size_t>(limits.maxLen));
      if (endsInEos)
        ids.back() = limits.eos;
      ++c.truncated;
    }
    if (std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return id == limits.bos || id == limits.eos; })) {
      ++c.noContent;
      continue;
    }
    c.sentences.push_back(std::move(ids));
    c.lines.push_back(lineNo);
  }
  return c;
}

Corpus holdOut(Corpus &corpus, uint64_t seed, const std::string &name) {
  const int64_t n = static_cast<int64_t>(corpus.sentences.size());
  const int64_t k = std::max<int64_t>(100, (n + 99) / 100);
  if (n <= k)
    throw CorpusError(name + ": " + std::to_string(n) + " sentences are too few to hold out " + std::to_string(k) +
                      " for validation and train on the rest; give a validation file with --valid");
  std::vector<std::pair<double, int64_t>> keyed(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    keyed[i] = {uniform(seed, 0, static_cast<uint64_t>(i), 0, Purpose::Holdout), i};
  std::partial_sort(keyed.begin(), keyed.begin() + k, keyed.end());
  std::vector<bool> held(static_cast<size_t>(n), false);
  for (int64_t j = 0; j < k; ++j)
    held[keyed[j].second] = true;
  Corpus train, valid;
  for (int64_t i = 0; i < n; ++i) {
    Corpus &to = held[i] ? valid : train;
    to.sentences.push_back(std::move(corpus.sentences[i]));
    to.lines.push_back(corpus.lines[i]);
  }
  corpus.sentences = std::move(train.sentences);
  corpus.lines = std::move(train.lines);
  return valid;
}

namespace {

/// Consecutive sentences of `order` grouped while count * longest <= budget.
std::vector<Batch> group(const std::vector<std::vector<int32_t>> &sentences, const std::vector<int64_t> &order,
                         int64_t batchTokens) {
  std::vector<Batch> batches;
  Batch current;
  int64_t longest = 0;
  for (int64_t i : order) {
    const int64_t len = static_cast<int64_t>(sentences[i].size());
    const int64_t nextLongest = std::max(longest, len);
    if (!current.empty() && static_cast<int64_t>(current.size() + 1) * nextLongest > batchTokens) {
      batches.push_back(std::move(current));
      current.clear();
      longest = 0;
    }
    current.push_back(i);
    longest = std::max(longest, len);
  }
  if (!current.empty())
    batches.push_back(std::move(current));
  return batches;
}

} // namespace

std::vector<Batch> epochBatches(const std::vector<std::vector<int32_t>> &sentences, int64_t batchTokens,
                                uint64_t seed, uint64_t epoch) {
  const size_t n = sentences.size();
  std::vector<std::tuple<size_t, double, int64_t>> keyed(n);
  for (size_t i = 0; i < n; ++i)
    keyed[i] = {sentences[i].size(), uniform(seed, epoch, i, 0, Purpose::Shuffle), static_cast<int64_t>(i)};
  std::sort(keyed.begin(), keyed.end());
  std::vector<int64_t> order(n);
  for (size_t i = 0; i < n; ++i)
    order[i] = std::get<2>(keyed[i]);
  std::vector<Batch> batches = group(sentences, order, batchTokens);
  std::vector<std::pair<double, size_t>> batchKeys(batches.size());
  for (size_t b = 0; b < batches.size(); ++b)
    batchKeys[b] = {uniform(seed, epoch, b, 0, Purpose::BatchOrder), b};
  std::sort(batchKeys.begin(), batchKeys.end());
  std::vector<Batch> out;
  out.reserve(batches.size());
  for (const auto &[key, b] : batchKeys)
    out.push_back(std::move(batches[b]));
  return out;
}

std::vector<Batch> fixedBatches(const std::vector<std::vector<int32_t>> &sentences, int64_t batchTokens) {
  std::vector<int64_t> order(sentences.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sentences[a].size() < sentences[b].size(); });
  return group(sentences, order, batchTokens);
}

uint64_t corpusHash(const std::vector<std::vector<int32_t>> &sentences) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (v >> (8 * byte)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(sentences.size());
  for (const auto &s : sentences) {
    mix(s.size());
    for (int32_t id : s)
      mix(static_cast<uint32_t>(id));
  }
  return h;
}

} // namespace lmcc::train
