// Llama 4's router: a router slot only Llama 4 uses, so it lives with the family (DESIGN decision
// 16), its module in input_sigmoid_router.cpp beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/routers.hpp"

namespace megadsl::modules {
// Its module; weak outside the runtime library, as the core's are.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> input_sigmoid_router(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

// Llama4Router: the top k of the logits as they are (in the compute dtype), each chosen expert fed
// the token times sigmoid(logit): the weight scales the expert's input, not its output.
template <const router_names& N>
struct input_sigmoid_router {
  static_assert(N.expert_bias.empty() && N.bias.empty(), "megadsl: Llama 4's router has no bias");
  static constexpr router_knobs knobs{false};
  static constexpr std::string_view signature = ", sigmoid_on_input", signature_tail = "";
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add("router -> top ", shown(s.top_k), " of ", shown(s.experts), ", each expert fed x * sigmoid(logit)");
  }
  static constexpr void hf_names(basic_text<256>& t) { router_hf_names(t, N); }
  static constexpr int lower(arch_builder& b, const slot& at) {
    router_rows(b, at, N);
    return b.node(at, &modules::input_sigmoid_router, {}, {}, {}, nullptr, knobs_of(knobs));
  }
};

}  // namespace megadsl::blocks
