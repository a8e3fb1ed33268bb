#!/usr/bin/env bash
# README step 2: builds and runs every test (GoogleTest via CTest, then pytest when the
# Python package is present, then the sanitizer build's tests and the fuzz targets, then
# the threaded tests under ThreadSanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset release
cmake --build --preset release
# One test per core: the presets leave CTest's parallelism to the caller.
ctest --preset release --parallel "$(nproc)"
if [ -f python/tests/run.sh ]; then
  bash python/tests/run.sh
fi
bash scripts/sanitize.sh
bash scripts/tsan.sh
