// Run-time tests of formulas.hpp and plan_report: the published anchors (floating point, with
// explicit tolerances), the Korthikanti table, the shard plan's per-rank totals, and the same
// formulas on a shape resolved at run time (the `megadsl plan` path).
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "megadsl/formulas.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/plan_report.hpp"
#include "megadsl/rules.hpp"

// print_plan lives in megadsl::core, which spec_tests links.

using megadsl::layout;
using megadsl::training_flops_per_token;

namespace {

constexpr double giga = 1e9;

// Tables round to two decimals: within half a unit of the last digit.
Approx rounded(double v) { return Approx(v).margin(0.005 + 1e-12); }

}  // namespace

TEST_CASE("FLOPs per token reproduce the published cross-checks for Llama-3-8B", "[formulas][flops]") {
  // anchors-and-user-pain.md §1. Reproduced with the vocab padded for tp 1 or 2 (128256 is already
  // a multiple of 256); tp 8 pads it to 129024 and gives 51.49 instead of 51.47.
  const auto s = megadsl::llama3_8b::shape;
  const auto f4 = training_flops_per_token(s, layout{}, 4096);
  const auto f8 = training_flops_per_token(s, layout{}, 8192);
  CHECK(f4.megatron_non_causal / giga == rounded(51.47));
  CHECK(f4.megatron_causal / giga == rounded(48.25));
  CHECK(f4.torchtitan / giga == rounded(51.47));
  CHECK(f4.verl_legacy / giga == rounded(54.62));
  CHECK(f8.megatron_non_causal / giga == rounded(57.91));
  CHECK(f8.megatron_causal / giga == rounded(51.47));
  CHECK(f8.torchtitan / giga == rounded(57.91));
  CHECK(f8.verl_legacy / giga == rounded(61.06));
  // verl after PR #4959 halves the attention term.
  CHECK(f4.verl / giga == rounded(51.40));
  // "+3.15 GF/token" for counting the input embedding as a matmul: 6 V h.
  CHECK((f4.verl_legacy - f4.megatron_non_causal) / giga == Approx(3.15).margin(0.01));

  const auto f4_tp8 = training_flops_per_token(s, layout{.tp = 8}, 4096);
  CHECK(f4_tp8.megatron_non_causal / giga == rounded(51.49));
  CHECK(f4_tp8.torchtitan == f4.torchtitan);  // torchtitan does not pad

  // The causal discount at 8k: 12.5% (§1: "changes Llama-3-8B MFU at 8k by 12.5%").
  CHECK(f8.megatron_non_causal / f8.megatron_causal == Approx(1.125).epsilon(0.002));
}

TEST_CASE("FLOPs per token match the published NVIDIA throughput rows", "[formulas][flops]") {
  // NeMo 24.07 (old non-causal formula): Llama2-7B 776e12 / 16847 tok/s, Llama3-8B 697e12 / 12036.
  // Megatron-Bridge 25.11 (causal): Llama3-8B 744e12 / 14451. Published to 3 significant digits.
  const auto l2 = training_flops_per_token(megadsl::llama2_7b::shape, layout{}, 4096);
  const auto l3 = training_flops_per_token(megadsl::llama3_8b::shape, layout{}, 8192);
  CHECK(l2.megatron_non_causal / giga == rounded(46.08));
  CHECK(l2.megatron_non_causal == Approx(776e12 / 16847).epsilon(1e-3));
  CHECK(l3.megatron_non_causal == Approx(697e12 / 12036).epsilon(1e-3));
  CHECK(l3.megatron_causal == Approx(744e12 / 14451).epsilon(1e-3));
}

