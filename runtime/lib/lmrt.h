/*===- lmrt.h - The lmcc runtime: the C ABI generated libraries link --------===*
 *
 * Generated libraries (lib<name>.so) consist of compiled kernels (an object file
 * emitted by lmcc through LLVM) plus a small generated C file that describes the
 * model (lm_model_desc) and forwards <name>_load/_score/_embed/_free to the
 * functions below. liblmrt.so depends on neither MLIR/LLVM nor the spec parser:
 * only the C++ runtime, oneTBB and Eigen (header-only).
 *
 *===----------------------------------------------------------------------===*/
#ifndef LMRT_H
#define LMRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef LM_ABI_VERSION
#define LM_ABI_VERSION 11
#endif
/* Every tensor of the flat weight buffer, and the buffer itself, starts at a multiple of this many bytes
 * (lmcc's weight layout, codegen/Layout/WeightLayout.h, and the runtime's loader both use it). */
#define LM_WEIGHT_ALIGNMENT 64
/* Diformer: 32-bit words of hidden-key bits per target row (a key position per bit, bit j % 32 of word j / 32). */
#define LM_HIDDEN_WORDS(max_len) (((max_len) + 31) / 32)

/* liblmrt.so is built with -fvisibility=hidden; the functions below are its only exports. */
#ifndef LM_API
#if defined(__GNUC__) || defined(__clang__)
#define LM_API __attribute__((visibility("default")))
#else
#define LM_API
#endif
#endif

/* Status codes returned by every lm_rt_* and <name>_* function (and lm_set_num_threads); generated headers
 * declare them too, under the same guard. */
#ifndef LM_STATUS_CODES_DECLARED
#define LM_STATUS_CODES_DECLARED
enum {
  LM_OK = 0,
  LM_ERR_ARGUMENT = 1, /* a bad argument: NULL pointer, batch/stride/length out of range, id outside the vocabulary */
  LM_ERR_WEIGHTS = 2,  /* the weights file is unreadable, malformed or does not match the model */
  LM_ERR_MEMORY = 3,   /* an allocation failed */
  LM_ERR_INTERNAL = 4, /* anything else (a bug: please report) */
  LM_ERR_NONFINITE = 5 /* the computation gave a NaN or infinity (e.g. weights with huge values): the message names
                          the entry point and the first bad batch row; the outputs must not be used */
};
#endif

/* MLIR's C interface for ranked memrefs (llvm.emit_c_interface). */
typedef struct { float *allocated, *aligned; int64_t offset, sizes[1], strides[1]; } lm_memref1f;
typedef struct { float *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } lm_memref2f;
typedef struct { int32_t *allocated, *aligned; int64_t offset, sizes[1], strides[1]; } lm_memref1i;
typedef struct { int32_t *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } lm_memref2i;
typedef struct { int32_t *allocated, *aligned; int64_t offset, sizes[3], strides[3]; } lm_memref3i;
typedef struct { float *allocated, *aligned; int64_t offset, sizes[3], strides[3]; } lm_memref3f;

/* Compiled kernels. All memrefs are dense row-major (strides [cols, 1]).
 * weights: every model tensor in one flat buffer, tensor t at float offset tensors[t].offset.
 * ids, lengths: a chunk of `rows` sentences padded to n = max length of the chunk (ids past a
 * sentence's length are tokens.pad and must not influence anything).
 * score: token_logprobs [rows, n] (entries past a length: unspecified), scores [rows], n_scored [rows].
 * embed: out [rows, d_model]. */
typedef void (*lm_score_kernel)(lm_memref1f *weights, lm_memref2i *ids, lm_memref1i *lengths,
                                lm_memref2f *token_logprobs, lm_memref1f *scores, lm_memref1i *n_scored);
typedef void (*lm_embed_kernel)(lm_memref1f *weights, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2f *out);
/* Mask-and-predict embedding (ABI 10): states [rows, n, D], row i the state at position i of the copy that masks
 * it, for the copies spans selects (spans[b, i] = i + 1: position i's copy; i: none, its row 0). */
typedef void (*lm_span_embed_kernel)(lm_memref1f *weights, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2i *spans,
                                     lm_memref3f *states);
/* Mask-and-predict scoring (lm.mask_and_predict with spans): spans [rows, n]; token i of a sentence is
 * predicted with tokens [i, min(spans, length)) masked when spans > i, and not at all (token_logprobs 0)
 * otherwise, which lets the runtime split one sentence's masked copies over several calls. */
typedef void (*lm_span_score_kernel)(lm_memref1f *weights, lm_memref2i *ids, lm_memref1i *lengths, lm_memref2i *spans,
                                     lm_memref2f *token_logprobs, lm_memref1f *scores, lm_memref1i *n_scored);
