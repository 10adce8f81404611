//===- Diformer.h - lmcc's Diformer commands (score, grad, train, translate) -===//
//
// The Diformer family scores, trains and translates through its compiled library (lm_rt_score_pairs,
// lm_rt_train_step_pairs, lm_rt_translate) or the reference executor (runtime/reference/Diformer*): these
// entry points read the family's inputs (SRC ||| TGT ||| DIRS [||| HIDE] lines, {src, tgt,
// dirs, hide} batches) and print lmcc's JSON formats. Errors are std::invalid_argument naming
// the file and line.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "frontend/Spec.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace lmcc {
class Tokenizer;
}

namespace lmcc::cli {

struct CompiledModel;
/// `lmcc score` for family diformer: one JSON object per line, with "length_logprob"; through the compiled
/// library's lm_rt_score_pairs when `compiled` is given, else on the reference executor.
int diformerScore(const ModelSpec &spec, const std::string &weights, const std::string &input, const Tokenizer *tok,
                  int threads, CompiledModel *compiled = nullptr);
/// `lmcc grad` for family diformer: {"src","tgt","dirs","hide"} batch -> gradients, prints loss; through the
/// library compiled with --train (lm_rt_pair_loss_and_grad) when `compiled` is given, else the reference.
int diformerGrad(const ModelSpec &spec, const std::string &weights, const std::string &batch, const std::string &out,
                 int threads, CompiledModel *compiled = nullptr);
/// Builds the library compiled with --train loaded with the weights at a path (lmcc train's compiled path).
using CompileFn = std::function<std::unique_ptr<CompiledModel>(const std::string &weightsPath)>;
/// `lmcc train` for family diformer: batches {"src","tgt"[,"dirs","hide"]} per line, cycled; rows
/// without "dirs" are drawn by the directional objective (Philox, [train] seed, the step). Results do
/// not depend on `threads`. With `compile`: the compiled trainer (lm_rt_train_step_pairs), else the reference.
int diformerTrain(const ModelSpec &spec, const std::string &weights, const std::string &batches,
                  const std::string &outDir, int64_t steps, int64_t saveEvery, int threads,
                  const CompileFn &compile = nullptr);

struct TranslateOptions {
  std::string mode = "l2r";
  int beam = 4, lengthBeam = 5, iterations = 10;
  bool rerank = false;
};
/// `lmcc translate`: one source per line (ids, or text with the tokenizer) -> one JSON object
/// {"ids":[...],"score":S,"candidates":K,"ms":T} (and "text" with a tokenizer); through the compiled library's
/// lm_rt_translate when `compiled` is given, else on the reference executor (the same search).
int diformerTranslate(const ModelSpec &spec, const std::string &weights, const std::string &input,
                      const Tokenizer *tok, const TranslateOptions &options, CompiledModel *compiled = nullptr);

} // namespace lmcc::cli