TEST_CASE("Megatron's floating-point formula and the exact form agree", "[formulas][flops]") {
  // 12 B s L h^2 [(1 + g/n + s/h)(n d/h) + (ffn/h) m + V'/(2 L h)] / (B s), as Megatron writes it,
  // with its gated_linear_multiplier m = 3/2 for a gated MLP (SwiGLU, GeGLU) and 1 for a plain one.
  megadsl::for_each_preset([](auto p) {
    using P = typename decltype(p)::type;
    const auto s = P::shape;
    for (const std::int64_t tp : {1, 2}) {
      const layout l{.tp = tp};
      if (!megadsl::check(s, l).ok()) continue;
      const double h = static_cast<double>(s.hidden.get()), L = static_cast<double>(s.layers.get());
      const double n = static_cast<double>(s.heads.get()), g = static_cast<double>(s.kv_heads.get());
      const double d = static_cast<double>(megadsl::effective_head_dim(s).get());
      // A mixture: Megatron's moe_ffn_hidden_size x top_k + the shared expert's, on its sparse
      // layers; the dense ones (GLM-4.5's first) ffn, as Megatron's moe_layer_freq counts them.
      const auto has = [&](std::string_view row) { return megadsl::find_row(*s.arch, row) != nullptr; };
      const double sparse = static_cast<double>(megadsl::routed_layers(s));
      const double ffn = megadsl::routes_any(s)
                             ? (sparse * static_cast<double>(megadsl::expert_ffn_of(s).get() * s.top_k.get() +
                                                             (has("layers.{layer}.shared_expert.gate_up.weight") ? s.shared_expert_ffn.get() : 0)) +
                                (static_cast<double>(s.layers.get()) - sparse) * static_cast<double>(s.ffn.get())) /
                                   static_cast<double>(s.layers.get())
                             : static_cast<double>(s.ffn.get());
      // A plain MLP's two matrices (fc / proj, or Apertus's xIELU up / down): 1; a gated one's three: 3/2.
      const double m = has("layers.{layer}.fc.weight") || has("layers.{layer}.act.alpha_p") ? 1.0 : 1.5;
      const double vp = static_cast<double>(megadsl::padded_vocab(s, l));
      for (const std::int64_t seq : {2048, 4096, 8192}) {
        const double sq = static_cast<double>(seq);
        double nc = 12 * L * h * h * ((1 + g / n + sq / h) * (n * d / h) + ffn / h * m + vp / (2 * L * h));
        double c = 12 * L * h * h * ((1 + g / n + sq / h / 2) * (n * d / h) + ffn / h * m + vp / (2 * L * h));
        if (has("layers.{layer}.conv1d.weight")) {
          // Qwen3-Next's and Qwen3.5's hybrid (the DeltaNet's projections grouped or apart, the same sizes): 6 per element of each layer's matrices (the full layers' q_proj twice
          // as wide for its gate; the DeltaNet's projections, its depthwise conv's taps and out_proj),
          // the scores on the full-attention layers only, and the delta rule's own 6 x 4 nv dv^2 per
          // token (Megatron-LM's linear_self_attn_term for experimental_attention_variant "gated_delta_net").
          double linear = 0;
          for (std::int64_t i = 0; i < s.layers.get(); ++i) linear += megadsl::linear_layer(s, i) ? 1 : 0;
          const double full = L - linear;
          // (The DeltaNet's sizes are its own config keys.)
          const double nk = megadsl::setting(s, "linear_num_key_heads"), nv = megadsl::setting(s, "linear_num_value_heads");
          const double dk = megadsl::setting(s, "linear_key_head_dim"), dv = megadsl::setting(s, "linear_value_head_dim");
          const double taps = megadsl::setting(s, "linear_conv_kernel_dim");
          const double attention = (3 * n * d + 2 * g * d) * h;
          const double deltanet = (2 * nk * dk + 2 * nv * dv) * h + 2 * nv * h + (2 * nk * dk + nv * dv) * taps + h * nv * dv +
                                  4 * nv * dv * dv;
          const double mlp_head = 12 * L * h * h * (ffn / h * m + vp / (2 * L * h));
          nc = 6 * (full * attention + linear * deltanet) + 12 * full * sq * n * d + mlp_head;
          c = 6 * (full * attention + linear * deltanet) + 6 * full * sq * n * d + mlp_head;
        }
        if (has("layers.{layer}.kv_up.weight")) {
          // Multi-head latent attention (Megatron's MLA form, the latents' norm weights left out): 6 per
          // element of q_a/q_b (or q), kv_a, kv_b and o, and q k^T over dqk and p v over dv per head.
          const double rq = megadsl::setting(s, "q_lora_rank"), rkv = megadsl::setting(s, "kv_lora_rank");
          const double dn = megadsl::setting(s, "qk_nope_head_dim"), dv = megadsl::setting(s, "v_head_dim");
          const double dqk = dn + d;
          const double q = rq > 0 ? rq * h + n * dqk * rq : n * dqk * h;
          const double weights = q + (rkv + d) * h + n * (dn + dv) * rkv + h * n * dv;
          const double mlp_head = 12 * L * h * h * (ffn / h * m + vp / (2 * L * h));
          nc = 6 * L * weights + 6 * L * sq * n * (dqk + dv) + mlp_head;
          c = 6 * L * weights + 3 * L * sq * n * (dqk + dv) + mlp_head;
        }
        const auto f = training_flops_per_token(s, l, seq);
        INFO(P::name << " tp " << tp << " seq " << seq);
        CHECK(f.megatron_non_causal == Approx(nc).epsilon(1e-12));
        CHECK(f.megatron_causal == Approx(c).epsilon(1e-12));
      }
    }
  });
}

