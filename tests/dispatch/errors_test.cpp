// Every invalid input of issue 2 section 5 throws sdpa::Error naming the argument, what
// was expected and what came — from make_params and from the op itself, whichever backend
// the guard allows.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor randn(const Shape& shape, DType dtype = DType::kFloat32) {
  Tensor t = Tensor::empty(shape, dtype);
  // Deterministic non-zero contents; the values do not matter for validation.
  const int64_t n = t.numel();
  Tensor flat = t.view({n});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx[1] = {i};
    flat.set_item(idx, std::sin(static_cast<double>(i)) + 0.1);
  }
  return t;
}

struct Call {
  Tensor q, k, v;
  SDPAOptions options;
};

Call valid_call() {
  return {randn({2, 4, 7, 16}), randn({2, 4, 9, 16}), randn({2, 4, 9, 8}), {}};
}

// Returns the message of the sdpa::Error that make_params and the op throw for `c` (they
// must agree); an empty optional-like "" with a test failure when nothing is thrown.
std::string error_of(const Call& c) {
  std::string from_params, from_op;
  try {
    make_params(c.q, c.k, c.v, c.options);
    ADD_FAILURE() << "make_params accepted the call";
  } catch (const Error& e) {
    from_params = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "make_params threw a non-sdpa::Error: " << e.what();
  }
  for (const auto& backends : {std::vector<SDPBackend>{SDPBackend::MATH},
                               std::vector<SDPBackend>{SDPBackend::FLASH_ATTENTION},
                               default_priority_order()}) {
    sdpa_kernel guard(backends);
    try {
      scaled_dot_product_attention(c.q, c.k, c.v, c.options);
      ADD_FAILURE() << "scaled_dot_product_attention accepted the call";
    } catch (const Error& e) {
      from_op = e.what();
      // Validation errors come before backend selection, whatever the guard allows.
      EXPECT_EQ(from_op, from_params);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the op threw a non-sdpa::Error: " << e.what();
    }
  }
  return from_params;
}

// The op's message alone, for shapes make_params (3-D/4-D of matching ranks only) never
// sees: the entry points reduce other ranks and broadcast k/v first (broadcast.h).
std::string op_error_of(const Call& c) {
  try {
    scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    ADD_FAILURE() << "scaled_dot_product_attention accepted the call";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- ranks --------------------------------------------------------------------------

// 2-D to 8-D inputs and k/v broadcast against q are valid: tests/dispatch/broadcast_test.cpp.
TEST(InvalidInput, QueryRank) {
  Call c = valid_call();
  c.q = randn({16});
  EXPECT_THAT(op_error_of(c), AllOf(HasSubstr("query"), HasSubstr("1-D"), HasSubstr("[16]")));
}

TEST(InvalidInput, KeyAndValueRanksAboveTheQuerys) {
  Call c = valid_call();
  c.k = randn({1, 2, 4, 9, 16});
  EXPECT_THAT(op_error_of(c), AllOf(HasSubstr("key"), HasSubstr("5-D")));
  c = valid_call();
  c.v = randn({8});
  EXPECT_THAT(op_error_of(c), AllOf(HasSubstr("value"), HasSubstr("1-D")));
}

TEST(InvalidInput, UndefinedTensors) {
  Call c = valid_call();
  c.q = Tensor();
  EXPECT_THAT(error_of(c), HasSubstr("query"));
  c = valid_call();
  c.k = Tensor();
  EXPECT_THAT(error_of(c), HasSubstr("key"));
  c = valid_call();
  c.v = Tensor();
  EXPECT_THAT(error_of(c), HasSubstr("value"));
}

// ---- batch, heads, lengths, head dims ---------------------------------------------

TEST(InvalidInput, BatchMismatch) {
  Call c = valid_call();
  c.k = randn({3, 4, 9, 16});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("batch"), HasSubstr("2"),
                                 HasSubstr("3")));
  c = valid_call();
  c.v = randn({3, 4, 9, 8});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("batch")));
}

TEST(InvalidInput, HeadMismatchWithoutGqa) {
  Call c = valid_call();
  c.k = randn({2, 2, 9, 16});
  c.v = randn({2, 2, 9, 8});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("enable_gqa"), HasSubstr("4"),
                                 HasSubstr("2")));
}

TEST(InvalidInput, QueryHeadsNotAMultipleOfKvHeads) {
  Call c = valid_call();
  c.q = randn({2, 6, 7, 16});
  c.k = randn({2, 4, 9, 16});
  c.v = randn({2, 4, 9, 8});
  c.options.enable_gqa = true;
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("6"), HasSubstr("4")));
  // Hkv = 0.
  c.k = randn({2, 0, 9, 16});
  c.v = randn({2, 0, 9, 8});
  EXPECT_THAT(error_of(c), HasSubstr("key"));
}

