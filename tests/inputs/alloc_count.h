/* Counts the process's system allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign)
 * while `counting` is set: the replacements forward to glibc's __libc_* functions (glibc only). Included by the
 * allocation-counting clients alloc_count.c and alloc_count_pairs.c. */
#ifndef LMCC_TESTS_ALLOC_COUNT_H
#define LMCC_TESTS_ALLOC_COUNT_H
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static long allocations = 0;
static int counting = 0;
static void count(void) {
  if (counting)
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
}
void *malloc(size_t n) { count(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { count(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { count(); return __libc_realloc(p, n); }
void *memalign(size_t al, size_t n) { count(); return __libc_memalign(al, n); }
void *aligned_alloc(size_t al, size_t n) { count(); return __libc_memalign(al, n); }
int posix_memalign(void **p, size_t al, size_t n) {
  count();
  *p = __libc_memalign(al, n);
  return *p ? 0 : 12;
}

#define CHECK(call)                                                                                                  \
  do {                                                                                                               \
    if ((call) != 0) {                                                                                               \
      fprintf(stderr, "%s: %s\n", #call, lm_last_error());                                                           \
      return 1;                                                                                                      \
    }                                                                                                                \
  } while (0)

#endif
