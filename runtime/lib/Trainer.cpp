//===- Trainer.cpp - Compiled training: loss, gradients, optimizer steps, state files ===//
//
// The training half of liblmrt's C ABI (lmrt.h): the compiled `loss_grad` kernel computes the
// gradient of a whole batch in the weight buffer's layout; the trainer clips it and applies the
// optimizer (runtime/train/Optimizer.h) to the weights in place, then re-runs the init kernel so
// the packed GEMM copies and folded tables follow the new weights. The gradient step and the
// update are separate calls inside `step`, so an all-reduce of the gradient buffer can sit
// between them.
//
//===----------------------------------------------------------------------===//
#include "runtime/lib/Internal.h"
#include "runtime/lib/TrainKernels.h"
#include "runtime/train/Optimizer.h"
#include "runtime/weights/Format.h"
#include "runtime/weights/Safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using lmrt::detail::argument;
using lmrt::detail::nonFiniteResult;
using lmrt::detail::descNumel;
using lmrt::detail::descShape;
using lmrt::detail::Bound;
using lmrt::detail::runKernel;
using lmrt::detail::memref1;
using lmrt::detail::memref2;
using lmrt::detail::guardedCall;
using lmrt::detail::internal;

namespace {
/// A batch packed to [batch, n]: inputs padded with pad_id, targets with -1.
struct Packed {
  int64_t batch = 0, n = 0, targets = 0;
  std::vector<int32_t> inputs, target, lengths;
  std::vector<float> ce; ///< the loss kernel's per-row cross-entropy
};
/// Source/target pairs packed for the Diformer's loss kernels, and their outputs.
struct PackedPairs {
  lmrt::detail::PairBatch batch;
  std::vector<float> ce, lengthLp; ///< per target row; per pair
};
} // namespace

struct lm_trainer {
  lm_model *model = nullptr;
  std::unique_ptr<lmcc::train::Optimizer> optimizer;
  lmrt::detail::FloatBuffer grads; ///< the weight buffer's layout (the kernel writes every tensor's slot)
  Packed packed;            ///< the last step's batch (its buffers reused: a steady-state step allocates nothing)
  PackedPairs pairs;        ///< the same for a Diformer's steps
};

namespace {

void rerunInit(lm_model *m);

const lm_model_desc &trainable(const lm_model *m) {
  if (!m)
    argument("the model is NULL");
  if (m->desc->pair_score && m->desc->pair_loss_grad && m->desc->pair_loss && m->desc->train)
    return *m->desc; // a Diformer: trains on source/target pairs
  if (!m->desc->loss_grad || !m->desc->loss || !m->desc->train)
    argument("model " + lmcc::quoted(m->desc->name) + " was compiled without training entry points "
             "(lmcc compile --train)");
  return *m->desc;
}

/// Packs a batch into `p` (its buffers reused).
void pack(const lm_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths, int32_t batch,
          int32_t stride, Packed &p) {
  lmrt::detail::checkModelInputs(m, inputs, lengths, batch, stride);
  if (m->desc->pair_score)
    argument("model " + lmcc::quoted(m->desc->name) + " is a Diformer: it trains on source/target pairs (" +
             std::string(m->desc->name) + "_pair_loss_and_grad and _train_step_pairs; lm_rt_pair_loss_and_grad, "
             "lm_rt_train_step_pairs)");
  if (!targets)
    argument("targets is NULL");
  const lm_model_desc &d = *m->desc;
  p.batch = batch, p.n = 0, p.targets = 0;
  for (int32_t b = 0; b < batch; ++b)
    p.n = std::max<int64_t>(p.n, lengths[b]);
  p.inputs.assign(p.batch * p.n, d.pad_id);
  p.target.assign(p.batch * p.n, -1);
  p.lengths.assign(lengths, lengths + batch);
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t i = 0; i < lengths[b]; ++i) {
      const int64_t at = int64_t(b) * stride + i;
      const int32_t y = targets[at];
      if (y < -1 || y >= d.vocab)
        argument("targets[" + std::to_string(b) + "*stride+" + std::to_string(i) + "] = " + std::to_string(y) +
                 " is outside the vocabulary [0, " + std::to_string(d.vocab) + ") (-1: no target)");
      p.inputs[b * p.n + i] = inputs[at];
      p.target[b * p.n + i] = y;
      p.targets += y >= 0;
    }
  if (p.targets == 0)
    argument("the batch has no target (every target is -1)");
}

