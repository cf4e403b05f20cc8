"""The 2026 families' blocks, megadsl against transformers on the same checkpoint, batch and CPU.

    PYTHONPATH=build/python .venv/bin/python bench/family_blocks.py            # every family, 3 repeats
    PYTHONPATH=build/python .venv/bin/python bench/family_blocks.py --only deepseek_v3 --repeats 5

For each family a random checkpoint written by transformers itself (hidden 512, 4 layers, a
vocabulary of 8000; the mixtures 16 experts, top 4) in fp32: multi-head latent attention with
DeepSeek-V3's grouped sigmoid router (deepseek_v3), the sigmoid router with half-rotary attention
(glm4_moe), full-width q/k norms before a softmax mixture (olmoe), NoPE layers (smollm3),
q/k/v-biased attention (seed_oss), RoPE on interleaved pairs with biases everywhere (ernie4_5), the
GLM-4 sandwich with RoPE on pairs of half of each head (glm4), q/k norms after RoPE
(hunyuan_v1_dense) with a softmax mixture and a shared MLP (hunyuan_v1_moe), Granite's multipliers
(granite), Cohere's one LayerNorm for attention and MLP side by side (cohere; cohere2 with
three sliding layers of four and RoPE on those only), xIELU (apertus), and gpt-oss's learned
sinks with its biased experts and clamped SwiGLU (gpt_oss; transformers runs it with eager
attention, as it has no sdpa path for the sinks), Llama 4's chunked and temperature-tuned attention
with its router on the experts' input (llama4), Qwen3-Next's gated DeltaNet beside its output-gated
attention (qwen3_next; transformers' torch fallbacks of the chunked delta rule and the conv, as it
runs without flash-linear-attention and causal-conv1d), and ERNIE 4.5's biased softmax router beside
its shared experts (ernie4_5_moe). One table: tokens/s of the forward (log-probs + entropy) and of
forward + backward (a PPO-style loss), megadsl at tp 1 in this process and transformers (sdpa
attention, its default experts implementation), the median over the repeats, and the ratio. The
cases alternate repeat by repeat so that a slow phase of the machine hits both sides alike.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from side_by_side import hf_outputs, make_batch, ppo_loss  # noqa: E402

BASE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1408,
            vocab_size=8000, max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-6,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
NO_RMS = {k: v for k, v in BASE.items() if k != "rms_norm_eps"}  # (Cohere's LayerNorm: layer_norm_eps)
MOE = dict(num_experts_per_tok=4, moe_intermediate_size=256, norm_topk_prob=True)

FAMILIES = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(BASE, num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
                         qk_rope_head_dim=32, v_head_dim=64, n_routed_experts=16, n_shared_experts=1,
                         first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, **MOE)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(BASE, head_dim=64, n_routed_experts=16, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                      topk_group=1, attention_bias=True, partial_rotary_factor=0.5, **MOE)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(BASE, num_key_value_heads=8, intermediate_size=256, num_experts=16, num_experts_per_tok=4)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(BASE, no_rope_layer_interval=2)),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM",
                 dict(BASE, head_dim=64, attention_bias=True, attention_dropout=0.0, residual_dropout=0.0)),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(BASE, head_dim=64, use_bias=True)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(BASE, head_dim=64, attention_bias=True, partial_rotary_factor=0.5)),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
                         dict(BASE, head_dim=64, attention_bias=True,
                              rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0})),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
                       dict(BASE, head_dim=64, intermediate_size=256, num_experts=16, moe_topk=4)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(BASE, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                     logits_scaling=8.0)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(NO_RMS, layer_norm_eps=1e-5)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(NO_RMS, layer_norm_eps=1e-5, sliding_window=128)),
    # the xIELU MLP (plain: up, act, down; intermediate as wide as a gated MLP's gate + up) and q/k norms
    "apertus": ("ApertusConfig", "ApertusForCausalLM",
                dict(BASE, intermediate_size=2816, hidden_act="xielu", attention_bias=True,
                     rope_parameters={"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192})),
    # learned sinks (the explicit attention path), alternating windows, a biased router over experts
    # with biases and the clamped SwiGLU, stacked as transformers stores them
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(BASE, head_dim=64, intermediate_size=256, num_local_experts=16, num_experts_per_tok=4,
                     sliding_window=128,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})),
    # chunked RoPE layers (chunks of 128) with q/k L2 norms, a temperature-tuned NoPE layer, odd
    # layers routing top 1 of 16 (the expert fed x * sigmoid(logit)) beside the shared expert;
    # transformers' Llama4TextMoe runs every expert over every token, which megadsl does not
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM",
               dict(BASE, head_dim=64, intermediate_size=256, intermediate_size_mlp=1408, num_local_experts=16,
                    num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=128, floor_scale=128,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192})),
    # gated DeltaNet layers (4 key heads of 64, two value heads each, a conv of 4) with output-gated
    # attention every fourth layer (zero-centred q/k norms, RoPE on a quarter of each head); every
    # layer a softmax mixture of 16 experts, top 4, beside the shared expert behind its sigmoid gate
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(BASE, head_dim=64, num_experts=16, shared_expert_intermediate_size=512, linear_num_key_heads=4,
                        linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64, **MOE)),
    # ERNIE's router (softmax in fp32, an expert bias that selects) over 16 experts, top 4, beside a
    # shared expert; layer 0 dense; RoPE on interleaved pairs
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(BASE, head_dim=64, moe_num_experts=16, moe_k=4, moe_intermediate_size=256,
                          moe_num_shared_experts=1, moe_layer_start_index=1)),
}
# transformers' attention for each family: sdpa, but gpt-oss has none (its sinks: eager or flash only).
HF_ATTENTION = {"gpt_oss": "eager"}


def checkpoint(family, root):
    import torch
    import transformers

    path = os.path.join(root, family)
    if not os.path.exists(os.path.join(path, "config.json")):
        config_class, model_class, config = FAMILIES[family]
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
        for name, buf in model.named_buffers():  # an expert bias that matters
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0, 0.1)
        with torch.no_grad():  # (ERNIE's is a parameter, on its probabilities' scale)
            for name, p in model.named_parameters():
                if name.endswith("e_score_correction_bias"):
                    p.normal_(0, 0.05)
        model.save_pretrained(path)
    return path


def timed(step, iters):
    step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(FAMILIES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "megadsl-family-blocks"))
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    import megadsl

    torch.set_num_threads(args.threads)
    s = dict(vocab=BASE["vocab_size"])
    ids, mask = make_batch(s, args.batch, args.seq, padded=False)
    tokens = int(mask.sum())
    print(f"batch {args.batch} x {args.seq} ({tokens} tokens), fp32, {args.threads} threads, "
          f"torch {torch.__version__}; tokens/s, median of {args.repeats}")
    print(f"{'family':<12} {'pass':<14} {'megadsl':>10} {'transformers':>13} {'ratio':>7}")
    for family in args.only or list(FAMILIES):
        path = checkpoint(family, args.dir)
        ours = megadsl.Model.from_hf(path)
        theirs = AutoModelForCausalLM.from_pretrained(path, attn_implementation=HF_ATTENTION.get(family, "sdpa"),
                                                      dtype=torch.float32)

        def megadsl_step(backward):
            if not backward:
                with torch.no_grad():
                    ours.forward(ids, mask)
                return
            for p in ours.parameters().values():
                p.grad = None
            out = ours.forward(ids, mask)
            ppo_loss(out["log_probs"], out["entropy"], out["valid"]).backward()
            ours.finalize_grads()

        def hf_step(backward):
            if not backward:
                with torch.no_grad():
                    hf_outputs(theirs, ids, mask, False)
                return
            theirs.zero_grad(set_to_none=True)
            lp, ent, valid = hf_outputs(theirs, ids, mask, False)
            ppo_loss(lp, ent, valid).backward()

        for backward in (False, True):
            a, b = [], []
            for _ in range(args.repeats):
                a.append(tokens / timed(lambda: megadsl_step(backward), args.iters))
                b.append(tokens / timed(lambda: hf_step(backward), args.iters))
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{family:<12} {'fwd + bwd' if backward else 'fwd':<14} {ma:>10.0f} {mb:>13.0f} {ma / mb:>6.2f}x",
                  flush=True)
        del ours, theirs


if __name__ == "__main__":
    main()
