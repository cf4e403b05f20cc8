"""megadsl on one CUDA GPU against transformers on the same GPU, the same checkpoint and batches.

    python3 bench/gpu_throughput.py                                  # both shapes, parity, a profile
    python3 bench/gpu_throughput.py --shapes llama3.2-1b --iters 3 --no-parity --no-profile
    python3 bench/gpu_throughput.py --device cpu --tiny              # a smoke run of the script itself

megadsl's side runs in the program bench_gpu_step (bench/gpu_step.cpp: the library alone) with
--megadsl-bin PATH, or in this process through the Python module with --megadsl python
(PYTHONPATH=<build>/python). transformers runs in this process. scripts/gpu_check.sh builds both on
the lent GPU machine and runs this.

Each shape is a random checkpoint written by transformers (bf16 safetensors, embeddings tied or not
as the real models): Llama-3.2-1B and Qwen3-1.7B by default; llama3.1-8b (Llama-3.1-8B's sizes) runs
its own variants (rmpad, full recompute with and without activation offload) and transformers
padding-free with gradient checkpointing, without parity; mistral-window a sliding window. The batch has `--batch` rows of at most `--seq`
tokens with mixed lengths (spread over [seq/4, seq], left-padded as verl's rollouts are).

Throughput (one table): forward (log-probs + entropy, no grad) and forward + backward (a PPO loss
over log-probs and entropy) for
  megadsl   bf16 compute over fp32 parameters (verl's mixed precision), padded (SDPA) and
            remove-padding (the variable-length flash kernel), or --variants (bench_gpu_step's:
            rmpad-unfused, rmpad-full, rmpad-full-offload, rmpad-invariant, rmpad-whole-head),
  hf        transformers, bf16 weights, sdpa: padded with the attention mask, and padding-free
            (one packed row, position_ids restarting per sequence: its block-diagonal mask).
Tokens are the batch's real tokens; step time is the median over `--iters` timed steps (CUDA
events, after warm-up); peak memory is torch's CUDA allocator peak during the case (both sides
allocate through it); MFU is the useful FLOPs by Megatron's formula (causal attention: 2 x n^2 x
q_dim per layer and sequence; weights 2 x per token, LM head included; x3 for forward + backward)
over the time and the device's dense bf16 peak (--peak, else by its name: 989.4 TFLOP/s for the
H100 / H200 SXM). The measured bf16 GEMM rate of this device is printed beside it.

Parity (one table per shape): log-prob error against transformers in fp32 (TF32 off) on the same
batch: max and mean absolute error over the valid positions, for transformers in bf16 (its own
bf16 error, the yardstick), megadsl in fp32, and megadsl bf16 padded and remove-padding.

Profile: one forward + backward step of megadsl (remove-padding) and of transformers (padding-free)
under the Kineto profiler: the kernels by GPU time, the GPU's busy share of the step, and the host
synchronisations in the step. Full tables go to --out (a folder), the summary to stdout.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

# The CPU benchmark's objective and measured steps (bench/side_by_side.py): one definition of each.
import side_by_side
from side_by_side import megadsl_step

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = {
    # meta-llama/Llama-3.2-1B's config.json (random weights)
    "llama3.2-1b": dict(family="llama", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                        vocab=128256, rope_theta=500000.0, eps=1e-5, max_pos=131072,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # Qwen/Qwen3-1.7B's config.json (random weights)
    "qwen3-1.7b": dict(family="qwen3", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                       vocab=151936, rope_theta=1000000.0, eps=1e-6, max_pos=40960, rope_scaling=None),
    # Llama-3.2-1B's sizes as a Mistral with a 1,024-token sliding window (random weights): the
    # windowed families' path (Mistral, Gemma 2/3's local layers, Cohere2, OLMo 3, ...)
    "mistral-window": dict(family="mistral", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                           vocab=32768, rope_theta=1000000.0, eps=1e-5, max_pos=32768, rope_scaling=None,
                           window=1024),
    # meta-llama/Llama-3.1-8B's sizes (random weights): the 8B-class shape on one GPU. Its
    # activations at batch 8 x 4096 do not fit beside fp32 parameters and gradients without full
    # recompute; transformers runs padding-free with gradient checkpointing (its padded case and
    # the fp32 parity copy are left out: 32 GB more each).
    "llama3.1-8b": dict(family="llama", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                        vocab=128256, rope_theta=500000.0, eps=1e-5, max_pos=131072,
                        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192),
                        tied=False, bench=dict(variants="rmpad,rmpad-full,rmpad-full-offload", hf_cases=("padding-free",),
                                   hf_checkpointing=True, parity=False)),
    # the smoke shape (--tiny)
    "tiny": dict(family="llama", hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=256, vocab=1000,
                 rope_theta=10000.0, eps=1e-5, max_pos=4096, rope_scaling=None),
}


def log(*a):
    print(*a, flush=True)


# ---- the checkpoint and the batches ------------------------------------------------------------


def hf_config(s):
    extra = {}
    if s["family"] == "qwen3":
        from transformers import Qwen3Config as Config
    elif s["family"] == "mistral":
        from transformers import MistralConfig as Config

        extra["sliding_window"] = s["window"]
    else:
        from transformers import LlamaConfig as Config
    kw = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
              num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], intermediate_size=s["ffn"],
              vocab_size=s["vocab"], rms_norm_eps=s["eps"], max_position_embeddings=s["max_pos"],
              tie_word_embeddings=s.get("tied", True), **extra)
    rope = dict(rope_type="default", rope_theta=s["rope_theta"])
    if s["rope_scaling"]:
        rope.update(s["rope_scaling"])
    cfg = Config(**kw, rope_parameters=rope)
    return cfg


def make_checkpoint(s, path, device):
    """transformers builds the model on the device (bf16) and writes it: the model is returned."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(s), dtype=torch.bfloat16, attn_implementation="sdpa")
    model.save_pretrained(path)
    return model.eval()


