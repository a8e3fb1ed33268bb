// AMX bf16 GEMM (amx_bf16.h): tile configuration, the OS permission, operand staging.

#include "cpu/amx_bf16.h"

#include <cpuid.h>
#include <immintrin.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/syscall.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sdpa::cpu {
namespace {

// Every tile: 16 rows of 64 bytes (16 x 32 bf16 for A, 16 pairs x 16 columns for B,
// 16 x 16 float32 for C). Tiles 0-3 accumulate C, 4-5 hold A, 6-7 hold B.
constexpr int kTileRows = 16;
constexpr int kTileBytes = 64;
constexpr int64_t kTileWords = kTileRows * 16;  // 32-bit words (bf16 pairs, floats) per tile

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

TileConfig standard_config() {
  TileConfig config{};
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = kTileBytes;
    config.rows[t] = kTileRows;
  }
  return config;
}

thread_local int t_scope_depth = 0;

// (Constructors and destructors do not take GCC's target attribute: these do.)
__attribute__((target("amx-tile"))) void load_tile_config() {
  static const TileConfig config = standard_config();
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// Where the tiles of one operand come from: k-step s of the full steps at
// base + s * step_bytes, rows stride bytes apart; the partial last step (if any) from a
// zero-padded copy at `tail` (rows kTileBytes apart). With `groups`, the steps come in
// runs of group_steps from separate buffers: step s at
// groups[s / group_steps] + base_offset + (s % group_steps) * step_bytes.
struct TileSource {
  const uint8_t* base;
  int64_t step_bytes;
  int64_t stride;
  const uint8_t* tail;
  const uint16_t* const* groups = nullptr;
  int64_t group_steps = 0;
  int64_t base_offset = 0;

  const uint8_t* step(int64_t s) const {
    if (groups == nullptr) return base + s * step_bytes;
    return reinterpret_cast<const uint8_t*>(groups[s / group_steps]) + base_offset +
           s % group_steps * step_bytes;
  }
};

// A 16 x 16 float32 block of C: in place (rows stride bytes apart), or through `staged`
// when the block has fewer than 16 rows.
struct CBlock {
  float* c;
  int64_t ldc;
  int rows;
  float* staged;

  float* tile() const { return rows == kTileRows ? c : staged; }
  int64_t stride() const { return rows == kTileRows ? ldc * 4 : kTileBytes; }
};

// GCC 12's AVX-512 unpack intrinsics pass an undefined vector as their masked-off source,
// which -Wmaybe-uninitialized reports at every call.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// 32-bit words (bf16 pairs) of one 16 x 16 A tile: row r = pairs [d0, d0 + pairs) of A
// row r0 + r, zero beyond `rows` and `pairs`.
__attribute__((target("avx512f"))) void stage_a_tile(const Bf16PairRows& a, int64_t r0, int rows,
                                                     int64_t d0, int pairs, uint32_t* dst) {
  std::memset(dst, 0, kTileWords * sizeof(uint32_t));
  if (a.pair_stride == 2) {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(dst + r * 16, a.data + (r0 + r) * a.ld + 2 * d0, pairs * sizeof(uint32_t));
    }
    return;
  }
  if (a.ld == 2) {
    // Consecutive rows' pairs are adjacent words (a pair-packed transpose): load 16 words
    // per pair and transpose the 16 x 16 block (three rounds of 2 x 2 block swaps after
    // an interleave, 64 shuffles).
    const __mmask16 row_mask = static_cast<__mmask16>((1u << rows) - 1u);
    __m512i v[16];
    for (int d = 0; d < 16; ++d) {
      v[d] = d < pairs
                 ? _mm512_maskz_loadu_epi32(row_mask, a.data + 2 * r0 + (d0 + d) * a.pair_stride)
                 : _mm512_setzero_si512();
    }
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
      v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
      v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
      v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
    for (int r = 0; r < rows; ++r) _mm512_storeu_si512(dst + r * 16, v[r]);
    return;
  }
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < pairs; ++d) {
      std::memcpy(dst + r * 16 + d, a.data + (r0 + r) * a.ld + (d0 + d) * a.pair_stride, 4);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// One block of up to 2 x 2 C tiles: C(s, j) += A(s) . B(j) over every k-step.
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(const TileSource* a_src,
                                                            const TileSource* b_src,
                                                            const CBlock* c, bool two_rows,
                                                            bool two_cols, int64_t full_steps,
                                                            bool accumulate) {
  // Tile numbers are immediates, so each tile's code is spelled out.
  if (accumulate) {
    _tile_loadd(0, c[0].tile(), c[0].stride());
    if (two_cols) _tile_loadd(1, c[1].tile(), c[1].stride());
    if (two_rows) _tile_loadd(2, c[2].tile(), c[2].stride());
    if (two_rows && two_cols) _tile_loadd(3, c[3].tile(), c[3].stride());
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const bool tail = a_src[0].tail != nullptr;
  for (int64_t s = 0; s < full_steps + (tail ? 1 : 0); ++s) {
    const bool full = s < full_steps;
    const auto at = [&](const TileSource& src) { return full ? src.step(s) : src.tail; };
    const auto stride = [&](const TileSource& src) { return full ? src.stride : kTileBytes; };
    _tile_loadd(4, at(a_src[0]), stride(a_src[0]));
    _tile_loadd(6, at(b_src[0]), stride(b_src[0]));
    _tile_dpbf16ps(0, 4, 6);
    if (two_cols) {
      _tile_loadd(7, at(b_src[1]), stride(b_src[1]));
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_rows) {
      _tile_loadd(5, at(a_src[1]), stride(a_src[1]));
      _tile_dpbf16ps(2, 5, 6);
      if (two_cols) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c[0].tile(), c[0].stride());
  if (two_cols) _tile_stored(1, c[1].tile(), c[1].stride());
  if (two_rows) _tile_stored(2, c[2].tile(), c[2].stride());
  if (two_rows && two_cols) _tile_stored(3, c[3].tile(), c[3].stride());
}

// Per-thread staging memory, grown as needed: A tiles, B tail tiles, C blocks.
std::vector<uint32_t>& staging() {
  thread_local std::vector<uint32_t> words;
  return words;
}

}  // namespace

bool cpu_and_os_have_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
  if (!amx_bf16 || !amx_tile) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1u)) return false;  // OSXSAVE
  uint32_t xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr uint32_t kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
  if ((xcr0_low & kTileState) != kTileState) return false;