/// A non-finite loss of entry point `entry` (issue 21: LM_ERR_NONFINITE, the entry and the first bad batch row;
/// `perRow` loss terms a row in `terms`, then `extra` one more term a row, e.g. the length term).
[[noreturn]] void nonFiniteLoss(const char *entry, double loss, const std::vector<float> &terms, int64_t perRow,
                                const std::vector<float> *extra = nullptr) {
  int64_t row = -1;
  for (size_t i = 0; i < terms.size() && row < 0; ++i)
    if (!std::isfinite(terms[i]))
      row = int64_t(i) / perRow;
  for (size_t i = 0; extra && i < extra->size() && row < 0; ++i)
    if (!std::isfinite((*extra)[i]))
      row = int64_t(i);
  nonFiniteResult(std::string(entry) + ": the loss is not finite (" + lmcc::valueString(float(loss)) + ")" +
                  (row >= 0 ? "; first non-finite term in batch row " + std::to_string(row) : std::string()) +
                  "; the weights are left unchanged");
}

/// (1/T) sum ce ([rows, n]), summed in row order in double; an error when not finite.
double meanLoss(const char *entry, const std::vector<float> &ce, int64_t n, int64_t targets) {
  double sum = 0;
  for (float v : ce)
    sum += v;
  const double loss = sum / double(targets);
  if (!std::isfinite(loss))
    nonFiniteLoss(entry, loss, ce, n);
  return loss;
}

/// A non-finite gradient element of entry point `entry` (LM_ERR_NONFINITE; the gradient sums over the rows, so
/// it names the tensor and index).
[[noreturn]] void nonFiniteGradient(const char *entry, const lm_tensor_desc &t, int64_t k) {
  nonFiniteResult(std::string(entry) + ": the gradient of tensor " + lmcc::quoted(t.name) +
                  " is not finite at flat index " + std::to_string(k) + "; the weights are left unchanged");
}

/// Runs the loss_grad kernel on the packed batch into `grads` (the weight layout: it writes every tensor's slot); dropout
/// masks of training step `step`. `checkGrads`: reject a non-finite gradient here (a train step leaves
/// that to the optimizer, which checks before it changes anything).
double lossAndGrad(const char *entry, lm_model *m, Packed &p, float *grads, int64_t step, bool checkGrads) {
  const lm_model_desc &d = *m->desc;
  lmrt::setDropoutContext(uint64_t(d.train->seed), uint64_t(step));
  std::vector<float> &ce = p.ce;
  ce.assign(size_t(p.batch * p.n), 0.0f);
  lm_memref1f w = memref1(m->weights, d.total_floats), g = memref1(grads, d.total_floats);
  lm_memref2i in = memref2(p.inputs.data(), p.batch, p.n), tg = memref2(p.target.data(), p.batch, p.n);
  lm_memref1i len = memref1(p.lengths.data(), p.batch);
  lm_memref2f ceRef = memref2(ce.data(), p.batch, p.n);
  runKernel(entry, [&] { d.loss_grad(&w, &in, &tg, &len, &ceRef, &g); }, Bound::Held);
  const double loss = meanLoss(entry, ce, p.n, p.targets);
  for (int32_t i = 0; checkGrads && i < d.num_tensors; ++i) {
    const lm_tensor_desc &t = d.tensors[i];
    const float *slot = grads + t.offset;
    for (int64_t k = 0; k < descNumel(t); ++k)
      if (!std::isfinite(slot[k]))
        nonFiniteGradient(entry, t, k);
  }
  return loss;
}

