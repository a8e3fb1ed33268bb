// SDPA_INLINE: how the SIMD kernels (src/cpu, src/flex) inline their helpers.
//
// Optimized builds force-inline them (Highway's HWY_INLINE), so that a tile loop compiles
// to one function whose accumulators and row state stay in registers.
//
// Under AddressSanitizer or ThreadSanitizer every inlined access carries its check, and
// the forced inlining builds functions so large that clang's register allocation on them
// is superlinear: clang 14 took 32 minutes for flash_decode_tile.cc with ASan + UBSan at
// -O1, and 1.5 minutes with ordinary inline helpers (the compiler then inlines what its
// cost model accepts). Sanitized builds check memory and threads, not speed, so there the
// helpers are plain `inline`.
#pragma once

#include "hwy/base.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SDPA_SANITIZED_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SDPA_SANITIZED_BUILD 1
#endif

#ifdef SDPA_SANITIZED_BUILD
#define SDPA_INLINE inline
#else
#define SDPA_INLINE HWY_INLINE
#endif
