# Families are compositions of blocks: describe prints the composition, and the parameter table
# follows it (Qwen3's per-head q/k norms, whole on every tp rank; Gemma's (1 + w) norms).
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(describe qwen3-8b --tp 8)
expect_exit(0)
expect_no_err(".")
expect_out("attention  q/k/v, rope, q/k rms_norm per head  \\[self_attn\\]")
expect_out("\n  layers\\.{layer}\\.q_norm\\.weight +model\\.layers\\.{layer}\\.self_attn\\.q_norm\\.weight +replicated +\\(128\\) +\\(128\\) +replicated +\\(128\\) ")
expect_out("parameters: 8,190,735,360 ")

megadsl(describe gemma-7b --tp 4)
expect_exit(0)
expect_out("embedding  \\(\\* sqrt\\(hidden\\)\\)")
expect_out("pre_norm  rms_norm<rms_1p>  \\[input_layernorm\\]")
expect_out("gated_mlp<gelu_tanh>")
expect_out("parameters: 8,537,680,896 ")

# A Gemma checkpoint made by transformers reads as the gemma composition.
megadsl(describe ${FIXTURES}/gemma-tf5)
expect_exit(0)
expect_out("gated_mlp<gelu_tanh>")

# OLMo2: norms after the sublayers, bound to HF's post_* names; full-width q/k norms split over tp.
megadsl(describe olmo2-7b --tp 8)
expect_exit(0)
expect_out("post_norm  rms_norm<rms_wmul>  \\[post_attention_layernorm\\]")
expect_out("\n  layers\\.{layer}\\.mlp_post_norm\\.weight +model\\.layers\\.{layer}\\.post_feedforward_layernorm\\.weight +replicated ")
expect_out("\n  layers\\.{layer}\\.k_norm\\.weight +model\\.layers\\.{layer}\\.self_attn\\.k_norm\\.weight +column +\\(4096\\) +\\(4096\\) +dim 0 +\\(512\\) ")
expect_out("parameters: 7,298,617,344 ")

# Phi-3: HF's fused tensors are the source of the fused parameters, sliced per tp rank.
megadsl(describe phi3-mini --tp 4)
expect_exit(0)
expect_out("\n  layers\\.{layer}\\.qkv\\.weight +model\\.layers\\.{layer}\\.self_attn\\.qkv_proj\\.weight +fused q/k/v +\\(9216, 3072\\) +\\(9216, 3072\\) +dim 0 +\\(2304, 3072\\) ")
expect_out("parameters: 3,821,079,552 ")

# StarCoder2 (from a checkpoint transformers wrote): LayerNorms with biases, a plain MLP with biases.
megadsl(describe ${FIXTURES}/starcoder2-tf5 --tp 2)
expect_exit(0)
expect_out("pre_norm  layer_norm \\(\\+ bias\\)  \\[input_layernorm\\]")
expect_out("plain_mlp<gelu_tanh> \\+ biases  \\[mlp: c_fc, c_proj\\]")
expect_out("\n  layers\\.{layer}\\.fc\\.bias +model\\.layers\\.{layer}\\.mlp\\.c_fc\\.bias +column +\\(176\\) +\\(176\\) +dim 0 +\\(88\\) ")

# Gemma2: sandwich norms (four per layer, bound to HF's four names), the score scale and soft-caps.
megadsl(describe gemma-2-9b --tp 8)
expect_exit(0)
expect_out("sandwich  rms_norm<rms_1p>  \\[input_layernorm, post_attention_layernorm\\]")
expect_out("sandwich  rms_norm<rms_1p>  \\[pre_feedforward_layernorm, post_feedforward_layernorm\\]")
expect_out("scale query_pre_attn_scalar\\^-1/2, tanh soft-cap")
expect_out("lm head: tanh soft-cap of the logits")
expect_out("\n  layers\\.{layer}\\.mlp_norm\\.weight +model\\.layers\\.{layer}\\.pre_feedforward_layernorm\\.weight +replicated ")
expect_out("parameters: 9,241,705,984 ")
megadsl(describe ${FIXTURES}/gemma2-tf5)
expect_exit(0)
expect_out("sandwich  rms_norm<rms_1p>")

