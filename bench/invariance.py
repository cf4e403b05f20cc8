"""How many of one sequence's log-probs change with what else is in the batch, the padding and the
layout: the invariant property off and on, side by side; and its cost in tokens/s.

    .venv/bin/python bench/invariance.py [--fixtures qwen3-tf5,deepseek-v3-tf5] [--dtypes fp32,bf16]
                                         [--modes off,on] [--speed] [--quick]

Sweep: one sequence of 31 tokens, alone at tp 1 (the reference), then inside padded batches of 4
and 8 (left and right), packed (remove-padding), in micro-batches of 1 to 8, and at tp 2, tp 2 +
sp, tp 4, pp 2, cp 2 and, for mixtures, ep 2 and tp 2 x ep 2 (each on launch_local's ranks). Each
line prints how many of its 30 log-probs differ from the reference's bits and the largest |diff|.

--speed: tokens/s of the forward (log-probs) and of a training step (fwd + bwd + AdamW), off and
on, of a dense and a mixture model made here (transformers' configs, random weights), tp 1, the
ratio on/off (each the best of ROUNDS timings, the two modes timed in alternation).
"""

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
LENGTH = 31
ROUNDS = 5  # --speed: each mode timed this many times, alternating; the best kept


def batches(vocab):
    """The target row and batches holding it: {name: (ids, mask, row, micro_batch_size)}."""
    import torch

    g = torch.Generator().manual_seed(7)
    target = torch.randint(1, vocab, (LENGTH,), generator=g)
    out = {"alone": (target.unsqueeze(0), torch.ones(1, LENGTH, dtype=torch.long), 0, None)}
    for rows, side in ((4, "left"), (8, "right"), (8, "left")):
        width = LENGTH + 9
        ids = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        lengths = torch.randint(5, width + 1, (rows,), generator=g)
        at = rows // 2
        lengths[at] = LENGTH
        for r in range(rows):
            n = int(lengths[r])
            seq = target if r == at else torch.randint(1, vocab, (n,), generator=g)
            sl = slice(width - n, width) if side == "left" else slice(0, n)
            ids[r, sl] = seq
            mask[r, sl] = 1
        out[f"{side}-padded batch of {rows}"] = (ids, mask, at, None)
        if rows == 8 and side == "left":
            for mb in (1, 2, 3):
                out[f"left-padded 8 in micro-batches of {mb}"] = (ids, mask, at, mb)
    return out


def _positions(ids, mask, row):
    import torch

    valid = mask[row].bool().clone()
    idx = valid.nonzero().squeeze(1)
    keep = torch.zeros_like(valid)
    keep[idx[:-1]] = True  # the last token has no next token
    return keep


def _forward(path, kw, dtype, cases, world):
    import torch

    import megadsl

    model = megadsl.Model.from_hf(path, dtype=dtype, **kw)
    got = {}
    with torch.no_grad():
        for name, (ids, mask, row, mb) in cases.items():
            lp = model.forward(ids, mask, micro_batch_size=mb, entropy=False)["log_probs"]
            got[name] = lp[row][_positions(ids, mask, row)].clone()
    model.close()
    return got


def run_case(path, kw, dtype, cases, world):
    import megadsl

    if world == 1:
        return _forward(path, kw, dtype, cases, 1)
    return megadsl.launch_local(world, _forward, path, kw, dtype, cases, world, timeout=600)[0]


def layouts(moe):
    rows = [("tp 2", dict(tp=2), 2), ("tp 2 + sp", dict(tp=2, sp=True, rmpad=True), 2), ("tp 4", dict(tp=4), 4),
            ("pp 2", dict(pp=2), 2), ("cp 2", dict(cp=2, rmpad=True), 2)]
    if moe:
        rows += [("ep 2", dict(ep=2), 2), ("tp 2 x ep 2", dict(tp=2, ep=2), 4)]
    return rows


