// sdpa::Tensor: factories, views (sharing storage), copies with broadcast and dtype
// conversion, element access and the size/overflow errors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/reference.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;
using test::to_doubles;

// A float64 tensor of `shape` holding 0, 1, 2, ... in row-major order.
Tensor iota(const Shape& shape, DType dtype = DType::kFloat64) {
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  test::fill_from_doubles(t, v);
  return t;
}

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// ---- factories ----------------------------------------------------------------------

TEST(TensorFactories, EmptyIsContiguousAlignedAndTyped) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                      DType::kBool, DType::kInt32, DType::kInt64}) {
    const Tensor t = Tensor::empty({2, 3, 5}, dtype);
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.dim(), 3);
    EXPECT_EQ(t.sizes(), (Shape{2, 3, 5}));
    EXPECT_EQ(t.strides(), (Shape{15, 5, 1}));
    EXPECT_EQ(t.numel(), 30);
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.device(), Device{});
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.storage_offset(), 0);
    EXPECT_TRUE(aligned64(t.data_ptr())) << dtype_name(dtype);
    EXPECT_GE(t.storage()->nbytes(), 30 * element_size(dtype));
  }
}

TEST(TensorFactories, DefaultConstructedIsUndefined) {
  const Tensor t;
  EXPECT_FALSE(t.defined());
}

TEST(TensorFactories, ZerosAndFull) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                      DType::kInt32, DType::kInt64}) {
    for (double x : to_doubles(Tensor::zeros({3, 7}, dtype))) EXPECT_EQ(x, 0.0);
    const bool integral = dtype == DType::kInt32 || dtype == DType::kInt64;
    for (double x : to_doubles(Tensor::full({4, 5}, integral ? -7.0 : 2.5, dtype))) {
      EXPECT_EQ(x, integral ? -7.0 : 2.5) << dtype_name(dtype);
    }
  }
  // full() rounds to the dtype: 1 + 2^-8 is a tie in bfloat16 -> 1 (even).
  EXPECT_EQ(Tensor::full({1}, 1.0 + std::ldexp(1.0, -8), DType::kBFloat16).item({0}), 1.0);
  EXPECT_EQ(Tensor::full({1}, 1e6, DType::kFloat16).item({0}),
            std::numeric_limits<double>::infinity());
  for (double x : to_doubles(Tensor::full({9}, 1.0, DType::kBool))) EXPECT_EQ(x, 1.0);
}

TEST(TensorFactories, ZeroSizedAndScalarShapes) {
  const Tensor empty = Tensor::empty({0, 4}, DType::kFloat32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.sizes(), (Shape{0, 4}));
  const Tensor scalar = Tensor::full({}, 3.0, DType::kFloat32);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item(std::span<const int64_t>{}), 3.0);
}

TEST(TensorFactories, NegativeOrOverflowingSizesThrow) {
  EXPECT_THROW(Tensor::empty({2, -1}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::zeros({int64_t{1} << 40, int64_t{1} << 40}, DType::kFloat32), Error);
  // numel fits in int64 but the byte count does not.
  EXPECT_THROW(Tensor::empty({int64_t{1} << 62}, DType::kFloat64), Error);
}

TEST(TensorShapes, HelpersAndSizeAccessors) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({}), Shape{});
  // Zero-size with dimensions whose product overflows (a fuzzer finding: signed overflow).
  const Tensor empty = Tensor::empty({0, int64_t{1} << 60, 16, 2}, DType::kFloat32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.stride(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(empty.stride(1), 32);
  EXPECT_EQ(checked_numel({2, 3, 4}), 24);
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_THROW(checked_numel({int64_t{1} << 32, int64_t{1} << 32}), Error);
  EXPECT_THROW(checked_numel({std::numeric_limits<int64_t>::max(), 2}), Error);
  EXPECT_EQ(shape_str({2, 16, 7, 64}), "[2, 16, 7, 64]");
  EXPECT_EQ(shape_str({}), "[]");
  const Tensor t = Tensor::empty({2, 16, 7, 64}, DType::kFloat32);
  EXPECT_EQ(t.describe(), "[2, 16, 7, 64] float32 cpu");
  EXPECT_EQ(t.size(-1), 64);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.stride(-2), 64);
  EXPECT_THROW(t.size(4), Error);
  EXPECT_THROW(t.size(-5), Error);
  EXPECT_THROW(t.stride(4), Error);
}