# Qwen2-MoE with dense layers among the sparse ones: two kinds of layer, the layers of each, and
# each pipeline stage's count of each kind.
megadsl(describe ${FIXTURES}/qwen2-moe-mixed-tf5 --pp 2)
expect_exit(0)
expect_out("kind 0:  block x 2 \\(layers 0, 2\\)\n")
expect_out("kind 1:  block x 2 \\(layers 1, 3\\)\n")
expect_out("\n  0      0        0      0-1     2      kind 0 x 1, kind 1 x 1 ")

# SmolLM3: two kinds of layer, the NoPE ones chosen by no_rope_layers (every fourth here).
megadsl(describe smollm3-3b --tp 2)
expect_exit(0)
expect_out("kind 1:  block x 9 \\(layers 3, 7, 11, 15, 19, 23, 27, 31, 35\\)")
expect_out("attention \\(no RoPE\\)  q/k/v, no rope  \\[self_attn\\]")
expect_out("parameters: 3,075,098,624 ")

# OLMoE read from a checkpoint transformers wrote: full-width q/k norms before a mixture in every layer.
megadsl(describe ${FIXTURES}/olmoe-tf5)
expect_exit(0)
expect_out("attention  q/k/v, rope, q/k rms_norm over the full width  \\[self_attn\\]")
expect_out("moe_mlp<silu>  router softmax -> top 2 of 4  \\[mlp: gate, experts.E.gate/up/down_proj\\]")

# Mixtral: the mixture's slots under the names the family binds (its module, its experts' w1/w3/w2),
# and HunYuan's router in fp32 at gate.wg beside its shared MLP.
megadsl(describe mixtral-8x7b --tp 2 --ep 4)
expect_exit(0)
expect_out("moe_mlp<silu>  router softmax -> top 2 of 8, renormalised  \\[block_sparse_moe: gate, experts.E.w1/w3/w2\\]")
megadsl(describe hunyuan-a13b)
expect_exit(0)
expect_out("router softmax \\(fp32\\) -> top 8 of 64, renormalised; \\+ shared gated_mlp  \\[mlp: gate.wg, experts.E.gate/up/down_proj, shared_mlp\\]")

# Seed-OSS: q/k/v biases without o_proj's.
megadsl(describe seed-oss-36b --tp 8)
expect_exit(0)
expect_out("attention  q/k/v \\+ bias, rope  \\[self_attn\\]")
expect_out("parameters: 36,151,104,512 ")

# GLM-4.5: a dense first layer, then DeepSeek-V3's grouped sigmoid router with its expert bias and
# ungated shared experts, bound to HF's names.
megadsl(describe glm-4.5-air --tp 8 --ep 8)
expect_exit(0)
expect_out("kind 1:  block x 45 ")
expect_out("router sigmoid \\+ expert bias -> top 8 of 128 in the best 1 of 1 groups, renormalised")
expect_out("\n  layers\\.{layer}\\.router\\.expert_bias +model\\.layers\\.{layer}\\.mlp\\.gate\\.e_score_correction_bias +replicated +\\(128\\) ")
expect_out("parameters: 106,852,251,264 ")

