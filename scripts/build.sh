#!/usr/bin/env bash
# Configures and builds megadsl into ./build (after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${MEGADSL_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
