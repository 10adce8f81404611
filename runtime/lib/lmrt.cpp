//===- lmrt.cpp - The lmcc runtime behind every generated library ---------===//
//
// Implements the C ABI of lmrt.h:
//  * loading: safetensors (F32/F16/BF16) or embedded weights into one 64-byte
//    aligned flat buffer laid out by the model descriptor, with every tensor's
//    presence, shape and finiteness checked, and unexpected tensors rejected;
//  * score/embed: every argument validated before anything is written, then the
//    batch is cut into chunks of consecutive sentences (always the same chunks,
//    whatever the thread count, so results do not depend on it), each chunk packed
//    into a dense [rows, n] id matrix padded with the pad id and handed to the
//    compiled kernel; chunks run in parallel on a oneTBB arena;
//  * the Eigen GEMM fallback the kernels call (lm_rt_sgemm_nt).
//
// Thread safety: a loaded model is read-only and every call works in its own
// buffers (taken from a per-thread pool, so the steady state does not allocate),
// so concurrent calls on one model or on different models are safe.
// No C++ exception crosses the C ABI: every entry point catches everything and
// turns it into a status code plus the thread's lm_last_error() message.
//
//===----------------------------------------------------------------------===//

#include "runtime/lib/lmrt.h"
#include "runtime/lib/Tokenizer.h"
#include "runtime/weights/Format.h"
#include "runtime/weights/Safetensors.h"

#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "runtime/lib/Internal.h"

namespace {

using lmcc::quoted;
using lmcc::shapeString;
using lmcc::valueString;
using lmcc::WeightError;

/// Sentences per chunk of lm_rt_score_pairs, and the smallest chunk of the score and embed pieces (planPieces).
constexpr int64_t kChunkRows = 8;
/// The most sentences a score or embed piece run alone takes: each piece streams every weight from memory once and
/// runs its GEMMs on its rows alone, so a batch of short sentences gains from large ones. Pieces of 32 rather than 8
/// sentences (bench/results/2026-12-04-pieces.md; one library, the two plans alternating call by call in one
/// process, bit-identical results): T-TA / uniLM score batch 32 n 10 one thread 1.08x, n 40 1.04x, n 128 1.01x,
/// biLM PLL n 10 1.03x. Pieces side by side (planPieces) keep kChunkRows.
constexpr int64_t kMaxChunkRows = 32;
/// Temporaries past which a chunk of sentences runs sentence by sentence even where the limit allows more: a
/// larger piece gains nothing in its GEMMs, and its activations only stream through memory and crowd the
/// thread's share of the workspace limit (a chunk of 8 biLM PLL sentences at n = 128, 2.4 GB, ran 1.5x slower
/// per sentence than one sentence, 300 MB, at a time).
constexpr double kPieceBytes = double(512 << 20);
/// Upper bound on the arena size, whatever lm_set_num_threads was given.
constexpr int kMaxArenaThreads = 1024;
constexpr size_t kWeightAlignment = LM_WEIGHT_ALIGNMENT;

// --- Errors ---------------------------------------------------------------------

thread_local std::string t_error;
thread_local const char *t_errorText = "";

int fail(int code, const char *message) noexcept {
  try {
    t_error = message;
    t_errorText = t_error.c_str();
  } catch (...) {
    t_errorText = "out of memory (while recording an error message)";
  }
  return code;
}

int fail(int code, const std::string &message) noexcept { return fail(code, message.c_str()); }

/// An error with its status code, thrown inside the runtime and turned into a return value at
/// the C boundary.
struct Failure {
  int code;
  std::string message;
};

[[noreturn]] void argumentError(std::string message) { throw Failure{LM_ERR_ARGUMENT, std::move(message)}; }
/// A generated entry point computed a NaN or infinity (weights with huge values, say): LM_ERR_NONFINITE.
[[noreturn]] void nonFinite(const char *entry, int32_t row) {
  throw Failure{LM_ERR_NONFINITE, std::string(entry) + ": non-finite result for batch row " + std::to_string(row) +
                                      " (the outputs are not usable; check the weights for huge values)"};
}
[[noreturn]] void internalError(std::string message) {
  throw Failure{LM_ERR_INTERNAL, "internal error: " + std::move(message)};
}

/// Runs `body` and converts whatever it throws into a status code and a message.
template <typename F> int guarded(F &&body) noexcept {
  try {
    body();
    return LM_OK;
  } catch (const Failure &f) {
    return fail(f.code, f.message);
  } catch (const WeightError &e) {
    return fail(LM_ERR_WEIGHTS, e.what());
  } catch (const std::bad_alloc &) {
    return fail(LM_ERR_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    try {
      return fail(LM_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
      return fail(LM_ERR_INTERNAL, "internal error");
    }
  } catch (...) {
    return fail(LM_ERR_INTERNAL, "internal error: unknown exception");
  }
}

// --- Formatting -------------------------------------------------------------------

using lmrt::detail::allocateFloats;
using lmrt::detail::descShape;
using lmrt::detail::Bound;
using lmrt::detail::runKernel;
using lmrt::detail::memref1;
using lmrt::detail::memref2;
using lmrt::detail::memref3;
using lmrt::detail::checkPairInputs;
using lmrt::detail::packPairs;
using lmrt::detail::PairBatch;

// --- Descriptor ---------------------------------------------------------------

/// Checks the descriptor a generated library passes (a failure here is a compiler bug).
void checkDescriptor(const lm_model_desc *desc) {
  if (!desc)
    argumentError("the model descriptor is NULL");
  const std::string model = desc->name ? quoted(desc->name) : std::string("(unnamed)");
  auto bad = [&](const std::string &what) { internalError("model descriptor " + model + ": " + what); };
  if (!desc->name)
    bad("name is NULL");
  if (desc->vocab < 1 || desc->vocab > std::numeric_limits<int32_t>::max())
    bad("vocab = " + std::to_string(desc->vocab) + " is out of range");
  if (desc->max_len < 1 || desc->max_len > std::numeric_limits<int32_t>::max())
    bad("max_len = " + std::to_string(desc->max_len) + " is out of range");
  if (desc->d_model < 1 || desc->d_model > (int64_t(1) << 32))
    bad("d_model = " + std::to_string(desc->d_model) + " is out of range");
  if (desc->pad_id < 0 || desc->pad_id >= desc->vocab)
    bad("pad_id = " + std::to_string(desc->pad_id) + " is outside the vocabulary");
  if (desc->num_tensors < 0 || (desc->num_tensors > 0 && !desc->tensors))
    bad("the tensor table is missing");
  if (desc->total_floats < 0 ||
      static_cast<uint64_t>(desc->total_floats) > std::numeric_limits<size_t>::max() / sizeof(float) / 2)
    bad("total_floats = " + std::to_string(desc->total_floats) + " is out of range");
  std::set<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> ranges; // [begin, end) in floats
  for (int32_t i = 0; i < desc->num_tensors; ++i) {
    const lm_tensor_desc &t = desc->tensors[i];
    if (!t.name)
      bad("tensor " + std::to_string(i) + " has no name");
    if (!names.insert(t.name).second)
      bad("tensor " + quoted(t.name) + " appears twice");
    if (t.rank < 1 || t.rank > 2)
      bad("tensor " + quoted(t.name) + " has rank " + std::to_string(t.rank));
    int64_t numel = 1;
    for (int32_t d = 0; d < t.rank; ++d) {
      if (t.shape[d] < 1)
        bad("tensor " + quoted(t.name) + " has shape " + shapeString(descShape(t)));
      if (t.shape[d] > desc->total_floats / numel) // numel * shape[d] > total_floats, without overflow
        bad("tensor " + quoted(t.name) + " of shape " + shapeString(descShape(t)) +
            " does not fit in the weight buffer");
      numel *= t.shape[d];
    }
    if (t.offset < 0 || t.offset > desc->total_floats - numel)
      bad("tensor " + quoted(t.name) + " has offset " + std::to_string(t.offset) + " (" +
          std::to_string(numel) + " floats, buffer of " + std::to_string(desc->total_floats) + ")");
    ranges.emplace_back(t.offset, t.offset + numel);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      bad("tensors overlap in the weight buffer");
}

// --- Loading ------------------------------------------------------------------

lmcc::WeightSet readFile(const std::string &path) {
  try {
    return lmcc::readSafetensors(path);
  } catch (const WeightError &) {
    throw;
  } catch (const std::bad_alloc &) {
    throw;
  } catch (const std::exception &e) {
    throw WeightError(path + ": cannot read: " + e.what());
  }
}

/// Reads, checks and lays out the weights of `path` into `buffer` (desc->total_floats floats).
void loadFile(const lm_model_desc *desc, const std::string &path, float *buffer) {
  lmcc::WeightSet weights = readFile(path);
  const std::string model = quoted(desc->name);

  // Missing tensors, in the descriptor's (canonical) order.
  std::set<std::string> expected;
  int32_t missing = 0;
  const lm_tensor_desc *firstMissing = nullptr;
  for (int32_t i = 0; i < desc->num_tensors; ++i) {
    const lm_tensor_desc &t = desc->tensors[i];
    expected.insert(t.name);
    if (!weights.has(t.name)) {
      ++missing;
      if (!firstMissing)
        firstMissing = &t;
    }
  }
  if (firstMissing)
    throw WeightError(path + ": tensor " + quoted(firstMissing->name) + ": missing (expected shape " +
                      shapeString(descShape(*firstMissing)) + ")" +
                      (missing > 1 ? "; " + std::to_string(missing - 1) + " more missing" : std::string()));

  // Tensors the model does not use.
  for (const auto &entry : weights.tensors)
    if (!expected.count(entry.first))
      throw WeightError(path + ": tensor " + quoted(entry.first) + ": unexpected for model " + model +
                        " (it has no such tensor)");

  // Shapes and values, then copy, in offset order (gaps zeroed); each tensor is released once
  // copied so that the peak memory stays near one copy of the weights.
  std::vector<const lm_tensor_desc *> byOffset;
  for (int32_t i = 0; i < desc->num_tensors; ++i)
    byOffset.push_back(&desc->tensors[i]);
  std::sort(byOffset.begin(), byOffset.end(),
            [](const lm_tensor_desc *a, const lm_tensor_desc *b) { return a->offset < b->offset; });
  for (const lm_tensor_desc *t : byOffset) {
    const lmcc::Tensor &tensor = weights.tensors.at(t->name);
    const std::vector<int64_t> shape = descShape(*t);
    if (tensor.shape != shape)
      throw WeightError(path + ": tensor " + quoted(t->name) + ": wrong shape: expected " + shapeString(shape) +
                        ", got " + shapeString(tensor.shape));
    for (size_t i = 0; i < tensor.data.size(); ++i)
      if (!std::isfinite(tensor.data[i]))
        throw WeightError(path + ": tensor " + quoted(t->name) + ": non-finite value " +
                          valueString(tensor.data[i]) + " at flat index " + std::to_string(i));
  }
  int64_t cursor = 0;
  for (const lm_tensor_desc *t : byOffset) {
    auto it = weights.tensors.find(t->name);
    const std::vector<float> &data = it->second.data;
    if (t->offset > cursor)
      std::memset(buffer + cursor, 0, static_cast<size_t>(t->offset - cursor) * sizeof(float));
    std::memcpy(buffer + t->offset, data.data(), data.size() * sizeof(float));
    cursor = t->offset + static_cast<int64_t>(data.size());
    weights.tensors.erase(it);
  }
  if (desc->total_floats > cursor)
    std::memset(buffer + cursor, 0, static_cast<size_t>(desc->total_floats - cursor) * sizeof(float));
}

void requestAmx() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtileData = 18; // asm/prctl.h, the XTILEDATA state component
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtileData) == 0)
    return;
  const std::string reason = std::strerror(errno);
#else
  const std::string reason = "AMX needs Linux on x86-64";
#endif
  argumentError("the kernels use AMX tiles (bf16 weights compiled for a CPU with AMX-BF16), but this process cannot "
                "have AMX tile state (" + reason + "): run the library on a CPU and kernel with AMX, or compile it "
                "for this CPU");
}

void loadImpl(const lm_model_desc *desc, const char *path, lm_model **out) {
  checkDescriptor(desc);
  if (!out)
    argumentError("out is NULL");
  if (desc->amx)
    requestAmx();
  auto model = std::make_unique<lm_model>();
  model->desc = desc;
  if (!path) {
    if (!desc->embedded_weights)
      argumentError("weights_path is NULL and model " + quoted(desc->name) +
                    " was compiled without embedded weights (lmcc compile --embed-weights)");
    if (!desc->init && reinterpret_cast<uintptr_t>(desc->embedded_weights) % kWeightAlignment == 0) {
      // Read-only use in place: the kernels never write to the weights (no init kernel).
      model->weights = const_cast<float *>(desc->embedded_weights);
    } else {
      auto buffer = allocateFloats(desc->total_floats);
      std::memcpy(buffer.get(), desc->embedded_weights, static_cast<size_t>(desc->total_floats) * sizeof(float));
      model->weights = buffer.get();
      model->owned = buffer.release();
    }
  } else {
    auto buffer = allocateFloats(desc->total_floats);
    loadFile(desc, path, buffer.get());
    model->weights = buffer.get();
    model->owned = buffer.release();
  }
  if (desc->init) { // tensors folded at load time (lm-fold-constants)
    lm_memref1f weights = memref1(model->weights, desc->total_floats);
    runKernel("load", [&] { desc->init(&weights); }, Bound::Unbounded);
  }
  *out = model.release();
}

// --- Threads ------------------------------------------------------------------

std::atomic<int> g_threads{1};

/// One arena per thread count, created on first use and kept for the life of the process
/// (deliberately never destroyed: arenas must not be torn down during static destruction
/// while another library may still use oneTBB).
tbb::task_arena &arenaFor(int threads) {
  thread_local int t_threads = 0;
  thread_local tbb::task_arena *t_arena = nullptr; // this thread's last answer, to skip the lock
  if (t_threads == threads)
    return *t_arena;
  static std::mutex mutex;
  static auto *arenas = new std::map<int, tbb::task_arena *>();
  std::lock_guard<std::mutex> lock(mutex);
  tbb::task_arena *&arena = (*arenas)[threads];
  if (!arena) {
    auto created = std::make_unique<tbb::task_arena>(threads);
    created->initialize();
    arena = created.release();
  }
  t_threads = threads;
  t_arena = arena;
  return *arena;
}

/// The threads a call runs on: lm_set_num_threads, at most what the machine offers (more would only
/// oversubscribe it and make oneTBB warn).
int effectiveThreads() {
  static const int available = std::max(1, tbb::info::default_concurrency());
  return std::min({g_threads.load(std::memory_order_relaxed), kMaxArenaThreads, available});
}

/// A cap on the threads of the kernels' parallel loops (lm_rt_parallel_for) called from this thread, 0: none. A
/// call whose pieces fit the workspace limit only without the other threads' work items (their scratch, the memory
/// model's thread_bytes) runs its pieces on the calling thread under a cap of 1 (KernelThreadCap).
thread_local int t_kernelThreadCap = 0;

class KernelThreadCap {
public:
  explicit KernelThreadCap(int cap) : previous_(t_kernelThreadCap) { t_kernelThreadCap = cap; }
  ~KernelThreadCap() { t_kernelThreadCap = previous_; }
  KernelThreadCap(const KernelThreadCap &) = delete;
  KernelThreadCap &operator=(const KernelThreadCap &) = delete;

private:
  int previous_;
};

/// The threads of a kernel's parallel loop on this thread: the call's, under this thread's cap.
int kernelThreads() {
  const int threads = effectiveThreads();
  return t_kernelThreadCap > 0 ? std::min(threads, t_kernelThreadCap) : threads;
}

/// Calls run(i) for i in [0, count), in parallel when more than one thread is configured. Exceptions thrown
/// by a piece reach the caller.
template <typename F> void forEachPiece(int64_t count, int threads, F &&run) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i)
      run(i);
    return;
  }
  arenaFor(threads).execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, count, 1),
        [&](const tbb::blocked_range<int64_t> &r) {
          // Isolated: while a piece's kernel waits on its own nested parallel loop, this thread runs only
          // that loop's tasks, never another piece (two pieces on one thread would hold twice its share of
          // the workspace limit).
          for (int64_t i = r.begin(); i != r.end(); ++i)
            tbb::this_task_arena::isolate([&] { run(i); });
        },
        tbb::simple_partitioner());
  });
}