// ---- views --------------------------------------------------------------------------

TEST(TensorViews, TransposeSwapsSizesAndStridesAndSharesStorage) {
  Tensor t = iota({2, 3, 4});
  Tensor tt = t.transpose(0, 2);
  EXPECT_EQ(tt.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(tt.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(tt.item({c, b, a}), t.item({a, b, c}));
  test::set_at(tt, {3, 2, 1}, -7.0);
  EXPECT_EQ(t.item({1, 2, 3}), -7.0);
  EXPECT_EQ(t.transpose(-1, -3).sizes(), (Shape{4, 3, 2}));
  EXPECT_THROW(t.transpose(0, 3), Error);
}

TEST(TensorViews, Permute) {
  const Tensor t = iota({2, 3, 4, 5});
  const Tensor p = t.permute({0, 2, 1, 3});  // BHSD <-> BSHD
  EXPECT_EQ(p.sizes(), (Shape{2, 4, 3, 5}));
  EXPECT_EQ(p.strides(), (Shape{60, 5, 20, 1}));
  EXPECT_EQ(p.item({1, 3, 2, 4}), t.item({1, 2, 3, 4}));
  EXPECT_EQ(t.permute({-1, 0, 1, 2}).sizes(), (Shape{5, 2, 3, 4}));
  EXPECT_THROW(t.permute({0, 1, 2}), Error);     // too few
  EXPECT_THROW(t.permute({0, 0, 1, 2}), Error);  // repeated
  EXPECT_THROW(t.permute({0, 1, 2, 4}), Error);  // out of range
}

TEST(TensorViews, SelectDropsADimension) {
  const Tensor t = iota({2, 3, 4});
  const Tensor s = t.select(1, 2);
  EXPECT_EQ(s.sizes(), (Shape{2, 4}));
  EXPECT_EQ(s.strides(), (Shape{12, 1}));
  EXPECT_EQ(s.storage_offset(), 8);
  EXPECT_EQ(s.item({1, 3}), t.item({1, 2, 3}));
  EXPECT_EQ(t.select(-1, 0).sizes(), (Shape{2, 3}));
  EXPECT_THROW(t.select(1, 3), Error);
  EXPECT_THROW(t.select(3, 0), Error);
}

TEST(TensorViews, SliceWithStepAndClampedEnd) {
  const Tensor t = iota({3, 10});
  const Tensor s = t.slice(1, 2, 9, 3);  // columns 2, 5, 8
  EXPECT_EQ(s.sizes(), (Shape{3, 3}));
  EXPECT_EQ(s.strides(), (Shape{10, 3}));
  EXPECT_EQ(s.item({2, 0}), 22.0);
  EXPECT_EQ(s.item({2, 2}), 28.0);
  const Tensor clamped = t.slice(1, 7, 100);
  EXPECT_EQ(clamped.sizes(), (Shape{3, 3}));
  EXPECT_EQ(clamped.item({0, 2}), 9.0);
  EXPECT_EQ(t.slice(1, 4, 4).sizes(), (Shape{3, 0}));
  EXPECT_EQ(t.slice(-1, 1, 3).item({1, 0}), 11.0);
  // A slice of a slice composes offsets.
  EXPECT_EQ(t.slice(1, 2, 10).slice(1, 1, 3).item({0, 0}), 3.0);
  EXPECT_THROW(t.slice(1, 0, 5, 0), Error);
}

TEST(TensorViews, ExpandBroadcastsWithZeroStrides) {
  const Tensor t = iota({3, 1});
  const Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  EXPECT_EQ(e.item({1, 2, 3}), 2.0);
  EXPECT_EQ(e.storage(), t.storage());
  EXPECT_THROW(t.expand({2, 4}), Error);  // 3 -> 4
  EXPECT_THROW(t.expand({1}), Error);     // fewer dims
}

TEST(TensorViews, UnsqueezeSqueeze) {
  const Tensor t = iota({2, 3});
  const Tensor u = t.unsqueeze(1);
  EXPECT_EQ(u.sizes(), (Shape{2, 1, 3}));
  EXPECT_EQ(u.item({1, 0, 2}), 5.0);
  EXPECT_EQ(t.unsqueeze(-1).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(t.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(u.squeeze(1).sizes(), (Shape{2, 3}));
  EXPECT_EQ(u.squeeze(1).strides(), t.strides());
  EXPECT_THROW(t.unsqueeze(4), Error);
}

TEST(TensorViews, ViewReshapesContiguousTensors) {
  const Tensor t = iota({2, 3, 4});
  const Tensor v = t.view({6, 4});
  EXPECT_EQ(v.sizes(), (Shape{6, 4}));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_EQ(v.item({5, 3}), 23.0);
  EXPECT_THROW(t.view({5, 4}), Error);
  EXPECT_THROW(t.transpose(0, 1).view({24}), Error);
}

// ---- copies -------------------------------------------------------------------------

TEST(TensorCopies, ContiguousReturnsSelfOrACopy) {
  const Tensor t = iota({3, 4});
  EXPECT_EQ(t.contiguous().storage(), t.storage());
  const Tensor tt = t.transpose(0, 1);
  const Tensor c = tt.contiguous();
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.sizes(), (Shape{4, 3}));
  EXPECT_EQ(to_doubles(c), to_doubles(tt));
  // Broadcast and sliced views materialize too.
  const Tensor e = iota({1, 3}).expand({2, 3}).contiguous();
  EXPECT_EQ(to_doubles(e), (std::vector<double>{0, 1, 2, 0, 1, 2}));
}

TEST(TensorCopies, CloneIsIndependent) {
  Tensor t = iota({2, 2});
  Tensor c = t.clone();
  EXPECT_NE(c.storage(), t.storage());
  test::set_at(c, {0, 0}, 9);
  EXPECT_EQ(t.item({0, 0}), 0.0);
  EXPECT_EQ(c.dtype(), t.dtype());
}

TEST(TensorCopies, ToConvertsWithRoundToNearestEven) {
  Tensor t = Tensor::empty({6}, DType::kFloat64);
  const std::vector<double> v = {1.0 + std::ldexp(1.0, -8),      // bf16 tie -> 1
                                 1.0 + 3 * std::ldexp(1.0, -8),  // bf16 tie -> 1 + 2^-6
                                 1.0 + std::ldexp(1.0, -11),     // f16 tie -> 1
                                 70000.0,                         // f16 overflow
                                 std::ldexp(1.0, -24),            // f16 smallest subnormal
                                 -0.1};
  test::fill_from_doubles(t, v);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    const Tensor c = t.to(dtype);
    EXPECT_EQ(c.dtype(), dtype);
    EXPECT_TRUE(c.is_contiguous());
    const auto got = to_doubles(c);
    for (size_t i = 0; i < v.size(); ++i) {
      // round_to_dtype of the float32 value (the library converts through float32).
      const double f = static_cast<float>(v[i]);
      EXPECT_EQ(got[i], test::round_to_dtype(f, dtype)) << dtype_name(dtype) << " " << v[i];
    }
  }
  // Float to int and bool.
  const Tensor ints = Tensor::full({2}, 3.0, DType::kFloat32).to(DType::kInt64);
  EXPECT_EQ(ints.item({1}), 3.0);
  EXPECT_EQ(Tensor::full({1}, 0.5, DType::kFloat32).to(DType::kBool).item({0}), 1.0);
  EXPECT_EQ(Tensor::zeros({1}, DType::kFloat32).to(DType::kBool).item({0}), 0.0);
}

TEST(TensorCopies, CopyBroadcastsAndConverts) {
  Tensor dst = Tensor::zeros({2, 3}, DType::kBFloat16);
  Tensor src = Tensor::empty({3}, DType::kFloat32);
  test::fill_from_doubles(src, {1.0, 1.0 + std::ldexp(1.0, -8), -3.25});
  dst.copy_(src);
  EXPECT_EQ(to_doubles(dst), (std::vector<double>{1.0, 1.0, -3.25, 1.0, 1.0, -3.25}));

  // Into a non-contiguous destination (a transposed view writes through to its base).
  Tensor base = Tensor::zeros({3, 2}, DType::kFloat64);
  Tensor view = base.transpose(0, 1);  // [2, 3]
  view.copy_(iota({2, 3}, DType::kFloat32));
  EXPECT_EQ(to_doubles(base), (std::vector<double>{0, 3, 1, 4, 2, 5}));

  // Size-1 dims broadcast; incompatible shapes throw.
  Tensor d2 = Tensor::zeros({2, 2, 2}, DType::kFloat32);
  d2.copy_(iota({2, 1, 2}));
  EXPECT_EQ(to_doubles(d2), (std::vector<double>{0, 1, 0, 1, 2, 3, 2, 3}));
  EXPECT_THROW(d2.copy_(iota({3})), Error);
  EXPECT_THROW(d2.copy_(iota({2, 2, 2, 2})), Error);
}

// Every element of `got` equals the one of `want` at the same index (read with item()).
void expect_same_elements(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.sizes(), want.sizes());
  std::vector<int64_t> index(static_cast<size_t>(want.dim()), 0);
  for (int64_t linear = 0; linear < want.numel(); ++linear) {
    int64_t rest = linear;
    for (int64_t d = want.dim() - 1; d >= 0; --d) {
      index[static_cast<size_t>(d)] = rest % want.size(d);
      rest /= want.size(d);
    }
    ASSERT_EQ(got.item(index), want.item(index)) << "element " << linear;
  }
}

// Copies between tensors of one dtype move whole runs of the last dimension: views whose
// last dimension is strided, transposed, stepped or broadcast (stride 0), into strided
// destinations, 0-d and empty tensors, 2-, 4- and 8-byte elements.
TEST(TensorCopies, SameDtypeCopiesOfStridedViews) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor src = iota({3, 4, 5}, dtype);
    const Tensor views[] = {src.permute({2, 0, 1}), src.slice(2, 1, 5, 2), src.transpose(0, 2),
                            src.select(1, 2).unsqueeze(-1).expand({3, 5, 4}), src};
    for (const Tensor& view : views) {
      expect_same_elements(view.contiguous(), view);
      Tensor strided = Tensor::zeros({view.size(2), view.size(1), view.size(0)}, dtype)
                           .permute({2, 1, 0});
      strided.copy_(view);
      expect_same_elements(strided, view);
    }
    Tensor scalar = Tensor::zeros({}, dtype);
    scalar.copy_(src.select(0, 2).select(0, 3).select(0, 4));
    EXPECT_EQ(scalar.item({}), 59.0);
    Tensor empty = Tensor::empty({0, 5}, dtype);
    empty.copy_(Tensor::empty({0, 5}, dtype));
  }
}

