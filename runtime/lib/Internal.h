//===- Internal.h - liblmrt internals shared by its source files (not installed) ===//
#pragma once

#include "runtime/lib/lmrt.h"

#include <functional>
#include <string>

struct lm_model {
  const lm_model_desc *desc = nullptr;
  float *weights = nullptr; ///< desc->total_floats floats, 64-byte aligned
  void *owned = nullptr;    ///< what lm_rt_free releases (null when the embedded weights are used in place)
};

namespace lmrt::detail {
/// Throw an argument / internal error that guardedCall turns into its status code and message.
[[noreturn]] void argument(std::string message);
[[noreturn]] void internal(std::string message);
/// Runs `body`, converting whatever it throws into a status code and lm_last_error().
int guardedCall(const std::function<void()> &body) noexcept;
/// The model, ids and lengths checks of lm_rt_score (ids in the vocabulary, 1 <= length <= max_len, stride).
void checkModelInputs(const lm_model *m, const int32_t *ids, const int32_t *lengths, int32_t batch, int32_t stride);
} // namespace lmrt::detail