// --- Workspace limit and the pieces of a call ------------------------------------

std::atomic<int64_t> g_workspaceLimit{0}; // 0: the default

/// The default workspace limit: a quarter of the memory the machine or the process's cgroup (memory.max of
/// cgroup v2, a container's limit) has, and at most half of what the address-space and data limits (ulimit -v,
/// -d) leave the process when it is first asked (its libraries and weights already mapped): a limited process
/// cuts its calls into pieces that fit rather than runs out of memory inside a kernel (runKernel).
int64_t defaultWorkspaceLimit() {
  static const int64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
    const uint64_t page = size > 0 ? uint64_t(size) : 4096;
    uint64_t machine = pages > 0 ? uint64_t(pages) * page : uint64_t(4) << 30;
    if (std::ifstream cgroup("/sys/fs/cgroup/memory.max"); cgroup) {
      uint64_t max = 0;
      if (cgroup >> max && max > 0) // "max" (no limit) does not parse
        machine = std::min(machine, max);
    }
    uint64_t limit = machine / 4;
    // /proc/self/statm: sizes in pages; the first is the address space, the sixth data + stack.
    uint64_t used[7] = {};
    if (std::ifstream statm("/proc/self/statm"); statm)
      for (uint64_t &u : used)
        statm >> u;
    for (auto [resource, inUse] : {std::pair{RLIMIT_AS, used[0] * page}, std::pair{RLIMIT_DATA, used[5] * page}}) {
      struct rlimit r {};
      if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
        limit = std::min<uint64_t>(limit, uint64_t(r.rlim_cur) > inUse ? (uint64_t(r.rlim_cur) - inUse) / 2 : 1);
    }
    return int64_t(std::min<uint64_t>(std::max<uint64_t>(limit, 1), uint64_t(INT64_MAX)));
  }();
  return bytes;
}

int64_t workspaceLimit() {
  const int64_t set = g_workspaceLimit.load(std::memory_order_relaxed);
  return set > 0 ? set : defaultWorkspaceLimit();
}

/// A piece of a call: sentences [b0, b0 + rows) and, for mask-and-predict scoring of one sentence, the
/// positions [first, last) whose masked copies it computes (all of them by default).
struct Piece {
  int64_t b0, rows;
  int32_t first = 0, last = std::numeric_limits<int32_t>::max();
};

/// A size in the runtime's messages: MB with one decimal, or KB / bytes below what that shows ("0.0 MB").
std::string megabytes(double bytes) {
  char text[48];
  if (bytes >= 0.05 * (1 << 20))
    std::snprintf(text, sizeof text, "%.1f MB", bytes / (1 << 20));
  else if (bytes >= 1024)
    std::snprintf(text, sizeof text, "%.1f KB", bytes / 1024);
  else
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  return text;
}

/// The pieces of a call, the threads that run them side by side (fewer than configured when only one piece at a
/// time fits the workspace limit) and the threads of the kernels' parallel loops (1 when even one piece at a time
/// fits only without the other threads' work items).
/// The pieces live in the calling thread's storage (reused call after call: a call in steady state allocates
/// nothing), valid until its next call.
struct Plan {
  const std::vector<Piece> &pieces;
  int threads, kernelThreads;
};

