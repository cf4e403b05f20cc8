"""Every family's fixture on CUDA: `megadsl run --device cuda` against the log-probs transformers wrote.

    python3 bench/gpu_families.py --megadsl build/tools/megadsl [--fixtures tests/fixtures] [--jobs 8]

For each fixture (tests/fixtures/*/, a tiny checkpoint written by transformers with its reference
outputs), the reference's left-padded batch is run through `megadsl run` on the GPU:
  fp32 padded      one rank, SDPA with the padding mask
  fp32 rmpad       one rank, remove-padding (the packed path)
  bf16 rmpad       one rank, bf16 compute over fp32 weights (verl's mixed precision)
  fp32 2 ranks     two local ranks on the one GPU: tp 2 + SP + remove-padding, or for a mixture
                   of experts ep 2 + remove-padding (the batch split over the two replicas); their
                   CUDA tensors go between the ranks through host memory over Gloo
                   (MEGADSL_CUDA_COMM=gloo), since NCCL wants a GPU per rank.
Each prints the max and mean |log-prob - transformers' fp32 log-prob| over the valid positions,
beside transformers' own bf16 error (its causal-LM class in bf16 with SDPA, or eager attention
where the family refuses SDPA, on the same GPU: the yardstick for megadsl's bf16; "n/a" where this
transformers lacks the family). The fp32 cases must be within --tol (1e-4); bf16 is reported. Exit
status 1 when an fp32 case misses or a run fails.
"""

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def is_moe(config):
    text = config.get("text_config", config)
    return any(isinstance(text.get(k), int) and text.get(k) > 0 for k in EXPERT_KEYS)


def cases(moe):
    two = ["--ranks", "2", "--ep", "2", "--rmpad"] if moe else ["--ranks", "2", "--tp", "2", "--sp", "--rmpad"]
    return [("fp32 padded", []), ("fp32 rmpad", ["--rmpad"]), ("bf16 rmpad", ["--rmpad", "--compute", "bf16"]),
            ("fp32 2 ranks", two)]


def run_case(args, fixture, name, flags, work):
    import torch
    from safetensors.torch import load_file

    out = os.path.join(work, name.replace(" ", "_") + ".safetensors")
    cmd = [args.megadsl, "run", fixture, "--device", args.device, "--input", os.path.join(work, "left.safetensors"),
           "--output", out] + flags
    env = dict(os.environ, MEGADSL_CUDA_COMM="gloo")
    t0 = time.perf_counter()
    left = args.ends_at - t0
    if left < 5:
        return dict(case=name, error="not run: --deadline passed", seconds=0.0)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=min(args.timeout, left))
    except subprocess.TimeoutExpired:
        return dict(case=name, error=f"timed out after {min(args.timeout, left):.0f} s", seconds=min(args.timeout, left))
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        # The rank's own message, not the launcher's "rank 0 exited with code 1" after it.
        lines = [l for l in (p.stderr + p.stdout).splitlines() if l.strip() and not l.startswith("megadsl launch:")]
        return dict(case=name, error=(lines[-1] if lines else f"exit {p.returncode}")[:300], seconds=seconds)
    got = load_file(out)
    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    valid = got["valid"].bool() & ref["left.attention_mask"].bool()
    diff = (got["log_probs"].double() - ref["left.log_probs"].double()).abs()[valid]
    return dict(case=name, max=diff.max().item(), mean=diff.mean().item(), seconds=seconds,
                flags=" ".join(flags))


