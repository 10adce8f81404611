//===- TrainRun.cpp - `lmcc train --data`: a training run over a corpus --------===//
#include "tools/lmcc/TrainRun.h"
#include "tools/lmcc/Common.h"

#include "runtime/train/Objectives.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace lmcc::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::atomic<int> stopSignal{0};
extern "C" void onStopSignal(int sig) { stopSignal.store(sig); }
} // namespace

StopSignals::StopSignals() {
  stopSignal.store(0);
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &oldInt_);
  sigaction(SIGTERM, &action, &oldTerm_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &oldInt_, nullptr);
  sigaction(SIGTERM, &oldTerm_, nullptr);
}

int StopSignals::caught() { return stopSignal.load(); }

namespace {

/// lmcc's bounded reader (readInput: a directory, a line over 16 MiB or 4 GiB in all are errors), as a RunError.
std::string readFile(const std::string &path, const char *what) {
  try {
    return readInput(path, what);
  } catch (const InputError &e) {
    throw RunError(e.what());
  }
}

/// fsync() of a file or directory: what a rename after it makes durable.
void flushToDisk(const fs::path &path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0)
      ::close(fd);
    throw RunError(path.string() + ": cannot flush to the disk: " + std::strerror(err));
  }
  ::close(fd);
}

/// Appends a whole line with one write(2) on an O_APPEND descriptor: a killed process leaves the line
/// entirely or not at all.
void appendLine(const fs::path &path, const std::string &line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RunError(path.string() + ": cannot open: " + std::strerror(errno));
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size()))
    throw RunError(path.string() + ": write failed: " + (n < 0 ? std::strerror(err) : "short write"));
}

void check(int status, const std::string &what) {
  if (status == LM_ERR_MEMORY) // exit 5, as every out of memory
    throw ResourceError(what + ": " + lm_rt_last_error());
  if (status != LM_OK)
    throw RunError(what + ": " + lm_rt_last_error());
}

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string clock(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

/// The directory lock: flock() on RUN_DIR/lock, released by the kernel when the process dies.
class RunLock {
public:
  explicit RunLock(const fs::path &dir) {
    const fs::path path = dir / "lock";
    // O_NOFOLLOW: a symbolic link planted as the lock would otherwise have its target truncated (as log.jsonl and
    // the other run files, a lock that is not a regular file is refused).
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0)
      throw RunError(path.string() + (errno == ELOOP ? std::string(": exists and is not a regular file")
                                                     : ": cannot open: " + std::string(std::strerror(errno))));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      if (err == EWOULDBLOCK)
        throw RunError(dir.string() + ": another lmcc train is using this run directory (" + path.string() +
                       " is locked)");
      throw RunError(path.string() + ": cannot lock: " + std::strerror(err));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0 && ::write(fd_, pid.data(), pid.size()) < 0) {
      // The pid is informational only.
    }
  }
  ~RunLock() { ::close(fd_); }
  RunLock(const RunLock &) = delete;
  RunLock &operator=(const RunLock &) = delete;

private:
  int fd_ = -1;
};

/// Test-only fault injection (LMCC_TRAIN_KILL_AT="step:K", "checkpoint:K", "term:K", "term-data:0" or
/// "term-loaded:0"): SIGKILL ourselves after step K or in the middle of writing checkpoint K (after its
/// weights, before the rename), or SIGTERM ourselves after step K, once the data is read (before the model is
/// compiled) or once the model is compiled (before the first step).
struct KillPoint {
  std::string where;
  int64_t step = -1;
  KillPoint() {
    if (const char *v = std::getenv("LMCC_TRAIN_KILL_AT")) {
      std::string s(v);
      size_t colon = s.find(':');
      if (colon != std::string::npos) {
        where = s.substr(0, colon);
        step = std::atoll(s.c_str() + colon + 1);
      }
    }
  }
  void at(const char *point, int64_t s) const {
    if (step != s)
      return;
    if (where == point)
      ::raise(SIGKILL);
    if ((where == "term" && std::string(point) == "step") || where == "term-" + std::string(point))
      ::raise(SIGTERM);
  }
};

struct Checkpoint {
  fs::path dir;
  int64_t step = 0, epoch = 0, batch = 0;
  double tokens = 0, seconds = 0;
};