/* Diformer scoring (family "diformer"): src [rows, m], src_lengths [rows], tgt [rows, n] (bos .. eos),
 * tgt_lengths [rows], dirs [rows, n, 1 + LM_HIDDEN_WORDS(max_len)]: each target row's direction (0 R, 1 L,
 * 2 S, 3 skip) followed by the bits of the keys hidden from it; token_logprobs [rows, n] (0 for skipped rows),
 * scores, n_scored (rows not skipped) and length_logprobs (log P(n | source)) [rows]. */
typedef void (*lm_pair_score_kernel)(lm_memref1f *weights, lm_memref2i *src, lm_memref1i *src_lengths,
                                     lm_memref2i *tgt, lm_memref1i *tgt_lengths, lm_memref3i *dirs,
                                     lm_memref2f *token_logprobs, lm_memref1f *scores, lm_memref1i *n_scored,
                                     lm_memref1f *length_logprobs);
/* The Diformer's training entries (lmcc compile --train): the inputs of lm_pair_score_kernel; ce [rows, n] each
 * row's cross-entropy (0 for skipped rows), length_logprobs [rows]; the loss is sum ce / sum_b n_b +
 * length_loss * mean_b(-length_logprobs), and grads its gradient in the weight buffer's layout (as
 * lm_loss_grad_kernel's). */
typedef void (*lm_pair_loss_kernel)(lm_memref1f *weights, lm_memref2i *src, lm_memref1i *src_lengths, lm_memref2i *tgt,
                                    lm_memref1i *tgt_lengths, lm_memref3i *dirs, lm_memref2f *ce,
                                    lm_memref1f *length_logprobs);
typedef void (*lm_pair_loss_grad_kernel)(lm_memref1f *weights, lm_memref2i *src, lm_memref1i *src_lengths,
                                         lm_memref2i *tgt, lm_memref1i *tgt_lengths, lm_memref3i *dirs, lm_memref2f *ce,
                                         lm_memref1f *length_logprobs, lm_memref1f *grads);
/* The Diformer's decoding entries (lm_rt_translate). The decoder's keys and values are cached as [rows, T, kv_width]
 * (kv_width = 2 x decoder layers x d_model: layer l's keys at features [2l d, 2l d + d), its values after them).
 * encode: src, src_lengths -> length_logprobs [rows, max_len] (log P(n | source) for every n) and cross_kv
 * [rows, m, kv_width] (the cross-attention keys/values of the encoder's output); token_kv: ids [rows, T] -> kv
 * [rows, T, kv_width] (self-attention keys/values of each token: they depend on the token alone); decode: self_kv
 * [rows, n, kv_width] of the target's tokens, cross_kv, src_lengths, tgt_lengths, dirs (as lm_pair_score_kernel)
 * -> logprobs [rows, n, vocab] of every target row; step: the same plus positions [rows] -> logprobs
 * [rows, 1, vocab] of target row positions[b] alone. */
typedef void (*lm_pair_encode_kernel)(lm_memref1f *weights, lm_memref2i *src, lm_memref1i *src_lengths,
                                      lm_memref2f *length_logprobs, lm_memref3f *cross_kv);
typedef void (*lm_pair_token_kv_kernel)(lm_memref1f *weights, lm_memref2i *ids, lm_memref3f *kv);
typedef void (*lm_pair_decode_kernel)(lm_memref1f *weights, lm_memref3f *self_kv, lm_memref3f *cross_kv,
                                      lm_memref1i *src_lengths, lm_memref1i *tgt_lengths, lm_memref3i *dirs,
                                      lm_memref3f *logprobs);
typedef void (*lm_pair_step_kernel)(lm_memref1f *weights, lm_memref3f *self_kv, lm_memref3f *cross_kv,
                                    lm_memref1i *src_lengths, lm_memref1i *tgt_lengths, lm_memref3i *dirs,
                                    lm_memref1i *positions, lm_memref3f *logprobs);
/* Computes the tensors lm-fold-constants derived from weights alone (e.g. T-TA's first-layer
 * query of the positions) into their slots of the weight buffer, once, after loading. */
typedef void (*lm_init_kernel)(lm_memref1f *weights);
/* Training (lmcc compile --train). inputs, targets [rows, n] (target -1: no prediction at that row),
 * lengths [rows]; ce [rows, n]: each row's cross-entropy (0 where no target); grads: the gradient of
 * (1/T) sum ce in the weight buffer's layout: every tensor's slot is written (0 where the loss does not reach
 * it; the caller need not zero it), the rest of the buffer (folded tables, packed copies) is left as it was. */
typedef void (*lm_loss_kernel)(lm_memref1f *weights, lm_memref2i *inputs, lm_memref2i *targets, lm_memref1i *lengths,
                               lm_memref2f *ce);
typedef void (*lm_loss_grad_kernel)(lm_memref1f *weights, lm_memref2i *inputs, lm_memref2i *targets,
                                    lm_memref1i *lengths, lm_memref2f *ce, lm_memref1f *grads);

