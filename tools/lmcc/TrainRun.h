//===- TrainRun.h - `lmcc train --data`: a training run over a corpus ----------===//
//
// A run directory holds
//   lock                      flock()ed while a run uses the directory
//   run.json                  what the run is a function of (spec hash, corpus hashes, steps,
//                             batch budget, threads, seed, initial weights); --resume checks it
//   log.jsonl                 one object per log point
//   loss.png                  training and validation loss (PLplot), redrawn at each validation
//   checkpoint-<step>/        weights.safetensors (canonical), trainer.safetensors (weights and
//                             optimizer state), state.json (step, epoch, batch, RNG); written as
//                             .checkpoint-<step>.tmp-<pid>/, flushed, then renamed
//   final/weights.safetensors at the end
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"
#include "runtime/lib/lmrt.h"
#include "runtime/train/Corpus.h"

#include <signal.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace lmcc::cli {

/// Bad input or a failed write of a run; the message names the file (and line).
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// While alive, SIGINT and SIGTERM are caught instead of ending the process (issue 16: a training loop finishes its
/// step, writes its weights and optimizer state, and exits 130); caught() says which arrived (0: none).
class StopSignals {
public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals &) = delete;
  StopSignals &operator=(const StopSignals &) = delete;
  static int caught();

private:
  struct sigaction oldInt_ {}, oldTerm_ {};
};

struct TrainRunOptions {
  std::string data, valid, weights, runDir;
  bool ids = false, dropLong = false, resume = false;
  int64_t steps = 0; ///< 0: the spec's [train] steps (the schedule's total is the run's length either way)
  int64_t batchTokens = 8192;
  int threads = 1;
  int64_t maxMemoryMB = 0; ///< the runtime's workspace limit (--max-memory); 0: its default
  int64_t logEvery = 25, validEvery = 250, checkpointEvery = 500, keep = 3;
};

struct TrainRunHooks {
  train::LineEncoder encode;                                     ///< a corpus line -> ids (text or --ids)
  std::function<lm_model *(const std::string &weights)> load;    ///< compiles (cached) with --train and loads
  std::function<void(const std::string &path)> writeInitWeights; ///< seeded initial weights, when no --weights
};

/// Runs (or resumes) a training run; returns the process exit code (130 after SIGINT/SIGTERM, with a
/// checkpoint written). Throws std::exception subclasses for bad input, naming file and line.
int runTrainCorpus(const ModelSpec &spec, const TrainRunOptions &o, const TrainRunHooks &hooks);

/// Redraws RUN_DIR/loss.png from RUN_DIR/log.jsonl (`lmcc plot`).
void plotRun(const std::string &runDir);

/// Throws RunError when `path` exists and is not a regular file (a device, a directory, a FIFO): the atomic
/// writes below rename over their path, which would replace it.
void requireReplaceable(const std::string &path);

/// Writes `text` to `path` (requireReplaceable) by way of a temporary file in the same directory, flushed to
/// the disk and renamed into place: a reader sees the old file or the whole new one.
void writeAtomically(const std::string &path, const std::string &text);

} // namespace lmcc::cli