# DeepSeek-V3: multi-head latent attention, its low-rank projections bound to HF's names, the down
# projections replicated and the heads' up projections split over tp.
megadsl(describe deepseek-v3 --tp 8 --ep 32)
expect_exit(0)
expect_out("mla \\(multi-head latent attention\\)  q via rank 1536, kv via rank 512, heads \\[nope 128 \\| rope 64\\], v 128, rope on pairs")
expect_out("\n  layers\\.{layer}\\.q_up\\.weight +model\\.layers\\.{layer}\\.self_attn\\.q_b_proj\\.weight +column +\\(24576, 1536\\) +\\(24576, 1536\\) +dim 0 +\\(3072, 1536\\) ")
expect_out("\n  layers\\.{layer}\\.kv_down\\.weight +model\\.layers\\.{layer}\\.self_attn\\.kv_a_proj_with_mqa\\.weight +replicated +\\(576, 7168\\) ")
expect_out("parameters: 671,026,419,200 ")
# Moonlight: the query directly (q_lora_rank null), q_proj split over tp, no q_a_proj.
megadsl(describe moonlight-16b-a3b --tp 2)
expect_exit(0)
expect_out("mla \\(multi-head latent attention\\)  q direct, kv via rank 512, heads \\[nope 128 \\| rope 64\\], v 128, rope on pairs")
expect_out("\n  layers\\.{layer}\\.q_proj\\.weight +model\\.layers\\.{layer}\\.self_attn\\.q_proj\\.weight +column +\\(3072, 2048\\) ")
expect_no_out("q_a_proj\\.weight +replicated")
# Kimi K2: 384 experts, 64 heads; its heads split over tp 8 x cp 2 (Ulysses).
megadsl(describe kimi-k2 --tp 8 --ep 64)
expect_exit(0)
expect_out("parameters: 1,026,408,232,448 ")
megadsl(check kimi-k2 --tp 8 --cp 2 --ep 64)
expect_exit(0)

# ERNIE 4.5: the Llama blocks with RoPE on interleaved pairs.
megadsl(describe ernie-4.5-0.3b --tp 2)
expect_exit(0)
expect_out("attention  q/k/v, rope on pairs  \\[self_attn\\]")
expect_out("parameters: 360,748,032 ")
# ERNIE 4.5 MoE: its router (softmax, an expert bias that selects, stored as one row) and shared
# experts in layers 1-27; the hub's count of ERNIE-4.5-21B-A3B's tensors.
megadsl(describe ernie-4.5-21b-a3b --tp 2 --ep 8)
expect_exit(0)
expect_out("router softmax \\(fp32\\) \\+ expert bias -> top 6 of 64, unbiased scores renormalised")
expect_out("model\\.layers\\.{layer}\\.mlp\\.moe_statics\\.e_score_correction_bias +replicated +\\(1, 64\\)")
expect_out("parameters: 21,825,437,888 ")
# The fixture transformers wrote reads as that composition: layers 1-2 sparse, 0 and 3 dense.
megadsl(describe ${FIXTURES}/ernie4-5-moe-tf5 --ep 2)
expect_exit(0)
expect_out("kind 1:  block x 2 \\(layers 1, 2\\)")
expect_out("moe_mlp<silu>  router softmax \\(fp32\\) \\+ expert bias -> top 2 of 8")

# GLM-4: a sandwich of norms under GLM's names, gate/up fused, RoPE on pairs of half of each head.
megadsl(describe glm-4-9b-0414 --tp 2)
expect_exit(0)
expect_out("post_self_attn_layernorm")
expect_out("post_mlp_layernorm")
expect_out("parameters: 9,400,279,040 ")

# Granite 3.3 8B: Llama's blocks, each with its multiplier (its own config key), shown with their values.
megadsl(describe granite-3.3-8b --tp 4)
expect_exit(0)
expect_out("parameters: 8,170,864,640 ")
expect_out("embedding  \\(\\* embedding_multiplier\\)")
expect_out("output x residual_multiplier")
expect_out("attention  q/k/v, rope, scores x 0.007813")
expect_out("lm head: logits / logits_scaling \\(16\\)")
expect_out("residual_multiplier = 0.22 \\(default 1\\)")

# EXAONE 4.0 1.2B: no window, so every layer rotates.
megadsl(describe exaone-4.0-1.2b --tp 2)
expect_exit(0)
expect_out("parameters: 1,279,391,488 ")

