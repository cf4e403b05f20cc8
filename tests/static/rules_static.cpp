// Static tests of the validation rules (rules.hpp, model.hpp): compiling this file is passing.
//
// In-language negative tests: `valid_layout<M, L>` and `violates<M, L>("rule")` ask the checker
// without failing the build, so every rule that can be decided from the type is probed here, by
// name, next to layouts that must be accepted. Rules whose inputs are dynamic are skipped at
// compile time (and checked at run time with the same words, see tests/unit/spec_rules.cpp).
#include <string_view>

#include "megadsl/model.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/rules.hpp"

namespace {

using megadsl::dynamic;
using megadsl::layout;
using megadsl::rope_type;
using megadsl::run_facts;
using megadsl::shape;
using megadsl::valid_layout;
using megadsl::violates;
using megadsl::llama3_8b;

template <class M, layout L>
inline constexpr megadsl::violations found = megadsl::check(M::shape, L);
// The first (or only) message, as the compiler and require_valid show it.
template <class M, layout L>
constexpr std::string_view first_message() {
  return found<M, L>.items[0].message.view();
}
template <class M, layout L>
constexpr int violation_count() {
  return found<M, L>.count;
}

// A small GQA model whose sizes isolate one rule at a time.
constexpr shape small{.hidden = 1024, .layers = 12, .heads = 16, .kv_heads = 4, .ffn = 2816,
                      .vocab = 32000, .max_positions = 4096};
struct small_model : megadsl::llama<small> {};

// ---- accepted ----
static_assert(valid_layout<llama3_8b, layout{}>);
static_assert(valid_layout<llama3_8b, layout{.tp = 8, .pp = 4, .sp = true}>);
static_assert(valid_layout<llama3_8b, layout{.tp = 4, .pp = 2, .vpp = 2, .sp = true, .rmpad = true}>);
static_assert(valid_layout<llama3_8b, layout{.tp = 16}>);  // kv heads replicated: 8 divides 16
static_assert(valid_layout<llama3_8b, layout{.pp = 3, .first_stage_layers = 10, .last_stage_layers = 10}>);
static_assert(valid_layout<llama3_8b, layout{.pp = 4, .first_stage_layers = 7, .last_stage_layers = 7}>);
static_assert(valid_layout<small_model, layout{.tp = 2, .pp = 3, .vpp = 2}>);
// Declaring the types compiles (the static_assert inside invalid_layout holds).
using actor = megadsl::causal_lm<llama3_8b, layout{.tp = 8, .pp = 4, .sp = true}>;
using critic = megadsl::value_model<llama3_8b, layout{.tp = 8, .pp = 4, .sp = true}, megadsl::value_head{.bias = false}>;
static_assert(actor::is_actor && critic::is_critic && !critic::head.bias);

// ---- each rule, by name, with its message ----
static_assert(violates<llama3_8b, layout{.tp = 3}>("heads_divisible_by_tp"));
static_assert(first_message<llama3_8b, layout{.tp = 3}>() ==
              "heads_divisible_by_tp: num_heads = 32 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32");
static_assert(!valid_layout<llama3_8b, layout{.tp = 3}>);

// kv_heads 4 with tp 8: 16 heads split, 4 divides 8 -> replicated, fine; tp 16 over 4 kv heads fine;
// a 6-kv-head model at tp 4 is neither.
struct kv6 : megadsl::llama<shape{.hidden = 3072, .layers = 12, .heads = 24, .kv_heads = 6,
                                  .ffn = 8192, .vocab = 32000, .max_positions = 4096}> {};
static_assert(valid_layout<small_model, layout{.tp = 8}>);
static_assert(violates<kv6, layout{.tp = 4}>("kv_heads_fit_tp"));
static_assert(violation_count<kv6, layout{.tp = 4}>() == 1);
static_assert(first_message<kv6, layout{.tp = 4}>() ==
              "kv_heads_fit_tp: num_key_value_heads = 6 is neither a multiple nor a divisor of tp = 4; "
              "valid tp: 1, 2, 3, 6, 12, 24");

struct odd_ffn : megadsl::llama<shape{.hidden = 1024, .layers = 12, .heads = 16, .kv_heads = 4,
                                      .ffn = 1000, .vocab = 32000, .max_positions = 4096}> {};
static_assert(violates<odd_ffn, layout{.tp = 16}>("ffn_divisible_by_tp"));
static_assert(violation_count<odd_ffn, layout{.tp = 16}>() == 1);
static_assert(first_message<odd_ffn, layout{.tp = 16}>() ==
              "ffn_divisible_by_tp: ffn = 1000 is not divisible by tp = 16; valid tp: 1, 2, 4, 8");

static_assert(violates<llama3_8b, layout{.sp = true}>("sp_needs_tp"));
static_assert(violation_count<llama3_8b, layout{.sp = true}>() == 1);
static_assert(violates<llama3_8b, layout{.vpp = 2}>("vpp_needs_pp"));

static_assert(violates<llama3_8b, layout{.pp = 3}>("layers_fit_stages"));
static_assert(first_message<llama3_8b, layout{.pp = 3}>() ==
              "layers_fit_stages: num_layers = 32 is not divisible by pp * vpp = 3 * 1 = 3; valid pp: 1, 2, "
              "4, 8, 16, 32; or give first_stage_layers / last_stage_layers");
static_assert(violates<llama3_8b, layout{.pp = 4, .vpp = 3}>("layers_fit_stages"));
static_assert(violates<llama3_8b, layout{.pp = 4, .first_stage_layers = 10, .last_stage_layers = 11}>(
    "layers_fit_stages"));
// Explicit counts whose per-rank layers do not split over the vpp chunks.
static_assert(violates<llama3_8b, layout{.pp = 2, .vpp = 2, .first_stage_layers = 15, .last_stage_layers = 17}>(
    "layers_fit_stages"));
static_assert(violates<llama3_8b, layout{.first_stage_layers = 4}>("stage_counts_need_pp"));

// Context parallelism gives each cp rank whole kv groups of its tp rank, or a share of one group.
static_assert(valid_layout<llama3_8b, layout{.tp = 2, .sp = true, .cp = 4}>);
static_assert(valid_layout<llama3_8b, layout{.rmpad = true, .cp = 8}>);
static_assert(valid_layout<megadsl::llama3_70b, layout{.tp = 8, .sp = true, .cp = 4}>);  // 8 query heads, one kv head per tp rank
static_assert(first_message<llama3_8b, layout{.tp = 8, .cp = 8}>() ==
              "cp_splits_heads: a tp rank's 4 query heads in 1 kv group(s) (heads 32, kv heads 8, tp 8) do not split "
              "into cp = 8 equal shares of whole groups or of one group; valid cp: 1, 2, 4; or cp_comm ring (k/v around "
              "a ring: any head count)");
static_assert(violates<megadsl::qwen2_5_7b, layout{.tp = 2, .cp = 4}>("cp_splits_heads"));  // 14 query heads, 2 groups
// The ring keeps every head on every cp rank: no head rule.
static_assert(valid_layout<megadsl::qwen2_5_7b, layout{.tp = 2, .cp = 4, .cp_comm = megadsl::cp_comm_kind::ring}>);
static_assert(valid_layout<llama3_8b, layout{.tp = 8, .cp = 8, .cp_comm = megadsl::cp_comm_kind::ring}>);
// Hierarchical cp (a2a+ring): the head rule over the all-to-all groups' cp_a2a ranks only.
constexpr auto a2a_ring = megadsl::cp_comm_kind::a2a_ring;
static_assert(valid_layout<llama3_8b, layout{.tp = 8, .cp = 8, .cp_comm = a2a_ring, .cp_a2a = 4}>);
static_assert(valid_layout<megadsl::qwen2_5_7b, layout{.tp = 2, .cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2}>);  // 14 heads, 2 groups
static_assert(first_message<llama3_8b, layout{.tp = 8, .cp = 16, .cp_comm = a2a_ring, .cp_a2a = 8}>() ==
              "cp_splits_heads: a tp rank's 4 query heads in 1 kv group(s) (heads 32, kv heads 8, tp 8) do not split "
              "into cp_a2a = 8 equal shares of whole groups or of one group; valid cp_a2a: 2, 4; or cp_comm ring (k/v "
              "around a ring: any head count)");
static_assert(first_message<llama3_8b, layout{.cp = 8, .cp_comm = a2a_ring, .cp_a2a = 3}>() ==
              "cp_a2a_fits: cp_comm a2a+ring with cp = 8 and cp_a2a = 3: cp_a2a (the all-to-all groups' size) must lie "
              "strictly between 1 and cp and divide it; valid cp_a2a: 2, 4; or cp_comm a2a (all heads) or ring (no "
              "all-to-all)");
static_assert(violates<llama3_8b, layout{.cp = 2, .cp_comm = a2a_ring, .cp_a2a = 2}>("cp_a2a_fits"));
static_assert(violates<llama3_8b, layout{.cp = 4, .cp_comm = megadsl::cp_comm_kind::ring, .cp_a2a = 2}>("cp_a2a_fits"));
// Invariant arithmetic runs Ulysses under cp: the ring's tiles depend on the layout.
static_assert(violates<llama3_8b, layout{.cp = 2, .cp_comm = megadsl::cp_comm_kind::ring, .invariant = true}>("invariant_cp_a2a"));
static_assert(violates<llama3_8b, layout{.cp = 4, .cp_comm = a2a_ring, .cp_a2a = 2, .invariant = true}>("invariant_cp_a2a"));
static_assert(violates<llama3_8b, layout{.ep = 4}>("ep_needs_experts"));
// Mixtures of experts: whole experts per ep rank, each expert split over etp (= tp).
static_assert(valid_layout<megadsl::mixtral_8x7b, layout{.tp = 2, .pp = 4, .ep = 8}>);
static_assert(valid_layout<megadsl::qwen3_30b_a3b, layout{.tp = 4, .sp = true, .ep = 16}>);
static_assert(violates<megadsl::mixtral_8x7b, layout{.ep = 3}>("ep_needs_experts"));
static_assert(first_message<megadsl::qwen1_5_moe_a2_7b, layout{.ep = 7}>() ==
              "ep_needs_experts: experts = 60 do not split over ep = 7 ranks (each holds whole experts); valid ep: 1, 2, "
              "3, 4, 5, 6, 10, 12, 15, 20, 30, 60");
struct odd_experts : megadsl::qwen3_moe<shape{.hidden = 256, .layers = 2, .heads = 4, .kv_heads = 4, .ffn = 512,
                                              .vocab = 1000, .max_positions = 128, .experts = 4, .top_k = 2,
                                              .expert_ffn = 90}> {};
static_assert(valid_layout<odd_experts, layout{.tp = 2}>);
static_assert(first_message<odd_experts, layout{.tp = 4}>() ==
              "expert_ffn_divisible_by_etp: each expert's intermediate size 90 is not divisible by etp = 4; valid etp: "
              "1, 2, 3, 5, 6, 9, 10, 15, 18, 30, 45");
static_assert(violates<odd_experts, layout{.tp = 2, .etp = 4}>("etp_divides_tp"));
struct greedy_router : megadsl::qwen3_moe<shape{.hidden = 256, .layers = 2, .heads = 4, .kv_heads = 4, .ffn = 512,
                                                .vocab = 1000, .max_positions = 128, .experts = 4, .top_k = 5,
                                                .expert_ffn = 96}> {};
static_assert(first_message<greedy_router, layout{}>() ==
              "moe_routing_valid: top_k = 5 experts per token of 4; use 1 <= top_k <= 4");
static_assert(violates<llama3_8b, layout{.vocab_pad_multiple = 0}>("vocab_pad_multiple_positive"));
static_assert(violates<llama3_8b, layout{.tp = 0}>("positive_sizes"));
static_assert(first_message<llama3_8b, layout{.tp = 0}>() == "positive_sizes: tp = 0 must be positive");

struct odd_width : megadsl::llama<shape{.hidden = 1000, .layers = 2, .heads = 3, .kv_heads = 3,
                                        .ffn = 3000, .vocab = 1000, .max_positions = 128}> {};
static_assert(violates<odd_width, layout{}>("head_dim_consistent"));
struct odd_width_explicit : megadsl::llama<shape{.hidden = 1000, .layers = 2, .heads = 3, .kv_heads = 3,
                                                 .ffn = 3000, .vocab = 1000, .head_dim = 64,
                                                 .max_positions = 128}> {};
static_assert(valid_layout<odd_width_explicit, layout{}>);  // an explicit head_dim is allowed

struct kv5 : megadsl::llama<shape{.hidden = 2048, .layers = 4, .heads = 16, .kv_heads = 5,
                                  .ffn = 4096, .vocab = 1000, .max_positions = 128}> {};
static_assert(violates<kv5, layout{}>("heads_divisible_by_kv_heads"));

struct zero_layers : megadsl::llama<shape{.hidden = 256, .layers = 0, .heads = 4, .kv_heads = 4,
                                          .ffn = 512, .vocab = 1000, .max_positions = 128}> {};
static_assert(violates<zero_layers, layout{}>("positive_sizes"));

struct shrinking_rope
    : megadsl::llama<shape{.hidden = 256, .layers = 2, .heads = 4, .kv_heads = 4, .ffn = 512, .vocab = 1000,
                           .max_positions = 128, .rope = {.type = rope_type::linear, .factor = 0.5}}> {};
static_assert(violates<shrinking_rope, layout{}>("rope_scaling_valid"));
struct inverted_llama3_rope
    : megadsl::llama<shape{.hidden = 256, .layers = 2, .heads = 4, .kv_heads = 4, .ffn = 512, .vocab = 1000,
                           .max_positions = 128,
                           .rope = {.type = rope_type::llama3, .factor = 8.0, .low_freq_factor = 4.0,
                                    .high_freq_factor = 1.0, .original_max_positions = 64}}> {};
static_assert(violates<inverted_llama3_rope, layout{}>("rope_scaling_valid"));

// The presets' own restrictions.
static_assert(violates<megadsl::qwen2_5_0_5b, layout{.tp = 4}>("heads_divisible_by_tp"));
static_assert(valid_layout<megadsl::qwen2_5_0_5b, layout{.tp = 2, .pp = 2, .sp = true}>);
static_assert(violates<megadsl::tinyllama_1_1b, layout{.pp = 4}>("layers_fit_stages"));
static_assert(valid_layout<megadsl::tinyllama_1_1b, layout{.pp = 2}>);

// Several rules at once, in table order, joined by " | " in the diagnostic.
static_assert(violation_count<llama3_8b, layout{.tp = 3, .pp = 3}>() == 4);
static_assert(megadsl::check(llama3_8b::shape, layout{.tp = 3, .pp = 3}).items[3].rule == "layers_fit_stages");

// ---- run facts: decided in constant evaluation too when they are known ----
static_assert(megadsl::check(llama3_8b::shape, layout{.tp = 8, .pp = 2}, run_facts{.world = 24})
                  .has("world_fits_layout"));
static_assert(megadsl::check(llama3_8b::shape, layout{.tp = 8, .pp = 2}, run_facts{.world = 32}).ok());
static_assert(megadsl::check(llama3_8b::shape, layout{.tp = 8},
                             run_facts{.world = 32, .global_batch = 30, .micro_batch = 2})
                  .has("global_batch_divisible"));
static_assert(megadsl::check(llama3_8b::shape, layout{.pp = 4, .vpp = 2}, run_facts{.microbatches = 6})
                  .has("interleaved_microbatches"));
// Without the interleaved schedule any microbatch count is fine.
static_assert(megadsl::check(llama3_8b::shape, layout{.pp = 4}, run_facts{.microbatches = 6}).ok());

// ---- dynamic fields: a rule reading an unknown value is skipped, the others still apply ----
struct heads_unknown : megadsl::llama<shape{.hidden = 4096, .layers = 32, .heads = dynamic, .kv_heads = dynamic,
                                            .ffn = 14336, .vocab = 128256, .max_positions = 8192}> {};
static_assert(!violates<heads_unknown, layout{.tp = 3}>("heads_divisible_by_tp"));
static_assert(!violates<heads_unknown, layout{.tp = 3}>("kv_heads_fit_tp"));
static_assert(violates<heads_unknown, layout{.tp = 3}>("ffn_divisible_by_tp"));  // ffn is static
static_assert(valid_layout<heads_unknown, layout{.tp = 8}>);
using heads_unknown_actor = megadsl::causal_lm<heads_unknown, layout{.tp = 8}>;  // declarable

struct layers_unknown : megadsl::llama<shape{.hidden = 4096, .layers = dynamic, .heads = 32, .kv_heads = 8,
                                             .ffn = 14336, .vocab = 128256, .max_positions = 8192}> {};
static_assert(valid_layout<layers_unknown, layout{.pp = 3}>);                  // decided at run time
static_assert(violates<layers_unknown, layout{.pp = 1, .vpp = 2}>("vpp_needs_pp"));  // layout-only

// Everything dynamic (the command-line tool's form): nothing to decide at compile time.
struct any_llama : megadsl::llama<megadsl::dynamic_shape> {};
static_assert(valid_layout<any_llama, layout{.tp = 3, .pp = 3}>);
static_assert(valid_layout<any_llama, megadsl::dynamic_layout>);
// A dynamic degree skips the rules that read it; the layout-only ones that do not, still apply.
static_assert(valid_layout<llama3_8b, layout{.tp = dynamic}>);
static_assert(violates<llama3_8b, layout{.tp = dynamic, .pp = 3}>("layers_fit_stages"));
static_assert(!violates<llama3_8b, layout{.tp = dynamic, .sp = true}>("sp_needs_tp"));
static_assert(valid_layout<llama3_8b, megadsl::dynamic_layout>);

// ---- the expert grid's rules: etp divides tp; the world holds whole expert grids ----
static_assert(violation_count<llama3_8b, layout{.tp = 4, .etp = 8}>() == 1 && violates<llama3_8b, layout{.tp = 4, .etp = 8}>("etp_divides_tp"));
static_assert(violation_count<llama3_8b, layout{.tp = 4, .etp = 3}>() == 1 && violates<llama3_8b, layout{.tp = 4, .etp = 3}>("etp_divides_tp"));
static_assert(first_message<llama3_8b, layout{.tp = 4, .etp = 8}>() ==
              "etp_divides_tp: etp = 8 does not divide tp = 4 (an expert's shards are split over at most the attention's); "
              "valid etp: 1, 2, 4");
static_assert(valid_layout<llama3_8b, layout{.tp = 4, .etp = 2}>);
static_assert(megadsl::check(llama3_8b::shape, layout{.tp = 2, .pp = 2, .etp = 1}, run_facts{.world = 8}).ok());
static_assert(megadsl::check(llama3_8b::shape, layout{.pp = 2, .ep = 2}, run_facts{.world = 6}).has("expert_grid_fits_world"));

}  // namespace

