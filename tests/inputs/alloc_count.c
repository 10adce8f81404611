/* Counts the system allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign) of
 * steady-state calls through a model's C API at 1 thread (issue 4: the runtime's steady-state calls allocate
 * nothing; at 2 threads a worker may run a piece it has not run before, and its workspace cache then takes a
 * block from the system). `alloc-count WEIGHTS`: score, embed and train-step calls; `alloc-count WEIGHTS pairs`
 * (a Diformer): score_pairs calls and pair train steps (lm_rt_train_step_pairs; R, L and S rows, hidden keys), then
 * translate calls in every decoding mode, with and without self-reranking.
 * MODEL is replaced by the model's name and UMODEL by its upper-case form before compiling (a model compiled
 * with --train; ids 4.. and 6.. must be in its vocabulary; link liblmrt too). glibc only: the replacements forward to glibc's
 * __libc_* functions and count while `counting` is set. */
#define _GNU_SOURCE
#include "MODEL.h"

#include <string.h>
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

/* liblmrt's Diformer training step (runtime/lib/lmrt.h; the model's header has no pair step). */
int lm_rt_train_step_pairs(void *t, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                           const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                           const uint32_t *hidden, int32_t batch, float *loss, double nll[2], double *lr,
                           double *grad_norm);

enum { B = 3, N = 8, S = 6, T = 7, W = LM_HIDDEN_WORDS(UMODEL_MAX_LEN) };

/* Token ids: score, embed and train steps; returns the exit status. */
static int countIds(MODEL_model *m, MODEL_trainer *t) {
  int32_t ids[B * N], targets[B * N], lengths[B] = {N, 5, 3};
  float logprobs[B * N], scores[B], emb[B * 512], loss;
  for (int i = 0; i < B * N; ++i) {
    ids[i] = 4 + i % 7;
    targets[i] = i % N < lengths[i / N] - 1 ? 4 + (i + 1) % 7 : -1;
  }
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
  return 0;
}

/* Source/target pairs (a Diformer): score_pairs and pair train steps; returns the exit status. */
static int countPairs(MODEL_model *m, MODEL_trainer *t) {
  int32_t src[B * S], srcLen[B] = {S, 4, 2}, tgt[B * T], tgtLen[B] = {T, 5, 3}, dirs[B * T];
  uint32_t hidden[B * T * W];
  memset(hidden, 0, sizeof hidden);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < S; ++i)
      src[b * S + i] = 6 + (b + i) % 9;
    const int n = tgtLen[b];
    for (int i = 0; i < T; ++i) { /* R, L and S rows; an S row hides one other content key */
      tgt[b * T + i] = i == 0 ? UMODEL_BOS_ID : i == n - 1 ? UMODEL_EOS_ID : 6 + (b * 3 + i) % 9;
      dirs[b * T + i] = i == 0 ? 0 : i >= n - 1 ? 1 : i % 3;
      if (dirs[b * T + i] == 2 && n > 3)
        hidden[(b * T + i) * W] = 1u << (i == 1 ? 2 : 1);
    }
  }
  float lp[B * T], scores[B], lengths[B], loss;
  double nll[2], lr, norm;
  for (int i = 0; i < 8; ++i) { /* warm up: the workspace cache fills */
    CHECK(MODEL_score_pairs(m, src, srcLen, S, tgt, tgtLen, T, dirs, hidden, B, lp, scores, lengths));
    CHECK(lm_rt_train_step_pairs(t, src, srcLen, S, tgt, tgtLen, T, dirs, hidden, B, &loss, nll, &lr, &norm));
  }
  long score = 0, train = 0;
  for (int i = 0; i < 10; ++i) {
    allocations = 0, counting = 1;
    int rc = MODEL_score_pairs(m, src, srcLen, S, tgt, tgtLen, T, dirs, hidden, B, lp, scores, lengths);
    counting = 0, score += allocations, allocations = 0, counting = 1;
    rc |= lm_rt_train_step_pairs(t, src, srcLen, S, tgt, tgtLen, T, dirs, hidden, B, &loss, nll, &lr, &norm);
    counting = 0, train += allocations;
    if (rc != 0) {
      fprintf(stderr, "a call failed: %s\n", lm_last_error());
      return 1;
    }
  }
  printf("10 score_pairs calls %ld allocations, 10 pair train steps %ld\n", score, train);
  /* translate: every decoding mode, with and without self-reranking, on sources of two lengths */
  int32_t out[UMODEL_MAX_LEN], outLen, cands;
  double outScore;
  long translate = 0;
  for (int round = 0; round < 11; ++round) /* round 0 warms up */
    for (int mode = LM_DECODE_L2R; mode <= LM_DECODE_EASY_FIRST; ++mode)
      for (int rerank = 0; rerank < 2; ++rerank)
        for (int b = 0; b < 2; ++b) {
          allocations = 0, counting = round > 0;
          const int rc = MODEL_translate(m, src + b * S, srcLen[b], mode, 3, 2, 3, rerank, 0, out, UMODEL_MAX_LEN,
                                         &outLen, &outScore, &cands);
          counting = 0, translate += allocations;
          if (rc != 0) {
            fprintf(stderr, "translate (mode %d, rerank %d) failed: %s\n", mode, rerank, lm_last_error());
            return 1;
          }
        }
  printf("160 translate calls %ld allocations\n", translate);
  return 0;
}

int main(int argc, char **argv) {
  const int pairs = argc == 3 && strcmp(argv[2], "pairs") == 0;
  if (argc != 2 && !pairs) {
    fprintf(stderr, "usage: %s WEIGHTS [pairs]\n", argv[0]);
    return 2;
  }
  MODEL_model *m;
  MODEL_trainer *t;
  CHECK(MODEL_load(argv[1], &m));
  CHECK(MODEL_trainer_new(m, &t));
  lm_set_num_threads(1);
  const int status = pairs ? countPairs(m, t) : countIds(m, t);
  MODEL_trainer_free(t);
  MODEL_free(m);
  return status;
}
