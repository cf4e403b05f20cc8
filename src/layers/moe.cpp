#include "megadsl/layers/moe.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "megadsl/layers/invariant.hpp"
#include "megadsl/layers/kernels.hpp"
#include "megadsl/blocks/routers.hpp"  // router_knobs
#include "megadsl/layers/block_modules.hpp"
#include "megadsl/parallel/mappings.hpp"

namespace megadsl {

namespace {
// The k weights divided by max(their sum, floor) (floor 0: by the sum).
at::Tensor renormalised(const at::Tensor& w, double floor) {
  const at::Tensor sum = w.sum(-1, /*keepdim=*/true);
  return w / (floor > 0 ? sum.clamp_min(floor) : sum);
}
}  // namespace

routing route(const at::Tensor& logits, std::int64_t top_k, bool renormalise, double floor) {
  TORCH_CHECK(top_k >= 1 && top_k <= logits.size(-1), "megadsl: route: top_k = ", top_k, " of ", logits.size(-1),
              " experts");
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);  // (T, E) fp32
  auto [weights, indices] = at::topk(probs, top_k, -1);          // (T, k) each, largest first
  if (renormalise) weights = renormalised(weights, floor);
  return {indices, weights};
}

at::Tensor softmax_weights(const at::Tensor& logits, const at::Tensor& indices, bool renormalise, double floor) {
  const at::Tensor w = at::softmax(logits, -1, at::kFloat).gather(1, indices);  // (T, k)
  return renormalise ? renormalised(w, floor) : w;
}

routing route_softmax_biased(const at::Tensor& logits, const at::Tensor& bias, std::int64_t top_k, double floor) {
  TORCH_CHECK(top_k >= 1 && top_k <= logits.size(-1), "megadsl: route_softmax_biased: top_k = ", top_k, " of ",
              logits.size(-1), " experts");
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);                              // (T, E) fp32
  const at::Tensor indices = std::get<1>((probs + bias.to(at::kFloat)).topk(top_k, -1));     // (T, k)
  return {indices, renormalised(probs.gather(1, indices), floor)};
}

routing route_sigmoid_grouped(const at::Tensor& logits, const at::Tensor& bias, std::int64_t top_k, std::int64_t groups,
                              std::int64_t group_top_k, bool renormalise, double scale) {
  const std::int64_t tokens = logits.size(0), experts = logits.size(1);
  TORCH_CHECK(groups >= 1 && experts % groups == 0 && top_k >= 1 && top_k <= group_top_k * (experts / groups),
              "megadsl: route_sigmoid_grouped: top_k = ", top_k, " from ", group_top_k, " of ", groups, " groups of ",
              experts, " experts");
  const at::Tensor scores = pointwise(logits.to(at::kFloat), [](const at::Tensor& t) { return at::sigmoid(t); });  // (T, E)
  at::Tensor choice = scores + bias.to(at::kFloat);              // (T, E): selects only
  if (groups > 1) {
    const at::Tensor by_group = choice.view({tokens, groups, experts / groups});           // (T, G, E/G)
    const at::Tensor group_scores = std::get<0>(by_group.topk(2, -1)).sum(-1);             // (T, G)
    const at::Tensor best = std::get<1>(group_scores.topk(group_top_k, -1, true, false));  // (T, kg)
    const at::Tensor keep = at::zeros_like(group_scores).scatter_(1, best, 1.0)
                                .unsqueeze(-1).expand({tokens, groups, experts / groups}).reshape({tokens, experts});
    choice = choice.masked_fill(keep.eq(0), -std::numeric_limits<float>::infinity());
  }
  const at::Tensor indices = std::get<1>(choice.topk(top_k, -1, true, false));  // (T, k)
  return {indices, sigmoid_weights(logits, indices, renormalise, scale)};
}

at::Tensor sigmoid_weights(const at::Tensor& logits, const at::Tensor& indices, bool renormalise, double scale) {
  at::Tensor w = pointwise(logits.to(at::kFloat), [](const at::Tensor& t) { return at::sigmoid(t); }).gather(1, indices);  // (T, k) fp32
  if (renormalise) w = w / (w.sum(-1, /*keepdim=*/true) + 1e-20);
  return w * scale;
}

