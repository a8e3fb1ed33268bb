#pragma once
// A backend: its name, an ordered list of named checks and its kernels. Selection and
// can_use run the same checks, so "supported" and "ran" cannot disagree.

#include <span>
#include <string_view>

#include "dispatch/kernel_io.h"
#include "sdpa/sdpa.h"

namespace sdpa::detail {

/// Returns true when `params` passes; otherwise adds a reason (when collecting).
using CheckFn = bool (*)(const AttentionParams& params, Reasons& reasons);

struct NamedCheck {
  std::string_view name;
  CheckFn fn;
};

using ForwardFn = void (*)(const AttentionParams& params, const Tensor& out, const Tensor& lse);
/// Writes the gradients (kernel_io.h).
using BackwardFn = void (*)(const AttentionParams& params, BackwardOutputs& outputs);

struct BackendImpl {
  SDPBackend id;
  std::span<const NamedCheck> checks;
  ForwardFn forward;    ///< null when the backend is not built into this library
  BackwardFn backward;  ///< null when the backend has no backward
  /// Runs every AttnBias from its native descriptor; otherwise biases are materialized.
  bool native_bias;
};

/// The implementation record of `backend` (not ERROR).
const BackendImpl& backend_impl(SDPBackend backend);

/// Runs `impl`'s checks in order. When reasons.collect is false it stops at the first
/// failure; otherwise it runs every check so the caller sees all reasons.
bool run_checks(const BackendImpl& impl, const AttentionParams& params, Reasons& reasons);

}  // namespace sdpa::detail
