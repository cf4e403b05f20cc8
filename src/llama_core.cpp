// The per-rank Llama forward, once with tensor parallelism and once without (explicitly
// instantiated below). Activations are token-major (T, h); under SP each rank holds T/tp rows.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

#include "megadsl/layers/llama_layers.hpp"
#include "megadsl/layers/vocab_parallel.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/llama_model.hpp"
#include "megadsl/runtime/packing.hpp"
#include "megadsl/runtime/shard_io.hpp"

namespace megadsl::detail {
namespace {

std::uint64_t fnv1a(std::string_view s, std::uint64_t seed) {
  std::uint64_t h = 1469598103934665603ULL ^ seed;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

// The full HF tensor of `name`, the same on every rank and under every layout (DESIGN §13).
at::Tensor init_full(std::string_view hf_name, const dims& d, const model_options& o) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(fnv1a(hf_name, o.seed));
  const std::vector<std::int64_t> size = d.rank == 1 ? std::vector<std::int64_t>{d.rows}
                                                     : std::vector<std::int64_t>{d.rows, d.cols};
  const bool norm = hf_name.find("norm") != std::string_view::npos;
  const bool bias = hf_name.size() >= 4 && hf_name.substr(hf_name.size() - 4) == "bias";
  at::Tensor t;
  if (norm) t = o.test_init ? 1.0 + at::normal(0.0, 0.1, size, gen) : at::ones(size);
  else if (bias) t = o.test_init ? at::normal(0.0, o.init_std, size, gen) : at::zeros(size);
  else t = at::normal(0.0, o.init_std, size, gen);
  return t.to(o.dtype);
}

struct layer_weights {
  at::Tensor attn_norm, qkv, qkv_bias, o_proj, mlp_norm, gate_up, down;
};

template <bool Tp>
class llama_core final : public llama_core_base {
 public:
  llama_core(const runtime_config& c, parallel_groups& g) : cfg_(c), plans_(plan_params(c.s, c.l, c.head)) {
    if (c.l.pp.get() != 1)
      throw std::invalid_argument(
          "megadsl: this runtime runs pp = 1; pipeline stages and schedules are tracked in the pipeline issue");
    if constexpr (Tp) {
      tp_ = g.tp.get();
      tp_size_ = tp_->size();
      tp_rank_ = tp_->rank();
      if (tp_size_ != c.l.tp.get())
        throw std::invalid_argument("megadsl: the tp group has " + std::to_string(tp_size_) +
                                    " ranks but the layout says tp = " + std::to_string(c.l.tp.get()));
      sp_ = c.l.sp.get();
    }
    build_parameters();
  }

  const runtime_config& config() const override { return cfg_; }
  std::vector<named_parameter>& parameters() override { return params_; }

  void finalize_grads() override {
    if constexpr (Tp) {
      for (auto& p : params_) {
        if (!p.tensor.grad().defined()) continue;
        at::Tensor g = p.tensor.grad();
        if (p.sequence_parallel) tp_->all_reduce(g);
        if (p.plan->row->kind == shard_kind::fused_qkv && cfg_.s.kv_heads.get() < tp_size_) sum_kv_replicas(g);
      }
    }
  }

