//===- Optimizer.cpp - AdamW / Adam / SGD with clipping and HF schedules --===//

#include "runtime/train/Optimizer.h"

#include "runtime/weights/Format.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <type_traits>
#include <limits>
#include <set>
#include <utility>

namespace lmcc::train {

namespace {

[[noreturn]] void badConfig(const std::string &what) {
  throw std::invalid_argument("optimizer: " + what);
}

[[noreturn]] void stateError(const std::string &what) {
  throw WeightError("optimizer state: " + what);
}

bool finite(double v) { return std::isfinite(v); }

constexpr double kPi = 3.14159265358979323846;

} // namespace

const char *kindName(OptimizerConfig::Kind kind) {
  switch (kind) {
  case OptimizerConfig::AdamW: return "adamw";
  case OptimizerConfig::Adam: return "adam";
  case OptimizerConfig::SGD: return "sgd";
  }
  return "?";
}

Optimizer::Optimizer(OptimizerConfig config, std::vector<ParamSlot> slots)
    : config_(config), slots_(std::move(slots)) {
  const OptimizerConfig &c = config_;
  if (c.kind != OptimizerConfig::AdamW && c.kind != OptimizerConfig::Adam && c.kind != OptimizerConfig::SGD)
    badConfig("unknown kind");
  if (c.schedule != OptimizerConfig::Linear && c.schedule != OptimizerConfig::Constant &&
      c.schedule != OptimizerConfig::Cosine)
    badConfig("unknown schedule");
  if (!finite(c.lr) || c.lr < 0)
    badConfig("lr must be a finite number >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1) || !(c.beta2 >= 0 && c.beta2 < 1))
    badConfig("betas must be in [0, 1)");
  if (!finite(c.eps) || !(c.eps > 0))
    badConfig("eps must be a finite number > 0");
  if (!finite(c.weightDecay) || c.weightDecay < 0)
    badConfig("weight decay must be a finite number >= 0");
  if (c.warmupSteps < 0)
    badConfig("warm-up steps must be >= 0");
  if (c.totalSteps < 1)
    badConfig("total steps must be >= 1");
  if (!finite(c.clipNorm) || c.clipNorm < 0)
    badConfig("clip norm must be a finite number >= 0 (0 = off)");

  std::set<std::string> names;
  std::vector<std::pair<int64_t, size_t>> byOffset;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot &p = slots_[i];
    if (p.name.empty())
      badConfig("a slot has an empty name");
    if (!names.insert(p.name).second)
      badConfig("tensor " + quoted(p.name) + ": duplicate slot");
    if (p.offset < 0)
      badConfig("tensor " + quoted(p.name) + ": negative offset");
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d < 0)
        badConfig("tensor " + quoted(p.name) + ": negative dimension in " + shapeString(p.shape));
      if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
        badConfig("tensor " + quoted(p.name) + ": too many elements");
      n *= d;
    }
    if (p.offset > std::numeric_limits<int64_t>::max() - n)
      badConfig("tensor " + quoted(p.name) + ": offset + size overflows");
    numel_.push_back(n);
    numFloats_ = std::max(numFloats_, p.offset + n);
    byOffset.push_back({p.offset, i});
  }
  std::sort(byOffset.begin(), byOffset.end());
  for (size_t k = 1; k < byOffset.size(); ++k) {
    size_t a = byOffset[k - 1].second, b = byOffset[k].second;
    if (slots_[a].offset + numel_[a] > slots_[b].offset && numel_[a] > 0 && numel_[b] > 0)
      badConfig("tensors " + quoted(slots_[a].name) + " and " + quoted(slots_[b].name) + " overlap");
  }
  if (hasMoments()) {
    expAvg_.assign(static_cast<size_t>(numFloats_), 0.0f);
    expAvgSq_.assign(static_cast<size_t>(numFloats_), 0.0f);
  }
  for (size_t i = 0; i < slots_.size(); ++i)
    for (int64_t b = 0; b < numel_[i]; b += kChunk)
      chunks_.push_back({i, b, std::min(numel_[i], b + kChunk)});
  partial_.assign(chunks_.size(), 0.0); // every chunk writes its own entry
  partialAbs_.assign(chunks_.size(), 0.0f);
}