TEST(InvalidInput, ValueHeadsDifferFromKeyHeads) {
  Call c = valid_call();
  c.v = randn({2, 2, 9, 8});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("heads")));
  c.options.enable_gqa = true;
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("heads")));
}

TEST(InvalidInput, HeadDimMismatch) {
  Call c = valid_call();
  c.k = randn({2, 4, 9, 32});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("16"), HasSubstr("32")));
}

TEST(InvalidInput, KeyValueLengthMismatch) {
  Call c = valid_call();
  c.v = randn({2, 4, 10, 8});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("9"), HasSubstr("10")));
}

// ---- dtypes and devices -------------------------------------------------------------

TEST(InvalidInput, DtypeMismatch) {
  Call c = valid_call();
  c.k = randn({2, 4, 9, 16}, DType::kBFloat16);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("bfloat16"), HasSubstr("float32")));
  c = valid_call();
  c.v = randn({2, 4, 9, 8}, DType::kFloat64);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("float64"), HasSubstr("float32")));
}

TEST(InvalidInput, NonFloatingQuery) {
  Call c = valid_call();
  c.q = Tensor::zeros({2, 4, 7, 16}, DType::kInt32);
  c.k = Tensor::zeros({2, 4, 9, 16}, DType::kInt32);
  c.v = Tensor::zeros({2, 4, 9, 8}, DType::kInt32);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("query"), HasSubstr("int32")));
}

TEST(InvalidInput, DeviceMismatch) {
  std::vector<float> buf(2 * 4 * 9 * 16, 0.5f);
  Call c = valid_call();
  c.k = Tensor::from_blob(buf.data(), {2, 4, 9, 16}, contiguous_strides({2, 4, 9, 16}),
                          DType::kFloat32, Device{DeviceType::kCUDA, 0});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("key"), HasSubstr("cuda:0"), HasSubstr("cpu")));
  c = valid_call();
  c.v = Tensor::from_blob(buf.data(), {2, 4, 9, 8}, contiguous_strides({2, 4, 9, 8}),
                          DType::kFloat32, Device{DeviceType::kExternal, 1});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("value"), HasSubstr("external:1")));
}

// ---- masks --------------------------------------------------------------------------

TEST(InvalidInput, MaskNotBroadcastable) {
  Call c = valid_call();
  c.options.attn_mask = Tensor::full({8, 9}, 1, DType::kBool);  // L is 7
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("[8, 9]")));
  c.options.attn_mask = Tensor::full({7, 10}, 1, DType::kBool);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("[7, 10]")));
  c.options.attn_mask = Tensor::full({3, 4, 7, 9}, 1, DType::kBool);  // batch 3 vs 2
  EXPECT_THAT(error_of(c), HasSubstr("attn_mask"));
  c.options.attn_mask = Tensor::full({1, 2, 4, 7, 9}, 1, DType::kBool);  // rank 5
  EXPECT_THAT(error_of(c), HasSubstr("attn_mask"));
  // GQA: the mask broadcasts against Hq, not Hkv.
  Call g = valid_call();
  g.k = randn({2, 2, 9, 16});
  g.v = randn({2, 2, 9, 8});
  g.options.enable_gqa = true;
  g.options.attn_mask = Tensor::full({2, 2, 7, 9}, 1, DType::kBool);
  EXPECT_THAT(error_of(g), HasSubstr("attn_mask"));
}

TEST(InvalidInput, MaskWrongDtype) {
  Call c = valid_call();
  c.options.attn_mask = Tensor::zeros({7, 9}, DType::kInt32);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("int32")));
  c.options.attn_mask = Tensor::zeros({7, 9}, DType::kFloat64);  // query is float32
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("float64"),
                                 HasSubstr("float32")));
  c.options.attn_mask = Tensor::zeros({7, 9}, DType::kBFloat16);
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("bfloat16")));
}

TEST(InvalidInput, MaskOnAnotherDevice) {
  std::vector<uint8_t> buf(7 * 9, 1);
  Call c = valid_call();
  c.options.attn_mask =
      Tensor::from_blob(buf.data(), {7, 9}, {9, 1}, DType::kBool, Device{DeviceType::kCUDA, 0});
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("cuda")));
}

TEST(InvalidInput, CausalTogetherWithMask) {
  Call c = valid_call();
  c.options.attn_mask = Tensor::full({7, 9}, 1, DType::kBool);
  c.options.is_causal = true;
  EXPECT_THAT(error_of(c), AllOf(HasSubstr("attn_mask"), HasSubstr("is_causal")));
}