/// The newest checkpoint-<step>/ with all its files and a readable state.json.
std::optional<Checkpoint> newestCheckpoint(const fs::path &runDir) {
  std::optional<Checkpoint> best;
  for (const auto &entry : fs::directory_iterator(runDir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("checkpoint-", 0) != 0)
      continue;
    const std::string digits = name.substr(11);
    if (digits.empty() || digits.size() > 15 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
      continue;
    Checkpoint c;
    c.dir = entry.path();
    try {
      for (const char *file : {"weights.safetensors", "trainer.safetensors"})
        if (!fs::is_regular_file(c.dir / file))
          throw RunError("missing");
      json state = json::parse(readFile((c.dir / "state.json").string(), "checkpoint state"));
      c.step = state.at("step").get<int64_t>();
      c.epoch = state.at("epoch").get<int64_t>();
      c.batch = state.at("batch").get<int64_t>();
      c.tokens = state.at("tokens").get<double>();
    } catch (const std::exception &) {
      std::fprintf(stderr, "lmcc train: %s is incomplete or unreadable; skipped\n", c.dir.c_str());
      continue;
    }
    if (c.step != std::stoll(digits))
      continue;
    if (!best || c.step > best->step)
      best = c;
  }
  // The elapsed time at that step (elapsed.json, written after each checkpoint); unknown (0) when the newest
  // complete checkpoint is not the one it was written for.
  if (best && fs::is_regular_file(runDir / "elapsed.json")) {
    try {
      json e = json::parse(readFile((runDir / "elapsed.json").string(), "elapsed time"));
      if (e.at("step").get<int64_t>() == best->step)
        best->seconds = e.at("elapsed_s").get<double>();
    } catch (const std::exception &) {
    }
  }
  return best;
}

/// Inputs, targets and lengths of a batch, padded to its longest sentence.
struct Packed {
  std::vector<int32_t> inputs, targets, lengths;
  int32_t batch = 0, stride = 1;
  int64_t tokens = 0;
};

Packed pack(const ModelSpec &spec, const std::vector<std::vector<int32_t>> &sentences, const train::Batch &batch,
            uint64_t step) {
  Packed p;
  p.batch = static_cast<int32_t>(batch.size());
  for (int64_t i : batch)
    p.stride = std::max<int32_t>(p.stride, static_cast<int32_t>(sentences[i].size()));
  p.inputs.assign(static_cast<size_t>(p.batch) * p.stride, static_cast<int32_t>(spec.tokens.pad));
  p.targets.assign(p.inputs.size(), -1);
  for (size_t b = 0; b < batch.size(); ++b) {
    const std::vector<int32_t> &x = sentences[batch[b]];
    train::Example e = train::makeExample(spec, x, step, static_cast<uint64_t>(batch[b]));
    std::copy(e.inputs.begin(), e.inputs.end(), p.inputs.begin() + b * p.stride);
    std::copy(e.targets.begin(), e.targets.end(), p.targets.begin() + b * p.stride);
    p.lengths.push_back(static_cast<int32_t>(x.size()));
    p.tokens += static_cast<int64_t>(x.size());
  }
  return p;
}

std::string number(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

class Run {
public:
  Run(const ModelSpec &spec, const TrainRunOptions &o, const TrainRunHooks &hooks)
      : spec_(spec), o_(o), hooks_(hooks), dir_(o.runDir), tty_(::isatty(STDERR_FILENO) == 1) {}

  int run();

private:
  void loadData();
  json record() const;
  void checkRecord();
  void validate(int64_t step);
  void logPoint(int64_t step, bool validated);
  void progress(int64_t step, bool force);
  void writeCheckpoint(int64_t step);
  /// Sets the place in the data (epoch, batch, tokens, the epoch's batches) after `step` steps from the start.
  void seekTo(int64_t step);
  void pruneCheckpoints();
  void trimLog(int64_t step);
  /// Ends a progress line redrawn in place (terminal only).
  void endLine() {
    if (lineOpen_)
      std::fprintf(stderr, "\n");
    lineOpen_ = false;
  }
  double elapsed() const {
    return secondsBefore_ +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }

  const ModelSpec &spec_;
  TrainRunOptions o_;
  const TrainRunHooks &hooks_;
  fs::path dir_;
  bool tty_;
  KillPoint kill_;

  train::Corpus train_, valid_;
  std::string validName_;
  lm_model *model_ = nullptr;
  lm_trainer *trainer_ = nullptr;
  int64_t total_ = 0, epoch_ = 0, batchIndex_ = 0;
  std::vector<train::Batch> batches_;

  // Progress since the last log point.
  std::deque<float> window_;
  double lastLr_ = 0, lastNorm_ = 0, tokens_ = 0, tokensAtLog_ = 0, secondsAtLog_ = 0, secondsBefore_ = 0;
  std::optional<double> validLoss_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now(), lastDraw_;
  bool lineOpen_ = false;
};

void Run::loadData() {
  train::CorpusLimits limits;
  limits.maxLen = spec_.dims.maxLen, limits.vocab = spec_.dims.vocab;
  limits.bos = static_cast<int32_t>(spec_.tokens.bos), limits.eos = static_cast<int32_t>(spec_.tokens.eos);
  limits.dropLong = o_.dropLong;
  train_ = train::readCorpus(readFile(o_.data, "data file"), o_.data, hooks_.encode, limits);
  if (!o_.valid.empty()) {
    valid_ = train::readCorpus(readFile(o_.valid, "validation file"), o_.valid, hooks_.encode, limits);
    validName_ = o_.valid;
  } else {
    valid_ = train::holdOut(train_, static_cast<uint64_t>(spec_.train.seed), o_.data);
    validName_ = "1% of " + o_.data;
  }
  if (train_.sentences.empty())
    throw RunError(o_.data + ": no sentence to train on");
  if (valid_.sentences.empty())
    throw RunError(o_.valid + ": no validation sentence");
  // A batch holds at most --batch-tokens tokens: every sentence must fit in one.
  for (const auto *c : {&train_, &valid_})
    for (size_t i = 0; i < c->sentences.size(); ++i)
      if (int64_t(c->sentences[i].size()) > o_.batchTokens)
        throw RunError((c == &train_ || o_.valid.empty() ? o_.data : o_.valid) + ":" + std::to_string(c->lines[i]) +
                       ": a sentence of " + std::to_string(c->sentences[i].size()) + " tokens does not fit in a batch "
                       "of --batch-tokens " + std::to_string(o_.batchTokens) + " (give at least max_len = " +
                       std::to_string(spec_.dims.maxLen) + ")");
}

json Run::record() const {
  json r;
  r["spec"] = spec_.name;
  r["spec_hash"] = specHash(spec_);
  r["data"] = o_.data;
  r["data_hash"] = hex(train::corpusHash(train_.sentences));
  r["valid"] = validName_;
  r["valid_hash"] = hex(train::corpusHash(valid_.sentences));
  r["sentences"] = train_.sentences.size();
  r["valid_sentences"] = valid_.sentences.size();
  r["steps"] = total_;
  r["batch_tokens"] = o_.batchTokens;
  r["threads"] = o_.threads;
  r["seed"] = spec_.train.seed;
  r["init"] = o_.weights.empty() ? std::string("seeded") : o_.weights;
  return r;
}

void Run::checkRecord() {
  const fs::path path = dir_ / "run.json";
  json saved;
  try {
    saved = json::parse(readFile(path.string(), "run record"));
  } catch (const json::exception &e) {
    throw RunError(path.string() + ": unreadable: " + e.what());
  }
  const json now = record();
  for (const char *key : {"spec_hash", "data_hash", "valid_hash", "steps", "batch_tokens", "threads", "seed", "init"})
    if (!saved.contains(key) || saved[key] != now[key])
      throw RunError(path.string() + ": \"" + key + "\" was " + (saved.contains(key) ? saved[key].dump() : "missing") +
                     ", this command gives " + now[key].dump() +
                     " (--resume continues the same run: same spec, data, --steps, --batch-tokens, --threads, "
                     "--weights)");
}

void Run::validate(int64_t step) {
  double sum = 0;
  int64_t count = 0;
  const std::vector<train::Batch> batches = train::fixedBatches(valid_.sentences, o_.batchTokens);
  for (const train::Batch &b : batches) {
    Packed p = pack(spec_, valid_.sentences, b, /*step=*/0);
    float loss = 0;
    int64_t targets = 0;
    check(lm_rt_loss(model_, p.inputs.data(), p.targets.data(), p.lengths.data(), p.batch, p.stride, &loss, &targets),
          "validation at step " + std::to_string(step));
    sum += double(loss) * double(targets);
    count += targets;
  }
  validLoss_ = count ? sum / double(count) : std::nan("");
}

void Run::progress(int64_t step, bool force) {
  if (!tty_ && !force)
    return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - lastDraw_ < std::chrono::milliseconds(100)) // redrawn at most 10 times a second
    return;
  lastDraw_ = now;
  double mean = 0;
  for (float l : window_)
    mean += l;
  mean = window_.empty() ? 0 : mean / double(window_.size());
  const double seconds = elapsed();
  const double rate = (seconds - secondsAtLog_) > 0 ? (tokens_ - tokensAtLog_) / (seconds - secondsAtLog_) : 0;
  const double perStep = seconds / std::max<double>(1, double(step));
  const double epoch = double(epoch_) + (batches_.empty() ? 0 : double(batchIndex_) / double(batches_.size()));
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  epoch %.2f  loss %.4f  lr %.3g  %.0f tok/s  %s elapsed  ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), epoch, mean, lastLr_,
                tokens_ == tokensAtLog_ ? 0.0 : rate, clock(seconds).c_str(),
                clock(perStep * double(total_ - step)).c_str());
  if (tty_)
    std::fprintf(stderr, "\r%s\x1b[K", line);
  else
    std::fprintf(stderr, "%s\n", line);
  lineOpen_ = tty_;
  std::fflush(stderr);
}

