// LoRA's declaration and shard geometry (include/megadsl/lora.hpp): which HF modules the adapters
// wrap, as PEFT's target_modules matches them, and A / B on one tp rank from the base's split.
#include <catch2/catch.hpp>

#include <string>
#include <string_view>

#include "megadsl/lora.hpp"
#include "megadsl/models/deepseek_v3.hpp"
#include "megadsl/models/llama.hpp"
#include "megadsl/models/llama4.hpp"
#include "megadsl/models/mixtral.hpp"
#include "megadsl/models/phi3.hpp"
#include "megadsl/models/qwen3_next.hpp"
#include "megadsl/models/qwen_moe.hpp"
#include "megadsl/models/tiny.hpp"

using megadsl::dims;
using megadsl::layout;
using megadsl::lora;
using megadsl::lora_adapter;
using megadsl::mat;

namespace {

const lora_adapter* adapter_of(const megadsl::lora_adapter_list& list, std::string_view module_end) {
  for (const lora_adapter& a : list)
    if (a.module.ends_with(module_end)) return &a;
  return nullptr;
}
std::string rules_text(const megadsl::shape& s, const lora& a) {
  return std::string(megadsl::lora_rules(s, a).joined().view());
}

// tiny_llama: hidden 256, 4 layers, 8 heads of 32 over 2 kv heads, ffn 688.
constexpr megadsl::shape tiny = megadsl::tiny_llama::shape;

}  // namespace

TEST_CASE("LoRA targets match HF module names as PEFT's target_modules does", "[spec][lora]") {
  using megadsl::lora_target_matches;
  CHECK(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "q_proj"));
  CHECK(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "self_attn.q_proj"));
  CHECK(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "model.layers.{layer}.self_attn.q_proj"));
  CHECK_FALSE(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "_proj"));
  CHECK_FALSE(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "proj"));
  CHECK_FALSE(lora_target_matches("model.layers.{layer}.self_attn.q_proj", "k_proj"));
  CHECK(megadsl::lora_module_of("model.layers.{layer}.mlp.down_proj.weight") == "model.layers.{layer}.mlp.down_proj");
}

TEST_CASE("LoRA on q_proj and v_proj of a fused q/k/v row: one adapter per HF source, B split with the heads", "[spec][lora]") {
  static constexpr lora qv = lora{.rank = 8, .alpha = 16.0}.target("q_proj").target("v_proj");
  static_assert(megadsl::lora_adapters(tiny, layout{}, qv).size() == 2);  // a constant expression
  CHECK(qv.scaling() == 2.0);
  const auto one = megadsl::lora_adapters(tiny, layout{}, qv);
  const lora_adapter* q = adapter_of(one, ".q_proj");
  const lora_adapter* v = adapter_of(one, ".v_proj");
  REQUIRE((q != nullptr && v != nullptr));
  CHECK((q->row->name == "layers.{layer}.qkv.weight" && q->source == 0 && v->source == 2));
  CHECK((q->in == 256 && q->out == 256 && v->in == 256 && v->out == 64 && q->split == 0));
  CHECK((q->a_local == mat(8, 256) && q->b_local == mat(256, 8) && v->b_local == mat(64, 8)));
  // PEFT's trainable count: r (in + out) per adapter and layer.
  CHECK(megadsl::lora_parameter_count(tiny, qv) == 4 * 8 * ((256 + 256) + (256 + 64)));
  // tp 2: each rank's B has its heads' rows, A is whole.
  const auto two = megadsl::lora_adapters(tiny, layout{.tp = 2}, qv);
  CHECK((adapter_of(two, ".q_proj")->b_local == mat(128, 8) && adapter_of(two, ".q_proj")->a_local == mat(8, 256)));
  CHECK(adapter_of(two, ".v_proj")->b_local == mat(32, 8));
  // tp 4 over 2 kv heads: each rank holds its group's kv head, and so its B rows (replicated).
  CHECK(adapter_of(megadsl::lora_adapters(tiny, layout{.tp = 4}, qv), ".v_proj")->b_local == mat(32, 8));
  CHECK(megadsl::lora_rules(tiny, qv).ok());
}