/// The pair loss: sum ce / sum_b n_b + length_loss * mean_b(-length_logprob), in double in row order.
double pairLoss(const char *entry, const lm_model_desc &d, const std::vector<float> &ce,
                const std::vector<float> &lengthLp, int64_t n, const std::vector<int32_t> &tgtLengths, double *nll) {
  double tokens = 0, sum = 0, length = 0;
  for (int32_t n : tgtLengths)
    tokens += n;
  for (float v : ce)
    sum += v;
  for (float v : lengthLp)
    length -= v;
  const double loss = sum / tokens + d.length_loss * length / double(lengthLp.size());
  if (nll) {
    nll[0] = sum / tokens;
    nll[1] = length / double(lengthLp.size());
  }
  if (!std::isfinite(loss))
    nonFiniteLoss(entry, loss, ce, n, &lengthLp);
  return loss;
}

/// The pair_loss_grad kernel on checked pairs (packed into `p`) into `grads`; see lossAndGrad.
double pairLossAndGrad(const char *entry, lm_model *m, const int32_t *src, const int32_t *srcLengths, int32_t srcStride,
                       const int32_t *tgt, const int32_t *tgtLengths, int32_t tgtStride, const int32_t *dirs,
                       const uint32_t *hidden, int32_t batch, PackedPairs &packed, float *grads, bool checkGrads,
                       double *nll) {
  const lm_model_desc &d = *m->desc;
  if (!d.pair_loss_grad)
    argument("model " + lmcc::quoted(d.name) + " does not train on source/target pairs (only family \"diformer\" "
             "compiled with --train does)");
  lmrt::detail::checkPairInputs(m, src, srcLengths, srcStride, tgt, tgtLengths, tgtStride, dirs, hidden, batch);
  lmrt::detail::PairBatch &p = packed.batch;
  lmrt::detail::packPairs(p, &d, src, srcLengths, srcStride, tgt, tgtLengths, tgtStride, dirs, hidden, 0, batch);
  std::vector<float> &ce = packed.ce, &lengthLp = packed.lengthLp;
  ce.assign(size_t(p.rows * p.n), 0.0f);
  lengthLp.assign(size_t(p.rows), 0.0f);
  lm_memref1f w = memref1(m->weights, d.total_floats), g = memref1(grads, d.total_floats);
  lm_memref2i srcRef = p.srcRef(), tgtRef = p.tgtRef();
  lm_memref1i srcLenRef = p.srcLenRef(), tgtLenRef = p.tgtLenRef();
  lm_memref3i rowsRef = p.rowsRef();
  lm_memref2f ceRef = memref2(ce.data(), p.rows, p.n);
  lm_memref1f lenRef = memref1(lengthLp.data(), p.rows);
  runKernel(
      "train", [&] { d.pair_loss_grad(&w, &srcRef, &srcLenRef, &tgtRef, &tgtLenRef, &rowsRef, &ceRef, &lenRef, &g); },
      Bound::Held);
  const double loss = pairLoss(entry, d, ce, lengthLp, p.n, p.tgtLen, nll);
  for (int32_t i = 0; checkGrads && i < d.num_tensors; ++i) {
    const lm_tensor_desc &t = d.tensors[i];
    for (int64_t k = 0; k < descNumel(t); ++k)
      if (!std::isfinite(grads[t.offset + k]))
        nonFiniteGradient(entry, t, k);
  }
  return loss;
}

/// One optimizer step on the gradient in t->grads (the all-reduce point is before this call).
void applyStep(const char *entry, lm_trainer *t, double *lr, double *gradNorm) {
  lmcc::train::Optimizer::StepInfo info;
  try {
    info = t->optimizer->step(t->model->weights, t->grads.get());
  } catch (const lmcc::train::NonFiniteGradient &e) {
    nonFiniteResult(std::string(entry) + ": the gradient is not finite: " + e.what() +
                    "; the weights are left unchanged");
  } catch (const lmcc::train::NonFiniteUpdate &e) {
    nonFiniteResult(std::string(entry) + ": " + e.what() + "; the weights are left unchanged");
  }
  rerunInit(t->model);
  if (lr)
    *lr = info.lr;
  if (gradNorm)
    *gradNorm = info.gradNorm;
}

/// The gradient in the weight buffer's layout -> the packed layout (tensor after tensor, lm_rt_param_info).
void packGradient(const lm_model_desc &d, const float *grads, float *out) {
  for (int32_t i = 0; i < d.num_tensors; ++i) {
    const lm_tensor_desc &t = d.tensors[i];
    out = std::copy(grads + t.offset, grads + t.offset + descNumel(t), out);
  }
}