routing route_sigmoid_on_input(const at::Tensor& logits, std::int64_t top_k) {
  TORCH_CHECK(top_k >= 1 && top_k <= logits.size(-1), "megadsl: route_sigmoid_on_input: top_k = ", top_k, " of ",
              logits.size(-1), " experts");
  const at::Tensor indices = std::get<1>(logits.topk(top_k, -1, true, false));  // (T, k)
  return {indices, sigmoid_weights(logits, indices, false, 1.0), /*on_input=*/true};
}

at::Tensor sigmoid_balance_probs(const at::Tensor& logits) {
  const at::Tensor s = logits.to(at::kFloat).sigmoid();
  return s / (s.sum(-1, /*keepdim=*/true) + 1e-20);
}

router_module::router_module(const block_build& b)
    : weight_(b.require("weight")), bias_(b.find("bias")), fp32_(b.knobs<blocks::router_knobs>().fp32),
      experts_(b.s().experts.get()), top_k_(b.s().top_k.get()), norm_topk_(b.s().norm_topk.get()) {
  if (const at::Tensor bias = b.find("expert_bias"); bias.defined()) {
    load_.bias = bias;
    load_.tokens = at::zeros({experts_}, bias.options().dtype(at::kDouble));
    if (b.args.expert_loads != nullptr) b.args.expert_loads->push_back(&load_);
  }
}

at::Tensor router_module::logits(const at::Tensor& x, const layer_context& c) const {
  if (fp32_) return linear_in(c.l.invariant.get(), x.to(at::kFloat), weight_.to(at::kFloat));  // (T, E) fp32
  return c.linear(x, weight_, bias_);
}

void update_expert_bias(expert_load& e, const at::Tensor& tokens, double rate) {
  at::NoGradGuard no_grad;
  const at::Tensor t = tokens.to(at::kDouble);
  const at::Tensor offset = t.mean() - t;  // (E): below the mean -> positive
  e.bias.add_((at::sign(offset) * rate).to(e.bias.scalar_type()));
  e.tokens.zero_();
}

