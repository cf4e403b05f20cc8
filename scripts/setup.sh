#!/usr/bin/env bash
# Installs everything megadsl needs on a fresh Debian bookworm machine (idempotent).
set -euo pipefail
# libopenblas0-pthread: Debian's LibTorch calls the system BLAS, and without it that is the
# reference netlib BLAS, about 12x slower on the tests' matrix products.
packages=(build-essential cmake ninja-build libtorch-dev libgloo-dev libboost-dev
          librange-v3-dev catch2 nlohmann-json3-dev libopenblas0-pthread python3)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