#ifdef __linux__
  // Linux 5.16+ hands the 8 KiB tile data state to processes that ask for it; without the
  // permission the first tile instruction raises SIGILL.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool amx_available() {
  static const bool available = [] {
    const char* off = std::getenv("SDPA_DISABLE_AMX");
    if (off != nullptr && std::string(off) == "1") return false;
    return cpu_and_os_have_amx();
  }();
  return available;
}

AmxTiles::AmxTiles(bool enable) {
  if (!enable || !amx_available()) return;
  active_ = true;
  if (t_scope_depth++ > 0) return;
  owner_ = true;
  load_tile_config();
}

AmxTiles::~AmxTiles() {
  if (!active_) return;
  --t_scope_depth;
  if (owner_) release_tiles();
}

namespace {

// AmxBf16Gemm's body; B in groups of group_pairs pairs (b_groups, depth a multiple of
// group_pairs, itself of 16) or in one buffer (b).
void amx_gemm(const GemmDims& dims, const Bf16PairRows& a, const uint16_t* b,
              const uint16_t* const* b_groups, int64_t group_pairs, Matrix<float> c,
              GemmOutput output) {
  const int64_t m = dims.m, n = dims.n, depth = dims.depth;
  if (m <= 0 || n <= 0) return;
  const bool accumulate = output == GemmOutput::kAccumulate;
  const int64_t full_steps = depth / 16;
  const int tail_pairs = static_cast<int>(depth % 16);
  const int64_t steps = full_steps + (tail_pairs > 0 ? 1 : 0);
  if (steps == 0) {
    if (!accumulate) {
      for (int64_t r = 0; r < m; ++r) std::fill(c.data + r * c.ld, c.data + r * c.ld + n, 0.0f);
    }
    return;
  }
  const int64_t col_tiles = n / 16;
  // Staging: two A row blocks of `steps` tiles, one B tail tile per column tile, 4 C tiles.
  std::vector<uint32_t>& words = staging();
  const size_t need = static_cast<size_t>((2 * steps + col_tiles + 4) * kTileWords);
  if (words.size() < need) words.resize(need);
  uint32_t* a_staged = words.data();
  uint32_t* b_tail = a_staged + 2 * steps * kTileWords;
  float* c_staged = reinterpret_cast<float*>(b_tail + col_tiles * kTileWords);

  const int64_t ldb_bytes = 4 * n;
  if (tail_pairs > 0) {  // never with groups (whole steps only)
    const uint16_t* rows = b + full_steps * 16 * 2 * n;
    for (int64_t j = 0; j < col_tiles; ++j) {
      uint32_t* tile = b_tail + j * kTileWords;
      std::memset(tile, 0, kTileWords * sizeof(uint32_t));
      for (int d = 0; d < tail_pairs; ++d) {
        std::memcpy(tile + d * 16, rows + d * 2 * n + 32 * j, kTileBytes);
      }
    }
  }
  const auto b_source = [&](int64_t j) {
    if (b_groups != nullptr) {
      return TileSource{nullptr, 16 * ldb_bytes, ldb_bytes, nullptr, b_groups, group_pairs / 16,
                        64 * j};
    }
    return TileSource{
        reinterpret_cast<const uint8_t*>(b + 32 * j), 16 * ldb_bytes, ldb_bytes,
        tail_pairs > 0 ? reinterpret_cast<const uint8_t*>(b_tail + j * kTileWords) : nullptr};
  };

  for (int64_t r0 = 0; r0 < m; r0 += 2 * kTileRows) {
    const bool two_rows = m - r0 > kTileRows;
    TileSource a_src[2];
    int block_rows[2];
    for (int s = 0; s < (two_rows ? 2 : 1); ++s) {
      const int64_t row = r0 + s * kTileRows;
      block_rows[s] = static_cast<int>(std::min<int64_t>(kTileRows, m - row));
      uint32_t* staged = a_staged + s * steps * kTileWords;
      const bool in_place = a.pair_stride == 2 && block_rows[s] == kTileRows;
      // Tiles read in place: whole rows of 16 pairs; the rest staged zero-padded.
      for (int64_t k = in_place ? full_steps : 0; k < steps; ++k) {
        const int pairs = k < full_steps ? 16 : tail_pairs;
        stage_a_tile(a, row, block_rows[s], 16 * k, pairs, staged + k * kTileWords);
      }
      const uint8_t* staged_bytes = reinterpret_cast<const uint8_t*>(staged);
      const uint8_t* tail = tail_pairs > 0 ? staged_bytes + full_steps * kTileWords * 4 : nullptr;
      a_src[s] = in_place ? TileSource{reinterpret_cast<const uint8_t*>(a.data + row * a.ld),
                                       kTileBytes, 2 * a.ld, tail}
                          : TileSource{staged_bytes, kTileWords * 4, kTileBytes, tail};
    }
    for (int64_t j = 0; j < col_tiles; j += 2) {
      const bool two_cols = j + 1 < col_tiles;
      const TileSource b_src[2] = {b_source(j), b_source(two_cols ? j + 1 : j)};
      CBlock blocks[4];
      for (int s = 0; s < 2; ++s) {
        for (int t = 0; t < 2; ++t) {
          const int rows = s == 0 || two_rows ? block_rows[s] : 0;
          CBlock& block = blocks[2 * s + t];
          block = {c.data + (r0 + s * kTileRows) * c.ld + 16 * (j + t), c.ld, rows,
                   c_staged + (2 * s + t) * kTileWords};
          if (rows == kTileRows || rows == 0 || (t == 1 && !two_cols)) continue;
          std::memset(block.staged, 0, kTileWords * sizeof(float));
          if (accumulate) {
            for (int r = 0; r < rows; ++r) {
              std::memcpy(block.staged + r * 16, block.c + r * c.ld, kTileBytes);
            }
          }
        }
      }
      amx_block(a_src, b_src, blocks, two_rows, two_cols, full_steps, accumulate);
      for (int i = 0; i < 4; ++i) {
        const CBlock& block = blocks[i];
        if (block.rows == kTileRows || block.rows == 0 || (i % 2 == 1 && !two_cols)) continue;
        for (int r = 0; r < block.rows; ++r) {
          std::memcpy(block.c + r * c.ld, block.staged + r * 16, kTileBytes);
        }
      }
    }
  }
}

}  // namespace

void AmxBf16Gemm(const GemmDims& dims, const Bf16PairRows& a, const uint16_t* b, Matrix<float> c,
                 GemmOutput output) {
  amx_gemm(dims, a, b, nullptr, 0, c, output);
}

void AmxBf16GemmGroups(const GemmDims& dims, const Bf16PairRows& a,
                       const uint16_t* const* b_groups, int64_t group_pairs, Matrix<float> c,
                       GemmOutput output) {
  amx_gemm(dims, a, nullptr, b_groups, group_pairs, c, output);
}

}  // namespace sdpa::cpu