# Apertus: xIELU's four scalars per layer, two of them HF's 0-dim buffers.
megadsl(describe ${FIXTURES}/apertus-tf5 --tp 2)
expect_exit(0)
expect_out("xielu_mlp  \\[mlp: up_proj, act_fn \\(alpha_p, alpha_n, beta, eps\\), down_proj\\]")
expect_out("attention_layernorm")
expect_out("layers\\.{layer}\\.act\\.beta +model\\.layers\\.{layer}\\.mlp\\.act_fn\\.beta +replicated +\\(\\) +\\(1\\)")
expect_out("parameters: 179,144 ")  # transformers' count: alpha_p and alpha_n are parameters, beta and eps buffers

# gpt-oss: a learned sink per query head, split with the heads; the experts' biases and clamped
# SwiGLU; HF's one tensor per layer and projection for every expert (stacked).
megadsl(describe ${FIXTURES}/gpt-oss-tf5 --tp 2)
expect_exit(0)
expect_out("attention  q/k/v \\+ bias, o \\+ bias, rope, learned sinks  \\[self_attn\\]")
expect_out("moe_mlp<clamped_swiglu>  router \\+ bias -> top 2 of 4, softmax over them")
expect_out("\n  layers\\.{layer}\\.sinks +model\\.layers\\.{layer}\\.self_attn\\.sinks +column +\\(4\\) +\\(4\\) +dim 0 +\\(2\\) ")
expect_out("\n  layers\\.{layer}\\.experts\\.{expert}\\.gate_up\\.weight +model\\.layers\\.{layer}\\.mlp\\.experts\\.gate_up_proj +fused gate/up +\\(4, 64, 96\\) stacked +\\(96, 64\\) +dim 0 +\\(48, 64\\) ")
expect_out("\n  layers\\.{layer}\\.experts\\.{expert}\\.down\\.bias +model\\.layers\\.{layer}\\.mlp\\.experts\\.down_proj_bias +replicated +\\(4, 64\\) stacked ")
expect_out("parameters: 239,968 ")
# The mixture block's own config keys, as the fixture's config.json gives them (swiglu_limit 1).
expect_out("config keys the blocks read themselves\n  swiglu_alpha = 1.702 \\(default 1.702\\): [^\n]+\n  swiglu_limit = 1 \\(default 7\\): ")

megadsl(describe gpt-oss-120b --tp 8 --ep 8)
expect_exit(0)
expect_out("gpt-oss-120b: actor \\(LM head\\); preset, openai/gpt-oss-120b")
expect_out("parameters: 116,829,156,672 ")
expect_out("published: 116,829,156,672")

# Llama 4: six kinds of layer (chunked RoPE layers with and without the q/k L2 norm, temperature-tuned
# NoPE layers, each dense or routed), the router feeding the experts' input, experts stacked under
# feed_forward.
megadsl(describe ${FIXTURES}/llama4-tf5 --tp 2)
expect_exit(0)
expect_out("attention  q/k/v \\+ bias, o \\+ bias, rope on pairs, q/k rms-normed per head \\(no weight\\), chunks of 4  \\[self_attn\\]")
expect_out("attention \\(no RoPE\\)  q/k/v \\+ bias, o \\+ bias, no rope, q temperature-tuned  \\[self_attn\\]")
expect_out("moe_mlp<silu>  router -> top 1 of 4, each expert fed x \\* sigmoid\\(logit\\); \\+ shared gated_mlp")
expect_out("gated_mlp<silu>  \\[feed_forward\\]")
expect_out("model\\.layers\\.{layer}\\.feed_forward\\.experts\\.gate_up_proj +fused gate/up +\\(4, 64, 96\\) stacked")
expect_out("parameters: 218,432 ")
megadsl(describe llama4-scout --tp 8 --ep 8)
expect_exit(0)
expect_out("parameters: 107,769,861,120 \\(108B, HF count: true vocab, tied counted once\\); published: 107,769,861,120")
megadsl(describe llama4-maverick --tp 8 --ep 64)
expect_exit(0)
expect_out("parameters: 400,711,848,960 ")