TEST_CASE("verl's FLOPs reproduce verl's Qwen3.5 estimator for the gated DeltaNet hybrids", "[formulas][flops][verl]") {
  // verl 0.9.1's _estimate_qwen3_5_flops (dt = 1 s, times 1e12) on Qwen3-Next-80B-A3B's config
  // (every layer a mixture, 3 of 4 layers linear) and on the same sizes dense (intermediate_size
  // 5120): the full layers' q_proj counted twice as wide, the DeltaNet's projections and conv taps,
  // 15 dk dv nv per token and linear layer for the rule, the shared expert's gate.
  const std::array<std::int64_t, 3> lens{4096, 1024, 100};
  const std::array<std::int64_t, 1> one{4096};
  const auto moe = megadsl::qwen3_next_80b_a3b::shape;
  CHECK(megadsl::verl_flops(moe, lens) == Approx(128094010343424.0).epsilon(1e-13));
  CHECK(megadsl::verl_flops(moe, one) == Approx(101332505591808.0).epsilon(1e-13));
  // Qwen3.5-35B-A3B's text model (model_type qwen3_5_moe, which verl maps to this estimator).
  CHECK(megadsl::verl_flops(megadsl::qwen3_5_35b_a3b::shape, lens) == Approx(113819593605120.0).epsilon(1e-13));
  constexpr megadsl::shape dense_shape{.hidden = 2048, .layers = 48, .heads = 16, .kv_heads = 2, .ffn = 5120, .vocab = 151936,
                              .head_dim = 256, .max_positions = 262144, .rms_eps = 1e-6, .rope_theta = 10000000.0,
                              .rotary_fraction = 0.25, .linear_layers = megadsl::linear_every_but(48, 4),
                              .settings = megadsl::settings_given({{"linear_num_key_heads", 16}, {"linear_num_value_heads", 32},
                                                                   {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
                                                                   {"linear_conv_kernel_dim", 4}})};
  CHECK(megadsl::verl_flops(megadsl::qwen3_5<dense_shape>::shape, lens) == Approx(121785382600704.0).epsilon(1e-13));
}

TEST_CASE("verl's FLOPs reproduce the verl oracle for Llama-2-7B", "[formulas][flops][verl]") {
  // verl-semantics.md §6: seqlens [512, 1024, 2048] -> 149.226491215872 TFLOP, [4096] x 3 ->
  // 536.372695793664 (dt = 1 s), with the current attention coefficient 6.
  const auto s = megadsl::llama2_7b::shape;
  const std::array<std::int64_t, 3> mixed{512, 1024, 2048};
  const std::array<std::int64_t, 3> full{4096, 4096, 4096};
  CHECK(megadsl::verl_flops(s, mixed) / 1e12 == Approx(149.226491215872).epsilon(1e-15));
  CHECK(megadsl::verl_flops(s, full) / 1e12 == Approx(536.372695793664).epsilon(1e-15));
  // Before PR #4959 (coefficient 12) the same batches counted more attention.
  CHECK(megadsl::verl_flops(s, mixed, 12) > megadsl::verl_flops(s, mixed));
  // Remove-padding accounting: packing never costs more attention than one padded sequence.
  const std::array<std::int64_t, 1> packed{512 + 1024 + 2048};
  CHECK(megadsl::verl_flops(s, mixed) < megadsl::verl_flops(s, packed));
  CHECK(megadsl::megatron_flops(s, layout{}, mixed, true) < megadsl::megatron_flops(s, layout{}, packed, true));
}

TEST_CASE("activation bytes follow Korthikanti et al. Table 2", "[formulas][activations]") {
  // GPT-3 175B, the paper's own example: h 12288, a 96, s 2048, L 96, t 8, b 1; its layer is a
  // pre-norm one of LayerNorms, attention and a plain 4h MLP (StarCoder2's blocks).
  const megadsl::shape gpt3{.hidden = 12288, .layers = 96, .heads = 96, .kv_heads = 96,
                            .ffn = 4 * 12288, .vocab = 51200, .max_positions = 2048,
                            .arch = &megadsl::architecture_of<megadsl::starcoder2_blocks>};
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
  const double sbh = s * b * h;
  // The no-parallelism total is the sum of the paper's parts: attention 11sbh + 5as^2b,
  // MLP 19sbh, two layer norms 4sbh.
  const double parts = (11 * sbh + 5 * a * s * s * b) + 19 * sbh + 4 * sbh;
  CHECK(megadsl::activation_bytes_per_layer(gpt3, layout{}, 2048, 1, false) == Approx(parts).epsilon(1e-15));
  CHECK(megadsl::activation_bytes_per_layer(gpt3, layout{}, 2048, 1, false) == Approx(sbh * (34 + 5 * a * s / h)));
  // TP: 10sbh stays replicated (norm inputs, dropout masks, inputs of the first linears); 24sbh
  // and the attention core are split.
  const layout tp8{.tp = 8};
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, false) ==
        Approx(10 * sbh + (24 * sbh + 5 * a * s * s * b) / t).epsilon(1e-15));
  // TP + SP splits the replicated 10sbh too: exactly the unparallelised total / t.
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, true) ==
        Approx(parts / t).epsilon(1e-15));
  // Selective recompute drops the 5as^2b attention core; full recompute keeps the input only.
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, false, megadsl::recompute::selective) ==
        Approx(sbh * (10 + 24 / t)));
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, true, megadsl::recompute::selective) ==
        Approx(34 * sbh / t));
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, false, megadsl::recompute::full) ==
        Approx(2 * sbh));
  // For 175B at s 2048, 5as/h = 80: the attention core is 70% of the unparallelised bytes, which is
  // why selective recompute pays (the paper's argument).
  CHECK(5 * a * s / h == Approx(80));
  // Linear in the micro-batch.
  CHECK(megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 4, true) ==
        Approx(4 * megadsl::activation_bytes_per_layer(gpt3, tp8, 2048, 1, true)));
  // Whole model on the first stage with 1F1B: L/p layers x p micro-batches = L x per layer.
  const layout pipe{.tp = 8, .pp = 8, .sp = true};
  CHECK(megadsl::activation_bytes_first_stage(gpt3, pipe, 2048, 1, true) ==
        Approx(96 * megadsl::activation_bytes_per_layer(gpt3, pipe, 2048, 1, true)));
  // Interleaved, v = 2: x (1 + 7/16).
  const layout inter{.tp = 8, .pp = 8, .vpp = 2, .sp = true};
  CHECK(megadsl::activation_bytes_first_stage(gpt3, inter, 2048, 1, true) ==
        Approx((1 + 7.0 / 16) * 96 * megadsl::activation_bytes_per_layer(gpt3, pipe, 2048, 1, true)));
}

TEST_CASE("the gated DeltaNet keeps its chunked rule's intermediates, which selective recompute drops",
          "[formulas][activations]") {
  // Qwen3-Next-80B's layer 0 (a DeltaNet layer: 16 key heads, 32 value heads, dk = dv = 128,
  // h 2048) at tp 4, 4096 tokens: blocks.hpp gated_delta_net::keeps, bytes per token.
  const auto s = megadsl::qwen3_next_80b_a3b::shape;
  REQUIRE(megadsl::kind_of_layer(s, 0) != megadsl::kind_of_layer(s, 3));  // 3: full attention
  const layout tp4{.tp = 4};
  const double tokens = 4096, rule = 32 * (1040 + 16 * 128 + 9.5 * 128 + 3.5 * 128 * 128 / 64) + 16 * (522.4 + 28 * 128);
  const double none = megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, false, megadsl::recompute::none, 0);
  const double selective = megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, false, megadsl::recompute::selective, 0);
  CHECK(none - selective == Approx(tokens * rule / 4));
  // With SP the same bytes, over the tp ranks; full recompute keeps the layer's input alone.
  CHECK(megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, true, megadsl::recompute::none, 0) -
            megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, true, megadsl::recompute::selective, 0) ==
        Approx(tokens * rule / 4));
  CHECK(megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, false, megadsl::recompute::full, 0) == Approx(2 * tokens * 2048));
  // The block's other tensors (10.5 per key channel, 26.5 per value channel, its input's 2 per h)
  // stay under selective: the DeltaNet layer keeps more than the attention layer beside it.
  CHECK(selective > megadsl::activation_bytes_per_layer(s, tp4, 4096, 1, false, megadsl::recompute::selective, 3));
  // cp 2 halves every term (each rank: half the tokens before the all-to-all, half the heads after).
  const layout cp2{.tp = 4, .cp = 2};
  CHECK(megadsl::activation_bytes_per_layer(s, cp2, 4096, 1, false, megadsl::recompute::none, 0) == Approx(none / 2));
}