/* The spec's [train] table, as the trainer reads it. */
typedef struct {
  int32_t optimizer;        /* 0 adamw, 1 adam, 2 sgd */
  int32_t schedule;         /* 0 linear, 1 constant, 2 cosine */
  double lr, beta1, beta2, eps, weight_decay;
  int64_t warmup_steps, steps;
  double clip_norm;         /* 0 = off */
  double label_smoothing;   /* compiled into the loss kernels; informational here */
  int64_t seed;
} lm_train_desc;

typedef struct {
  const char *name;  /* canonical name, e.g. "layers.0.attn.q.weight" */
  int32_t rank;      /* 1 or 2 */
  int64_t shape[2];
  int64_t offset;    /* in floats, into the flat weight buffer (a multiple of 16 except inside a stacked group) */
} lm_tensor_desc;

typedef struct {
  const char *name;          /* the spec's name */
  const char *spec_hash;     /* specHash() of the resolved spec */
  int64_t vocab, max_len, d_model, heads, d_ff, layers;
  int32_t pad_id;            /* used to pad chunks */
  const lm_tensor_desc *tensors;
  int32_t num_tensors;
  int64_t total_floats;      /* size of the flat weight buffer */
  lm_score_kernel score;
  lm_embed_kernel embed;
  const float *embedded_weights; /* non-NULL when compiled with --embed-weights (flat layout above) */
  lm_init_kernel init;           /* NULL when nothing is folded at load time */
  /* ABI 3: training entries, NULL unless compiled with --train. */
  lm_loss_kernel loss;
  lm_loss_grad_kernel loss_grad;
  const lm_train_desc *train;
  /* ABI 4: mask-and-predict scoring takes spans (then `score` is NULL), and the memory model of the entry
   * points (codegen/Stats.h): a call on B sentences padded to n with C masked copies needs at most
   * B * sentence_bytes[n] + C * copy_bytes[n] bytes of temporaries on one thread (more threads: ABI 8's
   * thread_bytes). Arrays of max_len + 1; NULL: unknown. */
  lm_span_score_kernel span_score;
  const int64_t *score_sentence_bytes, *score_copy_bytes, *embed_sentence_bytes, *embed_copy_bytes;
  /* ABI 5: the Diformer's source/target scoring (then score, span_score and embed are NULL). */
  lm_pair_score_kernel pair_score;
  int32_t bos_id, eos_id; /* the Diformer's targets run bos .. eos */
  lm_pair_loss_kernel pair_loss;          /* NULL unless a Diformer compiled with --train */
  lm_pair_loss_grad_kernel pair_loss_grad;
  double length_loss;                     /* [diformer] length_loss: the weight of the length term */
  /* ABI 6: the Diformer's decoding entries (NULL for other families) and the ids its search treats apart. */
  lm_pair_encode_kernel pair_encode;
  lm_pair_token_kv_kernel pair_token_kv;
  lm_pair_decode_kernel pair_decode;
  lm_pair_step_kernel pair_step;
  int64_t kv_width; /* features of a token's cached decoder keys/values (2 x decoder layers x d_model) */
  int32_t unk_id, mask_id;
  /* ABI 7: nonzero when the kernels use AMX tiles (bf16 weights compiled for a CPU with AMX-BF16): lm_rt_load asks
   * the operating system for AMX tile state first (lm_rt_request_amx). */
  int32_t amx;
  /* ABI 8: the memory model's term per thread: a call on T threads needs at most (T - 1) * thread_bytes[n] bytes
   * more than the one-thread bound above (each thread's work item -- an attention task, a log-probability chunk --
   * holds scratch of its own), n the call's longest sentence. Arrays of max_len + 1; NULL: unknown. */
  const int64_t *score_thread_bytes, *embed_thread_bytes;
  /* ABI 10: mask-and-predict embedding (then `embed` is NULL): the kernel returns each position's state and the
   * runtime pools them, so that a sentence's copies can be cut into windows under the workspace limit as scoring's
   * are. embed_pool: 0 mean over the valid rows whose id is not in embed_exclude (every valid row when none is
   * left), 1 mean over every valid row, 2 row 0; embed_normalize: then x / max(||x||_2, 1e-12). */
  lm_span_embed_kernel span_embed;
  int32_t embed_pool, embed_normalize;
  const int32_t *embed_exclude;
  int32_t num_embed_exclude;
} lm_model_desc;

typedef struct lm_model lm_model;

/* LM_OK when `version` is this runtime's LM_ABI_VERSION; else LM_ERR_ARGUMENT, the message naming both. Every
 * generated library calls it with the version it was generated for before it hands its lm_model_desc to the
 * runtime (<name>_load, <name>_param_info): a process has one liblmrt.so, the first one loaded, so the libraries
 * of two lmcc versions in one program share it, and a descriptor of another layout would be misread. (ABI 9;
 * a library of ABI <= 8 does not call it.) */
