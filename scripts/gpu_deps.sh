#!/usr/bin/env bash
# Gathers the header-only dependencies (Boost.Hana, range-v3, Catch2 2, nlohmann-json) with their
# CMake packages into .deps/ (git-ignored), from this machine's Debian packages, for a machine that
# cannot install them: the lent GPU machine (scripts/gpu_check.sh configures with
# -DCMAKE_PREFIX_PATH=.deps). The CMake packages compute their prefix from their own location.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include/boost .deps/lib/cmake .deps/share/cmake
cp -r /usr/include/boost/hana /usr/include/boost/hana.hpp /usr/include/boost/version.hpp \
      /usr/include/boost/config /usr/include/boost/config.hpp /usr/include/boost/core .deps/include/boost/
cp -r /usr/include/range /usr/include/concepts /usr/include/meta /usr/include/std \
      /usr/include/catch2 /usr/include/nlohmann .deps/include/
# Gloo's headers: c10d's ProcessGroupGloo.hpp includes them, and PyTorch's wheel does not ship them.
cp -r /usr/include/gloo .deps/include/
cp -r /usr/lib/cmake/range-v3 /usr/lib/cmake/Catch2 .deps/lib/cmake/
# Catch2 2.x is header-only; its package also names the (unused) main library, which must exist.
cp /usr/lib/libCatch2WithMain.a .deps/lib/
cp -r /usr/share/cmake/nlohmann_json .deps/share/cmake/
du -sh .deps