def make_batch(s, batch, seq, device, seed=7):
    """(ids, mask): `batch` rows of `seq`, lengths spread over [seq/4, seq], left-padded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, s["vocab"], (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    lengths = torch.linspace(seq // 4, seq, batch).round().long()
    lengths = lengths[torch.randperm(batch, generator=g)]
    for i, n in enumerate(lengths.tolist()):
        mask[i, : seq - n] = 0
        ids[i, : seq - n] = 0
    return ids.to(device), mask.to(device)


def useful_flops(s, mask, backward):
    """Megatron's count (causal attention) of the batch's real tokens; with a sliding window W, the
    scores of the (query, key) pairs it keeps: 4 q per pair, W (W + 1) / 2 + (n - W) W pairs."""
    q, kv, h = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["hidden"]
    weights = s["layers"] * (h * (q + 2 * kv) + q * h + 3 * h * s["ffn"]) + s["vocab"] * h
    lengths = mask.sum(1).tolist()
    w = s.get("window")

    def attention(n):
        return 2 * n * n * q if not w or n <= w else 4 * q * (w * (w + 1) // 2 + (n - w) * w)

    forward = 2 * weights * sum(lengths) + sum(attention(n) for n in lengths) * s["layers"]
    return forward * (3 if backward else 1)


# ---- the two sides -----------------------------------------------------------------------------


def hf_outputs(model, ids, mask, packed):
    """log-probs of the next token and entropy, (b, s) fp32, from transformers' logits, computed on
    the valid positions only (the full padded (b, s, vocab) fp32 tensor is not made)."""
    import torch

    valid = torch.zeros_like(mask, dtype=torch.bool)
    valid[:, :-1] = mask[:, :-1].bool() & mask[:, 1:].bool()
    if packed:  # transformers' padding-free path: one row, positions restarting per sequence
        keep = mask.bool()
        pos = (mask.cumsum(1) - 1)[keep].unsqueeze(0)
        hidden = model.model(input_ids=ids[keep].unsqueeze(0), position_ids=pos).last_hidden_state[0]
        full = hidden.new_zeros(ids.shape + (hidden.shape[-1],))
        full[keep] = hidden
        hidden = full
    else:
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    logits = model.lm_head(hidden[valid]).float()  # (n, vocab)
    targets = ids[:, 1:][valid[:, :-1]]
    lse = torch.logsumexp(logits, -1)
    lp_v = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent_v = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    lp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).masked_scatter(valid, lp_v)
    ent = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device).masked_scatter(valid, ent_v)
    return lp, ent, valid


def hf_step(model, ids, mask, backward, packed):
    return side_by_side.hf_step(model, ids, mask, backward, packed, outputs=hf_outputs)


# ---- measuring ---------------------------------------------------------------------------------


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(step, iters, device, warmup=2):
    """Median seconds per step (CUDA events around each step), and the allocator's peak bytes."""
    import torch

    for _ in range(warmup):
        step()
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return statistics.median(times), peak


