"""A rank-32 LoRA training step against a full fine-tuning step of the same model, megadsl and PEFT on
transformers side by side in the same run (issue 48): tokens/s, AdamW's bytes, gradient bytes and
the process's peak memory rise over the step.

    PYTHONPATH=build/python .venv/bin/python bench/lora.py [--hidden 512] [--layers 4] [--seq 512]
                                                           [--rows 8] [--rank 32] [--steps 4]

The model is made here (transformers' Qwen3Config, random weights, vocab 32,000). Each mode runs in
a fresh process (so its peak RSS is its own): one warm-up step, then `--steps` timed steps (median).
The loss is the same policy-gradient sum on every side (-sum(advantage * log p) / tokens).

  megadsl full    Model.from_hf(...).trainer(): AdamW over every parameter
  megadsl lora    Model.from_hf(..., lora_rank=32, lora_alpha=64): the base frozen, AdamW over the adapters
  peft lora       PEFT's get_peft_model (r 32, all-linear) on transformers, torch's AdamW over the adapters
  hf full         transformers, torch's AdamW over every parameter
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

MODES = ("megadsl full", "megadsl lora", "peft lora", "hf full")


def make_model(out, hidden, layers):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=32000, hidden_size=hidden, intermediate_size=3 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                   num_key_value_heads=max(1, hidden // 128), head_dim=64,
                                   max_position_embeddings=4096, tie_word_embeddings=False)
    transformers.Qwen3ForCausalLM(cfg).to(torch.float32).save_pretrained(out)


def batch(rows, seq):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 32000, (rows, seq), generator=g)
    mask = torch.ones_like(ids)
    loss_mask = mask.clone().float()
    loss_mask[:, -1] = 0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask,
            "advantages": torch.randn(ids.shape, generator=g)}


def pg_loss(log_probs, b, tokens):
    return -(b["advantages"] * log_probs * b["loss_mask"]).sum() / tokens


def child(mode, path, args):
    import torch

    torch.manual_seed(0)
    b = batch(args.rows, args.seq)
    tokens = b["loss_mask"].sum()
    info = {}
    if mode.startswith("megadsl"):
        import megadsl

        kw = dict(lora_rank=args.rank, lora_alpha=2 * args.rank) if mode.endswith("lora") else {}
        model = megadsl.Model.from_hf(path, **kw)
        trainer = model.trainer(lr=1e-5)
        loss_fn = lambda out, mb, counts: pg_loss(out["log_probs"], mb, counts["batch_num_tokens"])  # noqa: E731

        def step():
            trainer.step(b, microbatches=1, loss_fn=loss_fn)

        def after():
            info["optimizer_bytes"] = trainer.optimizer_bytes
            info["trained_parameters"] = sum(t.numel() for _, t in model.export_lora()) if mode.endswith("lora") else \
                sum(t.numel() for t in model.parameters().values())
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if mode.startswith("peft"):
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules="all-linear"))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5)

        def step():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, b["input_ids"][:, 1:, None])[..., 0]
            loss = pg_loss(torch.nn.functional.pad(lp, (0, 1)), b, tokens)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        def after():
            info["optimizer_bytes"] = sum(t.numel() * t.element_size() for s in opt.state.values()
                                          for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
            info["trained_parameters"] = sum(p.numel() for p in params)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()  # warm-up (and AdamW's state)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    after()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    info.update(step_s=statistics.median(times), tokens_per_s=args.rows * args.seq / statistics.median(times),
                peak_rise_mb=(peak - loaded) / 1024)
    print(json.dumps(info))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--child", default=None)
    ap.add_argument("--path", default=None)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.path, args)
        return
    threads = os.environ.get("OMP_NUM_THREADS", "all")
    print(f"hidden {args.hidden}, {args.layers} layers, vocab 32000, {args.rows} x {args.seq} tokens, rank {args.rank}, "
          f"fp32 on the CPU (threads: {threads})")
    with tempfile.TemporaryDirectory() as d:
        make_model(d, args.hidden, args.layers)
        rows = {}
        for mode in MODES:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--path", d] + \
                  [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "seq", "rows", "rank", "steps")]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{mode}: failed\n{out.stderr[-2000:]}")
                continue
            rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'mode':<14} {'tokens/s':>9} {'step s':>7} {'trained params':>15} {'AdamW MB':>9} {'peak rise MB':>13}")
    for mode, r in rows.items():
        print(f"{mode:<14} {r['tokens_per_s']:>9.0f} {r['step_s']:>7.3f} {r['trained_parameters']:>15,} "
              f"{r['optimizer_bytes'] / 2**20:>9.1f} {r['peak_rise_mb']:>13.0f}")
    if "megadsl full" in rows and "megadsl lora" in rows:
        f, l = rows["megadsl full"], rows["megadsl lora"]
        print(f"megadsl lora / full: speed {l['tokens_per_s'] / f['tokens_per_s']:.2f}x, peak rise "
              f"{l['peak_rise_mb'] / f['peak_rise_mb']:.2f}x, AdamW bytes saved {(f['optimizer_bytes'] - l['optimizer_bytes']) / 2**20:.0f} MB")
    if "megadsl lora" in rows and "peft lora" in rows:
        print(f"megadsl lora / peft lora: speed {rows['megadsl lora']['tokens_per_s'] / rows['peft lora']['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