double Optimizer::scheduleFactor(int64_t s) const {
  // transformers.optimization: _get_{linear,constant,cosine}_schedule_with_warmup_lr_lambda
  const int64_t w = config_.warmupSteps, total = config_.totalSteps;
  if (s < w)
    return static_cast<double>(s) / static_cast<double>(std::max<int64_t>(1, w));
  switch (config_.schedule) {
  case OptimizerConfig::Constant:
    return 1.0;
  case OptimizerConfig::Linear:
    return std::max(0.0, static_cast<double>(total - s) / static_cast<double>(std::max<int64_t>(1, total - w)));
  case OptimizerConfig::Cosine: {
    const double numCycles = 0.5;
    double progress = static_cast<double>(s - w) / static_cast<double>(std::max<int64_t>(1, total - w));
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * numCycles * 2.0 * progress)));
  }
  }
  return 0.0;
}

void Optimizer::forEachChunk(FunctionRef<void(const Chunk &)> body) const {
  if (parallel_)
    parallel_(int64_t(chunks_.size()), [&](int64_t c) { body(chunks_[size_t(c)]); });
  else
    for (const Chunk &c : chunks_)
      body(c);
}

double Optimizer::gradNorm(const float *grads) const {
  double unused = 0;
  return gradNormAndWeightSum(grads, grads, &unused);
}

