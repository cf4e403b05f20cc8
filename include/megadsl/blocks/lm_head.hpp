// The heads on the last stage: the LM head (the actor's) and the value head (the critic's).
#pragma once

#include "megadsl/blocks/builder.hpp"

namespace megadsl::blocks {

// How a family's config key scales the LM head's logits (HF's CausalLM output, before any
// temperature): multiplied by it (Cohere's logit_scale) or divided by it (Granite's logits_scaling).
enum class logit_scaling : std::int8_t { times, divided_by };

// The LM head (lm_head, vocab-parallel; the embedding where tied) and the value head (score, one
// output; GPT-NeoX's classifier), their rows declared here and chosen by the model type (causal_lm
// / value_model). `Scale`: a config key of the family's that scales the logits as `Op` says;
// decoder_stage applies it to each rank's vocabulary shard. The decoder's last argument:
//
//   decoder<embedding<>, ..., layer_norm_no_bias, hf_default_names, lm_head<&cohere_logit_scale>>
template <const config_setting* Scale = nullptr, logit_scaling Op = logit_scaling::times>
struct lm_head {
  static constexpr void lower(arch_builder& b, const slot& outer) {
    // Tied embeddings: the HF source is the embedding; on pp > 1 the last stage keeps a copy.
    slot lm = outer.sub("lm_head", outer.names->lm_head);
    lm.where = placement::last_stage;
    b.param(lm, {"weight", &geo::vocab, {"weight"}, 1, presence::actor});
    // (…ForTokenClassification's head: decoder_names::value_head.)
    slot value = outer.sub("value_head", outer.names->value_head);
    value.where = placement::last_stage;
    b.param(value, {"weight", &geo::value_weight, {"weight"}, 1, presence::critic});
    b.param(value, {"bias", &geo::value_bias, {"bias"}, 1, presence::critic_bias});
    if constexpr (Scale != nullptr) {
      b.logit_scale = b.setting(*Scale);
      b.logit_divides = Op == logit_scaling::divided_by;
    }
  }
};

}  // namespace megadsl::blocks
