#include "common/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace sdpa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Nearest value with `mantissa_bits` fraction bits, minimum normal exponent `min_exp`
// (subnormals below), largest finite `max_finite`; ties to even, overflow to infinity.
double round_binary(double value, int mantissa_bits, int min_exp, double max_finite) {
  if (std::isnan(value) || std::isinf(value) || value == 0.0) return value;
  const double a = std::fabs(value);
  int ex = 0;
  std::frexp(a, &ex);  // a = m * 2^ex, m in [0.5, 1)
  const int e = std::max(ex - 1, min_exp);
  const double quantum = std::ldexp(1.0, e - mantissa_bits);
  // a / quantum is exact (power-of-two scaling); nearbyint rounds half to even.
  const double r = std::nearbyint(a / quantum) * quantum;
  const double rounded = r > max_finite ? kInf : r;
  return std::copysign(rounded, value);
}

constexpr double kFloat16Max = 65504.0;
const double kBFloat16Max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127

uint16_t encode_binary16(double value, int mantissa_bits, int exp_bias, int min_exp,
                         double max_finite) {
  const int exp_bits = 15 - mantissa_bits;
  const uint16_t exp_all_ones = static_cast<uint16_t>(((1u << exp_bits) - 1u) << mantissa_bits);
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isnan(value)) {
    return static_cast<uint16_t>(sign | exp_all_ones | (1u << (mantissa_bits - 1)));
  }
  const double r = std::fabs(round_binary(value, mantissa_bits, min_exp, max_finite));
  if (std::isinf(r)) return static_cast<uint16_t>(sign | exp_all_ones);
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, min_exp)) {  // subnormal: r = mantissa * 2^(min_exp - mantissa_bits)
    const auto mantissa = static_cast<uint16_t>(std::ldexp(r, mantissa_bits - min_exp));
    return static_cast<uint16_t>(sign | mantissa);
  }
  int ex = 0;
  std::frexp(r, &ex);
  const int e = ex - 1;
  const auto mantissa = static_cast<uint16_t>(std::ldexp(r, mantissa_bits - e) -
                                              std::ldexp(1.0, mantissa_bits));
  return static_cast<uint16_t>(sign | ((e + exp_bias) << mantissa_bits) | mantissa);
}

double decode_binary16(uint16_t bits, int mantissa_bits, int exp_bias) {
  const int exp_bits = 15 - mantissa_bits;
  const bool negative = (bits & 0x8000u) != 0;
  const int exponent = (bits >> mantissa_bits) & ((1 << exp_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  double magnitude;
  if (exponent == (1 << exp_bits) - 1) {
    magnitude = mantissa == 0 ? kInf : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - exp_bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa + (1 << mantissa_bits)),
                           exponent - exp_bias - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Row-major strides of `shape` (in elements).
std::vector<int64_t> row_major(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    s[d] = s[d + 1] * shape[d + 1];
  }
  return s;
}

}  // namespace

double round_to_dtype(double value, DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return value;
    case DType::kFloat32: return static_cast<double>(static_cast<float>(value));
    case DType::kFloat16: return round_binary(value, 10, -14, kFloat16Max);
    case DType::kBFloat16: return round_binary(value, 7, -126, kBFloat16Max);
    case DType::kBool: return value != 0.0 ? 1.0 : 0.0;
    case DType::kInt32:
    case DType::kInt64: return std::trunc(value);
  }
  return value;
}

uint16_t encode_float16(double value) { return encode_binary16(value, 10, 15, -14, kFloat16Max); }
uint16_t encode_bfloat16(double value) {
  return encode_binary16(value, 7, 127, -126, kBFloat16Max);
}
double decode_float16(uint16_t bits) { return decode_binary16(bits, 10, 15); }
double decode_bfloat16(uint16_t bits) { return decode_binary16(bits, 7, 127); }

