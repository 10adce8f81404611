/* Two compiled models linked into one program. */
#include "tiny_bilm.h"
#include "tiny_tta.h"
#include <stdio.h>

int main(int argc, char **argv) {
  tiny_tta_model *a = NULL;
  tiny_bilm_model *b = NULL;
  if (argc < 3 || tiny_tta_load(argv[1], &a) || tiny_bilm_load(argv[2], &b)) {
    fprintf(stderr, "load: %s\n", lm_last_error());
    return 1;
  }
  int32_t ids[5] = {3, 10, 11, 12, 1}, len = 5;
  float lp[5], sa = 0, sb = 0;
  if (tiny_tta_score(a, ids, &len, 1, 5, lp, &sa) || tiny_bilm_score(b, ids, &len, 1, 5, lp, &sb)) {
    fprintf(stderr, "score: %s\n", lm_last_error());
    return 1;
  }
  printf("tta %.4f bilm %.4f\n", sa, sb);
  tiny_tta_free(a);
  tiny_bilm_free(b);
  return 0;
}