TEST_CASE("per-rank parameters add up to the HF count plus padding and replicas", "[formulas][memory]") {
  // An accounting independent of the shard plan: summing every (tp, pp) rank's elements gives the HF
  // count, plus padded vocab rows, plus the replicated norms, output biases (and value head) on every tp rank,
  // plus kv heads replicated when kv_heads < tp, plus a tied lm_head's copy when pp > 1.
  megadsl::for_each_preset([](auto p) {
    using P = typename decltype(p)::type;
    const auto s = P::shape;
    for (const bool actor : {true, false})
      for (const std::int64_t tp : {1, 2, 4, 8})
        for (const std::int64_t pp : {1, 2, 4}) {
          const layout l{.tp = tp, .pp = pp};
          if (!megadsl::check(s, l).ok()) continue;
          const megadsl::head_info head{actor, true};
          std::int64_t sum = 0;
          for (std::int64_t r = 0; r < pp; ++r) sum += megadsl::local_elements(s, l, head, r) * tp;
          const std::int64_t h = s.hidden, L = s.layers, v = s.vocab, kv = s.kv_heads;
          const std::int64_t d = megadsl::effective_head_dim(s), vp = megadsl::padded_vocab(s, l);
          const bool tied = s.tie_embeddings.get();
          std::int64_t expected = megadsl::parameter_count(s, head);
          const int vocab_tables = actor && !tied ? 2 : 1;
          expected += (vp - v) * h * vocab_tables;
          if (actor && tied && pp > 1) expected += vp * h;  // the last stage's copy
          const auto row = [&](std::string_view n) { return megadsl::find_row(*s.arch, n); };
          // Per-head q/k norms (full width or a weight per head: split, not replicated) on the layers whose kind has them
          // (GLM-4.5's only where use_qk_norm says; none on Qwen3-Next's DeltaNet layers).
          const auto* q_norm = row("layers.{layer}.q_norm.weight");
          std::int64_t qk_norms = 0;
          if (q_norm != nullptr && q_norm->geometry(s).split < 0)
            for (std::int64_t i = 0; i < L; ++i)
              if ((q_norm->layer_kinds >> megadsl::kind_of_layer(s, i)) & 1u) qk_norms += 2 * d;
          // Norm weights (and LayerNorm biases): two per layer, four in sandwich form, one where
          // attention and MLP read one norm side by side (Cohere's); o_proj's and a plain MLP's
          // output biases are added after the reduction, so replicated too.
          const std::int64_t per_norm = row("final_norm.bias") != nullptr ? 2 : 1;
          const bool sandwich = row("layers.{layer}.attn_norm.weight") && row("layers.{layer}.attn_post_norm.weight");
          const bool shared = row("layers.{layer}.attn_norm.weight") && !row("layers.{layer}.mlp_norm.weight");
          const std::int64_t norms = (sandwich ? 4 : shared ? 1 : 2) * per_norm;
          const bool out_bias = s.out_bias.get(), plain = row("layers.{layer}.fc.weight") != nullptr;
          const std::int64_t biases = (out_bias ? 1 : 0) + (out_bias && plain ? 1 : 0);
          // A mixture's router (experts, h), Qwen2-MoE's shared-expert gate (1, h) and DeepSeek's expert
          // bias (experts) are replicated, on its sparse layers.
          const bool moe = megadsl::routes_any(s);
          const std::int64_t routers =
              moe ? megadsl::routed_layers(s) * (h * (s.experts.get() + (row("layers.{layer}.shared_expert_gate.weight") ? 1 : 0)) +
                                                 (row("layers.{layer}.router.expert_bias") ? s.experts.get() : 0) +
                                                 (row("layers.{layer}.router.bias") ? s.experts.get() : 0))
                  : 0;
          // gpt-oss's experts' down biases (h each), added after the experts' partial sums: replicated.
          const std::int64_t expert_biases =
              row("layers.{layer}.experts.{expert}.down.bias") ? megadsl::routed_layers(s) * s.experts.get() * h : 0;
          // Multi-head latent attention's down projections and their norms are replicated.
          const bool mla = row("layers.{layer}.kv_up.weight") != nullptr;
          const auto rq = mla ? static_cast<std::int64_t>(megadsl::setting(s, "q_lora_rank")) : 0;
          const auto rkv = mla ? static_cast<std::int64_t>(megadsl::setting(s, "kv_lora_rank")) : 0;
          const std::int64_t latents = mla ? L * (rq * h + rq + (rkv + d) * h + rkv) : 0;
          // Qwen3-Next: the q/k norms on its full-attention layers only; each DeltaNet layer's gated
          // norm (dv) is replicated (its conv's channels split with the heads).
          std::int64_t attention_layers = L, deltanet = 0;
          if (row("layers.{layer}.conv1d.weight") != nullptr)
            for (std::int64_t i = 0; i < L; ++i)
              if (megadsl::linear_layer(s, i)) {
                --attention_layers;
                deltanet += static_cast<std::int64_t>(megadsl::setting(s, "linear_value_head_dim"));
              }
          const std::int64_t replicated = L * (norms + biases) * h + per_norm * h + qk_norms + routers +
                                          expert_biases + latents + deltanet + (actor ? 0 : h + 1);
          expected += replicated * (tp - 1);
          // xIELU's four scalars per layer (Apertus) on every tp rank; beta and eps, HF's buffers, are
          // not among the HF count's parameters at all.
          if (row("layers.{layer}.act.alpha_p") != nullptr) expected += L * (4 * tp - 2);
          // Fused q/k/v: kv heads replicated where fewer than tp. Qwen3-Next's gated attention keeps
          // k_proj and v_proj whole on every rank (with their biases), on its full-attention layers.
          if (kv < tp && row("layers.{layer}.qkv.weight") != nullptr) expected += L * (tp - kv) * 2 * d * (h + (s.qkv_bias.get() ? 1 : 0));
          if (row("layers.{layer}.k_proj.weight") != nullptr)
            expected += attention_layers * 2 * kv * d * (h + (s.qkv_bias.get() ? 1 : 0)) * (tp - 1);
          INFO(P::name << (actor ? " actor" : " critic") << " tp " << tp << " pp " << pp);
          CHECK(sum == expected);
        }
  });
}