double load_element(const void* base, DType dtype, int64_t offset) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, bytes + offset * 4, 4);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, bytes + offset * 8, 8);
      return d;
    }
    case DType::kBFloat16:
    case DType::kFloat16: {
      uint16_t bits;
      std::memcpy(&bits, bytes + offset * 2, 2);
      return dtype == DType::kFloat16 ? decode_float16(bits) : decode_bfloat16(bits);
    }
    case DType::kBool: return bytes[offset] != 0 ? 1.0 : 0.0;
    case DType::kInt32: {
      int32_t i;
      std::memcpy(&i, bytes + offset * 4, 4);
      return i;
    }
    case DType::kInt64: {
      int64_t i;
      std::memcpy(&i, bytes + offset * 8, 8);
      return static_cast<double>(i);
    }
  }
  throw std::logic_error("load_element: unknown dtype");
}

void store_element(void* base, DType dtype, int64_t offset, double value) {
  auto* bytes = static_cast<unsigned char*>(base);
  switch (dtype) {
    case DType::kFloat32: {
      const auto f = static_cast<float>(value);
      std::memcpy(bytes + offset * 4, &f, 4);
      return;
    }
    case DType::kFloat64: std::memcpy(bytes + offset * 8, &value, 8); return;
    case DType::kBFloat16:
    case DType::kFloat16: {
      const uint16_t bits =
          dtype == DType::kFloat16 ? encode_float16(value) : encode_bfloat16(value);
      std::memcpy(bytes + offset * 2, &bits, 2);
      return;
    }
    case DType::kBool: bytes[offset] = value != 0.0 ? 1 : 0; return;
    case DType::kInt32: {
      const auto i = static_cast<int32_t>(value);
      std::memcpy(bytes + offset * 4, &i, 4);
      return;
    }
    case DType::kInt64: {
      const auto i = static_cast<int64_t>(value);
      std::memcpy(bytes + offset * 8, &i, 8);
      return;
    }
  }
  throw std::logic_error("store_element: unknown dtype");
}

namespace {
// Calls fn(linear_index, element_offset) for every element of t in row-major order.
template <typename Fn>
void for_each_element(const Tensor& t, Fn fn) {
  const Shape& sizes = t.sizes();
  const Shape& strides = t.strides();
  const int64_t rank = static_cast<int64_t>(sizes.size());
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  if (count == 0) return;
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t n = 0; n < count; ++n) {
    fn(n, offset);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++index[d] < sizes[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (sizes[d] - 1);
      index[d] = 0;
    }
  }
}
}  // namespace

std::vector<double> to_doubles(const Tensor& t) {
  int64_t count = 1;
  for (int64_t s : t.sizes()) count *= s;
  std::vector<double> out(static_cast<size_t>(count));
  const void* base = t.data_ptr();
  for_each_element(t, [&](int64_t n, int64_t offset) {
    out[n] = load_element(base, t.dtype(), offset);
  });
  return out;
}

void fill_from_doubles(const Tensor& t, const std::vector<double>& values) {
  void* base = t.data_ptr();
  for_each_element(t, [&](int64_t n, int64_t offset) {
    store_element(base, t.dtype(), offset, values.at(n));
  });
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  // Random123 philox.h: PHILOX_M4x32_0/1 and the Weyl key increments W32_0/1.
  const uint64_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  const uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += w0;
      key[1] += w1;
    }
    const uint64_t prod0 = m0 * ctr[0];
    const uint64_t prod1 = m1 * ctr[2];
    const uint32_t hi0 = static_cast<uint32_t>(prod0 >> 32), lo0 = static_cast<uint32_t>(prod0);
    const uint32_t hi1 = static_cast<uint32_t>(prod1 >> 32), lo1 = static_cast<uint32_t>(prod1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

bool dropout_keeps(const PhiloxState& state, double p, uint64_t element) {
  const uint64_t block = element / 4;
  const auto words = philox4x32_10(
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
       static_cast<uint32_t>(state.offset), static_cast<uint32_t>(state.offset >> 32)},
      {static_cast<uint32_t>(state.seed), static_cast<uint32_t>(state.seed >> 32)});
  const double threshold = std::floor(p * 4294967296.0);
  return static_cast<double>(words[element % 4]) >= threshold;
}

