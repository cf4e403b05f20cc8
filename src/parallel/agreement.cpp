#include "megadsl/parallel/agreement.hpp"

#include <ATen/ATen.h>
#include <boost/hana/at_key.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/keys.hpp>
#include <boost/hana/string.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "megadsl/hf_config.hpp"
#include "megadsl/parallel/comm.hpp"
#include "megadsl/reflection.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl {
namespace hana = boost::hana;

namespace {

template <class T>
std::string text_of(const maybe<T>& v) {
  if (!v.is_static()) return "dynamic";
  if constexpr (std::is_enum_v<T>) {
    return std::string(name_of(v.get()));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.get() ? "true" : "false";
  } else {
    std::ostringstream os;
    os.precision(17);
    os << v.get();
    return os.str();
  }
}

template <class Struct>
void add_fields(field_list& out, const std::string& prefix, const Struct& s) {
  hana::for_each(hana::keys(s), [&](auto key) {
    const std::string name = prefix + hana::to<char const*>(key);
    const auto& v = hana::at_key(s, key);
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, rope_scaling>) add_fields(out, name + ".", v);
    else out.emplace_back(name, text_of(v));
  });
}

std::uint64_t fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::uint64_t hash_text(const field_list& fields) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [k, v] : fields) {
    h = fnv(h, k.data(), k.size());
    h = fnv(h, "=", 1);
    h = fnv(h, v.data(), v.size());
    h = fnv(h, "\n", 1);
  }
  return h;
}

std::string serialise(const field_list& fields) {
  std::string s;
  for (const auto& [k, v] : fields) s += k + '\x1f' + v + '\x1e';
  return s;
}

field_list parse(const std::string& s) {
  field_list out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t sep = s.find('\x1f', at), end = s.find('\x1e', at);
    if (sep == std::string::npos || end == std::string::npos || sep > end) break;
    out.emplace_back(s.substr(at, sep - at), s.substr(sep + 1, end - sep - 1));
    at = end + 1;
  }
  return out;
}

// Every rank's string, in rank order (only on the rare path where the ranks disagree).
std::vector<std::string> all_gather_text(const comm_group& world, const std::string& mine) {
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong);
  const at::Tensor lengths = world.all_gather(length, 0);  // (world)
  const std::int64_t longest = std::max<std::int64_t>(1, lengths.max().item<std::int64_t>());
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  const at::Tensor all = world.all_gather(bytes.unsqueeze(0), 0).contiguous();  // (world, longest)
  std::vector<std::string> out;
  for (std::int64_t r = 0; r < world.size(); ++r)
    out.emplace_back(static_cast<const char*>(all[r].data_ptr()), static_cast<std::size_t>(lengths[r].item<std::int64_t>()));
  return out;
}

// "0, 1, 2" (at most 8 named, then "and N more").
std::string rank_list(const std::vector<std::int64_t>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}

// "2 on rank 0, 1 on ranks 1, 3": each distinct value with the ranks that hold it, in rank order.
std::string by_value(const std::vector<std::string>& values, const std::vector<std::int64_t>& ranks) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> groups;
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == values[i]; });
    if (it == groups.end()) groups.push_back({values[i], {ranks[i]}});
    else it->second.push_back(ranks[i]);
  }
  std::string s;
  for (std::size_t i = 0; i < groups.size(); ++i)
    s += (i ? ", " : "") + groups[i].first + " on rank" + (groups[i].second.size() > 1 ? "s " : " ") +
         rank_list(groups[i].second);
  return s;
}

std::string hex(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

const char* call_name(std::int64_t c) {
  switch (static_cast<batch_call>(c)) {
    case batch_call::forward: return "forward";
    case batch_call::forward_backward: return "forward_backward";
    case batch_call::train_step: return "a training step";
  }
  return "another call";
}

}  // namespace

field_list fields_of(const layout& l) {
  field_list out;
  add_fields(out, "", l);
  return out;
}

