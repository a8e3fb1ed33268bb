// The bf16 packers of the vdpbf16ps kernels (src/cpu/pack_bf16.h) against their layouts'
// definitions, for contiguous rows (the AVX-512 transposes and interleaves, on CPUs with
// AVX-512BW) and rows with a column stride of 2 (element by element): odd head dims,
// partial tiles, odd row counts, a first row other than 0.

#include "cpu/pack_bf16.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::cpu {
namespace {

// [1, 1, rows, dim] bf16 rows with distinct nonzero bits; col_stride 1 or 2 (the odd
// columns of a buffer twice as wide).
struct Rows {
  std::vector<uint16_t> buffer;
  Tensor tensor;
  int64_t col_stride;

  Rows(int64_t rows, int64_t dim, int64_t col_stride) : col_stride(col_stride) {
    buffer.resize(static_cast<size_t>(rows * dim * col_stride));
    std::mt19937 rng(static_cast<uint32_t>(rows * 1000 + dim));
    for (uint16_t& bits : buffer) bits = static_cast<uint16_t>(rng() % 0xFFFF + 1);
    tensor = Tensor::from_blob(
        buffer.data(), {1, 1, rows, dim},
        {rows * dim * col_stride, rows * dim * col_stride, dim * col_stride, col_stride},
        DType::kBFloat16);
  }
  uint16_t at(int64_t r, int64_t e) const {
    return buffer[static_cast<size_t>((r * tensor.size(3) + e) * col_stride)];
  }
};

constexpr int64_t kFirst = 3;  // rows read start here
const int64_t kDims[] = {1, 2, 7, 31, 32, 33, 63, 64, 65, 128};
const int64_t kCounts[] = {1, 2, 15, 16, 17, 63, 64};

TEST(PackBf16, DimPairsMatchTheirLayout) {
  constexpr int64_t n = 64;
  for (int64_t col_stride : {1, 2}) {
    for (int64_t dim : kDims) {
      for (int64_t count : kCounts) {
        const Rows rows(kFirst + count, dim, col_stride);
        const int64_t dim2 = dim + dim % 2;
        std::vector<uint16_t> got(static_cast<size_t>(dim2 * n), 0xABCD);
        pack_bf16_dim_pairs(RowView(rows.tensor, 0, 0), kFirst, count, n, got.data());
        for (int64_t e = 0; e < dim2; ++e) {
          for (int64_t c = 0; c < n; ++c) {
            const uint16_t want = c < count && e < dim ? rows.at(kFirst + c, e) : 0;
            ASSERT_EQ(got[static_cast<size_t>((e / 2) * 2 * n + 2 * c + e % 2)], want)
                << "col_stride " << col_stride << " dim " << dim << " count " << count
                << " element " << e << " row " << c;
          }
        }
      }
    }
  }
}

TEST(PackBf16, RowPairsMatchTheirLayout) {
  for (int64_t col_stride : {1, 2}) {
    for (int64_t dim : kDims) {
      for (int64_t count : kCounts) {
        const Rows rows(kFirst + count, dim, col_stride);
        const int64_t ld = (dim + 15) / 16 * 16 + 16;
        const int64_t count2 = count + count % 2;
        std::vector<uint16_t> got(static_cast<size_t>(count2 * ld + 64), 0xABCD);
        pack_bf16_row_pairs(RowView(rows.tensor, 0, 0), kFirst, count, ld, got.data());
        for (int64_t c = 0; c < count2; ++c) {
          for (int64_t e = 0; e < ld; ++e) {
            const uint16_t want = c < count && e < dim ? rows.at(kFirst + c, e) : 0;
            ASSERT_EQ(got[static_cast<size_t>((c / 2) * 2 * ld + 2 * e + c % 2)], want)
                << "col_stride " << col_stride << " dim " << dim << " count " << count << " row "
                << c << " element " << e;
          }
        }
        // Nothing past the layout is written.
        for (int64_t i = count2 * ld; i < count2 * ld + 64; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(i)], 0xABCD) << "dim " << dim << " count " << count;
        }
      }
    }
  }
}

TEST(PackBf16, RowsMatchTheirLayout) {
  for (int64_t col_stride : {1, 2}) {
    for (int64_t dim : kDims) {
      const int64_t count = 17, ld = dim + 5;
      const Rows rows(kFirst + count, dim, col_stride);
      std::vector<uint16_t> got(static_cast<size_t>(count * ld), 0xABCD);
      pack_bf16_rows(RowView(rows.tensor, 0, 0), kFirst, count, {got.data(), ld});
      for (int64_t c = 0; c < count; ++c) {
        for (int64_t e = 0; e < ld; ++e) {
          ASSERT_EQ(got[static_cast<size_t>(c * ld + e)], e < dim ? rows.at(kFirst + c, e) : 0)
              << "col_stride " << col_stride << " dim " << dim << " row " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sdpa::cpu
