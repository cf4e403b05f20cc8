#!/usr/bin/env bash
# Builds the GPU checks' programs here, against the PyTorch the lent GPU machine has, so that the
# machine's few minutes go to running them (scripts/gpu_check.sh with PREBUILT). Packs into .gpu/
# (git-ignored; carry it): bin.tar.xz (bench_gpu_step, cuda_tests, megadsl and the PyTorch version
# they were built against) and fixtures.tar.xz (every fixture but the critics, as the tree would be
# too large to send with them).
#
#   bash scripts/gpu_prebuild.sh 2.11.0     # the version that machine's python3 reports
#
# The wheel's LibTorch (PyPI, its CUDA 13 build) is unpacked under /tmp; linking borrows this
# .venv's CUDA 13 libraries for their sonames, and at run time gpu_check.sh puts that machine's
# own PyTorch and CUDA libraries first on the library path.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${1:?the PyTorch version of the GPU machine, e.g. 2.11.0}
W=/tmp/megadsl-torch-$V
BUILD=${BUILD:-build-gpu-$V}
PY=.venv/bin/python
if [ ! -f "$W/site/torch/share/cmake/Torch/TorchConfig.cmake" ]; then
  mkdir -p "$W"
  $PY -m pip download -q --no-deps --only-binary=:all: "torch==$V" -d "$W"
  unzip -q -o "$W"/torch-"$V"-*.whl 'torch/*' -d "$W/site"
fi
ln -sfn "$($PY -c 'import nvidia; print(list(nvidia.__path__)[0])')" "$W/site/nvidia"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$W/site/torch/share/cmake/Torch" \
  -DMEGADSL_BUILD_PYTHON=OFF -DMEGADSL_BUILD_EXAMPLES=ON -DTORCH_CUDA_ARCH_LIST=9.0 -DMEGADSL_CUDA_ARCHITECTURES=90 >/dev/null
ninja -C "$BUILD" -j "${JOBS:-$(nproc)}" bench_gpu_step cuda_tests megadsl_tool
echo "$V" >"$BUILD/TORCH_VERSION"
mkdir -p .gpu
tar -cJf .gpu/bin.tar.xz -C "$BUILD" TORCH_VERSION bench/bench_gpu_step tests/cuda/cuda_tests tools/megadsl
tar -cf - -C tests/fixtures --exclude=critic --exclude='*.py' --exclude=README.md . | xz -T0 -6 >.gpu/fixtures.tar.xz
du -sh .gpu/*
