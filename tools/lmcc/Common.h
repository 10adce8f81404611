//===- Common.h - What the lmcc subcommands share -------------------------===//
//
// The error kinds and exit codes, the parsed command line (Options), input reading (whole files, or line by
// line for the streaming commands: score, embed, tokenize, sts, blimp, rerank), sentence encoding (ids or the
// spec's [tokenizer]), number and string formatting of the JSON output, the progress line, and the compiled
// model loaded from the library cache.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "driver/Compile.h"
#include "frontend/Spec.h"
#include "runtime/lib/Tokenizer.h"
#include "runtime/lib/lmrt.h"
#include "runtime/weights/Safetensors.h"
#include "tools/lmcc/Diformer.h"
#include "tools/lmcc/TrainRun.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace lmcc::cli {

constexpr int kExitOk = 0, kExitInput = 1, kExitUsage = 2, kExitUnsupported = 3, kExitInternal = 4,
              kExitResource = 5;

/// Invalid input or output (exit 1); the message names the file and line.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A command line that parses but asks for something impossible (a missing -o, options that exclude each
/// other): exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Not enough memory for what was asked, with the runtime's message (e.g. a sentence over --max-memory): exit 5.
struct ResourceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string spec, weights, ids = "-", output, from, input, cpu, dumpIR, gemm = "generated", text, corpus;
  std::string weightsDtype = "f32";
  bool json = false, reference = false, embedWeights = false, staticArchive = false, naive = false, stats = false;
  bool tokens = false, truncate = false, lowercase = false, timing = false, wordLevel = false;
  std::optional<double> lambda; ///< lmcc score --lambda (family ngram); unset: the spec's
  std::string name;
  int64_t vocabSize = 0;
  std::map<std::string, bool> noPass; // pass flag -> --no-<pass> given
  int64_t statsN = 0;
  int64_t l1Ways = 0; ///< lmcc compile --l1-ways; 0 = the host's (a named --cpu: unknown)
  int threads = 1;
  uint64_t seed = 0;
  bool train = false;
  std::string batch, batches, resume;
  int64_t steps = 0, saveEvery = 0;
  lmcc::cli::TrainRunOptions run; // lmcc train --data
  lmcc::cli::TranslateOptions translate;
  // Evaluation (tools/lmcc/Eval.cpp) and the scoring commands.
  std::string pll = "original"; ///< --pll original|word-l2r (mask-and-predict scoring)
  int64_t maxMemoryMB = 0;      ///< --max-memory MB; 0 = the runtime's default
  std::string data, layout, nbest, tune;
  bool markdown = false;
  int64_t maxPairs = 0;              ///< blimp --max-pairs; 0 = every pair
  double rerankLambda = -1;          ///< rerank --lambda; < 0: --tune
  double lengthPenalty = 0;          ///< rerank --length-penalty
  bool lengthPenaltyGiven = false;
};

/// The whole contents of `path` ('-' = stdin); a directory, an unreadable file or a read error is an
/// InputError naming the path.
std::string readInput(const std::string &path, const char *what);

/// Reads `path` ('-' = stdin; gzip-compressed files are decompressed) one line at a time, so a command's memory
/// does not grow with its input. A final newline does not start a line; "\r\n" is accepted; a line longer than
/// 16 MiB is an error naming it (a binary file such as /dev/zero fails fast).
class LineReader {
public:
  LineReader(const std::string &path, const char *what);
  ~LineReader();
  LineReader(const LineReader &) = delete;
  LineReader &operator=(const LineReader &) = delete;
  /// The next line (without its newline) into `line`; false at the end of the input.
  bool next(std::string &line);
  /// "file:line" of the line `next` returned last.
  std::string where() const { return name + ":" + std::to_string(lineNo); }
  const std::string &fileName() const { return name; }
  int64_t lineNumber() const { return lineNo; }

private:
  bool fill();
  void *file = nullptr; // gzFile
  std::string name, what, buffer;
  size_t pos = 0;
  bool eof = false;
  int64_t lineNo = 0;
};

/// One line of token ids, validated: integers in [0, vocab), 1 to max_len of them.
std::vector<int32_t> encodeIds(std::string_view line, const std::string &where, const ModelSpec &spec);

/// One line of text through the tokenizer (bos + pieces + eos). A sentence longer than max_len is an error
/// naming `where` unless `truncate` (keep bos, the first max_len - 2 pieces and eos).
std::vector<int32_t> encodeText(std::string_view line, const std::string &where, const ModelSpec &spec,
                                const Tokenizer &tok, bool truncate);