LM_API int lm_rt_check_abi(int version);
/* Loads weights (canonical names, F32/F16/BF16 safetensors; NULL path = embedded weights),
 * checks every tensor's presence, shape and finiteness against desc. */
LM_API int lm_rt_load(const lm_model_desc *desc, const char *weights_path, lm_model **out);
/* Asks Linux for AMX tile state for this process (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), which the kernels of a
 * library with desc->amx need before their first tile instruction (lm_rt_load does it for them). LM_OK, or
 * LM_ERR_ARGUMENT with the reason when the CPU or the kernel has no AMX. Idempotent. */
LM_API int lm_rt_request_amx(void);
/* Validates all arguments first (nothing is written on error), then scores in chunks across the
 * runtime's oneTBB arena. token_logprobs may be NULL; entries past a sentence's length are untouched. */
/* Thread safety: a loaded model is read-only and every call works in buffers of its own, so calls on
 * the same model or on different models may run concurrently from any number of threads. */
LM_API int lm_rt_score(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                float *token_logprobs, float *scores);
/* lm_rt_score plus n_scored[batch] (may be NULL): the number of positions that count in each score
 * (skip_special leaves out special tokens). Not part of the generated header. */
LM_API int lm_rt_score_ex(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                          float *token_logprobs, float *scores, int32_t *n_scored);
/* Mask-and-predict scoring with spans [batch*stride]: token i of sentence b is predicted with tokens
 * [i, spans[b*stride+i]) masked, each span in (i, lengths[b]] (NULL: i + 1, the original PLL). Other
 * models: an error. Same outputs and rules as lm_rt_score_ex. */
LM_API int lm_rt_score_spans(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride,
                             const int32_t *spans, float *token_logprobs, float *scores, int32_t *n_scored);
/* Diformer scoring of source/target pairs (models of family "diformer"; an LM_ERR_ARGUMENT otherwise).
 * Sentence b: source src[b*src_stride ..] of src_lengths[b] tokens (1..max_len), target tgt[b*tgt_stride ..]
 * of tgt_lengths[b] = n tokens (bos .. eos, 2 <= n < max_len), dirs[b*tgt_stride + i] the direction of
 * target row i (0 R: sees keys j <= i and predicts y_{i+1}; 1 L: j >= i, predicts y_{i-1}; 2 S: j != i and
 * not hidden, predicts y_i; 3 skip: not scored), with z_0 R or skip and z_{n-1} L or skip. hidden (may be
 * NULL: none) holds LM_HIDDEN_WORDS(max_len) words per target row ((b*tgt_stride + i) * words ..): bit j % 32
 * of word j / 32 hides key j from S row i (positions 1..n-2 only, S rows only). Outputs: token_logprobs
 * [batch*tgt_stride] (may be NULL; positions i < n written, 0 for skipped rows), scores [batch] (the sum, length
 * excluded), length_logprobs [batch] (may be NULL): log P(n | source). */
LM_API int lm_rt_score_pairs(lm_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                             const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                             const uint32_t *hidden, int32_t batch, float *token_logprobs, float *scores,
                             float *length_logprobs);
/* Diformer decoding of one source (issue 19's `lmcc translate`): mode LM_DECODE_L2R / LM_DECODE_R2L (beam search of
 * `beam` hypotheses, only the new row computed per step, ranked by log-likelihood / predicted tokens),
 * LM_DECODE_MASK_PREDICT (CMLM, `iterations` passes for each of the length head's `length_beam` best lengths of
 * at least one content token) or LM_DECODE_EASY_FIRST (DisCo-style passes); rerank != 0 rescores the candidates with the mean of their
 * teacher-forced L2R and R2L log-likelihoods (sums over the n - 1 predicted tokens). max_target bounds the target an AR search
 * builds (bos..eos; 0: max_len - 1, else 2..max_len-1). Writes the translation (bos .. eos) to tgt[0..capacity),
 * its length to *tgt_length (also when it does not fit: then LM_ERR_ARGUMENT), its ranking score to *score and
 * the number of candidates compared to *candidates (score and candidates may be NULL). beam, length_beam and
 * iterations are in [1, 1000]. */
#ifndef LM_DECODE_MODES_DECLARED /* also in every lmcc model header */
#define LM_DECODE_MODES_DECLARED
enum { LM_DECODE_L2R = 0, LM_DECODE_R2L = 1, LM_DECODE_MASK_PREDICT = 2, LM_DECODE_EASY_FIRST = 3 };
#endif
LM_API int lm_rt_translate(lm_model *m, const int32_t *src, int32_t src_length, int32_t mode, int32_t beam,
                           int32_t length_beam, int32_t iterations, int32_t rerank, int32_t max_target, int32_t *tgt,
                           int32_t capacity, int32_t *tgt_length, double *score, int32_t *candidates);
LM_API int lm_rt_embed(lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride, float *out);
LM_API void lm_rt_free(lm_model *m);