field_list fields_of(const runtime_config& c) {
  field_list out;
  add_fields(out, "", c.s);
  if (c.s.arch != nullptr && !c.s.settings.dynamic)
    for (const config_setting& k : c.s.arch->settings) {
      std::ostringstream os;
      os.precision(17);
      os << setting(c.s, k.key);
      out.emplace_back("settings." + std::string(k.key), os.str());
    }
  out.emplace_back("architecture", c.s.arch != nullptr ? std::string(c.s.arch->name) : std::string("dynamic"));
  add_fields(out, "layout.", c.l);
  const model_options& o = c.options;
  out.emplace_back("head", c.head.actor ? "actor" : c.head.value_bias ? "critic (value head with bias)" : "critic");
  out.emplace_back("dtype", std::string(c10::toString(o.dtype)));
  out.emplace_back("compute dtype", std::string(c10::toString(o.compute())));
  out.emplace_back("device", c10::DeviceTypeName(o.device.type(), /*lower_case=*/true));
  out.emplace_back("sliding window", describe(o.attention_window));
  out.emplace_back("dropout", describe(o.dropout));
  out.emplace_back("seed", std::to_string(o.seed));
  for (const auto& [name, v] : {std::pair<const char*, double>{"init_std", o.init_std},
                                {"moe_aux_loss_coeff", o.moe_aux_loss_coeff},
                                {"moe_z_loss_coeff", o.moe_z_loss_coeff},
                                {"moe_expert_bias_update_rate", o.moe_expert_bias_update_rate}})
    out.emplace_back(name, number_text(v));
  out.emplace_back("moe_aux_loss_per_sequence", o.moe_aux_loss_per_sequence ? "true" : "false");
  out.emplace_back("batch_checksum", o.batch_checksum ? "true" : "false");
  out.emplace_back("head_chunk_tokens", std::to_string(o.head_chunk_tokens));  // the head's collectives per chunk
  return out;
}

std::string number_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

field_list fields_of(const forward_options& o) {
  return {{"temperature", number_text(o.temperature)},
          {"entropy", o.entropy ? "true" : "false"},
          {"logits", o.return_logits ? "true" : "false"},
          {"record_routing", o.record_routing ? "true" : "false"}};
}

named_tensors fields_of(const batch& b) {
  return {{"input_ids", b.input_ids}, {"attention_mask", b.attention_mask}, {"labels", b.labels},
          {"routed_experts", b.routed_experts}, {"temperature", b.temperature}};
}

namespace {

// "tp is 2 on rank 0, 1 on rank 1; sp is ...": the fields the ranks disagree on (at most four), from
// every rank's list (a collective: every rank calls it once the hashes differ).
std::string differing_fields(const comm_group& world, const field_list& fields) {
  const std::vector<std::string> texts = all_gather_text(world, serialise(fields));
  std::vector<field_list> theirs;
  for (const std::string& t : texts) theirs.push_back(parse(t));
  std::string diffs;
  int shown = 0;
  for (std::size_t i = 0; i < fields.size() && shown < 4; ++i) {
    std::vector<std::string> values;
    bool differ = false;
    for (const field_list& f : theirs) {
      values.push_back(i < f.size() && f[i].first == fields[i].first ? f[i].second : "?");
      differ = differ || values.back() != values.front();
    }
    if (!differ) continue;
    diffs += std::string(shown++ ? "; " : "") + fields[i].first + " is " + by_value(values, world.ranks());
  }
  if (diffs.empty()) diffs = "their field lists differ (ranks built from different megadsl versions?)";
  return diffs;
}

}  // namespace

void agree_on(const comm_group& world, std::string_view what, const field_list& fields, std::string_view fix) {
  if (world.size() == 1) return;
  const counted_as_checks bookkeeping;
  at::Tensor mine = at::full({1}, static_cast<std::int64_t>(hash_text(fields)), at::kLong);
  const at::Tensor all = world.all_gather(mine, 0);  // (world)
  if (all.eq(all[0]).all().item<bool>()) return;
  throw agreement_error("megadsl: the ranks " + std::string(what) + ": " + differing_fields(world, fields) + "; " +
                        std::string(fix));
}

std::uint64_t tensor_checksum(const at::Tensor& t, std::uint64_t seed) {
  std::uint64_t h = seed;
  const std::string type = c10::toString(t.scalar_type());
  h = fnv(h, type.data(), type.size());
  for (const std::int64_t d : t.sizes()) h = fnv(h, &d, sizeof d);
  const at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
  // Eight bytes at a time (FNV-1a over 64-bit words), then the tail byte by byte.
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const std::size_t n = static_cast<std::size_t>(c.numel()) * c.element_size();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return fnv(h, p + i, n - i);
}

