// sdpa::Shape: std::vector's behaviour for the operations tensors use, inline storage, and
// a clear error past Shape::kMaxDims.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

std::vector<int64_t> as_vector(const Shape& s) { return s.to_vector(); }

TEST(Shape, ConstructsLikeAVector) {
  EXPECT_EQ(as_vector(Shape{}), std::vector<int64_t>{});
  EXPECT_EQ(as_vector(Shape{2, 7, 1}), (std::vector<int64_t>{2, 7, 1}));
  EXPECT_EQ(as_vector(Shape(3)), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(as_vector(Shape(2, -5)), (std::vector<int64_t>{-5, -5}));
  const std::vector<int64_t> v{4, 63, 65};
  EXPECT_EQ(as_vector(Shape(v)), v);
  EXPECT_EQ(as_vector(Shape(v.begin() + 1, v.end())), (std::vector<int64_t>{63, 65}));
  const int32_t narrow[] = {1, 257};
  EXPECT_EQ(as_vector(Shape(std::begin(narrow), std::end(narrow))),
            (std::vector<int64_t>{1, 257}));
}

TEST(Shape, EditsLikeAVector) {
  Shape s{5, 12, 27};
  s.insert(s.begin(), 1);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{1, 5, 12, 27}));
  s.insert(s.end(), 32);
  s.insert(s.begin() + 2, 9);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{1, 5, 9, 12, 27, 32}));
  EXPECT_EQ(*s.erase(s.begin() + 2), 12);
  s.erase(s.end() - 1);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{1, 5, 12, 27}));
  s.pop_back();
  s.push_back(8);
  EXPECT_EQ(s.front(), 1);
  EXPECT_EQ(s.back(), 8);
  s.resize(6, 3);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{1, 5, 12, 8, 3, 3}));
  s.resize(2);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{1, 5}));
  s.assign(3, 7);
  EXPECT_EQ(as_vector(s), (std::vector<int64_t>{7, 7, 7}));
  s.clear();
  EXPECT_TRUE(s.empty());
}

TEST(Shape, CopiesAreIndependentAndCompareByValue) {
  Shape a{2, 3, 4};
  Shape b = a;
  b[1] = 30;
  EXPECT_EQ(a[1], 3);
  EXPECT_FALSE(a == b);
  b[1] = 3;
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == (Shape{2, 3}));  // a prefix is not equal
  EXPECT_FALSE((Shape{2, 3, 4, 0}) == a);
}

TEST(Shape, MoreThanMaxDimsIsAnErrorNamingTheRank) {
  Shape s(Shape::kMaxDims, 1);
  try {
    s.push_back(1);
    FAIL() << "expected sdpa::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 8 dimensions, got 9"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.size(), Shape::kMaxDims);  // unchanged by the failed push
  EXPECT_THROW(Shape(std::vector<int64_t>(Shape::kMaxDims + 3, 1)), Error);
  EXPECT_THROW(s.insert(s.begin(), 2), Error);
  EXPECT_THROW(s.resize(Shape::kMaxDims + 1), Error);
  // Tensors reach the limit the same way.
  const Tensor t = Tensor::zeros(Shape(Shape::kMaxDims, 1), DType::kFloat32);
  EXPECT_THROW(t.unsqueeze(0), Error);
}

}  // namespace
}  // namespace sdpa
