#pragma once
// One harness for every backend (STYLE item 10): random inputs in any layout, the float64
// reference of common/reference.h, dtype-scaled tolerances, and a runner that tries a case
// on every backend, records the ones that report "not supported" and checks the others.

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/reference.h"
#include "sdpa/sdpa.h"

namespace sdpa::test {

/// How a [B, H, N, D] input is laid out in memory.
enum class Layout {
  kBHSD,          ///< contiguous [B, H, N, D]
  kBSHD,          ///< [B, N, H, D] allocated, then transpose(1, 2)
  kSliceD,        ///< [B, H, N, D + 3] allocated, slice(-1, 1, D + 1): unit stride, row
                  ///< stride D + 3, first element misaligned by one element
  kStridedD,      ///< [B, H, N, 2 D] allocated, slice(-1, 0, 2 D, 2): D stride 2
  kHeadDimMajor,  ///< [B, H, D, N] allocated, then transpose(-1, -2): D stride N
};
const char* layout_name(Layout layout);

/// A tensor of logical shape `shape` (3-D or 4-D; the last two dims are [N, D]) in
/// `layout`, filled with N(0, stddev) values rounded to `dtype` (never all zeros).
Tensor random_tensor(const Shape& shape, DType dtype, Layout layout, std::mt19937& rng,
                     double stddev = 1.0);

/// Error bounds by dtype. Outputs: max |out - ref| / max(max |ref|, 1e-30) <= out_rel.
/// lse: |lse - ref| <= lse_abs + lse_rel * |ref| (lse is float32 for every dtype).
/// Rationale (inputs are the stored, already rounded values, so these bound only the
/// computation): float64 is computed in float64; float32 accumulates over up to 1000 keys
/// and 256 head dims in float32 (eps 1.2e-7); the half types are computed in float32 and
/// rounded once to the output dtype (half an ulp = 2^-9 for bfloat16, 2^-11 for float16)
/// plus at most the same again for an intermediate rounding of P (what PyTorch's CPU
/// flash does), with a fudge factor of ~5.
struct Tolerance {
  double out_rel;
  double lse_abs;
  double lse_rel;
};
Tolerance tolerance_for(DType dtype);

/// What the mask of a case is.
enum class MaskKind { kNone, kBool, kFloat };

/// One attention call to check on every backend.
struct Case {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, q_len = 1, kv_len = 1;
  int64_t head_dim = 64;
  int64_t head_dim_v = -1;  ///< -1: same as head_dim
  DType dtype = DType::kFloat32;
  Layout q_layout = Layout::kBHSD;
  Layout kv_layout = Layout::kBHSD;
  bool unbatched = false;  ///< 3-D inputs [H, N, D]
  MaskKind mask = MaskKind::kNone;
  /// Mask shape, right-aligned against [B, Hq, L, S]; empty = the full scores shape.
  Shape mask_shape;
  /// Query rows whose whole mask row is masked (bool false / float -inf); needs an L dim.
  std::vector<int64_t> masked_rows;
  bool causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
  double dropout_p = 0.0;
  PhiloxState philox{1234, 0};  ///< dropout_state used when dropout_p > 0
  uint32_t seed = 42;           ///< for the random inputs
  double input_std = 1.0;       ///< q/k/v ~ N(0, input_std); > 1 gives peaked softmax rows

  int64_t ev() const { return head_dim_v < 0 ? head_dim : head_dim_v; }
  std::string describe() const;
};

/// Inputs of a case (built once, shared by every backend).
struct CaseInputs {
  Tensor q, k, v, mask;
  SDPAOptions options;
  ReferenceResult ref;
};
CaseInputs make_inputs(const Case& c);

/// Which backends ran a case and which reported "not supported" (with their reasons).
struct CaseReport {
  std::vector<SDPBackend> ran;
  std::map<SDPBackend, std::string> not_supported;
  bool ran_backend(SDPBackend b) const;
};

/// Compares `actual` (any strides) with the reference, at the given tolerance. Rows the
/// reference finds fully masked must be exactly 0 (out) and -inf (lse).
::testing::AssertionResult matches_reference(const Tensor& out, const Tensor& lse,
                                             const ReferenceResult& ref, DType dtype,
                                             bool unbatched);

/// Runs `c` on every backend: under sdpa_kernel{backend}, a backend for which can_use() is
/// false is recorded (and must also refuse the call with sdpa::Error); every other one
/// must run, report itself in AttentionResult::backend and match the reference. Failures
/// are reported through gtest (ADD_FAILURE) with the case and backend in the message.
CaseReport check_case(const Case& c);

/// check_case for inputs built by hand (in.ref must be their reference).
CaseReport check_inputs(const CaseInputs& in, DType dtype, bool unbatched,
                        const std::string& what);

/// Tallies reports of a sweep: how many cases each backend ran and skipped, with one
/// example reason per backend. print() writes the tally to stdout.
struct SweepTally {
  std::map<SDPBackend, int> ran, skipped;
  std::map<SDPBackend, std::string> example_reason;
  void add(const CaseReport& report);
  void print(const std::string& title) const;
};

/// The backends the library knows (default_priority_order()).
std::vector<SDPBackend> all_backends();

}  // namespace sdpa::test