/// Cuts a call into pieces whose temporaries (the descriptor's memory model: rows * sentence[n] + copies *
/// copy[n]) fit the workspace limit shared by `threads` running pieces at once, less what the work items of
/// `kernelThreads` threads hold beyond one thread's (kernelThreads - 1) * thread[n], n the call's longest sentence:
/// at most kernelThreads items run at once, and each piece's term counts one. Chunks of kMaxChunkRows sentences
/// (kChunkRows when pieces run side by side), each cut in halves while over the limit or over kPieceBytes and
/// longer than kChunkRows; a chunk still over them sentence by sentence; a sentence over the limit (`splitCopies`:
/// mask-and-predict scoring and embedding) in windows of its positions' masked copies. Results do not depend on
/// the cut: every kernel computes each sentence, row and copy on its own (the generated GEMM's rows, attention per
/// sentence or copy). A piece that does not fit even alone is an LM_ERR_MEMORY naming what it needs. Into `pieces`
/// (cleared first).
void planPieces(std::vector<Piece> &pieces, const int32_t *lengths, int32_t batch, const int64_t *sentence,
                const int64_t *copy, const int64_t *thread, bool splitCopies, const char *entry, int64_t threads,
                int64_t kernelThreads) {
  pieces.clear();
  const int64_t limit = workspaceLimit();
  const int32_t longest = batch > 0 ? *std::max_element(lengths, lengths + batch) : 0;
  const double items = thread ? double(kernelThreads - 1) * double(thread[longest]) : 0.0;
  const double budget = (double(limit) - items) / double(threads);
  auto bytes = [&](int64_t rows, int64_t n, int64_t copies) {
    return double(rows) * double(sentence[n]) + (copy ? double(copies) * double(copy[n]) : 0.0);
  };
  // Whether the chunk [b0, b0 + rows) fits: its temporaries at its longest sentence, with its masked copies.
  auto fits = [&](int64_t b0, int64_t rows) {
    int64_t n = 0, copies = 0;
    for (int64_t r = 0; r < rows; ++r)
      n = std::max<int64_t>(n, lengths[b0 + r]), copies += lengths[b0 + r];
    return !sentence || bytes(rows, n, copies) <= std::min(budget, kPieceBytes);
  };
  // A chunk that fits is one piece; one that does not, a sentence at a time, or in windows of masked copies.
  auto place = [&](int64_t b0, int64_t rows, bool fit) {
    if (fit) {
      pieces.push_back({b0, rows});
      return;
    }
    for (int64_t b = b0; b < b0 + rows; ++b) {
      const int32_t len = lengths[b];
      if (bytes(1, len, len) <= budget) {
        pieces.push_back({b, 1});
        continue;
      }
      const double perCopy = copy ? double(copy[len]) : 0;
      const int64_t window = splitCopies && perCopy > 0 ? int64_t((budget - double(sentence[len])) / perCopy) : 0;
      if (window < 1)
        throw Failure{LM_ERR_MEMORY,
                      std::string(entry) + ": sentence " + std::to_string(b) + " (" + std::to_string(len) +
                          " tokens) needs " + megabytes(double(sentence[len]) + perCopy * (splitCopies ? 1 : len)) +
                          (splitCopies && perCopy > 0 ? " for one masked copy" : "") +
                          " of temporaries, over the workspace limit of " + megabytes(budget) +
                          (threads > 1 ? " per thread (" + megabytes(double(limit)) + " for " +
                                             std::to_string(threads) + " threads)"
                                       : std::string()) +
                          "; raise it (lm_set_workspace_limit, lmcc --max-memory)"};
      for (int64_t first = 0; first < len; first += window)
        pieces.push_back({b, 1, int32_t(first), int32_t(std::min<int64_t>(len, first + window))});
    }
  };
  // Pieces run one at a time take chunks of kMaxChunkRows sentences; pieces side by side keep kChunkRows (chunks of
  // 16 at two threads read 0.97-1.03x, and fewer pieces than threads cut mask-and-predict copies into windows: the
  // biLM PLL at batch 32 ran 0.87x in 32-sentence pieces). Each chunk is cut in halves (recursively) while it does
  // not fit and has more than kChunkRows.
  const int64_t chunk = threads > 1 ? kChunkRows : kMaxChunkRows;
  auto cut = [&](auto &self, int64_t b0, int64_t rows) -> void {
    const bool fit = fits(b0, rows);
    if (!fit && rows > kChunkRows)
      self(self, b0, rows / 2), self(self, b0 + rows / 2, rows - rows / 2);
    else
      place(b0, rows, fit);
  };
  for (int64_t b0 = 0; b0 < batch; b0 += chunk)
    cut(cut, b0, std::min<int64_t>(chunk, batch - b0));
}

/// Fewer pieces than threads (a batch of one or two sentences): each sentence's masked copies are cut into as
/// many windows as there are threads, which then run side by side instead of sharing one call's GEMMs (the
/// same numbers: every copy is computed on its own). Each window is no larger than its piece was.
void spreadCopies(std::vector<Piece> &out, const std::vector<Piece> &pieces, const int32_t *lengths, int threads) {
  out.clear();
  for (const Piece &p : pieces)
    for (int64_t b = p.b0; b < p.b0 + p.rows; ++b) {
      const int64_t first = p.first, last = std::min<int64_t>(lengths[b], p.last);
      const int64_t n = last - first, parts = std::min<int64_t>(threads, n);
      for (int64_t k = 0; k < parts; ++k)
        out.push_back({b, 1, int32_t(first + k * n / parts), int32_t(first + (k + 1) * n / parts)});
    }
}

/// The pieces of a call: side by side on every thread; else one at a time, the kernels on every thread; else (the
/// other threads' work items are what does not fit) one at a time with the kernels on the calling thread alone.
/// The last plan's LM_ERR_MEMORY is the call's.
Plan plan(const int32_t *lengths, int32_t batch, const int64_t *sentence, const int64_t *copy, const int64_t *thread,
          bool splitCopies, const char *entry) {
  thread_local std::vector<Piece> t_pieces, t_spread;
  const int threads = effectiveThreads();
  const std::pair<int, int> tries[3] = {{threads, threads}, {1, threads}, {1, 1}}; // (side by side, kernel threads)
  const int count = threads == 1 ? 1 : thread ? 3 : 2;
  for (int i = 0;; ++i) {
    const auto [sideBySide, kernel] = tries[i];
    try {
      planPieces(t_pieces, lengths, batch, sentence, copy, thread, splitCopies, entry, sideBySide, kernel);
      if (splitCopies && sideBySide > 1 && int64_t(t_pieces.size()) < sideBySide) {
        spreadCopies(t_spread, t_pieces, lengths, sideBySide);
        return Plan{t_spread, sideBySide, kernel};
      }
      return Plan{t_pieces, sideBySide, kernel};
    } catch (const Failure &f) {
      if (f.code != LM_ERR_MEMORY || i + 1 == count)
        throw;
    }
  }
}

// --- Per-chunk buffers ----------------------------------------------------------

struct Workspace {
  std::vector<int32_t> ids, lengths, nScored, spans;
  std::vector<float> logprobs, scores, states, lengthLogprobs;
  PairBatch pairs; ///< lm_rt_score_pairs's packed chunk
  /// A mask-and-predict embedding call's sentences cut into windows (spanEmbed): each one's rows, gathered until
  /// its last window is in. Entries are reused call after call (only the first `used` belong to the call).
  struct Gathered {
    int64_t b = -1;        ///< the sentence
    int64_t remaining = 0; ///< windows still to come
    std::vector<float> rows;
  };
  std::vector<Gathered> gathered;
};

/// A per-thread pool of workspaces: a chunk takes one out and puts it back, so the steady
/// state does not allocate, and a nested chunk on the same thread (oneTBB may run another
/// task while a kernel waits on a nested parallel loop) gets a workspace of its own.
thread_local std::vector<std::unique_ptr<Workspace>> t_workspaces;

class WorkspaceLease {
public:
  WorkspaceLease() {
    if (t_workspaces.empty()) {
      ws_ = std::make_unique<Workspace>();
    } else {
      ws_ = std::move(t_workspaces.back());
      t_workspaces.pop_back();
    }
  }
  ~WorkspaceLease() {
    try {
      t_workspaces.push_back(std::move(ws_));
    } catch (...) { // out of memory growing the pool: just drop the workspace
    }
  }
  WorkspaceLease(const WorkspaceLease &) = delete;
  WorkspaceLease &operator=(const WorkspaceLease &) = delete;
  Workspace &operator*() { return *ws_; }
  Workspace *operator->() { return ws_.get(); }

private:
  std::unique_ptr<Workspace> ws_;
};

template <typename T> void grow(std::vector<T> &v, size_t n) {
  if (v.size() < n)
    v.resize(n);
}

// --- Argument validation ----------------------------------------------------------

} // namespace

namespace lmrt::detail {

/// One of 2 MB or more is 2 MB-aligned and advised as huge pages (MADV_HUGEPAGE; a no-op where transparent huge
/// pages are off): scoring a short sentence streams every weight from memory once per call, and with 4 KB pages
/// the 10-token vocabulary projection ran 1.2-1.5x slower (bench/results/2026-11-25-stream.md).
FloatBuffer allocateFloats(int64_t n) {
  constexpr size_t kHugePage = size_t(2) << 20;
  size_t bytes = static_cast<size_t>(n) * sizeof(float);
  const size_t alignment = bytes >= kHugePage ? kHugePage : kWeightAlignment;
  bytes = std::max((bytes + alignment - 1) / alignment * alignment, alignment);
  void *p = std::aligned_alloc(alignment, bytes);
  if (!p)
    throw std::bad_alloc();
  if (alignment == kHugePage)
    ::madvise(p, bytes, MADV_HUGEPAGE); // advice only: without THP the pages stay 4 KB
  return FloatBuffer(static_cast<float *>(p));
}
[[noreturn]] void argument(std::string message) { argumentError(std::move(message)); }
[[noreturn]] void internal(std::string message) { internalError(std::move(message)); }
[[noreturn]] void nonFiniteResult(std::string message) { throw Failure{LM_ERR_NONFINITE, std::move(message)}; }
int guardedCall(lmcc::FunctionRef<void()> body) noexcept { return guarded(body); }
} // namespace lmrt::detail