namespace {

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

at::Tensor index_tensor(const std::vector<std::int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& x, const routing& r, const local_experts& e, activation_fn act,
                       const comm_group* ep) {
  const std::int64_t tokens = x.size(0), k = r.indices.size(1), hidden = x.size(1), experts = e.experts;
  const std::int64_t ranks = ep != nullptr ? ep->size() : 1, ep_rank = ep != nullptr ? ep->rank() : 0;
  TORCH_CHECK(experts > 0 && experts % ranks == 0, "megadsl: moe_experts: ", experts, " experts do not split over ep = ",
              ranks, " ranks");
  const std::int64_t per_rank = experts / ranks;
  const auto given = static_cast<std::int64_t>(e.gate_up.size());
  TORCH_CHECK(given == per_rank && static_cast<std::int64_t>(e.down.size()) == per_rank && e.first == ep_rank * per_rank,
              "megadsl: moe_experts: ep rank ", ep_rank, " holds experts [", ep_rank * per_rank, ", ",
              (ep_rank + 1) * per_rank, "), and was given ", given, " from ", e.first);
  TORCH_CHECK((e.gate_up_bias.empty() || static_cast<std::int64_t>(e.gate_up_bias.size()) == per_rank) &&
                  (e.down_bias.empty() || static_cast<std::int64_t>(e.down_bias.size()) == per_rank),
              "megadsl: moe_experts: expert biases must be given for every local expert or none");
  TORCH_CHECK(r.indices.size(0) == tokens, "megadsl: moe_experts: routing for ", r.indices.size(0), " tokens, ", tokens,
              " given");
  if (r.indices.numel() > 0) {
    const std::int64_t low = r.indices.min().item<std::int64_t>(), high = r.indices.max().item<std::int64_t>();
    TORCH_CHECK(low >= 0 && high < experts, "megadsl: moe_experts: the routing names expert ", low < 0 ? low : high,
                "; the layer has experts 0 to ", experts - 1, " (a routing recorded for another model?)");
  }

  // The assignments sorted by expert (stable: each expert's rows keep the token order).
  const at::Tensor flat = r.indices.reshape({-1});                    // (T k)
  const at::Tensor order = at::argsort(flat, /*stable=*/true, 0);     // (T k): assignment ids by expert
  // Each token once per slot, then permuted: a gather without repeated indices, so its backward is
  // a scatter without collisions (deterministic on CUDA too).
  const at::Tensor w = r.weights.reshape({tokens * k, 1}).to(x.scalar_type());  // (T k, 1)
  at::Tensor per_slot = x.unsqueeze(1).expand({tokens, k, hidden}).reshape({tokens * k, hidden});
  if (r.on_input) per_slot = per_slot * w;  // Llama 4: the expert sees the scaled token
  const at::Tensor rows = per_slot.index_select(0, order);

  // Rows per expert decide the splits: sent to each rank, and received from each rank for each of
  // this rank's experts (the counts go first, in their own all-to-all).
  const at::Tensor counts = at::bincount(flat, {}, experts).to(at::kLong);  // (E)
  std::vector<std::int64_t> send(static_cast<std::size_t>(ranks), 0), recv(static_cast<std::size_t>(ranks), 0);
  const std::vector<std::int64_t> mine = to_vector(counts);
  for (std::int64_t i = 0; i < experts; ++i) send[static_cast<std::size_t>(i / per_rank)] += mine[static_cast<std::size_t>(i)];
  std::vector<std::int64_t> from;  // (ranks, per_rank): rows from each source for each local expert
  if (ranks > 1) {
    const std::vector<std::int64_t> block(static_cast<std::size_t>(ranks), per_rank);
    from = to_vector(ep->all_to_all(counts.to(at::kCPU), block, block));
  } else {
    from = mine;
  }
  for (std::int64_t s = 0; s < ranks; ++s)
    for (std::int64_t j = 0; j < per_rank; ++j)
      recv[static_cast<std::size_t>(s)] += from[static_cast<std::size_t>(s * per_rank + j)];

  const at::Tensor arrived = ranks > 1 ? all_to_all_rows(rows, send, recv, *ep) : rows;  // by source, then expert

  // Regroup by local expert: expert j's rows from source 0, then from source 1, ...
  std::vector<std::int64_t> source_start(static_cast<std::size_t>(ranks), 0);
  for (std::int64_t s = 1; s < ranks; ++s)
    source_start[static_cast<std::size_t>(s)] = source_start[static_cast<std::size_t>(s - 1)] + recv[static_cast<std::size_t>(s - 1)];
  std::vector<std::int64_t> grouped_ids, expert_rows(static_cast<std::size_t>(per_rank), 0);
  grouped_ids.reserve(static_cast<std::size_t>(arrived.size(0)));
  for (std::int64_t j = 0; j < per_rank; ++j)
    for (std::int64_t s = 0; s < ranks; ++s) {
      std::int64_t start = source_start[static_cast<std::size_t>(s)];
      for (std::int64_t i = 0; i < j; ++i) start += from[static_cast<std::size_t>(s * per_rank + i)];
      const std::int64_t n = from[static_cast<std::size_t>(s * per_rank + j)];
      for (std::int64_t row = 0; row < n; ++row) grouped_ids.push_back(start + row);
      expert_rows[static_cast<std::size_t>(j)] += n;
    }
  const at::Tensor grouped_index = index_tensor(grouped_ids, x.device());
  const at::Tensor grouped = arrived.index_select(0, grouped_index);  // (R, h) by local expert

  // Each local expert's gated MLP on its rows.
  std::vector<at::Tensor> outputs;
  std::int64_t offset = 0;
  for (std::int64_t j = 0; j < per_rank; ++j) {
    const std::int64_t n = expert_rows[static_cast<std::size_t>(j)];
    const at::Tensor seg = grouped.narrow(0, offset, n);                              // (n, h)
    const auto jj = static_cast<std::size_t>(j);
    const at::Tensor up_bias = e.gate_up_bias.empty() ? at::Tensor() : e.gate_up_bias[jj].to(x.scalar_type());
    const at::Tensor down_bias = e.down_bias.empty() ? at::Tensor() : e.down_bias[jj].to(x.scalar_type());
    at::Tensor gate_up = linear_in(e.invariant, seg, e.gate_up[jj].to(x.scalar_type()), up_bias);  // (n, 2 f)
    if (e.adapt) gate_up = e.adapt(jj, false, seg, gate_up);
    const at::Tensor h = e.glu ? e.glu(gate_up) : gated(gate_up, act);                        // (n, f)
    if (e.chunks > 0) {  // (n, h): this rank's chunks' subtree
      outputs.push_back(invariant_subtree_linear(h, e.down[jj].to(x.scalar_type()), e.chunks, down_bias));
    } else {
      at::Tensor y = linear_in(e.invariant, h, e.down[jj].to(x.scalar_type()), down_bias);  // (n, h)
      outputs.push_back(e.adapt ? e.adapt(jj, true, h, y) : y);
    }
    offset += n;
  }
  at::Tensor computed = outputs.empty() ? grouped : at::cat(outputs, 0);  // (R, h)
  // Invariant arithmetic: the tp ranks' subtrees (they computed the same rows) summed whole.
  if (e.chunks > 0) computed = invariant_chunk_sum(computed.unsqueeze(0), e.chunk_group, false);

  // Back to arrival order, back to the sources, back to the assignments' order.
  const at::Tensor returned_here = computed.index_select(0, at::argsort(grouped_index));
  const at::Tensor returned = ranks > 1 ? all_to_all_rows(returned_here, recv, send, *ep) : returned_here;  // (T k, h) by expert
  const at::Tensor per_assignment = returned.index_select(0, at::argsort(order));  // (T k, h) as (t, slot)
  return (r.on_input ? per_assignment : per_assignment * w).view({tokens, k, hidden}).sum(1);  // (T, h)
}

namespace {

// (T, E) 0/1: expert e among token t's top k.
at::Tensor routing_map(const at::Tensor& indices, std::int64_t experts) {
  return at::zeros({indices.size(0), experts}, at::TensorOptions().dtype(at::kFloat).device(indices.device()))
      .scatter_(1, indices, 1.0);
}

struct attach_loss_fn : torch::autograd::Function<attach_loss_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& y, const at::Tensor& loss) {
    (void)loss;
    return y.view_as(y);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list grad) {
    return {grad[0], at::ones({}, grad[0].options().dtype(at::kFloat))};
  }
};

}  // namespace

