"""Where the time goes: a per-operator profile (self CPU time) of one megadsl step and one transformers
step on the same checkpoint and batch as bench/side_by_side.py, side by side.

    PYTHONPATH=build/python .venv/bin/python bench/op_profile.py [--backward] [--padded] [--rmpad]
        [--hidden 1024] [--dtype bf16] [--top 25]

The operators are ATen's (both sides dispatch through it), so the rows compare like with like.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import side_by_side as sbs  # noqa: E402


def profile(step, top):
    import torch
    from torch.profiler import ProfilerActivity, profile as prof

    step()  # warm-up
    with prof(activities=[ProfilerActivity.CPU]) as p:
        step()
    rows = sorted(p.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows)
    out = {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in rows[:top]}
    return out, total / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in dict(hidden=512, layers=8, heads=8, kv_heads=4, ffn=0, vocab=32000, batch=8, seq=512, top=20,
                     threads=os.cpu_count()).items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--rmpad", action="store_true")
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    args = ap.parse_args()
    if args.ffn == 0:
        args.ffn = (8 * args.hidden // 3 + 63) // 64 * 64
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    s = sbs.shape_of(args)
    path = os.path.join(tempfile.gettempdir(), "megadsl-bench-" + "-".join(f"{k}{v}" for k, v in s.items()))
    sbs.make_checkpoint(s, path)
    ids, mask = sbs.make_batch(s, args.batch, args.seq, args.padded)

    import megadsl
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = megadsl.Model.from_hf(path, rmpad=args.rmpad, recompute=args.recompute, dtype=args.dtype)
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=dtype)

    def md_step():
        if args.backward:
            for p in model.parameters().values():
                p.grad = None
            out = model.forward(ids, mask)
            sbs.ppo_loss(out["log_probs"], out["entropy"], out["valid"]).backward()
        else:
            with torch.no_grad():
                model.forward(ids, mask)

    def hf_step():
        if args.backward:
            hf.zero_grad(set_to_none=True)
            sbs.ppo_loss(*sbs.hf_outputs(hf, ids, mask, False)).backward()
        else:
            with torch.no_grad():
                sbs.hf_outputs(hf, ids, mask, False)

    md, md_total = profile(md_step, args.top)
    tf, tf_total = profile(hf_step, args.top)
    print(f"self CPU seconds per step: megadsl {md_total:.2f}, transformers {tf_total:.2f} "
          f"({'fwd+bwd' if args.backward else 'forward'}, {'50% padded' if args.padded else 'unpadded'}"
          f"{', rmpad' if args.rmpad else ''}, {args.dtype}, {args.threads} threads)")
    print(f"| operator | megadsl s (calls) | transformers s (calls) |")
    print("|---|---|---|")
    for key in sorted(set(md) | set(tf), key=lambda k: -max(md.get(k, (0, 0))[0], tf.get(k, (0, 0))[0])):
        a, b = md.get(key), tf.get(key)
        cell = lambda v: f"{v[0]:.3f} ({v[1]})" if v else "-"  # noqa: E731
        print(f"| {key} | {cell(a)} | {cell(b)} |")


if __name__ == "__main__":
    main()
