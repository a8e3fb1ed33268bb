#pragma once
// Independent definitions of every provided bias, written from docs/semantics.md and
// include/sdpa/attn_bias.h (not from src/bias): which keys a query keeps and what is added
// to its score. Used to check each bias's materialize() before that tensor serves as the
// golden for the fused kernels.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../training/attention_test_util.h"
#include "sdpa/attn_bias.h"

namespace sdpa_test {

using sdpa::BiasShape;
using sdpa::DiagonalAlignment;

/// keep(b, h, i, j) and add(b, h, i, j) of a bias on a call of shape `shape`.
struct Expected {
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> keep = [](int64_t, int64_t, int64_t,
                                                                    int64_t) { return true; };
  std::function<double(int64_t, int64_t, int64_t, int64_t)> add = [](int64_t, int64_t, int64_t,
                                                                     int64_t) { return 0.0; };
};

inline int64_t diagonal_offset(DiagonalAlignment a, int64_t q_len, int64_t kv_len) {
  return a == DiagonalAlignment::kBottomRight ? kv_len - q_len : 0;
}

/// i + d - left <= j <= i + d + right, absent bounds unbounded.
inline bool in_window(int64_t i, int64_t j, int64_t d, std::optional<int64_t> left,
                      std::optional<int64_t> right) {
  return (!left || j >= i + d - *left) && (!right || j <= i + d + *right);
}

inline Expected expect_causal(DiagonalAlignment a, const BiasShape& s) {
  const int64_t d = diagonal_offset(a, s.q_len, s.kv_len);
  return {[=](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + d; }, Expected{}.add};
}

inline Expected expect_window(std::optional<int64_t> left, std::optional<int64_t> right,
                              DiagonalAlignment a, const BiasShape& s) {
  const int64_t d = diagonal_offset(a, s.q_len, s.kv_len);
  return {[=](int64_t, int64_t, int64_t i, int64_t j) { return in_window(i, j, d, left, right); },
          Expected{}.add};
}

inline Expected expect_alibi(std::vector<double> slopes, DiagonalAlignment a, const BiasShape& s) {
  const int64_t d = diagonal_offset(a, s.q_len, s.kv_len);
  return {Expected{}.keep, [=](int64_t, int64_t h, int64_t i, int64_t j) {
            return -slopes[h] * static_cast<double>(std::llabs(i + d - j));
          }};
}

/// Documents with per-document lengths; causal inside each document with alignment `a`.
inline Expected expect_documents(std::vector<int64_t> q_lens, std::vector<int64_t> kv_lens,
                                 std::optional<DiagonalAlignment> causal) {
  return {[=](int64_t, int64_t, int64_t i, int64_t j) {
            int64_t q0 = 0, k0 = 0;
            for (size_t d = 0; d < q_lens.size(); ++d) {
              if (i >= q0 && i < q0 + q_lens[d]) {
                if (j < k0 || j >= k0 + kv_lens[d]) return false;
                if (!causal) return true;
                const int64_t off = diagonal_offset(*causal, q_lens[d], kv_lens[d]);
                return j - k0 <= i - q0 + off;
              }
              q0 += q_lens[d];
              k0 += kv_lens[d];
            }
            return false;
          },
          Expected{}.add};
}

inline Expected expect_padded(std::vector<int64_t> lengths, bool causal, const BiasShape& s) {
  const int64_t L = s.q_len;
  return {[=](int64_t b, int64_t, int64_t i, int64_t j) {
            return j < lengths[b] && (!causal || j <= i + lengths[b] - L);
          },
          Expected{}.add};
}

/// A dense tensor broadcast (right-aligned) to the scores: bool keeps, float adds.
inline Expected expect_tensor(const Tensor& t) {
  auto at = [t](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t idx[4] = {b, h, i, j};
    Shape index;
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t src = idx[4 - t.dim() + d];
      index.push_back(t.size(d) == 1 ? 0 : src);
    }
    return t.item(index);
  };
  if (t.dtype() == DType::kBool) {
    return {[=](int64_t b, int64_t h, int64_t i, int64_t j) { return at(b, h, i, j) != 0.0; },
            Expected{}.add};
  }
  return {[=](int64_t b, int64_t h, int64_t i, int64_t j) { return !std::isinf(at(b, h, i, j)); },
          [=](int64_t b, int64_t h, int64_t i, int64_t j) {
            const double x = at(b, h, i, j);
            return std::isinf(x) ? 0.0 : x;
          }};
}

/// Masks intersect, additive terms add.
inline Expected expect_all(std::vector<Expected> parts) {
  return {[=](int64_t b, int64_t h, int64_t i, int64_t j) {
            for (const Expected& p : parts) {
              if (!p.keep(b, h, i, j)) return false;
            }
            return true;
          },
          [=](int64_t b, int64_t h, int64_t i, int64_t j) {
            double s = 0;
            for (const Expected& p : parts) s += p.add(b, h, i, j);
            return s;
          }};
}

/// Checks `bias->materialize(shape, float64)` against `expected` element by element.
inline ::testing::AssertionResult materializes_as(const sdpa::AttnBias& bias,
                                                  const BiasShape& shape,
                                                  const Expected& expected) {
  const Tensor m = bias.materialize(shape, DType::kFloat64).expand(shape.scores());
  int64_t wrong = 0;
  std::string first;
  for_each_index(shape.scores(), [&](const Shape& x) {
    const int64_t b = x[0], h = x[1], i = x[2], j = x[3];
    const double value = m.item(x);
    const bool keep = expected.keep(b, h, i, j);
    bool ok;
    if (m.dtype() == DType::kBool) {
      ok = (value != 0.0) == keep && expected.add(b, h, i, j) == 0.0;
    } else if (!keep) {
      ok = value == -std::numeric_limits<double>::infinity();
    } else {
      const double want = expected.add(b, h, i, j);
      ok = std::abs(value - want) <= 1e-12 * std::max(1.0, std::abs(want));
    }
    if (!ok && wrong++ == 0) {
      std::ostringstream os;
      os << "[" << b << ", " << h << ", " << i << ", " << j << "]: materialized " << value
         << ", expected ";
      if (keep) {
        os << "keep + " << expected.add(b, h, i, j);
      } else {
        os << "masked";
      }
      first = os.str();
    }
  });
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bias.describe() << ": " << wrong
                                       << " elements differ from the definition, first " << first;
}

}  // namespace sdpa_test
