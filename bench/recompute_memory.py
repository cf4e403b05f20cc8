"""What activation recompute saves and costs for one family: peak memory and step time of a
forward + backward, each recompute mode in a fresh process.

    PYTHONPATH=build/python .venv/bin/python bench/recompute_memory.py                      # qwen3_next
    PYTHONPATH=build/python .venv/bin/python bench/recompute_memory.py --family deepseek_v3 --seq 2048

The checkpoint is family_blocks.py's (written by transformers, hidden 512, 4 layers, fp32). For
each layout recompute ("none", "selective": the token mixer's core, i.e. RoPE and attention, or
the gated DeltaNet's chunked rule, runs again in the backward; "full": each layer from its input)
a child process loads the model, runs one warm-up step, then `--iters` steps of a PPO-style loss
and its backward, and reports the step time (median) and how far the process's peak RSS rose
above what it held after loading (the activations and gradients of one step, plus the allocator's
slack). The log-probs of the three modes are compared: recompute must not change a number.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def child(args):
    import torch

    import megadsl
    from family_blocks import BASE
    from side_by_side import make_batch, ppo_loss

    torch.set_num_threads(args.threads)
    model = megadsl.Model.from_hf(args.path, recompute=args.mode)
    ids, mask = make_batch(dict(vocab=BASE["vocab_size"]), args.batch, args.seq, padded=False)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def step():
        for p in model.parameters().values():
            p.grad = None
        out = model.forward(ids, mask)
        ppo_loss(out["log_probs"], out["entropy"], out["valid"]).backward()
        model.finalize_grads()
        return out["log_probs"].detach()

    log_probs = step()
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"step_s": statistics.median(times), "rise_mb": (peak - loaded) / 1024,
                      "tokens": int(mask.sum()), "log_probs": log_probs.flatten()[:4096].tolist()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="qwen3_next")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "megadsl-family-blocks"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from family_blocks import checkpoint

    path = checkpoint(args.family, args.dir)
    print(f"{args.family}: batch {args.batch} x {args.seq}, fp32, {args.threads} threads, forward + backward "
          f"(median of {args.iters} steps)")
    print(f"{'recompute':<10} {'step s':>8} {'tokens/s':>9} {'peak rise MB':>13}")
    results = {}
    for mode in ("none", "selective", "full"):
        cmd = [sys.executable, __file__, "--child", "--path", path, "--mode", mode, "--batch", str(args.batch),
               "--seq", str(args.seq), "--iters", str(args.iters), "--threads", str(args.threads)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        results[mode] = r
        print(f"{mode:<10} {r['step_s']:>8.2f} {r['tokens'] / r['step_s']:>9.0f} {r['rise_mb']:>13.0f}")
    base = results["none"]["log_probs"]
    for mode in ("selective", "full"):
        diff = max(abs(a - b) for a, b in zip(base, results[mode]["log_probs"]))
        print(f"max |log-prob difference| {mode} vs none: {diff:.1e}")


if __name__ == "__main__":
    main()