// ---- scalars ------------------------------------------------------------------------

TEST(InvalidInput, DropoutOutsideZeroOne) {
  // 1.0 itself is valid (every weight dropped): tests/dispatch/degenerate_test.cpp.
  for (double p : {-0.1, -kInf, std::nextafter(1.0, 2.0), 1.5, kInf, kNaN}) {
    Call c = valid_call();
    c.options.dropout_p = p;
    EXPECT_THAT(error_of(c), HasSubstr("dropout_p")) << "p = " << p;
  }
}

TEST(InvalidInput, NonFiniteScale) {
  for (double s : {kInf, -kInf, kNaN}) {
    Call c = valid_call();
    c.options.scale = s;
    EXPECT_THAT(error_of(c), HasSubstr("scale")) << "scale = " << s;
  }
}

// Validation happens before dropout state is drawn: a rejected call leaves the generator.
TEST(InvalidInput, RejectedCallsDoNotAdvanceTheGenerator) {
  Generator gen(3);
  Call c = valid_call();
  c.options.dropout_p = 0.5;
  c.options.generator = &gen;
  c.options.scale = kNaN;
  EXPECT_THROW(make_params(c.q, c.k, c.v, c.options), Error);
  c.options.scale.reset();
  c.options.attn_mask = Tensor::zeros({7, 10}, DType::kBool);
  EXPECT_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options), Error);
  EXPECT_EQ(gen.next().offset, 0u);
}

// ---- sizes overflowing int64 ----------------------------------------------------------

TEST(InvalidInput, FromBlobRejectsOverflowingOffsets) {
  float x = 0;
  const int64_t huge = int64_t{1} << 40;
  EXPECT_THROW(Tensor::from_blob(&x, {huge, 1, huge, 16}, {huge * 16, 16, 16, 1},
                                 DType::kFloat32),
               Error);
  EXPECT_THROW(Tensor::from_blob(&x, {2, 4, 3, 16}, {std::numeric_limits<int64_t>::max(), 1, 1, 1},
                                 DType::kFloat32),
               Error);
}

// Zero strides keep every offset small, but [B, Hq, L, S] / the output have more than
// 2^63 elements: the op must refuse (not allocate, not wrap around).
TEST(InvalidInput, ScoreOrOutputElementCountOverflows) {
  std::vector<float> buf(64, 0.25f);
  const int64_t big = int64_t{1} << 32;
  auto broadcast = [&](const Shape& shape) {
    return Tensor::from_blob(buf.data(), shape, Shape(shape.size(), 0), DType::kFloat32);
  };
  const int64_t half = int64_t{1} << 31;
  Call c;
  // Each tensor has < 2^63 elements, but B * Hq * L * S = 2^31 * 2^31 * 2 = 2^63 does not.
  ASSERT_NO_THROW(c.q = broadcast({half, 1, half, 1}));
  c.k = broadcast({half, 1, 2, 1});
  c.v = broadcast({half, 1, 2, 1});
  EXPECT_THAT(error_of(c), HasSubstr("overflow"));
  // The output B * Hq * L * Ev overflows (scores do not: S = 1).
  c.q = broadcast({half, 1, half, 1});
  c.k = broadcast({half, 1, 1, 1});
  c.v = broadcast({half, 1, 1, 4});
  EXPECT_THAT(error_of(c), HasSubstr("overflow"));
  c.q = broadcast({1, 1, big, 16});  // L * S = 2^64
  c.k = broadcast({1, 1, big, 16});
  c.v = broadcast({1, 1, big, 16});
  const std::string msg = error_of(c);
  EXPECT_THAT(msg, HasSubstr("overflow"));
  EXPECT_THAT(msg, AnyOf(HasSubstr("query"), HasSubstr("key"), HasSubstr("value")))
      << "the message names no argument";
}

// Sizes past 2^62 (broadcast views) would overflow the kernels' rounding to tiles and
// chunks ((L + 63) / 64 for L near INT64_MAX).
TEST(InvalidInput, SizesPastTwoToTheSixtyTwo) {
  std::vector<float> buf(4, 0.5f);
  const int64_t near_max = std::numeric_limits<int64_t>::max() - 5;
  Call c;
  c.q = Tensor::from_blob(buf.data(), {1, 1, near_max, 1}, {0, 0, 0, 0}, DType::kFloat32);
  c.k = Tensor::from_blob(buf.data(), {1, 1, 1, 1}, {0, 0, 0, 0}, DType::kFloat32);
  c.v = c.k;
  EXPECT_THAT(error_of(c), HasSubstr("query: expected sizes <= 2^62, got [1, 1, " +
                                     std::to_string(near_max) + ", 1]"));
  c.q = c.k;
  c.v = Tensor::from_blob(buf.data(), {1, 1, 1, (int64_t{1} << 62) + 1}, {0, 0, 0, 0},
                          DType::kFloat32);
  EXPECT_THAT(error_of(c), HasSubstr("value: expected sizes <= 2^62"));
}