TEST(TensorCopies, CopyOfOverlappingSelfIsSafe) {
  Tensor t = iota({4});
  t.copy_(t);
  EXPECT_EQ(to_doubles(t), (std::vector<double>{0, 1, 2, 3}));
}

// ---- element access -----------------------------------------------------------------

TEST(TensorItems, EveryDtypeRoundTrips) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                      DType::kInt32, DType::kInt64}) {
    Tensor t = Tensor::zeros({2, 3}, dtype);
    test::set_at(t, {1, 2}, -5.0);
    EXPECT_EQ(t.item({1, 2}), -5.0) << dtype_name(dtype);
    EXPECT_EQ(t.item({1, 1}), 0.0);
    // Written where the strides say.
    EXPECT_EQ(test::load_element(t.data_ptr(), dtype, 5), -5.0) << dtype_name(dtype);
  }
  Tensor b = Tensor::zeros({3}, DType::kBool);
  test::set_at(b, {1}, 1.0);
  EXPECT_EQ(to_doubles(b), (std::vector<double>{0, 1, 0}));
  Tensor big = Tensor::zeros({1}, DType::kInt64);
  test::set_at(big, {0}, 9007199254740992.0);  // 2^53
  EXPECT_EQ(big.item({0}), 9007199254740992.0);
}

