#include "megadsl/parallel/mappings.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace megadsl {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const comm_group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<const comm_group*>(ctx->saved_data["group"].toInt());
}
void keep_group(AutogradContext* ctx, const comm_group& g) {
  ctx->saved_data["group"] = reinterpret_cast<std::int64_t>(&g);
}

at::Tensor split(const at::Tensor& x, std::int64_t dim, const comm_group& g) {
  TORCH_CHECK(x.size(dim) % g.size() == 0, "megadsl: cannot split dim ", dim, " of size ", x.size(dim),
              " over the ", g.name(), " group of ", g.size(),
              " ranks; with sequence parallelism the token count must be padded to a multiple of tp");
  return x.chunk(g.size(), dim)[static_cast<std::size_t>(g.rank())].contiguous();
}

at::Tensor summed(const at::Tensor& x, const comm_group& g) {
  at::Tensor y = x.contiguous().clone();
  g.all_reduce(y);
  return y;
}

struct copy_to_fn : torch::autograd::Function<copy_to_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm_group* g) {
    keep_group(ctx, *g);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {summed(grad[0], group_of(ctx)), {}};
  }
};

struct reduce_from_fn : torch::autograd::Function<reduce_from_fn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const comm_group* g) { return summed(x, *g); }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], {}}; }
};

struct gather_last_fn : torch::autograd::Function<gather_last_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm_group* g) {
    keep_group(ctx, *g);
    return g->all_gather(x, x.dim() - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {split(grad[0], grad[0].dim() - 1, group_of(ctx)), {}};
  }
};

struct scatter_sp_fn : torch::autograd::Function<scatter_sp_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm_group* g) {
    keep_group(ctx, *g);
    return split(x, 0, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {group_of(ctx).all_gather(grad[0], 0), {}};
  }
};

struct gather_sp_fn : torch::autograd::Function<gather_sp_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm_group* g, bool tp_grad) {
    keep_group(ctx, *g);
    ctx->saved_data["tp_grad"] = tp_grad;
    return g->all_gather(x, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const comm_group& g = group_of(ctx);
    if (ctx->saved_data["tp_grad"].toBool()) return {g.reduce_scatter(grad[0], 0), {}, {}};
    return {split(grad[0], 0, g), {}, {}};
  }
};

struct reduce_scatter_sp_fn : torch::autograd::Function<reduce_scatter_sp_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm_group* g) {
    keep_group(ctx, *g);
    return g->reduce_scatter(x, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {group_of(ctx).all_gather(grad[0], 0), {}};
  }
};

struct all_to_all_fn : torch::autograd::Function<all_to_all_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<std::int64_t> send,
                            std::vector<std::int64_t> recv, const comm_group* g) {
    keep_group(ctx, *g);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return g->all_to_all(x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const std::vector<std::int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<std::int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {group_of(ctx).all_to_all(grad[0], recv, send), {}, {}, {}};
  }
};

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<std::int64_t>& send_rows,
                           const std::vector<std::int64_t>& recv_rows, const comm_group& g) {
  return g.size() == 1 ? x : all_to_all_fn::apply(x, send_rows, recv_rows, &g);
}

at::Tensor cp_tokens_to_heads(const at::Tensor& x, const comm_group& cp) {
  const std::int64_t n = cp.size(), rows = x.size(0), groups = x.size(1);
  if (n == 1) return x;
  TORCH_CHECK(groups % n == 0, "megadsl: ", groups, " head groups do not split over the cp group of ", n, " ranks");
  std::vector<std::int64_t> out_shape = x.sizes().vec();
  out_shape[0] = n * rows;
  out_shape[1] = groups / n;
  // Block j of the send buffer (rank j's share of the groups) holds this rank's rows: (n L, G/n ...).
  const at::Tensor send = x.reshape({rows, n, -1}).transpose(0, 1).reshape({n * rows, -1});
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), rows);
  return all_to_all_rows(send, counts, counts, cp).view(out_shape);  // from rank i: its rows, in rank order
}

