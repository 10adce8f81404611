//===- Header.cpp - The generated C header of a compiled library ------------===//
//
// Text generation only. The header is the public contract of a compiled model
// (see README.md, "Generated libraries"); Glue.cpp writes the C file that implements it
// through the runtime (runtime/lib/lmrt.h).
//
//===----------------------------------------------------------------------===//

#include "codegen/Emit/Header.h"
#include "codegen/Emit/Text.h"

#include <sstream>

namespace lmcc::codegen {

using namespace text;

namespace {

const char *kHeaderPrologue = R"(
#ifndef LMCC_MODEL_@NAME@_H
#define LMCC_MODEL_@NAME@_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the runtime ABI (liblmrt.so) the library was generated for: @NAME@_ABI_VERSION; LM_ABI_VERSION is
 * the first included lmcc header's (or lmrt.h's). <name>_load fails, naming both, under a runtime of another. */
#define @NAME@_ABI_VERSION @ABI@
#ifndef LM_ABI_VERSION
#define LM_ABI_VERSION @ABI@
#endif
/* The status codes int functions return (0 = ok); also in lmrt.h. */
#ifndef LM_STATUS_CODES_DECLARED
#define LM_STATUS_CODES_DECLARED
enum { LM_OK = 0, LM_ERR_ARGUMENT = 1, LM_ERR_WEIGHTS = 2, LM_ERR_MEMORY = 3, LM_ERR_INTERNAL = 4, LM_ERR_NONFINITE = 5 };
#endif
/* Diformer: words of hidden-key bits per target row (see <name>_score_pairs). */
#ifndef LM_HIDDEN_WORDS
#define LM_HIDDEN_WORDS(max_len) (((max_len) + 31) / 32)
#endif
/* Diformer: the decoding modes of <name>_translate. */
#ifndef LM_DECODE_MODES_DECLARED
#define LM_DECODE_MODES_DECLARED
enum { LM_DECODE_L2R = 0, LM_DECODE_R2L = 1, LM_DECODE_MASK_PREDICT = 2, LM_DECODE_EASY_FIRST = 3 };
#endif

)";

const char *kHeaderFunctions = R"(
/* A loaded model (opaque). Read-only after @name@_load. */
typedef struct @name@_model @name@_model;

/* Loads the weights: a safetensors file with the canonical tensor names (F32, F16 or BF16), or, when
 * the library was compiled with --embed-weights (@NAME@_EMBEDDED_WEIGHTS is 1), NULL for the weights
 * compiled in. Every tensor is checked (present, right shape, finite; no unexpected tensor); the error
 * names the file and the tensor. On success *out receives the model (free it with @name@_free); on
 * failure *out is left unchanged. */
int @name@_load(const char *weights_path, @name@_model **out);

/* Scores a batch of sentences. Sentence b is ids[b*stride .. b*stride + lengths[b]), with
 * 1 <= lengths[b] <= min(@NAME@_MAX_LEN, stride) and every id in [0, @NAME@_VOCAB).
 *   token_logprobs  batch*stride floats, or NULL: token_logprobs[b*stride + i] receives the log-probability
 *                   of token i of sentence b for i < lengths[b]; entries past a sentence's length are
 *                   left untouched.
 *   scores          batch floats: the sentence scores.
 * Returns 0, or non-zero with lm_last_error() set. All arguments are validated before anything is
 * written: on an invalid argument no output is touched. */
int @name@_score(@name@_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *token_logprobs, float *scores);

/* Mask-and-predict (PLL) scoring with chosen spans: token i of sentence b is predicted with tokens
 * [i, spans[b*stride + i]) masked, spans[b*stride + i] in (i, lengths[b]]. i + 1 everywhere is @name@_score;
 * the end of the word holding token i is Kauf & Ivanova's within-word l2r PLL (a word's later pieces are
 * masked too). Models that do not score by mask-and-predict return an error. */
int @name@_score_spans(@name@_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, const int32_t *spans, float *token_logprobs, float *scores);

/* Sentence embeddings: out receives batch*@NAME@_D_MODEL floats (row b = sentence b). Same batch layout,
 * validation and error rules as @name@_score. */
int @name@_embed(@name@_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *out);