TEST_CASE("bytes per parameter", "[formulas][memory]") {
  const auto s = megadsl::llama3_8b::shape;
  const layout l{.tp = 8, .pp = 4};
  const auto f = megadsl::training_memory(s, l, {}, megadsl::precision::fp32, 0);
  const auto b = megadsl::training_memory(s, l, {}, megadsl::precision::bf16_mixed, 0);
  CHECK(f.parameters == b.parameters);
  CHECK(f.total_bytes == Approx(16.0 * static_cast<double>(f.parameters)));
  CHECK(b.total_bytes == Approx(18.0 * static_cast<double>(b.parameters)));
  // Distributed optimizer over dp 8: 6 + 12/8 = 7.5 bytes per parameter.
  const auto d = megadsl::training_memory(s, l, {}, megadsl::precision::bf16_mixed, 0, 8);
  CHECK(d.total_bytes == Approx(7.5 * static_cast<double>(d.parameters)));
  // Full Adam training of an 8B model does not fit one 80 GB GPU (anchors §0: ~16 B/param).
  const auto one = megadsl::training_memory(s, layout{}, {}, megadsl::precision::bf16_mixed, 0);
  CHECK(one.total_bytes > 80e9);
}

TEST_CASE("formulas on a shape resolved at run time equal the static ones", "[formulas][dynamic]") {
  // What `megadsl plan` does: start from an all-dynamic shape, fill it from a config at run time.
  megadsl::shape s = megadsl::dynamic_shape;
  CHECK_THROWS_AS(megadsl::parameter_count(s), megadsl::unresolved_value);
  const megadsl::preset_entry* e = megadsl::find_preset("qwen2.5-7b");
  REQUIRE(e != nullptr);
  s = e->s;
  megadsl::layout l = megadsl::dynamic_layout;
  l.tp = 4;
  l.pp = 7;
  l.vpp = 1;
  l.first_stage_layers = 0;
  l.last_stage_layers = 0;
  l.sp = true;
  l.rmpad = false;
  l.vocab_pad_multiple = 128;
  l.cp = 1;
  l.ep = 1;
  REQUIRE(megadsl::check(s, l).ok());
  constexpr megadsl::layout static_l{.tp = 4, .pp = 7, .sp = true};
  constexpr auto count = megadsl::parameter_count(megadsl::qwen2_5_7b::shape);
  constexpr auto flops = training_flops_per_token(megadsl::qwen2_5_7b::shape, static_l, 4096);
  CHECK(megadsl::parameter_count(s) == count);
  CHECK(training_flops_per_token(s, l, 4096).megatron_causal == flops.megatron_causal);
  CHECK(megadsl::training_memory(s, l, {}, megadsl::precision::bf16_mixed, 6).parameters ==
        megadsl::local_elements(megadsl::qwen2_5_7b::shape, static_l, {}, 6));
}

TEST_CASE("the preset registry", "[presets]") {
  for (const auto& e : megadsl::presets) {
    INFO(e.name);
    CHECK(megadsl::find_preset(e.name) == &e);
    CHECK(megadsl::parameter_count(e.s) == e.published_params);
    CHECK(megadsl::check(e.s, megadsl::layout{}).ok());
    int same_name = 0;
    for (const auto& other : megadsl::presets) same_name += other.name == e.name ? 1 : 0;
    CHECK(same_name == 1);
  }
  for (const char* name : {"llama3-8b", "llama2-7b", "qwen2.5-0.5b", "tinyllama-1.1b", "mistral-7b",
                           "llama3.2-1b", "llama3.1-405b", "tiny"})
    CHECK(megadsl::find_preset(name) != nullptr);
  CHECK(megadsl::find_preset("Llama3-8B") == nullptr);  // exact names only
}

TEST_CASE("expert parallelism's all-to-all bytes: uniform routing, the rank's own stage's sparse layers", "[formulas][moe]") {
  using megadsl::moe_all_to_all_bytes;
  const std::int64_t tokens = 4096;  // bf16: 2 bytes; dispatch and combine, forward and backward
  const auto bytes = [&](const megadsl::shape& s, double ep, double layers) {
    return 4.0 * layers * static_cast<double>(tokens * s.top_k.get() * s.hidden.get()) * 2 * (ep - 1) / ep;
  };
  const auto qwen = megadsl::qwen3_30b_a3b::shape;  // 48 layers, every one sparse
  CHECK(moe_all_to_all_bytes(qwen, layout{}, tokens, 2) == 0);
  CHECK(moe_all_to_all_bytes(megadsl::llama3_8b::shape, layout{.ep = 8}, tokens, 2) == 0);
  CHECK(moe_all_to_all_bytes(qwen, layout{.ep = 8}, tokens, 2) == bytes(qwen, 8, 48));
  CHECK(moe_all_to_all_bytes(qwen, layout{.pp = 4, .ep = 8}, tokens, 2) == bytes(qwen, 8, 12));
  // GLM-4.5 at pp 4: 23 layers a stage, the first 3 dense, so stage 0 has 20 sparse and the others 23.
  const auto glm = megadsl::glm4_5::shape;
  CHECK(moe_all_to_all_bytes(glm, layout{.pp = 4, .ep = 8}, tokens, 2) == bytes(glm, 8, 23));
  CHECK(moe_all_to_all_bytes(glm, layout{.ep = 8}, tokens, 2) == bytes(glm, 8, 89));
}