def device_peak(args):
    """(name, dense bf16 peak FLOP/s used for MFU, measured bf16 GEMM FLOP/s)."""
    import torch

    if args.device != "cuda":
        return "cpu", args.peak or 1e12, 0.0
    name = torch.cuda.get_device_name()
    peak = args.peak * 1e12 if args.peak else (989.4e12 if ("H100" in name or "H200" in name) else None)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        a @ b
    e1.record()
    e1.synchronize()
    measured = 10 * 2 * n**3 / (e0.elapsed_time(e1) / 1e3)
    return name, peak or measured, measured


# ---- the parts ---------------------------------------------------------------------------------


def save_batch(path, ids, mask):
    from safetensors.torch import save_file

    save_file({"input_ids": ids.cpu().contiguous(), "attention_mask": mask.cpu().contiguous()}, path)


def megadsl_program(args, name, path, ids, mask, pids, pmask, profile, ab=False, variants=None):
    """Runs bench_gpu_step on the checkpoint: its rows (layout, work, step_s, peak_gib), the parity
    log-probs (a dict) and the trace's path (or None)."""
    import subprocess

    from safetensors.torch import load_file

    work = os.path.join(args.work, name + "-megadsl")
    os.makedirs(work, exist_ok=True)
    save_batch(os.path.join(work, "batch.safetensors"), ids, mask)
    cmd = [args.megadsl_bin, path, os.path.join(work, "batch.safetensors"), work, "--iters", str(args.iters),
           "--device", args.device]
    if pids is not None:
        save_batch(os.path.join(work, "parity.safetensors"), pids, pmask)
        cmd += ["--parity", os.path.join(work, "parity.safetensors")]
    if profile:
        cmd += ["--profile"]
    if ab:
        cmd += ["--ab"]
    if variants:
        cmd += ["--variants", variants]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in r.stdout.splitlines():
        if "USDT" not in line and "gpuGetDeviceCount" not in line:
            log("  | " + line)
    if r.returncode != 0:
        log(f"  bench_gpu_step exited with {r.returncode}")
    rows = []
    if os.path.exists(os.path.join(work, "megadsl_steps.json")):
        with open(os.path.join(work, "megadsl_steps.json")) as f:
            rows = json.load(f)
    lps = None
    if pids is not None and os.path.exists(os.path.join(work, "megadsl_logprobs.safetensors")):
        lps = load_file(os.path.join(work, "megadsl_logprobs.safetensors"))
    trace = os.path.join(work, "megadsl_trace.json")
    return rows, lps, (trace if profile and os.path.exists(trace) else None)


def variants_for(given, name, s):
    """--variants for this shape: a list for every shape, or this shape's part of 'SHAPE=V,V;...';
    else the shape's own (SHAPES' bench), else None (bench_gpu_step's default)."""
    if given and "=" not in given:
        return given
    per_shape = dict(part.split("=", 1) for part in (given or "").split(";") if part)
    return per_shape.get(name) or s.get("bench", {}).get("variants")


def megadsl_in_process(args, path, ids, mask):
    """The same rows through the Python module, in this process."""
    import torch

    import megadsl

    rows = []
    for rmpad in (False, True):
        model = megadsl.Model.from_hf(path, dtype="bf16", device=args.device, rmpad=rmpad, batch_checksum=False)
        for backward in (False, True):
            seconds, peak_bytes = timed(lambda: megadsl_step(model, ids, mask, backward), args.iters, args.device)
            rows.append(dict(layout="rmpad" if rmpad else "padded", work="fwd+bwd" if backward else "fwd",
                             step_s=seconds, peak_gib=peak_bytes / 2**30))
        model.close()
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def megadsl_parity_in_process(args, path, ids, mask):
    import megadsl

    out = {}
    for label, dtype, rmpad in (("fp32", "fp32", False), ("bf16_padded", "bf16", False), ("bf16_rmpad", "bf16", True)):
        m = megadsl.Model.from_hf(path, dtype=dtype, device=args.device, rmpad=rmpad)
        out[label] = m.forward(ids, mask)["log_probs"].float()
        m.close()
    return out