/* Diformer (family "diformer"; other models return an error): scores source/target pairs. Pair b: source
 * src[b*src_stride ..] of src_lengths[b] tokens (1..@NAME@_MAX_LEN), target tgt[b*tgt_stride ..] of
 * n = tgt_lengths[b] tokens (bos .. eos, 2 <= n < @NAME@_MAX_LEN); dirs[b*tgt_stride + i] is target row i's
 * direction: 0 R (sees keys j <= i, predicts y_{i+1}), 1 L (j >= i, predicts y_{i-1}), 2 S (j != i and not
 * hidden, predicts y_i), 3 skip (not scored); row 0 is R or skip, row n-1 L or skip. hidden (NULL: none)
 * holds LM_HIDDEN_WORDS(@NAME@_MAX_LEN) words per target row, from (b*tgt_stride + i) * words: bit j % 32 of
 * word j / 32 hides key j (1..n-2) from S row i. Outputs: token_logprobs (may be NULL) [batch*tgt_stride],
 * i < n written, 0 for skipped rows; scores [batch]: their sum; length_logprobs (may be NULL) [batch]:
 * log P(n | source) (not in the score). */
int @name@_score_pairs(@name@_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride, const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs, const uint32_t *hidden, int32_t batch, float *token_logprobs, float *scores, float *length_logprobs);

/* Diformer (other models return an error): decodes one source of src_length ids (1..@NAME@_MAX_LEN) in mode
 * LM_DECODE_L2R / LM_DECODE_R2L (beam search of `beam` hypotheses, ranked by log-likelihood / predicted tokens),
 * LM_DECODE_MASK_PREDICT (`iterations` CMLM passes for each of the length head's `length_beam` best lengths of at
 * least one content token) or LM_DECODE_EASY_FIRST; rerank != 0 rescores the candidates with the mean of their teacher-forced L2R and R2L
 * log-likelihoods (sums over the n - 1 predicted tokens). max_target: the longest target an AR search builds (0: @NAME@_MAX_LEN - 1). Writes
 * bos .. eos to tgt[0 .. capacity) (@NAME@_MAX_LEN always fits), its length to *tgt_length, the ranking score to
 * *score and the candidates compared to *candidates (both may be NULL). */
int @name@_translate(@name@_model *m, const int32_t *src, int32_t src_length, int32_t mode, int32_t beam, int32_t length_beam, int32_t iterations, int32_t rerank, int32_t max_target, int32_t *tgt, int32_t capacity, int32_t *tgt_length, double *score, int32_t *candidates);

/* Frees a model (NULL is allowed). The model must not be in use by another thread. As with free(), a freed model
 * is gone: passing it to any function afterwards (a second free included) is undefined behaviour. */
void @name@_free(@name@_model *m);

/* Shared by all lmcc model headers (defined by every lmcc model library, all behaving alike). */
#ifndef LM_RUNTIME_FUNCTIONS_DECLARED
#define LM_RUNTIME_FUNCTIONS_DECLARED
/* The message of the last failed call on this thread ("" if none; a successful call does not clear it).
 * Valid until the next failing call on this thread. */
const char *lm_last_error(void);
/* Threads used by later calls, process-wide (default 1). Returns 0 (LM_OK), or LM_ERR_ARGUMENT (with
 * lm_last_error() set, the setting unchanged) when n < 1. Results do not depend on the thread count. */
int lm_set_num_threads(int n);
/* Bounds the temporaries of each later call (all its threads together) to about `bytes`: calls are cut into
 * smaller pieces to stay under it (mask-and-predict scoring splits a sentence's masked copies), with the
 * same results. A call that cannot fit (one masked copy, or one sentence, needs more) fails with
 * LM_ERR_MEMORY naming what it needs; training and translation calls, which cannot be cut, fail so when
 * their temporaries would pass it. Loading is not bounded. 0 restores the default, a quarter of the physical memory.
 * Process-wide. Returns the previous limit in bytes, or -1 (with lm_last_error() set) when bytes < 0. */
int64_t lm_set_workspace_limit(int64_t bytes);
#endif

/* Text: BERT WordPiece tokenization, exactly as Hugging Face's BertTokenizerFast (shared by all lmcc model
 * headers; defined by every lmcc model library). lm_tokenizer_load reads a vocabulary (one token a line,
 * id = line number - 1) and finds the specials by their usual strings: [PAD], [UNK], [SOS] (else [CLS])
 * as bos, [EOS] (else [SEP]) as eos, [MASK]; lowercase != 0: BERT uncased (lowercase, NFD, accents
 * stripped). lm_tokenize writes bos, the pieces' ids and eos for len bytes of UTF-8 (one sentence) and
 * sets *n; when *n > capacity nothing is written and 1 is returned (call again with a larger buffer).
 * Invalid UTF-8 is an error naming the byte offset. lm_token_piece: the vocabulary entry of id, or NULL. */
