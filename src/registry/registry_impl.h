#pragma once
// Internals shared by the registry's translation units.

#include <memory>
#include <string>
#include <vector>

#include "sdpa/registry.h"

namespace sdpa::registry {

/// The library's ops, in declaration order (kOps in ops.cpp).
enum class OpId : int {
  kAttention,
  kAttentionOut,
  kAttentionInplace,
  kAttentionBackward,
  kAttentionBackwardOut,
  kMergeAttentionStates,
  kMaterializeBias,
  kCount
};
inline constexpr int kNumOps = static_cast<int>(OpId::kCount);

/// Shape, dtype and device of one Tensor return of a functional op; `defined` is false for
/// a return the call does not produce (attention_backward's grad_attn_mask unless asked).
struct TensorMeta {
  Shape shape;
  DType dtype = DType::kFloat32;
  Device device{};
  bool defined = true;
};

/// Validates the call's inputs (beyond make_params) and returns the functional op's
/// Tensor returns (not the Tensor[] one), for allocation and out= checks.
using MetaFn = std::vector<TensorMeta> (*)(const OpCall& call);

/// One op's declaration: its schema and C++ calling convention.
struct OpDecl {
  OpId id;
  const char* schema;
  /// Positional arguments arrive as one AttentionParams (OpCall::params).
  bool takes_params;
  MetaFn meta;  ///< of the functional op of this variant's family
};

/// The declarations, indexed by OpId.
const OpDecl& op_decl(OpId id);

/// Finds an op by full name ("attention.out"); -1 when unknown.
int find_op(std::string_view name);

/// Calls op `id` (OpCall as for call_op).
void call(OpId id, OpCall& call);

/// Registers the CPU kernels (cpu_kernels.cpp) on the CPU key.
void register_cpu_kernels(BackendHandle cpu);

/// The CPU backend that runs `params` for the calling thread: `chosen` when it is MATH or
/// FLASH_ATTENTION, otherwise the first CPU backend the active backends allow (FLASH, MATH
/// when they allow none, as the CPU fallback must run somewhere) whose checks pass. No
/// guard is pushed: the allowed list is passed to the selection explicitly.
SDPBackend cpu_backend_for(const AttentionParams& params, SDPBackend chosen);

/// The interface of an external device (null for CPU/CUDA or an unregistered device).
std::shared_ptr<const DeviceInterface> device_interface(Device device);

/// Loads SDPA_BACKENDS once (first use). Re-entrant calls from a plugin's registration
/// return immediately.
void ensure_env_backends();

/// `params` with every tensor (q, k, v, dense mask, grad_out, out, lse) copied to host.
AttentionParams params_to_host(const AttentionParams& params);

/// Byte ranges of two tensors on one device intersect.
bool overlaps(const Tensor& a, const Tensor& b);

}  // namespace sdpa::registry
