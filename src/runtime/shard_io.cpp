#include "megadsl/runtime/shard_io.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace megadsl {

std::string with_layer(std::string_view pattern, std::int64_t layer) {
  std::string out(pattern);
  const std::string key = "{layer}";
  for (auto pos = out.find(key); pos != std::string::npos; pos = out.find(key))
    out.replace(pos, key.size(), std::to_string(layer));
  return out;
}

std::string with_instance(std::string_view pattern, param_instance at) {
  std::string out = with_layer(pattern, at.layer);
  const std::string key = "{expert}";
  for (auto pos = out.find(key); pos != std::string::npos; pos = out.find(key))
    out.replace(pos, key.size(), std::to_string(at.expert));
  return out;
}

std::string hf_key(const param_row& row, int slot, param_instance at) {
  std::string out = with_instance(row.hf[static_cast<std::size_t>(slot)], at);
  if (row.stacking != hf_stacking::none) out += "[" + std::to_string(at.expert) + "]";
  return out;
}

at::Tensor expert_from_stack(const at::Tensor& stack, const param_row& row, std::int64_t expert) {
  at::Tensor t = stack.select(0, expert);  // (in, out) or (out)
  if (t.dim() == 2) t = t.t();             // (out, in)
  if (row.stacking == hf_stacking::experts_interleaved) {
    const std::int64_t n = t.size(0);       // rows g0, u0, g1, u1, ... -> [gate; up]
    t = at::cat({t.slice(0, 0, n, 2), t.slice(0, 1, n, 2)}, 0);
  }
  return t.contiguous();
}

at::Tensor stack_slice_of(const at::Tensor& linear, const param_row& row) {
  at::Tensor t = linear;  // (out, in) or (out)
  if (row.stacking == hf_stacking::experts_interleaved) {
    std::vector<std::int64_t> halves = t.sizes().vec();  // [gate; up] -> g0, u0, g1, u1, ...
    halves[0] /= 2;
    halves.insert(halves.begin(), 2);
    t = t.reshape(halves).transpose(0, 1).reshape(linear.sizes());
  }
  if (t.dim() == 2) t = t.t();  // (in, out)
  return t.contiguous();
}

std::vector<slot_share> slot_shares(const std::vector<std::int64_t>& slots, std::int64_t tp, std::int64_t rank) {
  std::vector<slot_share> out;
  std::int64_t global = 0;
  for (const std::int64_t rows : slots) {
    if (rows != 0) out.push_back({global + rank * (rows / tp), rows / tp});
    global += rows;
  }
  return out;
}

at::Tensor held_form(const param_row& row, const at::Tensor& stored) {
  switch (row.form) {
    case hf_form::scalar: return stored.reshape({1});
    case hf_form::conv: return stored.squeeze(1);
    case hf_form::one_row: return stored.squeeze(0);
    case hf_form::as_held: break;
  }
  return stored;
}

at::Tensor hf_stored_form(const param_row& row, const at::Tensor& held) {
  if (row.stacking != hf_stacking::none) return stack_slice_of(held, row);
  switch (row.form) {
    case hf_form::scalar: return held.reshape({});
    case hf_form::conv: return held.unsqueeze(1);
    case hf_form::one_row: return held.unsqueeze(0);
    case hf_form::as_held: break;
  }
  return held;
}

void merge_stacked(std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  // "name[e]" -> (base, e); any other name -> nullopt.
  const auto split = [](const std::string& n) -> std::optional<std::pair<std::string, std::int64_t>> {
    if (n.empty() || n.back() != ']') return std::nullopt;
    const auto open = n.rfind('[');
    if (open == std::string::npos || open + 2 > n.size() - 1) return std::nullopt;
    std::int64_t e = 0;
    for (std::size_t i = open + 1; i + 1 < n.size(); ++i) {
      if (n[i] < '0' || n[i] > '9') return std::nullopt;
      e = e * 10 + (n[i] - '0');
    }
    return std::pair{n.substr(0, open), e};
  };
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::map<std::string, std::vector<at::Tensor>> stacks;  // base -> slices by expert
  std::map<std::string, std::size_t> where;               // base -> its place in `out`
  for (auto& [name, t] : tensors) {
    const auto key = split(name);
    if (!key) {
      out.emplace_back(std::move(name), std::move(t));
      continue;
    }
    auto& slices = stacks[key->first];
    if (where.count(key->first) == 0) {
      where[key->first] = out.size();
      out.emplace_back(key->first, at::Tensor());
    }
    if (static_cast<std::int64_t>(slices.size()) <= key->second) slices.resize(static_cast<std::size_t>(key->second + 1));
    slices[static_cast<std::size_t>(key->second)] = std::move(t);
  }
  for (auto& [base, slices] : stacks) {
    for (std::size_t e = 0; e < slices.size(); ++e)
      if (!slices[e].defined())
        throw std::logic_error("megadsl: stacking " + base + ": expert " + std::to_string(e) + " is missing");
    out[where[base]].second = at::stack(slices, 0).contiguous();
  }
  tensors = std::move(out);
}