#ifndef LM_TOKENIZER_FUNCTIONS_DECLARED
#define LM_TOKENIZER_FUNCTIONS_DECLARED
#ifndef LM_TOKENIZER_TYPE_DECLARED
#define LM_TOKENIZER_TYPE_DECLARED
typedef struct lm_tokenizer lm_tokenizer;
#endif
int lm_tokenizer_load(const char *vocab_path, int lowercase, lm_tokenizer **out);
int lm_tokenize(const lm_tokenizer *tok, const char *utf8, size_t len, int32_t *ids, size_t capacity, size_t *n);
const char *lm_token_piece(const lm_tokenizer *tok, int32_t id);
int32_t lm_tokenizer_vocab_size(const lm_tokenizer *tok);
void lm_tokenizer_free(lm_tokenizer *tok);
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif
)";

const char *kHeaderTraining = R"(
#ifdef __cplusplus
extern "C" {
#endif

/* Training (the library was compiled with --train). The batch loss is (1/T) * sum of each row's
 * cross-entropy over the T rows with a target: row i of sentence b (inputs[b*stride + i]) predicts
 * targets[b*stride + i], a token id, or -1 for no prediction; label smoothing from the spec's [train].
 * A batch without any target or a target outside [-1, @NAME@_VOCAB) is an error (status 1); a NaN/inf loss or
 * gradient is status 5 (LM_ERR_NONFINITE), the message naming the entry point and the first batch row with a
 * non-finite loss term (or the gradient's tensor). Either way lm_last_error() is set and nothing is changed. */
typedef struct @name@_trainer @name@_trainer;

/* The loss of a batch and, when grad is not NULL, its gradient: @NAME@_N_PARAMS floats laid out as
 * @name@_param_info says. The weights are unchanged. With [train] dropout or attention_dropout the loss is that
 * of step 0's dropout masks (a trainer's step s draws step s's). */
int @name@_loss_and_grad(@name@_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                          int32_t batch, int32_t stride, float *loss, float *grad);
/* Parameter `index` (0 .. number of tensors - 1): its canonical name and its offset and count in grad. */
int @name@_param_info(int32_t index, const char **name, int64_t *offset, int64_t *count);
/* A trainer with the optimizer settings of the spec's [train] (AdamW / Adam / SGD, schedule, clipping);
 * it updates the weights of m in place. m must outlive it. */
int @name@_trainer_new(@name@_model *m, @name@_trainer **out);
/* One optimizer step on a batch: gradient, global-norm clipping, update with the scheduled learning rate. */
int @name@_train_step(@name@_trainer *t, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                       int32_t batch, int32_t stride, float *loss);
/* Diformer (family "diformer"; it has no ids-only training, so its _loss_and_grad and _train_step return an error,
 * and other models return one here): the directional loss of source/target pairs, laid out as for
 * @name@_score_pairs, and its gradient (grad may be NULL); nll (may be NULL) receives 2 doubles: the token NLL
 * per target token and the mean length NLL, the loss's two terms. _train_step_pairs: one optimizer step on it. */
int @name@_pair_loss_and_grad(@name@_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                               const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride,
                               const int32_t *dirs, const uint32_t *hidden, int32_t batch, float *loss, double *nll,
                               float *grad);
int @name@_train_step_pairs(@name@_trainer *t, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                             const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                             const uint32_t *hidden, int32_t batch, float *loss, double *nll);
/* Weights + optimizer moments + step count in one safetensors file (written to a temporary name, then
 * renamed); _trainer_load restores them into the trainer and its model. */
int @name@_trainer_save(@name@_trainer *t, const char *path);
int @name@_trainer_load(@name@_trainer *t, const char *path);
/* The weights as canonical safetensors, loadable by @name@_load (written atomically). */
int @name@_save_weights(@name@_model *m, const char *path);
void @name@_trainer_free(@name@_trainer *t);

#ifdef __cplusplus
} /* extern "C" */
#endif
)";

const char *kHeaderCpp = R"(
#ifdef __cplusplus
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

