/* Counts the system allocations of steady-state Diformer calls through a model's C API at 1 thread:
 * MODEL_score_pairs, and lm_rt_train_step_pairs on the model's trainer (issue 4: the runtime's steady-state calls
 * allocate nothing). MODEL is replaced by the model's name and UMODEL by its upper-case form before compiling (a
 * model compiled with --train; target ids 6.. and source ids 6.. must be in its vocabulary); alloc_count.h counts. */
#define _GNU_SOURCE
#include "MODEL.h"

#include "alloc_count.h"

#include <string.h>

/* liblmrt's Diformer training step (runtime/lib/lmrt.h; the model's header has no pair step). */
int lm_rt_train_step_pairs(void *t, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                           const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                           const uint32_t *hidden, int32_t batch, float *loss, double nll[2], double *lr,
                           double *grad_norm);

enum { B = 3, S = 6, T = 7, W = LM_HIDDEN_WORDS(UMODEL_MAX_LEN) };

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s WEIGHTS\n", argv[0]);
    return 2;
  }
  MODEL_model *m;
  MODEL_trainer *t;
  CHECK(MODEL_load(argv[1], &m));
  CHECK(MODEL_trainer_new(m, &t));
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
  lm_set_num_threads(1);
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
  MODEL_trainer_free(t);
  MODEL_free(m);
  return 0;
}
