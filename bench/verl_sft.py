"""verl's own SFT trainer on this machine with megadsl's engine and with verl's FSDP engine, in one
run: the same model, data, batch and schedule (fp32, 2 ranks each), and for each engine the median
step time, tokens/s and the MFU verl itself reports (perf/mfu, its FLOPs formula over its CPU peak).

    .venv-verl/bin/python bench/verl_sft.py [--hidden 256 --layers 4 --steps 12]

Run in the verl environment (.venv-verl) with the module built (scripts/build.sh). The step time is
TrainingWorker.train_batch's wall time on rank 0 (bench/verl_sft_timed.py), the first step left out.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests" / "verl"))

import sft_runs  # noqa: E402
import tiny_chat  # noqa: E402


def measure(name, world, args, tmp):
    times = tmp / f"{name}.times.json"
    code, out, steps = sft_runs.run(world, args, tmp / f"{name}.jsonl", env_extra={"MEGADSL_STEP_TIMES": str(times)},
                                    script=str(ROOT / "bench" / "verl_sft_timed.py"), timeout=3600)
    if code != 0:
        sys.exit(f"{name}: exit {code}\n{out[-4000:]}")
    t = json.loads(times.read_text())[1:]  # the first step also warms up
    tokens = [steps[s]["train/global_tokens"] for s in sorted(steps) if "train/global_tokens" in steps[s]][1:]
    mfu = [steps[s]["train/mfu"] for s in sorted(steps) if "train/mfu" in steps[s]][1:]
    return {"name": name, "step": statistics.median(t), "tok_s": sum(tokens) / sum(t), "mfu": statistics.median(mfu),
            "loss": steps[max(steps)]["train/loss"] if "train/loss" in steps[max(steps)] else float("nan")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = tiny_chat.make(tmp / "chat", hidden=a.hidden, layers=a.layers, train=64)
        common = lambda out: sft_runs.common(data, tmp / out, a.steps) + ["trainer.test_freq=-1"]  # noqa: E731
        rows = [measure("verl FSDP2 (dp 2)", 2, common("f") + sft_runs.FSDP, tmp),
                measure("megadsl dp 2", 2, common("m1") + ["engine=megadsl"], tmp),
                measure("megadsl tp 2", 2, common("m2") + ["engine=megadsl", "engine.tensor_model_parallel_size=2"],
                        tmp)]
    base = rows[0]["tok_s"]
    print(f"verl 0.9.1 SFT trainer, hidden {a.hidden} x {a.layers} layers, global batch 8, fp32, 2 ranks on this "
          f"machine, {a.steps} steps (first left out)")
    print(f"{'engine':<20} {'step (s)':>9} {'tokens/s':>10} {'vs FSDP':>8} {'perf/mfu':>10} {'last loss':>10}")
    for r in rows:
        print(f"{r['name']:<20} {r['step']:>9.3f} {r['tok_s']:>10.0f} {r['tok_s'] / base:>7.2f}x "
              f"{r['mfu']:>10.4f} {r['loss']:>10.5f}")


if __name__ == "__main__":
    main()