namespace {

void expect_shape(const at::Tensor& t, const dims& d, std::string_view what) {
  const bool ok = d.rank == 1 ? (t.dim() == 1 && t.size(0) == d.rows)
                              : (t.dim() == 2 && t.size(0) == d.rows && t.size(1) == d.cols);
  if (!ok) {
    std::string want = d.rank == 1 ? "(" + std::to_string(d.rows) + ")"
                                   : "(" + std::to_string(d.rows) + ", " + std::to_string(d.cols) + ")";
    throw std::invalid_argument("megadsl: " + std::string(what) + " has shape " + std::string(t.sizes().vec().empty() ? "()" : c10::str(t.sizes())) +
                                ", expected " + want);
  }
}

}  // namespace

std::vector<shard_piece> shard_pieces(const param_plan& p, const shape& s, const layout& l,
                                      std::int64_t tp_rank, piece_set which) {
  const param_row& row = *p.row;
  const row_geometry& g = p.geo;
  const bool main = which == piece_set::main_replica;
  std::vector<shard_piece> out;
  if (g.split < 0) {  // whole on every rank; tp rank 0's is the main replica
    if (main && tp_rank != 0) return out;
    std::int64_t local = 0;
    for (std::size_t i = 0; i < g.sources.size(); ++i)
      if (g.sources[i].units > 0) {
        out.push_back({static_cast<int>(i), 0, local, 0, g.sources[i].extent(), static_cast<int>(i)});
        local += g.sources[i].extent();
      }
  } else if (g.vocab) {
    if (main && p.tied) return out;  // the embedding's copy: the embedding is the main replica
    const std::int64_t rows = p.local.rows, begin = tp_rank * rows;
    const std::int64_t take = std::max<std::int64_t>(0, std::min(rows, p.hf_shapes[0].rows - begin));
    if (take > 0) out.push_back({0, 0, 0, begin, take});  // rows past the true vocab: padding
  } else {
    // Each source's units on this rank: its share, or its group's one replica (the main one on the
    // first rank of the group).
    const std::int64_t tp = l.tp;
    struct share {
      std::int64_t first = 0, count = 0;
      bool main = true;
    };
    std::array<share, 3> mine{};
    int last = 0;
    for (std::size_t i = 0; i < g.sources.size(); ++i) {
      const geometry_source& x = g.sources[i];
      if (x.units == 0) continue;
      last = static_cast<int>(i);
      if (x.replicated_when_fewer && x.units < tp) mine[i] = {tp_rank * x.units / tp, 1, (tp_rank * x.units) % tp == 0};
      else mine[i] = {tp_rank * (x.units / tp), x.units / tp, true};
    }
    // Grouped: per unit of the last source, each source's share of it ([q heads | k | v] per kv
    // group); else each source's whole share, side by side.
    const std::int64_t groups = g.grouped ? mine[static_cast<std::size_t>(last)].count : 1;
    std::int64_t local = 0;
    for (std::int64_t grp = 0; grp < groups; ++grp)
      for (std::size_t i = 0; i < g.sources.size(); ++i) {
        const geometry_source& x = g.sources[i];
        if (x.units == 0) continue;
        const std::int64_t n = mine[i].count / groups, rows = n * x.unit;
        if (!main || mine[i].main)
          out.push_back({static_cast<int>(i), g.split, local, (mine[i].first + grp * n) * x.unit, rows, static_cast<int>(i)});
        local += rows;
      }
  }
  // HF stores the sources as one tensor, concatenated in order (Phi-3's qkv_proj = [Q; K; V],
  // gate_up_proj = [gate; up], Qwen3.5's in_proj_qkv): the same pieces, at the source's offset in it.
  if (row.concatenated)
    for (shard_piece& x : out) {
      for (int i = 0; i < x.slot; ++i) x.global_offset += g.sources[static_cast<std::size_t>(i)].extent();
      x.slot = 0;
    }
  return out;
}