/* C++ wrappers: RAII ownership, errors as exceptions. */
namespace @ns@ {

constexpr int64_t vocab = @NAME@_VOCAB;
constexpr int64_t max_len = @NAME@_MAX_LEN;
constexpr int64_t d_model = @NAME@_D_MODEL;

/* Thrown by the wrappers: what() is lm_last_error(), code() the status returned. */
class Error : public std::runtime_error {
public:
  Error(int code, const char *message) : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

private:
  int code_;
};

/* For std::unique_ptr<@name@_model, Deleter> (ModelPtr) when using the C functions directly. */
struct Deleter {
  void operator()(@name@_model *m) const noexcept { @name@_free(m); }
};
using ModelPtr = std::unique_ptr<@name@_model, Deleter>;

/* Scores of a batch: token_logprobs[b] holds one value per token of sentence b. */
struct Scores {
  std::vector<std::vector<float>> token_logprobs;
  std::vector<float> scores;
};

/* A loaded model. Movable, not copyable; the const methods may be called from several threads at once. */
class Model {
public:
  Model() noexcept = default;
  /* Loads weights_path (nullptr: the embedded weights); throws Error. */
  explicit Model(const char *weights_path) {
    @name@_model *m = nullptr;
    check(@name@_load(weights_path, &m));
    ptr_.reset(m);
  }
  explicit Model(const std::string &weights_path) : Model(weights_path.c_str()) {}
  static Model load(const std::string &weights_path) { return Model(weights_path); }

  @name@_model *get() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return static_cast<bool>(ptr_); }

  /* The C calls, throwing Error instead of returning a status. */
  void score(const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *token_logprobs,
             float *scores) const {
    check(@name@_score(ptr_.get(), ids, lengths, batch, stride, token_logprobs, scores));
  }
  void embed(const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *out) const {
    check(@name@_embed(ptr_.get(), ids, lengths, batch, stride, out));
  }

  /* One batch of sentences (an empty batch gives an empty result). */
  Scores score(const std::vector<std::vector<int32_t>> &sentences) const {
    Scores result;
    if (sentences.empty())
      return result;
    Batch b(sentences);
    std::vector<float> logprobs(b.ids.size());
    result.scores.resize(sentences.size());
    check(@name@_score(ptr_.get(), b.ids.data(), b.lengths.data(), b.batch, b.stride, logprobs.data(),
                       result.scores.data()));
    result.token_logprobs.resize(sentences.size());
    for (std::size_t i = 0; i < sentences.size(); ++i) {
      const float *row = logprobs.data() + i * static_cast<std::size_t>(b.stride);
      result.token_logprobs[i].assign(row, row + sentences[i].size());
    }
    return result;
  }
  /* Embeddings of a batch: one vector of d_model floats per sentence. */
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>> &sentences) const {
    std::vector<std::vector<float>> result;
    if (sentences.empty())
      return result;
    Batch b(sentences);
    std::vector<float> out(sentences.size() * static_cast<std::size_t>(d_model));
    check(@name@_embed(ptr_.get(), b.ids.data(), b.lengths.data(), b.batch, b.stride, out.data()));
    for (std::size_t i = 0; i < sentences.size(); ++i)
      result.emplace_back(out.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(d_model)),
                          out.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<std::size_t>(d_model)));
    return result;
  }
  /* Diformer: one source decoded (bos .. eos); score (may be nullptr) receives the ranking score. */
  std::vector<int32_t> translate(const std::vector<int32_t> &src, int32_t mode = LM_DECODE_L2R, int32_t beam = 4,
                                 int32_t length_beam = 5, int32_t iterations = 10, bool rerank = false,
                                 int32_t max_target = 0, double *score = nullptr) const {
    std::vector<int32_t> tgt(static_cast<std::size_t>(max_len));
    int32_t length = 0;
    check(@name@_translate(ptr_.get(), src.data(), static_cast<int32_t>(src.size()), mode, beam, length_beam,
                           iterations, rerank ? 1 : 0, max_target, tgt.data(), static_cast<int32_t>(tgt.size()),
                           &length, score, nullptr));
    tgt.resize(static_cast<std::size_t>(length));
    return tgt;
  }

