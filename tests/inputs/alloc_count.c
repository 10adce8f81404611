/* Counts the system allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign) of
 * steady-state score, embed and train-step calls through a model's C API at 1 thread (issue 4: the runtime's
 * steady-state calls allocate nothing; at 2 threads a worker may run a piece it has not run before, and its
 * workspace cache then takes a block from the system). MODEL is replaced by the model's name before compiling;
 * alloc_count.h counts. */
#define _GNU_SOURCE
#include "MODEL.h"

#include "alloc_count.h"

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