at::Tensor switch_load_balancing_loss(const at::Tensor& probs, const at::Tensor& indices, const at::Tensor& valid) {
  const std::int64_t experts = probs.size(1), k = indices.size(1);
  const at::Tensor v = valid.to(at::kFloat).unsqueeze(1);                        // (T, 1)
  const double tokens = std::max(1.0, valid.sum().item<double>());
  const at::Tensor per_expert = (routing_map(indices, experts) * v).sum(0);      // (E) f_e, no gradient
  const at::Tensor mass = (probs * v).sum(0);                                    // (E) P_e
  return (mass * per_expert).sum() * (static_cast<double>(experts) / (static_cast<double>(k) * tokens * tokens));
}

at::Tensor sequence_load_balancing_loss(const at::Tensor& probs, const at::Tensor& indices, const at::Tensor& valid,
                                        const at::Tensor& sequence, std::int64_t sequences) {
  const std::int64_t experts = probs.size(1), k = indices.size(1);
  const at::Tensor v = valid.to(at::kFloat).unsqueeze(1);                                              // (T, 1)
  const at::Tensor zeros = at::zeros({sequences, experts}, probs.options());
  const at::Tensor counts = zeros.index_add(0, sequence, routing_map(indices, experts) * v);          // (S, E)
  const at::Tensor mass = zeros.index_add(0, sequence, probs * v);                                    // (S, E)
  const at::Tensor lengths = at::zeros({sequences}, probs.options()).index_add(0, sequence, v.squeeze(1));  // (S)
  const at::Tensor present = lengths > 0;
  const at::Tensor len = lengths.clamp_min(1).unsqueeze(1);
  // Megatron: cost = counts / (len k / E), P = mean over the sequence's tokens, sum over e, mean over sequences.
  const at::Tensor per_sequence = ((counts / (len * (static_cast<double>(k) / static_cast<double>(experts)))) * (mass / len)).sum(1);
  return (per_sequence * present).sum() / present.sum().clamp_min(1);
}

at::Tensor router_z_loss(const at::Tensor& logits, const at::Tensor& valid) {
  const at::Tensor v = valid.to(at::kFloat);
  return (at::logsumexp(logits.to(at::kFloat), -1).pow(2) * v).sum() / v.sum().clamp_min(1);
}

at::Tensor attach_loss(const at::Tensor& y, const at::Tensor& loss) { return attach_loss_fn::apply(y, loss); }

}  // namespace megadsl