# Qwen3-Next: gated DeltaNet layers (the conv's weight shown in HF's (channels, 1, taps)) beside
# output-gated attention, four kinds of layer; the published 80B's count as transformers gives it.
megadsl(describe ${FIXTURES}/qwen3-next-tf5 --tp 2)
expect_exit(0)
expect_out("gated_delta_net \\(linear attention\\)  q/k 4 heads of 16, v 8 heads of 12, conv 4  \\[linear_attn: in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj\\]")
expect_out("attention \\(output gate\\)  q/k/v, rope on part of each head, q/k rms_norm per head, output times sigmoid\\(gate\\)")
expect_out("model\\.layers\\.{layer}\\.linear_attn\\.conv1d\\.weight +column slots +\\(224, 1, 4\\) +\\(224, 4\\) +dim 0 +\\(112, 4\\)")
expect_out("parameters: 272,952 ")
megadsl(describe qwen3-next-80b-a3b --tp 2 --ep 8)
expect_exit(0)
expect_out("parameters: 79,674,391,296 \\(79.7B, HF count: true vocab, tied counted once\\); published: 79,674,391,296")
# Its 2 kv heads over 8 ranks (k_proj / v_proj replicated), 16 key heads of the DeltaNet over 8;
# context parallelism (Ulysses) splits each tp rank's key heads further, whole ones.
megadsl(check qwen3-next-80b-a3b --tp 8 --ep 8)
expect_exit(0)
megadsl(check qwen3-next-80b-a3b --tp 4 --cp 2 --ep 8)
expect_exit(0)
megadsl(check qwen3-next-80b-a3b --tp 8 --cp 4)
expect_exit(1)
expect_err("cp_splits_heads: linear_num_key_heads = 16 is not divisible by tp x cp = 32")

# Qwen3.5: the DeltaNet's in_proj_qkv holds all q, all k, all v: each slot split over tp.
megadsl(describe ${FIXTURES}/qwen3-5-tf5 --tp 2)
expect_exit(0)
expect_out("model\\.layers\\.{layer}\\.linear_attn\\.in_proj_qkv\\.weight +column slots +\\(224, 64\\) +\\(224, 64\\) +dim 0 +\\(112, 64\\)")
expect_out("\\[linear_attn: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj\\]")
# Qwen3.5-35B-A3B's text model: transformers' count of its config; 16 key heads over tp 4 x cp 2.
megadsl(describe qwen3.5-35b-a3b --tp 4 --ep 8)
expect_exit(0)
expect_out("parameters: 34,660,610,688 \\(34.7B, HF count: true vocab, tied counted once\\); published: 34,660,610,688")
megadsl(check qwen3.5-35b-a3b --tp 4 --cp 2 --ep 8)
expect_exit(0)

# Presets whose counts equal the published checkpoints' (each checked at compile time against its
# composition): EXAONE 4.0 32B, Apertus 8B (its parameters; the xIELU buffers apart), Hunyuan-A13B,
# and the dense Qwen3.5 text models.
megadsl(describe exaone-4.0-32b --tp 8)
expect_exit(0)
expect_out("parameters: 32,003,216,384 ")
megadsl(describe apertus-8b --tp 4)
expect_exit(0)
expect_out("parameters: 8,053,338,176 ")
megadsl(describe hunyuan-a13b --tp 4 --ep 8)
expect_exit(0)
expect_out("parameters: 80,393,183,232 ")
megadsl(describe qwen3.5-9b --tp 4)
expect_exit(0)
expect_out("parameters: 8,953,803,264 ")
megadsl(describe qwen3.5-27b --tp 4)
expect_exit(0)
expect_out("parameters: 26,895,998,464 ")
# plan: the bytes a rank sends over cp (Ulysses) beside ep's.
megadsl(plan ernie-4.5-21b-a3b --tp 2 --ep 8 --cp 2 --world 16)
expect_exit(0)
expect_out("cp all-to-all per micro-batch +[0-9.]+ GB +sent per rank over cp \\(Ulysses\\)")
