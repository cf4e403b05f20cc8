#!/usr/bin/env bash
# The GPU checks in one command, for a machine with an NVIDIA GPU, its own PyTorch (python3) and
# nvcc, and no network (the lent device machine): builds megadsl against that PyTorch, runs the
# CUDA test tier, a smoke run of the Python module on CUDA, then bench/gpu_throughput.py (bf16
# parity against transformers, tokens/s, MFU, peak memory, a profile of one step; megadsl's side in
# the program bench_gpu_step). Logs and tables go to $OUT (default ./gpu-out), at most 8 files;
# the summary to stdout.
#
#   bash scripts/gpu_deps.sh          # here, once: the header-only dependencies into .deps/
#   bash scripts/gpu_check.sh         # there (the device tool: carry .deps)
# or, to spend the GPU machine's minutes on running rather than building:
#   bash scripts/gpu_prebuild.sh 2.11.0   # here: the programs against that machine's PyTorch, packed in .gpu/
#   PREBUILT=.gpu/bin.tar.xz FIXTURES_TAR=.gpu/fixtures.tar.xz bash scripts/gpu_check.sh   # there (carry .gpu)
#
# Each phase has its own time limit, so one that fails or hangs leaves the others their time.
# Knobs (environment): TARGETS, SKIP_NCCL, SKIP_SMOKE, SKIP_FAMILIES, FAMILIES_ONLY (fixture names,
# comma-separated), BENCH_ARGS (e.g. "--iters 3
# --ab"), BENCH_TIMEOUT or DEADLINE (the benchmark runs until DEADLINE seconds after the start),
# PREBUILT and FIXTURES_TAR (above), MODULE (with PREBUILT: build the Python module here too).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build-gpu}
start=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - start )) s)"; }

stamp "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
echo "$(nproc) cores; $(cmake --version | head -1); $(nvcc --version | tail -1); $(c++ --version | head -1)"

here_torch=$($PY -c 'import torch; print(torch.__version__.split("+")[0])')
if [ -n "${PREBUILT:-}" ] && [ "$(tar -xJOf "$PREBUILT" TORCH_VERSION)" != "$here_torch" ]; then
  echo "$PREBUILT was built against PyTorch $(tar -xJOf "$PREBUILT" TORCH_VERSION), this machine has $here_torch: building here"
  PREBUILT=
