#pragma once
// bfloat16 tile GEMMs on Intel AMX (Sapphire Rapids and later): TDPBF16PS multiplies a
// 16 x 32 bf16 tile by a 32 x 16 one into a 16 x 16 float32 tile, 16384 FLOPs per
// instruction against vdpbf16ps's 64 (measured on one Xeon core: 2.8 TFLOP/s against
// 0.11). Same operands and results as Bf16Gemm (bf16_dot.h), whose pair-packed B is
// AMX's VNNI layout for B tiles, so the flash kernels switch between the two per call.
//
// Tiles are per-thread state that must be configured (LDTILECFG, ~80 ns) before use and
// that Linux grants a process only on request (arch_prctl(ARCH_REQ_XCOMP_PERM)); an
// AmxTiles scope configures them once for a thread's whole share of a call.

#include <cstdint>

#include "cpu/bf16_dot.h"
#include "cpu/matrix_view.h"

namespace sdpa::cpu {

/// Whether this CPU has AMX-TILE and AMX-BF16 and the OS enables their state and granted
/// it to this process (asking for the permission), whatever SDPA_DISABLE_AMX says.
bool cpu_and_os_have_amx();

/// cpu_and_os_have_amx() unless SDPA_DISABLE_AMX is 1 (tests use it to run the vdpbf16ps
/// kernels on AMX CPUs); decided on the first call.
bool amx_available();

/// Loads the tile configuration of AmxBf16Gemm on the calling thread for its lifetime and
/// releases the tiles (TILERELEASE) at its end, so other AMX users on the thread (oneDNN
/// under torch) find them released as they expect. Nested scopes on one thread leave the
/// outermost in charge. Inactive when `enable` is false or !amx_available().
class AmxTiles {
 public:
  explicit AmxTiles(bool enable);
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;

  /// Whether AmxBf16Gemm may run on this thread during this scope.
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool owner_ = false;
};

/// C[m, n] (+)= A[m, 2 depth_pairs] . B, exactly Bf16Gemm's contract (bf16_dot.h layouts:
/// dims.depth counts pairs, b pair-packed [depth_pairs][n][2], n a multiple of 16, A read
/// through a.ld and a.pair_stride), on AMX tiles: 32 x 32 blocks of C in four
/// accumulator tiles. A rows that are not 16 full pairs apart in memory (the transposed
/// operands of the backward) and partial tiles go through zero-padded copies. Products
/// accumulate in float32 like vdpbf16ps's, in a different order. Requires an active
/// AmxTiles scope on the calling thread.
void AmxBf16Gemm(const GemmDims& dims, const Bf16PairRows& a, const uint16_t* b, Matrix<float> c,
                 GemmOutput output);

/// AmxBf16Gemm with B in groups of `group_pairs` pairs (a multiple of 16) held in separate
/// buffers: pairs [g * group_pairs, (g + 1) * group_pairs) of B are b_groups[g], each
/// pair-packed [group_pairs][n][2]; dims.depth is a multiple of group_pairs. The flash
/// forward's deferred P.v, whose value tiles are packed apart.
void AmxBf16GemmGroups(const GemmDims& dims, const Bf16PairRows& a,
                       const uint16_t* const* b_groups, int64_t group_pairs, Matrix<float> c,
                       GemmOutput output);

/// AmxBf16Gemm when `amx` (an active AmxTiles scope), else Bf16Gemm.
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16GemmOn(bool amx, const GemmDims& dims,
                                                                     const Bf16PairRows& a,
                                                                     const uint16_t* b,
                                                                     Matrix<float> c,
                                                                     GemmOutput output) {
  if (amx) return AmxBf16Gemm(dims, a, b, c, output);
  Bf16Gemm(dims, a, b, c, output);
}

}  // namespace sdpa::cpu
