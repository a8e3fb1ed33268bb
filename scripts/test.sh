#!/usr/bin/env bash
# README step 2: builds and runs every test (GoogleTest via CTest, then pytest when the
# Python package is present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset release
cmake --build --preset release
ctest --preset release
if [ -f python/tests/run.sh ]; then
  bash python/tests/run.sh
fi
