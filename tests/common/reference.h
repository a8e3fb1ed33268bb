#pragma once
// Test-side ground truth, written independently of the library: element encoding and
// decoding for every dtype, a float64 naive attention (triple loop) and Philox4x32-10.
// Nothing here calls the library's conversions or kernels, so a bug there cannot hide in
// the reference.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "sdpa/generator.h"
#include "sdpa/tensor.h"

namespace sdpa::test {

/// Rounds `value` to the nearest value representable in `dtype` (ties to even; overflow to
/// infinity for the half types, subnormals kept), computed with double arithmetic only.
double round_to_dtype(double value, DType dtype);

/// Bits of the IEEE binary16 / bfloat16 nearest to `value` (ties to even), and back.
uint16_t encode_float16(double value);
uint16_t encode_bfloat16(double value);
double decode_float16(uint16_t bits);
double decode_bfloat16(uint16_t bits);

/// Reads / writes the element at element offset `offset` from `base` (no strides involved).
double load_element(const void* base, DType dtype, int64_t offset);
void store_element(void* base, DType dtype, int64_t offset, double value);

/// Every element of `t` in row-major order of its logical shape, read through its strides.
std::vector<double> to_doubles(const Tensor& t);

/// Writes `values` (row-major of t's logical shape) into `t` through its strides.
void fill_from_doubles(const Tensor& t, const std::vector<double>& values);

/// t.set_item at a braced index (Tensor::set_item takes only a span).
inline void set_at(const Tensor& t, std::initializer_list<int64_t> index, double value) {
  Tensor(t).set_item(std::span<const int64_t>(index.begin(), index.size()), value);
}

/// Philox4x32-10 (Salmon et al. 2011, Random123's philox4x32 with 10 rounds).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key);

/// The documented dropout rule (docs/semantics.md): element n of [B, Hq, L, S] uses word
/// n % 4 of the Philox block at counter (n / 4, offset) keyed by the seed, and is kept when
/// that word >= p * 2^32.
bool dropout_keeps(const PhiloxState& state, double p, uint64_t element);

/// Options of the reference, mirroring SDPAOptions.
struct ReferenceOptions {
  Tensor mask;  ///< bool (true = keep) or additive float, broadcastable to the scores
  bool causal = false;  ///< top-left: query i sees keys j <= i
  std::optional<double> scale;
  double dropout_p = 0.0;
  PhiloxState philox;
};

/// out [B, Hq, L, Ev] and lse [B, Hq, L] (B = 1 for 3-D inputs), row-major, float64.
struct ReferenceResult {
  int64_t batch = 0, heads_q = 0, q_len = 0, head_dim_v = 0;
  std::vector<double> out;
  std::vector<double> lse;
  /// Rows whose every key is masked (lse = -inf, out = 0).
  std::vector<bool> fully_masked;
};

/// Naive attention in float64 from the values stored in q, k, v (any strides, any dtype;
/// 3-D or 4-D; GQA by h / (Hq / Hkv)). Fully masked rows give out = 0 and lse = -inf.
ReferenceResult reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ReferenceOptions& options);

}  // namespace sdpa::test
