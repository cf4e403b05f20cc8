#!/usr/bin/env bash
# The README's test command: install, build, run every test tier with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${MEGADSL_TEST_JOBS:-2}" --timeout 900
cd ..
# The fuzzers of the file readers, each for a bounded time (0 skips them).
seconds=${MEGADSL_FUZZ_SECONDS:-60}
if [ "$seconds" != 0 ]; then bash scripts/fuzz.sh "$seconds"; fi