  model_output forward(const batch& b, const forward_options& o) override {
    const shape& s = cfg_.s;
    const packed_tokens pk = pack_tokens(b, cfg_.l.rmpad.get(), sp_ ? tp_size_ : 1, s.vocab.get());
    const std::int64_t tokens = pk.tokens;  // real tokens (T); pk.ids has T' >= T rows

    at::Tensor x = embed(pk.ids);  // (T'/tp or T', h)
    const at::Tensor inv_freq = rope_inv_freq(s, pk.max_position + 1);
    const rope_tables rope = rope_for_positions(inv_freq, pk.positions.narrow(0, 0, tokens), s);
    for (const layer_weights& w : layers_) x = decoder_layer(x, w, pk, rope);
    x = rms_norm(x, final_norm_, s.rms_eps);

    model_output out;
    if (cfg_.head.actor) {
      at::Tensor logits = column(x, lm_head_, {}).narrow(0, 0, tokens);  // (T, V'/tp)
      if (o.temperature != 1.0) logits = logits / o.temperature;
      const vocab_shard shard{tp_rank_ * lm_head_.size(0), s.vocab.get()};
      const logprob_entropy le = vocab_parallel_logprob_entropy(
          logits, pk.labels.narrow(0, 0, tokens), shard, tp_group(), o.entropy);
      const at::Tensor label_ok = pk.label_valid.narrow(0, 0, tokens);
      out.log_probs = pk.unpack(le.log_probs * label_ok);
      out.valid = pk.unpack(label_ok).to(at::kBool);
      if (o.entropy) out.entropy = pk.unpack(le.entropy);
      if (o.return_logits) {
        at::Tensor full = logits;
        if constexpr (Tp) full = gather_from_tp_last(logits, *tp_);
        out.logits = pk.unpack(full.narrow(1, 0, s.vocab.get()).to(at::kFloat));
      }
    } else {
      at::Tensor v = at::linear(x, value_w_, value_b_);  // (T'/tp or T', 1)
      if constexpr (Tp)
        if (sp_) v = gather_from_sp(v, *tp_, /*tensor_parallel_output_grad=*/false);
      out.values = pk.unpack(v.narrow(0, 0, tokens).squeeze(1).to(at::kFloat));
      out.valid = pk.unpack(at::ones({tokens}, at::kBool));
    }
    return out;
  }

 private:
  // With kv_heads < tp a kv head lives on tp / kv_heads ranks, each of which sees only the
  // gradient from its own query heads: the copies' k/v gradients are summed, so they stay equal.
  void sum_kv_replicas(at::Tensor& grad) {
    const std::int64_t d = qkv_.head_dim, kv_rows = qkv_.q_per_group * d;
    at::Tensor mine = grad.narrow(0, kv_rows, 2 * d);                            // (2d[, h]) k and v rows
    const at::Tensor all = tp_->all_gather(mine.contiguous().unsqueeze(0), 0);   // (tp, 2d[, h])
    const std::int64_t kv = cfg_.s.kv_heads.get(), my_head = tp_rank_ * kv / tp_size_;
    at::Tensor sum = at::zeros_like(mine);
    for (std::int64_t r = 0; r < tp_size_; ++r)
      if (r * kv / tp_size_ == my_head) sum += all[r];
    mine.copy_(sum);
  }

  const comm_group* tp_group() const {
    if constexpr (Tp) return tp_;
    return nullptr;
  }

  // Vocab-parallel embedding: rows outside this rank's range read as zero, then summed over tp.
  at::Tensor embed(const at::Tensor& ids) {
    const std::int64_t rows = embed_.size(0), start = tp_rank_ * rows;
    if constexpr (!Tp) return at::embedding(embed_, ids);
    else {
      const at::Tensor mine = (ids >= start) & (ids < start + rows);
      const at::Tensor local = at::embedding(embed_, (ids - start) * mine) * mine.unsqueeze(1);  // (T', h) partial
      return sp_ ? reduce_scatter_to_sp(local, *tp_) : reduce_from_tp(local, *tp_);
    }
  }

  // Column-parallel linear: its input is replicated (or gathered from SP shards) first.
  at::Tensor column(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    at::Tensor full = x;
    if constexpr (Tp) full = sp_ ? gather_from_sp(x, *tp_) : copy_to_tp(x, *tp_);
    return at::linear(full, w, b);
  }

  // Row-parallel linear: partial sums over tp, all-reduced (or reduce-scattered to SP shards).
  at::Tensor row(const at::Tensor& x, const at::Tensor& w) {
    at::Tensor y = at::linear(x, w);
    if constexpr (Tp) y = sp_ ? reduce_scatter_to_sp(y, *tp_) : reduce_from_tp(y, *tp_);
    return y;
  }

