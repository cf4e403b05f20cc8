#!/usr/bin/env bash
# The GPU checks in one command, for a machine with an NVIDIA GPU, its own PyTorch (python3) and
# nvcc, and no network (the lent device machine): builds megadsl against that PyTorch, runs the
# CUDA test tier, a smoke run of the Python module on CUDA, then bench/gpu_throughput.py (bf16
# parity against transformers, tokens/s, MFU, peak memory, a profile of one step; megadsl's side in
# the program bench_gpu_step). Logs and tables go to $OUT (default ./gpu-out), at most 8 files.
#
#   bash scripts/gpu_deps.sh          # here, once: the header-only dependencies into .deps/
#   bash scripts/gpu_check.sh         # there (the device tool: carry .deps)
#
# Each phase has its own time limit, so one that fails or hangs leaves the others their time.
# Knobs (environment): TARGETS, SKIP_NCCL, SKIP_SMOKE, BENCH_ARGS (e.g. "--iters 3 --ab"),
# BENCH_TIMEOUT or DEADLINE (the benchmark runs until DEADLINE seconds after the start).
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

stamp "configure"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" \
  -DBoost_NO_BOOST_CMAKE=ON -DBoost_INCLUDE_DIR="$PWD/.deps/include" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -DMEGADSL_PYTHON="$(command -v "$PY")" -DMEGADSL_BUILD_EXAMPLES=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DMEGADSL_CUDA_ARCHITECTURES=90 \
  >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
grep "megadsl:" "$OUT/configure.log"

stamp "build: bench_gpu_step, cuda_tests, the Python module ($JOBS jobs)"
ninja -C "$BUILD" -j "$JOBS" -k 0 ${TARGETS:-bench_gpu_step cuda_tests megadsl_python} >"$OUT/build.log" 2>&1 ||
  grep -A8 "error" "$OUT/build.log" | head -60
[ -x "$BUILD/bench/bench_gpu_step" ] || exit 1

stamp "CUDA tier: cuda_tests [cuda] (one GPU)"
MEGADSL_TIMEOUT_S=120 timeout 180 "$BUILD/tests/cuda/cuda_tests" --need-gpus 1 "[cuda]" >"$OUT/cuda_tests.log" 2>&1
echo "cuda_tests [cuda]: exit $?"
tail -25 "$OUT/cuda_tests.log"

[ -n "${SKIP_NCCL:-}" ] || {
stamp "NCCL: two ranks on the one GPU (NCCL wants a GPU per rank; tried, to report what it says)"
MEGADSL_TIMEOUT_S=15 timeout 40 "$BUILD/tests/cuda/cuda_tests" --ranks 2 --need-gpus 1 "[nccl]" >"$OUT/nccl_tp2.log" 2>&1
echo "cuda_tests --ranks 2 [nccl]: exit $?"
grep -m5 -i "error\|passed\|failed\|nccl" "$OUT/nccl_tp2.log" | cut -c1-300
}

[ -n "${SKIP_SMOKE:-}" ] || {
stamp "the Python module on CUDA: a tiny model (faulthandler; a crash is run again under cuda-gdb)"
smoke="bench/gpu_throughput.py --tiny --megadsl python --no-profile --iters 1"
PYTHONPATH="$BUILD/python" PYTHONUNBUFFERED=1 timeout 45 $PY -X faulthandler $smoke --work /tmp/smoke >"$OUT/smoke.log" 2>&1
rc=$?
echo "python module smoke: exit $rc"
grep -v "Writing model" "$OUT/smoke.log" | tail -12
if [ $rc -ne 0 ] && command -v cuda-gdb >/dev/null; then
  PYTHONPATH="$BUILD/python" timeout 60 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt \
    --args $PY $smoke --no-throughput --work /tmp/smoke2 >>"$OUT/smoke.log" 2>&1
  grep -A25 "SIGSEGV" "$OUT/smoke.log" | cut -c1-240 | head -40
fi
}

stamp "bench/gpu_throughput.py"
# DEADLINE (seconds from the start, optional): the benchmark gets what is left of it.
bench_limit=${BENCH_TIMEOUT:-270}
[ -z "${DEADLINE:-}" ] || bench_limit=$(( DEADLINE - ($(date +%s) - start) ))
PYTHONPATH="$BUILD/python" PYTHONUNBUFFERED=1 timeout "$bench_limit" \
  $PY bench/gpu_throughput.py --out "$OUT" --work /tmp/megadsl-gpu-bench ${BENCH_ARGS:-} 2>&1 |
  grep -v "Writing model shards\|Loading weights\|USDT" | tee "$OUT/bench.log"
stamp "done"
