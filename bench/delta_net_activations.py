"""What a gated DeltaNet layer keeps for the backward, measured against `megadsl plan`'s estimate.

    PYTHONPATH=build/python .venv/bin/python bench/delta_net_activations.py [--tokens 512] [--dtype bf16]

For each shape (hidden, key heads, value heads, dk, dv) it writes two Qwen3.5 text checkpoints made
only of DeltaNet layers (transformers, random weights; 1 and 3 layers, a SwiGLU of 64), runs one
training step of each at recompute none and selective, and counts with torch's saved-tensor hooks
the bytes the forward saves for the backward (every storage saved before the backward unpacks any).
A layer's figure is the 3-layer model's less the 1-layer model's, halved, per token. It prints
that next to `megadsl plan`'s per-layer activations (16-bit, tp 1) for the same checkpoint, and
the two modes' difference, which is the chunked rule's intermediates alone (plan's `core` term of
the block, blocks.hpp gated_delta_net::keeps): the layer's norms and MLP cancel out of it.
"""

import argparse
import os
import re
import tempfile

import torch
import transformers

import megadsl

SHAPES = [  # hidden, key heads, value heads, dk, dv
    (64, 2, 4, 16, 16), (128, 2, 4, 16, 16), (64, 4, 4, 16, 16), (64, 2, 8, 16, 16), (64, 2, 4, 32, 16),
    (64, 2, 4, 16, 32), (64, 2, 4, 64, 64), (128, 4, 8, 32, 32), (64, 2, 2, 32, 32), (128, 2, 8, 64, 32),
    (256, 4, 8, 32, 64), (256, 2, 4, 128, 128),
]


def checkpoint(path, h, hk, hv, dk, dv, layers):
    cfg = transformers.Qwen3_5TextConfig(
        hidden_size=h, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=64, vocab_size=256, layer_types=["linear_attention"] * layers, linear_num_key_heads=hk,
        linear_num_value_heads=hv, linear_key_head_dim=dk, linear_value_head_dim=dv, tie_word_embeddings=False)
    transformers.Qwen3_5ForCausalLM(cfg).save_pretrained(path)


def saved_bytes(path, mode, tokens, dtype):
    model = megadsl.Model.from_hf(path, recompute=mode, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 256, (1, tokens), generator=g)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        old = model.forward(ids, mask)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": old["valid"].float(),
             "old_log_probs": old["log_probs"], "advantages": torch.randn(ids.shape, generator=g)}
    saved, state = {}, {"backward": False}

    def pack(t):
        if not state["backward"]:
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
        return t

    def unpack(t):
        state["backward"] = True
        return t

    trainer = model.trainer(lr=0.0)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        trainer.step(batch)
    model.close()
    return sum(saved.values())


def planned(path):
    """plan's per-layer bytes per token without SP, recompute none and selective (at a long sequence,
    so that its 3 significant digits resolve the per-token figure)."""
    seq = 1 << 22
    text = megadsl.plan(str(path), seq=seq)
    out = {}
    for mode in ("none", "selective"):
        m = re.search(r"per layer, recompute " + mode + r"\b\D*([0-9.]+)\s+(?:-|[0-9.]+)\s*$", text, re.M)
        out[mode] = float(m.group(1)) * (1 << 30) / seq
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    print(f"bytes per token per DeltaNet layer, {args.tokens} tokens, {args.dtype} (plan: 16-bit activations, tp 1)")
    print(f"{'h':>5} {'nk':>3} {'nv':>3} {'dk':>4} {'dv':>4} | {'none':>8} {'plan':>8} | {'selective':>9} {'plan':>8} |"
          f" {'rule (none - sel.)':>18} {'plan':>8} {'error':>7}")
    worst = 0.0
    for h, hk, hv, dk, dv in SHAPES:
        with tempfile.TemporaryDirectory() as t:
            measured = {}
            for layers in (1, 3):
                checkpoint(os.path.join(t, str(layers)), h, hk, hv, dk, dv, layers)
            for mode in ("none", "selective"):
                measured[mode] = (saved_bytes(os.path.join(t, "3"), mode, args.tokens, args.dtype) -
                                  saved_bytes(os.path.join(t, "1"), mode, args.tokens, args.dtype)) / 2 / args.tokens
            plan = planned(os.path.join(t, "3"))
        rule, rule_plan = measured["none"] - measured["selective"], plan["none"] - plan["selective"]
        error = (rule_plan - rule) / rule
        worst = max(worst, abs(error))
        print(f"{h:>5} {hk:>3} {hv:>3} {dk:>4} {dv:>4} | {measured['none']:>8.0f} {plan['none']:>8.0f} |"
              f" {measured['selective']:>9.0f} {plan['selective']:>8.0f} | {rule:>18.0f} {rule_plan:>8.0f} {error:>+7.1%}")
    print(f"the rule's intermediates: plan within {worst:.1%} of the measurement")


if __name__ == "__main__":
    main()