TEST(TensorItems, SetItemRoundsHalfTypes) {
  Tensor h = Tensor::zeros({1}, DType::kFloat16);
  test::set_at(h, {0}, 1.0 + 3 * std::ldexp(1.0, -11));
  EXPECT_EQ(h.item({0}), 1.0 + std::ldexp(1.0, -9));
  Tensor b = Tensor::zeros({1}, DType::kBFloat16);
  test::set_at(b, {0}, 3.0e38 * 10);
  EXPECT_TRUE(std::isinf(b.item({0})));
}

TEST(TensorItems, BadIndicesThrow) {
  const Tensor t = Tensor::zeros({2, 3}, DType::kFloat32);
  EXPECT_THROW(t.item({2, 0}), Error);
  EXPECT_THROW(t.item({0, 3}), Error);
  EXPECT_THROW(t.item({0}), Error);
  EXPECT_THROW(t.item({0, 0, 0}), Error);
}

// ---- from_blob ----------------------------------------------------------------------

TEST(TensorFromBlob, WrapsWithoutCopying) {
  std::vector<float> buf(12);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  Tensor t = Tensor::from_blob(buf.data(), {3, 4}, {1, 3}, DType::kFloat32);  // column-major
  EXPECT_EQ(t.data_ptr(), buf.data());
  EXPECT_EQ(t.item({2, 1}), 5.0);
  test::set_at(t, {0, 0}, 42.0);
  EXPECT_EQ(buf[0], 42.0f);
}

