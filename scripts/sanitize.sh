#!/usr/bin/env bash
# The sanitizer job of scripts/test.sh (and so of CI): the sanitize preset (clang,
# AddressSanitizer + UBSan at -O1, every SIMD target Highway compiles) builds the C++ tests
# and the libFuzzer targets into build/sanitize; CTest runs the tests, then
# scripts/fuzz.sh runs each fuzz target for SDPA_FUZZ_SECONDS (default 60) from the
# seed corpus, the Python one (atheris) against the package python/tests/run.sh built.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset sanitize
cmake --build --preset sanitize
ctest --preset sanitize --parallel "$(nproc)"
py="${SDPA_PY_VENV:-build/venv-py}/bin/python"
if [ -x "$py" ] && "$py" -c "import sdpa" 2>/dev/null; then
  "$py" -m pip install -q atheris==3.0.0
  export SDPA_FUZZ_PYTHON="$py"
fi
bash scripts/fuzz.sh "${SDPA_FUZZ_SECONDS:-60}"