private:
  /* Sentences packed with stride = the longest length (invalid lengths are reported by the C call). */
  struct Batch {
    explicit Batch(const std::vector<std::vector<int32_t>> &sentences) {
      std::size_t longest = 1;
      for (const std::vector<int32_t> &s : sentences)
        longest = s.size() > longest ? s.size() : longest;
      if (sentences.size() > 0x7fffffff || longest > 0x7fffffff)
        throw Error(1, "the batch is too large for int32 sizes");
      batch = static_cast<int32_t>(sentences.size());
      stride = static_cast<int32_t>(longest);
      ids.assign(sentences.size() * longest, 0);
      for (std::size_t i = 0; i < sentences.size(); ++i) {
        lengths.push_back(static_cast<int32_t>(sentences[i].size()));
        for (std::size_t j = 0; j < sentences[i].size(); ++j)
          ids[i * longest + j] = sentences[i][j];
      }
    }
    std::vector<int32_t> ids, lengths;
    int32_t batch = 0, stride = 1;
  };
  static void check(int status) {
    if (status != 0)
      throw Error(status, lm_last_error());
  }
  ModelPtr ptr_;
};

/* lm_set_num_threads, throwing Error when n < 1. */
inline void set_num_threads(int n) {
  if (lm_set_num_threads(n) != LM_OK)
    throw Error(1, lm_last_error());
}

} /* namespace @ns@ */
#endif /* __cplusplus */

#endif /* LMCC_MODEL_@NAME@_H */
)";

} // namespace

std::string generateHeader(const ModelFacts &spec, bool embedWeights) {
  checkName(spec.name);
  const std::string &name = spec.name;
  const std::string NAME = upper(name);
  std::ostringstream os;
  os << "/* " << name << ".h - the C API of lib" << name << ".so, generated by lmcc from the spec \"" << name
     << "\"\n"
     << " * (family " << spec.family << ", spec hash " << spec.specHash << "). Do not edit.\n"
     << " *\n"
     << " * Build: cc app.c -I DIR -L DIR -l" << name << " (lib" << name
     << ".so finds liblmrt.so in its own directory); from the --static archive: cc app.c -I DIR DIR/lib" << name
     << ".a -L DIR -llmrt -lm -Wl,-rpath,DIR.\n"
     << " * Conventions:\n"
     << " *  - Functions returning int return 0 on success, else a non-zero status (1 invalid argument,\n"
     << " *    2 weights, 3 out of memory, 4 internal error, 5 a NaN or infinity in the results: the message\n"
     << " *    names the entry point and the first bad batch row) and lm_last_error() tells what went wrong.\n"
     << " *  - Sentences are token ids (int32) in rows of a batch: see " << name << "_score.\n"
     << " *  - Thread safety: a loaded model is read-only, so calls on the same model or on different models\n"
     << " *    may run concurrently from any threads (only " << name
     << "_free must not race with other calls on that model).\n"
     << " *    lm_set_num_threads is process-wide; lm_last_error() is per thread.\n"
     << " */";
  os << expand(kHeaderPrologue, name, "");
  const std::pair<const char *, int64_t> dims[] = {
      {"VOCAB", spec.vocab},   {"MAX_LEN", spec.maxLen}, {"D_MODEL", spec.dModel},
      {"LAYERS", spec.layers}, {"HEADS", spec.heads},    {"D_FF", spec.dFF}};
  os << "/* Model dimensions. */\n";
  for (const auto &[macro, value] : dims)
    os << "#define " << NAME << "_" << macro << " " << value << "\n";
  os << "/* Special token ids. */\n"
     << "#define " << NAME << "_PAD_ID " << spec.pad << "\n"
     << "#define " << NAME << "_UNK_ID " << spec.unk << "\n"
     << "#define " << NAME << "_BOS_ID " << spec.bos << "\n"
     << "#define " << NAME << "_EOS_ID " << spec.eos << "\n"
     << "#define " << NAME << "_MASK_ID " << spec.mask << "\n"
     << "/* specHash() of the resolved spec; 1 when the weights are compiled into the library. */\n"
     << "#define " << NAME << "_SPEC_HASH " << cString(spec.specHash) << "\n"
     << "#define " << NAME << "_EMBEDDED_WEIGHTS " << (embedWeights ? 1 : 0) << "\n";
  os << expand(kHeaderFunctions, name, "");
  if (spec.train)
    os << "\n/* Parameters: every canonical tensor, packed back to back in canonical order. */\n"
       << "#define " << NAME << "_N_PARAMS " << spec.train->numParams << "\n"
       << expand(kHeaderTraining, name, "");
  os << expand(kHeaderCpp, name, cppNamespace(name));
  return os.str();
}

} // namespace lmcc::codegen
