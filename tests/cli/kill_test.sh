#!/usr/bin/env bash
# Kill tests (issue: parent and ranks live and die together). `megadsl run` and `megadsl convert`
# on 2 local ranks get SIGTERM or SIGKILL at moments spread over their run. Afterwards no process
# of the job may be alive, and the target is either absent or complete; a target that is absent
# when the command returns must stay absent (nothing is written after it returns).
#   kill_test.sh MEGADSL FIXTURE_DIR WORK_DIR
set -u
megadsl=$1 fixture=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cat > "$work/in.json" <<'JSON'
{"input_ids": [[241, 174, 188, 97, 299, 299, 188, 110, 89, 70, 155, 11], [0, 0, 0, 0, 0, 72, 294, 212, 222, 174, 116, 117]],
 "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]]}
JSON
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
complete_json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "log_probs" in d' "$1" 2>/dev/null; }
complete_ckpt() { [ -f "$1/metadata.json" ] && [ -f "$1/rank_0.safetensors" ] && [ -f "$1/rank_1.safetensors" ]; }
trials=0
for what in run convert; do
  for sig in TERM KILL; do
    for delay in 0.05 0.2 0.4 0.6 0.8 1.0 1.2 1.5 2.0 3.0; do
      trials=$((trials + 1))
      target="$work/$what-$sig-$delay"
      if [ "$what" = run ]; then
        "$megadsl" run "$fixture" --tp 2 --ranks 2 --input "$work/in.json" --output "$target.json" 2>/dev/null >/dev/null &
        target="$target.json"
      else
        "$megadsl" convert --from "$fixture" --to "$target" --tp 2 --ranks 2 2>/dev/null >/dev/null &
      fi
      pid=$!
      sleep "$delay"
      kill -s "$sig" "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      existed=0; [ -e "$target" ] && existed=1
      sleep 0.3
      if pgrep -f -- "$target" >/dev/null; then
        fail "$what: ranks alive 0.3 s after SIG$sig at ${delay}s: $(pgrep -af -- "$target" | tr '\n' ' ')"
        pkill -9 -f -- "$target"
      fi
      sleep 1
      if [ $existed = 0 ] && [ -e "$target" ]; then fail "$what: $target appeared after the command returned (SIG$sig at ${delay}s)"; fi
      if [ -e "$target" ]; then
        if [ "$what" = run ]; then complete_json "$target" || fail "run: $target is incomplete (SIG$sig at ${delay}s)"
        else complete_ckpt "$target" || fail "convert: $target is incomplete (SIG$sig at ${delay}s)"; fi
      fi
      for stale in "$work"/*.tmp*; do [ -e "$stale" ] && echo "note: stale $stale (SIG$sig at ${delay}s)"; done
    done
  done
done
echo "$((trials - failures)) passed, $failures failed"
[ $failures = 0 ]