TEST(TensorFromBlob, OwnerIsReleasedWithTheLastView) {
  int released = 0;
  std::vector<double> buf(8, 1.0);
  {
    std::shared_ptr<void> owner(nullptr, [&](void*) { ++released; });
    Tensor view;
    {
      Tensor t = Tensor::from_blob(buf.data(), {8}, {1}, DType::kFloat64, {}, owner);
      owner.reset();
      view = t.slice(0, 2, 6);
    }
    EXPECT_EQ(released, 0);
    EXPECT_EQ(view.item({0}), 1.0);
  }
  EXPECT_EQ(released, 1);
}

TEST(TensorFromBlob, NegativeSizesAndOverflowingExtentsThrow) {
  float x = 0;
  const int64_t big = std::numeric_limits<int64_t>::max();
  try {
    Tensor::from_blob(&x, {2, -3}, {3, 1}, DType::kFloat32);
    ADD_FAILURE() << "negative size accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("-3"));
  }
  EXPECT_THROW(Tensor::from_blob(&x, {int64_t{1} << 62, 4}, {4, 1}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {3}, {big / 2 + 1}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {2, 2}, {big, 1}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {2, 2, 2}, {big / 2, big / 2, 2}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {3}, {-(big / 2) - 2}, DType::kFloat32), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {2, 3}, {3}, DType::kFloat32), Error);  // rank mismatch
  // Zero-size tensors with any stride are fine.
  EXPECT_NO_THROW(Tensor::from_blob(&x, {0, 5}, {big, 1}, DType::kFloat32));
}

// The element offsets fit in int64 but the byte offsets do not: data_ptr() + offset *
// element_size would wrap, so the extent check must be in bytes.
TEST(TensorFromBlob, OverflowingByteExtentsThrow) {
  double x = 0;
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(Tensor::from_blob(&x, {2}, {big / 4}, DType::kFloat64), Error);
  EXPECT_THROW(Tensor::from_blob(&x, {3}, {big / 2}, DType::kFloat32), Error);
}

}  // namespace
}  // namespace sdpa
