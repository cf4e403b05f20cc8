"""The chunked gated delta rule (Qwen3-Next's linear attention), megadsl's kernel against transformers'
torch fallback (torch_chunk_gated_delta_rule, what transformers runs without flash-linear-attention),
on the same tensors, CPU, fp32.

    PYTHONPATH=build/python .venv/bin/python bench/gated_delta_rule.py
    PYTHONPATH=build/python .venv/bin/python bench/gated_delta_rule.py --batch 2 --seq 2048 --repeats 5

Shapes are one tp rank's share of Qwen3-Next-80B's layer scaled to the CPU: key heads of 128 with
two value heads of 128 each (--key-heads 4 by default). Prints tokens/s of the forward and of
forward + backward (the gradients of q, k, v, g and beta), the median over the repeats (the two
sides alternate repeat by repeat), the ratio, and the largest difference of the outputs.
"""

import argparse
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--key-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import megadsl
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    torch.set_num_threads(args.threads)
    b, length, hk, d = args.batch, args.seq, args.key_heads, args.head_dim
    hv = 2 * hk
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(b, length, hk, d, generator=gen) for _ in range(2))
    v = torch.randn(b, length, hv, d, generator=gen)
    g = -0.1 * torch.rand(b, length, hv, generator=gen)
    beta = torch.rand(b, length, hv, generator=gen)
    inputs = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
    weight = torch.randn(b, length, hv, d, generator=gen)

    def ours():
        return megadsl.kernels.chunk_gated_delta_rule(*inputs)

    def theirs():
        return torch_chunk_gated_delta_rule(*inputs, use_qk_l2norm_in_kernel=True)[0]

    def step(fn, backward):
        if not backward:
            with torch.no_grad():
                return fn()
        for t in inputs:
            t.grad = None
        out = fn()
        (out * weight).sum().backward()
        return out

    def timed(fn, backward):
        step(fn, backward)
        t0 = time.perf_counter()
        for _ in range(args.iters):
            step(fn, backward)
        return (time.perf_counter() - t0) / args.iters

    with torch.no_grad():
        diff = (ours() - theirs()).abs().max().item()
    tokens = b * length
    print(f"batch {b} x {length} ({tokens} tokens), {hk} key heads / {hv} value heads of {d}, chunk 64, fp32, "
          f"{args.threads} threads, torch {torch.__version__}; max |megadsl - transformers| = {diff:.2e}")
    print(f"{'pass':<12} {'megadsl':>10} {'transformers':>13} {'ratio':>7}   (tokens/s, median of {args.repeats})")
    for backward in (False, True):
        a, t = [], []
        for _ in range(args.repeats):
            a.append(tokens / timed(ours, backward))
            t.append(tokens / timed(theirs, backward))
        ma, mt = statistics.median(a), statistics.median(t)
        print(f"{'fwd + bwd' if backward else 'fwd':<12} {ma:>10.0f} {mt:>13.0f} {ma / mt:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
