// Static tests of the model presets: compiling this file is passing.
//
// For every preset: its parameter count recomputed from the shape equals the published count of the
// HF checkpoint, a few layouts that must be accepted, and a few that must be rejected by exactly the
// rule named (with the values of that preset).
#include "megadsl/formulas.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/models/registry.hpp"

namespace {

using megadsl::layout;
using megadsl::parameter_count;
using megadsl::valid_layout;
using megadsl::violates;

// Rejected by `rule` and by nothing else.
template <class M, layout L>
constexpr bool violates_only(std::string_view rule) {
  const auto& v = megadsl::violations_of<M, L>;
  return v.count == 1 && v.has(rule);
}

// Published parameter counts (HF checkpoints), written out here rather than read from the
// structs, so a typo in either place fails.
static_assert(parameter_count(megadsl::llama2_7b::shape) == 6'738'415'616);
static_assert(parameter_count(megadsl::llama2_13b::shape) == 13'015'864'320);
static_assert(parameter_count(megadsl::llama2_70b::shape) == 68'976'648'192);
static_assert(parameter_count(megadsl::llama3_8b::shape) == 8'030'261'248);
static_assert(parameter_count(megadsl::llama3_70b::shape) == 70'553'706'496);
static_assert(parameter_count(megadsl::llama3_1_405b::shape) == 405'853'388'800);
static_assert(parameter_count(megadsl::llama3_2_1b::shape) == 1'235'814'400);
static_assert(parameter_count(megadsl::llama3_2_3b::shape) == 3'212'749'824);
static_assert(parameter_count(megadsl::tinyllama_1_1b::shape) == 1'100'048'384);
static_assert(parameter_count(megadsl::mistral_7b::shape) == 7'241'732'096);
static_assert(parameter_count(megadsl::qwen2_5_0_5b::shape) == 494'032'768);
static_assert(parameter_count(megadsl::qwen2_5_7b::shape) == 7'615'616'512);
static_assert(parameter_count(megadsl::qwen2_5_72b::shape) == 72'706'203'648);
static_assert(parameter_count(megadsl::qwen3_0_6b::shape) == 596'049'920);
static_assert(parameter_count(megadsl::qwen3_8b::shape) == 8'190'735'360);
static_assert(parameter_count(megadsl::gemma_2b::shape) == 2'506'172'416);
static_assert(parameter_count(megadsl::gemma_7b::shape) == 8'537'680'896);
static_assert(parameter_count(megadsl::gemma2_9b::shape) == 9'241'705'984);  // = HF index total_size / 2
static_assert(parameter_count(megadsl::olmo2_7b::shape) == 7'298'617'344);
static_assert(parameter_count(megadsl::phi3_mini::shape) == 3'821'079'552);
static_assert(parameter_count(megadsl::starcoder2_7b::shape) == 7'173'923'840);
static_assert(parameter_count(megadsl::pythia_1_4b::shape) == 1'414'647'808);  // Pythia paper, table 1
static_assert(parameter_count(megadsl::tiny_llama::shape) == 3'283'200);
static_assert(parameter_count(megadsl::tiny_qwen::shape) == 3'028'736);
static_assert(parameter_count(megadsl::tiny_llama3::shape) == 3'027'200);

// Every preset: its published parameter count equals the count summed over its composition's rows,
// and its unparallelised layout passes every rule.
static_assert([] {
  bool ok = true;
  megadsl::for_each_preset([&](auto p) {
    using P = typename decltype(p)::type;
    ok = ok && parameter_count(P::shape) == P::published_params &&
         megadsl::check(P::shape, layout{}).ok();
  });
  return ok;
}());

// Every preset's registry entry is the struct's shape.
constexpr bool every_preset_consistent() {
  bool ok = true;
  megadsl::for_each_preset([&](auto p) {
    using P = typename decltype(p)::type;
    const megadsl::preset_entry* e = megadsl::find_preset(P::name);
    ok = ok && e != nullptr && e->published_params == P::published_params &&
         e->s.hidden.get() == P::shape.hidden.get() && e->s.vocab.get() == P::shape.vocab.get() &&
         e->s.layers.get() == P::shape.layers.get();
  });
  return ok;
}
static_assert(every_preset_consistent());
static_assert(megadsl::presets.size() == megadsl::all_presets::size);
static_assert(megadsl::find_preset("llama3-8b")->s.rope_theta.get() == 500000.0);
static_assert(megadsl::find_preset("meta-llama/Meta-Llama-3-8B") == nullptr);  // names only
static_assert(megadsl::find_preset("tiny")->s.vocab.get() == 1000);
static_assert(megadsl::find_preset("llama3-9b") == nullptr);

// The preset name is the struct's, not the family's.
static_assert(megadsl::llama3_8b::name == "llama3-8b");
static_assert(megadsl::llama3_8b::family == "llama");

// Shape details that are easy to get wrong.
static_assert(megadsl::effective_head_dim(megadsl::llama3_2_1b::shape).get() == 64);
static_assert(megadsl::effective_head_dim(megadsl::llama3_2_3b::shape).get() == 128);
static_assert(megadsl::effective_head_dim(megadsl::qwen2_5_0_5b::shape).get() == 64);
static_assert(megadsl::llama3_1_405b::shape.rope.factor.get() == 8.0);
static_assert(megadsl::llama3_2_1b::shape.rope.factor.get() == 32.0);
static_assert(megadsl::llama3_2_1b::shape.tie_embeddings.get());
static_assert(megadsl::qwen2_5_0_5b::shape.qkv_bias.get() && megadsl::qwen2_5_0_5b::shape.tie_embeddings.get());
static_assert(megadsl::qwen2_5_7b::shape.qkv_bias.get() && !megadsl::qwen2_5_7b::shape.tie_embeddings.get());

// ---- Llama 2 ----
static_assert(valid_layout<megadsl::llama2_7b, layout{.tp = 8}>);
static_assert(valid_layout<megadsl::llama2_7b, layout{.tp = 4, .pp = 4, .vpp = 2, .sp = true}>);
// tp 6 breaks three rules at once (32 heads, 32 kv heads, ffn 11008); all three are reported.
static_assert(megadsl::check(megadsl::llama2_7b::shape, layout{.tp = 6}).count == 3);
static_assert(violates<megadsl::llama2_7b, layout{.tp = 6}>("heads_divisible_by_tp"));
static_assert(violates<megadsl::llama2_7b, layout{.tp = 6}>("kv_heads_fit_tp"));
static_assert(violates<megadsl::llama2_7b, layout{.tp = 6}>("ffn_divisible_by_tp"));
static_assert(!valid_layout<megadsl::llama2_7b, layout{.tp = 6}>);
static_assert(violates_only<megadsl::llama2_7b, layout{.pp = 5}>("layers_fit_stages"));

static_assert(valid_layout<megadsl::llama2_13b, layout{.tp = 8, .pp = 5}>);
static_assert(valid_layout<megadsl::llama2_13b, layout{.tp = 4, .pp = 4, .vpp = 2}>);
// 40 heads and 40 kv heads split 5 ways, but ffn 13824 = 2^9 * 27 does not.
static_assert(violates_only<megadsl::llama2_13b, layout{.tp = 5}>("ffn_divisible_by_tp"));
static_assert(violates<megadsl::llama2_13b, layout{.tp = 16}>("heads_divisible_by_tp"));
static_assert(violates_only<megadsl::llama2_13b, layout{.pp = 3}>("layers_fit_stages"));

static_assert(valid_layout<megadsl::llama2_70b, layout{.tp = 8, .pp = 8, .sp = true}>);
static_assert(valid_layout<megadsl::llama2_70b, layout{.tp = 16, .pp = 4, .vpp = 5}>);  // kv replicated
static_assert(violates_only<megadsl::llama2_70b, layout{.tp = 8, .pp = 6}>("layers_fit_stages"));
static_assert(violates_only<megadsl::llama2_70b, layout{.tp = 128}>("heads_divisible_by_tp"));

// ---- Llama 3 ----
static_assert(valid_layout<megadsl::llama3_8b, layout{.tp = 8, .pp = 4, .sp = true}>);
static_assert(valid_layout<megadsl::llama3_8b, layout{.tp = 2, .pp = 2, .vpp = 4}>);
static_assert(valid_layout<megadsl::llama3_8b, layout{.tp = 16}>);  // 8 kv heads, each on 2 ranks
static_assert(valid_layout<megadsl::llama3_8b, layout{.pp = 3, .first_stage_layers = 10, .last_stage_layers = 10}>);
static_assert(violates<megadsl::llama3_8b, layout{.tp = 3}>("heads_divisible_by_tp"));
static_assert(violates<megadsl::llama3_8b, layout{.tp = 3}>("kv_heads_fit_tp"));
static_assert(violates_only<megadsl::llama3_8b, layout{.pp = 3}>("layers_fit_stages"));
static_assert(violates_only<megadsl::llama3_8b, layout{.pp = 4, .vpp = 3}>("layers_fit_stages"));
static_assert(violates_only<megadsl::llama3_8b, layout{.sp = true}>("sp_needs_tp"));
static_assert(violates_only<megadsl::llama3_8b, layout{.vpp = 2}>("vpp_needs_pp"));
static_assert(violates_only<megadsl::llama3_8b, layout{.tp = 64}>("heads_divisible_by_tp"));

static_assert(valid_layout<megadsl::llama3_70b, layout{.tp = 8, .pp = 4, .vpp = 5, .sp = true}>);
static_assert(violates_only<megadsl::llama3_70b, layout{.tp = 8, .pp = 3}>("layers_fit_stages"));

// 126 layers: pp 7, 9, 14, 18 split evenly; pp 16 needs first/last counts (7 + 14 x 8 + 7).
static_assert(valid_layout<megadsl::llama3_1_405b, layout{.tp = 8, .pp = 9, .sp = true}>);
static_assert(valid_layout<megadsl::llama3_1_405b, layout{.tp = 8, .pp = 16, .first_stage_layers = 7, .last_stage_layers = 7}>);
static_assert(violates_only<megadsl::llama3_1_405b, layout{.tp = 8, .pp = 16}>("layers_fit_stages"));
static_assert(violates_only<megadsl::llama3_1_405b, layout{.tp = 8, .pp = 8}>("layers_fit_stages"));

static_assert(valid_layout<megadsl::llama3_2_1b, layout{.tp = 8, .pp = 4}>);
static_assert(valid_layout<megadsl::llama3_2_1b, layout{.tp = 32, .pp = 16}>);
static_assert(violates_only<megadsl::llama3_2_1b, layout{.pp = 3}>("layers_fit_stages"));

static_assert(valid_layout<megadsl::llama3_2_3b, layout{.tp = 8, .pp = 7}>);
static_assert(valid_layout<megadsl::llama3_2_3b, layout{.tp = 4, .pp = 2, .vpp = 2, .sp = true}>);
static_assert(violates_only<megadsl::llama3_2_3b, layout{.tp = 16}>("heads_divisible_by_tp"));
// 24 heads split 12 ways, but 8 kv heads neither divide nor are divided by 12.
static_assert(violates<megadsl::llama3_2_3b, layout{.tp = 12}>("kv_heads_fit_tp"));
static_assert(!violates<megadsl::llama3_2_3b, layout{.tp = 12}>("heads_divisible_by_tp"));
static_assert(violates_only<megadsl::llama3_2_3b, layout{.pp = 8}>("layers_fit_stages"));

// ---- TinyLlama: 22 layers ----
static_assert(valid_layout<megadsl::tinyllama_1_1b, layout{.tp = 8, .pp = 2}>);  // 4 kv heads on 8 ranks
static_assert(valid_layout<megadsl::tinyllama_1_1b, layout{.pp = 4, .first_stage_layers = 4, .last_stage_layers = 4}>);
static_assert(violates_only<megadsl::tinyllama_1_1b, layout{.pp = 4}>("layers_fit_stages"));
static_assert(violates_only<megadsl::tinyllama_1_1b, layout{.tp = 64}>("heads_divisible_by_tp"));

// ---- Mistral ----
static_assert(valid_layout<megadsl::mistral_7b, layout{.tp = 8, .pp = 4, .sp = true}>);
static_assert(violates<megadsl::mistral_7b, layout{.tp = 3}>("heads_divisible_by_tp"));
static_assert(violates_only<megadsl::mistral_7b, layout{.pp = 5}>("layers_fit_stages"));

// ---- Qwen2.5 ----
static_assert(valid_layout<megadsl::qwen2_5_0_5b, layout{.tp = 2, .pp = 4, .sp = true}>);
static_assert(valid_layout<megadsl::qwen2_5_0_5b, layout{.pp = 2}>);  // tied embeddings across stages
static_assert(violates_only<megadsl::qwen2_5_0_5b, layout{.tp = 4}>("heads_divisible_by_tp"));  // 14 heads
static_assert(violates_only<megadsl::qwen2_5_0_5b, layout{.tp = 14}>("ffn_divisible_by_tp"));
static_assert(violates<megadsl::qwen2_5_0_5b, layout{.tp = 7}>("kv_heads_fit_tp"));
static_assert(violates_only<megadsl::qwen2_5_0_5b, layout{.pp = 5}>("layers_fit_stages"));

static_assert(valid_layout<megadsl::qwen2_5_7b, layout{.tp = 4, .pp = 7}>);
static_assert(violates_only<megadsl::qwen2_5_7b, layout{.tp = 8}>("heads_divisible_by_tp"));  // 28 heads
static_assert(violates<megadsl::qwen2_5_7b, layout{.tp = 7}>("kv_heads_fit_tp"));

static_assert(valid_layout<megadsl::qwen2_5_72b, layout{.tp = 8, .pp = 4, .sp = true}>);
static_assert(valid_layout<megadsl::qwen2_5_72b, layout{.tp = 16, .pp = 5}>);
static_assert(violates<megadsl::qwen2_5_72b, layout{.tp = 3}>("heads_divisible_by_tp"));
static_assert(!violates<megadsl::qwen2_5_72b, layout{.tp = 3}>("ffn_divisible_by_tp"));  // 29568 = 3 x 9856

// ---- tiny test models ----
static_assert(valid_layout<megadsl::tiny_llama, layout{.tp = 4, .pp = 2, .sp = true}>);
static_assert(valid_layout<megadsl::tiny_llama, layout{.tp = 8}>);  // 2 kv heads on 8 ranks
static_assert(valid_layout<megadsl::tiny_llama, layout{.tp = 2, .pp = 2, .vpp = 2}>);
static_assert(valid_layout<megadsl::tiny_qwen, layout{.tp = 2, .pp = 4}>);
static_assert(valid_layout<megadsl::tiny_llama3, layout{.tp = 4, .pp = 2}>);
static_assert(violates_only<megadsl::tiny_llama, layout{.tp = 16}>("heads_divisible_by_tp"));
static_assert(violates_only<megadsl::tiny_llama, layout{.pp = 3}>("layers_fit_stages"));

// The model types the declarations produce.
using tiny_actor = megadsl::causal_lm<megadsl::tiny_llama, layout{.tp = 2, .pp = 2}>;
using tiny_critic = megadsl::value_model<megadsl::qwen2_5_0_5b, layout{.tp = 2, .pp = 2}>;
static_assert(tiny_actor::is_actor && tiny_critic::is_critic);

}  // namespace

// ---- Families are compositions: the architecture and its rows come from the blocks ----
namespace arch_checks {
using megadsl::find_row;
constexpr bool has(const megadsl::shape& s, std::string_view name) { return find_row(*s.arch, name) != nullptr; }
static_assert(has(megadsl::qwen3_8b::shape, "layers.{layer}.q_norm.weight") && !has(megadsl::llama3_8b::shape, "layers.{layer}.q_norm.weight"));
static_assert(megadsl::qwen3_8b::shape.arch->name.find("per_head_qk_norm(rms_norm<rms>") != std::string_view::npos);
static_assert(megadsl::gemma_7b::shape.arch->act == megadsl::activation::gelu_tanh);
static_assert(megadsl::gemma_7b::shape.arch->name.starts_with("decoder(embedding<sqrt_hidden>"));
// A (1 + w) norm's weights start at 0.
static_assert(find_row(*megadsl::gemma_7b::shape.arch, "final_norm.weight")->init == megadsl::param_init::zeros);
static_assert(find_row(*megadsl::llama3_8b::shape.arch, "final_norm.weight")->init == megadsl::param_init::ones);
static_assert(megadsl::qwen3_8b::family == "qwen3" && megadsl::gemma_7b::family == "gemma");
// Llama, Mistral and Qwen2 are one composition: one architecture object.
static_assert(megadsl::llama3_8b::shape.arch == megadsl::qwen2_5_0_5b::shape.arch);
// Gemma2: sandwich norms (four per layer), bound to HF's four names.
static_assert(find_row(*megadsl::gemma2_9b::shape.arch, "layers.{layer}.mlp_norm.weight")->hf[0] ==
              "model.layers.{layer}.pre_feedforward_layernorm.weight");
static_assert(has(megadsl::gemma2_9b::shape, "layers.{layer}.attn_post_norm.weight"));
}  // namespace arch_checks
// GPT-NeoX: query_key_value is a column split (its rows grouped per head), under NeoX's names.
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::pythia_1_4b, layout{.tp = 4}>>("layers.{layer}.qkv.weight") ==
              megadsl::mat(3 * 2048 / 4, 2048));
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::pythia_1_4b>>()["lm_head.weight"].row->hf[0] == "embed_out.weight");
static_assert(megadsl::pythia_1_4b::shape.arch->name.find("block(parallel(layer_norm") != std::string_view::npos);
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::gemma2_9b>>().count ==
              megadsl::plan_params<megadsl::causal_lm<megadsl::gemma_7b>>().count + 2);
// Qwen3's q/k norms: one head_dim vector per layer each, whole on every tp rank.
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::qwen3_8b, layout{.tp = 8}>>(
                  "layers.{layer}.q_norm.weight") == megadsl::vec(128));
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::qwen3_8b>>().count ==
              megadsl::plan_params<megadsl::causal_lm<megadsl::llama3_8b>>().count + 2);
// OLMo2: post norms instead of pre norms (same count), full-width q/k norms split over tp.
static_assert(megadsl::olmo2_7b::shape.arch->name.find("block(post_norm(") != std::string_view::npos);
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::olmo2_7b, layout{.tp = 8}>>(
                  "layers.{layer}.k_norm.weight") == megadsl::vec(4096 / 8));
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::olmo2_7b, layout{.tp = 8}>>(
                  "layers.{layer}.mlp_post_norm.weight") == megadsl::vec(4096));
struct olmo2_gqa : megadsl::olmo2<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 1024,
                                                 .vocab = 1000, .max_positions = 128}> {};
static_assert(violates<olmo2_gqa, layout{.tp = 4}>("full_width_qk_norm_needs_kv_heads_per_rank"));
static_assert(valid_layout<olmo2_gqa, layout{.tp = 2}>);
// Command R+: q/k LayerNorms with a weight per head, split over tp with the heads.
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::command_r_plus, layout{.tp = 8}>>(
                  "layers.{layer}.q_norm.weight") == megadsl::mat(96 / 8, 128));
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::command_r_plus, layout{.tp = 8}>>(
                  "layers.{layer}.k_norm.weight") == megadsl::mat(1, 128));
static_assert(valid_layout<megadsl::command_r_plus, layout{.tp = 16}>);  // the 8 kv heads' k weights replicated
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::command_r_plus, layout{.tp = 16}>>(
                  "layers.{layer}.k_norm.weight") == megadsl::mat(1, 128));
// HunYuan: q/k norms after RoPE, named query_layernorm / key_layernorm; RoPE on halves; under cp
// each rank rotates and norms its own rows before the all-to-all.
struct hunyuan_small : megadsl::hunyuan_dense<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2,
                                                             .ffn = 1024, .vocab = 1000, .max_positions = 128}> {};
static_assert(valid_layout<hunyuan_small, layout{.tp = 2}>);
static_assert(valid_layout<hunyuan_small, layout{.cp = 2}>);
struct hunyuan_pairs : megadsl::hunyuan_dense<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2,
                                                             .ffn = 1024, .vocab = 1000, .max_positions = 128,
                                                             .rope_interleave = true}> {};
static_assert(violates<hunyuan_pairs, layout{}>("qk_norm_after_rope_needs_halves"));
// HunYuan MoE: every layer's mixture plus the ungated shared MLP, both of ffn, the router under gate.wg.
struct hunyuan_moe_small : megadsl::hunyuan_moe<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 256,
                                                               .vocab = 1000, .max_positions = 128, .experts = 4, .top_k = 2,
                                                               .shared_expert_ffn = 256, .norm_topk = true}> {};
static_assert(valid_layout<hunyuan_moe_small, layout{.tp = 2, .ep = 2}>);
static_assert(parameter_count(hunyuan_moe_small::shape) ==
              2 * 1000 * 512 + 4 * (2 * 512 + 2 * 512 * 512 + 2 * 512 * 128 + 2 * 64 + 4 * 512 + 5 * 3 * 512 * 256) + 512);
// Granite: Llama's blocks, each with its multiplier, its own config key; a key no block of the
// composition declares is refused where the shape meets it.
struct granite_small : megadsl::granite<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 1024,
                                                       .vocab = 1000, .max_positions = 128,
                                                       .settings = megadsl::settings_given({{"embedding_multiplier", 12.0},
                                                                                            {"residual_multiplier", 0.22},
                                                                                            {"attention_multiplier", 0.0078125},
                                                                                            {"logits_scaling", 8.0}})}> {};
static_assert(granite_small::shape.arch == &megadsl::architecture_of<megadsl::granite_blocks>);
static_assert(megadsl::setting(granite_small::shape, "logits_scaling") == 8.0 &&
              megadsl::setting(granite_small::shape, "residual_multiplier") == 0.22);
static_assert(granite_small::shape.arch->logit_scale >= 0 && granite_small::shape.arch->logit_divides);
static_assert(granite_small::shape.arch->name.find("attention<separate, scores x attention_multiplier>") != std::string_view::npos);
static_assert(valid_layout<granite_small, layout{.tp = 2, .cp = 2}>);
static_assert(megadsl::undeclared_setting(megadsl::with_architecture(
                  megadsl::shape{.settings = megadsl::settings_given({{"logits_scaling", 2.0}})},
                  &megadsl::architecture_of<megadsl::granite_blocks>)).empty());
static_assert(megadsl::undeclared_setting(megadsl::shape{.settings = megadsl::settings_given({{"logit_scale", 2.0}}),
                                                         .arch = &megadsl::architecture_of<megadsl::granite_blocks>}) ==
              "logit_scale");
// Cohere2: one bias-free LayerNorm read by attention and MLP side by side; two kinds of layer (RoPE
// or none) by the shape's nope_layers.
struct cohere2_small : megadsl::cohere2<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 1024,
                                                       .vocab = 1000, .max_positions = 128, .tie_embeddings = true,
                                                       .rope_interleave = true, .nope_layers = 0b1000}> {};
static_assert(cohere2_small::shape.arch->name.find("parallel_shared_norm(layer_norm_no_bias") != std::string_view::npos);
static_assert(megadsl::kind_of_layer(cohere2_small::shape, 3) == 1 && megadsl::kind_of_layer(cohere2_small::shape, 2) == 0);
static_assert(valid_layout<cohere2_small, layout{.tp = 2, .pp = 2, .sp = true}>);
// (no post_attention_layernorm: the layer's one norm is input_layernorm)
static_assert(parameter_count(cohere2_small::shape) ==
              1000 * 512 + 4 * (512 + 512 * 512 * 2 + 2 * 512 * 128 + 3 * 512 * 1024) + 512);
// StarCoder2: a plain MLP (fc split over tp with its bias, proj with a bias added after the
// reduction), LayerNorm biases, an o_proj bias.
struct sc2 : megadsl::starcoder2<megadsl::shape{.hidden = 512, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 2048,
                                                .vocab = 1000, .max_positions = 128, .qkv_bias = true,
                                                .tie_embeddings = true, .out_bias = true}> {};
static_assert(megadsl::local_shape<megadsl::causal_lm<sc2, layout{.tp = 4}>>("layers.{layer}.fc.bias") == megadsl::vec(512));
static_assert(megadsl::local_shape<megadsl::causal_lm<sc2, layout{.tp = 4}>>("layers.{layer}.down.weight") ==
              megadsl::mat(512, 512));
static_assert(megadsl::local_shape<megadsl::causal_lm<sc2, layout{.tp = 4}>>("final_norm.bias") == megadsl::vec(512));
// embed + 4 x (q, k, v, o + biases, fc + bias, proj + bias, 2 LayerNorms) + final LayerNorm.
static_assert(parameter_count(sc2::shape) ==
              1000 * 512 + 4 * (512 * 512 * 2 + 2 * 512 * 128 + 512 + 2 * 128 + 512 + 2 * 512 * 2048 + 2048 + 512 + 4 * 512) +
                  2 * 512);
// Phi-3: one concatenated HF tensor per fused parameter; the per-rank shard is the same.
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::phi3_mini>>()["layers.{layer}.qkv.weight"].row->hf_count == 1);
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::phi3_mini>>()["layers.{layer}.qkv.weight"].hf_shapes[0] ==
              megadsl::mat(3 * 3072, 3072));
static_assert(megadsl::local_shape<megadsl::causal_lm<megadsl::phi3_mini, layout{.tp = 4}>>("layers.{layer}.gate_up.weight") ==
              megadsl::mat(2 * 8192 / 4, 3072));
static_assert(megadsl::plan_params<megadsl::causal_lm<megadsl::gemma_7b>>().count ==
              megadsl::plan_params<megadsl::causal_lm<megadsl::llama3_8b>>().count);
