/* Counts the system allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign) of
 * steady-state score, embed and train-step calls through a model's C API at 1 thread (issue 4: the runtime's
 * steady-state calls allocate nothing; at 2 threads a worker may run a piece it has not run before, and its
 * workspace cache then takes a block from the system). MODEL is replaced by the model's name before compiling.
 * glibc only: the replacements forward to glibc's __libc_* functions and count while `counting` is set. */
#define _GNU_SOURCE
#include "MODEL.h"

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
    if ((call) != 0) {                                                                                           \
      fprintf(stderr, "%s: %s\n", #call, lm_last_error());                                                           \
      return 1;                                                                                                      \
    }                                                                                                                \
  } while (0)

enum { B = 3, N = 8 };

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s WEIGHTS\n", argv[0]);
    return 2;
  }
  MODEL_model *m;
  MODEL_trainer *t;
  CHECK(MODEL_load(argv[1], &m));
  CHECK(MODEL_trainer_new(m, &t));
  int32_t ids[B * N], targets[B * N], lengths[B] = {N, 5, 3};
  float logprobs[B * N], scores[B], emb[B * 512], loss;
  for (int i = 0; i < B * N; ++i) {
    ids[i] = 4 + i % 7;
    targets[i] = i % N < lengths[i / N] - 1 ? 4 + (i + 1) % 7 : -1;
  }
  lm_set_num_threads(1);
  for (int i = 0; i < 8; ++i) { /* warm up: the workspace cache fills */
    CHECK(MODEL_score(m, ids, lengths, B, N, logprobs, scores));
    CHECK(MODEL_embed(m, ids, lengths, B, N, emb));
    CHECK(MODEL_train_step(t, ids, targets, lengths, B, N, &loss));
  }
  long score = 0, embed = 0, train = 0;
  for (int i = 0; i < 10; ++i) {
    allocations = 0, counting = 1;
    int rc = MODEL_score(m, ids, lengths, B, N, logprobs, scores);
    counting = 0, score += allocations, allocations = 0, counting = 1;
    rc |= MODEL_embed(m, ids, lengths, B, N, emb);
    counting = 0, embed += allocations, allocations = 0, counting = 1;
    rc |= MODEL_train_step(t, ids, targets, lengths, B, N, &loss);
    counting = 0, train += allocations;
    if (rc != 0) {
      fprintf(stderr, "a call failed: %s\n", lm_last_error());
      return 1;
    }
  }
  printf("10 score calls %ld allocations, 10 embed calls %ld, 10 train steps %ld\n", score, embed, train);
  MODEL_trainer_free(t);
  MODEL_free(m);
  return 0;
}
