"""megadsl against HuggingFace transformers on the same checkpoint, the same batches, the same CPU.

    .venv/bin/python bench/side_by_side.py                       # hidden 512 x 8 layers, every case
    .venv/bin/python bench/side_by_side.py --hidden 1024 --repeats 5
    .venv/bin/python bench/side_by_side.py --quick               # a small model, two repeats: a smoke run

Needs the Python module on the path (`pip install --no-build-isolation .`, or PYTHONPATH=build-py
after a build of python/), and the venv's transformers. Prints one table: for every case (forward =
log-probs + entropy; forward + backward = a PPO-style loss; unpadded and 50%-padded batches; fp32
and bf16), tokens/s of each side (median, min-max over the repeats), the ratio to transformers'
sdpa on the same batch in the same dtype (median of the per-repeat ratios), the achieved FLOP/s as
a share of this machine's measured fp32 GEMM peak, and the peak RSS of each process. The
activation-recompute rows (layout recompute="selective" / "full") show what recompute costs in
time and saves in memory for the same forward + backward.

Every measurement runs in a fresh process (peak RSS is per process; tp 2 cases start two ranks
with megadsl.launch_local), and the cases are interleaved repeat by repeat so that a slow phase of
the machine hits every side alike. Tokens are the batch's real tokens (padding excluded) for both
sides; FLOPs count the useful work only: 2 x (matmul weights) per token, plus causal attention
2 x n^2 x q_dim per layer and sequence; forward + backward is 3x the forward.
"""

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the checkpoint and the batches ------------------------------------------------------------


def shape_of(a):
    return dict(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, ffn=a.ffn, vocab=a.vocab)


