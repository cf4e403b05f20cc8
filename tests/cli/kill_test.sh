#!/usr/bin/env bash
# Kill tests (parent and ranks live and die together; checkpoints are replaced whole). `megadsl run`
# and `megadsl convert` (to a distributed and to an HF checkpoint, each over a previous one) on 2
# local ranks get SIGTERM or SIGKILL at moments spread over their run. Afterwards no process of the
# job may be alive; run's output is absent or complete, and a target that is absent when the
# command returns stays absent; a convert target is the previous checkpoint or the new one, whole.
#   kill_test.sh MEGADSL FIXTURE_DIR WORK_DIR
set -u
megadsl=$1 fixture=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cat > "$work/in.json" <<'JSON'
{"input_ids": [[241, 174, 188, 97, 299, 299, 188, 110, 89, 70, 155, 11], [0, 0, 0, 0, 0, 72, 294, 212, 222, 174, 116, 117]],
 "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]]}
JSON
# The previous state every convert trial starts from: a distributed checkpoint and an HF copy.
"$megadsl" convert --from "$fixture" --to "$work/previous-dist" --tp 2 --ranks 2 >/dev/null 2>&1 || { echo "FAIL: setup"; exit 1; }
mkdir -p "$work/previous-hf" && cp "$fixture/config.json" "$fixture/model.safetensors" "$work/previous-hf/"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
complete_json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "log_probs" in d' "$1" 2>/dev/null; }
# (hf/: the source's config.json and tokenizer files, which a conversion back to HF writes again)
complete_ckpt() { [ -f "$1/metadata.json" ] && [ -f "$1/rank_0.safetensors" ] && [ -f "$1/rank_1.safetensors" ] &&
                  [ -f "$1/hf/config.json" ] && [ "$(ls "$1" | wc -l)" = 4 ]; }
# The previous HF checkpoint (fp32) or the new one (bf16, written by megadsl), nothing else in it.
complete_hf() { [ "$(ls "$1" | tr '\n' ' ')" = "config.json model.safetensors " ] &&
                python3 - "$1" <<'PY'
import json, struct, sys
d = sys.argv[1]
dtype = (lambda c: c.get("torch_dtype", c.get("dtype")))(json.load(open(d + "/config.json")))
with open(d + "/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
stored = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
# config.json and the weights of one and the same save: the old fp32 pair or the new bf16 pair
assert (dtype, stored) in (("float32", {"F32"}), ("bfloat16", {"BF16"})), (dtype, stored)
PY
}
trials=0
for what in run convert convert-hf; do
  for sig in TERM KILL; do
    for delay in 0.05 0.2 0.4 0.6 0.8 1.0 1.2 1.5 2.0 3.0; do
      trials=$((trials + 1))
      target="$work/$what-$sig-$delay"
      if [ "$what" = run ]; then
        "$megadsl" run "$fixture" --tp 2 --ranks 2 --input "$work/in.json" --output "$target.json" 2>/dev/null >/dev/null &
        target="$target.json"
      elif [ "$what" = convert ]; then
        cp -r "$work/previous-dist" "$target"
        "$megadsl" convert --from "$fixture" --to "$target" --tp 2 --ranks 2 2>/dev/null >/dev/null &
      else
        cp -r "$work/previous-hf" "$target"
        "$megadsl" convert --from "$fixture" --to "$target" --to-format hf --dtype bf16 --tp 2 --ranks 2 2>/dev/null >/dev/null &
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
        elif [ "$what" = convert ]; then complete_ckpt "$target" || fail "convert: $target is incomplete or mixed (SIG$sig at ${delay}s)"
        else complete_hf "$target" || fail "convert-hf: $target is incomplete or mixed: $(ls "$target" | tr '\n' ' ') (SIG$sig at ${delay}s)"; fi
      elif [ "$what" != run ]; then
        fail "$what: the previous checkpoint $target is gone (SIG$sig at ${delay}s)"
      fi
      # A SIGTERM lets every process remove what it was writing; after a SIGKILL the next write
      # beside it (the next trial's) removes it.
      if [ "$sig" = TERM ]; then
        for stale in "$work"/*.tmp-* "$work"/*.lock; do
          [ -e "$stale" ] && fail "$what: $stale left behind after SIGTERM at ${delay}s"
        done
      fi
    done
  done
done
# The last SIGKILL's leftovers go with the next write anywhere beside them.
"$megadsl" convert --from "$fixture" --to "$work/last" --tp 2 --ranks 2 >/dev/null 2>&1 || fail "the final convert failed"
trials=$((trials + 1))
for stale in "$work"/*.tmp-* "$work"/*.lock; do [ -e "$stale" ] && fail "$stale left behind after the final convert"; done
echo "$((trials - failures)) passed, $failures failed"
[ $failures = 0 ]
