#pragma once
// A backend: its name, an ordered list of named checks and its kernels. Selection and
// can_use run the same checks, so "supported" and "ran" cannot disagree.
//
// Each backend's record lives with its code (src/cpu/backends.cpp, src/registry/
// overrideable.cpp, src/dispatch/unbuilt_backends.cpp); backend_table.cpp lists them.

#include <span>
#include <string>
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

/// Writes out [B, Hq, L, Ev] and lse [B, Hq, L] (preallocated, contiguous, on
/// params.device) completely.
using ForwardFn = void (*)(const AttentionParams& params, const Tensor& out, const Tensor& lse);
/// Writes the gradients into preallocated outputs (kernel_io.h).
using BackwardFn = void (*)(const AttentionParams& params, BackwardOutputs& outputs);
/// Runs a call whose outputs the backend allocates itself (an external device's plugin
/// allocates on its device): returns out [B, Hq, L, Ev] and lse [B, Hq, L], and sets `ran`
/// to the backend that computed them (a CPU backend when the registry fell back to CPU).
using ExternalForwardFn = ForwardOutputs (*)(const AttentionParams& params, SDPBackend& ran);
/// Returns the gradients (BackwardOutputs' shapes) on params.device; `ran` as above.
using ExternalBackwardFn = BackwardOutputs (*)(const AttentionParams& params, SDPBackend& ran);

struct BackendImpl {
  SDPBackend id;
  std::span<const NamedCheck> checks;
  ForwardFn forward;    ///< null when not built into this library, or external
  BackwardFn backward;  ///< null when the backend has no backward, or external
  /// Runs every AttnBias from its native descriptor; otherwise biases are materialized.
  bool native_bias;
  /// Set (with forward/backward null) for a backend that allocates its own outputs:
  /// OVERRIDEABLE, which runs through the operator registry.
  ExternalForwardFn external_forward = nullptr;
  ExternalBackwardFn external_backward = nullptr;
  /// Kernels for CUDA tensors (null when the backend has none in this build): same
  /// contracts as forward/backward, with outputs in device memory, queued on
  /// params.stream.
  ForwardFn cuda_forward = nullptr;
  BackwardFn cuda_backward = nullptr;
  /// explain()'s BackendVerdict::lowering for the call (null: nothing to describe).
  std::string (*describe)(const AttentionParams& params) = nullptr;
};

/// The records of the table (backend_table.cpp), defined next to each backend's kernels.
extern const BackendImpl kMathBackend;           // src/cpu/backends.cpp
extern const BackendImpl kFlashBackend;          // src/cpu/backends.cpp
extern const BackendImpl kEfficientBackend;      // src/dispatch/unbuilt_backends.cpp
extern const BackendImpl kCudnnBackend;          // src/dispatch/unbuilt_backends.cpp
extern const BackendImpl kOverrideableBackend;   // src/registry/overrideable.cpp

/// The implementation record of `backend` (not ERROR).
const BackendImpl& backend_impl(SDPBackend backend);

/// Runs `impl`'s checks in order. When reasons.collect is false it stops at the first
/// failure; otherwise it runs every check so the caller sees all reasons.
bool run_checks(const BackendImpl& impl, const AttentionParams& params, Reasons& reasons);

/// The first backend of `order` whose checks pass `params` (the guard is not consulted:
/// `order` is the whole allowed list). Throws sdpa::Error listing every backend's reasons
/// when none does.
SDPBackend select_from(const AttentionParams& params, std::span<const SDPBackend> order);

/// Runs built-in backend `impl`'s forward kernel into out/lse, giving it the materialized
/// bias when it does not run biases natively.
void forward_into(const BackendImpl& impl, const AttentionParams& params, const Tensor& out,
                  const Tensor& lse);
/// Runs built-in backend `impl`'s backward kernel into `outputs` (as forward_into).
void backward_into(const BackendImpl& impl, const AttentionParams& params,
                   BackwardOutputs& outputs);

/// Fresh outputs for a forward call: out [B, Hq, L, Ev] (params.dtype) and lse
/// [B, Hq, L] (float32), contiguous on params.device.
ForwardOutputs allocate_forward_outputs(const AttentionParams& params);
/// Fresh gradients shaped like params.q/k/v (params.dtype, contiguous, params.device), and
/// grad_mask [B, Hq, L, S] when params.attn_mask_requires_grad.
BackwardOutputs allocate_backward_outputs(const AttentionParams& params);

}  // namespace sdpa::detail