/* --- Training (models compiled with --train) ------------------------------------------------------
 * The batch loss of issue 14: (1/T) sum of each row's cross-entropy over the T rows with a target
 * (targets[b*stride+i] in [0, vocab), or -1 for none; a batch without any target is an error).
 * Parameters are the model's tensors in canonical (descriptor) order, packed back to back:
 * lm_rt_param_info gives each one's offset and count in that packed layout. */
typedef struct lm_trainer lm_trainer;
/* Total floats of all parameters (the packed gradient's size). */
LM_API int64_t lm_rt_num_params(const lm_model_desc *desc);
LM_API int lm_rt_param_info(const lm_model_desc *desc, int32_t index, const char **name, int64_t *offset,
                            int64_t *count);
/* loss (may be NULL) and the gradient in the packed layout (grad may be NULL). Weights unchanged. */
LM_API int lm_rt_loss_and_grad(lm_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                               int32_t batch, int32_t stride, float *loss, float *grad);
/* The Diformer's directional loss of source/target pairs (the arguments of lm_rt_score_pairs) and its gradient
 * in the packed layout (grad may be NULL); models compiled from family "diformer" with --train. nll (may be
 * NULL) receives the loss's two terms: the token NLL per target token and the mean length NLL. */
LM_API int lm_rt_pair_loss_and_grad(lm_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                                    const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride,
                                    const int32_t *dirs, const uint32_t *hidden, int32_t batch, float *loss,
                                    double nll[2], float *grad);
/* The loss alone (forward only): returns (1/T) sum ce and, when targets_out is not NULL, T. */
LM_API int lm_rt_loss(lm_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                      int32_t batch, int32_t stride, float *loss, int64_t *targets_out);
/* A trainer owns the optimizer state of `m` (settings from the spec's [train]); m must outlive it. */
LM_API int lm_rt_trainer_new(lm_model *m, lm_trainer **out);
/* lm_rt_trainer_new with other optimizer settings than the compiled [train] table (NULL: those);
 * label_smoothing is compiled into the loss kernels and must equal the model's. */
LM_API int lm_rt_trainer_new_ex(lm_model *m, const lm_train_desc *settings, lm_trainer **out);
/* One step: gradient, clipping, optimizer, schedule; the weights of m are updated in place. A NaN/inf
 * loss or gradient is reported (LM_ERR_ARGUMENT) and leaves the weights and the state unchanged. */
LM_API int lm_rt_train_step(lm_trainer *t, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                            int32_t batch, int32_t stride, float *loss);
/* The same, also returning the learning rate the step used and the pre-clip global gradient norm (may be NULL). */
LM_API int lm_rt_train_step_ex(lm_trainer *t, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                               int32_t batch, int32_t stride, float *loss, double *lr, double *grad_norm);
/* One step on source/target pairs (a Diformer's trainer): gradient of lm_rt_pair_loss_and_grad's loss,
 * clipping, optimizer, schedule. */
LM_API int lm_rt_train_step_pairs(lm_trainer *t, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                                  const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride,
                                  const int32_t *dirs, const uint32_t *hidden, int32_t batch, float *loss,
                                  double nll[2], double *lr, double *grad_norm);
/* Steps done so far (-1 on a NULL trainer). */
LM_API int64_t lm_rt_trainer_steps(const lm_trainer *t);
/* Weights + optimizer moments + step count as one safetensors file (written to a temporary name, then renamed). */
LM_API int lm_rt_trainer_save(lm_trainer *t, const char *path);
LM_API int lm_rt_trainer_load(lm_trainer *t, const char *path);
/* The model's weights as canonical safetensors (loadable by lm_rt_load), written atomically. */
LM_API int lm_rt_save_weights(lm_model *m, const char *path);
LM_API void lm_rt_trainer_free(lm_trainer *t);

/* The message of the last failed call on this thread ("" if none; a successful call does not clear it).
 * The pointer stays valid until the next failing call on this thread. */
LM_API const char *lm_last_error(void);
/* Threads used by later calls (>= 1, process-wide, default 1; at most the machine's concurrency is used);
 * returns LM_OK, or LM_ERR_ARGUMENT (and sets the error; the setting unchanged) if n < 1 (issue 4's C ABI: status
 * codes). lm_rt_set_num_threads (below) returns the previous value instead, or -1. Results do not depend on the thread
 * count: each sentence, row and masked copy is computed on its own, whatever chunk of consecutive sentences (up to
 * 32 on one thread, 8 side by side, fewer under the workspace limit) and thread it falls in. */
LM_API int lm_set_num_threads(int n);
/* The same two functions under runtime names. Every generated lib<name>.so defines lm_last_error and
 * lm_set_num_threads as forwarders to these, so that a program linked with -l<name> alone finds them
 * (linkers do not resolve a program's symbols in a library's dependencies). */
