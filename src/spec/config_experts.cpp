// A mixture of experts' keys (family_config::moe), as each family's config class reads them.
#include "config_reader.hpp"

namespace megadsl::hf_read {

// A mixture of experts' keys (family_config::moe): its count under the key its config class reads
// (num_local_experts or num_experts) or an alias transformers 5 writes instead (reading either).
void read_experts(const reader& r, const family_config& family, shape& s) {
  const json& root = r.root();
  const moe_config& m = *family.moe;
  // A name the config class maps onto a key (attribute_map): read as that key, unless both disagree.
  const auto alias = [&](std::string_view key, std::string_view other) {
    const json* a = other.empty() ? nullptr : r.find(root, other);
    if (a == nullptr) return;
    const json* k = r.find(root, key);
    if (k != nullptr && *k != *a)
      r.fail(other, "is " + describe_json(*a) + " but " + std::string(key) + " is " + describe_json(*k),
             "keep one of them (transformers maps " + std::string(other) + " onto " + std::string(key) + ")");
  };
  alias(m.count_key, m.count_alias);
  alias(m.top_k_key, m.top_k_alias);
  // The name config.json gives it: the key, or where only the alias is there, the alias.
  const auto stated = [&](std::string_view key, std::string_view other) {
    return r.find(root, key) == nullptr && !other.empty() && r.find(root, other) != nullptr ? other : key;
  };
  const bool both = m.reads_both_counts;
  const json* local = both || m.count_key == "num_local_experts" ? r.find(root, "num_local_experts") : nullptr;
  const json* named = both || m.count_key == "num_experts" ? r.find(root, "num_experts")
                      : m.count_key != "num_local_experts" ? r.find(root, stated(m.count_key, m.count_alias)) : nullptr;
  if (local && named && r.integer(*local, "num_local_experts", 1) != r.integer(*named, "num_experts", 1))
    r.fail("num_experts", "is " + describe_json(*named) + " but num_local_experts is " + describe_json(*local),
           "keep one of them (transformers reads " + std::string(m.count_key) + " for " + std::string(family.model_type) + ")");
  if (!local && !named)
    r.fail(m.count_key, "missing (the number of experts per layer)", "point megadsl at the model's own config.json or add the key");
  s.experts = local ? r.integer(*local, "num_local_experts", 1) : r.integer(*named, both ? "num_experts" : m.count_key, 1);
  // A top-k key may list one per layer: megadsl's mixture has one top-k for every layer.
  s.top_k = r.optional<std::int64_t>(stated(m.top_k_key, m.top_k_alias), m.top_k, [&](const json& v, std::string_view k) {
    if (!v.is_array()) return r.integer(v, k, 1);
    if (v.empty() || static_cast<std::int64_t>(v.size()) != s.layers.get())
      r.fail(k, "is " + describe_json(v) + ", expected one number or one per layer (" + std::to_string(s.layers.get()) + ")",
             "give one top-k");
    const std::int64_t first = r.integer(v.front(), k, 1);
    for (const json& e : v)
      if (r.integer(e, k, 1) != first)
        r.fail(k, "differs between layers (" + describe_json(v) + "); megadsl's mixture has one top-k for every layer",
               "this checkpoint is not supported yet");
    return first;
  });
  if (m.shared_as_wide_as_ffn) s.shared_expert_ffn = s.ffn;  // a shared MLP of intermediate_size
  if (m.experts_as_wide_as_ffn) {
    s.expert_ffn = 0;  // intermediate_size
    s.norm_topk = !m.reads_norm_topk ||
                  r.optional<bool>("norm_topk_prob", m.norm_topk, [&](const json& v, std::string_view k) { return r.boolean(v, k); });
    return;
  }
  s.expert_ffn = r.optional<std::int64_t>(m.expert_ffn_key, m.expert_ffn,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  s.norm_topk = m.reads_norm_topk ? r.optional<bool>("norm_topk_prob", m.norm_topk,
                                                     [&](const json& v, std::string_view k) { return r.boolean(v, k); })
                                  : m.norm_topk;
  if (has_shared_expert(s) && !m.shared_count_key.empty())
    s.shared_expert_ffn = s.expert_ffn.get() * r.optional<std::int64_t>(m.shared_count_key, m.shared_count,
        [&](const json& v, std::string_view k) { return r.integer(v, k, m.shared_count_least); });
  else if (m.shared_as_wide_as_experts)
    s.shared_expert_ffn = s.expert_ffn;  // a shared expert as wide as each expert
  else if (has_shared_expert(s))
    s.shared_expert_ffn = r.optional<std::int64_t>("shared_expert_intermediate_size", m.shared_expert_ffn,
        [&](const json& v, std::string_view k) { return r.integer(v, k, 1); });
  if (m.every_layer) {  // no dense layer (the config class has no key for one)
    s.sparse_step = 1;
    s.dense_layers = 0;
    return;
  }
  if (!m.dense_first_key.empty()) {  // the first k layers dense, the rest sparse
    const std::int64_t k = r.optional<std::int64_t>(m.dense_first_key, m.dense_first,
        [&](const json& v, std::string_view key) { return r.integer(v, key, 0); });
    if (k >= 63 && s.layers.get() > 63)
      r.fail(m.dense_first_key, "is " + std::to_string(k) + "; megadsl marks dense layers among the first 63 only",
             "this checkpoint is not supported yet");
    s.sparse_step = 1;
    const std::int64_t dense = std::min(k, s.layers.get());  // (transformers: layer i is dense when i < k)
    s.dense_layers = dense >= 63 ? std::numeric_limits<std::int64_t>::max() : (std::int64_t{1} << dense) - 1;
    return;
  }
  // Dense layers among the sparse ones: a layer is sparse when it is not in mlp_only_layers and
  // (i + 1) % decoder_sparse_step == 0; the dense ones have a gated MLP of intermediate_size.
  s.sparse_step = r.optional<std::int64_t>(m.sparse_step_key, 1,
      [&](const json& v, std::string_view k) { return r.integer(v, k, 1); }, /*note=*/false);
  std::int64_t dense = 0;
  if (!m.sparse_first_key.empty()) {  // the layers outside [start, end] dense
    const std::int64_t first = r.optional<std::int64_t>(m.sparse_first_key, m.sparse_first,
        [&](const json& v, std::string_view k) { return r.integer(v, k, 0); });
    std::int64_t last = r.optional<std::int64_t>(m.sparse_last_key, -1,
        [&](const json& v, std::string_view k) { return r.integer(v, k, -1); });
    if (last == -1) last = s.layers.get() - 1;  // (the config class's __post_init__)
    // (Bits only where the step alone would route: one model, one shape, whatever range says it.)
    for (std::int64_t i = 0; i < s.layers.get(); ++i) {
      if ((i >= first && i <= last) || (i + 1) % s.sparse_step.get() != 0) continue;
      if (i >= 63)
        r.fail(i > last ? m.sparse_last_key : m.sparse_first_key,
               "leaves layer " + std::to_string(i) + " dense; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
    s.dense_layers = dense;
    return;
  }
  if (!m.sparse_layers_key.empty()) {  // a list of the sparse layers, overriding the step
    const json* listed = r.find(root, m.sparse_layers_key);
    if (listed == nullptr || listed->is_null()) {
      s.dense_layers = 0;
      return;
    }
    if (!listed->is_array())
      r.fail(m.sparse_layers_key, "expected a list of layer indices, got " + describe_json(*listed), "write e.g. [1, 3, 5]");
    std::vector<bool> sparse(static_cast<std::size_t>(s.layers.get()), false);
    for (const json& e : *listed) {
      const std::int64_t i = r.integer(e, m.sparse_layers_key, 0);
      if (i < s.layers.get()) sparse[static_cast<std::size_t>(i)] = true;  // no such layer: transformers matches none either
    }
    // The list the step gives (the config class writes it so): the step alone says it.
    bool stepped = true;
    for (std::int64_t i = 0; i < s.layers.get(); ++i)
      stepped = stepped && sparse[static_cast<std::size_t>(i)] == ((i + 1) % s.sparse_step.get() == 0);
    if (stepped) {
      s.dense_layers = 0;
      return;
    }
    s.sparse_step = 1;
    for (std::int64_t i = 0; i < s.layers.get(); ++i) {
      if (sparse[static_cast<std::size_t>(i)]) continue;
      if (i >= 63)
        r.fail(m.sparse_layers_key, "leaves layer " + std::to_string(i) + " dense; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
    s.dense_layers = dense;
    return;
  }
  if (const json* only = r.find(root, "mlp_only_layers")) {
    if (!only->is_array())
      r.fail("mlp_only_layers", "expected a list of layer indices, got " + describe_json(*only), "write e.g. [] or [0, 3]");
    for (const json& e : *only) {
      const std::int64_t i = r.integer(e, "mlp_only_layers", 0);
      if (i >= s.layers.get()) continue;  // no such layer: transformers matches none either
      if (i >= 63)
        r.fail("mlp_only_layers", "lists layer " + std::to_string(i) + "; megadsl marks dense layers among the first 63 only",
               "this checkpoint is not supported yet");
      dense |= std::int64_t{1} << i;
    }
  }
  s.dense_layers = dense;
}

}  // namespace megadsl::hf_read