namespace {

void checkInputs(const lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride) {
  if (!m)
    argumentError("the model is NULL");
  if (!ids)
    argumentError("ids is NULL");
  if (!lengths)
    argumentError("lengths is NULL");
  if (batch < 1)
    argumentError("batch = " + std::to_string(batch) + " must be at least 1");
  if (stride < 1)
    argumentError("stride = " + std::to_string(stride) + " must be at least 1");
  const lm_model_desc *d = m->desc;
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t len = lengths[b];
    if (len < 1 || len > d->max_len)
      argumentError("lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside [1, max_len=" +
                    std::to_string(d->max_len) + "]");
    if (len > stride)
      argumentError("lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " is larger than stride = " +
                    std::to_string(stride));
  }
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t *row = ids + static_cast<int64_t>(b) * stride;
    for (int32_t i = 0; i < lengths[b]; ++i)
      if (row[i] < 0 || row[i] >= d->vocab)
        argumentError("ids[" + std::to_string(b) + "*stride+" + std::to_string(i) + "] = " + std::to_string(row[i]) +
                      " is outside the vocabulary [0, " + std::to_string(d->vocab) + ")");
  }
}

} // namespace

namespace lmrt::detail {
void checkModelInputs(const lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride) {
  checkInputs(m, ids, lengths, batch, stride);
}

void checkPairInputs(const lm_model *m, const int32_t *src, const int32_t *srcLengths, int32_t srcStride,
                     const int32_t *tgt, const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs,
                     const uint32_t *hidden, int32_t batch) {
  if (!m)
    argumentError("the model is NULL");
  const lm_model_desc *d = m->desc;
  if (!d->pair_score)
    argumentError("model " + quoted(d->name) + " does not score source/target pairs (only family \"diformer\" does)");
  for (auto [what, p] : {std::pair<const char *, const void *>{"src", src}, {"src_lengths", srcLengths},
                         {"tgt", tgt}, {"tgt_lengths", tgtLengths}, {"dirs", dirs}})
    if (!p)
      argumentError(std::string(what) + " is NULL");
  if (batch < 1)
    argumentError("batch = " + std::to_string(batch) + " must be at least 1");
  if (srcStride < 1 || tgtStride < 1)
    argumentError("src_stride = " + std::to_string(srcStride) + " and tgt_stride = " + std::to_string(tgtStride) +
                  " must be at least 1");
  const int64_t W = LM_HIDDEN_WORDS(d->max_len);
  auto where = [](const char *what, int32_t b, int64_t i) {
    return std::string(what) + "[" + std::to_string(b) + "*stride+" + std::to_string(i) + "]";
  };
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t m0 = srcLengths[b], n = tgtLengths[b];
    if (m0 < 1 || m0 > d->max_len || m0 > srcStride)
      argumentError("src_lengths[" + std::to_string(b) + "] = " + std::to_string(m0) + " is outside [1, min(max_len=" +
                    std::to_string(d->max_len) + ", src_stride=" + std::to_string(srcStride) + ")]");
    if (n < 2 || n >= d->max_len || n > tgtStride)
      argumentError("tgt_lengths[" + std::to_string(b) + "] = " + std::to_string(n) + " is outside [2, min(max_len-1=" +
                    std::to_string(d->max_len - 1) + ", tgt_stride=" + std::to_string(tgtStride) +
                    ")] (bos .. eos; the length head predicts n < max_len)");
    for (int32_t i = 0; i < m0; ++i)
      if (src[int64_t(b) * srcStride + i] < 0 || src[int64_t(b) * srcStride + i] >= d->vocab)
        argumentError(where("src", b, i) + " = " + std::to_string(src[int64_t(b) * srcStride + i]) +
                      " is outside the vocabulary [0, " + std::to_string(d->vocab) + ")");
    const int32_t *y = tgt + int64_t(b) * tgtStride;
    for (int32_t i = 0; i < n; ++i)
      if (y[i] < 0 || y[i] >= d->vocab)
        argumentError(where("tgt", b, i) + " = " + std::to_string(y[i]) + " is outside the vocabulary [0, " +
                      std::to_string(d->vocab) + ")");
    if (y[0] != d->bos_id || y[n - 1] != d->eos_id)
      argumentError("target " + std::to_string(b) + " must start with bos (" + std::to_string(d->bos_id) +
                    ") and end with eos (" + std::to_string(d->eos_id) + ")");
    const int32_t *z = dirs + int64_t(b) * tgtStride;
    for (int32_t i = 0; i < n; ++i) {
      if (z[i] < 0 || z[i] > 3)
        argumentError(where("dirs", b, i) + " = " + std::to_string(z[i]) + " is not a direction (0 R, 1 L, 2 S, 3 skip)");
      for (int64_t j = 0; hidden && j < W * 32; ++j) { // every bit of the row's words: none past n - 2 is set
        const uint32_t word = hidden[(int64_t(b) * tgtStride + i) * W + j / 32];
        if (!((word >> (j % 32)) & 1u))
          continue;
        if (z[i] != 2)
          argumentError(where("hidden", b, i) + " hides key " + std::to_string(j) + " from a row that is not S");
        if (j < 1 || j > n - 2)
          argumentError(where("hidden", b, i) + " hides key " + std::to_string(j) + ", outside 1..n-2 = 1.." +
                        std::to_string(n - 2) + " (bos and eos are never hidden)");
      }
    }
    if (z[0] != 0 && z[0] != 3)
      argumentError(where("dirs", b, 0) + " = " + std::to_string(z[0]) + ": row 0 must be R (0) or skip (3)");
    if (z[n - 1] != 1 && z[n - 1] != 3)
      argumentError(where("dirs", b, n - 1) + " = " + std::to_string(z[n - 1]) + ": row n-1 must be L (1) or skip (3)");
  }
}

void packPairs(PairBatch &p, const lm_model_desc *d, const int32_t *src, const int32_t *srcLengths, int32_t srcStride,
               const int32_t *tgt, const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs,
               const uint32_t *hidden, int64_t b0, int64_t rows) {
  const int64_t W = LM_HIDDEN_WORDS(d->max_len);
  p.rows = rows, p.width = 1 + W, p.ms = 0, p.n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    p.ms = std::max<int64_t>(p.ms, srcLengths[b0 + r]);
    p.n = std::max<int64_t>(p.n, tgtLengths[b0 + r]);
  }
  const size_t R = size_t(rows);
  p.src.assign(R * size_t(p.ms), d->pad_id);
  p.tgt.assign(R * size_t(p.n), d->pad_id);
  p.srcLen.resize(R);
  p.tgtLen.resize(R);
  p.rowData.assign(R * size_t(p.n * p.width), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = b0 + r;
    p.srcLen[size_t(r)] = srcLengths[b];
    p.tgtLen[size_t(r)] = tgtLengths[b];
    std::copy(src + b * srcStride, src + b * srcStride + srcLengths[b], p.src.begin() + r * p.ms);
    std::copy(tgt + b * tgtStride, tgt + b * tgtStride + tgtLengths[b], p.tgt.begin() + r * p.n);
    for (int64_t i = 0; i < p.n; ++i) {
      int32_t *row = p.rowData.data() + (r * p.n + i) * p.width;
      if (i >= tgtLengths[b]) {
        row[0] = 3;
        continue;
      }
      row[0] = dirs[b * tgtStride + i];
      for (int64_t w = 0; hidden && w < W; ++w)
        row[1 + w] = int32_t(hidden[(b * tgtStride + i) * W + w]);
    }
  }
}

} // namespace lmrt::detail

namespace {

/// Packs sentences [b0, b0 + rows) into ws.ids ([rows, n] padded with the pad id) and
/// ws.lengths; returns n, the longest length of the chunk.
int64_t packChunk(const lm_model_desc *d, const int32_t *ids, const int32_t *lengths, int32_t stride, int64_t b0,
                  int64_t rows, Workspace &ws) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    n = std::max<int64_t>(n, lengths[b0 + r]);
  grow(ws.ids, static_cast<size_t>(rows * n));
  grow(ws.lengths, static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t len = lengths[b0 + r];
    const int32_t *src = ids + (b0 + r) * stride;
    int32_t *dst = ws.ids.data() + r * n;
    std::copy(src, src + len, dst);
    std::fill(dst + len, dst + n, d->pad_id);
    ws.lengths[static_cast<size_t>(r)] = len;
  }
  return n;
}

/// spans NULL: i + 1 everywhere; else each in (i, length].
void checkSpans(const int32_t *spans, const int32_t *lengths, int32_t batch, int32_t stride) {
  for (int32_t b = 0; spans && b < batch; ++b)
    for (int32_t i = 0; i < lengths[b]; ++i) {
      const int32_t e = spans[int64_t(b) * stride + i];
      if (e <= i || e > lengths[b])
        argumentError("spans[" + std::to_string(b) + "*stride+" + std::to_string(i) + "] = " + std::to_string(e) +
                      " is outside (" + std::to_string(i) + ", lengths[" + std::to_string(b) +
                      "] = " + std::to_string(lengths[b]) + "]");
    }
}

