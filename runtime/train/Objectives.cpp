//===- Objectives.cpp - Training objectives: (inputs, targets) from a sentence -===//
#include "runtime/train/Objectives.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace lmcc::train {

namespace {

bool isSpecial(const ModelSpec &spec, int32_t id) { return id == spec.tokens.bos || id == spec.tokens.eos; }

void checkSentence(const ModelSpec &spec, const std::vector<int32_t> &x, uint64_t sentence) {
  if (x.empty())
    throw std::invalid_argument("sentence " + std::to_string(sentence) + ": empty");
  for (size_t t = 0; t < x.size(); ++t)
    if (x[t] < 0 || x[t] >= spec.dims.vocab)
      throw std::invalid_argument("sentence " + std::to_string(sentence) + ", position " + std::to_string(t) +
                                  ": token id " + std::to_string(x[t]) + " outside [0, " +
                                  std::to_string(spec.dims.vocab) + ")");
}

} // namespace

double uniform(uint64_t seed, uint64_t step, uint64_t sentence, uint32_t position, Purpose purpose) {
  const std::array<uint32_t, 4> w =
      philox4x32({position, static_cast<uint32_t>(purpose), static_cast<uint32_t>(sentence),
                  static_cast<uint32_t>(step)},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(w[0]) << 32 | w[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

Example causalExample(const std::vector<int32_t> &x) {
  Example e{x, std::vector<int32_t>(x.size(), -1)};
  for (size_t i = 0; i + 1 < x.size(); ++i)
    e.targets[i] = x[i + 1];
  return e;
}

Example autoencodingExample(const ModelSpec &spec, const std::vector<int32_t> &x) {
  Example e{x, std::vector<int32_t>(x.size(), -1)};
  for (size_t i = 0; i < x.size(); ++i)
    if (!isSpecial(spec, x[i]))
      e.targets[i] = x[i];
  return e;
}

Example maskedExample(const ModelSpec &spec, const std::vector<int32_t> &x, uint64_t step, uint64_t sentence) {
  const TrainOptions &o = spec.train;
  const uint64_t seed = static_cast<uint64_t>(o.seed);
  auto draw = [&](size_t position, Purpose purpose) {
    return uniform(seed, step, sentence, static_cast<uint32_t>(position), purpose);
  };
  Example e{x, std::vector<int32_t>(x.size(), -1)};

  // 1. Bernoulli(mask_prob) per non-special position.
  std::vector<size_t> candidates, chosen;
  for (size_t i = 0; i < x.size(); ++i)
    if (!isSpecial(spec, x[i])) {
      candidates.push_back(i);
      if (draw(i, Purpose::Choose) < o.maskProb)
        chosen.push_back(i);
    }
  if (candidates.empty())
    return e;
  // 2. At least one.
  if (chosen.empty()) {
    size_t index = static_cast<size_t>(draw(0, Purpose::Fallback) * static_cast<double>(candidates.size()));
    chosen.push_back(candidates[std::min(index, candidates.size() - 1)]);
  }
  // 3. At most max_masks: the ones with the smallest keys, a uniformly random subset.
  if (static_cast<int64_t>(chosen.size()) > o.maxMasks) {
    std::vector<std::pair<double, size_t>> keyed;
    for (size_t i : chosen)
      keyed.push_back({draw(i, Purpose::Subset), i});
    std::sort(keyed.begin(), keyed.end());
    chosen.clear();
    for (int64_t k = 0; k < o.maxMasks; ++k)
      chosen.push_back(keyed[k].second);
    std::sort(chosen.begin(), chosen.end());
  }
  // 4-5. Replace and predict.
  const int32_t mask = static_cast<int32_t>(spec.tokens.mask);
  for (size_t i : chosen) {
    e.targets[i] = x[i];
    if (o.maskReplace == MaskReplace::Mask) {
      e.inputs[i] = mask;
      continue;
    }
    const double r = draw(i, Purpose::Replace);
    if (r < 0.8) {
      e.inputs[i] = mask;
    } else if (r < 0.9) {
      int64_t id = static_cast<int64_t>(draw(i, Purpose::RandomId) * static_cast<double>(spec.dims.vocab));
      e.inputs[i] = static_cast<int32_t>(std::min<int64_t>(id, spec.dims.vocab - 1));
    } // else unchanged
  }
  return e;
}

Example makeExample(const ModelSpec &spec, const std::vector<int32_t> &x, uint64_t step, uint64_t sentence) {
  checkSentence(spec, x, sentence);
  switch (resolvedObjective(spec)) {
  case Objective::Causal:
  case Objective::NGram: // the heads' targets x[i+j] are the causal ones shifted (MLIRGen's lm.shift_targets)
    return causalExample(x);
  case Objective::Autoencoding:
    return autoencodingExample(spec, x);
  case Objective::Masked:
    return maskedExample(spec, x, step, sentence);
  case Objective::Directional: // source/target pairs: runtime/train/Directional.h draws its rows
    throw std::invalid_argument("objectives: \"directional\" trains on source/target pairs, not sentences");
  case Objective::Auto:
    break;
  }
  throw std::invalid_argument("objectives: the objective did not resolve");
}

Examples makeExamples(const ModelSpec &spec, const std::vector<std::vector<int32_t>> &sentences, uint64_t step,
                      uint64_t firstSentence) {
  Examples out;
  for (size_t b = 0; b < sentences.size(); ++b) {
    Example e = makeExample(spec, sentences[b], step, firstSentence + b);
    out.inputs.push_back(std::move(e.inputs));
    out.targets.push_back(std::move(e.targets));
  }
  return out;
}

} // namespace lmcc::train