double Optimizer::gradNormAndWeightSum(const float *params, const float *grads, double *weightSum) const {
  std::vector<double> &partial = partial_;
  std::vector<float> &partialAbs = partialAbs_;
  forEachChunk([&](const Chunk &c) {
    const float *g = grads + slots_[c.slot].offset, *p = params + slots_[c.slot].offset;
    // Eight running sums of squares (element k into sum k % 8, so that the loop vectorizes), added in order at the
    // end; and |p| summed in float: only a bound, so the order does not matter, and inf or NaN carries through.
    double sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float abs[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = c.begin;
    for (; k + 8 <= c.end; k += 8)
      for (int i = 0; i < 8; ++i) {
        sums[i] += static_cast<double>(g[k + i]) * static_cast<double>(g[k + i]);
        abs[i] += std::fabs(p[k + i]);
      }
    for (; k < c.end; ++k) {
      sums[(k - c.begin) % 8] += static_cast<double>(g[k]) * static_cast<double>(g[k]);
      abs[(k - c.begin) % 8] += std::fabs(p[k]);
    }
    double sum = 0.0;
    float total = 0.0f;
    for (int i = 0; i < 8; ++i)
      sum += sums[i], total += abs[i];
    partial[size_t(&c - chunks_.data())] = sum;
    partialAbs[size_t(&c - chunks_.data())] = total;
  });
  double sum = 0.0, total = 0.0;
  for (size_t i = 0; i < partial.size(); ++i)
    sum += partial[i], total += static_cast<double>(partialAbs[i]);
  *weightSum = total;
  return std::sqrt(sum);
}

namespace {
std::string numberText(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", x);
  return text;
}
} // namespace

Optimizer::StepInfo Optimizer::step(float *params, float *grads) {
  // Nothing changes unless every gradient is finite. The norm (a double sum of float squares, which cannot
  // overflow) is finite exactly when every element is; only then is the first bad element looked for.
  StepInfo info;
  double weightSum = 0;
  info.gradNorm = gradNormAndWeightSum(params, grads, &weightSum);
  if (!std::isfinite(info.gradNorm))
    for (size_t i = 0; i < slots_.size(); ++i) {
      const float *g = grads + slots_[i].offset;
      for (int64_t k = 0; k < numel_[i]; ++k)
        if (!std::isfinite(g[k]))
          throw NonFiniteGradient("tensor " + quoted(slots_[i].name) + ": gradient element " + std::to_string(k) +
                                  " is " + valueString(g[k]));
    }
  double coef = 1.0;
  if (config_.clipNorm > 0)
    coef = std::min(1.0, config_.clipNorm / (info.gradNorm + 1e-6));
  const bool clip = coef < 1.0;
  const double lr = config_.lr * scheduleFactor(steps_);
  info.lr = lr;
  const double wd = config_.weightDecay;
  const double b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const double t = static_cast<double>(steps_ + 1);
  const double bc1 = 1.0 - std::pow(b1, t), bc2Sqrt = std::sqrt(1.0 - std::pow(b2, t));
  const double stepSize = lr / bc1;
  const bool decoupled = config_.kind == OptimizerConfig::AdamW, sgd = config_.kind == OptimizerConfig::SGD;

  // The update of chunk c, stored (kStore) or only computed: returns the first element it makes non-finite (a
  // huge lr overflows float: the weights were saved as inf or NaN), else -1. Both passes compute every element
  // the same way, so nothing is stored unless every updated weight is finite.
  auto chunkUpdate = [&](const Chunk &c, auto store) -> int64_t {
    constexpr bool kStore = decltype(store)::value;
    const ParamSlot &slot = slots_[c.slot];
    float *p = params + slot.offset;
    float *g = grads + slot.offset;
    const auto clipOf = [=](float x) { return clip ? static_cast<float>(static_cast<double>(x) * coef) : x; };
    const auto clipped = [&](int64_t k) { return clipOf(g[k]); };
    if (sgd) {
      const bool decay = slot.shape.size() >= 2;
      for (int64_t k = c.begin; k < c.end; ++k) {
        const float gk = clipped(k);
        double d = static_cast<double>(gk);
        if (decay)
          d += wd * static_cast<double>(p[k]);
        const float pk = static_cast<float>(static_cast<double>(p[k]) - lr * d);
        if constexpr (kStore)
          g[k] = gk, p[k] = pk;
        else if (!std::isfinite(pk))
          return k;
      }
      return int64_t(-1);
    }
    const bool decay = slot.shape.size() >= 2 && wd != 0.0;
    float *m = const_cast<float *>(expAvg_.data()) + slot.offset;
    float *v = const_cast<float *>(expAvgSq_.data()) + slot.offset;
    // float arithmetic in torch's order (lerp_, mul_/addcmul_, sqrt/div/add, addcdiv_), with the scalars
    // rounded once: the loop vectorizes, and it is what torch computes.
    const float shrink = static_cast<float>(1.0 - lr * wd), wdf = static_cast<float>(wd);
    const float w1 = static_cast<float>(1.0 - b1), b2f = static_cast<float>(b2), w2 = static_cast<float>(1.0 - b2);
    const float bc2f = static_cast<float>(bc2Sqrt), epsf = static_cast<float>(eps);
    const float step = static_cast<float>(stepSize);
    // One loop per decay mode, on restrict pointers, so that the compiler vectorizes it (sqrt and division
    // are correctly rounded: the same numbers as one element at a time); the stored pass writes the clipped
    // gradient back in the same loop when clipping changed it (kClip), and leaves it alone otherwise (a 4-byte
    // store a parameter less: the same numbers).
    auto update = [&](auto mode, auto clipping) {
      constexpr int kMode = decltype(mode)::value; // 0: no decay, 1: decoupled (AdamW), 2: L2 (Adam)
      constexpr bool kClip = decltype(clipping)::value;
      float *__restrict pp = p + c.begin;
      float *__restrict gp = g + c.begin;
      float *__restrict mp = m + c.begin;
      float *__restrict vp = v + c.begin;
      const int64_t n = c.end - c.begin;
      // An element's moments (m, v: old in, new out) and its next weight, from its weight and gradient (values
      // only: the loops below keep their restrict pointers, and vectorize).
      const auto advance = [=](float pk, float gk, float &m, float &v) {
        if constexpr (kMode == 1)
          pk *= shrink;   // torch.optim.AdamW: decay before the update
        if constexpr (kMode == 2)
          gk += wdf * pk; // torch.optim.Adam: L2 added to the gradient
        m = m + w1 * (gk - m);
        v = b2f * v + w2 * gk * gk;
        return pk - step * (m / (std::sqrt(v) / bc2f + epsf));
      };
      bool finite = true;
      for (int64_t k = 0; k < n; ++k) {
        float mk = mp[k], vk = vp[k];
        const float gk = kClip ? clipOf(gp[k]) : gp[k];
        const float next = advance(pp[k], gk, mk, vk);
        if constexpr (kStore) {
          mp[k] = mk, vp[k] = vk, pp[k] = next;
          if constexpr (kClip)
            gp[k] = gk;
        } else
          finite &= std::isfinite(next);
      }
      for (int64_t k = 0; !finite && k < n; ++k) { // the first non-finite one, for the message
        float mk = mp[k], vk = vp[k];
        if (!std::isfinite(advance(pp[k], clipped(c.begin + k), mk, vk)))
          return c.begin + k;
      }
      return int64_t(-1);
    };
    const auto withClip = [&](auto mode) {
      return clip ? update(mode, std::true_type{}) : update(mode, std::false_type{});
    };
    if (!decay)
      return withClip(std::integral_constant<int, 0>{});
    if (decoupled)
      return withClip(std::integral_constant<int, 1>{});
    return withClip(std::integral_constant<int, 2>{});
  };
  // Whether an update can overflow, bounded from the magnitudes (relative slack far above float rounding): a weight
  // |p| <= weightSum, a clipped gradient |g| <= gradNorm * coef, a moment |m| <= momentBound_ and a denominator
  // sqrt(v) / bc2 + eps >= eps, so |next| <= |p| max(1, 1 - lr wd) + lr / bc1 |m| / eps (AdamW; Adam adds wd |p| to
  // the gradient, SGD takes lr (|g| + wd |p|)). Only when the bound reaches the float range (or a weight is not
  // finite: weightSum is then inf or NaN) is every update computed first to find the one that overflows.
  const double gradBound = info.gradNorm * coef * (1 + 1e-6);
  const double decayedGrad = config_.kind == OptimizerConfig::AdamW ? gradBound : gradBound + wd * weightSum;
  const double momentBound = std::max(momentBound_, decayedGrad) * (1 + 1e-6);
  const double squareBound = std::max(squareBound_, decayedGrad * decayedGrad) * (1 + 1e-6);
  const double epsFloat = static_cast<float>(eps); // what the update divides by: 0 for an eps under float's range
  const double updateBound =
      sgd ? weightSum + lr * decayedGrad
          : weightSum * std::max(1.0, std::fabs(1.0 - lr * wd)) + std::fabs(stepSize) * momentBound / epsFloat;
  // The float scalars of the update must be finite (an lr past the float range times a zero moment is NaN), and eps
  // must not round to 0 (a zero moment over a zero denominator).
  const double floatMax = double(std::numeric_limits<float>::max());
  const bool mayOverflow = !(updateBound * 2 < floatMax && squareBound < floatMax && std::fabs(stepSize) < floatMax &&
                             std::fabs(1.0 - lr * wd) < floatMax && wd < floatMax && (sgd || epsFloat > 0));
  std::atomic<bool> overflows{false};
  if (mayOverflow)
    forEachChunk([&](const Chunk &c) {
      if (chunkUpdate(c, std::false_type{}) >= 0)
        overflows.store(true, std::memory_order_relaxed);
    });
  if (overflows.load())
    for (const Chunk &c : chunks_)
      if (const int64_t k = chunkUpdate(c, std::false_type{}); k >= 0)
        throw NonFiniteUpdate("the update makes tensor " + quoted(slots_[c.slot].name) + " element " +
                              std::to_string(k) + " non-finite at lr = " + numberText(lr) +
                              " (float overflows: lower [train] lr)");
  forEachChunk([&](const Chunk &c) { chunkUpdate(c, std::true_type{}); });
  momentBound_ = momentBound, squareBound_ = squareBound;
  ++steps_;
  return info;
}

void Optimizer::saveState(WeightSet &out) const {
  out.metadata[kKindKey] = kindName(config_.kind);
  out.metadata[kStepKey] = std::to_string(steps_);
  if (!hasMoments())
    return;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot &p = slots_[i];
    auto begin = static_cast<size_t>(p.offset), end = begin + static_cast<size_t>(numel_[i]);
    Tensor m, v;
    m.shape = v.shape = p.shape;
    m.data.assign(expAvg_.begin() + begin, expAvg_.begin() + end);
    v.data.assign(expAvgSq_.begin() + begin, expAvgSq_.begin() + end);
    out.tensors[kExpAvgPrefix + p.name] = std::move(m);
    out.tensors[kExpAvgSqPrefix + p.name] = std::move(v);
  }
}