void rerunInit(lm_model *m) {
  if (m->desc->init) {
    lm_memref1f w = memref1(m->weights, m->desc->total_floats);
    runKernel("train", [&] { m->desc->init(&w); }, Bound::Unbounded);
  }
}

lmcc::WeightSet canonicalWeights(const lm_model *m) {
  lmcc::WeightSet out;
  const lm_model_desc &d = *m->desc;
  for (int32_t i = 0; i < d.num_tensors; ++i) {
    const lm_tensor_desc &t = d.tensors[i];
    lmcc::Tensor tensor;
    tensor.shape = descShape(t);
    tensor.data.assign(m->weights + t.offset, m->weights + t.offset + descNumel(t));
    out.tensors.emplace(t.name, std::move(tensor));
  }
  out.metadata["name"] = d.name;
  out.metadata["spec_hash"] = d.spec_hash ? d.spec_hash : "";
  return out;
}

lmcc::train::OptimizerConfig configOf(const lm_train_desc &t) {
  lmcc::train::OptimizerConfig c;
  c.kind = t.optimizer == 1 ? lmcc::train::OptimizerConfig::Adam
           : t.optimizer == 2 ? lmcc::train::OptimizerConfig::SGD
                              : lmcc::train::OptimizerConfig::AdamW;
  c.schedule = t.schedule == 1 ? lmcc::train::OptimizerConfig::Constant
               : t.schedule == 2 ? lmcc::train::OptimizerConfig::Cosine
                                 : lmcc::train::OptimizerConfig::Linear;
  c.lr = t.lr, c.beta1 = t.beta1, c.beta2 = t.beta2, c.eps = t.eps, c.weightDecay = t.weight_decay;
  c.warmupSteps = t.warmup_steps, c.totalSteps = t.steps, c.clipNorm = t.clip_norm;
  return c;
}

} // namespace

