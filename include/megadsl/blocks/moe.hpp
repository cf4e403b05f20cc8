// The mixture of experts, composed of slots: its router, its experts and its shared expert, each a
// type with its own rows, HF names (bound by the family) and knobs (blocks/routers.hpp,
// blocks/experts.hpp).
//   moe<>                                                        Qwen3-MoE, OLMoE
//   moe<softmax_router<>, experts<>, gated_shared_expert<>>      Qwen2-MoE, Qwen3-Next
//   moe<grouped_sigmoid_router<>, experts<>, shared_expert<hf_shared_experts_names, presence::shared_experts>>
//                                                                DeepSeek-V3, GLM-4.5
//   moe<input_sigmoid_router<..>, stacked_experts<..>, shared_expert<..>, llama4_mixture>   Llama 4 (models/llama4/)
#pragma once

#include <string_view>

#include "megadsl/blocks/experts.hpp"
#include "megadsl/blocks/routers.hpp"

namespace megadsl::blocks {

// The mixture's HF module (mlp; Mixtral's block_sparse_moe, Llama 4's feed_forward) and its names'
// part of the mixture's name in the architecture's name, which checkpoints record (HF's common
// names were first written as Qwen's).
struct mixture_names {
  std::string_view module = "mlp";
  std::string_view signature = "qwen";
};
inline constexpr mixture_names hf_mixture_names{};

// A mixture of experts behind a top-k router: the shape gives experts, top_k, expert_ffn,
// norm_topk (and shared_expert_ffn). Experts split over ep (whole experts) and each expert over
// etp = tp like a gated MLP; tokens travel to their experts by all-to-all (layers/moe.hpp). The
// router is replicated; under tp its gradient is summed over tp, since the experts' outputs it
// weighs are partial sums there. Its module (src/layers/moe_mlp.cpp) holds the experts and the
// shared expert and runs the router's module (the router slot's node, its child).
template <class Router = softmax_router<>, class Experts = experts<>, class Shared = no_shared_expert,
          const mixture_names& N = hf_mixture_names>
struct moe {
  static_assert(router_slot<Router>, "megadsl: moe's first argument is a router (blocks/routers.hpp)");
  static_assert(experts_slot<Experts>, "megadsl: moe's second argument is its experts (blocks/experts.hpp)");
  static_assert(shared_expert_slot<Shared>, "megadsl: moe's third argument is its shared expert or no_shared_expert (blocks/experts.hpp)");
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add("  ");
    Router::details(s, t);
    Experts::details(s, t);
    Shared::details(s, t);
    t.add("  [", N.module, ": ");
    Router::hf_names(t);
    t.add(", ");
    Experts::hf_names(t);
    Shared::hf_names(t);
    t.add("]");
  }
  static constexpr int lower(arch_builder& b, const slot& layer) {
    const slot at = layer.module(N.module);
    const int router = Router::lower(b, at.sub("router", ""));
    Experts::lower(b, at);
    Shared::lower(b, at);
    b.routes = true;
    // (The order the mixture's name has always had, which recorded checkpoints hold.)
    basic_text<64> name("moe_mlp<");
    name.add(Experts::signature, ", ", N.signature, Router::signature, Shared::signature, Router::signature_tail, ">");
    basic_text<64> label("moe_mlp<");
    label.add(Experts::signature, ">");
    // The dense MLP's estimate (the paper has no mixture): the experts' activations per token are
    // top_k of them, each narrower.
    return b.costs(b.node(at, &modules::moe_mlp, {router}, name.view(), label.view(), &details, knobs_of(Experts::knobs)),
                   mlp_keeps);
  }
};

}  // namespace megadsl::blocks
