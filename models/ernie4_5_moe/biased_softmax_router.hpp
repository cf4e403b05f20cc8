// ERNIE 4.5's router: a router slot only ERNIE 4.5 uses, so it lives with the family (DESIGN
// decision 16), its module in biased_softmax_router.cpp beside this file.
#pragma once

#include <memory>

#include "megadsl/blocks/routers.hpp"

namespace megadsl::modules {
// Its module; weak outside the runtime library, as the core's are.
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> biased_softmax_router(const block_build& b);
}  // namespace megadsl::modules

namespace megadsl::blocks {

// Ernie4_5_MoeTopKRouter: softmax scores over every expert in fp32, the experts chosen by scores +
// an expert bias (selecting only, balanced by load in training like DeepSeek-V3's), their
// unbiased scores divided by max(sum, moe_norm_min), its own config key (Ernie4_5_MoeConfig's
// default 1e-12).
inline constexpr config_setting moe_norm_min{.key = "moe_norm_min", .fallback = 1e-12, .least = 0,
                                             .meaning = "the floor of the top-k weights' sum they are divided by"};
template <const router_names& N>
struct biased_softmax_router {
  static_assert(!N.expert_bias.empty() && N.bias.empty(), "megadsl: ERNIE's router has an expert bias and no bias on its logits");
  static constexpr router_knobs knobs{true};
  static constexpr std::string_view signature = "", signature_tail = ", fp32_router";
  static constexpr void details(const shape& s, basic_text<256>& t) {
    t.add("router softmax (fp32) + expert bias -> top ", shown(s.top_k), " of ", shown(s.experts),
          ", unbiased scores renormalised");
  }
  static constexpr void hf_names(basic_text<256>& t) { router_hf_names(t, N); }
  static constexpr int lower(arch_builder& b, const slot& at) {
    b.setting(moe_norm_min);
    router_rows(b, at, N);
    return b.node(at, &modules::biased_softmax_router, {}, {}, {}, nullptr, knobs_of(knobs));
  }
};

}  // namespace megadsl::blocks