void Run::logPoint(int64_t step, bool validated) {
  double mean = 0;
  for (float l : window_)
    mean += l;
  mean = window_.empty() ? std::nan("") : mean / double(window_.size());
  const double seconds = elapsed();
  const double rate = seconds > secondsAtLog_ ? (tokens_ - tokensAtLog_) / (seconds - secondsAtLog_) : 0;
  const double epoch = double(epoch_) + (batches_.empty() ? 0 : double(batchIndex_) / double(batches_.size()));
  std::string line = "{\"step\":" + std::to_string(step) + ",\"epoch\":" + number(epoch) + ",\"loss\":" +
                     number(mean) + ",\"lr\":" + number(lastLr_) + ",\"tokens_per_s\":" + number(rate) +
                     ",\"grad_norm\":" + number(lastNorm_);
  if (validated)
    line += ",\"valid_loss\":" + number(*validLoss_) + ",\"valid_ppl\":" + number(std::exp(*validLoss_));
  line += "}\n";
  appendLine(dir_ / "log.jsonl", line);
  progress(step, /*force=*/true);
  if (validated) {
    endLine();
    std::fprintf(stderr, "  valid loss %.4f  ppl %.2f (%s)\n", *validLoss_, std::exp(*validLoss_),
                 validName_.c_str());
  }
  window_.clear();
  tokensAtLog_ = tokens_;
  secondsAtLog_ = seconds;
  if (validated) {
    try {
      plotRun(dir_.string());
    } catch (const std::exception &e) {
      std::fprintf(stderr, "lmcc train: loss.png not drawn: %s\n", e.what());
    }
  }
}