void agree_on_batch(const comm_group& world, batch_call call, std::int64_t replica,
                    const std::vector<named_tensors>& microbatches, bool checksum, const field_list& options) {
  if (world.size() == 1) return;
  const counted_as_checks bookkeeping;
  // Per rank: the call, its replica, the micro-batches' rows (summed) and columns (the widest),
  // which fields are given, a hash of every field's dtype and shape, and the checksum of their bytes.
  std::uint64_t shapes = 0xcbf29ce484222325ull, values = 0;
  std::int64_t given = 0, rows = 0, cols = 0;
  const auto count = static_cast<std::int64_t>(microbatches.size());
  shapes = fnv(shapes, &count, sizeof count);
  for (const named_tensors& tensors : microbatches) {
    bool first = true;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i].second;
      if (!t.defined()) continue;
      if (i < 63) given |= std::int64_t{1} << i;
      if (first && t.dim() >= 1) {
        rows += t.size(0);
        cols = std::max<std::int64_t>(cols, t.dim() >= 2 ? t.size(1) : 1);
        first = false;
      }
      const std::string type = c10::toString(t.scalar_type());
      shapes = fnv(shapes, type.data(), type.size());
      for (const std::int64_t d : t.sizes()) shapes = fnv(shapes, &d, sizeof d);
      if (checksum) values = tensor_checksum(t, values ^ (0x9e3779b97f4a7c15ull * (i + 1)));
    }
  }
  const named_tensors& names = microbatches.empty() ? named_tensors{} : microbatches.front();
  const at::Tensor mine = at::tensor({static_cast<std::int64_t>(call), replica, rows, cols, given,
                                      static_cast<std::int64_t>(shapes), static_cast<std::int64_t>(values), count,
                                      static_cast<std::int64_t>(hash_text(options))},
                                     at::kLong);
  const at::Tensor all = world.all_gather(mine.unsqueeze(0), 0).contiguous();  // (world, width)
  const auto a = all.accessor<std::int64_t, 2>();
  const std::int64_t n = world.size();
  const std::vector<std::int64_t>& ranks = world.ranks();
  // "<text of rank i> on ranks ..., <other text> on ranks ..." over `who` (indices into the group).
  auto each = [&](const std::vector<std::int64_t>& who, auto text) {
    std::vector<std::string> v;
    std::vector<std::int64_t> r;
    for (std::int64_t i : who) v.push_back(text(i)), r.push_back(ranks[static_cast<std::size_t>(i)]);
    return by_value(v, r);
  };
  std::vector<std::int64_t> everyone(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) everyone[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = 1; i < n; ++i)
    if (a[i][0] != a[0][0])
      throw agreement_error("megadsl: the ranks are making different calls: " +
                            each(everyone, [&](std::int64_t r) { return std::string(call_name(a[r][0])); }) +
                            "; every rank must make the same calls in the same order");
  // The call's options, the same on every rank of the world (a temperature, a learning rate, a
  // micro-batch count that differs would give numbers that match no rank's, or a hang).
  if (all.select(1, 8).ne(a[0][8]).any().item<bool>())
    throw agreement_error("megadsl: the ranks made " + std::string(call_name(a[0][0])) + " with different options: " +
                          differing_fields(world, options) + "; every rank must make the same call with the same options");
  // The ranks of each replica, in order; the first disagreement found is reported.
  std::map<std::int64_t, std::vector<std::int64_t>> replicas;
  for (std::int64_t i = 0; i < n; ++i) replicas[a[0][1] < 0 ? -1 : a[i][1]].push_back(i);
  const std::string in = std::string(" in ") + call_name(a[0][0]);
  const std::string must = "; " + std::string(a[0][1] < 0 ? "every rank" : "every rank of a model replica (its tp, pp and ep ranks)") +
                           " must be given the same batch";
  for (const auto& [replica_id, members] : replicas) {
    auto differs = [&](std::int64_t j) {
      return std::any_of(members.begin(), members.end(), [&](std::int64_t i) { return a[i][j] != a[members[0]][j]; });
    };
    if (differs(7))
      throw agreement_error("megadsl: the ranks were given different numbers of micro-batches" + in + ": " +
                            each(members, [&](std::int64_t r) { return std::to_string(a[r][7]); }) + must);
    if (differs(2) || differs(3))
      throw agreement_error("megadsl: the ranks were given batches of different shapes" + in + ": " +
                            (names.empty() ? std::string("the batch") : names.front().first) + " is " +
                            each(members, [&](std::int64_t r) { return std::to_string(a[r][2]) + " x " + std::to_string(a[r][3]); }) +
                            must);
    if (differs(4) || differs(5))
      throw agreement_error("megadsl: the ranks were given batches with different fields or shapes" + in + ": " +
                            each(members,
                                 [&](std::int64_t r) {
                                   std::string fields;
                                   for (std::size_t k = 0; k < names.size() && k < 63; ++k)
                                     if ((a[r][4] >> k) & 1) fields += (fields.empty() ? "" : "+") + names[k].first;
                                   return "{" + fields + ", shapes " + hex(static_cast<std::uint64_t>(a[r][5])).substr(0, 8) + "}";
                                 }) +
                            must);
    if (differs(6))
      throw agreement_error("megadsl: the ranks were given different batches" + in + " (same shapes, other values): checksum " +
                            each(members, [&](std::int64_t r) { return hex(static_cast<std::uint64_t>(a[r][6])); }) + must +
                            " (model_options::batch_checksum = false turns this check off)");
  }
}

}  // namespace megadsl