LM_API const char *lm_rt_last_error(void);
LM_API int lm_rt_set_num_threads(int n);
/* Bounds the temporaries of each later call (all its threads together) to about `bytes`, with the
 * descriptor's memory model: a call is cut into pieces under it (fewer sentences at once; one sentence's
 * masked copies in windows), with the same results; when one piece cannot fit, the call fails with
 * LM_ERR_MEMORY naming what it needs. Calls without a memory model (training: loss_and_grad, train_step; the
 * Diformer's translate) are held to it as they run: a temporary that would take the call's temporaries past it
 * ends the call with LM_ERR_MEMORY. Loading a model is not bounded. The runtime's cache of freed temporaries is
 * held under it too.
 * 0 = the default: a quarter of the physical memory (or of the cgroup's memory.max), at most half of what
 * ulimit -v / -d leave the process. A temporary the system refuses even so (a limit set above what the process
 * may map) ends the call with LM_ERR_MEMORY naming its size, the call's temporaries freed. Returns the previous limit in bytes (the default's
 * value when none was set), or -1 when bytes < 0. Process-wide. */
LM_API int64_t lm_set_workspace_limit(int64_t bytes);
LM_API int64_t lm_rt_set_workspace_limit(int64_t bytes);

/* GEMM called by generated kernels: C[m, n] = A[m, k] * B[n, k]^T (+ bias[n] when bias != NULL).
 * Row-major with leading dimensions lda, ldb, ldc. Pointers are passed as integers by the kernels. */
LM_API void lm_rt_sgemm_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    const float *bias, float *c, int64_t ldc);

/* Runs fn(ctx, begin, end) over pieces of [0, n) on the runtime's oneTBB arena (the thread count set by
 * lm_set_num_threads); generated kernels split one GEMM's weight panels this way. */
typedef void (*lm_task_fn)(void *ctx, int64_t begin, int64_t end);
LM_API void lm_rt_parallel_for(int64_t n, lm_task_fn fn, void *ctx);

/* The private (per-core L2) cache of the threads a call runs on, in bytes: the L2 size the system reports
 * (1 MiB when it reports none) times the runtime's thread count. Generated attention prefetches the next
 * item's operands only when a call's operands exceed it. */
LM_API int64_t lm_rt_private_cache_bytes(void);

/* Loss and backward kernels called by compiled training code (lm-to-loops lowers the lm training ops
 * to these; runtime/lib/TrainKernels.cpp, one copy per ISA level chosen at first use). Dense row-major
 * float32; B sentences padded to N rows with lengths[b] valid rows; mask: 0 none, 1 causal,
 * 2 anticausal, 3 diagonal, 4 directional (rows [B, N, row_width], the Diformer's); per_length: the loss
 * divides by sum_b lengths[b] instead of the number of rows with a target; activation kind: 0 gelu, 1 gelu_tanh, 2 relu. Deterministic for any
 * thread count. */
/* The GEMM generated into the model's library for these kernels (lm-to-loops, Gemm.cpp getOrCreateTrainGemm): for
 * panels p in [p_begin, p_end) and columns n = 64 p + j < N, C[m ldc + n] = (accumulate ? C[m ldc + n] : 0) +
 * sum_{k < K} A[m lda + k] B[k][n], B packed in panels of 64 columns, each cut into K x `cols` column slices
 * (flat[64 K p + K cols (j / cols) + cols k + j % cols], zero past N); `cols` (the generated tile's width) is
 * passed next to it. The kernels that take one (token and n-gram losses, linear backward) run their GEMMs on it. */
typedef void (*lm_rt_gemm_fn)(const float *A, int64_t lda, int64_t M, int64_t K, const float *packed, float *C,
                              int64_t ldc, int64_t N, int64_t p_begin, int64_t p_end, int64_t accumulate);
LM_API void lm_rt_token_loss(const float *h, const float *W, const float *bias, const int32_t *targets,
                             const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                             float *ce, float *lse, lm_rt_gemm_fn gemm, int64_t gemm_cols);
LM_API void lm_rt_token_loss_grad(const float *h, const float *W, const float *bias, const int32_t *targets,
                                  const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                                  double smoothing, int32_t per_length, float *dh, float *dW, float *dbias,
                                  lm_rt_gemm_fn gemm, int64_t gemm_cols);
/* lm.token_loss_and_grad: lm_rt_token_loss then lm_rt_token_loss_grad on the lse it wrote (the same results, bit for
 * bit), the live rows' logits computed once and kept for the backward when they take at most keep_bytes (and the
 * call's workspace has room for them), computed again otherwise. dbias may be NULL. */
LM_API void lm_rt_token_loss_and_grad(const float *h, const float *W, const float *bias, const int32_t *targets,
                                      const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V,
                                      double smoothing, int32_t per_length, int64_t keep_bytes, float *ce, float *lse,
                                      float *dh, float *dW, float *dbias, lm_rt_gemm_fn gemm, int64_t gemm_cols);
