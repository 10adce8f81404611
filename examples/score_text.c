/* score_text.c - tokenizes text and scores it with a model compiled by lmcc, all through the C API of the
 * generated header: lm_tokenizer_load / lm_tokenize / lm_token_piece (BERT WordPiece, Hugging Face
 * BertTokenizerFast-exact) and example_model_load / example_model_score.
 *
 * Written against a model named example_model; see README.md for building it.
 *
 *   ./score_text WEIGHTS.safetensors VOCAB.txt TEXT.txt [--cased]
 *
 * TEXT.txt holds one sentence per line (UTF-8). Each is tokenized (bos, pieces, eos) and scored on its own;
 * one JSON object per line is printed: {"tokens":["[SOS]","the",...],"score":S}. Piece strings are printed
 * as they are (a real program would JSON-escape quotes and backslashes).
 */
#include "example_model.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  lm_tokenizer *tok = NULL;
  example_model_model *model = NULL;
  static char line[1 << 16];
  int32_t ids[EXAMPLE_MODEL_MAX_LEN];
  float token_logprobs[EXAMPLE_MODEL_MAX_LEN], score;
  int line_no = 0, status = 0;
  FILE *f;

  if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "--cased") != 0)) {
    fprintf(stderr, "usage: %s WEIGHTS.safetensors VOCAB.txt TEXT.txt [--cased]\n", argv[0]);
    return 2;
  }
  if (lm_tokenizer_load(argv[2], argc == 4 /* lowercase unless --cased */, &tok) != 0 ||
      example_model_load(argv[1], &model) != 0) {
    fprintf(stderr, "error: %s\n", lm_last_error());
    lm_tokenizer_free(tok);
    return 1;
  }
  f = fopen(argv[3], "rb");
  if (!f) {
    perror(argv[3]);
    status = 1;
  }
  while (f && status == 0 && fgets(line, sizeof line, f)) {
    size_t len = strcspn(line, "\n"), n = 0, i;
    int32_t length;
    ++line_no;
    /* Text -> ids (with bos and eos), then one sentence of `length` ids in a batch of one. */
    if (lm_tokenize(tok, line, len, ids, EXAMPLE_MODEL_MAX_LEN, &n) == 0) {
      length = (int32_t)n;
      if (example_model_score(model, ids, &length, 1, length, token_logprobs, &score) == 0)
        n = (size_t)length;
      else
        status = 1;
    } else {
      status = 1;
    }
    if (status) {
      fprintf(stderr, "%s:%d: %s\n", argv[3], line_no, lm_last_error());
      break;
    }
    printf("{\"tokens\":[");
    for (i = 0; i < n; i++)
      printf("%s\"%s\"", i ? "," : "", lm_token_piece(tok, ids[i]));
    printf("],\"score\":%.9g}\n", score);
  }
  if (f)
    fclose(f);
  example_model_free(model);
  lm_tokenizer_free(tok);
  return status;
}