/// A mask-and-predict piece's spans into ws.spans [rows, n] (ws.ids packed by packChunk): inside the piece's window
/// of positions the caller's `spans` (or i + 1: position i's copy alone), outside it i (no copy).
void pieceSpans(Workspace &ws, const Piece &piece, const int32_t *lengths, int64_t n, const int32_t *spans,
                int32_t stride) {
  grow(ws.spans, static_cast<size_t>(piece.rows * n));
  for (int64_t r = 0; r < piece.rows; ++r)
    for (int32_t i = 0; i < n; ++i) {
      const bool inside = i >= piece.first && i < piece.last && i < lengths[piece.b0 + r];
      ws.spans[size_t(r * n + i)] = !inside ? i : spans ? spans[(piece.b0 + r) * stride + i] : i + 1;
    }
}

/// Scoring (lm_rt_score*); `spanEntry`: called as lm_rt_score_spans, which only mask-and-predict models take
/// (with spans or NULL).
void scoreImpl(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
               const int32_t *spans, float *tokenLogprobs, float *scores, int32_t *nScored, bool spanEntry = false) {
  checkInputs(m, ids, lengths, batch, stride);
  if (!scores)
    argumentError("scores is NULL");
  const lm_model_desc *d = m->desc;
  if (d->pair_score)
    argumentError("model " + quoted(d->name) + " is a Diformer: it scores source/target pairs (lm_rt_score_pairs)");
  if (!d->score && !d->span_score)
    argumentError("model " + quoted(d->name) + " is encoder only ([head] mlm = false): it has no score entry point; "
                  "use embed");
  if ((spans || spanEntry) && !d->span_score)
    argumentError("model " + quoted(d->name) + " does not score by mask-and-predict: spans do not apply");
  checkSpans(spans, lengths, batch, stride);
  const bool withSpans = d->span_score != nullptr;
  const Plan cut =
      plan(lengths, batch, d->score_sentence_bytes, d->score_copy_bytes, d->score_thread_bytes, withSpans, "score");
  const KernelThreadCap cap(cut.kernelThreads);
  const std::vector<Piece> &pieces = cut.pieces;
  // Mask-and-predict pieces may cover part of a sentence's positions: their token log-probabilities are
  // collected here and every score is summed from them afterwards, in the order the kernel's sum uses (in
  // double, position by position), so a sentence scored in windows gets the score of one call.
  std::vector<float> collected;
  float *lp = tokenLogprobs;
  if (withSpans && !lp) {
    collected.resize(size_t(batch) * stride);
    lp = collected.data();
  }
  lm_memref1f weights = memref1(m->weights, d->total_floats);
  forEachPiece(int64_t(pieces.size()), cut.threads, [&](int64_t p) {
    const Piece &piece = pieces[size_t(p)];
    const int64_t b0 = piece.b0, rows = piece.rows;
    WorkspaceLease ws;
    const int64_t n = packChunk(d, ids, lengths, stride, b0, rows, *ws);
    grow(ws->logprobs, static_cast<size_t>(rows * n));
    grow(ws->nScored, static_cast<size_t>(rows));
    grow(ws->scores, static_cast<size_t>(rows));
    lm_memref1f w = weights;
    lm_memref2i idsRef = memref2(ws->ids.data(), rows, n);
    lm_memref1i lengthsRef = memref1(ws->lengths.data(), rows);
    lm_memref2f logprobsRef = memref2(ws->logprobs.data(), rows, n);
    lm_memref1f scoresRef = memref1(ws->scores.data(), rows);
    lm_memref1i nScoredRef = memref1(ws->nScored.data(), rows);
    if (withSpans) {
      pieceSpans(*ws, piece, lengths, n, spans, stride);
      lm_memref2i spansRef = memref2(ws->spans.data(), rows, n);
      runKernel(
          "score", [&] { d->span_score(&w, &idsRef, &lengthsRef, &spansRef, &logprobsRef, &scoresRef, &nScoredRef); },
          Bound::Planned);
    } else {
      runKernel(
          "score", [&] { d->score(&w, &idsRef, &lengthsRef, &logprobsRef, &scoresRef, &nScoredRef); }, Bound::Planned);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t len = lengths[b0 + r];
      const int32_t first = std::max<int32_t>(0, piece.first), last = std::min(len, piece.last);
      if (lp) {
        const float *src = ws->logprobs.data() + r * n;
        std::copy(src + first, src + last, lp + (b0 + r) * stride + first);
      }
      if (!withSpans)
        scores[b0 + r] = ws->scores[size_t(r)];
      if (nScored && first == 0)
        nScored[b0 + r] = ws->nScored[static_cast<size_t>(r)];
    }
  });
  if (withSpans)
    for (int32_t b = 0; b < batch; ++b) {
      double sum = 0; // lm.sentence_score's sum: unscored positions hold 0
      for (int32_t i = 0; i < lengths[b]; ++i)
        sum += double(lp[int64_t(b) * stride + i]);
      scores[b] = float(sum);
    }
  for (int32_t b = 0; b < batch; ++b) {
    bool finite = std::isfinite(scores[b]);
    for (int32_t i = 0; tokenLogprobs && finite && i < lengths[b]; ++i)
      finite = std::isfinite(tokenLogprobs[int64_t(b) * stride + i]);
    if (!finite)
      nonFinite("score", b);
  }
}

/// lm_rt_score_pairs: checked, then scored in chunks of kChunkRows pairs across the threads.
void pairsImpl(lm_model *m, const int32_t *src, const int32_t *srcLengths, int32_t srcStride, const int32_t *tgt,
               const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs, const uint32_t *hidden,
               int32_t batch, float *tokenLogprobs, float *scores, float *lengthLogprobs) {
  checkPairInputs(m, src, srcLengths, srcStride, tgt, tgtLengths, tgtStride, dirs, hidden, batch);
  if (!scores)
    argumentError("scores is NULL");
  const lm_model_desc *d = m->desc;
  const int threads = effectiveThreads();
  const int64_t pieces = (batch + kChunkRows - 1) / kChunkRows;
  lm_memref1f weights = memref1(m->weights, d->total_floats);
  forEachPiece(pieces, threads, [&](int64_t p) {
    const int64_t b0 = p * kChunkRows, rows = std::min<int64_t>(kChunkRows, batch - b0);
    WorkspaceLease ws;
    PairBatch &pb = ws->pairs;
    packPairs(pb, d, src, srcLengths, srcStride, tgt, tgtLengths, tgtStride, dirs, hidden, b0, rows);
    const int64_t n = pb.n;
    const size_t R = size_t(rows);
    grow(ws->nScored, R);
    grow(ws->logprobs, R * size_t(n));
    grow(ws->scores, R);
    grow(ws->lengthLogprobs, R);
    lm_memref1f w = weights;
    lm_memref2i srcRef = pb.srcRef(), tgtRef = pb.tgtRef();
    lm_memref1i srcLenRef = pb.srcLenRef(), tgtLenRef = pb.tgtLenRef();
    lm_memref3i rowsRef = pb.rowsRef();
    lm_memref2f lpRef = memref2(ws->logprobs.data(), rows, n);
    lm_memref1f scRef = memref1(ws->scores.data(), rows), lenRef = memref1(ws->lengthLogprobs.data(), rows);
    lm_memref1i nRef = memref1(ws->nScored.data(), rows);
    runKernel(
        "score_pairs",
        [&] { d->pair_score(&w, &srcRef, &srcLenRef, &tgtRef, &tgtLenRef, &rowsRef, &lpRef, &scRef, &nRef, &lenRef); },
        Bound::Planned);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = b0 + r;
      if (tokenLogprobs)
        std::copy(ws->logprobs.begin() + r * n, ws->logprobs.begin() + r * n + tgtLengths[b],
                  tokenLogprobs + b * tgtStride);
      scores[b] = ws->scores[size_t(r)];
      if (lengthLogprobs)
        lengthLogprobs[b] = ws->lengthLogprobs[size_t(r)];
    }
  });
  for (int32_t b = 0; b < batch; ++b) {
    bool finite = std::isfinite(scores[b]) && (!lengthLogprobs || std::isfinite(lengthLogprobs[b]));
    for (int32_t i = 0; tokenLogprobs && finite && i < tgtLengths[b]; ++i)
      finite = std::isfinite(tokenLogprobs[int64_t(b) * tgtStride + i]);
    if (!finite)
      nonFinite("score_pairs", b);
  }
}

/// out[0..D) = the pooled states rows[0..len) (row stride D) of a sentence with ids `ids`, as lm.mean_pool
/// computes it (codegen/LmToLoops/Logprob.cpp): row 0 (cls), or per feature the sum over the rows used in row
/// order in double, divided by their count (mean: the rows whose id is not excluded, every row when none is
/// left; mean_all: every row); then, normalized, x / max(||x||_2, 1e-12) in double.
void poolStates(const lm_model_desc *d, const float *rows, const int32_t *ids, int32_t len, float *out) {
  const int64_t D = d->d_model;
  if (d->embed_pool == 2) {
    std::copy(rows, rows + D, out);
  } else {
    auto excluded = [&](int32_t id) {
      return d->embed_pool == 0 &&
             std::find(d->embed_exclude, d->embed_exclude + d->num_embed_exclude, id) !=
                 d->embed_exclude + d->num_embed_exclude;
    };
    int32_t kept = 0;
    for (int32_t t = 0; t < len; ++t)
      kept += !excluded(ids[t]);
    const bool all = kept == 0;
    const double count = all ? double(len) : double(kept);
    thread_local std::vector<double> sum; // reused: a steady-state call allocates nothing
    sum.assign(size_t(D), 0.0);
    for (int32_t t = 0; t < len; ++t)
      if (all || !excluded(ids[t]))
        for (int64_t c = 0; c < D; ++c)
          sum[size_t(c)] += double(rows[t * D + c]);
    for (int64_t c = 0; c < D; ++c)
      out[c] = float(sum[size_t(c)] / count);
  }
  if (d->embed_normalize) {
    double sq = 0;
    for (int64_t c = 0; c < D; ++c)
      sq += double(out[c]) * double(out[c]);
    const double norm = std::max(std::sqrt(sq), 1e-12);
    for (int64_t c = 0; c < D; ++c)
      out[c] = float(double(out[c]) / norm);
  }
}

