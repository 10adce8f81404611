/* MODEL_score and MODEL_embed on weights that overflow: the status is LM_ERR_NONFINITE (5) and the message names
 * the entry point and the row. MODEL is replaced by the model name, DIM by its D_MODEL macro. */
#include "MODEL.h"

#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  MODEL_model *m = NULL;
  if (MODEL_load(argv[1], &m)) {
    fprintf(stderr, "load: %s\n", lm_last_error());
    return 1;
  }
  const int32_t ids[2 * 4] = {3, 7, 9, 1, 3, 8, 1, 0};
  const int32_t lengths[2] = {4, 3};
  float scores[2], embedding[2 * DIM];
  int status = MODEL_score(m, ids, lengths, 2, 4, NULL, scores);
  printf("score %d %s\n", status, status ? lm_last_error() : "");
  status = MODEL_embed(m, ids, lengths, 2, 4, embedding);
  printf("embed %d %s\n", status, status ? lm_last_error() : "");
  MODEL_free(m);
  return 0;
}