  at::Tensor decoder_layer(const at::Tensor& x, const layer_weights& w, const packed_tokens& pk,
                           const rope_tables& rope) {
    const shape& s = cfg_.s;
    const std::int64_t tokens = pk.tokens;
    const at::Tensor h = rms_norm(x, w.attn_norm, s.rms_eps);
    const at::Tensor qkv = column(h, w.qkv, w.qkv_bias).narrow(0, 0, tokens);  // (T, G*(Q+2)*d)
    const at::Tensor grouped = qkv.view({tokens, qkv_.groups, qkv_.q_per_group + 2, qkv_.head_dim});
    const at::Tensor q = apply_rope(grouped.narrow(2, 0, qkv_.q_per_group), rope);              // (T, G, Q, d)
    const at::Tensor k = apply_rope(grouped.select(2, qkv_.q_per_group), rope);                 // (T, G, d)
    const at::Tensor v = grouped.select(2, qkv_.q_per_group + 1);                               // (T, G, d)
    at::Tensor a = pk.rmpad ? attention_varlen(q, k, v, pk.cu_seqlens)
                            : attention_padded(q, k, v, pk.attention_mask, pk.batch, pk.seq);   // (T, G*Q*d)
    if (pk.ids.size(0) > tokens) a = at::constant_pad_nd(a, {0, 0, 0, pk.ids.size(0) - tokens});
    const at::Tensor after_attn = x + row(a, w.o_proj);
    const at::Tensor h2 = rms_norm(after_attn, w.mlp_norm, s.rms_eps);
    return after_attn + row(swiglu(column(h2, w.gate_up, {})), w.down);
  }

  void build_parameters() {
    const shape& s = cfg_.s;
    const layout& l = cfg_.l;
    qkv_ = qkv_layout(s, l, tp_rank_);
    layers_.resize(static_cast<std::size_t>(s.layers.get()));
    const bool sp = cfg_.l.sp.get();
    for (const param_plan& p : plans_) {
      const param_row& row = *p.row;
      const std::int64_t count = row.where == placement::layer ? s.layers.get() : 1;
      for (std::int64_t layer = 0; layer < count; ++layer) {
        std::vector<at::Tensor> hf;
        for (int i = 0; i < row.hf_count; ++i) {
          // A tied lm_head is the embedding: its initial values are the embedding's.
          const std::string_view source = p.tied ? std::string_view("model.embed_tokens.weight") : row.hf[static_cast<std::size_t>(i)];
          hf.push_back(init_full(with_layer(source, layer), p.hf_shapes[static_cast<std::size_t>(i)], cfg_.options));
        }
        at::Tensor t;
        if (p.tied) t = embed_;  // pp = 1: the very same tensor (one gradient)
        else t = shard_from_hf(p, s, l, tp_rank_, hf).set_requires_grad(true);
        bind(row.name, layer, t);
        if (!p.tied)
          params_.push_back({with_layer(row.name, layer), t, &p,
                             sp && row.kind == shard_kind::replicated});
      }
    }
  }

  void bind(std::string_view name, std::int64_t layer, const at::Tensor& t) {
    auto& w = layers_[static_cast<std::size_t>(layer)];
    if (name == "embed.weight") embed_ = t;
    else if (name == "layers.{layer}.attn_norm.weight") w.attn_norm = t;
    else if (name == "layers.{layer}.qkv.weight") w.qkv = t;
    else if (name == "layers.{layer}.qkv.bias") w.qkv_bias = t;
    else if (name == "layers.{layer}.o_proj.weight") w.o_proj = t;
    else if (name == "layers.{layer}.mlp_norm.weight") w.mlp_norm = t;
    else if (name == "layers.{layer}.gate_up.weight") w.gate_up = t;
    else if (name == "layers.{layer}.down.weight") w.down = t;
    else if (name == "final_norm.weight") final_norm_ = t;
    else if (name == "lm_head.weight") lm_head_ = t;
    else if (name == "value_head.weight") value_w_ = t;
    else if (name == "value_head.bias") value_b_ = t;
    else throw std::logic_error("megadsl: parameter table row without a binding: " + std::string(name));
  }

  runtime_config cfg_;
  param_list plans_;
  const comm_group* tp_ = nullptr;
  std::int64_t tp_size_ = 1, tp_rank_ = 0;
  bool sp_ = false;
  qkv_rank_layout qkv_{};
  at::Tensor embed_, final_norm_, lm_head_, value_w_, value_b_;
  std::vector<layer_weights> layers_;
  std::vector<named_parameter> params_;
};

}  // namespace

template <bool TensorParallel>
std::unique_ptr<llama_core_base> make_llama_core(const runtime_config& c, parallel_groups& g) {
  return std::make_unique<llama_core<TensorParallel>>(c, g);
}
template std::unique_ptr<llama_core_base> make_llama_core<true>(const runtime_config&, parallel_groups&);
template std::unique_ptr<llama_core_base> make_llama_core<false>(const runtime_config&, parallel_groups&);

}  // namespace megadsl::detail