/// lm_rt_embed of a mask-and-predict model (span_embed): the kernel computes each position's state from its masked
/// copy, in pieces of sentences and, for a sentence whose copies do not fit the workspace limit together, in windows
/// of its copies (as scoreImpl); a sentence's rows are pooled here once all of them are in. The same numbers
/// whatever the cut: each copy is computed on its own, and the pooling reads the rows in order.
void spanEmbed(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t stride, const Plan &cut,
               float *out) {
  const lm_model_desc *d = m->desc;
  const int64_t D = d->d_model;
  const std::vector<Piece> &pieces = cut.pieces;
  // A sentence cut into windows: its rows are gathered in a buffer of its own until the last window is in (the
  // entries are made here, in sentence order as the plan's windows come; the pieces only change their contents,
  // under the mutex). The buffers are the call's workspace's, reused: a steady-state call allocates nothing.
  WorkspaceLease call;
  std::vector<Workspace::Gathered> &gathered = call->gathered;
  size_t used = 0;
  for (const Piece &p : pieces)
    if (p.rows == 1 && (p.first > 0 || p.last < lengths[p.b0])) {
      if (used == 0 || gathered[used - 1].b != p.b0) {
        if (used == gathered.size())
          gathered.emplace_back();
        gathered[used].b = p.b0, gathered[used].remaining = 0;
        ++used;
      }
      ++gathered[used - 1].remaining;
    }
  auto windowed = [&](int64_t b) -> Workspace::Gathered * {
    auto it = std::lower_bound(gathered.begin(), gathered.begin() + std::ptrdiff_t(used), b,
                               [](const Workspace::Gathered &g, int64_t key) { return g.b < key; });
    return it != gathered.begin() + std::ptrdiff_t(used) && it->b == b ? &*it : nullptr;
  };
  std::mutex mutex;
  lm_memref1f weights = memref1(m->weights, d->total_floats);
  forEachPiece(int64_t(pieces.size()), cut.threads, [&](int64_t p) {
    const Piece &piece = pieces[size_t(p)];
    const int64_t b0 = piece.b0, rows = piece.rows;
    WorkspaceLease ws;
    const int64_t n = packChunk(d, ids, lengths, stride, b0, rows, *ws);
    grow(ws->states, static_cast<size_t>(rows * n * D));
    pieceSpans(*ws, piece, lengths, n, nullptr, stride);
    lm_memref1f w = weights;
    lm_memref2i idsRef = memref2(ws->ids.data(), rows, n);
    lm_memref1i lengthsRef = memref1(ws->lengths.data(), rows);
    lm_memref2i spansRef = memref2(ws->spans.data(), rows, n);
    lm_memref3f statesRef = memref3(ws->states.data(), rows, n, D);
    runKernel("embed", [&] { d->span_embed(&w, &idsRef, &lengthsRef, &spansRef, &statesRef); }, Bound::Planned);
    Workspace::Gathered *g = rows > 1 ? nullptr : windowed(b0);
    if (!g) { // whole sentences
      for (int64_t r = 0; r < rows; ++r)
        poolStates(d, ws->states.data() + r * n * D, ids + (b0 + r) * stride, lengths[b0 + r], out + (b0 + r) * D);
      return;
    }
    const int32_t len = lengths[b0], first = std::max<int32_t>(0, piece.first), last = std::min(len, piece.last);
    {
      std::lock_guard<std::mutex> lock(mutex);
      grow(g->rows, size_t(len) * D);
      std::copy(ws->states.data() + first * D, ws->states.data() + last * D, g->rows.data() + first * D);
      if (--g->remaining > 0)
        return;
    }
    // The last window is in: no other piece touches this sentence's rows now.
    poolStates(d, g->rows.data(), ids + b0 * stride, len, out + b0 * D);
  });
}

void embedImpl(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *out) {
  checkInputs(m, ids, lengths, batch, stride);
  if (!out)
    argumentError("out is NULL");
  const lm_model_desc *d = m->desc;
  if (!d->embed && !d->span_embed && d->pair_score)
    argumentError("model " + quoted(d->name) + " is a Diformer: it has no embed entry point (lm_rt_score_pairs)");
  if (d->span_embed) {
    const Plan cut = plan(lengths, batch, d->embed_sentence_bytes, d->embed_copy_bytes, d->embed_thread_bytes,
                          /*splitCopies=*/true, "embed");
    const KernelThreadCap cap(cut.kernelThreads);
    spanEmbed(m, ids, lengths, stride, cut, out);
    for (int64_t i = 0; i < int64_t(batch) * d->d_model; ++i)
      if (!std::isfinite(out[i]))
        nonFinite("embed", int32_t(i / d->d_model));
    return;
  }
  if (!d->embed)
    internalError("model " + quoted(d->name) + " has no embed kernel");
  const Plan cut = plan(lengths, batch, d->embed_sentence_bytes, d->embed_copy_bytes, d->embed_thread_bytes,
                        /*splitCopies=*/false, "embed");
  const KernelThreadCap cap(cut.kernelThreads);
  const std::vector<Piece> &pieces = cut.pieces;
  lm_memref1f weights = memref1(m->weights, d->total_floats);
  forEachPiece(int64_t(pieces.size()), cut.threads, [&](int64_t p) {
    const int64_t b0 = pieces[size_t(p)].b0, rows = pieces[size_t(p)].rows;
    WorkspaceLease ws;
    const int64_t n = packChunk(d, ids, lengths, stride, b0, rows, *ws);
    lm_memref1f w = weights;
    lm_memref2i idsRef = memref2(ws->ids.data(), rows, n);
    lm_memref1i lengthsRef = memref1(ws->lengths.data(), rows);
    lm_memref2f outRef = memref2(out + b0 * d->d_model, rows, d->d_model); // dense rows of the caller's buffer
    runKernel("embed", [&] { d->embed(&w, &idsRef, &lengthsRef, &outRef); }, Bound::Planned);
  });
  for (int64_t i = 0; i < int64_t(batch) * d->d_model; ++i)
    if (!std::isfinite(out[i]))
      nonFinite("embed", int32_t(i / d->d_model));
}

} // namespace

// --- The C ABI ----------------------------------------------------------------------