def add_row(rows, s, name, work, label, mask, seconds, peak_bytes, peak):
    tokens = int(mask.sum())
    mfu = useful_flops(s, mask.cpu(), work == "fwd+bwd") / seconds / peak
    rows.append(dict(shape=name, work=work, case=label, tokens=tokens, step_s=seconds, tokens_per_s=tokens / seconds,
                     mfu=mfu, peak_gib=peak_bytes / 2**30))
    log(f"  {name:12} {work:8} {label:22} {seconds * 1e3:9.1f} ms {tokens / seconds:12,.0f} tok/s "
        f"MFU {100 * mfu:5.1f}%  peak {peak_bytes / 2**30:6.1f} GiB")


def hf_throughput(args, name, s, hf_model, ids, mask, peak, rows):
    import torch

    bench = s.get("bench", {})
    cases = [(label, packed) for label, packed in (("hf sdpa padded", False), ("hf sdpa padding-free", True))
             if label.split(" ", 2)[2] in bench.get("hf_cases", ("padded", "padding-free"))]
    if bench.get("hf_checkpointing"):
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        cases = [(label + " ckpt", packed) for label, packed in cases]
    for backward in (False, True):
        for label, packed in cases:
            hf_model.train(backward)
            # Out of memory with the whole batch: the same rows in 2, then 4 micro-batches, one after
            # the other (the same work in smaller pieces), said beside the row.
            for micro in (1, 2, 4):
                def step(micro=micro):
                    for i, m in zip(ids.chunk(micro), mask.chunk(micro)):
                        hf_step(hf_model, i, m, backward, packed)

                try:
                    seconds, peak_bytes = timed(step, args.iters, args.device)
                    if micro > 1:
                        log(f"  {name} {label}: in {micro} micro-batches (the whole batch ran out of memory)")
                    break
                except Exception as e:  # noqa: BLE001  (an OOM is a row, not the end)
                    log(f"  {name} {label}: {micro} micro-batch(es) failed: {type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120]}")
                    seconds, peak_bytes = float("nan"), 0
                    hf_model.zero_grad(set_to_none=True)
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
                    if not (args.device == "cuda" and isinstance(e, torch.cuda.OutOfMemoryError)):
                        break
            hf_model.zero_grad(set_to_none=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
            add_row(rows, s, name, "fwd+bwd" if backward else "fwd", label, mask, seconds, peak_bytes, peak)


def parity(args, name, s, hf_model, ids, mask, megadsl_lps, out_rows):
    """log-prob errors against transformers fp32 (TF32 off) on one batch."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        hf_model.eval()
        lp_bf16, _, valid = hf_outputs(hf_model, ids, mask, False)
        fp32 = copy.deepcopy(hf_model).float()
        ref, ref_ent, _ = hf_outputs(fp32, ids, mask, False)
        del fp32
        if args.device == "cuda":
            torch.cuda.empty_cache()
    got = {"transformers bf16 (its own error)": lp_bf16}
    for key, label in (("fp32", "megadsl fp32"), ("bf16_padded", "megadsl bf16 padded"),
                       ("bf16_rmpad", "megadsl bf16 rmpad")):
        if megadsl_lps and key in megadsl_lps:
            got[label] = megadsl_lps[key].to(ref.device).float()
    v = valid
    for label, lp in got.items():
        err = (lp - ref).abs()[v]
        row = dict(shape=name, side=label, max_abs=float(err.max()), mean_abs=float(err.mean()),
                   positions=int(v.sum()), ref_mean_log_prob=float(ref[v].mean()),
                   ref_mean_entropy=float(ref_ent[v].mean()))
        out_rows.append(row)
        log(f"  {name:12} {label:34} max {row['max_abs']:.3e}  mean {row['mean_abs']:.3e}")


def trace_summary(side, path, out):
    """The kernels by GPU time, the GPU's busy share of the step, the host synchronisations."""
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    kernels, runtime, ops = {}, {}, {}
    first, last = None, None
    # The op (and its input shapes, where recorded) that launched each kernel: by correlation id
    # through the runtime call, else by the shared External id.
    op_of_ext, ext_of_corr = {}, {}
    for e in events:
        a = e.get("args", {}) or {}
        if e.get("cat") == "cpu_op" and "External id" in a:
            dims = a.get("Input Dims")
            op_of_ext[a["External id"]] = e.get("name", "") + (" " + json.dumps(dims)[:90] if dims else "")
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in a and "External id" in a:
            ext_of_corr[a["correlation"]] = a["External id"]
    by_op = {}
    for e in events:
        cat, name, dur = e.get("cat", ""), e.get("name", ""), float(e.get("dur", 0) or 0)
        if cat == "kernel" or cat == "gpu_memcpy" or cat == "gpu_memset":
            k = kernels.setdefault(name, [0.0, 0])
            k[0] += dur
            k[1] += 1
            a = e.get("args", {}) or {}
            ext = a.get("External id", ext_of_corr.get(a.get("correlation")))
            o = by_op.setdefault(op_of_ext.get(ext, "(no op)"), [0.0, 0])
            o[0] += dur
            o[1] += 1
            ts = float(e.get("ts", 0))
            first = ts if first is None else min(first, ts)
            last = ts + dur if last is None else max(last, ts + dur)
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            r = runtime.setdefault(name, [0.0, 0])
            r[0] += dur
            r[1] += 1
        elif cat == "cpu_op" and name in ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::to",
                                          "aten::copy_"):
            ops[name] = ops.get(name, 0) + 1
    busy = sum(v[0] for v in kernels.values())
    span = (last - first) if first is not None else 0.0
    syncs = {n: v[1] for n, v in runtime.items() if "Synchronize" in n or "Memcpy" in n and "Async" not in n}
    launches = sum(v[1] for n, v in runtime.items() if "LaunchKernel" in n or "cuLaunch" in n)
    lines = [f"profile {side}: GPU busy {busy / 1e3:.1f} ms of a {span / 1e3:.1f} ms span "
             f"({100 * busy / span if span else 0:.0f}%); {launches} kernel launches; host syncs {syncs}; "
             f"ops {ops}"]
    for n, (d, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]:
        lines.append(f"    {100 * d / busy if busy else 0:5.1f}%  {d / 1e3:8.2f} ms  x{c:<5} {n[:110]}")
    lines.append("  by the op that launched them (with input shapes where recorded):")
    for n, (d, c) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:25]:
        lines.append(f"    {100 * d / busy if busy else 0:5.1f}%  {d / 1e3:8.2f} ms  x{c:<5} {n[:150]}")
    out.write("\n".join(lines) + "\n")
    for line in lines[:9]:
        log("  " + line)


