//===- Peak.h - The FP32 FMA peak of this machine, as the benchmarks measure it ---===//
//
// Independent FMA chains that fill the vector registers: 16 chains of 16 floats with AVX-512, 12 of 8 with AVX2
// (16 registers). Every "fraction of the peak" in bench/results/ divides by what these loops reach; kernel_bench
// (machine/peak, and its start-up peak) and train_bench measure with this one definition.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace lmcc::bench {

/// `iterations` steps of 16 FMA chains of 16 floats; returns the FLOPs done.
__attribute__((target("avx512f"), noinline)) inline double fmaLoop512(int64_t iterations) {
  __m512 acc[16];
  for (auto &a : acc)
    a = _mm512_set1_ps(0.5f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 16
    for (auto &a : acc) // fully unrolled, so the accumulators live in registers
      a = _mm512_fmadd_ps(a, x, y);
  __m512 sum = acc[0];
  for (int j = 1; j < 16; ++j)
    sum = _mm512_add_ps(sum, acc[j]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return double(iterations) * 16 * 16 * 2;
}

/// `iterations` steps of 12 FMA chains of 8 floats; returns the FLOPs done.
__attribute__((target("avx2,fma"), noinline)) inline double fmaLoop256(int64_t iterations) {
  __m256 acc[12];
  for (auto &a : acc)
    a = _mm256_set1_ps(0.5f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (auto &a : acc)
      a = _mm256_fmadd_ps(a, x, y);
  __m256 sum = acc[0];
  for (int j = 1; j < 12; ++j)
    sum = _mm256_add_ps(sum, acc[j]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return double(iterations) * 12 * 8 * 2;
}

inline double fmaLoop(bool avx512, int64_t iterations) {
  return avx512 ? fmaLoop512(iterations) : fmaLoop256(iterations);
}

/// GFLOP/s of `threads` threads running 20 million steps of the loop at once, best of `repetitions`.
inline double measurePeak(bool avx512, int threads, int repetitions) {
  volatile int64_t count = 20'000'000; // opaque to the optimizer
  double best = 0;
  for (int rep = 0; rep < repetitions; ++rep) {
    std::vector<double> flops(threads);
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { flops[t] = fmaLoop(avx512, count); });
    for (auto &t : pool)
      t.join();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double total = 0;
    for (double f : flops)
      total += f;
    best = std::max(best, total / seconds / 1e9);
  }
  return best;
}

} // namespace lmcc::bench
