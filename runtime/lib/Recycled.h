//===- Recycled.h - An allocator whose steady state takes nothing from the system ---===//
//
// Issue 4's runtime rule: a steady-state call allocates nothing. lm_rt_translate's search (DiformerSearch.cpp,
// Translate.cpp) builds and drops many small containers a call: hypotheses, parallel passes, rows of
// log-probabilities, the token keys/values cache. Recycled<T> serves them from a thread-local free list per
// power-of-two size class and puts a freed block back on the list of the thread that frees it: a call takes
// from the system only the blocks that the calls before it on this thread never needed at once (the first
// calls, a longer source, a wider beam). The blocks go back to the system when their thread exits. Meant for
// containers that live and die on one thread, as the search's do within a call: a block freed on another thread
// joins that thread's lists, so a producer thread handing its containers to a consumer would take new blocks
// from the system for every one.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define LMCC_RECYCLED_BYPASS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LMCC_RECYCLED_BYPASS 1
#endif
#endif

namespace lmcc::decode {

namespace detail {

/// The free blocks of one thread: a singly linked list per size class of 2^k bytes.
class BlockPool {
public:
  static BlockPool &local() {
    thread_local BlockPool pool;
    return pool;
  }
  void *take(std::size_t bytes) {
#ifdef LMCC_RECYCLED_BYPASS // under AddressSanitizer every block is the system's, so that a use after free is caught
    return ::operator new(bytes);
#endif
    const int k = sizeClass(bytes);
    if (Block *b = free_[k]) {
      free_[k] = b->next;
      return b;
    }
    return ::operator new(std::size_t(1) << k);
  }
  void give(void *p, std::size_t bytes) {
#ifdef LMCC_RECYCLED_BYPASS
    return ::operator delete(p);
#endif
    const int k = sizeClass(bytes);
    auto *b = static_cast<Block *>(p);
    b->next = free_[k];
    free_[k] = b;
  }
  ~BlockPool() {
    for (Block *&head : free_)
      while (head) {
        Block *next = head->next;
        ::operator delete(head);
        head = next;
      }
  }

private:
  struct Block {
    Block *next;
  };
  static constexpr int kMinClass = 4, kClasses = 48; ///< 16 bytes .. 128 TiB
  static int sizeClass(std::size_t bytes) {
    int k = kMinClass;
    while (k < kClasses && (std::size_t(1) << k) < bytes)
      ++k;
    if (k == kClasses)
      throw std::bad_alloc();
    return k;
  }
  Block *free_[kClasses] = {};
};

} // namespace detail

/// A stateless allocator over the calling thread's BlockPool (any Recycled allocator frees any other's blocks).
template <class T>
struct Recycled {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "Recycled blocks have operator new's alignment");
  Recycled() = default;
  template <class U>
  Recycled(const Recycled<U> &) noexcept {}
  T *allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T))
      throw std::bad_alloc();
    return static_cast<T *>(detail::BlockPool::local().take(n * sizeof(T)));
  }
  void deallocate(T *p, std::size_t n) noexcept { detail::BlockPool::local().give(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const Recycled<U> &) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const Recycled<U> &) const noexcept {
    return false;
  }
};

/// The search's vectors.
template <class T>
using Vec = std::vector<T, Recycled<T>>;

} // namespace lmcc::decode
