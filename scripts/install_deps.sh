#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages, and the cuDNN frontend
# headers when a CUDA toolkit is present (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
# clang, libomp-dev and libclang-rt-14-dev (libFuzzer, the sanitizer runtimes, Archer): the
# sanitize and tsan presets of scripts/sanitize.sh and scripts/tsan.sh; python3-dev: the
# Python module's headers, and libpython for tsan.sh's interpreter; libopenmpi-dev and
# openmpi-bin: sdpa_mpi (context parallelism over MPI) and its mpirun tests.
packages=(cmake ninja-build g++ libhwy-dev libdlpack-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev python3 python3-venv python3-dev clang libomp-dev
          libclang-rt-14-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# With a CUDA toolkit: the cuDNN frontend (header-only; PyPI's nvidia-cudnn-frontend,
# pinned) for the CUDNN_ATTENTION backend, unpacked into .deps/cudnn-frontend/include.
frontend=1.32.0
dest=.deps/cudnn-frontend
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if [ "$(cat "$dest/VERSION" 2>/dev/null)" != "$frontend" ]; then
    rm -rf "$dest" .deps/wheels && mkdir -p "$dest" .deps/wheels
    [ -x .deps/venv/bin/pip ] || python3 -m venv .deps/venv
    .deps/venv/bin/pip download -q --no-deps --only-binary=:all: -d .deps/wheels \
      "nvidia-cudnn-frontend==$frontend"
    python3 -c "import zipfile, glob, sys; z = zipfile.ZipFile(glob.glob('.deps/wheels/*.whl')[0]); [z.extract(n, sys.argv[1]) for n in z.namelist() if n.startswith('include/')]" "$dest"
    echo "$frontend" > "$dest/VERSION"
    rm -rf .deps/wheels
  fi
fi
