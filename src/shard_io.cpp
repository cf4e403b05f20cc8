#include "megadsl/runtime/shard_io.hpp"

#include <ATen/ATen.h>

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

at::Tensor shard_from_hf(const param_plan& p, const shape& s, const layout& l, std::int64_t tp_rank,
                         const std::vector<at::Tensor>& hf) {
  const param_row& row = *p.row;
  if (static_cast<int>(hf.size()) != row.hf_count)
    throw std::invalid_argument("megadsl: " + std::string(row.name) + " needs " + std::to_string(row.hf_count) + " HF tensors");
  for (int i = 0; i < row.hf_count; ++i) expect_shape(hf[static_cast<std::size_t>(i)], p.hf_shapes[static_cast<std::size_t>(i)], row.hf[static_cast<std::size_t>(i)]);
  const std::int64_t tp = l.tp;
  switch (row.kind) {
    case shard_kind::replicated:
      return hf[0].clone();
    case shard_kind::vocab: {
      const std::int64_t rows = p.local.rows;
      at::Tensor local = at::zeros({rows, p.local.cols}, hf[0].options());  // padded rows stay zero
      const std::int64_t begin = tp_rank * rows;
      const std::int64_t take = std::max<std::int64_t>(0, std::min(rows, hf[0].size(0) - begin));
      if (take > 0) local.narrow(0, 0, take).copy_(hf[0].narrow(0, begin, take));
      return local;
    }
    case shard_kind::row:
      return hf[0].chunk(tp, 1)[static_cast<std::size_t>(tp_rank)].contiguous();
    case shard_kind::column:
      return hf[0].chunk(tp, 0)[static_cast<std::size_t>(tp_rank)].contiguous();
    case shard_kind::fused_gate_up:
      return at::cat({hf[0].chunk(tp, 0)[static_cast<std::size_t>(tp_rank)],
                      hf[1].chunk(tp, 0)[static_cast<std::size_t>(tp_rank)]}, 0);
    case shard_kind::fused_qkv: {
      const qkv_rank_layout q = qkv_layout(s, l, tp_rank);
      const std::int64_t d = q.head_dim;
      std::vector<at::Tensor> parts;
      for (std::int64_t g = 0; g < q.groups; ++g) {
        const std::int64_t first_q = q.first_q_head + g * q.q_per_group, kv = q.first_kv_head + g;
        parts.push_back(hf[0].narrow(0, first_q * d, q.q_per_group * d));  // q heads of the group
        parts.push_back(hf[1].narrow(0, kv * d, d));                       // its k head
        parts.push_back(hf[2].narrow(0, kv * d, d));                       // its v head
      }
      return at::cat(parts, 0);
    }
  }
  throw std::logic_error("megadsl: unknown shard kind");
}

std::vector<at::Tensor> hf_from_shards(const param_plan& p, const shape& s, const layout& l,
                                       const std::vector<at::Tensor>& shards) {
  const param_row& row = *p.row;
  const std::int64_t tp = l.tp;
  if (row.kind == shard_kind::replicated && !shards.empty()) return {shards[0].clone()};
  if (static_cast<std::int64_t>(shards.size()) != tp)
    throw std::invalid_argument("megadsl: " + std::string(row.name) + " needs one shard per tp rank");
  switch (row.kind) {
    case shard_kind::replicated:
      return {shards[0].clone()};
    case shard_kind::vocab:
      return {at::cat(shards, 0).narrow(0, 0, s.vocab.get()).contiguous()};
    case shard_kind::row:
      return {at::cat(shards, 1)};
    case shard_kind::column:
      return {at::cat(shards, 0)};
    case shard_kind::fused_gate_up: {
      std::vector<at::Tensor> gates, ups;
      for (const auto& t : shards) {
        auto halves = t.chunk(2, 0);
        gates.push_back(halves[0]);
        ups.push_back(halves[1]);
      }
      return {at::cat(gates, 0), at::cat(ups, 0)};
    }
    case shard_kind::fused_qkv: {
      std::vector<at::Tensor> qs, ks, vs;
      for (std::int64_t r = 0; r < tp; ++r) {
        const qkv_rank_layout q = qkv_layout(s, l, r);
        const std::int64_t d = q.head_dim, block = (q.q_per_group + 2) * d;
        // With kv_heads < tp a kv head is replicated over tp/kv ranks: take it from the first.
        const bool owns_kv = s.kv_heads.get() >= tp || (r * s.kv_heads.get()) % tp == 0;
        const at::Tensor& t = shards[static_cast<std::size_t>(r)];
        for (std::int64_t g = 0; g < q.groups; ++g) {
          qs.push_back(t.narrow(0, g * block, q.q_per_group * d));
          if (owns_kv) {
            ks.push_back(t.narrow(0, g * block + q.q_per_group * d, d));
            vs.push_back(t.narrow(0, g * block + (q.q_per_group + 1) * d, d));
          }
        }
      }
      return {at::cat(qs, 0), at::cat(ks, 0), at::cat(vs, 0)};
    }
  }
  throw std::logic_error("megadsl: unknown shard kind");
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
