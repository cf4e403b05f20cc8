#!/usr/bin/env bash
# The README's test command: install, build, run every test tier with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${MEGADSL_TEST_JOBS:-2}" --timeout 900
