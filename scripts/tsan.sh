#!/usr/bin/env bash
# The ThreadSanitizer job of scripts/test.sh (and so of CI): the tsan preset (clang,
# -fsanitize=thread at -O1) builds the test programs whose tests run threads, and CTest
# runs those tests (the tsan test preset's filter): sdpa_kernel guards and flags across
# std::threads, the shared dropout generator, simultaneous calls (CPU, the plugin device,
# the registry's derived variants and CPU fallback), the per-thread capability override,
# and the OpenMP kernels at several thread counts.
#
# OpenMP: clang links LLVM's libomp, whose synchronization TSan cannot see by itself (it
# would report the barriers of every parallel region as races). Archer (libarcher.so,
# shipped with libomp-dev) is loaded as an OMPT tool through OMP_TOOL_LIBRARIES and tells
# TSan about OpenMP's barriers, tasks and locks; ignore_noninstrumented_modules keeps the
# runtime's own uninstrumented code out of the reports. Races inside our parallel regions
# are still reported.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset tsan
cmake --build --preset tsan
omp="$(ldd build/tsan/tests/sdpa_core_tests | awk '/libomp/ {print $3; exit}')"
archer="$(dirname "$(readlink -f "$omp")")/libarcher.so"
if [ ! -f "$archer" ]; then
  echo "tsan: no libarcher.so beside the OpenMP runtime '$omp' (libomp-dev installs it)" >&2
  exit 1
fi
OMP_TOOL_LIBRARIES="$archer" ctest --preset tsan --parallel "$(nproc)"