extern "C" {

int64_t lm_rt_num_params(const lm_model_desc *desc) {
  if (!desc)
    return -1;
  int64_t n = 0;
  for (int32_t i = 0; i < desc->num_tensors; ++i)
    n += descNumel(desc->tensors[i]);
  return n;
}

int lm_rt_param_info(const lm_model_desc *desc, int32_t index, const char **name, int64_t *offset, int64_t *count) {
  return guardedCall([&] {
    if (!desc)
      argument("the model descriptor is NULL");
    if (index < 0 || index >= desc->num_tensors)
      argument("parameter index " + std::to_string(index) + " is outside [0, " + std::to_string(desc->num_tensors) +
               ")");
    int64_t at = 0;
    for (int32_t i = 0; i < index; ++i)
      at += descNumel(desc->tensors[i]);
    if (name)
      *name = desc->tensors[index].name;
    if (offset)
      *offset = at;
    if (count)
      *count = descNumel(desc->tensors[index]);
  });
}

int lm_rt_loss_and_grad(lm_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                        int32_t batch, int32_t stride, float *loss, float *grad) {
  return guardedCall([&] {
    const lm_model_desc &d = trainable(m);
    Packed p;
    pack(m, inputs, targets, lengths, batch, stride, p);
    lmrt::detail::FloatBuffer grads = lmrt::detail::allocateFloats(d.total_floats);
    const double value = lossAndGrad("loss_and_grad", m, p, grads.get(), 0, /*checkGrads=*/true);
    if (grad)
      packGradient(d, grads.get(), grad);
    if (loss)
      *loss = float(value);
  });
}

int lm_rt_pair_loss_and_grad(lm_model *m, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                             const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                             const uint32_t *hidden, int32_t batch, float *loss, double nll[2], float *grad) {
  return guardedCall([&] {
    const lm_model_desc &d = trainable(m);
    lmrt::detail::FloatBuffer grads = lmrt::detail::allocateFloats(d.total_floats);
    PackedPairs packed;
    const double value = pairLossAndGrad("pair_loss_and_grad", m, src, src_lengths, src_stride, tgt, tgt_lengths,
                                         tgt_stride, dirs, hidden, batch, packed, grads.get(), /*checkGrads=*/true,
                                         nll);
    if (grad)
      packGradient(d, grads.get(), grad);
    if (loss)
      *loss = float(value);
  });
}

int lm_rt_train_step_pairs(lm_trainer *t, const int32_t *src, const int32_t *src_lengths, int32_t src_stride,
                           const int32_t *tgt, const int32_t *tgt_lengths, int32_t tgt_stride, const int32_t *dirs,
                           const uint32_t *hidden, int32_t batch, float *loss, double nll[2], double *lr,
                           double *gradNorm) {
  return guardedCall([&] {
    if (!t)
      argument("the trainer is NULL");
    const double value = pairLossAndGrad("train_step_pairs", t->model, src, src_lengths, src_stride, tgt, tgt_lengths,
                                         tgt_stride, dirs, hidden, batch, t->pairs, t->grads.get(),
                                         /*checkGrads=*/false, nll);
    // <- a data-parallel run would all-reduce t->grads here.
    applyStep("train_step_pairs", t, lr, gradNorm);
    if (loss)
      *loss = float(value);
  });
}

int lm_rt_loss(lm_model *m, const int32_t *inputs, const int32_t *targets, const int32_t *lengths, int32_t batch,
               int32_t stride, float *loss, int64_t *targetsOut) {
  return guardedCall([&] {
    const lm_model_desc &d = trainable(m);
    Packed p;
    pack(m, inputs, targets, lengths, batch, stride, p);
    std::vector<float> &ce = p.ce;
    ce.assign(size_t(p.batch * p.n), 0.0f);
    lm_memref1f w = memref1(m->weights, d.total_floats);
    lm_memref2i in = memref2(p.inputs.data(), p.batch, p.n), tg = memref2(p.target.data(), p.batch, p.n);
    lm_memref1i len = memref1(p.lengths.data(), p.batch);
    lm_memref2f ceRef = memref2(ce.data(), p.batch, p.n);
    runKernel("train", [&] { d.loss(&w, &in, &tg, &len, &ceRef); }, Bound::Held);
    const double value = meanLoss("loss", ce, p.n, p.targets);
    if (loss)
      *loss = float(value);
    if (targetsOut)
      *targetsOut = p.targets;
  });
}

int lm_rt_trainer_new(lm_model *m, lm_trainer **out) { return lm_rt_trainer_new_ex(m, nullptr, out); }

int lm_rt_trainer_new_ex(lm_model *m, const lm_train_desc *settings, lm_trainer **out) {
  return guardedCall([&] {
    const lm_model_desc &d = trainable(m);
    if (!out)
      argument("out is NULL");
    if (!settings)
      settings = d.train;
    if (settings->label_smoothing != d.train->label_smoothing)
      argument("label_smoothing " + std::to_string(settings->label_smoothing) + " differs from the compiled " +
               std::to_string(d.train->label_smoothing) + " (it is part of the loss kernels)");
    if (m->owned == nullptr)
      argument("model " + lmcc::quoted(d.name) + " uses its embedded weights in place; load it from a file to train");
    std::vector<lmcc::train::ParamSlot> slots;
    for (int32_t i = 0; i < d.num_tensors; ++i)
      slots.push_back({d.tensors[i].name, descShape(d.tensors[i]), d.tensors[i].offset});
    auto t = std::make_unique<lm_trainer>();
    t->model = m;
    try {
      t->optimizer = std::make_unique<lmcc::train::Optimizer>(configOf(*settings), std::move(slots));
    } catch (const std::invalid_argument &e) {
      argument(std::string("optimizer settings: ") + e.what());
    }
    t->optimizer->setParallel([](int64_t n, lmcc::FunctionRef<void(int64_t)> body) {
      lm_rt_parallel_for(
          n,
          [](void *ctx, int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i)
              (*static_cast<const lmcc::FunctionRef<void(int64_t)> *>(ctx))(i);
          },
          &body);
    });
    t->grads = lmrt::detail::allocateFloats(d.total_floats);
    *out = t.release();
  });
}

