// RowView's float16 rows (src/cpu/rows.h): contiguous rows convert through F16C on CPUs
// that have it, strided rows element by element through float16's portable conversion.
// Both must give the same values: every half bit pattern widened, and floats that round
// up, down, to even, to subnormals, to zero and to infinity narrowed, in rows whose lengths
// leave a scalar tail.

#include "cpu/rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::cpu {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A [1, 1, rows, cols] float16 view of `bits`, with column stride 1 or 2.
Tensor HalfRows(std::vector<uint16_t>& bits, int64_t rows, int64_t cols, int64_t col_stride) {
  return Tensor::from_blob(bits.data(), {1, 1, rows, cols},
                           {rows * cols * col_stride, rows * cols * col_stride, cols * col_stride,
                            col_stride},
                           DType::kFloat16);
}

TEST(RowView, Float16LoadMatchesPortableConversionForEveryHalf) {
  constexpr int64_t kCols = 1000;  // 65536 / 1000: 66 rows, the last one partly used
  constexpr int64_t kRows = (65536 + kCols - 1) / kCols;
  for (int64_t col_stride : {1, 2}) {
    std::vector<uint16_t> bits(static_cast<size_t>(kRows * kCols * col_stride));
    for (size_t i = 0; i < bits.size() / col_stride; ++i) {
      bits[i * col_stride] = static_cast<uint16_t>(i);
    }
    const RowView rows(HalfRows(bits, kRows, kCols, col_stride), 0, 0);
    std::vector<float> row(kCols);
    for (int64_t r = 0; r < kRows; ++r) {
      rows.load(r, row.data(), 2.0f);
      for (int64_t c = 0; c < kCols; ++c) {
        float16 h;
        h.bits = bits[static_cast<size_t>((r * kCols + c) * col_stride)];
        const float want = static_cast<float>(h) * 2.0f;
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(row[c])) << "bits " << h.bits;
        } else {
          EXPECT_EQ(FloatBits(row[c]), FloatBits(want)) << "bits " << h.bits;
        }
      }
    }
  }
}

TEST(RowView, Float16StoreMatchesPortableConversion) {
  std::vector<float> values;
  for (float f : {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e6f, INFINITY, -INFINITY,
                  6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-9f}) {
    values.push_back(f);
    values.push_back(-f);
  }
  // Halfway cases between neighbouring halves: ties to even, and one float past them.
  for (uint16_t h = 0x0001; h < 0x7bff; h = static_cast<uint16_t>(h * 3 + 7)) {
    float16 lo, hi;
    lo.bits = h;
    hi.bits = static_cast<uint16_t>(h + 1);
    const float mid = (static_cast<float>(lo) + static_cast<float>(hi)) / 2;
    values.push_back(mid);
    values.push_back(std::nextafter(mid, 0.0f));
    values.push_back(std::nextafter(mid, INFINITY));
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
  while (values.size() % 8 != 5) values.push_back(std::exp2(exponent(rng)));
  const int64_t cols = static_cast<int64_t>(values.size());
  for (int64_t col_stride : {1, 2}) {
    std::vector<uint16_t> bits(static_cast<size_t>(cols * col_stride));
    RowView(HalfRows(bits, 1, cols, col_stride), 0, 0).store(0, values.data());
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(bits[static_cast<size_t>(c * col_stride)], float16(values[c]).bits)
          << "value " << values[c] << " col_stride " << col_stride;
    }
  }
}

}  // namespace
}  // namespace sdpa::cpu
