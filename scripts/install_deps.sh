#!/usr/bin/env bash
# Installs the build and test dependencies from Debian's packages (idempotent).
set -euo pipefail
packages=(cmake ninja-build g++ libhwy-dev libdlpack-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev python3 python3-venv)
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
