// The float8_e4m3fn -> bfloat16 widening of the decode kernels (src/cpu/e4m3_bf16.h)
// against each code's value: all 256 codes at every position of a vector, rows of odd
// lengths (masked tails) with nothing written past their end, and masked loads that read
// codes outside the mask as 0. Needs AVX512_VBMI (skipped elsewhere).

#include "cpu/e4m3_bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/bf16_dot.h"
#include "sdpa/dtype.h"

namespace sdpa::cpu {
namespace {

// The bfloat16 bits of code c's value: its float32 bits' upper half (exact, 4 significant
// bits), computed from the scalar float8 conversion, not the kernels' table.
uint16_t want_bits(uint8_t c) {
  float8_e4m3fn x;
  x.bits = c;
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(x)) >> 16);
}

// Checks got against code c: equal bits, or for the NaN codes a bfloat16 NaN of c's sign.
void expect_widened(uint16_t got, uint8_t c, size_t at) {
  if ((c & 0x7F) == 0x7F) {
    EXPECT_EQ(got & 0x7F80, 0x7F80) << "code " << int{c} << " at " << at;
    EXPECT_NE(got & 0x007F, 0) << "code " << int{c} << " at " << at;
    EXPECT_EQ(got & 0x8000, (c & 0x80) << 8) << "code " << int{c} << " at " << at;
    return;
  }
  EXPECT_EQ(got, want_bits(c)) << "code " << int{c} << " at " << at;
}

TEST(E4M3Bf16, EveryCodeAtEveryPositionOfARow) {
  if (!vbmi_available()) GTEST_SKIP() << "this CPU has no AVX512_VBMI";
  // 256 rows of 64 codes: row r holds code (r + 37 i) & 0xFF at position i, so each code
  // meets each position.
  for (int r = 0; r < 256; ++r) {
    uint8_t codes[64];
    for (int i = 0; i < 64; ++i) codes[i] = static_cast<uint8_t>(r + 37 * i);
    uint16_t out[64];
    WidenE4M3Row(codes, 64, out);
    for (size_t i = 0; i < 64; ++i) expect_widened(out[i], codes[i], i);
  }
}

TEST(E4M3Bf16, RowsOfOddLengthsWriteNothingPastTheirEnd) {
  if (!vbmi_available()) GTEST_SKIP() << "this CPU has no AVX512_VBMI";
  constexpr uint16_t kGuard = 0xA5A5;
  for (int64_t n : {1, 7, 31, 32, 33, 63, 65, 127, 129, 257, 1000}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 131 + n);
    std::vector<uint16_t> out(codes.size() + 80, kGuard);
    WidenE4M3Row(codes.data(), n, out.data());
    for (size_t i = 0; i < codes.size(); ++i) expect_widened(out[i], codes[i], i);
    for (size_t i = codes.size(); i < out.size(); ++i) EXPECT_EQ(out[i], kGuard) << i;
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) void widen_vector(
    const uint8_t* codes, __mmask32 mask, uint16_t* out) {
  _mm512_storeu_si512(out, E4M3ToBf16(LoadE4M3Bf16Table(), codes, mask));
}

TEST(E4M3Bf16, MaskedVectorReadsCodesOutsideTheMaskAsZero) {
  if (!vbmi_available()) GTEST_SKIP() << "this CPU has no AVX512_VBMI";
  for (int r = 0; r < 256; r += 3) {
    uint8_t codes[32];
    for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>(r + 53 * i + 1);
    for (const __mmask32 mask : {~__mmask32{0}, __mmask32{0x7FFFF}, __mmask32{1}, __mmask32{0}}) {
      uint16_t out[32];
      widen_vector(codes, mask, out);
      for (size_t i = 0; i < 32; ++i) {
        if ((mask >> i) & 1) {
          expect_widened(out[i], codes[i], i);
        } else {
          EXPECT_EQ(out[i], 0) << "lane " << i << " outside the mask";
        }
      }
    }
  }
}

}  // namespace
}  // namespace sdpa::cpu
