#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang into ./build-fuzz and runs each for a
# bounded time on a copy of its committed corpus (tests/fuzz/corpus/<harness>), printing what
# libFuzzer reports: executions, coverage (cov: edges, ft: features) and whether it crashed.
#
#   scripts/fuzz.sh [SECONDS]        # 60 s per harness by default; after scripts/setup.sh
#   MEGADSL_FUZZ_MERGE=1 scripts/fuzz.sh 600   # also merge new inputs into the committed corpora
#
# A finding (crash, sanitizer report, a message that is not one printable line) fails the script
# and leaves the input in build-fuzz/findings/<harness>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
clang=$(command -v clang++-14 || command -v clang++)
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$clang" -DMEGADSL_FUZZ=ON \
  -DMEGADSL_BUILD_TESTS=OFF -DMEGADSL_BUILD_EXAMPLES=OFF -DMEGADSL_BUILD_PYTHON=OFF >/dev/null
cmake --build build-fuzz --target fuzzers -j "${MEGADSL_JOBS:-$(nproc)}"
# LibTorch's own allocations live until exit; leak reports about them are not findings.
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
status=0
for h in fuzz_hf_config fuzz_safetensors fuzz_run_input fuzz_dist_metadata; do
  seeds=tests/fuzz/corpus/$h
  work=build-fuzz/corpus/$h
  findings=build-fuzz/findings/$h
  rm -rf "$work" "$findings" && mkdir -p "$work" "$findings"
  cp -r "$seeds"/. "$work"/
  extra=(-dict=tests/fuzz/json.dict)  # JSON tokens; the safetensors header is JSON too
  log=build-fuzz/$h.log
  if ./build-fuzz/tests/fuzz/$h "$work" "${extra[@]}" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=4096 \
      -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1; then
    verdict="no crash"
  else
    verdict="FINDING (input in $findings)"
    status=1
    tail -40 "$log"
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' || true)
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' || true)
  corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' || true)
  echo "fuzz: $h: ${seconds} s, ${execs} executions, ${cov}, ${ft}, ${corp}: ${verdict}"
  if [ "${MEGADSL_FUZZ_MERGE:-0}" = 1 ] && [ $status = 0 ]; then
    ./build-fuzz/tests/fuzz/$h -merge=1 "$seeds" "$work" "${extra[@]}" -max_len=65536 >/dev/null 2>&1
  fi
done
exit $status
