/* Trains a T-TA model compiled with `lmcc compile --train` through the generated header's trainer API:
 * loads weights, reads sentences of token ids (one a line, bos .. eos), runs STEPS optimizer steps on them
 * as one batch with T-TA's autoencoding objective (every position but bos/eos predicts its own token; the
 * diagonal mask hides it), prints each step's loss and writes the trained weights (loadable by
 * example_model_load and `lmcc score --weights`). The optimizer and its schedule come from the spec's [train].
 *
 *   usage: train WEIGHTS IDS_FILE STEPS OUT.safetensors */
#include "example_model.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_SENTENCES 64

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s WEIGHTS IDS_FILE STEPS OUT.safetensors\n", argv[0]);
    return 2;
  }
  const int steps = atoi(argv[3]);
  FILE *f = fopen(argv[2], "r");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  /* Sentences padded to the model's max_len (stride); lengths say where each ends. */
  const int32_t stride = EXAMPLE_MODEL_MAX_LEN;
  int32_t *inputs = calloc((size_t)MAX_SENTENCES * stride, sizeof(int32_t));
  int32_t *targets = malloc(sizeof(int32_t) * MAX_SENTENCES * stride);
  int32_t lengths[MAX_SENTENCES] = {0};
  int32_t batch = 0;
  char line[8192];
  while (batch < MAX_SENTENCES && fgets(line, sizeof line, f)) {
    char *p = line, *end;
    int32_t n = 0;
    for (long id = strtol(p, &end, 10); end != p && n < stride; id = strtol(p, &end, 10)) {
      inputs[batch * stride + n++] = (int32_t)id;
      p = end;
    }
    if (n > 0)
      lengths[batch++] = n;
  }
  fclose(f);
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t i = 0; i < stride; ++i) {
      const int32_t x = inputs[b * stride + i];
      const int special = x == EXAMPLE_MODEL_BOS_ID || x == EXAMPLE_MODEL_EOS_ID;
      targets[b * stride + i] = i < lengths[b] && !special ? x : -1; /* -1: no prediction */
    }

  example_model_model *m = NULL;
  example_model_trainer *t = NULL;
  if (example_model_load(argv[1], &m) || example_model_trainer_new(m, &t)) {
    fprintf(stderr, "error: %s\n", lm_last_error());
    return 1;
  }
  for (int s = 0; s < steps; ++s) {
    float loss = 0;
    if (example_model_train_step(t, inputs, targets, lengths, batch, stride, &loss)) {
      fprintf(stderr, "step %d: %s\n", s + 1, lm_last_error());
      return 1;
    }
    printf("step %d loss %.4f\n", s + 1, loss);
  }
  if (example_model_save_weights(m, argv[4])) {
    fprintf(stderr, "error: %s\n", lm_last_error());
    return 1;
  }
  example_model_trainer_free(t);
  example_model_free(m);
  free(inputs);
  free(targets);
  return 0;
}