/* One head of lm.ngram_loss: targets shifted by `shift` (-1 past the sentence), total = [total +] weight * ce
 * (first != 0: overwritten); the gradient seeds d ce = weight / T, T counted on the unshifted targets, and
 * writes (first) or adds into dW and dbias (dbias may be NULL). */
LM_API void lm_rt_ngram_head_loss(const float *u, const float *W, const float *bias, const int32_t *targets,
                                  const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V, double smoothing,
                                  int64_t shift, double weight, int32_t first, float *total, float *lse,
                                  lm_rt_gemm_fn gemm, int64_t gemm_cols);
LM_API void lm_rt_ngram_head_grad(const float *u, const float *W, const float *bias, const int32_t *targets,
                                  const int32_t *lengths, const float *lse, int64_t B, int64_t N, int64_t D, int64_t V,
                                  double smoothing, int64_t shift, double weight, int32_t first, float *du, float *dW,
                                  float *dbias, lm_rt_gemm_fn gemm, int64_t gemm_cols);
/* lm.ngram_loss_and_grad, one head: lm_rt_ngram_head_loss then lm_rt_ngram_head_grad on the lse it wrote (the same
 * results, bit for bit), the head's logits kept between the two as lm_rt_token_loss_and_grad keeps them. */
LM_API void lm_rt_ngram_head_loss_and_grad(const float *u, const float *W, const float *bias, const int32_t *targets,
                                           const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t V,
                                           double smoothing, int64_t shift, double weight, int32_t first,
                                           int64_t keep_bytes, float *total, float *lse, float *du, float *dW,
                                           float *dbias, lm_rt_gemm_fn gemm, int64_t gemm_cols);
LM_API void lm_rt_linear_grad(const float *dy, const float *x, const float *W, int64_t rows, int64_t in, int64_t out,
                              float *dx, float *dW, float *db, lm_rt_gemm_fn gemm, int64_t gemm_cols);
LM_API void lm_rt_layer_norm_grad(const float *dy, const float *x, const float *gamma, int64_t rows, int64_t D,
                                  double eps, float *dx, float *dgamma, float *dbeta);
LM_API void lm_rt_activation_grad(const float *dy, const float *x, int64_t n, int32_t kind, float *dx);
/* rel_k, rel_v [2 clip + 1, d_model / heads] or NULL (then d_rel_k, d_rel_v are not written); rows: the
 * directional mask's [B, N, row_width] (NULL for other masks); lengths pad the M keys, query_lengths the N
 * queries (NULL: lengths). */
LM_API void lm_rt_attention_grad(const float *dO, const float *q, const float *k, const float *v,
                                 const int32_t *lengths, const int32_t *query_lengths, const int32_t *rows, int64_t row_width, const float *rel_k,
                                 const float *rel_v, int64_t clip, int64_t B, int64_t N, int64_t M, int64_t D,
                                 int64_t heads, int32_t mask, float scale, float *dq, float *dk, float *dv,
                                 float *d_rel_k, float *d_rel_v);
LM_API void lm_rt_relative_scores_grad(const float *dOut, const float *q, const float *rel, int64_t BH, int64_t N,
                                       int64_t M, int64_t dh, int64_t clip, float *dq, float *d_rel);
LM_API void lm_rt_relative_values_grad(const float *dOut, const float *p, const float *rel, int64_t BH, int64_t N,
                                       int64_t M, int64_t dh, int64_t clip, float *dp, float *d_rel);
LM_API void lm_rt_embed_grad(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N,
                             int64_t D, int64_t V, float *out);
/* out[v] += the scatter sum of lm_rt_embed_grad's row v, for the rows v some id reaches (others untouched). */
LM_API void lm_rt_embed_grad_add(const float *dy, const int32_t *ids, const int32_t *lengths, int64_t B, int64_t N,
                                 int64_t D, int64_t V, float *out);
LM_API void lm_rt_positions_grad(const float *dy, const int32_t *lengths, int64_t B, int64_t N, int64_t D, int64_t L,
                                 float *out);
LM_API void lm_rt_cross_entropy(const float *lp, const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N,
                                int64_t V, double smoothing, float *ce);
LM_API void lm_rt_cross_entropy_grad(const int32_t *targets, const int32_t *lengths, int64_t B, int64_t N, int64_t V,
                                     double smoothing, int32_t per_length, float *dlp);
/* out = x * keep / (1 - rate), keep from runtime/train/Philox.h's dropoutKeep with the [train] seed and the
 * trainer's step (rows past a length: 0). The same call applies the mask to a gradient. */
LM_API void lm_rt_dropout(const float *x, const int32_t *lengths, int64_t B, int64_t N, int64_t C, double rate,
                          int64_t site, float *out);