def hf_bf16(fixture, device):
    """transformers' own bf16 error on the fixture's left-padded batch (max, mean), or a reason."""
    import torch
    import transformers
    from safetensors.torch import load_file

    if fixture.rstrip("/").endswith("-vl-tf5"):
        return "multimodal class"
    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    model = None
    for attention in ("sdpa", "eager"):  # eager where the family refuses SDPA (gpt-oss's sinks)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.bfloat16,
                                                                      attn_implementation=attention).to(device).eval()
            break
        except ValueError:
            continue
        except Exception as e:  # a family this transformers does not have
            return type(e).__name__
    if model is None:
        return "no attention"
    ids, mask, pos = (ref[f"left.{k}"].to(device) for k in ("input_ids", "attention_mask", "position_ids"))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.double()
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    lp = torch.log_softmax(logits, -1).gather(-1, nxt.unsqueeze(-1)).squeeze(-1).cpu()
    valid = ref["left.attention_mask"].bool()
    pair = torch.zeros_like(valid)
    pair[:, :-1] = valid[:, :-1] & valid[:, 1:]
    diff = (lp - ref["left.log_probs"].double()).abs()[pair]
    del model
    return diff.max().item(), diff.mean().item()


def prepare(fixture, work):
    from safetensors.torch import load_file, save_file

    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    save_file({"input_ids": ref["left.input_ids"].contiguous(), "attention_mask": ref["left.attention_mask"].contiguous()},
              os.path.join(work, "left.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megadsl", required=True, help="the megadsl executable")
    ap.add_argument("--fixtures", default=os.environ.get("MEGADSL_FIXTURES", "tests/fixtures"))
    ap.add_argument("--only", default=None, help="comma-separated fixture names")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=60, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=600, help="seconds for them all: later runs are not started")
    ap.add_argument("--out", default=None, help="a folder for the json table")
    args = ap.parse_args()
    args.ends_at = time.perf_counter() + args.deadline
    names = sorted(d for d in os.listdir(args.fixtures)
                   if os.path.exists(os.path.join(args.fixtures, d, "reference.safetensors")))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    root = tempfile.mkdtemp(prefix="megadsl-gpu-families-")
    jobs = []
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for n in names:
            fixture = os.path.join(args.fixtures, n)
            with open(os.path.join(fixture, "config.json")) as f:
                config = json.load(f)
            work = os.path.join(root, n)
            os.makedirs(work)
            prepare(fixture, work)
            for case, flags in cases(is_moe(config)):
                jobs.append((n, pool.submit(run_case, args, fixture, case, flags, work)))
        # transformers' own bf16 error, in this process while the runs go on.
        hf = {}
        for n in names:
            if time.perf_counter() > args.ends_at - 10:
                hf[n] = "--deadline"
                continue
            try:
                hf[n] = hf_bf16(os.path.join(args.fixtures, n), args.device)
            except Exception as e:
                hf[n] = f"{type(e).__name__}: {str(e)[:80]}"
        results = {}
        for n, fut in jobs:
            try:
                r = fut.result()
            except Exception as e:  # a timeout, a file that is not there
                r = dict(case="?", error=str(e)[:300])
            results.setdefault(n, []).append(r)
    bad = 0
    width = max(len(n) for n in names)
    heads = [c for c, _ in cases(False)]
    print(f"\n{'fixture':{width}}  " + "  ".join(f"{h:>21}" for h in heads) + f"  {'hf bf16':>21}"
          + "   (max / mean |Δ log-prob|)")
    errors = []
    for n in names:
        cells = []
        for r in results[n]:
            if "error" in r:
                cells.append(f"{'FAILED':>21}")
                errors.append(f"{n} {r['case']}: {r['error']}")
                bad += 1
                continue
            miss = r["case"].startswith("fp32") and not r["max"] <= args.tol
            bad += miss
            cells.append(f"{r['max']:9.2e} / {r['mean']:8.1e}{'!' if miss else ' '}")
        h = hf[n]
        cells.append(f"{h[0]:9.2e} / {h[1]:8.1e} " if isinstance(h, tuple) else f"{'n/a (' + h[:14] + ')':>21}")
        print(f"{n:{width}}  " + "  ".join(cells))
    for e in errors[:25]:
        print("  " + e)
    if len(errors) > 25:
        print(f"  ... and {len(errors) - 25} more (--out's json has them all)")
    print(f"\n{len(names)} fixtures; fp32 within {args.tol:g} of transformers' fp32 log-probs ('!' where not); "
          f"{bad} case(s) failed or missed")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_families.json"), "w") as f:
            json.dump(dict(megadsl=results, hf_bf16=hf), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
