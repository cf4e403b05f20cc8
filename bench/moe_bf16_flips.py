"""How much of a mixture's bf16 log-prob error is its router's flips, for megadsl and transformers.

    PYTHONPATH=build/python .venv/bin/python bench/moe_bf16_flips.py [--only glm4-moe-tf5] [--device cpu]

For each mixture-of-experts fixture (tests/fixtures/*/ with experts in config.json), on its
reference's left-padded batch, against transformers' fp32 log-probs (max / mean |Δ| over the valid
positions):
  megadsl bf16                 bf16 compute, remove-padding, its router live
  megadsl bf16, fp32 routing   the same with the fp32 run's experts replayed (router replay): the
                               error of the arithmetic alone, without flips
  transformers bf16 sdpa/eager its causal-LM class in bf16, both attention implementations
and, where the routing can be read, how many (token, layer) pairs chose another set of experts than
in fp32. A near-tie that bf16 rounding flips moves that token's output by a whole expert, so a
handful of flips decides the max error; which side flips follows the rounding of everything before
the router (transformers' sdpa and eager differ there too).
"""

import argparse
import json
import os
import sys

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def pair_mask(mask):
    import torch

    valid = mask.bool()
    pair = torch.zeros_like(valid)
    pair[:, :-1] = valid[:, :-1] & valid[:, 1:]
    return pair


def error(lp, ref, pair):
    d = (lp.double().cpu() - ref.double()).abs()[pair]
    return d.max().item(), d.mean().item()


def flips(a, b, valid):
    """(token, layer) pairs of real tokens whose sets of experts differ; a and b (b, s, layers, k)."""
    routed = (a >= 0).any(-1)  # (b, s, layers): layers with a router
    differ = (a.sort(-1).values != b.sort(-1).values).any(-1) & routed & valid.unsqueeze(-1)
    return int(differ.sum()), int((routed & valid.unsqueeze(-1)).sum())


def hf_run(fixture, dtype, attention, ids, mask, pos, device):
    """transformers' log-probs, and the experts its routers chose ((token, k) per routed layer,
    read from any module output that holds an int64 (tokens, k) tensor), or None."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=dtype, attn_implementation=attention)
    model = model.to(device).eval()
    chosen = []

    def record(module, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.dim() == 2 and t.size(0) == ids.numel():
                chosen.append(t.detach().sort(-1).values.cpu())
                return

    hooks = [m.register_forward_hook(record) for m in model.modules() if "gate" in type(m).__name__.lower()
             or "router" in type(m).__name__.lower()]
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                       use_cache=False).logits.double()
    for h in hooks:
        h.remove()
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    lp = torch.log_softmax(logits, -1).gather(-1, nxt.to(device).unsqueeze(-1)).squeeze(-1)
    return lp, (torch.stack(chosen, 1) if chosen else None)  # (tokens, layers, k)


def main():
    import torch

    import megadsl
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.environ.get("MEGADSL_FIXTURES", "tests/fixtures"))
    ap.add_argument("--only", default=None, help="comma-separated fixture names")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    names = []
    for n in sorted(os.listdir(args.fixtures)):
        path = os.path.join(args.fixtures, n, "config.json")
        if not os.path.exists(path) or n.endswith("-vl-tf5"):
            continue
        config = json.load(open(path))
        if any(isinstance(config.get(k), int) and config[k] > 0 for k in EXPERT_KEYS):
            names.append(n)
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    print(f"{'fixture':22} {'megadsl bf16':>22} {'flips':>8} {'megadsl, fp32 routing':>22} "
          f"{'transformers sdpa':>22} {'flips':>8} {'transformers eager':>22} {'flips':>8}")
    for n in names:
        fixture = os.path.join(args.fixtures, n)
        ref = load_file(os.path.join(fixture, "reference.safetensors"))
        ids, mask, pos = ref["left.input_ids"], ref["left.attention_mask"], ref["left.position_ids"]
        lp_ref, pair, valid = ref["left.log_probs"], pair_mask(mask), mask.bool()
        m32 = megadsl.Model.from_hf(fixture, rmpad=True, device=args.device)
        m16 = megadsl.Model.from_hf(fixture, rmpad=True, dtype="bf16", device=args.device)
        o32 = m32.forward(ids, mask, record_routing=True)
        o16 = m16.forward(ids, mask, record_routing=True)
        replayed = m16.forward(ids, mask, routed_experts=o32["routed_experts"])
        r32, r16 = o32["routed_experts"].cpu(), o16["routed_experts"].cpu()
        cells = [error(o16["log_probs"], lp_ref, pair), "%d/%d" % flips(r32, r16, valid),
                 error(replayed["log_probs"], lp_ref, pair)]
        hf32 = None
        for attention in ("sdpa", "eager"):
            try:
                if hf32 is None:
                    _, hf32 = hf_run(fixture, torch.float32, attention, ids, mask, pos, args.device)
                lp, chosen = hf_run(fixture, torch.bfloat16, attention, ids, mask, pos, args.device)
                cells.append(error(lp, lp_ref, pair))
                if chosen is not None and hf32 is not None and chosen.shape == hf32.shape:
                    real = valid.reshape(-1)
                    differ = (chosen != hf32).any(-1)[real]
                    cells.append(f"{int(differ.sum())}/{differ.numel()}")
                else:
                    cells.append("-")
            except ValueError as e:  # an attention implementation the family refuses
                cells += [str(e)[:20], "-"]
        print(f"{n:22} " + " ".join(f"{c[0]:9.3e} / {c[1]:9.3e}" if isinstance(c, tuple) else f"{c:>8}"
                                     for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
