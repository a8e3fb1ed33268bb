// Every provided bias and composition, run natively by FLASH, equals MATH run on the
// bias's own materialize() tensor in float64 -- output, logsumexp and gradients -- for
// L == S, L < S, L > S, GQA and odd sizes. Before serving as the golden, materialize() is
// checked against the independent definition in bias_reference.h.
//
// Tolerance (attention_test_util.h): golden = MATH float64 on the float64 materialization;
// tolerance = kFudge * max(dtype default, error of MATH run on the bias in the tested dtype).

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bias_reference.h"

namespace sdpa_test {
namespace {

using sdpa::AlibiBias;
using sdpa::AttnBiasPtr;
using sdpa::BlockDiagonalBias;
using sdpa::LocalAttentionBias;
using sdpa::PaddedKeysBias;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;
constexpr DiagonalAlignment kTopLeft = DiagonalAlignment::kTopLeft;
constexpr DiagonalAlignment kBottomRight = DiagonalAlignment::kBottomRight;

struct CallShape {
  std::string name;
  int64_t batch, heads_q, heads_kv, q_len, kv_len, dim_qk, dim_vo;
  DType dtype = DType::kFloat32;  // of the call (a TensorBias part must match it)
  BiasShape bias_shape() const { return {batch, heads_q, q_len, kv_len}; }
};

// Document lengths for n positions. Queries: {1, 0, n/3, rest}; keys: {n/4, 1, 0, rest}:
// a document of one query, a document with keys but no queries, one with queries but no
// keys (fully masked rows), and q/kv documents of different lengths. Tiny n: one document.
std::vector<int64_t> q_documents(int64_t n) {
  if (n < 6) return {n};
  return {1, 0, n / 3, n - 1 - n / 3};
}
std::vector<int64_t> kv_documents(int64_t n, int64_t q_n) {
  if (q_n < 6 || n < 6) return {n};
  return {n / 4, 1, 0, n - n / 4 - 1};
}
// kv lengths per batch: all, a third, then ones (never 0 here; all-padding is in the
// edge tests).
std::vector<int64_t> padded_lengths(const CallShape& c) {
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < c.batch; ++b) {
    lengths.push_back(b == 0 ? c.kv_len : std::max<int64_t>(1, c.kv_len / 3));
  }
  return lengths;
}
std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
std::vector<float> custom_slopes(int64_t heads) {
  std::vector<float> s;
  for (int64_t h = 0; h < heads; ++h) s.push_back(0.05f + 0.3f * static_cast<float>(h));
  return s;
}

struct BiasCase {
  std::string name;
  // The bias for a call shape, and its independent definition.
  std::function<AttnBiasPtr(const CallShape&)> make;
  std::function<Expected(const CallShape&)> expected;
};

std::vector<BiasCase> bias_cases() {
  std::vector<BiasCase> v;
  auto add = [&](std::string name, std::function<AttnBiasPtr(const CallShape&)> make,
                 std::function<Expected(const CallShape&)> expected) {
    v.push_back({std::move(name), std::move(make), std::move(expected)});
  };
  add(
      "CausalUpperLeft",
      [](const CallShape& c) { return sdpa::causal_upper_left(c.q_len, c.kv_len); },
      [](const CallShape& c) { return expect_causal(kTopLeft, c.bias_shape()); });
  add(
      "CausalLowerRight",
      [](const CallShape& c) { return sdpa::causal_lower_right(c.q_len, c.kv_len); },
      [](const CallShape& c) { return expect_causal(kBottomRight, c.bias_shape()); });
  add(
      "WindowCausal16",
      [](const CallShape&) { return std::make_shared<LocalAttentionBias>(16, 0); },
      [](const CallShape& c) { return expect_window(16, 0, kBottomRight, c.bias_shape()); });
  add(
      "WindowTopLeft5x7",
      [](const CallShape&) { return std::make_shared<LocalAttentionBias>(5, 7, kTopLeft); },
      [](const CallShape& c) { return expect_window(5, 7, kTopLeft, c.bias_shape()); });
  add(
      "WindowLeftOnly",
      [](const CallShape&) { return std::make_shared<LocalAttentionBias>(9, std::nullopt); },
      [](const CallShape& c) {
        return expect_window(9, std::nullopt, kBottomRight, c.bias_shape());
      });
  add(
      "WindowRightOnlyTopLeft",
      [](const CallShape&) {
        return std::make_shared<LocalAttentionBias>(std::nullopt, 3, kTopLeft);
      },
      [](const CallShape& c) { return expect_window(std::nullopt, 3, kTopLeft, c.bias_shape()); });
  add(
      "WindowZero", [](const CallShape&) { return std::make_shared<LocalAttentionBias>(0, 0); },
      [](const CallShape& c) { return expect_window(0, 0, kBottomRight, c.bias_shape()); });
  add(
      "WindowWiderThanS",
      [](const CallShape& c) {
        return std::make_shared<LocalAttentionBias>(c.kv_len + c.q_len, c.kv_len + 1, kTopLeft);
      },
      [](const CallShape& c) {
        return expect_window(c.kv_len + c.q_len, c.kv_len + 1, kTopLeft, c.bias_shape());
      });
  add(
      "Alibi", [](const CallShape& c) { return std::make_shared<AlibiBias>(c.heads_q); },
      [](const CallShape& c) {
        return expect_alibi(to_double(sdpa::alibi_slopes(c.heads_q)), kBottomRight, c.bias_shape());
      });
  add(
      "AlibiCustomTopLeft",
      [](const CallShape& c) {
        return std::make_shared<AlibiBias>(custom_slopes(c.heads_q), kTopLeft);
      },
      [](const CallShape& c) {
        return expect_alibi(to_double(custom_slopes(c.heads_q)), kTopLeft, c.bias_shape());
      });
  add(
      "Documents",
      [](const CallShape& c) {
        return BlockDiagonalBias::from_seqlens(q_documents(c.q_len),
                                               kv_documents(c.kv_len, c.q_len));
      },
      [](const CallShape& c) {
        return expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len),
                                std::nullopt);
      });
  add(
      "DocumentsCausalTopLeft",
      [](const CallShape& c) {
        return BlockDiagonalBias::from_seqlens(q_documents(c.q_len),
                                               kv_documents(c.kv_len, c.q_len), true);
      },
      [](const CallShape& c) {
        return expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len), kTopLeft);
      });
  add(
      "DocumentsCausalBottomRight",
      [](const CallShape& c) {
        return BlockDiagonalBias::from_seqlens(q_documents(c.q_len),
                                               kv_documents(c.kv_len, c.q_len), true, kBottomRight);
      },
      [](const CallShape& c) {
        return expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len),
                                kBottomRight);
      });
  add(
      "PaddedKeys",
      [](const CallShape& c) { return std::make_shared<PaddedKeysBias>(padded_lengths(c)); },
      [](const CallShape& c) { return expect_padded(padded_lengths(c), false, c.bias_shape()); });
  add(
      "PaddedKeysCausal",
      [](const CallShape& c) { return std::make_shared<PaddedKeysBias>(padded_lengths(c), true); },
      [](const CallShape& c) { return expect_padded(padded_lengths(c), true, c.bias_shape()); });
  add(
      "DocsCausalAlibiPadding",
      [](const CallShape& c) {
        return sdpa::compose(
            {BlockDiagonalBias::from_seqlens(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len)),
             sdpa::causal_lower_right(c.q_len, c.kv_len), std::make_shared<AlibiBias>(c.heads_q),
             std::make_shared<PaddedKeysBias>(padded_lengths(c))});
      },
      [](const CallShape& c) {
        return expect_all(
            {expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len), std::nullopt),
             expect_causal(kBottomRight, c.bias_shape()),
             expect_alibi(to_double(sdpa::alibi_slopes(c.heads_q)), kBottomRight, c.bias_shape()),
             expect_padded(padded_lengths(c), false, c.bias_shape())});
      });
  add(
      "DocsCausalInsideAndWindow",
      [](const CallShape& c) {
        return sdpa::compose({BlockDiagonalBias::from_seqlens(
                                  q_documents(c.q_len), kv_documents(c.kv_len, c.q_len), true),
                              std::make_shared<LocalAttentionBias>(4, 2, kTopLeft)});
      },
      [](const CallShape& c) {
        return expect_all(
            {expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len), kTopLeft),
             expect_window(4, 2, kTopLeft, c.bias_shape())});
      });
  add(
      "PaddingCausalWindowAlibi",
      [](const CallShape& c) {
        return sdpa::compose({std::make_shared<PaddedKeysBias>(padded_lengths(c), true),
                              std::make_shared<LocalAttentionBias>(20, 5),
                              std::make_shared<AlibiBias>(custom_slopes(c.heads_q))});
      },
      [](const CallShape& c) {
        return expect_all(
            {expect_padded(padded_lengths(c), true, c.bias_shape()),
             expect_window(20, 5, kBottomRight, c.bias_shape()),
             expect_alibi(to_double(custom_slopes(c.heads_q)), kBottomRight, c.bias_shape())});
      });
  // Documents with padding: a causal band aligned bottom-right is where "inside the
  // document" and "inside the valid keys" can disagree; materialize() defines the result.
  add(
      "DocsCausalBottomRightAndPadding",
      [](const CallShape& c) {
        return sdpa::compose(
            {BlockDiagonalBias::from_seqlens(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len),
                                             true, kBottomRight),
             std::make_shared<PaddedKeysBias>(padded_lengths(c))});
      },
      [](const CallShape& c) {
        return expect_all(
            {expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len), kBottomRight),
             expect_padded(padded_lengths(c), false, c.bias_shape())});
      });
  add(
      "PaddedCausalAndDocuments",
      [](const CallShape& c) {
        return sdpa::compose({std::make_shared<PaddedKeysBias>(padded_lengths(c), true),
                              BlockDiagonalBias::from_seqlens(q_documents(c.q_len),
                                                              kv_documents(c.kv_len, c.q_len))});
      },
      [](const CallShape& c) {
        return expect_all({expect_padded(padded_lengths(c), true, c.bias_shape()),
                           expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len),
                                            std::nullopt)});
      });
  add(
      "FloatTensorAndCausal",
      [](const CallShape& c) {
        return sdpa::compose(
            {std::make_shared<sdpa::TensorBias>(randn({c.heads_q, 1, c.kv_len}, c.dtype, 91)),
             sdpa::causal_lower_right(c.q_len, c.kv_len)});
      },
      [](const CallShape& c) {
        return expect_all({expect_tensor(randn({c.heads_q, 1, c.kv_len}, c.dtype, 91)),
                           expect_causal(kBottomRight, c.bias_shape())});
      });
  add(
      "BoolTensorAndDocuments",
      [](const CallShape& c) {
        return sdpa::compose(
            {std::make_shared<sdpa::TensorBias>(random_bool({c.q_len, c.kv_len}, 0.7, 92)),
             BlockDiagonalBias::from_seqlens(q_documents(c.q_len),
                                             kv_documents(c.kv_len, c.q_len))});
      },
      [](const CallShape& c) {
        return expect_all({expect_tensor(random_bool({c.q_len, c.kv_len}, 0.7, 92)),
                           expect_documents(q_documents(c.q_len), kv_documents(c.kv_len, c.q_len),
                                            std::nullopt)});
      });
  return v;
}