def sweep(fixture, dtype, invariant):
    import json

    import torch

    path = os.path.join(FIXTURES, fixture)
    config = json.load(open(os.path.join(path, "config.json")))
    text = config.get("text_config", config)
    moe = any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))
    cases = batches(int(text["vocab_size"]))
    extra = dict(invariant=True) if invariant else {}
    base = run_case(path, dict(**extra), dtype, cases, 1)
    ref = base["alone"]
    lines = [(name, base[name]) for name in cases if name != "alone"]
    packed = run_case(path, dict(rmpad=True, **extra), dtype, cases, 1)
    lines += [("packed " + name, packed[name]) for name in cases if name != "alone"]
    for label, kw, world in layouts(moe):
        try:
            got = run_case(path, dict(kw, **extra), dtype, {"alone": cases["alone"],
                                                              "left-padded batch of 8": cases["left-padded batch of 8"]}, world)
        except Exception as e:  # a layout the fixture cannot take
            print(f"  {label:38s} skipped: {str(e).splitlines()[-1][:120]}")
            continue
        lines += [(label + " alone", got["alone"]), (label + " in left-padded 8", got["left-padded batch of 8"])]
    worst = 0
    for name, lp in lines:
        differ = int((lp != ref).sum())
        d = (lp.double() - ref.double()).abs().max().item()
        worst = max(worst, differ)
        print(f"  {name:38s} {differ:2d}/{ref.numel()} differ   max |diff| {d:.2e}")
    return worst


def speed(invariant_modes):
    """tokens/s of the forward and of a training step, each mode, a dense and a mixture model."""
    import torch
    import transformers

    import megadsl

    tmp = tempfile.mkdtemp(prefix="megadsl-invariance-")
    models = {
        "dense (Llama, hidden 512 x 4)": transformers.LlamaConfig(
            hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
            vocab_size=8000, max_position_embeddings=4096, tie_word_embeddings=False),
        "mixture (Qwen3-MoE, hidden 256 x 4, 8 experts top 2)": transformers.Qwen3MoeConfig(
            hidden_size=256, intermediate_size=704, moe_intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_experts=8, num_experts_per_tok=2,
            vocab_size=8000, max_position_embeddings=4096, tie_word_embeddings=False),
    }
    torch.manual_seed(0)
    ids = torch.randint(1, 8000, (8, 512))
    mask = torch.ones_like(ids)
    tokens = ids.numel()
    for name, cfg in models.items():
        path = os.path.join(tmp, name.split()[0])
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
        batch = dict(input_ids=ids, attention_mask=mask, loss_mask=mask.float(),
                     old_log_probs=torch.zeros(ids.shape), advantages=torch.randn(ids.shape))
        runs = {}
        for mode in invariant_modes:  # both built first, then timed in alternation (the machine's drift hits both)
            model = megadsl.Model.from_hf(path, rmpad=True, **(dict(invariant=True) if mode == "on" else {}))
            trainer = model.trainer(lr=1e-5)
            with torch.no_grad():
                model.forward(ids, mask, entropy=False)
            trainer.step(batch, microbatches=2)
            runs[mode] = (model, trainer)
        best = {mode: [0.0, 0.0] for mode in invariant_modes}  # the best of the rounds, tokens/s
        for _ in range(ROUNDS):
            for mode, (model, trainer) in runs.items():
                with torch.no_grad():
                    t = time.perf_counter()
                    model.forward(ids, mask, entropy=False)
                    best[mode][0] = max(best[mode][0], tokens / (time.perf_counter() - t))
                t = time.perf_counter()
                trainer.step(batch, microbatches=2)
                best[mode][1] = max(best[mode][1], tokens / (time.perf_counter() - t))
        rates = {}
        for mode, (model, _) in runs.items():
            fwd, step = best[mode]
            rates[mode] = (fwd, step)
            model.close()
            print(f"{name:52s} invariant {mode:3s}: forward {fwd:8.0f} tokens/s, training step {step:8.0f} tokens/s")
        if len(rates) == 2:
            print(f"{name:52s} on / off: forward {rates['on'][0] / rates['off'][0]:.3f}, "
                  f"training step {rates['on'][1] / rates['off'][1]:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default="qwen3-tf5,llama-gqa,deepseek-v3-tf5,qwen3-moe-tf5,gpt-oss-tf5,qwen3-next-tf5")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--modes", default="off,on")
    ap.add_argument("--speed", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("MEGADSL_FIXTURES", FIXTURES)
    modes = args.modes.split(",")
    if args.speed:
        speed(modes)
        return
    for fixture in args.fixtures.split(","):
        for dtype in args.dtypes.split(","):
            for mode in modes:
                print(f"{fixture}, {dtype}, invariant {mode}:")
                try:
                    sweep(fixture, dtype, mode == "on")
                except Exception as e:
                    print(f"  refused: {str(e).splitlines()[-1][:200]}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))
    main()
