#!/usr/bin/env bash
# The ThreadSanitizer job of scripts/test.sh (and so of CI): the tsan preset (clang,
# -fsanitize=thread at -O1) builds the test programs whose tests run threads, and CTest
# runs those tests (the tsan test preset's filter): sdpa_kernel guards and flags across
# std::threads, the shared dropout generator, simultaneous calls (CPU, the plugin device,
# the registry's derived variants and CPU fallback), the per-thread capability override,
# and the OpenMP kernels at several thread counts. With the venv python/tests/run.sh made
# (SDPA_PY_VENV, default build/venv-py), the Python module is built the same way and the
# Python thread tests run on an interpreter that carries TSan's runtime
# (scripts/tsan_python.cpp).
#
# OpenMP: clang links LLVM's libomp, whose synchronization TSan cannot see by itself (it
# would report the barriers of every parallel region as races). Archer (libarcher.so,
# shipped with libomp-dev) is loaded as an OMPT tool through OMP_TOOL_LIBRARIES and tells
# TSan about OpenMP's barriers, tasks and locks; ignore_noninstrumented_modules keeps the
# runtime's own uninstrumented code (and CPython's) out of the reports. Races inside our
# parallel regions are still reported.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SDPA_PY_VENV:-build/venv-py}"
python=()
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import numpy, pytest" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q nanobind==3.1.0
  python=(-DSDPA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(realpath "$venv")/bin/python")
fi
cmake --preset tsan "${python[@]}"
cmake --build --preset tsan
omp="$(ldd build/tsan/tests/sdpa_core_tests | awk '/libomp/ {print $3; exit}')"
archer="$(dirname "$(readlink -f "$omp")")/libarcher.so"
if [ ! -f "$archer" ]; then
  echo "tsan: no libarcher.so beside the OpenMP runtime '$omp' (libomp-dev installs it)" >&2
  exit 1
fi
export OMP_TOOL_LIBRARIES="$archer"
ctest --preset tsan --parallel "$(nproc)"

if ((${#python[@]})); then
  cmake --build build/tsan --target _C
  read -r include libdir ldversion < <("$venv/bin/python" -c "import sysconfig as s; \
print(s.get_paths()['include'], s.get_config_var('LIBDIR'), s.get_config_var('LDVERSION'))")
  # In the venv's bin, so that the interpreter finds the venv (pyvenv.cfg) as python does.
  clang++ -fsanitize=thread -O1 -I"$include" scripts/tsan_python.cpp -o "$venv/bin/python-tsan" \
    -L"$libdir" -Wl,-rpath,"$libdir" -l"python$ldversion"
  rm -rf build/tsan/package && mkdir -p build/tsan/package
  cp -r python/sdpa build/tsan/package/sdpa
  cp build/tsan/python/_C*.so build/tsan/package/sdpa/
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1" \
    PYTHONPATH=build/tsan/package SDPA_TESTS_WITHOUT_TORCH=1 \
    "$venv/bin/python-tsan" -m pytest -q -s -p no:cacheprovider \
    python/tests/test_threads.py python/tests/test_flex_threads.py
fi