at::Tensor shard_from_hf(const param_plan& p, const shape& s, const layout& l, std::int64_t tp_rank,
                         const std::vector<at::Tensor>& hf) {
  const param_row& row = *p.row;
  if (static_cast<int>(hf.size()) != row.hf_count)
    throw std::invalid_argument("megadsl: " + std::string(row.name) + " needs " + std::to_string(row.hf_count) + " HF tensors");
  for (int i = 0; i < row.hf_count; ++i) expect_shape(hf[static_cast<std::size_t>(i)], p.hf_shapes[static_cast<std::size_t>(i)], row.hf[static_cast<std::size_t>(i)]);
  const std::vector<std::int64_t> size = p.local.rank == 1 ? std::vector<std::int64_t>{p.local.rows}
                                                           : std::vector<std::int64_t>{p.local.rows, p.local.cols};
  // A fused row's parts may be stored in different dtypes (a bf16 gate_proj beside an fp32 up_proj):
  // the shard takes the widest, so no part is rounded to another's precision.
  at::ScalarType dtype = hf[0].scalar_type();
  for (const at::Tensor& t : hf) dtype = at::promote_types(dtype, t.scalar_type());
  at::Tensor local = at::zeros(size, hf[0].options().dtype(dtype));  // vocab padding rows stay zero
  for (const shard_piece& x : shard_pieces(p, s, l, tp_rank, piece_set::all))
    local.narrow(x.dim, x.local_offset, x.extent)
        .copy_(hf[static_cast<std::size_t>(x.slot)].narrow(x.dim, x.global_offset, x.extent));
  return local;
}

std::vector<at::Tensor> hf_from_shards(const param_plan& p, const shape& s, const layout& l,
                                       const std::vector<at::Tensor>& shards) {
  const param_row& row = *p.row;
  const std::int64_t tp = l.tp;
  if (p.split_dim < 0 && !shards.empty()) return {shards[0].clone()};
  if (static_cast<std::int64_t>(shards.size()) != tp)
    throw std::invalid_argument("megadsl: " + std::string(row.name) + " needs one shard per tp rank");
  std::vector<at::Tensor> out;
  for (int i = 0; i < row.hf_count; ++i) {
    const dims& d = p.hf_shapes[static_cast<std::size_t>(i)];
    out.push_back(at::empty(d.rank == 1 ? std::vector<std::int64_t>{d.rows} : std::vector<std::int64_t>{d.rows, d.cols},
                            shards[0].options()));
  }
  // A tied copy has no main-replica pieces of its own; its values are the embedding's.
  param_plan untied = p;
  untied.tied = false;
  for (std::int64_t r = 0; r < tp; ++r)
    for (const shard_piece& x : shard_pieces(untied, s, l, r, piece_set::main_replica))
      out[static_cast<std::size_t>(x.slot)]
          .narrow(x.dim, x.global_offset, x.extent)
          .copy_(shards[static_cast<std::size_t>(r)].narrow(x.dim, x.local_offset, x.extent));
  return out;
}

std::vector<at::Tensor> gather_hf(const param_plan& p, const shape& s, const layout& l,
                                  const comm_group* tp, const at::Tensor& local) {
  if (p.split_dim < 0 || tp == nullptr || tp->size() == 1) {
    if (p.split_dim >= 0 && l.tp.get() != 1)
      throw std::invalid_argument("megadsl: gathering a tp-sharded parameter needs its tp group");
    return hf_from_shards(p, s, l, {local.detach()});
  }
  const at::Tensor all = tp->all_gather(local.detach().unsqueeze(0), 0);  // (tp, local...)
  return hf_from_shards(p, s, l, all.unbind(0));
}

}  // namespace megadsl
