// The keys every config class has and what megadsl does with them, the dropout keys, and the
// notes on keys a family's config class does not know.
#include "config_reader.hpp"

namespace megadsl::hf_read {

// The keys of every family's config class (PreTrainedConfig's own and the shape's), and what megadsl
// does with them; each family's own keys are in its header (family_config::keys), found first. A
// key in neither is unknown to the family's config class: transformers ignores it too, and megadsl
// says so in a note.
constexpr config_key_rule common_keys[] = {
    // Shape: read by parse_hf_config.
    {"model_type", key_use::read},
    {"hidden_size", key_use::read},
    {"num_hidden_layers", key_use::read},
    {"num_attention_heads", key_use::read},
    {"num_key_value_heads", key_use::read},
    {"intermediate_size", key_use::read},
    {"vocab_size", key_use::read},
    {"head_dim", key_use::read},
    {"max_position_embeddings", key_use::read},
    {"rope_theta", key_use::read},
    {"rope_scaling", key_use::read},
    {"rope_parameters", key_use::read},
    {"tie_word_embeddings", key_use::read},
    {"hidden_act", key_use::read},                // the family's activation only
    // Refused unless neutral (checked in check_keys).
    {"attention_dropout", key_use::read},         // dropout on the attention probabilities in training (read_dropout)
    {"classifier_dropout", key_use::refused},     // the value head's dropout (TokenClassification)
    {"quantization_config", key_use::refused},    // quantized weights
    {"pruned_heads", key_use::refused},
    // No effect on the numbers.
    {"torch_dtype", key_use::no_effect},          // the weights carry their dtype; convert writes it
    {"dtype", key_use::no_effect},
    {"architectures", key_use::no_effect},        // the head comes from the weights and the command
    {"transformers_version", key_use::no_effect},
    {"_name_or_path", key_use::no_effect},
    {"name_or_path", key_use::no_effect},
    {"initializer_range", key_use::no_effect},
    {"use_cache", key_use::no_effect},
    {"pad_token_id", key_use::no_effect},
    {"bos_token_id", key_use::no_effect},
    {"eos_token_id", key_use::no_effect},
    {"sep_token_id", key_use::no_effect},
    {"decoder_start_token_id", key_use::no_effect},
    {"id2label", key_use::no_effect},             // a critic's score shape is checked on the weights
    {"label2id", key_use::no_effect},
    {"num_labels", key_use::no_effect},
    {"problem_type", key_use::no_effect},
    {"tokenizer_class", key_use::no_effect},
    {"_attn_implementation", key_use::no_effect},  // eager, sdpa and flash compute the same attention
    {"attn_implementation", key_use::no_effect},
    {"_attn_implementation_autoset", key_use::no_effect},
    {"output_attentions", key_use::no_effect},
    {"output_hidden_states", key_use::no_effect},
    {"return_dict", key_use::no_effect},
    {"use_return_dict", key_use::no_effect},
    {"torchscript", key_use::no_effect},
    {"chunk_size_feed_forward", key_use::no_effect},  // chunking gives the same product
    {"is_encoder_decoder", key_use::no_effect},
    {"is_decoder", key_use::no_effect},
    {"add_cross_attention", key_use::no_effect},
    {"tie_encoder_decoder", key_use::no_effect},
    {"task_specific_params", key_use::no_effect},
    {"finetuning_task", key_use::no_effect},
    {"prefix", key_use::no_effect},
    {"auto_map", key_use::no_effect},
    {"keys_to_ignore_at_inference", key_use::no_effect},
    // 4.x configs still carry generation settings; they concern sampling, not the model's numbers.
    {"max_length", key_use::no_effect},
    {"min_length", key_use::no_effect},
    {"do_sample", key_use::no_effect},
    {"early_stopping", key_use::no_effect},
    {"num_beams", key_use::no_effect},
    {"num_beam_groups", key_use::no_effect},
    {"diversity_penalty", key_use::no_effect},
    {"temperature", key_use::no_effect},
    {"top_k", key_use::no_effect},
    {"top_p", key_use::no_effect},
    {"typical_p", key_use::no_effect},
    {"repetition_penalty", key_use::no_effect},
    {"length_penalty", key_use::no_effect},
    {"no_repeat_ngram_size", key_use::no_effect},
    {"encoder_no_repeat_ngram_size", key_use::no_effect},
    {"bad_words_ids", key_use::no_effect},
    {"num_return_sequences", key_use::no_effect},
    {"output_scores", key_use::no_effect},
    {"return_dict_in_generate", key_use::no_effect},
    {"forced_bos_token_id", key_use::no_effect},
    {"forced_eos_token_id", key_use::no_effect},
    {"remove_invalid_values", key_use::no_effect},
    {"exponential_decay_length_penalty", key_use::no_effect},
    {"suppress_tokens", key_use::no_effect},
    {"begin_suppress_tokens", key_use::no_effect},
};

const config_key_rule* find_key(const family_config& family, std::string_view key) {
  for (const config_key_rule& k : family.keys)
    if (k.key == key) return &k;
  for (const config_key_rule& k : common_keys)
    if (k.key == key) return &k;
  return nullptr;
}

// attention_dropout as most config classes have it (a family lists its own otherwise).
constexpr dropout_key attention_dropout_key{.key = "attention_dropout", .attention = true};

// The family's dropout keys: its own (family_config::dropouts), and attention_dropout unless the
// family lists it or its keys say its class applies none.
std::vector<dropout_key> dropout_keys_of(const family_config& family) {
  std::vector<dropout_key> out(family.dropouts.begin(), family.dropouts.end());
  bool listed = false;
  for (const dropout_key& k : out) listed = listed || k.key == attention_dropout_key.key;
  bool own_rule = false;
  for (const config_key_rule& k : family.keys) own_rule = own_rule || k.key == attention_dropout_key.key;
  if (!listed && !own_rule) out.push_back(attention_dropout_key);
  return out;
}

const dropout_key* dropout_key_named(const family_config& family, std::string_view key) {
  for (const dropout_key& k : family.dropouts)
    if (k.key == key) return &k;
  if (key != attention_dropout_key.key) return nullptr;
  for (const config_key_rule& k : family.keys)
    if (k.key == key) return nullptr;
  return &attention_dropout_key;
}

// The rates of the family's dropout keys, their class defaults where config.json is silent: each a
// probability in [0, 1).
dropout_rates read_dropout(const reader& r, const family_config& family, std::vector<std::string>& notes) {
  dropout_rates out;
  for (const dropout_key& k : dropout_keys_of(family)) {
    double p = k.class_default;
    const auto it = r.root().find(std::string(k.key));
    if (it == r.root().end()) {
      if (p != 0.0)
        notes.push_back(std::string(k.key) + " not in config.json: using " + format_double(p) + " (transformers' default), "
                        "applied in training steps");
    } else {
      if (!it->is_number())
        r.fail(k.key, "expected a dropout probability, got " + describe_json(*it),
               "write a number in [0, 1) (0.0: no dropout)");
      p = it->get<double>();
      if (!(p >= 0.0 && p < 1.0))
        r.fail(k.key, "is " + describe_json(*it) + ", not a probability below 1 (1 would drop everything)",
               "write a number in [0, 1) (0.0: no dropout)");
    }
    if (k.attention) out.attention = p;
    if (k.residual) out.residual = p;
    if (k.embedding) out.embedding = p;
  }
  return out;
}

// The key (or an older spelling) under which config.json gives a block's own setting, or "".
std::string_view setting_key_in(const json& root, const config_setting& c) {
  if (root.contains(std::string(c.key))) return c.key;
  for (const std::string_view k : c.also)
    if (!k.empty() && root.contains(std::string(k))) return k;
  return {};
}
bool is_setting_key(const architecture& a, std::string_view key) {
  for (const config_setting& c : a.settings)
    if (c.key == key || c.also[0] == key || c.also[1] == key) return true;
  return false;
}

// Refused keys must hold their neutral value; unknown keys get a note (transformers ignores them
// too, since its config class has no such field).
void check_keys(const reader& r, const family_config& family, std::vector<std::string>& notes) {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : r.root().items()) {
    if (dropout_key_named(family, key) != nullptr) continue;  // read by read_dropout
    if (is_setting_key(*family.arch, key)) continue;          // a block's own, read by read_block_settings
    const config_key_rule* k = find_key(family, key);
    if (k == nullptr) {
      unknown.push_back(printable(key));
      continue;
    }
    if (k->use == key_use::no_effect && !k->note.empty() && !value.is_null() &&
        !(value.is_number() && value.get<double>() == 0.0))
      notes.push_back(key + " = " + printable(value.dump()) + ": " + std::string(k->note));
    if (k->use != key_use::refused || value.is_null()) continue;
    if (key == "router_jitter_noise") {
      if (value.is_number() && value.get<double>() == 0.0) continue;
      r.fail(key, "is " + describe_json(value) + ": HF multiplies the router's input by random noise in training, "
             "which megadsl does not, so training would differ", "set it to 0.0 (as published configs have it)");
    }
    if (key == "classifier_dropout") {
      if (value.is_number() && value.get<double>() == 0.0) continue;
      r.fail(key, "is " + describe_json(value) + ": megadsl's value head has no dropout, so a critic's training would "
             "differ from HF's", "set it to 0.0 (verl's critics set it to 0)");
    }
    if (key == "pruned_heads" && value.is_object() && value.empty()) continue;
    if (value.is_boolean() && !value.get<bool>()) continue;  // a switch left off
    r.fail(key, "is " + describe_json(value) + ", which megadsl does not implement" + (k->note.empty() ? "" : " (" + std::string(k->note) + ")"),
           key == "quantization_config" ? "dequantize the checkpoint to bf16/fp32 first"
                                        : "this checkpoint is not supported");
  }
  if (!unknown.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unknown.size(); ++i) list += (i ? ", " : "") + unknown[i];
    notes.push_back("keys unknown to transformers' " + std::string(family.model_type) +
                    " config, ignored as transformers ignores them: " + list);
  }
}

}  // namespace megadsl::hf_read