TEST_CASE("LoRA on a row-parallel linear splits A with the base's input; all-linear wraps every linear of the layers",
          "[spec][lora]") {
  const lora o = lora{.rank = 4}.target("o_proj").target("down_proj");
  const auto two = megadsl::lora_adapters(tiny, layout{.tp = 2}, o);
  const lora_adapter* op = adapter_of(two, ".o_proj");
  const lora_adapter* down = adapter_of(two, ".down_proj");
  REQUIRE((op != nullptr && down != nullptr));
  CHECK((op->split == 1 && op->in == 256 && op->out == 256 && op->a_local == mat(4, 128) && op->b_local == mat(256, 4)));
  CHECK((down->in == 688 && down->out == 256 && down->a_local == mat(4, 344) && down->b_local == mat(256, 4)));
  // all-linear: q, k, v, o, gate, up, down; not the embedding, the LM head or the norms.
  const lora all = lora{.rank = 2}.target("all-linear");
  const auto every = megadsl::lora_adapters(tiny, layout{}, all);
  CHECK(every.size() == 7);
  for (const lora_adapter& a : every) CHECK(a.module.starts_with("model.layers.{layer}."));
  CHECK(megadsl::lora_parameter_count(tiny, all) ==
        4 * 2 * ((256 + 256) + 2 * (256 + 64) + (256 + 256) + 2 * (256 + 688) + (688 + 256)));
  CHECK(megadsl::lora_rules(tiny, all).ok());
  // rsLoRA scales by alpha / sqrt(r).
  CHECK(lora{.rank = 16, .alpha = 32.0, .rslora = true}.scaling() == 8.0);
}

TEST_CASE("LoRA on a row stored concatenated (Phi-3's qkv_proj) wraps it whole; MLA's whole down projections",
          "[spec][lora]") {
  const lora qkv = lora{.rank = 8}.target("qkv_proj");
  const auto phi = megadsl::lora_adapters(megadsl::phi3_mini::shape, layout{.tp = 2}, qkv);
  REQUIRE(phi.size() == 1);
  CHECK((phi.items[0].out == 3 * 3072 && phi.items[0].in == 3072 && phi.items[0].b_local == mat(3 * 3072 / 2, 8)));
  CHECK_THAT(rules_text(megadsl::phi3_mini::shape, lora{.rank = 8}.target("q_proj")),
             Catch::Contains("lora_targets_match") && Catch::Contains("\"q_proj\""));
  // DeepSeek-V3: q_a_proj (1536, 7168) and kv_a_proj_with_mqa are whole on every rank, so are their
  // adapters; q_b_proj is column-parallel.
  const lora mla = lora{.rank = 16}.target("q_a_proj").target("q_b_proj").target("kv_a_proj_with_mqa");
  const auto ds = megadsl::lora_adapters(megadsl::deepseek_v3_671b::shape, layout{.tp = 8}, mla);
  const lora_adapter* qa = adapter_of(ds, ".q_a_proj");
  const lora_adapter* qb = adapter_of(ds, ".q_b_proj");
  REQUIRE((qa != nullptr && qb != nullptr && adapter_of(ds, ".kv_a_proj_with_mqa") != nullptr));
  CHECK((qa->split == -1 && qa->a_local == mat(16, 7168) && qa->b_local == mat(1536, 16)));
  CHECK((qb->split == 0 && qb->in == 1536 && qb->out == 128 * 192 && qb->b_local == mat(128 * 192 / 8, 16)));
  // Moonlight has no q_a_proj (q_lora_rank null): the target names nothing there.
  CHECK_THAT(rules_text(megadsl::moonlight_16b_a3b::shape, lora{.rank = 16}.target("q_a_proj")),
             Catch::Contains("lora_targets_match"));
}

TEST_CASE("LoRA settings that cannot apply are refused by named rules", "[spec][lora]") {
  CHECK_THAT(rules_text(tiny, lora{.rank = 8}.target("lm_head")),
             Catch::Contains("lora_target_supported") && Catch::Contains("lm_head") && Catch::Contains("not the embedding or a head"));
  CHECK_THAT(rules_text(tiny, lora{.rank = 8}.target("input_layernorm")), Catch::Contains("a vector is no linear"));
  CHECK_THAT(rules_text(tiny, lora{.rank = 8}.target("qkv_proj")),
             Catch::Contains("lora_targets_match") && Catch::Contains("\"qkv_proj\" names no module"));
  CHECK_THAT(rules_text(tiny, lora{.rank = -1}.target("q_proj")), Catch::Contains("lora_rank_positive"));
  CHECK_THAT(rules_text(tiny, lora{.rank = 8, .alpha = 0.0}.target("q_proj")), Catch::Contains("lora_alpha_positive"));
  CHECK_THAT(rules_text(tiny, lora{.rank = 8, .dropout = 1.0}.target("q_proj")), Catch::Contains("lora_dropout_range"));
  CHECK_THAT(rules_text(tiny, lora{.rank = 8}), Catch::Contains("lora_targets_given"));
  // Qwen3-30B-A3B has no dense MLP layer: gate_proj names only its experts' (the family's dense
  // MLP row is in no layer), which take no adapters yet.
  CHECK_THAT(rules_text(megadsl::qwen3_30b_a3b::shape, lora{.rank = 8}.target("gate_proj")),
             Catch::Contains("lora_target_supported") && Catch::Contains("a mixture's experts take adapters through target_parameters"));
  CHECK(megadsl::lora_adapters(megadsl::qwen3_30b_a3b::shape, layout{}, lora{.rank = 8}.target("all-linear")).size() == 4);
  // The gated DeltaNet's causal conv is no nn.Linear (PEFT's all-linear leaves it out too).
  CHECK_THAT(rules_text(megadsl::qwen3_next_80b_a3b::shape, lora{.rank = 8}.target("conv1d")),
             Catch::Contains("lora_target_supported") && Catch::Contains("no nn.Linear"));
  CHECK(megadsl::lora_rules(tiny, lora{}).ok());  // rank 0: no adapters, nothing to check
  CHECK(megadsl::lora_adapters(tiny, layout{}, lora{}.target("q_proj")).size() == 0);
}

