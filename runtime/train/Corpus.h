//===- Corpus.h - The data pipeline of `lmcc train --data` ---------------------===//
//
// A corpus is one sentence a line (text through the spec's tokenizer, or token ids).
// This file turns it into the batches a run trains on, as a pure function of
// (lines, seed, epoch, batch-token budget), so that a run can be resumed from a
// checkpoint that stores only (epoch, batch index):
//
//   reading     empty lines are skipped (counted); a line over max_len is cut to
//               max_len (its last id stays eos when it was eos) or, with dropLong,
//               skipped (counted); a sentence without a content token (only bos/eos)
//               is skipped (counted: no objective has a target in it). Errors name
//               `file:line`.
//   hold-out    without a validation file, ceil(1%) of the sentences, at least 100,
//               are held out: the ones with the smallest keys
//               uniform(seed, 0, index, 0, Holdout) (ties: the lower index); both parts
//               keep the corpus order.
//   epoch e     keys k_i = uniform(seed, e, i, 0, Shuffle); sentences sorted by
//               (length, k_i, i); consecutive sentences form a batch while
//               count * longest <= batchTokens (a sentence longer than the budget is a
//               batch of its own; lmcc train refuses such a corpus); the batches are then ordered by
//               uniform(seed, e, batch, 0, BatchOrder) (ties: the lower batch index).
//   validation  sentences sorted by (length, index), batched the same way, no shuffle.
//
// uniform() and its Philox counter layout are Objectives.h's.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmcc::train {

/// A malformed corpus line; the message starts with `file:line`.
struct CorpusError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Encodes one line (without its newline) into a sentence's ids; `where` is "file:line".
/// Throws CorpusError (or anything derived from std::exception) for a malformed line.
using LineEncoder = std::function<std::vector<int32_t>(std::string_view line, const std::string &where)>;

struct Corpus {
  std::vector<std::vector<int32_t>> sentences;
  std::vector<int64_t> lines; ///< the 1-based source line of each sentence
  int64_t emptyLines = 0, truncated = 0, droppedLong = 0, noContent = 0;
};

struct CorpusLimits {
  int64_t maxLen = 0, vocab = 0;
  int32_t bos = -1, eos = -1;
  bool dropLong = false;
};

/// Reads `text` (the contents of `name`) line by line through `encode`; a final newline does not
/// start a line, "\r\n" is accepted. Ids outside [0, vocab) are an error naming the line.
Corpus readCorpus(std::string_view text, const std::string &name, const LineEncoder &encode,
                  const CorpusLimits &limits);

/// The integer a token spells in decimal: digits, or '-' and digits; nothing for anything else ('+3', a leading
/// \v or \f that strtoll would skip, "12abc", an embedded NUL) or past the range of long long.
std::optional<long long> parseDecimal(const std::string &token);

/// Parses a line of whitespace-separated token ids (the `--ids` format); errors name `where` and
/// the token's column.
std::vector<int32_t> parseIdLine(std::string_view line, const std::string &where, int64_t vocab);

/// Moves the held-out sentences (see the file comment) from `corpus` into the returned corpus.
/// Throws CorpusError when nothing would be left to train on (a corpus of at most the held-out count).
Corpus holdOut(Corpus &corpus, uint64_t seed, const std::string &name);

/// One batch: indices into the corpus's sentences.
using Batch = std::vector<int64_t>;

/// The batches of epoch `epoch`, in training order (see the file comment).
std::vector<Batch> epochBatches(const std::vector<std::vector<int32_t>> &sentences, int64_t batchTokens,
                                uint64_t seed, uint64_t epoch);

/// The validation batches: sorted by length, no shuffle.
std::vector<Batch> fixedBatches(const std::vector<std::vector<int32_t>> &sentences, int64_t batchTokens);

/// FNV-1a 64 over the sentences (lengths and ids): identifies a corpus in a run's record.
uint64_t corpusHash(const std::vector<std::vector<int32_t>> &sentences);

} // namespace lmcc::train