ReferenceResult reference_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ReferenceOptions& options) {
  const bool batched = q.dim() == 4;
  const int64_t off = batched ? 0 : 1;  // 3-D inputs are [H, L, E]: batch 1
  auto dim = [&](const Tensor& t, int64_t d) -> int64_t {
    return (!batched && d == 0) ? 1 : t.sizes()[d - off];
  };
  const int64_t B = dim(q, 0), Hq = dim(q, 1), L = dim(q, 2), E = dim(q, 3);
  const int64_t Hkv = dim(k, 1), S = dim(k, 2), Ev = dim(v, 3);
  const int64_t group = Hkv == 0 ? 1 : Hq / Hkv;
  const std::vector<double> qd = to_doubles(q), kd = to_doubles(k), vd = to_doubles(v);

  // Mask broadcast (right-aligned) to [B, Hq, L, S].
  std::vector<double> md;
  std::array<int64_t, 4> mstride{0, 0, 0, 0};
  const bool has_mask = options.mask.defined();
  const bool bool_mask = has_mask && options.mask.dtype() == DType::kBool;
  if (has_mask) {
    md = to_doubles(options.mask);
    const Shape& ms = options.mask.sizes();
    const std::vector<int64_t> rm = row_major(ms);
    const std::array<int64_t, 4> full{B, Hq, L, S};
    const int64_t mr = static_cast<int64_t>(ms.size());
    for (int64_t d = 0; d < mr; ++d) {
      const int64_t target = 4 - mr + d;
      if (ms[d] != 1 && ms[d] != full[target]) {
        throw std::logic_error("reference_attention: mask not broadcastable");
      }
      mstride[target] = ms[d] == 1 ? 0 : rm[d];
    }
  }
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(E));

  ReferenceResult r;
  r.batch = B;
  r.heads_q = Hq;
  r.q_len = L;
  r.head_dim_v = Ev;
  r.out.assign(static_cast<size_t>(B * Hq * L * Ev), 0.0);
  r.lse.assign(static_cast<size_t>(B * Hq * L), -kInf);
  r.fully_masked.assign(static_cast<size_t>(B * Hq * L), true);
  std::vector<double> s(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < L; ++i) {
        const double* qrow = &qd[((b * Hq + h) * L + i) * E];
        double m = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          const double* krow = &kd[((b * Hkv + hk) * S + j) * E];
          double dot = 0.0;
          for (int64_t e = 0; e < E; ++e) dot += qrow[e] * krow[e];
          double score = dot * scale;
          if (has_mask) {
            const double mv =
                md[b * mstride[0] + h * mstride[1] + i * mstride[2] + j * mstride[3]];
            if (bool_mask) {
              if (mv == 0.0) score = -kInf;
            } else {
              score += mv;
            }
          }
          if (options.causal && j > i) score = -kInf;
          s[j] = score;
          m = std::max(m, score);
        }
        const int64_t row = (b * Hq + h) * L + i;
        if (m == -kInf) continue;  // fully masked (or S == 0): out 0, lse -inf
        double sum = 0.0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - m);
        r.lse[row] = m + std::log(sum);
        r.fully_masked[row] = false;
        double* orow = &r.out[row * Ev];
        for (int64_t j = 0; j < S; ++j) {
          double p = std::exp(s[j] - m) / sum;
          if (options.dropout_p > 0.0) {
            const uint64_t element = static_cast<uint64_t>(row * S + j);
            p = dropout_keeps(options.philox, options.dropout_p, element)
                    ? p / (1.0 - options.dropout_p)
                    : 0.0;
          }
          if (p == 0.0) continue;
          const double* vrow = &vd[((b * Hkv + hk) * S + j) * Ev];
          for (int64_t e = 0; e < Ev; ++e) orow[e] += p * vrow[e];
        }
      }
    }
  }
  return r;
}

}  // namespace sdpa::test