TEST_CASE("context parallelism's all-to-all bytes: each token mixer's Ulysses traffic, by hand", "[formulas][cp]") {
  using megadsl::cp_all_to_all_bytes;
  const std::int64_t tokens = 4096;  // a rank's own, bf16 below: forward + backward = 2 x 2 bytes per element
  const auto bytes = [&](double per_token_per_layer, std::int64_t layers) { return 4.0 * per_token_per_layer * layers * tokens; };
  const auto llama = megadsl::llama3_8b::shape;  // 32 heads of 128, 8 kv heads, 32 layers
  CHECK(cp_all_to_all_bytes(llama, layout{.cp = 1}, tokens, 2) == 0);
  // tp 1, cp 2: 4 whole kv groups per cp rank; [q | k | v] (32 + 16 heads) there, the output (32) back, half of each sent.
  CHECK(cp_all_to_all_bytes(llama, layout{.cp = 2}, tokens, 2) == bytes((32 + 16 + 32) * 128 * 0.5, 32));
  // tp 8, cp 2: one kv group per tp rank splits over cp: q (4 heads) and the output by all-to-all,
  // k and v (1 head each) gathered whole (sent once to the other rank).
  CHECK(cp_all_to_all_bytes(llama, layout{.tp = 8, .cp = 2}, tokens, 2) == bytes((4 + 4) * 128 * 0.5 + 2 * 128, 32));
  // A rank sends for its own pipeline stage's layers: 16 of 32 at pp 2, 8 at pp 2 x vpp 2 (two chunks of 4).
  CHECK(cp_all_to_all_bytes(llama, layout{.pp = 2, .cp = 2}, tokens, 2) == bytes((32 + 16 + 32) * 128 * 0.5, 16));
  CHECK(cp_all_to_all_bytes(llama, layout{.pp = 4, .vpp = 2, .cp = 2}, tokens, 2) == bytes((32 + 16 + 32) * 128 * 0.5, 8));
  // DeepSeek-V3 at tp 8, cp 2: 16 heads' [q 192 | k_nope 128 | v 128] there and v back, the
  // rotary key (64) gathered; 61 layers.
  CHECK(cp_all_to_all_bytes(megadsl::deepseek_v3_671b::shape, layout{.tp = 8, .cp = 2}, tokens, 2) ==
        bytes(16 * (192 + 128 + 2 * 128) * 0.5 + 64, 61));
  // Qwen3-Next-80B at tp 4, cp 2: 36 DeltaNet layers (4 key heads' q, k of 128, their 8 value
  // heads' v of 128, b and a; the 8 heads' output back) and 12 gated-attention layers (4 query
  // heads of 256 and the output by all-to-all; the one kv head a rank holds, gathered).
  CHECK(cp_all_to_all_bytes(megadsl::qwen3_next_80b_a3b::shape, layout{.tp = 4, .cp = 2}, tokens, 2) ==
        bytes((2 * 4 * 128 + 2 * 8 * 128 + 2 * 8) * 0.5, 36) + bytes((4 + 4) * 256 * 0.5 + 2 * 256, 12));
  // plan prints it where cp > 1, for the rank's own tokens.
  const auto e = *megadsl::find_preset("llama3-8b");
  std::ostringstream out;
  megadsl::print_plan(out, e.name, e.s, layout{.tp = 8, .cp = 2}, {.seq = 8192, .world = 16});
  CHECK_THAT(out.str(), Catch::Contains("cp all-to-all per micro-batch") && Catch::Contains("0.40 GB") &&
                            Catch::Contains("its 4,096 tokens"));
}

TEST_CASE("print_plan prints the figures of formulas.hpp", "[plan]") {
  const auto e = *megadsl::find_preset("llama3-8b");
  std::ostringstream out;
  megadsl::print_plan(out, e.name, e.s, layout{.tp = 8, .pp = 4, .sp = true}, {.seq = 4096, .world = 64});
  const std::string text = out.str();
  CHECK(text.find("8,030,261,248") != std::string::npos);   // parameter count
  CHECK(text.find("129,024") != std::string::npos);         // padded vocab
  CHECK(text.find("284,229,632") != std::string::npos);     // first-stage parameters per rank
  CHECK(text.find("51.49") != std::string::npos);           // Megatron non-causal at tp 8
  CHECK(text.find("48.27") != std::string::npos);           // causal
  CHECK(text.find("54.62") != std::string::npos);           // verl before #4959
  CHECK(text.find("dp 2") != std::string::npos);
  CHECK(text.find("Korthikanti") != std::string::npos);

  std::ostringstream critic;
  megadsl::print_plan(critic, "tiny", megadsl::tiny_llama::shape, layout{.tp = 2, .pp = 2},
                      {.seq = 128, .actor = false});
  CHECK(critic.str().find("3,027,457") != std::string::npos);  // 3,283,200 - 256,000 + 257

  // Fewer micro-batches than stages: only those are in flight on the first stage.
  std::ostringstream few;
  megadsl::print_plan(few, e.name, e.s, layout{.tp = 8, .pp = 4, .sp = true}, {.microbatches = 2});
  CHECK(few.str().find("8 layers x 2 micro-batches") != std::string::npos);

  // An invalid layout or world throws the rule's words and prints nothing.
  std::ostringstream bad;
  CHECK_THROWS_WITH(megadsl::print_plan(bad, e.name, e.s, layout{.tp = 3}, {}),
                    Catch::Contains("heads_divisible_by_tp"));
  CHECK_THROWS_WITH(megadsl::print_plan(bad, e.name, e.s, layout{.tp = 8}, {.world = 12}),
                    Catch::Contains("world_fits_layout"));
  CHECK_THROWS_WITH(megadsl::print_plan(bad, e.name, e.s, layout{.pp = 4, .vpp = 2}, {.microbatches = 6}),
                    Catch::Contains("interleaved_microbatches"));
  CHECK(bad.str().empty());
}

TEST_CASE("the LM head's extra peak in training: whole up to 2^28 logits a micro-batch, chunks of 2^25 beyond", "[formulas][head]") {
  using megadsl::lm_head_peak_bytes;
  using megadsl::lm_head_training_chunk;
  // Qwen's 151,936 vocabulary at tp 1: 1,766 tokens fit in 2^28 logits; beyond, chunks of 220.
  CHECK(lm_head_training_chunk(1766, 151936, 0) == 0);
  CHECK(lm_head_training_chunk(1767, 151936, 0) == 220);
  CHECK(lm_head_training_chunk(1767, 151936, -1) == 0);  // asked whole
  CHECK(lm_head_training_chunk(100, 151936, 16) == 16);  // asked a chunk
  // 16-bit logits through the fused CUDA kernels hold 4 bytes a logit, not 12: the same bytes hold
  // 3x the logits, whole and in chunks. The GPU benchmark's batch (20,480 tokens of Llama-3.2's
  // 128,256) goes in 27 chunks of 784 rows, where fp32 took 79 of 261.
  using megadsl::lm_head_fused_logit_bytes;
  CHECK(lm_head_training_chunk(20480, 128256, 0) == 261);
  CHECK(lm_head_training_chunk(20480, 128256, 0, lm_head_fused_logit_bytes) == 784);
  CHECK(lm_head_training_chunk(5300, 151936, 0, lm_head_fused_logit_bytes) == 0);  // 3x the logits fit whole
  CHECK(lm_head_training_chunk(5301, 151936, 0, lm_head_fused_logit_bytes) == 662);
  // Three fp32 buffers of the rows (logits, softmax, gradient): 64k tokens whole would be 111 GiB
  // of them, chunked 0.37 GiB (bench_lm_head_memory measured 0.375).
  CHECK(lm_head_peak_bytes(65536, 151936) == 3.0 * 4 * 220 * 151936);
  CHECK(lm_head_peak_bytes(65536, 151936, -1) == 3.0 * 4 * 65536 * 151936);
  CHECK(lm_head_peak_bytes(10, 151936, 16) == 3.0 * 4 * 10 * 151936);  // a chunk longer than the micro-batch
  // plan prints it for the rank's tokens: Qwen2.5-7B at tp 4, one 65,536-token sequence.
  const auto e = *megadsl::find_preset("qwen2.5-7b");
  std::ostringstream out;
  megadsl::print_plan(out, e.name, e.s, layout{.tp = 4}, {.seq = 65536, .world = 4});
  CHECK_THAT(out.str(), Catch::Contains("LM head in training") && Catch::Contains("in chunks of 882 tokens") &&
                            Catch::Contains("its 65,536 tokens x 38,016 vocab per tp rank"));
}

