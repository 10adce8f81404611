//===- Optimizer.h - AdamW / Adam / SGD with clipping and HF schedules ----===//
//
// The optimizer of compiled training (issue 14), spec-free so that liblmrt can link it:
// its settings are a plain OptimizerConfig (the trainer fills it from the spec's [train]
// table), its parameters one flat float buffer described by ParamSlots.
//
// Semantics are torch's (the fixtures in tests/golden/train_fixtures come from torch.optim):
//   * clipping: torch.nn.utils.clip_grad_norm_: norm = global L2 norm of all gradients;
//     coef = clipNorm / (norm + 1e-6); gradients *= coef when coef < 1 (clipNorm 0 = off);
//   * update s (0-based, s = steps() before the call) uses lr_s = lr * scheduleFactor(s),
//     Hugging Face's get_{linear,constant,cosine}_schedule_with_warmup (cosine: num_cycles 0.5,
//     which rises again past totalSteps, as HF's does); with warm-up the first update has lr 0
//     but still advances the moments and the step count;
//   * AdamW (torch.optim.AdamW): on tensors of rank >= 2, p *= 1 - lr_s wd; then with
//     t = s + 1: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//     p -= (lr_s / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps);
//   * Adam (torch.optim.Adam): coupled L2, g += wd p on rank >= 2 tensors, then the same moments
//     and update without the decoupled decay;
//   * SGD (torch.optim.SGD, no momentum): p -= lr_s (g + wd p), wd on rank >= 2 tensors only.
// Rank-1 tensors (biases, norms) never get weight decay. A tensor whose gradient is zero (the
// batch did not reach it) is still decayed and its moments still decay.
// Element updates are computed in double and rounded to float (moments are stored as float,
// as torch's state is). Sequential, fixed order: deterministic, no threads.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/weights/Safetensors.h"

#include <cstdint>
#include "runtime/train/FunctionRef.h"

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lmcc::train {

struct OptimizerConfig {
  enum Kind { AdamW, Adam, SGD } kind = AdamW;
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weightDecay = 0.01;
  int64_t warmupSteps = 0, totalSteps = 1000;
  enum Sched { Linear, Constant, Cosine } schedule = Linear;
  double clipNorm = 1.0;  ///< global L2 norm; 0 = off
};

/// One tensor in the flat parameter (and gradient) buffer.
struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  ///< in floats
};

/// A gradient holding NaN or inf: step() throws it before changing anything.
struct NonFiniteGradient : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// An update that would make a weight inf or NaN (a finite gradient times a huge lr): step() throws it before
/// changing anything.
struct NonFiniteUpdate : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Optimizer {
public:
  /// Throws std::invalid_argument for a bad setting (lr < 0, betas outside [0, 1), eps <= 0,
  /// wd < 0, warmupSteps < 0, totalSteps < 1, clipNorm < 0, any non-finite) or bad slots
  /// (empty or duplicate name, negative dimension or offset, overlapping slots).
  Optimizer(OptimizerConfig config, std::vector<ParamSlot> slots);

  /// Hugging Face's schedule factor of update s (0-based).
  double scheduleFactor(int64_t s) const;
  /// Global L2 norm of the gradients: double accumulation, slots in order, elements in order.
  double gradNorm(const float *grads) const;

  struct StepInfo {
    double lr;        ///< the learning rate this update used (lr x scheduleFactor)
    double gradNorm;  ///< the pre-clip global norm
  };
  /// Clips `grads` in place, then updates `params` in place; advances steps(). Both buffers hold
  /// at least numFloats() floats laid out by the slots. Throws NonFiniteGradient (naming the
  /// tensor) when a gradient is NaN/inf, leaving params, grads, moments and steps() unchanged.
  StepInfo step(float *params, float *grads);

  /// Updates done so far.
  int64_t steps() const { return steps_; }
  /// Runs body(i) for i in [0, n), possibly in parallel (liblmrt passes its thread arena). Work is cut
  /// into fixed chunks of at most kChunk elements of one tensor whatever runs them, and the norm's
  /// per-chunk partial sums are added in chunk order: results do not depend on the thread count.
  using ParallelFor = std::function<void(int64_t n, FunctionRef<void(int64_t)> body)>;
  void setParallel(ParallelFor parallel) { parallel_ = std::move(parallel); }
  static constexpr int64_t kChunk = 1 << 16;
  const OptimizerConfig &config() const { return config_; }
  const std::vector<ParamSlot> &slots() const { return slots_; }
  /// Floats a flat buffer needs: max over slots of offset + numel.
  int64_t numFloats() const { return numFloats_; }

  /// Adds the state to `out` (existing entries are kept; the names cannot collide with
  /// canonical weight names): for Adam/AdamW the tensors "optimizer.exp_avg.<name>" and
  /// "optimizer.exp_avg_sq.<name>" per slot (torch's state names), and the metadata
  /// "optimizer.kind" ("adamw" | "adam" | "sgd") and "optimizer.step" (decimal steps()).
  void saveState(WeightSet &out) const;
  /// Restores what saveState wrote. Checks the kind, the step count, every moment tensor's
  /// presence, shape and values (finite; exp_avg_sq >= 0) and that no other "optimizer.*"
  /// tensor is present; throws WeightError naming the tensor (or metadata key) and leaves the
  /// optimizer unchanged on error.
  void loadState(const WeightSet &in);

  /// Metadata keys and tensor name prefixes of the saved state.
  static constexpr const char *kKindKey = "optimizer.kind";
  static constexpr const char *kStepKey = "optimizer.step";
  static constexpr const char *kExpAvgPrefix = "optimizer.exp_avg.";
  static constexpr const char *kExpAvgSqPrefix = "optimizer.exp_avg_sq.";

private:
  bool hasMoments() const { return config_.kind != OptimizerConfig::SGD; }

  OptimizerConfig config_;
  std::vector<ParamSlot> slots_;
  std::vector<int64_t> numel_;  ///< per slot
  int64_t numFloats_ = 0;
  std::vector<float> expAvg_, expAvgSq_;  ///< flat, same layout as params (Adam/AdamW only)
  struct Chunk {
    size_t slot;
    int64_t begin, end; ///< elements of that slot
  };
  std::vector<Chunk> chunks_;
  ParallelFor parallel_;
  mutable std::vector<double> partial_; ///< gradNorm's per-chunk sums (sized once: a step allocates nothing)
  mutable std::vector<float> partialAbs_; ///< step's per-chunk sums of |weight| (inf or NaN when one is not finite)
  /// Bounds on every |exp_avg| and exp_avg_sq element: the largest loaded (loadState), grown by each step's
  /// largest clipped gradient (a moment is a weighted mean of its old value and the gradient). With the weights'
  /// and gradients' magnitudes they bound every update, so that step() looks for an update that overflows (a
  /// pass over weights, gradients and moments) only when the bound does not exclude one.
  double momentBound_ = 0, squareBound_ = 0;
  /// Sum of |params| over every slot (NaN or inf when a weight is not finite), with the gradient's norm.
  double gradNormAndWeightSum(const float *params, const float *grads, double *weightSum) const;
  void forEachChunk(FunctionRef<void(const Chunk &)> body) const;
  int64_t steps_ = 0;
};

/// "adamw" | "adam" | "sgd".
const char *kindName(OptimizerConfig::Kind kind);

} // namespace lmcc::train
