/* score.c - scores sentences with a model compiled by lmcc, through its C API.
 *
 * Written against a model named example_model (header example_model.h, library libexample_model.so);
 * see README.md for building it and for using another model.
 *
 *   ./score WEIGHTS.safetensors IDS.txt
 *
 * IDS.txt holds one sentence per line: token ids separated by spaces (blank lines are skipped).
 * All sentences are scored in one batch; one JSON object per sentence is printed, like `lmcc score`:
 *   {"token_logprobs":[...],"score":S}
 */
#include "example_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  const int32_t stride = EXAMPLE_MODEL_MAX_LEN; /* one row per sentence, long enough for any valid one */
  int32_t *ids = NULL, *lengths = NULL, batch = 0, capacity = 0, b, i;
  float *token_logprobs = NULL, *scores = NULL;
  example_model_model *model = NULL;
  char line[65536];
  FILE *f;
  int status = 1;

  if (argc != 3) {
    fprintf(stderr, "usage: %s WEIGHTS.safetensors IDS.txt\n", argv[0]);
    return 2;
  }

  /* Read the sentences into a [batch, stride] matrix of ids. */
  f = fopen(argv[2], "r");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  while (fgets(line, sizeof line, f)) {
    char *token = strtok(line, " \t\r\n");
    int32_t n = 0;
    if (!token)
      continue; /* blank line */
    if (batch == capacity) {
      capacity = capacity ? 2 * capacity : 64;
      ids = realloc(ids, (size_t)capacity * stride * sizeof *ids);
      lengths = realloc(lengths, (size_t)capacity * sizeof *lengths);
      if (!ids || !lengths) {
        fprintf(stderr, "out of memory\n");
        return 1;
      }
    }
    for (; token; token = strtok(NULL, " \t\r\n")) {
      if (n == stride) {
        fprintf(stderr, "%s: sentence %d has more than %d tokens (the model's max_len)\n", argv[2], batch + 1,
                (int)stride);
        return 1;
      }
      char *end = NULL;
      errno = 0;
      const long id = strtol(token, &end, 10);
      if (*end || errno == ERANGE || id < INT32_MIN || id > INT32_MAX) {
        fprintf(stderr, "%s: sentence %d: '%s' is not a token id\n", argv[2], batch + 1, token);
        return 1;
      }
      ids[(size_t)batch * stride + n++] = (int32_t)id; /* the library checks the range [0, vocab) */
    }
    lengths[batch++] = n;
  }
  fclose(f);

  /* Load, score, print. The library checks every id and length and reports problems. */
  if (example_model_load(argv[1], &model) != 0) {
    fprintf(stderr, "error: %s\n", lm_last_error());
    goto done;
  }
  if (batch > 0) {
    token_logprobs = malloc((size_t)batch * stride * sizeof *token_logprobs);
    scores = malloc((size_t)batch * sizeof *scores);
    if (!token_logprobs || !scores) {
      fprintf(stderr, "out of memory\n");
      goto done;
    }
    if (example_model_score(model, ids, lengths, batch, stride, token_logprobs, scores) != 0) {
      fprintf(stderr, "error: %s\n", lm_last_error());
      goto done;
    }
  }
  for (b = 0; b < batch; b++) {
    printf("{\"token_logprobs\":[");
    for (i = 0; i < lengths[b]; i++)
      printf("%s%.7g", i ? "," : "", token_logprobs[(size_t)b * stride + i]);
    printf("],\"score\":%.7g}\n", scores[b]);
  }
  status = 0;

done:
  example_model_free(model);
  free(ids);
  free(lengths);
  free(token_logprobs);
  free(scores);
  return status;
}