// MATH's [B, Hq, L, S] float32 scores for broadcast k/v of S = 2^62 - 1 keys come to
// 2^64 - 4 bytes: the allocator's rounding wrapped that to an empty block, which the
// scores' zero fill then overran. It is an out-of-memory error naming the bytes (valid
// input otherwise: make_params accepts it).
TEST(InvalidInput, ScratchNearTheAddressSpaceIsAnError) {
  std::vector<float> buf(4, 0.5f);
  const int64_t keys = (int64_t{1} << 62) - 1;
  Call c;
  c.q = Tensor::from_blob(buf.data(), {1, 1, 1, 1}, {1, 1, 1, 1}, DType::kFloat32);
  c.k = Tensor::from_blob(buf.data(), {1, 1, keys, 1}, {0, 0, 0, 0}, DType::kFloat32);
  c.v = c.k;
  const sdpa_kernel math(SDPBackend::MATH);
  try {
    scaled_dot_product_attention(c.q, c.k, c.v);
    ADD_FAILURE() << "MATH accepted the call";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory: could not allocate 18446744073709551612"));
  }
}

// ---- sdpa_kernel misuse -----------------------------------------------------------

TEST(InvalidInput, GuardWithNoBackendOrError) {
  EXPECT_THROW(sdpa_kernel(std::vector<SDPBackend>{}), Error);
  EXPECT_THROW(sdpa_kernel guard(SDPBackend::ERROR), Error);
  EXPECT_THROW(sdpa_kernel({SDPBackend::MATH, SDPBackend::ERROR}), Error);
}

// ---- valid edge inputs are not errors -----------------------------------------------

TEST(ValidInput, EdgeCasesAreAccepted) {
  Call c = valid_call();
  c.options.scale = -0.5;  // negative but finite
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
  c.options.scale = 0.0;
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
  c = valid_call();
  c.options.dropout_p = 0.0;
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
  c.options.dropout_p = std::nextafter(1.0, 0.0);
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
  // Masks of the query dtype, bool, 0-D-like [1] and [S] shapes.
  c = valid_call();
  c.options.attn_mask = Tensor::zeros({9}, DType::kFloat32);
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
  c.options.attn_mask = Tensor::full({1}, 1, DType::kBool);
  EXPECT_NO_THROW(scaled_dot_product_attention(c.q, c.k, c.v, c.options));
}

// A call without query rows returns its empty output at once, whatever the keys: beside
// 2^40 broadcast keys MATH's per-key scratch would need terabytes (it ran for seconds at
// 2^27). Without query rows every key gradient is zero.
TEST(ValidInput, CallsWithoutQueryRowsDoNoWork) {
  std::vector<float> buf(8, 0.5f);
  const auto broadcast = [&](const Shape& shape) {
    return Tensor::from_blob(buf.data(), shape, Shape(shape.size(), 0), DType::kFloat32);
  };
  const int64_t huge = int64_t{1} << 40;
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(backend_name(backend)));
    const sdpa_kernel guard(backend);
    const Tensor q = broadcast({0, 2, 4, 8}), kv = broadcast({0, 2, huge, 8});
    const AttentionResult r = scaled_dot_product_attention_with_lse(q, kv, kv);
    EXPECT_EQ(r.out.sizes(), (Shape{0, 2, 4, 8}));
    EXPECT_EQ(r.lse.sizes(), (Shape{0, 2, 4}));
    const AttentionGradients g =
        scaled_dot_product_attention_backward(q, q, kv, kv, r.out, r.lse);
    EXPECT_EQ(g.grad_k.sizes(), (Shape{0, 2, huge, 8}));
    // No query rows beside 1000 keys: zero key and value gradients.
    const Tensor no_rows = broadcast({1, 2, 0, 8}), keys = randn({1, 2, 1000, 8});
    const AttentionResult e = scaled_dot_product_attention_with_lse(no_rows, keys, keys);
    const AttentionGradients ge =
        scaled_dot_product_attention_backward(no_rows, no_rows, keys, keys, e.out, e.lse);
    for (const Tensor* grad : {&ge.grad_k, &ge.grad_v}) {
      ASSERT_EQ(grad->sizes(), (Shape{1, 2, 1000, 8}));
      for (int64_t j = 0; j < 1000; j += 37) EXPECT_EQ(grad->item({0, 1, j, 7}), 0.0) << j;
    }
  }
}

}  // namespace
}  // namespace sdpa