TEST_CASE("ring context parallelism: its traffic by hand, the rules that differ from Ulysses'", "[formulas][cp][ring]") {
  using megadsl::cp_comm_kind;
  using megadsl::cp_ring_bytes;
  constexpr auto ring = cp_comm_kind::ring;
  const std::int64_t tokens = 4096;
  const auto llama = megadsl::llama3_8b::shape;  // 8 kv heads of 128, 32 layers
  CHECK(cp_ring_bytes(llama, layout{.cp = 2}, tokens, 2) == 0);  // Ulysses: no ring
  CHECK(megadsl::cp_all_to_all_bytes(llama, layout{.cp = 2, .cp_comm = ring}, tokens, 2) == 0);
  // tp 8, cp 4: one kv head per tp rank; k/v (2 x 4096 x 128 bf16) and the ids (2 x 4096 int64)
  // 3 times forward; k/v, ids and dk/dv (fp32) 4 times backward.
  const double kv = 2.0 * tokens * 128 * 2, ids = 2.0 * tokens * 8, grads = 2.0 * tokens * 128 * 4;
  CHECK(cp_ring_bytes(llama, layout{.tp = 8, .cp = 4, .cp_comm = ring}, tokens, 2) == 32 * (3 * (kv + ids) + 4 * (kv + ids + grads)));
  // MLA passes every head of its tp rank, k at nope + rope (192) and v at 128: 16 heads at tp 8.
  const auto ds = megadsl::find_preset("deepseek-v3")->s;
  const double mla_kv = tokens * 16.0 * (192 + 128) * 2, mla_grads = tokens * 16.0 * (192 + 128) * 4;  // bf16, fp32
  CHECK(cp_ring_bytes(ds, layout{.tp = 8, .cp = 4, .cp_comm = ring}, tokens, 2) ==
        Approx(61 * (3 * (mla_kv + ids) + 4 * (mla_kv + ids + mla_grads))));
  // Hierarchical (a2a+ring), cp 4 as all-to-all pairs around a ring of 2: Ulysses' traffic over a
  // pair (8 kv groups go whole: [q | k | v] of 32 + 16 heads there and the output back, half of each
  // leaving the rank), and the ring's blocks of a pair's rows (2 x 4096) of half its kv heads (4 of
  // 8), once forward and twice backward.
  const layout pairs{.cp = 4, .cp_comm = cp_comm_kind::a2a_ring, .cp_a2a = 2};
  CHECK(megadsl::cp_all_to_all_bytes(llama, pairs, tokens, 2) == 2.0 * 32 * tokens * 2 * (2 * 32 + 2 * 8) * 128 * 0.5);
  const double pair_kv = 2.0 * tokens * 4 * 2 * 128 * 2, pair_ids = 2.0 * 2 * tokens * 8;
  const double pair_grads = 2.0 * tokens * 4 * 2 * 128 * 4;
  CHECK(cp_ring_bytes(llama, pairs, tokens, 2) == 32 * ((pair_kv + pair_ids) + 2 * (pair_kv + pair_ids + pair_grads)));
  // The head rule counts the all-to-all group only: tp 8 leaves 4 query heads of one group a rank,
  // which split over cp_a2a 4 (cp 8) and not over 8 (cp 16).
  CHECK(megadsl::check(llama, layout{.tp = 8, .cp = 8, .cp_comm = cp_comm_kind::a2a_ring, .cp_a2a = 4}).ok());
  CHECK(megadsl::check(llama, layout{.tp = 8, .cp = 16, .cp_comm = cp_comm_kind::a2a_ring, .cp_a2a = 8}).has("cp_splits_heads"));
  // Qwen2.5-7B at tp 4: 7 query heads a rank do not split over cp 2 (Ulysses) and run under the ring.
  const auto qwen = megadsl::find_preset("qwen2.5-7b")->s;
  CHECK(megadsl::check(qwen, layout{.tp = 4, .cp = 2}).has("cp_splits_heads"));
  CHECK(megadsl::check(qwen, layout{.tp = 4, .cp = 2, .cp_comm = ring}).ok());
  // Blocks that cannot ring say so, by rule: the gated DeltaNet (its recurrent state).
  CHECK(megadsl::check(megadsl::find_preset("qwen3-next-80b-a3b")->s, layout{.cp = 2, .cp_comm = ring}).has("cp_ring_supported"));
  CHECK_FALSE(megadsl::check(megadsl::find_preset("qwen3-next-80b-a3b")->s, layout{.cp = 2}).has("cp_ring_supported"));
  // MLA (v narrower than q and k), learned sinks and Llama 4's chunks ring.
  for (const char* name : {"deepseek-v3", "gpt-oss-20b", "llama4-scout"}) {
    INFO(name);
    CHECK(megadsl::check(megadsl::find_preset(name)->s, layout{.cp = 2, .cp_comm = ring}).ok());
  }
  const auto e = *megadsl::find_preset("llama3-8b");
  std::ostringstream out;
  megadsl::print_plan(out, e.name, e.s, layout{.tp = 8, .cp = 4, .cp_comm = ring}, {.seq = 16384, .world = 32});
  CHECK_THAT(out.str(), Catch::Contains("cp ring per micro-batch") && Catch::Contains("its 4,096 tokens"));
  CHECK_THAT(out.str(), !Catch::Contains("cp all-to-all"));
}