void Optimizer::loadState(const WeightSet &in) {
  auto kind = in.metadata.find(kKindKey);
  if (kind == in.metadata.end())
    stateError(std::string("metadata ") + quoted(kKindKey) + ": missing");
  if (kind->second != kindName(config_.kind))
    stateError(std::string("metadata ") + quoted(kKindKey) + ": \"" + kind->second + "\", but this optimizer is \"" +
               kindName(config_.kind) + "\"");
  auto stepIt = in.metadata.find(kStepKey);
  if (stepIt == in.metadata.end())
    stateError(std::string("metadata ") + quoted(kStepKey) + ": missing");
  const std::string &text = stepIt->second;
  int64_t steps = 0;
  bool ok = !text.empty() && text.size() <= 18 &&
            std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (ok)
    steps = std::stoll(text);
  if (!ok)
    stateError(std::string("metadata ") + quoted(kStepKey) + ": \"" + text.substr(0, 40) +
               "\" is not a non-negative integer");

  std::vector<float> m, v;
  double mMax = 0, vMax = 0; // the moments' bounds (momentBound_, squareBound_)
  std::set<std::string> expected;
  if (hasMoments()) {
    m.assign(static_cast<size_t>(numFloats_), 0.0f);
    v.assign(static_cast<size_t>(numFloats_), 0.0f);
    for (size_t i = 0; i < slots_.size(); ++i) {
      const ParamSlot &p = slots_[i];
      for (int which = 0; which < 2; ++which) {
        std::string name = (which == 0 ? kExpAvgPrefix : kExpAvgSqPrefix) + p.name;
        expected.insert(name);
        auto it = in.tensors.find(name);
        if (it == in.tensors.end())
          stateError("tensor " + quoted(name) + ": missing");
        const Tensor &t = it->second;
        if (t.shape != p.shape || static_cast<int64_t>(t.data.size()) != numel_[i])
          stateError("tensor " + quoted(name) + ": shape " + shapeString(t.shape) + ", expected " +
                     shapeString(p.shape));
        double &bound = which == 0 ? mMax : vMax;
        for (size_t k = 0; k < t.data.size(); ++k) {
          float x = t.data[k];
          bound = std::max(bound, double(std::fabs(x)));
          if (!std::isfinite(x) || (which == 1 && x < 0))
            stateError("tensor " + quoted(name) + ": element " + std::to_string(k) + " is " + valueString(x) +
                       (which == 1 ? " (must be finite and >= 0)" : " (must be finite)"));
        }
        std::copy(t.data.begin(), t.data.end(), (which == 0 ? m : v).begin() + p.offset);
      }
    }
  }
  for (const auto &[name, t] : in.tensors)
    if (name.rfind("optimizer.", 0) == 0 && !expected.count(name))
      stateError("tensor " + quoted(name) + ": unexpected (no such parameter for a \"" +
                 std::string(kindName(config_.kind)) + "\" optimizer)");
  expAvg_ = std::move(m);
  expAvgSq_ = std::move(v);
  momentBound_ = mMax, squareBound_ = vMax;
  steps_ = steps;
}

} // namespace lmcc::train