at::Tensor cp_heads_to_tokens(const at::Tensor& y, const comm_group& cp) {
  const std::int64_t n = cp.size();
  if (n == 1) return y;
  TORCH_CHECK(y.size(0) % n == 0, "megadsl: ", y.size(0), " tokens do not split over the cp group of ", n, " ranks");
  const std::int64_t rows = y.size(0) / n;
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), rows);
  const at::Tensor got = all_to_all_rows(y.reshape({n * rows, -1}).contiguous(), counts, counts, cp);  // by source: its groups
  return got.view({n, rows, -1}).transpose(0, 1).reshape({rows, -1});
}

void cp_whole_stream_heads(const at::Tensor& grouped, at::Tensor& q, at::Tensor& k, at::Tensor& v,
                           std::int64_t tokens, const comm_group& cp) {
  const std::int64_t n = cp.size(), rows = q.size(0), groups = q.size(1), per_group = q.size(2), d = q.size(3);
  if (groups % n == 0) {
    const at::Tensor both = grouped.defined() ? grouped : at::cat({q, k.unsqueeze(2), v.unsqueeze(2)}, 2);
    const auto parts = cp_tokens_to_heads(both, cp).narrow(0, 0, tokens).split_with_sizes({per_group, 1, 1}, 2);
    q = parts[0];             // (T, G/cp, Q, d)
    k = parts[1].squeeze(2);  // (T, G/cp, d)
    v = parts[2].squeeze(2);
    return;
  }
  const std::int64_t share = groups * per_group / n, group = cp.rank() * share / per_group;
  q = cp_tokens_to_heads(q.reshape({rows, groups * per_group, d}), cp).narrow(0, 0, tokens).unsqueeze(1);  // (T, 1, share, d)
  const auto whole = [&](const at::Tensor& t) {  // (rows, G, d) -> (T, 1, d): this rank's group
    return gather_from_sp(t.contiguous(), cp).narrow(0, 0, tokens).narrow(1, group, 1);
  };
  k = whole(k);
  v = whole(v);
}

at::Tensor gather_from_cp(const at::Tensor& mine, std::int64_t rows, std::int64_t tokens, const comm_group& cp,
                          const at::Tensor& places) {
  std::vector<std::int64_t> pad(static_cast<std::size_t>(2 * mine.dim()), 0);
  pad.back() = rows - mine.size(0);  // dim 0's trailing padding: every rank sends `rows`
  const at::Tensor all = gather_from_sp(at::constant_pad_nd(mine, pad), cp, /*tensor_parallel_output_grad=*/false);
  return places.defined() ? all.index_select(0, places) : all.narrow(0, 0, tokens);
}

at::Tensor copy_to_tp(const at::Tensor& x, const comm_group& tp) {
  return tp.size() == 1 ? x : copy_to_fn::apply(x, &tp);
}
at::Tensor reduce_from_tp(const at::Tensor& x, const comm_group& tp) {
  return tp.size() == 1 ? x : reduce_from_fn::apply(x, &tp);
}
at::Tensor gather_from_tp_last(const at::Tensor& x, const comm_group& tp) {
  return tp.size() == 1 ? x : gather_last_fn::apply(x, &tp);
}
at::Tensor scatter_to_sp(const at::Tensor& x, const comm_group& tp) {
  return tp.size() == 1 ? x : scatter_sp_fn::apply(x, &tp);
}
at::Tensor gather_from_sp(const at::Tensor& x, const comm_group& tp, bool tensor_parallel_output_grad) {
  return tp.size() == 1 ? x : gather_sp_fn::apply(x, &tp, tensor_parallel_output_grad);
}
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, const comm_group& tp) {
  return tp.size() == 1 ? x : reduce_scatter_sp_fn::apply(x, &tp);
}

}  // namespace megadsl