extern "C" {

int lm_rt_check_abi(int version) {
  if (version == LM_ABI_VERSION)
    return LM_OK;
  char message[320];
  std::snprintf(message, sizeof message,
                "this model library was generated for runtime ABI %d, but the liblmrt.so loaded in this process "
                "implements ABI %d (a process loads one liblmrt.so: libraries compiled by different lmcc versions "
                "cannot be used together; recompile them with one lmcc)",
                version, LM_ABI_VERSION);
  return fail(LM_ERR_ARGUMENT, message);
}

int lm_rt_load(const lm_model_desc *desc, const char *weights_path, lm_model **out) {
  return guarded([&] { loadImpl(desc, weights_path, out); });
}

int lm_rt_request_amx(void) { return guarded([] { requestAmx(); }); }

int lm_rt_score(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                float *token_logprobs, float *scores) {
  return guarded([&] { scoreImpl(m, ids, lengths, batch, stride, nullptr, token_logprobs, scores, nullptr); });
}

int lm_rt_score_ex(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                   float *token_logprobs, float *scores, int32_t *n_scored) {
  return guarded([&] { scoreImpl(m, ids, lengths, batch, stride, nullptr, token_logprobs, scores, n_scored); });
}

int lm_rt_score_spans(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                      const int32_t *spans, float *token_logprobs, float *scores, int32_t *n_scored) {
  return guarded([&] { scoreImpl(m, ids, lengths, batch, stride, spans, token_logprobs, scores, n_scored, true); });
}

int lm_rt_score_pairs(lm_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                      const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                      const uint32_t *hidden, int32_t batch, float *token_logprobs, float *scores,
                      float *length_logprobs) {
  return guarded([&] {
    pairsImpl(m, src, src_lengths, src_stride, tgt, tgt_lengths, tgt_stride, dirs, hidden, batch, token_logprobs,
              scores, length_logprobs);
  });
}

int lm_rt_embed(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *out) {
  return guarded([&] { embedImpl(m, ids, lengths, batch, stride, out); });
}

void lm_rt_free(lm_model *m) {
  if (!m)
    return;
  std::free(m->owned);
  delete m;
}

struct lm_tokenizer {
  lmcc::Tokenizer tokenizer;
};

int lm_tokenizer_load(const char *vocab_path, int lowercase, lm_tokenizer **out) {
  return lm_rt_tokenizer_load(vocab_path, lowercase, out);
}
int lm_tokenize(const lm_tokenizer *tok, const char *utf8, size_t len, int32_t *ids, size_t capacity, size_t *n) {
  return lm_rt_tokenize(tok, utf8, len, ids, capacity, n);
}
const char *lm_token_piece(const lm_tokenizer *tok, int32_t id) { return lm_rt_token_piece(tok, id); }
int32_t lm_tokenizer_vocab_size(const lm_tokenizer *tok) { return lm_rt_tokenizer_vocab_size(tok); }
void lm_tokenizer_free(lm_tokenizer *tok) { lm_rt_tokenizer_free(tok); }

int lm_rt_tokenizer_load(const char *vocab_path, int lowercase, lm_tokenizer **out) {
  return guarded([&] {
    if (!out)
      argumentError("lm_tokenizer_load: out is NULL");
    *out = nullptr;
    if (!vocab_path)
      argumentError("lm_tokenizer_load: vocab_path is NULL");
    try {
      const std::string text = lmcc::Tokenizer::readVocabulary(vocab_path); // bounded: /dev/zero is an error
      lmcc::SpecialIds specials = lmcc::Tokenizer::conventionalSpecials(text, vocab_path);
      *out = new lm_tokenizer{lmcc::Tokenizer::fromText(text, vocab_path, lowercase != 0, specials)};
    } catch (const lmcc::TokenizerError &e) {
      argumentError(e.what());
    }
  });
}

int lm_rt_tokenize(const lm_tokenizer *tok, const char *utf8, size_t len, int32_t *ids, size_t capacity,
                   size_t *n) {
  return guarded([&] {
    if (!tok || !n || (!utf8 && len) || (!ids && capacity))
      argumentError("lm_tokenize: NULL tokenizer, text, ids or n");
    if (len > (size_t(1) << 31)) // no sentence is 2 GiB; (size_t)-1 (a strlen mistake) read past the text
      argumentError("lm_tokenize: len " + std::to_string(len) + " is over 2 GiB: not the length of a sentence");
    std::vector<int32_t> out;
    try {
      out = tok->tokenizer.encodeSentence(std::string_view(utf8 ? utf8 : "", len), "lm_tokenize");
    } catch (const lmcc::TokenizerError &e) {
      argumentError(e.what());
    }
    *n = out.size();
    if (out.size() > capacity)
      argumentError("lm_tokenize: " + std::to_string(out.size()) + " ids do not fit in capacity " +
                    std::to_string(capacity));
    std::copy(out.begin(), out.end(), ids);
  });
}

const char *lm_rt_token_piece(const lm_tokenizer *tok, int32_t id) {
  if (!tok || id < 0 || id >= tok->tokenizer.size())
    return nullptr;
  return tok->tokenizer.piece(id).c_str();
}

int32_t lm_rt_tokenizer_vocab_size(const lm_tokenizer *tok) { return tok ? tok->tokenizer.size() : 0; }

void lm_rt_tokenizer_free(lm_tokenizer *tok) { delete tok; }

const char *lm_last_error(void) { return t_errorText; }
const char *lm_rt_last_error(void) { return t_errorText; }

int lm_set_num_threads(int n) { return lm_rt_set_num_threads(n) < 0 ? LM_ERR_ARGUMENT : LM_OK; }

int64_t lm_set_workspace_limit(int64_t bytes) { return lm_rt_set_workspace_limit(bytes); }

int64_t lm_rt_set_workspace_limit(int64_t bytes) {
  if (bytes < 0) {
    guarded([&] { argumentError("lm_set_workspace_limit: bytes = " + std::to_string(bytes) + " must be >= 0"); });
    return -1;
  }
  const int64_t previous = g_workspaceLimit.exchange(bytes);
  return previous > 0 ? previous : defaultWorkspaceLimit();
}

int lm_rt_set_num_threads(int n) {
  if (n < 1) {
    guarded([&] { argumentError("lm_set_num_threads: n = " + std::to_string(n) + " must be at least 1"); });
    return -1;
  }
  return g_threads.exchange(n);
}

void lm_rt_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    const float *bias, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return;
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<Matrix, Eigen::Unaligned, Stride> C(c, m, n, Stride(ldc));
  if (k <= 0) {
    C.setZero();
  } else {
    Eigen::Map<const Matrix, Eigen::Unaligned, Stride> A(a, m, k, Stride(lda));
    Eigen::Map<const Matrix, Eigen::Unaligned, Stride> B(b, n, k, Stride(ldb));
    C.noalias() = A * B.transpose();
  }
  if (bias)
    C.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias, n);
}


} // extern "C"

namespace {

/// Bytes of kernel temporaries in use by every thread (as the kernels asked for them, not the capacity of the
/// blocks that hold them), and their peak (lm_rt_workspace_peak_bytes): what the memory model bounds.
std::atomic<uint64_t> g_liveBytes{0}, g_peakBytes{0};

struct KernelGuard;

/// The header in front of every kernel temporary (64 bytes).
struct BlockHeader {
  uint64_t capacity, mapped;       ///< mapped: the mapping's length (0: from aligned_alloc)
  uint64_t requested;              ///< the size the kernel asked for, while the block is in use
  KernelGuard *guard;              ///< the kernel call it was allocated in (runKernel), while in use; else null
  BlockHeader *prev, *next;        ///< that call's blocks in use
};

/// One call of a generated entry point (runKernel): where a temporary the system cannot give unwinds to, and
/// the temporaries the call holds (linked through their headers by whichever thread allocated them), which the
/// unwinding frees. The generated code has no cleanups of its own (its buffers are these temporaries), so a
/// longjmp over its frames loses nothing else.
struct KernelGuard {
  /// A spin lock (one atomic exchange a side): every temporary of a call takes it twice, and a std::mutex cost a
  /// 25 us call of a small model 1 us; the call's tasks contend only when they allocate at the same instant.
  struct SpinLock {
    std::atomic_flag held = ATOMIC_FLAG_INIT;
    void lock() {
      while (held.test_and_set(std::memory_order_acquire)) {
      }
    }
    void unlock() { held.clear(std::memory_order_release); }
  };
  std::jmp_buf landing;
  const char *entry = nullptr;
  SpinLock mutex;                 ///< guards `blocks` and `held` (the call's tasks allocate on every thread)
  BlockHeader *blocks = nullptr;  ///< the temporaries in use
  uint64_t held = 0;              ///< their requested bytes
  uint64_t limit = 0;             ///< Bound::Held: the workspace limit `held` stays under; else 0 (none)
  std::atomic<bool> failed{false};
  bool overLimit = false;         ///< the failure was the limit's, not the system's
  uint64_t failedBytes = 0, liveAtFailure = 0;

  /// Whether `bytes` more of temporaries keep a held call under its limit (two of its tasks asking at once may
  /// both be told yes: the limit is about, not exact).
  bool fits(uint64_t bytes) {
    if (!limit)
      return true;
    std::lock_guard<SpinLock> lock(mutex);
    return held + bytes <= limit;
  }
  void link(BlockHeader *h) {
    std::lock_guard<SpinLock> lock(mutex);
    held += h->requested;
    h->guard = this, h->prev = nullptr, h->next = blocks;
    if (blocks)
      blocks->prev = h;
    blocks = h;
  }
  void unlink(BlockHeader *h) {
    std::lock_guard<SpinLock> lock(mutex);
    (h->prev ? h->prev->next : blocks) = h->next;
    if (h->next)
      h->next->prev = h->prev;
    h->guard = nullptr;
    held -= h->requested;
  }
};

/// The kernel call this thread computes for (its own runKernel, or the call whose tasks it runs), and the task
/// it runs (lm_rt_parallel_for): an allocation failure unwinds to the task, else to the call.
thread_local KernelGuard *t_kernel = nullptr;
thread_local std::jmp_buf *t_task = nullptr;

/// A thread's cache of freed kernel temporaries. Every block has a 64-byte header in front that records its
/// capacity and how it was allocated, so free needs no lookup. Blocks of 1 MB or more are mapped pages of their
/// own (munmap gives them back to the system at once, where malloc's heap could keep them resident). A request
/// takes the smallest cached block that holds it and is at most twice its size (a window of masked copies
/// shorter than the others reuses their blocks: its pages are already there). The blocks a thread holds, in use
/// or cached, stay under its share of the workspace limit when they can: a request that would pass it first
/// hands back the largest cached blocks, only as many as it must (dropping the whole cache there made a
/// 16-sentence biLM PLL call at n = 128 on two threads map 36 GB of fresh pages, 9 million page faults).
struct WorkspaceCache {
  using Header = BlockHeader;
  static constexpr uint64_t kHeader = 64, kMapFrom = uint64_t(1) << 20, kMaxRequest = uint64_t(1) << 62;
  static_assert(sizeof(Header) <= kHeader);
  static uint64_t share() { return uint64_t(workspaceLimit() / effectiveThreads()); }
  /// Cached blocks by capacity (equal ones in the order they were freed): a sorted vector, not a multimap, so
  /// that putting a block back allocates nothing once the vector has grown to the steady state's count.
  std::vector<std::pair<uint64_t, char *>> blocks;
  uint64_t cachedBytes = 0, liveBytes = 0, systemAllocations = 0;

