#!/usr/bin/env bash
# Prepares .gpu-deps/ for a GPU machine without network access (the lent device
# machines): the Debian packages of the build dependencies unpacked into .gpu-deps/usr,
# and the cuDNN frontend headers. scripts/gpu_check.sh uses them when present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
rm -rf .gpu-deps && mkdir -p .gpu-deps/debs
(cd .gpu-deps/debs && apt-get download -q libhwy-dev libhwy1 libdlpack-dev libcli11-dev \
   nlohmann-json3-dev libgtest-dev libgmock-dev)
for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps; done
rm -rf .gpu-deps/debs
echo "gpu deps: $(du -sh .gpu-deps | cut -f1) in .gpu-deps (bring it with .deps/cudnn-frontend)"