def hf_trace(args, name, hf_model, ids, mask):
    import torch
    from torch.profiler import ProfilerActivity, profile as prof

    hf_model.train()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    step = lambda: hf_step(hf_model, ids, mask, True, True)  # noqa: E731
    step()
    sync(args.device)
    with prof(activities=acts, record_shapes=True) as p:
        step()
        sync(args.device)
    path = os.path.join(args.work, name + "-hf-trace.json")
    p.export_chrome_trace(path)
    hf_model.zero_grad(set_to_none=True)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="llama3.2-1b,qwen3-1.7b")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--parity-batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak", type=float, default=None, help="dense bf16 peak, TFLOP/s (default: by device name)")
    ap.add_argument("--work", default="/tmp/megadsl-gpu-bench", help="where the checkpoints are written")
    ap.add_argument("--out", default=None, help="a folder for the full tables (json, profiles)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, seq 256: checks the script")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--no-parity", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--ab", action="store_true",
                    help="megadsl remove-padding rows with its fused kernels off too (first shape): what they save")
    ap.add_argument("--variants", default=None,
                    help="bench_gpu_step's variants, comma-separated, for every shape, or per shape as "
                         "'SHAPE=V,V;SHAPE=V' (default: the shape's own, else padded,rmpad)")
    ap.add_argument("--megadsl", choices=("program", "python"), default="program",
                    help="megadsl's side: the program bench_gpu_step (default) or the Python module in this process")
    ap.add_argument("--megadsl-bin", default=None, help="bench_gpu_step (default: build*/bench/bench_gpu_step)")
    args = ap.parse_args()
    if args.tiny:
        args.shapes, args.seq, args.batch, args.parity_batch = "tiny", 256, 4, 2
    import glob

    import torch
    import transformers

    if args.megadsl == "program" and not args.megadsl_bin:
        found = sorted(glob.glob(os.path.join(os.path.dirname(HERE), "build*", "bench", "bench_gpu_step")))
        if not found:
            sys.exit("gpu_throughput.py: no bench_gpu_step under build*/bench: build it, or pass --megadsl-bin "
                     "PATH or --megadsl python")
        args.megadsl_bin = found[0]
    out_dir = args.out or os.path.join(args.work, "out")
    os.makedirs(out_dir, exist_ok=True)
    dev_name, peak, gemm = device_peak(args)
    log(f"device {dev_name}; torch {torch.__version__}, transformers {transformers.__version__}; megadsl: "
        f"{args.megadsl_bin or 'the Python module'}; MFU against {peak / 1e12:.1f} TFLOP/s dense bf16; "
        f"measured bf16 GEMM 8192^3: {gemm / 1e12:.1f} TFLOP/s")
    log(f"batch {args.batch} x seq {args.seq} (mixed lengths, left-padded); {args.iters} timed steps per case")
    rows, prows = [], []
    profile_out = open(os.path.join(out_dir, "profile.txt"), "w")
    shapes = args.shapes.split(",")
    for name in shapes:
        s = SHAPES[name]
        path = os.path.join(args.work, name)
        t0 = time.perf_counter()
        hf_model = make_checkpoint(s, path, args.device)
        log(f"{name}: checkpoint written by transformers in {time.perf_counter() - t0:.1f} s")
        ids, mask = make_batch(s, args.batch, args.seq, args.device)
        pids, pmask = make_batch(s, args.parity_batch, args.seq, args.device, seed=11)
        with_parity = not args.no_parity and s.get("bench", {}).get("parity", True)
        profile = not args.no_profile and name == shapes[0]
        megadsl_lps, trace = None, None
        if args.megadsl == "python":
            m_rows = [] if args.no_throughput else megadsl_in_process(args, path, ids, mask)
            if not args.no_parity:
                megadsl_lps = megadsl_parity_in_process(args, path, pids, pmask)
        else:
            m_rows, megadsl_lps, trace = megadsl_program(args, name, path, ids, mask,
                                                         pids if with_parity else None, pmask, profile,
                                                         ab=args.ab and name == shapes[0],
                                                         variants=variants_for(args.variants, name, s))
        if not args.no_throughput:
            for r in m_rows:
                if "note" in r:  # a variant that ran out of memory or failed: said, not timed
                    log(f"  {name} megadsl {r['layout']} {r['work']}: {r['note']}")
                    continue
                add_row(rows, s, name, r["work"], f"megadsl {r['layout']}", mask, r["step_s"], r["peak_gib"] * 2**30,
                        peak)
            hf_throughput(args, name, s, hf_model, ids, mask, peak, rows)
        if with_parity:
            parity(args, name, s, hf_model, pids, pmask, megadsl_lps, prows)
        if profile:
            if trace:
                trace_summary(f"megadsl {name} rmpad fwd+bwd", trace, profile_out)
            trace_summary(f"transformers {name} padding-free fwd+bwd", hf_trace(args, name, hf_model, ids, mask),
                          profile_out)
        del hf_model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    profile_out.close()
    for work in ("fwd", "fwd+bwd"):
        for name in shapes:
            base = [r for r in rows if r["shape"] == name and r["work"] == work and r["case"] == "hf sdpa padded"]
            # transformers' fastest case on this shape and work (padding-free, as a rule)
            best = max((r["tokens_per_s"] for r in rows if r["shape"] == name and r["work"] == work
                        and r["case"].startswith("hf ") and r["tokens_per_s"] == r["tokens_per_s"]), default=None)
            for r in rows:
                if base and r["shape"] == name and r["work"] == work:
                    r["vs_hf_padded"] = r["tokens_per_s"] / base[0]["tokens_per_s"]
                if best and r["shape"] == name and r["work"] == work:
                    r["vs_hf_best"] = r["tokens_per_s"] / best
    with open(os.path.join(out_dir, "gpu_throughput.json"), "w") as f:
        json.dump(dict(device=dev_name, peak=peak, gemm=gemm, torch=torch.__version__,
                       transformers=transformers.__version__, batch=args.batch, seq=args.seq,
                       throughput=rows, parity=prows), f, indent=1)
    if rows:
        log("\nshape        work     case                    step ms      tokens/s   MFU   vs hf padded  vs hf best  peak GiB")
        for r in rows:
            log(f"{r['shape']:12} {r['work']:8} {r['case']:22} {r['step_s'] * 1e3:8.1f} {r['tokens_per_s']:13,.0f} "
                f"{100 * r['mfu']:5.1f}%  {r.get('vs_hf_padded', float('nan')):6.2f}x  "
                f"{r.get('vs_hf_best', float('nan')):9.2f}x  {r['peak_gib']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