def make_checkpoint(s, path):
    """A random Llama checkpoint written by transformers itself (fp32, untied)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv_heads"], intermediate_size=s["ffn"], vocab_size=s["vocab"],
                      max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-5)
    LlamaForCausalLM(cfg).save_pretrained(path)


def make_batch(s, batch, seq, padded):
    """(ids, mask): `batch` rows of `seq`; padded: lengths spread over [seq/4, seq] (half the tokens
    are padding on average), left-padded as verl's rollouts are."""
    import torch

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, s["vocab"], (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        lengths = torch.linspace(seq // 4, seq, batch).round().long()
        lengths = lengths[torch.randperm(batch, generator=g)]
        for i, n in enumerate(lengths.tolist()):
            mask[i, : seq - n] = 0
            ids[i, : seq - n] = 0
    return ids, mask


def useful_flops(s, mask, backward):
    hd = s["hidden"] // s["heads"]
    q, kv, h = s["heads"] * hd, s["kv_heads"] * hd, s["hidden"]
    weights = s["layers"] * (h * (q + 2 * kv) + q * h + 3 * h * s["ffn"]) + s["vocab"] * h
    lengths = mask.sum(1).tolist()
    tokens = sum(lengths)
    attention = sum(2 * n * n * q for n in lengths) * s["layers"]
    forward = 2 * weights * tokens + attention
    return forward * (3 if backward else 1)


# ---- one measurement (a worker process) --------------------------------------------------------


def ppo_loss(lp, ent, valid):
    """A PPO-style objective over both outputs: clipped ratio times a fixed advantage, plus entropy."""
    import torch

    adv = torch.linspace(-1, 1, lp.numel(), device=lp.device).view_as(lp)
    ratio = torch.exp(lp - lp.detach())
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    m = valid.to(lp.dtype)
    return (pg * m).sum() / m.sum() - 1e-3 * (ent * m).sum() / m.sum()


def hf_outputs(model, ids, mask, packed):
    """log-probs of the next token and entropy, (b, s), from transformers' logits."""
    import torch

    if packed:  # transformers' padding-free path: one row, positions restarting per sequence
        keep = mask.bool()
        flat = ids[keep].unsqueeze(0)
        pos = (mask.cumsum(1) - 1)[keep].unsqueeze(0)
        logits = model(input_ids=flat, position_ids=pos).logits[0]
        full = logits.new_zeros(ids.shape + (logits.shape[-1],))
        full[keep] = logits
        logits = full
    else:
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    logp = torch.log_softmax(logits.float(), -1)
    lp = torch.zeros(ids.shape, dtype=torch.float32)
    lp[:, :-1] = logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    valid = torch.zeros_like(mask, dtype=torch.bool)
    valid[:, :-1] = mask[:, :-1].bool() & mask[:, 1:].bool()
    return lp, ent, valid


def timed(step, iters):
    step()  # warm-up: allocations, thread pools, first-touch
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def megadsl_rank(path, layout, s, batch, seq, padded, backward, iters, dtype="fp32"):
    """On each rank of a megadsl job: seconds per iteration and this process's peak RSS."""
    import megadsl

    model = megadsl.Model.from_hf(path, dtype=dtype, **layout)
    ids, mask = make_batch(s, batch, seq, padded)
    return timed(lambda: megadsl_step(model, ids, mask, backward), iters), rss_mb()


def megadsl_step(model, ids, mask, backward):
    """One measured step of a megadsl model: forward (no grad), or forward + the PPO loss's backward
    with the gradients finalized as a trainer's step has them (also bench/gpu_throughput.py's)."""
    import torch

    if backward:
        for p in model.parameters().values():
            p.grad = None
        out = model.forward(ids, mask)
        ppo_loss(out["log_probs"], out["entropy"], out["valid"]).backward()
        model.finalize_grads()
    else:
        with torch.no_grad():
            model.forward(ids, mask)


def worker(case, args):
    import torch

    s = shape_of(args)
    side, layout, dtype = case["side"], case.get("layout", {}), case.get("dtype", "fp32")
    if side == "megadsl" and layout.get("tp", 1) > 1:
        import megadsl

        results = megadsl.launch_local(layout["tp"], megadsl_rank, args.checkpoint, layout, s, args.batch, args.seq,
                                       case["padded"], case["backward"], args.iters, dtype, timeout=3600,
                                       env={"MEGADSL_THREADS": str(max(1, args.threads // layout["tp"]))})
        seconds = max(r[0] for r in results)
        return {"seconds": seconds, "rss_mb": [r[1] for r in results]}
    torch.set_num_threads(args.threads)
    if side == "megadsl":
        seconds, rss = megadsl_rank(args.checkpoint, layout, s, args.batch, args.seq, case["padded"],
                                    case["backward"], args.iters, dtype)
        return {"seconds": seconds, "rss_mb": [rss]}
    if case.get("malloc"):  # megadsl's policy: large blocks stay in the heap (mallopt, as cpu_allocator.cpp)
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, attn_implementation="sdpa",
                                                 dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    ids, mask = make_batch(s, args.batch, args.seq, case["padded"])
    packed = case["variant"] == "padding-free"
    step = lambda: hf_step(model, ids, mask, case["backward"], packed)  # noqa: E731
    return {"seconds": timed(step, args.iters), "rss_mb": [rss_mb()]}


def hf_step(model, ids, mask, backward, packed, outputs=hf_outputs):
    """One measured step of transformers: `outputs` (log-probs, entropy, valid) without grad, or with
    the PPO loss's backward (also bench/gpu_throughput.py's, with its own `outputs`)."""
    import torch

    if backward:
        model.zero_grad(set_to_none=True)
        lp, ent, valid = outputs(model, ids, mask, packed)
        ppo_loss(lp, ent, valid).backward()
    else:
        with torch.no_grad():
            outputs(model, ids, mask, packed)


# ---- the table ---------------------------------------------------------------------------------


def cases_of(args):
    """Every case: its name, its side, and the name of its baseline (transformers sdpa in the same
    dtype, on the same batch and work)."""
    sides = [
        ("transformers sdpa", {"side": "hf", "variant": "sdpa"}),
        ("transformers padding-free", {"side": "hf", "variant": "padding-free"}),
        # The same, under the malloc policy megadsl sets for its own processes (src/runtime/cpu_allocator.hpp):
        # how much of the difference is the allocator's.
        ("transformers sdpa, megadsl's malloc policy", {"side": "hf", "variant": "sdpa", "malloc": True}),
        ("megadsl tp 1", {"side": "megadsl", "layout": {"tp": 1}}),
        ("megadsl tp 1 rmpad", {"side": "megadsl", "layout": {"tp": 1, "rmpad": True}}),
        ("megadsl tp 2", {"side": "megadsl", "layout": {"tp": 2}}),
        ("megadsl tp 2 rmpad", {"side": "megadsl", "layout": {"tp": 2, "rmpad": True}}),
        ("megadsl tp 2 sp rmpad", {"side": "megadsl", "layout": {"tp": 2, "sp": True, "rmpad": True}}),
        # Activation recompute: the same work, less kept for the backward (fwd+bwd only).
        ("megadsl tp 1 recompute selective", {"side": "megadsl", "layout": {"tp": 1, "recompute": "selective"},
                                              "train_only": True}),
        ("megadsl tp 1 recompute full", {"side": "megadsl", "layout": {"tp": 1, "recompute": "full"},
                                         "train_only": True}),
    ]
    bf16_sides = {"transformers sdpa", "transformers padding-free", "megadsl tp 1", "megadsl tp 1 rmpad"}
    out = []
    for dtype in args.dtypes.split(","):
        suffix = "" if dtype == "fp32" else " " + dtype
        for backward in (False, True):
            for padded in (False, True):
                for name, c in sides:
                    if c.get("variant") == "padding-free" and not padded:
                        continue  # the same as sdpa without padding
                    if c.get("train_only") and not backward:
                        continue
                    if dtype != "fp32" and name not in bf16_sides:
                        continue
                    out.append(dict(c, name=name + suffix, base="transformers sdpa" + suffix, dtype=dtype,
                                    backward=backward, padded=padded))
    return out


def gemm_peak(threads):
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * 2048**3 / (time.perf_counter() - t0))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=0, help="default: 8/3 hidden rounded up to 64")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--iters", type=int, default=2, help="timed iterations per measurement (after one warm-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="regular expression over the case names (e.g. 'sdpa|tp 1')")
    ap.add_argument("--work", choices=["both", "forward", "fwd+bwd"], default="both")
    ap.add_argument("--batches", choices=["both", "unpadded", "padded"], default="both")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16 (bf16 computes over fp32 "
                    "parameters in megadsl, a bf16 model in transformers)")
    ap.add_argument("--quick", action="store_true", help="hidden 128, 2 layers, vocab 4096, 4 x 128, 2 repeats")
    ap.add_argument("--checkpoint", default="", help="where the checkpoint is (made there when missing)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.vocab = 128, 2, 4, 2, 4096
        args.batch, args.seq, args.repeats, args.iters = 4, 128, 2, 1
    if args.ffn == 0:
        args.ffn = (8 * args.hidden // 3 + 63) // 64 * 64
    s = shape_of(args)
    if not args.checkpoint:
        name = "-".join(f"{k}{v}" for k, v in s.items())
        args.checkpoint = os.path.join(tempfile.gettempdir(), f"megadsl-bench-{name}")

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker), args)))
        return

    make_checkpoint(s, args.checkpoint)
    peak = gemm_peak(args.threads)
    cases = [c for c in cases_of(args) if re.search(args.only, c["name"])
             and args.work in ("both", "fwd+bwd" if c["backward"] else "forward")
             and args.batches in ("both", "padded" if c["padded"] else "unpadded")]
    if not all(any(b["name"] == c["base"] for b in cases) for c in cases):
        sys.exit("side_by_side: --only must keep 'transformers sdpa', the baseline of every ratio")
    print(f"model {s}, batch {args.batch} x {args.seq}, {args.threads} threads, {args.iters} iteration(s) per "
          f"measurement, {args.repeats} repeats; fp32 GEMM peak {peak / 1e9:.1f} GFLOP/s; checkpoint {args.checkpoint}",
          flush=True)
    runs = {i: [] for i in range(len(cases))}
    for r in range(args.repeats):
        for i, c in enumerate(cases):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(c), "--threads", str(args.threads),
                "--dtypes", args.dtypes,
                "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
                "--kv-heads", str(args.kv_heads), "--ffn", str(args.ffn), "--vocab", str(args.vocab),
                "--batch", str(args.batch), "--seq", str(args.seq), "--iters", str(args.iters),
                "--checkpoint", args.checkpoint]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{c['name']} failed:\n{p.stderr[-3000:]}")
            runs[i].append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    import torch  # noqa: F401  (make_batch)

    print()
    print("| work | batch | side | tokens/s (median, min-max) | vs transformers sdpa (same dtype) | % of fp32 GEMM peak | peak RSS per process |")
    print("|---|---|---|---|---|---|---|")
    for i, c in enumerate(cases):
        ids, mask = make_batch(s, args.batch, args.seq, c["padded"])
        tokens = int(mask.sum())
        flops = useful_flops(s, mask, c["backward"])
        tps = [tokens / m["seconds"] for m in runs[i]]
        base = next(j for j, b in enumerate(cases)
                    if b["name"] == c["base"] and b["backward"] == c["backward"] and b["padded"] == c["padded"])
        ratios = [runs[base][k]["seconds"] / runs[i][k]["seconds"] for k in range(len(tps))]
        share = statistics.median(flops / m["seconds"] for m in runs[i]) / peak * 100
        rss = max(max(m["rss_mb"]) for m in runs[i])
        print(f"| {'fwd+bwd' if c['backward'] else 'forward'} | {'50% padded' if c['padded'] else 'unpadded'} | "
              f"{c['name']} | {statistics.median(tps):,.0f} ({min(tps):,.0f}-{max(tps):,.0f}) | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {share:.0f}% | {rss:,.0f} MB |")


if __name__ == "__main__":
    main()
