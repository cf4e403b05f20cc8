#!/usr/bin/env bash
# Configures and builds megadsl into ./build (after scripts/setup.sh), and puts the Python module
# (build/python: megadsl, its verl engine and config groups) on the path of the project's
# environments, .venv and .venv-verl, so `.venv/bin/python -c "import megadsl"` works.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${MEGADSL_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs" ${MEGADSL_BUILD_TARGETS:+--target $MEGADSL_BUILD_TARGETS}
for venv in .venv .venv-verl; do
  if [ -x "$venv/bin/python" ]; then
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$PWD/build/python" > "$site/megadsl-build.pth"
  fi
done
