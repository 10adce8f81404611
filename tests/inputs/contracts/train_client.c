/* A client of the training half of the generated header (lmcc compile --train): loss and gradient, a
 * trainer with two steps, state and weights saved, a bad batch refused. MODEL is replaced by the model name. */
#include "MODEL.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3)
    return 2;
  MODEL_model *m = NULL;
  if (MODEL_load(argv[1], &m)) {
    fprintf(stderr, "load: %s\n", lm_last_error());
    return 1;
  }
  const int32_t inputs[2 * 4] = {3, 7, 9, 1, 3, 8, 1, 0};
  const int32_t targets[2 * 4] = {7, 9, 1, -1, 8, 1, -1, -1};
  const int32_t lengths[2] = {4, 3};
  float loss = 0;
  float *grad = malloc(sizeof(float) * MODEL_N_PARAMS);
  if (MODEL_loss_and_grad(m, inputs, targets, lengths, 2, 4, &loss, grad)) {
    fprintf(stderr, "loss_and_grad: %s\n", lm_last_error());
    return 1;
  }
  const char *name = NULL;
  int64_t offset = -1, count = -1, total = 0;
  for (int32_t i = 0; MODEL_param_info(i, &name, &offset, &count) == 0; ++i) {
    if (offset != total)
      return 3;
    total += count;
  }
  if (total != MODEL_N_PARAMS)
    return 4;
  printf("loss %.6f params %lld\n", loss, (long long)total);
  MODEL_trainer *t = NULL;
  if (MODEL_trainer_new(m, &t)) {
    fprintf(stderr, "trainer_new: %s\n", lm_last_error());
    return 1;
  }
  for (int step = 0; step < 2; ++step) {
    if (MODEL_train_step(t, inputs, targets, lengths, 2, 4, &loss)) {
      fprintf(stderr, "train_step: %s\n", lm_last_error());
      return 1;
    }
    printf("step %d loss %.6f\n", step + 1, loss);
  }
  const int32_t none[4] = {-1, -1, -1, -1};
  if (MODEL_train_step(t, inputs, none, lengths, 1, 4, &loss) == 0)
    return 5;
  printf("refused: %s\n", lm_last_error());
  char path[4096];
  snprintf(path, sizeof path, "%s/state.safetensors", argv[2]);
  if (MODEL_trainer_save(t, path) || MODEL_trainer_load(t, path))
    return 6;
  snprintf(path, sizeof path, "%s/weights.safetensors", argv[2]);
  if (MODEL_save_weights(m, path))
    return 7;
  MODEL_trainer_free(t);
  MODEL_free(m);
  free(grad);
  return 0;
}