int lm_rt_train_step_ex(lm_trainer *t, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                        int32_t batch, int32_t stride, float *loss, double *lr, double *gradNorm) {
  return guardedCall([&] {
    if (!t)
      argument("the trainer is NULL");
    Packed &p = t->packed;
    pack(t->model, inputs, targets, lengths, batch, stride, p);
    const double value =
        lossAndGrad("train_step", t->model, p, t->grads.get(), t->optimizer->steps(), /*checkGrads=*/false);
    // <- a data-parallel run would all-reduce t->grads here.
    applyStep("train_step", t, lr, gradNorm);
    if (loss)
      *loss = float(value);
  });
}

int lm_rt_train_step(lm_trainer *t, const int32_t *inputs, const int32_t *targets, const int32_t *lengths,
                     int32_t batch, int32_t stride, float *loss) {
  return lm_rt_train_step_ex(t, inputs, targets, lengths, batch, stride, loss, nullptr, nullptr);
}

int64_t lm_rt_trainer_steps(const lm_trainer *t) { return t ? t->optimizer->steps() : -1; }

int lm_rt_trainer_save(lm_trainer *t, const char *path) {
  return guardedCall([&] {
    if (!t)
      argument("the trainer is NULL");
    if (!path)
      argument("path is NULL");
    lmcc::WeightSet state = canonicalWeights(t->model);
    t->optimizer->saveState(state);
    // The RNG (issue 14: weights + moments + step + RNG): counter-based (Philox), every draw keyed by the [train]
    // seed and the step, so its whole state is the seed beside optimizer.step.
    state.metadata["rng.generator"] = "philox4x32-10 keyed by ([train] seed, step)";
    state.metadata["rng.seed"] = std::to_string(t->model->desc->train->seed);
    lmcc::writeSafetensors(path, state);
  });
}

int lm_rt_trainer_load(lm_trainer *t, const char *path) {
  return guardedCall([&] {
    if (!t)
      argument("the trainer is NULL");
    if (!path)
      argument("path is NULL");
    const lm_model_desc &d = *t->model->desc;
    lmcc::WeightSet state = lmcc::readSafetensors(path);
    auto hash = state.metadata.find("spec_hash");
    if (d.spec_hash && hash != state.metadata.end() && hash->second != d.spec_hash)
      throw lmcc::WeightError(std::string(path) + ": trainer state of spec hash " + hash->second + ", the model's is " +
                              d.spec_hash);
    // Check every weight before changing anything, then the optimizer state (which checks itself).
    for (int32_t i = 0; i < d.num_tensors; ++i) {
      const lm_tensor_desc &desc = d.tensors[i];
      if (!state.has(desc.name))
        throw lmcc::WeightError(std::string(path) + ": tensor " + lmcc::quoted(desc.name) + ": missing");
      const lmcc::Tensor &tensor = state.get(desc.name);
      if (tensor.shape != descShape(desc))
        throw lmcc::WeightError(std::string(path) + ": tensor " + lmcc::quoted(desc.name) + ": wrong shape " +
                                lmcc::shapeString(tensor.shape) + ", expected " + lmcc::shapeString(descShape(desc)));
      for (float v : tensor.data)
        if (!std::isfinite(v))
          throw lmcc::WeightError(std::string(path) + ": tensor " + lmcc::quoted(desc.name) + ": non-finite value");
    }
    try {
      t->optimizer->loadState(state);
    } catch (const lmcc::WeightError &e) { // "optimizer state: ...": the file it came from first
      throw lmcc::WeightError(std::string(path) + ": " + e.what());
    }
    for (int32_t i = 0; i < d.num_tensors; ++i) {
      const lmcc::Tensor &tensor = state.get(d.tensors[i].name);
      std::copy(tensor.data.begin(), tensor.data.end(), t->model->weights + d.tensors[i].offset);
    }
    rerunInit(t->model);
  });
}

int lm_rt_save_weights(lm_model *m, const char *path) {
  return guardedCall([&] {
    if (!m)
      argument("the model is NULL");
    if (!path)
      argument("path is NULL");
    lmcc::writeSafetensors(path, canonicalWeights(m));
  });
}

void lm_rt_trainer_free(lm_trainer *t) { delete t; }

} // extern "C"