/* ABI 11: lm_rt_dropout on packed rows x [B, T, C] (lm-prune-loss-rows): row j of sentence b is the sentence's row
 * rows[b, j] for the mask (rows [B, T] from lm.target_rows; -1 or past the length: 0). */
LM_API void lm_rt_dropout_rows(const float *x, const int32_t *lengths, const int32_t *rows, int64_t B, int64_t T,
                               int64_t C, double rate, int64_t site, float *out);
/* Attention dropout on probabilities x [B, H, N, M]: element (b, h, i, j) as lm_rt_dropout's (sentence b H + h,
 * row i, feature j) (runtime/train/Philox.h); rows past a length: 0. */
LM_API void lm_rt_dropout_heads(const float *x, const int32_t *lengths, int64_t B, int64_t H, int64_t N, int64_t M,
                                double rate, int64_t site, float *out);
LM_API void lm_rt_softmax_grad(const float *dy, const float *y, int64_t rows, int64_t C, int32_t logarithmic,
                               float *dx);

/* Allocation of kernel temporaries (MLIR's generic memref allocation functions). Each thread
 * keeps the blocks it freed, by size, and hands them out again: a kernel called again with
 * the same shapes allocates nothing from the system (the runtime's per-call workspace). */
LM_API void *_mlir_memref_to_llvm_alloc(uint64_t size);
LM_API void *_mlir_memref_to_llvm_aligned_alloc(uint64_t alignment, uint64_t size);
LM_API void _mlir_memref_to_llvm_free(void *ptr);
/* How many blocks this thread's workspace cache has taken from the system so far (tests, benchmarks). */
LM_API uint64_t lm_rt_workspace_system_allocations(void);
/* Gives the calling thread's cached (freed) kernel temporaries back to the system; returns their bytes. The next
 * call allocates them again. Blocks in use and other threads' caches are untouched. */
LM_API uint64_t lm_rt_workspace_release(void);
/* The most bytes of kernel temporaries in use at once (all threads; the sizes the kernels asked for, which the
 * model's memory model bounds, not the capacity of the cached blocks holding them) since the last reset; reset != 0
 * starts a new measurement (tests, benchmarks, lmcc score --timing). */
LM_API uint64_t lm_rt_workspace_peak_bytes(int reset);

/* --- Text: BERT WordPiece tokenization (Hugging Face BertTokenizerFast-exact) --------------------
 * lm_tokenizer_load reads a WordPiece vocabulary (one token a line, id = line number - 1) and finds the
 * special tokens by their usual strings: [PAD], [UNK], [SOS] (else [CLS]) as bos, [EOS] (else [SEP]) as
 * eos, [MASK]. lowercase != 0: BERT uncased (lowercase, NFD, accents stripped). Errors (file, line) go
 * to lm_last_error(). A tokenizer is read-only after loading: calls may run concurrently. */
#ifndef LM_TOKENIZER_TYPE_DECLARED
#define LM_TOKENIZER_TYPE_DECLARED
typedef struct lm_tokenizer lm_tokenizer;
#endif
LM_API int lm_tokenizer_load(const char *vocab_path, int lowercase, lm_tokenizer **out);
/* Tokenizes len bytes (at most 2 GiB) of UTF-8 text as one sentence: bos, the WordPiece ids, eos. *n receives the
 * number of ids; when it exceeds capacity, nothing is written to ids and LM_ERR_ARGUMENT is returned
 * with *n set (call again with a larger buffer). Invalid UTF-8 is LM_ERR_ARGUMENT naming the byte offset. */
LM_API int lm_tokenize(const lm_tokenizer *tok, const char *utf8, size_t len, int32_t *ids, size_t capacity,
                       size_t *n);
/* The vocabulary entry of id (NUL-terminated, owned by the tokenizer), or NULL when id is out of range. */
LM_API const char *lm_token_piece(const lm_tokenizer *tok, int32_t id);
/* The number of vocabulary entries. */
LM_API int32_t lm_tokenizer_vocab_size(const lm_tokenizer *tok);
/* Frees a tokenizer (NULL is allowed); using it afterwards (a second free included) is undefined behaviour. */
LM_API void lm_tokenizer_free(lm_tokenizer *tok);
/* The same five functions under runtime names: every generated lib<name>.so re-exports lm_tokenizer_* as
 * forwarders to these (as lm_last_error), so that a program linked with -l<name> alone finds them. */
LM_API int lm_rt_tokenizer_load(const char *vocab_path, int lowercase, lm_tokenizer **out);
LM_API int lm_rt_tokenize(const lm_tokenizer *tok, const char *utf8, size_t len, int32_t *ids, size_t capacity,
                          size_t *n);
LM_API const char *lm_rt_token_piece(const lm_tokenizer *tok, int32_t id);
LM_API int32_t lm_rt_tokenizer_vocab_size(const lm_tokenizer *tok);
LM_API void lm_rt_tokenizer_free(lm_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif /* LMRT_H */
