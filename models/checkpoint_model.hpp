// The model types of a checkpoint whose family is known only at run time (config.json's
// model_type, or a distributed checkpoint's metadata): every field of the shape and the layout
// dynamic. `megadsl run`, `megadsl convert` and the Python module all build these, through
// `with_checkpoint_model`, so there is one definition of each.
//
//   with_checkpoint_model(head, [&](auto spec) { run<typename decltype(spec)::type>(...); });
#pragma once

#include <string_view>
#include <type_traits>

#include "megadsl/model.hpp"
#include "megadsl/shard_plan.hpp"  // head_info

namespace megadsl {

struct hf_checkpoint_model : any_decoder<dynamic_shape> {
  static constexpr std::string_view name = "hf-checkpoint";
};
using checkpoint_actor = causal_lm<hf_checkpoint_model, dynamic_layout>;
using checkpoint_critic = value_model<hf_checkpoint_model, dynamic_layout>;
using checkpoint_critic_nobias = value_model<hf_checkpoint_model, dynamic_layout, value_head{.bias = false}>;

// Calls `f(std::type_identity<Spec>{})` with the spec for `head` (actor, critic with or without
// the value head's bias) and returns what it returns.
template <class F>
decltype(auto) with_checkpoint_model(const head_info& head, F&& f) {
  if (head.actor) return f(std::type_identity<checkpoint_actor>{});
  if (head.value_bias) return f(std::type_identity<checkpoint_critic>{});
  return f(std::type_identity<checkpoint_critic_nobias>{});
}

}  // namespace megadsl