TEST_CASE("megadsl's own activation peak: the layers without scores, the LM head, the ring's tiles",
          "[formulas][activations][ring]") {
  using megadsl::activation_peak_bytes;
  constexpr auto ring = megadsl::cp_comm_kind::ring;
  const auto s = megadsl::llama3_8b::shape;  // h 4096, ffn 14336, 32 heads, vocab 128256
  const double seq = 8192, h = 4096;
  // Per layer in 16-bit bytes per token and h: norms 2 + 2, attention 3 + 8 (no scores: the fused
  // core keeps its log-sum-exp), the gated MLP 3 + 8 x 14336 / 4096 = 31: 46 x element / 2.
  const double layers = 32 * 46 * seq * h;
  // The LM head: 8192 x 128256 logits pass 2^28, so chunks of 2^25 / 128256 = 261 rows, three fp32 buffers.
  const double head_rows = 261;
  CHECK(activation_peak_bytes(s, layout{}, 8192, 1, false, 2) == Approx(layers + 2 * 2 * seq * h + 3.0 * 4.0 * head_rows * 128256));
  // fp32 doubles the layers and the norm; the head's chunk is fp32 either way.
  CHECK(activation_peak_bytes(s, layout{}, 8192, 1, false, 4) == Approx(2 * layers + 2 * 4 * seq * h + 3.0 * 4.0 * head_rows * 128256));
  // A critic has no LM head; pp 2's first stage holds half the layers x 2 micro-batches, no head.
  CHECK(activation_peak_bytes(s, layout{}, 8192, 1, false, 2, 0, false) == Approx(layers + 2 * 2 * seq * h));
  CHECK(activation_peak_bytes(s, layout{.pp = 2}, 8192, 1, false, 2) == Approx(layers));
  // Under cp every term is per rank: 1/cp of the tokens (Ulysses). The ring's tiles (two fp32
  // buffers of ring_tile_scores: 32 heads x 2048 x 2048 is more) come at another moment than the
  // LM head's extra: the larger counts, here the head's; a critic has only the tiles.
  const double per_rank4 = layers / 4 + 2 * 2 * seq / 4 * h;
  const double head4 = 3.0 * 4.0 * 2048 * 128256;  // 2048 x 128256 logits are under 2^28: whole
  const double tiles = 2.0 * 4.0 * static_cast<double>(megadsl::ring_tile_scores);
  CHECK(activation_peak_bytes(s, layout{.cp = 4}, 8192, 1, false, 2) == Approx(per_rank4 + head4));
  CHECK(activation_peak_bytes(s, layout{.cp = 4, .cp_comm = ring}, 8192, 1, false, 2) == Approx(per_rank4 + head4));
  CHECK(activation_peak_bytes(s, layout{.cp = 4, .cp_comm = ring}, 8192, 1, false, 2, 0, false) == Approx(per_rank4 + tiles));
  // A tile is at least 16 rows (formulas.hpp ring_tile_rows): 32 heads x 16 x 65536 keys at 262144
  // tokens over cp 4, more than ring_tile_scores.
  CHECK(megadsl::ring_tile_rows(32, 65536, 65536) == 16);
  CHECK(megadsl::ring_tile_rows(32, 2048, 2048) == 128);
  CHECK(activation_peak_bytes(s, layout{.cp = 4, .cp_comm = ring}, 262144, 1, false, 2, 0, false) ==
        Approx(per_rank4 * 32 + 2.0 * 4.0 * 32 * 16 * 65536));
  // Fewer scores than a tile: the whole (heads, Tq, Tk), 32 x 256 x 256 at 1024 tokens over cp 4.
  CHECK(activation_peak_bytes(s, layout{.cp = 4, .cp_comm = ring}, 1024, 1, false, 2, 0, false) ==
        Approx(per_rank4 / 8 + 2.0 * 4.0 * 32 * 256 * 256));
  // Full recompute keeps each layer's input (2 sbh / element 2).
  CHECK(activation_peak_bytes(s, layout{.recompute = megadsl::recompute_kind::full}, 8192, 1, false, 2, 0, false) ==
        Approx(32 * 2 * seq * h + 2 * 2 * seq * h));
  // A soft-capped attention (Gemma2-9B: 42 layers, 16 heads, h 3584) runs the explicit core: its
  // fp32 tanh and probabilities, 8 bytes a score, on top of the paper's terms without scores.
  const auto g2 = megadsl::gemma2_9b::shape;
  const double g_seq = 4096, g_scores = 42 * 8.0 * 16 * g_seq * g_seq;
  const double g_layers = megadsl::activation_bytes_first_stage(g2, layout{}, 4096, 1, false) - 42 * 5.0 * 16 * g_seq * g_seq;
  CHECK(activation_peak_bytes(g2, layout{}, 4096, 1, false, 2, 0, false) == Approx(g_layers + 2 * 2 * g_seq * 3584 + g_scores));
  // Under Ulysses cp 2 each rank holds half the heads' scores over the whole sequence; the ring none.
  CHECK(activation_peak_bytes(g2, layout{.cp = 2}, 4096, 1, false, 2, 0, false) ==
        Approx(g_layers / 2 + 2 * 2 * g_seq / 2 * 3584 + g_scores / 2));
  CHECK(activation_peak_bytes(g2, layout{.cp = 2, .cp_comm = ring}, 4096, 1, false, 2, 0, false) <
        g_layers / 2 + 2 * 2 * g_seq / 2 * 3584 + g_scores / 8);
  // The paper's row keeps the scores on top: 5as/h = 5 x 32 x 8192 / 4096 = 320 per layer.
  CHECK(megadsl::activation_bytes_first_stage(s, layout{}, 8192, 1, false) == Approx(layers + 32 * 320 * seq * h));
}