const std::vector<CallShape>& call_shapes() {
  static const std::vector<CallShape> shapes = {
      {"Square", 2, 4, 2, 65, 65, 40, 24},      // L == S, GQA 2:1
      {"Wide", 1, 3, 3, 37, 130, 24, 24},       // L < S, odd head count
      {"Tall", 2, 3, 1, 130, 37, 16, 40},       // L > S, GQA 3:1
      {"Tiny", 1, 2, 2, 1, 1, 8, 8},            // one query, one key
      {"OddTiles", 1, 2, 1, 131, 263, 64, 64},  // several partial 64-wide tiles
  };
  return shapes;
}

struct Param {
  BiasCase bias;
  CallShape shape;
  DType dtype;
  std::string capability;  // forced SIMD capability for FLASH; "" = detected
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.bias.name << " on " << p.shape.name << " " << sdpa::dtype_name(p.dtype) << " "
      << p.capability;
}

class BiasEquivalence : public ::testing::TestWithParam<Param> {};

TEST_P(BiasEquivalence, FlashNativeMatchesMathOnMaterialized) {
  const Param& p = GetParam();
  const CallShape& c = p.shape;
  const AttnBiasPtr bias = p.bias.make(c);
  const BiasShape bshape = c.bias_shape();
  ASSERT_TRUE(materializes_as(*bias, bshape, p.bias.expected(c)));

  const uint64_t seed = std::hash<std::string>{}(p.bias.name + c.name) & 0xffff;
  const Tensor q = randn({c.batch, c.heads_q, c.q_len, c.dim_qk}, p.dtype, seed + 1);
  const Tensor k = randn({c.batch, c.heads_kv, c.kv_len, c.dim_qk}, p.dtype, seed + 2);
  const Tensor v = randn({c.batch, c.heads_kv, c.kv_len, c.dim_vo}, p.dtype, seed + 3);
  const Tensor go = randn({c.batch, c.heads_q, c.q_len, c.dim_vo}, p.dtype, seed + 4);

  SDPAOptions with_bias;
  with_bias.enable_gqa = c.heads_q != c.heads_kv;
  with_bias.attn_mask = bias;
  SDPAOptions with_tensor = with_bias;
  with_tensor.attn_mask = bias->materialize(bshape, DType::kFloat64);

  const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(go), with_tensor);
  const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, k, v, go, with_bias);
  FwdBwd flash;
  {
    std::optional<ScopedCapability> cap;
    if (!p.capability.empty()) cap.emplace(p.capability);
    flash = run_fwd_bwd(SDPBackend::FLASH_ATTENTION, q, k, v, go, with_bias);
  }
  EXPECT_EQ(flash.fwd.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_EQ(flash.grads.backend, SDPBackend::FLASH_ATTENTION);
  expect_matches_golden(flash, golden, naive, p.dtype);
  // MATH with the bias object is itself the materialized path: it must match too.
  expect_matches_golden(naive, golden, naive, p.dtype);
  EXPECT_FALSE(has_nan(flash.fwd.out) || has_nan(flash.grads.grad_q) ||
               has_nan(flash.grads.grad_k) || has_nan(flash.grads.grad_v));
}

std::vector<Param> params() {
  std::vector<Param> v;
  for (const BiasCase& b : bias_cases()) {
    for (const CallShape& s : call_shapes()) v.push_back({b, s, DType::kFloat32, ""});
    // One 16-bit run per bias on the multi-tile shape.
    CallShape half = call_shapes()[4];
    half.dtype = DType::kBFloat16;
    v.push_back({b, half, DType::kBFloat16, ""});
    // The per-element masking is SIMD code: every capability, on a shape with L > S
    // (partial tiles on both axes, GQA).
    for (const std::string& cap : supported_capabilities()) {
      v.push_back({b, call_shapes()[2], DType::kFloat32, cap});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllBiases, BiasEquivalence, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           std::string n = info.param.bias.name + "_" + info.param.shape.name;
                           if (info.param.dtype != DType::kFloat32) {
                             n.append("_").append(sdpa::dtype_name(info.param.dtype));
                           }
                           if (!info.param.capability.empty()) {
                             n.append("_").append(info.param.capability);
                           }
                           return n;
                         });

}  // namespace
}  // namespace sdpa_test
