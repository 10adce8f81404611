//===- TempDir.cpp - A temporary directory removed on every exit path ---------===//
#include "driver/TempDir.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

extern char **environ;

namespace lmcc::driver {
namespace {

constexpr int kSlots = 16;
constexpr size_t kPathMax = 4096;
// Paths the signal handler removes; a slot is live while `live[i]` is set (written before/after the path).
char paths[kSlots][kPathMax];
std::atomic<bool> live[kSlots];
std::mutex slotsMutex;
std::once_flag installed;

/// Removes every live TempDir (async-signal-safe: fork + execve of rm -rf).
void removeLiveTempDirs() {
  for (int i = 0; i < kSlots; ++i) {
    if (!live[i].load())
      continue;
    // _Fork, not fork: fork takes malloc's locks (and runs atfork handlers), which deadlocks when the signal
    // interrupted a thread inside malloc; _Fork is async-signal-safe (glibc 2.34).
    const pid_t pid = ::_Fork();
    if (pid == 0) {
      char rm[] = "/bin/rm", rf[] = "-rf", dashes[] = "--";
      char *argv[] = {rm, rf, dashes, paths[i], nullptr};
      ::execve("/bin/rm", argv, environ);
      ::_exit(127);
    }
    if (pid > 0) {
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  }
}

extern "C" void removeTempDirsAndDie(int sig) {
  removeLiveTempDirs();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void installHandlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler != SIG_DFL) // ignored, or handled by the program (lmcc train's checkpointing)
      continue;
    struct sigaction action {};
    action.sa_handler = removeTempDirsAndDie;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

} // namespace

void exitOutOfMemory(const char *message) {
  // One thread says it and exits; another that runs out at the same time waits for that.
  static std::atomic_flag exiting = ATOMIC_FLAG_INIT;
  if (exiting.test_and_set())
    for (;;)
      ::pause();
  const size_t length = std::strlen(message);
  if (::write(STDERR_FILENO, message, length) < 0 || ::write(STDERR_FILENO, "\n", 1) < 0) {
    // nothing more to say
  }
  removeLiveTempDirs();
  ::_exit(5);
}

TempDir::TempDir(std::filesystem::path path) : path_(std::move(path)) {
  std::filesystem::remove_all(path_);
  std::filesystem::create_directory(path_);
  std::call_once(installed, installHandlers);
  const std::string text = std::filesystem::absolute(path_).string();
  if (text.size() >= kPathMax)
    return; // not removed on a signal, still on every other exit path
  std::lock_guard<std::mutex> lock(slotsMutex);
  for (int i = 0; i < kSlots; ++i)
    if (!live[i].load()) {
      std::memcpy(paths[i], text.c_str(), text.size() + 1);
      live[i].store(true);
      slot_ = i;
      break;
    }
}

void TempDir::release() {
  if (slot_ >= 0) {
    std::lock_guard<std::mutex> lock(slotsMutex);
    live[slot_].store(false);
    slot_ = -1;
  }
  path_.clear();
}

TempDir::~TempDir() {
  std::string path = path_.string();
  release();
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
}

} // namespace lmcc::driver