void Run::seekTo(int64_t step) {
  epoch_ = 0, batchIndex_ = 0, tokens_ = 0;
  batches_ = train::epochBatches(train_.sentences, o_.batchTokens, uint64_t(spec_.train.seed), 0);
  for (int64_t left = step; left > 0;) {
    if (batchIndex_ == static_cast<int64_t>(batches_.size())) {
      ++epoch_, batchIndex_ = 0;
      batches_ = train::epochBatches(train_.sentences, o_.batchTokens, uint64_t(spec_.train.seed), uint64_t(epoch_));
    }
    if (batches_.empty()) // not for a corpus that was read (every sentence is in a batch), but never a loop forever
      throw RunError("epoch " + std::to_string(epoch_) + " has no batch");
    const int64_t take = std::min<int64_t>(left, static_cast<int64_t>(batches_.size()) - batchIndex_);
    for (int64_t b = batchIndex_; b < batchIndex_ + take; ++b)
      for (int64_t i : batches_[b])
        tokens_ += double(train_.sentences[i].size());
    batchIndex_ += take, left -= take;
  }
}

void Run::writeCheckpoint(int64_t step) {
  const fs::path final = dir_ / ("checkpoint-" + std::to_string(step));
  const fs::path tmp = dir_ / (".checkpoint-" + std::to_string(step) + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec)
    throw RunError(tmp.string() + ": " + ec.message());
  try { // a failure (a full disk) leaves no partial checkpoint behind
    check(lm_rt_save_weights(model_, (tmp / "weights.safetensors").c_str()), "checkpoint " + std::to_string(step));
    kill_.at("checkpoint", step);
    check(lm_rt_trainer_save(trainer_, (tmp / "trainer.safetensors").c_str()), "checkpoint " + std::to_string(step));
    json state;
    state["step"] = step;
    state["epoch"] = epoch_;
    state["batch"] = batchIndex_;
    state["tokens"] = tokens_;
    state["rng"] = {{"generator", "philox4x32-10"}, {"seed", spec_.train.seed}, {"counter_step", step}};
    writeAtomically(tmp / "state.json", state.dump(1) + "\n");
    flushToDisk(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (fs::exists(final)) // the same step written again (a resumed run that had finished): same contents
    fs::remove_all(final);
  fs::rename(tmp, final, ec);
  if (ec)
    throw RunError(final.string() + ": cannot rename the checkpoint into place: " + ec.message());
  flushToDisk(dir_);
  // The wall clock is the run's, not the checkpoint's (a checkpoint is a function of spec, data, seed and
  // threads, byte for byte): beside it, for the progress line's elapsed time after a resume.
  writeAtomically(dir_ / "elapsed.json", json{{"step", step}, {"elapsed_s", elapsed()}}.dump() + "\n");
  pruneCheckpoints();
}

void Run::pruneCheckpoints() {
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto &entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("checkpoint-", 0) == 0 && name.size() > 11 &&
        std::all_of(name.begin() + 11, name.end(), ::isdigit) && name.size() <= 26)
      found.push_back({std::stoll(name.substr(11)), entry.path()});
  }
  std::sort(found.rbegin(), found.rend());
  for (size_t i = size_t(std::max<int64_t>(o_.keep, 1)); i < found.size(); ++i)
    fs::remove_all(found[i].second);
}