TEST_CASE("A mixture's experts take PEFT's target_parameters adapters, stacked, sharded as their experts",
          "[spec][lora]") {
  using megadsl::lora_parameter_matches;
  CHECK(lora_parameter_matches("model.layers.{layer}.mlp.experts", "gate_up_proj", "mlp.experts.gate_up_proj"));
  CHECK(lora_parameter_matches("model.layers.{layer}.mlp.experts", "gate_up_proj", "gate_up_proj"));
  CHECK(lora_parameter_matches("model.layers.{layer}.mlp.experts", "down_proj", "experts.down_proj"));
  CHECK_FALSE(lora_parameter_matches("model.layers.{layer}.mlp.experts", "down_proj", "mlp.experts.gate_up_proj"));
  CHECK_FALSE(lora_parameter_matches("model.layers.{layer}.mlp.experts", "down_proj", "p.experts.down_proj"));
  CHECK_FALSE(lora_parameter_matches("model.layers.{layer}.mlp.experts", "down_proj", "own_proj"));
  // Qwen3-30B-A3B: 128 experts of ffn 768 over hidden 2048; at tp 4 each expert's gate_up adapter
  // has B's rows split as its [gate; up] rows are, its down adapter A's columns.
  constexpr megadsl::shape q = megadsl::qwen3_30b_a3b::shape;
  const lora both = lora{.rank = 8}.target("q_proj").target_parameter("mlp.experts.gate_up_proj").target_parameter("mlp.experts.down_proj");
  CHECK(megadsl::lora_rules(q, both).ok());
  const auto list = megadsl::lora_adapters(q, layout{.tp = 4, .ep = 8}, both);
  REQUIRE(list.size() == 3);
  const lora_adapter& up = list.items[1];
  const lora_adapter& down = list.items[2];
  CHECK((up.module == "model.layers.{layer}.mlp.experts" && up.parameter == "gate_up_proj" && up.experts == 128));
  CHECK((up.split == 0 && up.in == 2048 && up.out == 2 * 768 && up.b_local == mat(2 * 768 / 4, 8) && up.a_local == mat(8, 2048)));
  CHECK((down.parameter == "down_proj" && down.split == 1 && down.in == 768 && down.out == 2048 &&
         down.a_local == mat(8, 768 / 4) && down.b_local == mat(2048, 8)));
  CHECK(up.stacked_rank(8) == 8 * 128);
  // PEFT wraps gate_up_proj first: the later down_proj's wrapper is around it (".base_layer").
  CHECK((up.nesting == 1 && down.nesting == 0));
  CHECK(megadsl::lora_adapters(q, layout{}, lora{.rank = 8}.target_parameter("mlp.experts.down_proj")).items[0].nesting == 0);
  // Every layer's experts: 48 layers x 128 experts x r (in + out) per projection, + q_proj.
  CHECK(megadsl::lora_parameter_count(q, both) ==
        48 * (8 * (2048 + 32 * 128) + 128 * 8 * ((2048 + 2 * 768) + (768 + 2048))));
  // Named refusals: a parameter no experts have; stacked experts; Mixtral's w1/w3/w2.
  CHECK_THAT(rules_text(q, lora{.rank = 8}.target_parameter("mlp.experts.gate_proj")),
             Catch::Contains("lora_targets_match") && Catch::Contains("names no experts parameter"));
  CHECK_THAT(rules_text(megadsl::llama4_scout::shape, lora{.rank = 8}.target_parameter("feed_forward.experts.gate_up_proj")),
             Catch::Contains("lora_target_supported") && Catch::Contains("stacked experts"));
  CHECK_THAT(rules_text(megadsl::mixtral_8x7b::shape, lora{.rank = 8}.target_parameter("experts.gate_up_proj")),
             Catch::Contains("lora_target_supported") && Catch::Contains("w1/w3/w2"));
  CHECK(megadsl::lora_rules(q, lora{.rank = 8}.target_parameter("mlp.experts.down_proj")).ok());  // no target_modules: fine
}