/// The spec's [tokenizer]: the vocabulary, the [tokens] ids as specials, and the special strings
/// given in the spec checked against the vocabulary's lines.
Tokenizer loadTokenizer(const ModelSpec &spec);

/// A JSON string literal (pieces may hold quotes, backslashes and any UTF-8).
std::string jsonString(const std::string &s);

/// Formats a float with 9 significant digits; a non-finite value is an InputError "non-finite <what> (check the
/// weights)", so `what` names the value and where it comes from ("score for ids.txt:3").
void appendNumber(std::string &out, double v, const std::string &what);

/// A result of `entry` ("score", "embed") for the input at `origin` ("ids.txt:3") that is not finite: the
/// InputError the compiled runtime's LM_ERR_NONFINITE becomes (throwRuntimeStatus), for the reference executor,
/// which reports none itself.
template <typename T> void checkFinite(const T *values, size_t count, const std::string &origin, const char *entry) {
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(values[i]))
      throw InputError(origin + ": " + entry + ": non-finite result (the outputs are not usable; check the weights "
                       "for huge values)");
}

/// Parses one JSON value; a syntax error is an InputError naming `where`.
nlohmann::json parseJson(const std::string &text, const std::string &where);

/// writeSafetensors through a temporary directory beside `path` that SIGINT / SIGTERM / SIGHUP remove too
/// (driver::TempDir), then renamed into place: an interrupted `init`, `convert` or `grad` leaves nothing behind.
/// `path` must be a regular file or new.
void writeWeightsFile(const std::string &path, const WeightSet &weights);

/// Writes `text` to stdout and flushes it; a failed write (a full disk, a closed pipe) is an InputError.
void writeStdout(const std::string &text);

/// One line on stderr redrawn in place ("\r": lines done, lines per second, elapsed time) when stderr is a
/// terminal, nothing otherwise. At most five redraws a second.
class Progress {
public:
  explicit Progress(const char *what);
  ~Progress(); // ends the line
  void add(int64_t lines);

private:
  void draw();
  const char *what;
  bool enabled;
  int64_t done = 0;
  std::chrono::steady_clock::time_point start, last;
};

/// A failed runtime call as the CLI reports it: bad input and non-finite results are input errors (exit 1), an
/// allocation failure is out of memory, anything else internal. `rows`: where each batch row of the call came
/// from ("ids.txt:3"); a non-finite result is then reported for the input of its row, not the batch row.
[[noreturn]] void throwRuntimeStatus(int status, const std::vector<std::string> &rows = {});

/// A failed training or translation call (no batch rows to name): out of memory is exit 5, anything else the input's
/// (exit 1), its message `message`.
[[noreturn]] void throwCallStatus(int status, const std::string &message);

/// The runtime's process-wide settings of a command: its threads and workspace limit (--max-memory MB; 0: the
/// runtime's default).
void setRuntime(const Options &o);

/// Sentences padded to one stride for the runtime's batched entries.
struct Padded {
  std::vector<int32_t> ids, lengths;
  int32_t stride = 1;
  explicit Padded(const std::vector<std::vector<int32_t>> &sentences);
};

/// The pipeline the flags ask for: --naive runs no pass, --no-<pass> drops one.
void applyPipelineFlags(const Options &o, driver::LibraryOptions &options);

/// Where this lmcc's runtime (liblmrt.so, lmrt.h) lives: <prefix>/lib next to <prefix>/bin/lmcc.
std::string runtimeDir();

/// Scores or embeds through the compiled library (JIT by way of a cached library).
struct CompiledModel {
  void *handle = nullptr;
  lm_model *model = nullptr;
  CompiledModel(const ModelSpec &spec, const Options &o, const std::string &weightsPath = "");
  ~CompiledModel();
  CompiledModel(const CompiledModel &) = delete;
  CompiledModel &operator=(const CompiledModel &) = delete;
  const lm_model_desc *desc() const { return reinterpret_cast<const lm_model_desc *const *>(model)[0]; }
};

/// A gradient in lm_rt_loss_and_grad's packed layout as one tensor per parameter (canonical names and shapes).
WeightSet unpackGradient(const lm_model_desc *d, const std::vector<float> &packed);

} // namespace lmcc::cli
