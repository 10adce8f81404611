//===- CoreLatency.h - How far apart two CPUs of this process are, by a cache-line ping-pong ---===//
//
// Two threads, pinned to the first two CPUs the process may run on, pass one cache line back and forth; the
// time of a round trip says where the two CPUs sit: tens of nanoseconds when they share a last-level cache,
// hundreds when the line crosses between L3 domains (another CCX or socket). A virtual machine's two vCPUs can
// move between the two while a benchmark runs (the Zen 4 host of bench/results/2026-12-07-placement.md: 50 ns
// and 320 ns, flipping within seconds), and a two-thread call slows when its threads' data crosses; model_bench
// --ab measures this around every round so the report can say which rounds ran far apart.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace lmcc::bench {

/// Nanoseconds per round trip of a cache line between the first two CPUs of this process's affinity mask, or -1
/// when the process may run on one CPU only. The time depends on the line's address as well (where the coherence
/// directory of that address sits: 60-130 ns for lines of one process on the Zen 4 host), so it is measured on
/// kLines lines, `trips` round trips each after 200 unmeasured ones, and the fastest line's time returned. The
/// calling thread's own affinity is restored before returning. The lines are static: one call at a time.
inline double coreRoundTripNs(int trips = 2500) {
  constexpr int kLines = 8, kWarm = 200;
  // A thread pool's workers spin for a while after a parallel call; they would share the CPUs with the ping-pong.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return -1;
  int cpus[2], found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &allowed))
      cpus[found++] = c;
  if (found < 2)
    return -1;
  cpu_set_t mine;
  if (pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) != 0)
    return -1;
  auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
  };
  // Each alone in its pair of cache lines (the adjacent-line prefetcher moves lines in pairs).
  struct alignas(128) Line {
    std::atomic<int> value{0};
    char pad[128 - sizeof(std::atomic<int>)];
  };
  static Line lines[kLines];
  const int total = kWarm + trips;
  std::atomic<bool> ok{true};
  std::thread other([&ok, pin, cpu = cpus[1], total] {
    ok = pin(cpu);
    for (Line &l : lines)
      for (int i = 0; i < total; ++i) { // answers 2i + 1 with 2i + 2
        while (l.value.load(std::memory_order_acquire) != 2 * i + 1)
          ;
        l.value.store(2 * i + 2, std::memory_order_release);
      }
  });
  const bool pinned = pin(cpus[0]);
  double best = -1;
  for (Line &l : lines) {
    std::chrono::steady_clock::time_point start;
    for (int i = 0; i < total; ++i) {
      if (i == kWarm)
        start = std::chrono::steady_clock::now();
      l.value.store(2 * i + 1, std::memory_order_release);
      while (l.value.load(std::memory_order_acquire) != 2 * i + 2)
        ;
    }
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = best < 0 ? ns / trips : std::min(best, ns / trips);
    l.value.store(0, std::memory_order_relaxed); // the other thread has moved on to the next line
  }
  other.join();
  pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
  return pinned && ok ? best : -1;
}

} // namespace lmcc::bench
