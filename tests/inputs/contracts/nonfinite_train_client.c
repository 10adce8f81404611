/* MODEL_loss_and_grad and MODEL_train_step on weights that overflow (a library compiled with --train): the status
 * is LM_ERR_NONFINITE (5), the message names the entry point and the first bad row, and the weights are left
 * unchanged (a save before and after gives the same bytes). MODEL is replaced by the model name. */
#include "MODEL.h"

#include <stdio.h>
#include <string.h>

static long fileBytes(const char *path, unsigned char *buf, long cap) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  long n = (long)fread(buf, 1, (size_t)cap, f);
  fclose(f);
  return n;
}

int main(int argc, char **argv) {
  if (argc != 4)
    return 2;
  MODEL_model *m = NULL;
  MODEL_trainer *t = NULL;
  if (MODEL_load(argv[1], &m) || MODEL_trainer_new(m, &t)) {
    fprintf(stderr, "load: %s\n", lm_last_error());
    return 1;
  }
  const int32_t inputs[2 * 4] = {3, 7, 9, 1, 3, 8, 1, 0};
  const int32_t targets[2 * 4] = {-1, 7, 9, -1, -1, 8, -1, -1};
  const int32_t lengths[2] = {4, 3};
  float loss = 0;
  int status = MODEL_loss_and_grad(m, inputs, targets, lengths, 2, 4, &loss, NULL);
  printf("loss_and_grad %d %s\n", status, status ? lm_last_error() : "");
  if (MODEL_save_weights(m, argv[2]))
    return 1;
  status = MODEL_train_step(t, inputs, targets, lengths, 2, 4, &loss);
  printf("train_step %d %s\n", status, status ? lm_last_error() : "");
  if (MODEL_save_weights(m, argv[3]))
    return 1;
  static unsigned char a[1 << 22], b[1 << 22];
  long na = fileBytes(argv[2], a, sizeof a), nb = fileBytes(argv[3], b, sizeof b);
  printf("weights %s\n", na > 0 && na == nb && !memcmp(a, b, (size_t)na) ? "unchanged" : "changed");
  MODEL_trainer_free(t);
  MODEL_free(m);
  return 0;
}
