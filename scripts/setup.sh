#!/usr/bin/env bash
# README step 1: installs what is needed, builds (Release), and runs the main job:
# `sdpa run` on the shipped attention tensors of all-MiniLM-L6-v2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset release
cmake --build --preset release
./build/release/tools/sdpa run