  /// A block of `size` bytes, or null: the system has none (or the request is not one a kernel makes), or
  /// (`overLimit` set) it would take the held call this thread computes for past its limit.
  void *get(uint64_t alignment, uint64_t size, bool &overLimit) {
    overLimit = false;
    alignment = std::max<uint64_t>(alignment, 16);
    if (alignment > kHeader || (alignment & (alignment - 1)))
      return nullptr; // kernels only ask for small powers of two (every block is 64-byte aligned)
    if (size > kMaxRequest)
      return nullptr; // no system has it, and the header's rounding below would wrap around
    if (KernelGuard *g = t_kernel; g && !g->fits(size)) { // past a held call's limit: no block taken
      overLimit = true;
      return nullptr;
    }
    char *block;
    auto fit = std::lower_bound(blocks.begin(), blocks.end(), size,
                                [](const std::pair<uint64_t, char *> &b, uint64_t s) { return b.first < s; });
    // (The smallest capacity, kHeader, holds any smaller request: a block for 4 bytes is a 64-byte one.)
    if (fit != blocks.end() && (fit->first / 2 <= size || fit->first <= kHeader)) {
      block = fit->second;
      cachedBytes -= fit->first;
      blocks.erase(fit);
    } else {
      const uint64_t total = ((kHeader + size + kHeader - 1) / kHeader) * kHeader;
      // A new block while others sit idle: hand back the largest ones rather than grow past the limit.
      while (!blocks.empty() && liveBytes + cachedBytes + total > share()) {
        cachedBytes -= blocks.back().first;
        drop(blocks.back().second);
        blocks.pop_back();
      }
      uint64_t mapped = 0;
      if (total >= kMapFrom) {
        block = map(total);
        if (!block)
          return nullptr;
        mapped = total;
      } else {
        block = static_cast<char *>(std::aligned_alloc(kHeader, total));
        if (!block)
          return nullptr;
      }
      ++systemAllocations;
      *reinterpret_cast<Header *>(block) = {total - kHeader, mapped, 0, nullptr, nullptr, nullptr};
    }
    Header *header = reinterpret_cast<Header *>(block);
    header->requested = size;
    header->guard = nullptr;
    if (KernelGuard *g = t_kernel)
      g->link(header);
    liveBytes += header->capacity;
    const uint64_t live = g_liveBytes.fetch_add(size, std::memory_order_relaxed) + size;
    uint64_t peak = g_peakBytes.load(std::memory_order_relaxed);
    while (live > peak && !g_peakBytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return block + kHeader;
  }

  void put(void *ptr) {
    if (!ptr)
      return;
    char *block = static_cast<char *>(ptr) - kHeader;
    Header *header = reinterpret_cast<Header *>(block);
    if (header->guard)
      header->guard->unlink(header);
    const uint64_t capacity = header->capacity;
    liveBytes -= std::min(liveBytes, capacity); // a block may be freed by another thread than its allocator
    g_liveBytes.fetch_sub(header->requested, std::memory_order_relaxed);
    if (liveBytes + cachedBytes + capacity > share()) {
      drop(block);
      return;
    }
    cachedBytes += capacity;
    auto at = std::upper_bound(blocks.begin(), blocks.end(), capacity,
                               [](uint64_t c, const std::pair<uint64_t, char *> &b) { return c < b.first; });
    blocks.insert(at, {capacity, block});
  }

  /// Fresh pages for a block of `bytes`; from 2 MB on 2 MB-aligned and advised as huge pages (MADV_HUGEPAGE, a
  /// no-op where transparent huge pages are off), as the weights are: a batch's activations stream from memory
  /// through kernels that visit each row in pieces (the attention's heads), and on 4 KB pages the batch-32
  /// attention ran 5-10% slower (bench/results/2026-11-27-attention-stream.md).
  static char *map(uint64_t bytes) {
    constexpr uint64_t kHugePage = uint64_t(2) << 20, kPage = 4096;
    const uint64_t span = bytes >= kHugePage ? bytes + kHugePage : bytes;
    void *p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return nullptr;
    char *start = static_cast<char *>(p);
    if (span == bytes)
      return start;
    char *aligned = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(start) + kHugePage - 1) & ~(kHugePage - 1));
    char *end = aligned + (bytes + kPage - 1) / kPage * kPage;
    if (aligned > start)
      ::munmap(start, aligned - start);
    if (start + span > end)
      ::munmap(end, start + span - end);
    ::madvise(aligned, bytes, MADV_HUGEPAGE);
    return aligned;
  }

  static void drop(char *block) {
    const uint64_t mapped = reinterpret_cast<Header *>(block)->mapped;
    if (mapped)
      ::munmap(block, mapped);
    else
      std::free(block);
  }

  /// Gives every cached block back to the system; returns their bytes.
  uint64_t release() {
    const uint64_t bytes = cachedBytes;
    for (auto &entry : blocks)
      drop(entry.second);
    blocks.clear();
    cachedBytes = 0;
    return bytes;
  }

  ~WorkspaceCache() { release(); }
};

WorkspaceCache &workspaceCache() {
  thread_local WorkspaceCache cache;
  return cache;
}

/// Out of the task or kernel call this thread computes for (t_task, else t_kernel's landing); called with one.
[[noreturn]] void unwindKernel() {
  if (t_task)
    std::longjmp(*t_task, 1);
  std::longjmp(t_kernel->landing, 1);
}

/// A kernel temporary of `size` bytes: from the thread's cache or the system. When the system has none, the
/// call it is for fails (runKernel: LM_ERR_MEMORY); outside one (a kernel called directly, as the tests and
/// benchmarks do) the process stops with the reason rather than let the kernel write through a null pointer.
void *allocateTemporary(uint64_t alignment, uint64_t size) {
  bool overLimit;
  if (void *p = workspaceCache().get(alignment, size, overLimit))
    return p;
  KernelGuard *g = t_kernel;
  if (!g) {
    std::fprintf(stderr, "lmcc runtime: out of memory: a kernel temporary of %llu bytes could not be allocated\n",
                 static_cast<unsigned long long>(size));
    std::abort();
  }
  {
    std::lock_guard<KernelGuard::SpinLock> lock(g->mutex);
    if (!g->failed.load()) {
      g->failedBytes = size;
      g->liveAtFailure = overLimit ? g->held : g_liveBytes.load(std::memory_order_relaxed);
      g->overLimit = overLimit;
    }
  }
  g->failed.store(true);
  unwindKernel();
}

/// Task [begin, end) of a kernel call's parallel loop on this thread, under the call's guard `g` (or none):
/// an allocation failure in it ends the task (and marks the call failed: later tasks do not start).
void runTask(KernelGuard *g, lm_task_fn fn, void *ctx, int64_t begin, int64_t end) {
  if (!g) {
    fn(ctx, begin, end);
    return;
  }
  if (g->failed.load(std::memory_order_relaxed))
    return;
  struct Restore { // the thread's call and task as they were, also when fn throws
    KernelGuard *const kernel;
    std::jmp_buf *const task;
    ~Restore() { t_kernel = kernel, t_task = task; }
  } const restore{t_kernel, t_task};
  std::jmp_buf landing;
  t_kernel = g;
  t_task = &landing;
  if (setjmp(landing) == 0)
    fn(ctx, begin, end);
}

} // namespace

namespace lmrt::detail {
void *tryAllocateTemporary(uint64_t alignment, uint64_t size) {
  bool overLimit;
  return workspaceCache().get(alignment, size, overLimit);
}

void runKernel(const char *entry, lmcc::FunctionRef<void()> kernel, Bound bound) {
  if (t_kernel) { // inside another call's guard (its tasks): that one's
    kernel();
    return;
  }
  thread_local KernelGuard guard;
  guard.entry = entry;
  guard.failed.store(false);
  guard.overLimit = false;
  guard.failedBytes = guard.liveAtFailure = guard.held = 0;
  guard.limit = bound == Bound::Held ? uint64_t(workspaceLimit()) : 0;
  struct End { // also when the kernel throws: temporaries still in use (none in a generated kernel) leave the call
    KernelGuard &guard;
    ~End() {
      t_kernel = nullptr;
      std::lock_guard<KernelGuard::SpinLock> lock(guard.mutex);
      for (BlockHeader *h = guard.blocks; h; h = h->next)
        h->guard = nullptr;
      guard.blocks = nullptr;
    }
  } const end{guard};
  t_kernel = &guard;
  if (setjmp(guard.landing) != 0) {
    t_kernel = nullptr;
    // Every task has ended (lm_rt_parallel_for unwinds only after its loop): free what the call held.
    while (guard.blocks)
      workspaceCache().put(reinterpret_cast<char *>(guard.blocks) + WorkspaceCache::kHeader);
    if (guard.overLimit)
      throw Failure{LM_ERR_MEMORY, std::string(entry) + ": a kernel temporary of " +
                                       megabytes(double(guard.failedBytes)) + " would take the call's temporaries (" +
                                       megabytes(double(guard.liveAtFailure)) + " in use) past the workspace limit of " +
                                       megabytes(double(guard.limit)) +
                                       "; raise it (lm_set_workspace_limit, lmcc --max-memory) or lower the " +
                                       (std::string_view(entry) == "translate" ? "beam" : "batch")};
    throw Failure{LM_ERR_MEMORY, std::string(entry) + ": out of memory: a kernel temporary of " +
                                     megabytes(double(guard.failedBytes)) + " could not be allocated (" +
                                     megabytes(double(guard.liveAtFailure)) +
                                     " of temporaries in use); free memory, or lower the batch or the workspace "
                                     "limit (lm_set_workspace_limit, lmcc --max-memory)"};
  }
  kernel();
}
} // namespace lmrt::detail

extern "C" {

void *_mlir_memref_to_llvm_alloc(uint64_t size) { return allocateTemporary(16, size); }
void *_mlir_memref_to_llvm_aligned_alloc(uint64_t alignment, uint64_t size) {
  return allocateTemporary(alignment, size);
}
void _mlir_memref_to_llvm_free(void *ptr) { workspaceCache().put(ptr); }
uint64_t lm_rt_workspace_system_allocations(void) { return workspaceCache().systemAllocations; }
uint64_t lm_rt_workspace_release(void) { return workspaceCache().release(); }
uint64_t lm_rt_workspace_peak_bytes(int reset) {
  const uint64_t peak = g_peakBytes.load(std::memory_order_relaxed);
  if (reset)
    g_peakBytes.store(g_liveBytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return peak;
}

} // extern "C"

extern "C" int64_t lm_rt_private_cache_bytes(void) {
  static const int64_t perCore = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? int64_t(l2) : int64_t(1) << 20;
  }();
  return perCore * effectiveThreads();
}

extern "C" void lm_rt_parallel_for(int64_t n, lm_task_fn fn, void *ctx) {
  const int threads = kernelThreads();
  if (threads <= 1 || n <= 1) {
    fn(ctx, 0, n);
    return;
  }
  // Whole pieces only: every panel is computed the same way whatever the split, so results do
  // not depend on the thread count.
  KernelGuard *const g = t_kernel;
  arenaFor(threads).execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(1, n / (4 * threads))),
        [&](const tbb::blocked_range<int64_t> &r) { runTask(g, fn, ctx, r.begin(), r.end()); },
        tbb::simple_partitioner());
  });
  // A task ran out of memory: out of the kernel, now that the loop (and its C++ frames) is done.
  if (g && g->failed.load())
    unwindKernel();
}