fi
if [ -n "${PREBUILT:-}" ]; then
  stamp "prebuilt programs from $PREBUILT (built against PyTorch $here_torch, as this machine's)"
  mkdir -p "$BUILD" && tar -xJf "$PREBUILT" -C "$BUILD" || exit 1
  # The programs' run paths name the build machine's PyTorch: this one's libraries instead.
  site=$($PY -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  LD_LIBRARY_PATH="$site/torch/lib$(for d in "$site"/nvidia/*/lib; do printf ':%s' "$d"; done)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  # The Python module is built for this machine's Python, so here, behind the other phases
  # (MODULE=1; .deps carried): its log starts smoke.log.
  if [ -n "${MODULE:-}" ]; then
    ( cmake -S . -B build-module -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" \
        -DBoost_NO_BOOST_CMAKE=ON -DBoost_INCLUDE_DIR="$PWD/.deps/include" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        -DMEGADSL_PYTHON="$(command -v "$PY")" -DTORCH_CUDA_ARCH_LIST=9.0 -DMEGADSL_CUDA_ARCHITECTURES=90 &&
      nice ninja -C build-module -j "${MODULE_JOBS:-8}" megadsl_python ) >"$OUT/smoke.log" 2>&1 &
    module_pid=$!
  else
    SKIP_SMOKE=1
  fi
else
stamp "configure"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" \
  -DBoost_NO_BOOST_CMAKE=ON -DBoost_INCLUDE_DIR="$PWD/.deps/include" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -DMEGADSL_PYTHON="$(command -v "$PY")" -DMEGADSL_BUILD_EXAMPLES=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DMEGADSL_CUDA_ARCHITECTURES=90 \
  >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
grep "megadsl:" "$OUT/configure.log"

stamp "build: bench_gpu_step, cuda_tests, megadsl, the Python module ($JOBS jobs)"
ninja -C "$BUILD" -j "$JOBS" -k 0 ${TARGETS:-bench_gpu_step cuda_tests megadsl_tool megadsl_python} >"$OUT/build.log" 2>&1 ||
  grep -A8 "error" "$OUT/build.log" | head -60
[ -x "$BUILD/bench/bench_gpu_step" ] || exit 1
fi
if [ -n "${FIXTURES_TAR:-}" ]; then
  mkdir -p /tmp/megadsl-fixtures && tar -xJf "$FIXTURES_TAR" -C /tmp/megadsl-fixtures || exit 1
  export MEGADSL_FIXTURES=/tmp/megadsl-fixtures
fi
export MEGADSL_FIXTURES=${MEGADSL_FIXTURES:-$PWD/tests/fixtures}

stamp "CUDA tier: cuda_tests [cuda] (one GPU)"
MEGADSL_TIMEOUT_S=120 timeout 180 "$BUILD/tests/cuda/cuda_tests" --need-gpus 1 "[cuda]" >"$OUT/cuda_tests.log" 2>&1
echo "cuda_tests [cuda]: exit $?"
tail -25 "$OUT/cuda_tests.log"

[ -n "${SKIP_NCCL:-}" ] || {
stamp "two ranks on the one GPU: NCCL (it wants a GPU per rank: tried, to report what it says), then Gloo through host memory"
MEGADSL_TIMEOUT_S=15 timeout 40 "$BUILD/tests/cuda/cuda_tests" --ranks 2 --need-gpus 1 "[nccl]" >"$OUT/multirank.log" 2>&1
echo "cuda_tests --ranks 2 [nccl]: exit $?"
grep -m5 -i "error\|passed\|failed\|nccl" "$OUT/multirank.log" | cut -c1-300
MEGADSL_CUDA_COMM=gloo MEGADSL_TIMEOUT_S=60 timeout 90 "$BUILD/tests/cuda/cuda_tests" --ranks 2 --need-gpus 1 "[nccl]" \
  >"$OUT/gloo_tp2.log" 2>&1; rc=$?
echo "cuda_tests --ranks 2 [nccl] with MEGADSL_CUDA_COMM=gloo: exit $rc"
grep -m5 -i "error\|passed\|failed" "$OUT/gloo_tp2.log" | cut -c1-300
{ echo "==== MEGADSL_CUDA_COMM=gloo"; cat "$OUT/gloo_tp2.log"; } >>"$OUT/multirank.log" && rm "$OUT/gloo_tp2.log"
}

[ -n "${SKIP_FAMILIES:-}" ] || {
stamp "every fixture family on CUDA: megadsl run against transformers' log-probs (bench/gpu_families.py)"
PYTHONUNBUFFERED=1 timeout "${FAMILIES_TIMEOUT:-150}" $PY bench/gpu_families.py --megadsl "$BUILD/tools/megadsl" \
  --fixtures "$MEGADSL_FIXTURES" --jobs "${FAMILY_JOBS:-12}" ${FAMILIES_ONLY:+--only "$FAMILIES_ONLY"} --deadline $(( ${FAMILIES_TIMEOUT:-150} - 25 )) --out "$OUT" 2>&1 |
  grep -v "Loading weights\|falling back\|^$"
}

[ -n "${SKIP_SMOKE:-}" ] || {
module_dir=$BUILD/python
if [ -n "${module_pid:-}" ]; then
  stamp "waiting for the Python module's build"
  wait "$module_pid"; echo "module build: exit $? ($(grep -c "Building" "$OUT/smoke.log") objects)"
  module_dir=build-module/python
fi
stamp "the Python module on CUDA: a tiny model (faulthandler; a crash is run again under cuda-gdb)"
smoke="bench/gpu_throughput.py --tiny --megadsl python --no-profile --iters 1"
PYTHONPATH="$module_dir" PYTHONUNBUFFERED=1 timeout 45 $PY -X faulthandler $smoke --work /tmp/smoke >>"$OUT/smoke.log" 2>&1
rc=$?
echo "python module smoke: exit $rc"
grep -v "Writing model" "$OUT/smoke.log" | tail -12
if [ $rc -ne 0 ] && command -v cuda-gdb >/dev/null; then
  PYTHONPATH="$module_dir" timeout 60 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt \
    --args $PY $smoke --no-throughput --work /tmp/smoke2 >>"$OUT/smoke.log" 2>&1
  grep -A25 "SIGSEGV" "$OUT/smoke.log" | cut -c1-240 | head -40
fi
}

stamp "bench/gpu_throughput.py"
# DEADLINE (seconds from the start, optional): the benchmark gets what is left of it.
bench_limit=${BENCH_TIMEOUT:-270}
[ -z "${DEADLINE:-}" ] || bench_limit=$(( DEADLINE - ($(date +%s) - start) ))
PYTHONPATH="$BUILD/python" PYTHONUNBUFFERED=1 timeout "$bench_limit" \
  $PY bench/gpu_throughput.py --out "$OUT" --work /tmp/megadsl-gpu-bench --megadsl-bin "$BUILD/bench/bench_gpu_step" ${BENCH_ARGS:-} 2>&1 |
  grep -v "Writing model shards\|Loading weights\|USDT"
stamp "done"