/// Drops log points after `step` (written by a run that died before its next checkpoint).
void Run::trimLog(int64_t step) {
  const fs::path path = dir_ / "log.jsonl";
  if (!fs::exists(path))
    return;
  std::istringstream in(readFile(path.string(), "log"));
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (json::parse(line).at("step").get<int64_t>() <= step)
        kept += line + "\n";
    } catch (const std::exception &) {
      // A line cut by a kill: dropped.
    }
  }
  writeAtomically(path, kept);
}

int Run::run() {
  // SIGINT / SIGTERM from the start (issue 16: finish the current step, write a checkpoint, exit 130): one that
  // arrives while the data is read or the model compiled stops the run before its first step (below).
  const StopSignals signals;

  if (o_.batchTokens < 1)
    throw RunError("--batch-tokens " + std::to_string(o_.batchTokens) + ": must be positive");
  if (o_.logEvery < 1 || o_.validEvery < 0 || o_.checkpointEvery < 0 || o_.keep < 1)
    throw RunError("--log-every and --keep must be positive, --valid-every and --checkpoint-every >= 0 (0 = only at "
                   "the end)");
  loadData(); // every data error before anything is compiled or written
  kill_.at("data", 0);
  total_ = o_.steps > 0 ? o_.steps : spec_.train.steps;

  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw RunError(o_.runDir + ": cannot create the run directory" + (ec ? ": " + ec.message() : std::string()));
  RunLock lock(dir_);
  std::vector<fs::path> stale; // temporaries of a run that died
  for (const fs::path &d : {dir_, dir_ / "final"})
    if (fs::is_directory(d))
      for (const auto &entry : fs::directory_iterator(d)) {
        const std::string name = entry.path().filename().string();
        if (name.find(".tmp-") != std::string::npos || name.rfind(".init-", 0) == 0)
          stale.push_back(entry.path());
      }
  for (const fs::path &p : stale)
    fs::remove_all(p, ec);

  std::optional<Checkpoint> from;
  bool wroteRecord = false; // this process made run.json: removed again when the model does not load
  if (o_.resume && fs::exists(dir_ / "run.json")) {
    checkRecord();
    from = newestCheckpoint(dir_);
  } else {
    // A fresh run; with --resume, one killed before it wrote run.json (nothing else can be there).
    for (const auto &entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (name != "lock")
        throw RunError(o_.runDir + ": " +
                       (o_.resume ? "holds " + name + " but no run.json: not a run directory of lmcc train --data"
                                  : "not empty (holds " + name +
                                        "); continue that run with --resume, or train into a new directory"));
    }
    writeAtomically(dir_ / "run.json", record().dump(1) + "\n");
    wroteRecord = true;
  }

  // The model: the checkpoint's weights, the given ones, or seeded ones. Until it is loaded, a failure (a full
  // disk while writing seeded weights, bad --weights, a compile failure, a signal) leaves RUN_DIR as it was, so
  // that it can be reused.
  std::string weights = o_.weights;
  const fs::path init = dir_ / (".init-" + std::to_string(::getpid()) + ".safetensors");
  auto undo = [&] {
    fs::remove(init, ec);
    if (wroteRecord)
      fs::remove(dir_ / "run.json", ec);
  };
  try {
    if (from)
      weights = (from->dir / "weights.safetensors").string();
    else if (weights.empty()) {
      hooks_.writeInitWeights(init.string());
      weights = init.string();
    }
    if (StopSignals::caught()) { // before compiling: nothing to keep (a rerun starts afresh)
      undo();
      std::fprintf(stderr, "lmcc train: stopped by signal %d before the first step; nothing written\n",
                   StopSignals::caught());
      return 130;
    }
    model_ = hooks_.load(weights);
  } catch (...) {
    undo();
    throw;
  }
  fs::remove(init, ec);
  kill_.at("loaded", 0);
  started_ = std::chrono::steady_clock::now(); // compiling is not training time
  lm_rt_set_num_threads(o_.threads);
  lm_rt_set_workspace_limit(o_.maxMemoryMB << 20); // 0: the runtime's default
  lm_train_desc settings = *reinterpret_cast<const lm_model_desc *const *>(model_)[0]->train;
  settings.steps = total_;
  check(lm_rt_trainer_new_ex(model_, &settings, &trainer_), "trainer");
  std::unique_ptr<lm_trainer, void (*)(lm_trainer *)> owner(trainer_, lm_rt_trainer_free);

  int64_t step = 0;
  if (from) {
    check(lm_rt_trainer_load(trainer_, (from->dir / "trainer.safetensors").c_str()), from->dir.string());
    step = lm_rt_trainer_steps(trainer_);
    if (step != from->step)
      throw RunError(from->dir.string() + ": trainer state at step " + std::to_string(step) + ", state.json says " +
                     std::to_string(from->step));
    epoch_ = from->epoch, batchIndex_ = from->batch, tokens_ = from->tokens, secondsBefore_ = from->seconds;
    tokensAtLog_ = tokens_, secondsAtLog_ = secondsBefore_;
    std::fprintf(stderr, "lmcc train: resuming %s from %s (step %lld)\n", o_.runDir.c_str(),
                 from->dir.filename().c_str(), static_cast<long long>(step));
  } else if (o_.resume) {
    std::fprintf(stderr, "lmcc train: %s has no complete checkpoint; starting from step 0\n", o_.runDir.c_str());
  }
  trimLog(step);
  // state.json's place in the data, checked before it is used (issue 21: a damaged checkpoint is an error naming
  // it, not a crash or a silently different run). run.json fixes the data, --batch-tokens and the seed, so the
  // place is a function of the step: recomputed, and the state must say the same.
  if (from) {
    const int64_t epoch = epoch_, batch = batchIndex_;
    const double tokens = tokens_;
    seekTo(step);
    if (epoch != epoch_ || batch != batchIndex_ || !(tokens == tokens_))
      throw RunError((from->dir / "state.json").string() + ": epoch " + std::to_string(epoch) + ", batch " +
                     std::to_string(batch) + ", tokens " + number(tokens) + ", but step " + std::to_string(step) +
                     " of this run is at epoch " + std::to_string(epoch_) + ", batch " + std::to_string(batchIndex_) +
                     ", tokens " + number(tokens_) + " (an edited state, or another run's checkpoint)");
  } else {
    batches_ = train::epochBatches(train_.sentences, o_.batchTokens, uint64_t(spec_.train.seed), 0);
  }
  std::fprintf(stderr, "lmcc train: %zu training sentences (%zu batches an epoch), %zu validation sentences (%s); "
               "%lld steps\n",
               train_.sentences.size(), batches_.size(), valid_.sentences.size(), validName_.c_str(),
               static_cast<long long>(total_));

  bool checkpointed = from.has_value();
  while (step < total_ && !StopSignals::caught()) {
    if (batchIndex_ == static_cast<int64_t>(batches_.size())) {
      ++epoch_, batchIndex_ = 0;
      batches_ = train::epochBatches(train_.sentences, o_.batchTokens, uint64_t(spec_.train.seed), uint64_t(epoch_));
    }
    Packed p = pack(spec_, train_.sentences, batches_[batchIndex_], uint64_t(step));
    float loss = 0;
    check(lm_rt_train_step_ex(trainer_, p.inputs.data(), p.targets.data(), p.lengths.data(), p.batch, p.stride, &loss,
                              &lastLr_, &lastNorm_),
          "step " + std::to_string(step + 1));
    ++step, ++batchIndex_;
    tokens_ += double(p.tokens);
    window_.push_back(loss);
    kill_.at("step", step);
    const bool last = step == total_;
    const bool validated = last || (o_.validEvery > 0 && step % o_.validEvery == 0);
    if (validated)
      validate(step);
    if (validated || step % o_.logEvery == 0)
      logPoint(step, validated);
    else
      progress(step, false);
    checkpointed = false;
    if (last || StopSignals::caught() || (o_.checkpointEvery > 0 && step % o_.checkpointEvery == 0)) {
      writeCheckpoint(step);
      checkpointed = true;
    }
  }
  endLine();
  if (StopSignals::caught()) {
    if (!checkpointed)
      writeCheckpoint(step);
    std::fprintf(stderr, "lmcc train: stopped by signal %d after step %lld; checkpoint-%lld written (--resume "
                 "continues)\n",
                 StopSignals::caught(), static_cast<long long>(step), static_cast<long long>(step));
    return 130;
  }
  if (!checkpointed) // resumed at the end: the checkpoint exists; the final weights may not
    writeCheckpoint(step);
  fs::create_directories(dir_ / "final", ec);
  check(lm_rt_save_weights(model_, (dir_ / "final" / "weights.safetensors").c_str()), "final weights");
  if (!validLoss_)
    validate(step);
  plotRun(dir_.string());
  const int64_t cut = train_.truncated + valid_.truncated, dropped = train_.droppedLong + valid_.droppedLong;
  if (cut)
    std::fprintf(stderr, "lmcc train: %lld lines longer than max_len = %lld were truncated (--drop-long skips them)\n",
                 static_cast<long long>(cut), static_cast<long long>(spec_.dims.maxLen));
  if (dropped)
    std::fprintf(stderr, "lmcc train: %lld lines longer than max_len = %lld were skipped (--drop-long)\n",
                 static_cast<long long>(dropped), static_cast<long long>(spec_.dims.maxLen));
  json summary;
  summary["steps"] = step;
  summary["epochs"] = double(epoch_) + double(batchIndex_) / double(std::max<size_t>(1, batches_.size()));
  summary["valid_loss"] = *validLoss_;
  summary["valid_ppl"] = std::exp(*validLoss_);
  summary["tokens"] = tokens_;
  summary["truncated"] = cut;
  summary["dropped_long"] = dropped;
  summary["skipped_empty"] = train_.emptyLines + valid_.emptyLines;
  summary["skipped_no_content"] = train_.noContent + valid_.noContent;
  summary["weights"] = (dir_ / "final" / "weights.safetensors").string();
  std::printf("%s\n", summary.dump().c_str());
  return std::fflush(stdout) == 0 ? 0 : 1;
}

} // namespace

void requireReplaceable(const std::string &path) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw RunError(path + ": exists and is not a regular file (it is written to a temporary file and renamed "
                          "over the path)");
}

void writeAtomically(const std::string &path, const std::string &text) {
  requireReplaceable(path);
  const fs::path tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw RunError(tmp.string() + ": write failed: " + std::strerror(errno));
    }
  }
  flushToDisk(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw RunError(path + ": cannot rename into place: " + ec.message());
  }
}

int runTrainCorpus(const ModelSpec &spec, const TrainRunOptions &o, const TrainRunHooks &hooks) {
  Run run(spec, o, hooks);
  return run.run();
}

} // namespace lmcc::cli
