// Invariant arithmetic (layers/invariant.hpp). The forwards fix every summation order; the
// backwards are the plain ones (training is deterministic at a fixed layout either way).
#include "megadsl/layers/invariant.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "megadsl/parallel/comm.hpp"

namespace megadsl {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The intra-op threads at one for its lifetime: a single tile's GEMM outside a parallel region
// would otherwise take the BLAS's threads (and, for some shapes, split its inner dimension).
class one_thread {
 public:
  one_thread() : saved_(at::get_num_threads()) {
    if (saved_ != 1) at::set_num_threads(1);
  }
  ~one_thread() {
    if (saved_ != 1) at::set_num_threads(saved_);
  }
  one_thread(const one_thread&) = delete;
  one_thread& operator=(const one_thread&) = delete;

 private:
  int saved_;
};

// A copy of t's first `count` rows (of dim 0) in `size` rows, the rest zero.
at::Tensor zero_padded(const at::Tensor& t, std::int64_t first, std::int64_t count, std::int64_t size) {
  at::Tensor padded = at::zeros({size, t.size(1)}, t.options());
  padded.narrow(0, 0, count).copy_(t.narrow(0, first, count));
  return padded;
}

// The sum over `chunks` K-chunks c of x[:, c] @ w[:, c]^T (+ bias on chunk 0's product), in the
// pairwise tree (tree_sum), (T, N). In tiles of invariant_row_tile rows by invariant_col_tile
// output columns: each tile's chunk products are single-threaded GEMMs of that one fixed shape
// (inside a parallel region the BLAS runs on one thread), the last partial tile of rows or columns
// through a zero-padded copy, and the tree is summed within the tile. The column tiles matter
// because a rank's output width changes with tp (a column-parallel weight's rows): MKL takes
// another kernel, another summation order, for a narrow output (N <= 8 on AVX-512). x (T, K), w (N, K).
at::Tensor tiled_subtree(const at::Tensor& x, const at::Tensor& w, std::int64_t chunks, const at::Tensor& bias) {
  const std::int64_t rows = x.size(0), n = w.size(0), rt = invariant_row_tile, ct = invariant_col_tile;
  const std::int64_t row_tiles = (rows + rt - 1) / rt, col_tiles = (n + ct - 1) / ct, width = x.size(1) / chunks;
  const at::Tensor x_tail = rows % rt != 0 ? zero_padded(x, rows - rows % rt, rows % rt, rt) : at::Tensor();  // (rt, K)
  const at::Tensor w_tail = n % ct != 0 ? zero_padded(w, n - n % ct, n % ct, ct) : at::Tensor();              // (ct, K)
  at::Tensor out = at::empty({rows, n}, x.options());
  const auto one = [&](std::int64_t tile) {
    const std::int64_t t = tile / col_tiles, u = tile % col_tiles;
    const std::int64_t first = t * rt, count = std::min(rt, rows - first), col = u * ct, cols = std::min(ct, n - col);
    const at::Tensor xt = count < rt ? x_tail : x.narrow(0, first, rt);  // (rt, K)
    const at::Tensor wt = cols < ct ? w_tail : w.narrow(0, col, ct);     // (ct, K)
    const bool direct = chunks == 1 && count == rt && cols == ct && !bias.defined();
    at::Tensor products = direct ? out.narrow(0, first, rt).narrow(1, col, ct).unsqueeze(0) : at::empty({chunks, rt, ct}, x.options());
    for (std::int64_t c = 0; c < chunks; ++c) {
      at::Tensor o = products.select(0, c);
      at::mm_out(o, xt.narrow(1, c * width, width), wt.narrow(1, c * width, width).t());
    }
    if (direct) return;
    if (bias.defined()) products.select(0, 0).narrow(1, 0, cols).add_(bias.narrow(0, col, cols));
    out.narrow(0, first, count).narrow(1, col, cols).copy_(tree_sum(products).narrow(0, 0, count).narrow(1, 0, cols));
  };
  const std::int64_t tiles = row_tiles * col_tiles;
  if (tiles <= 1 || at::get_num_threads() == 1 || at::in_parallel_region()) {
    const one_thread single;
    for (std::int64_t t = 0; t < tiles; ++t) one(t);
  } else {
    at::parallel_for(0, tiles, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) one(t);
    });
  }
  return out;
}

// tiled_subtree on CUDA: cuBLAS picks its kernel, hence the summation order, by the operands'
// shapes, leading dimensions and alignment, so x and w are first copied chunk-major and padded to
// whole tiles, and every tile's every chunk is then one (rt, K / chunks) by (ct, K / chunks)^T
// product into a contiguous (rt, ct): the same call wherever the tile lies in the batch and whatever
// the rank's width (a chunk read in place would carry the rank's K as its leading dimension). One
// call at a time on the current stream.
at::Tensor tiled_subtree_cuda(const at::Tensor& x, const at::Tensor& w, std::int64_t chunks, const at::Tensor& bias) {
  const std::int64_t rows = x.size(0), n = w.size(0), rt = invariant_row_tile, ct = invariant_col_tile;
  const std::int64_t row_tiles = (rows + rt - 1) / rt, col_tiles = (n + ct - 1) / ct, width = x.size(1) / chunks;
  // Zero-padded to whole tiles, chunk-major: x (chunks, R, width), w (chunks, C, width).
  const auto chunk_major = [&](const at::Tensor& t, std::int64_t padded) {
    const at::Tensor whole = t.size(0) == padded ? t : at::constant_pad_nd(t, {0, 0, 0, padded - t.size(0)});
    return whole.reshape({padded, chunks, width}).transpose(0, 1).contiguous();
  };
  const at::Tensor xc = chunk_major(x, row_tiles * rt), wc = chunk_major(w, col_tiles * ct);
  at::Tensor out = at::empty({rows, n}, x.options());
  at::Tensor products = at::empty({chunks, rt, ct}, x.options());
  for (std::int64_t u = 0; u < col_tiles; ++u) {
    const std::int64_t col = u * ct, cols = std::min(ct, n - col);
    for (std::int64_t t = 0; t < row_tiles; ++t) {
      const std::int64_t first = t * rt, count = std::min(rt, rows - first);
      for (std::int64_t c = 0; c < chunks; ++c) {
        // Whole rows of the chunk-major copies: contiguous, leading dimension `width`, aligned to
        // a multiple of 128 rows.
        at::Tensor o = products.select(0, c);
        at::mm_out(o, xc.select(0, c).narrow(0, first, rt), wc.select(0, c).narrow(0, col, ct).t());
      }
      if (bias.defined()) products.select(0, 0).narrow(1, 0, cols).add_(bias.narrow(0, col, cols));
      out.narrow(0, first, count).narrow(1, col, cols).copy_(tree_sum(products).narrow(0, 0, count).narrow(1, 0, cols));
    }
  }
  return out;
}

// tiled_subtree with autograd; the backward is the plain linear's (x (T, K), w (N, K), bias (N)
// or empty: autograd functions take no undefined inputs).
struct subtree_linear_fn : torch::autograd::Function<subtree_linear_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                            std::int64_t chunks) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["bias"] = bias.numel() > 0;
    const at::Tensor b = bias.numel() > 0 ? bias : at::Tensor();
    return x.is_cuda() ? tiled_subtree_cuda(x, w, chunks, b) : tiled_subtree(x, w, chunks, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    return {g.mm(saved[1]), g.t().mm(saved[0]), ctx->saved_data["bias"].toBool() ? g.sum(0) : at::Tensor(), {}};
  }
};

// This rank's chunks' partial products (local, T, N), summed with the other ranks' in chunk order:
// the pairwise tree over all chunks, taken as a tree over this rank's (local is a power of two, its
// chunks adjacent: a subtree) and then a tree over the ranks' subtrees, so that one (T, N) per rank
// crosses the group.
at::Tensor chunk_sum(const at::Tensor& mine, const comm_group* tp, bool sp) {
  const at::Tensor subtree = tree_sum(mine);  // (T, N)
  if (tp == nullptr || tp->size() == 1) return subtree;
  if (!sp) return tree_sum(tp->all_gather(subtree.unsqueeze(0).contiguous(), 0));  // (t, T, N), rank-major
  const std::int64_t t = tp->size(), rows = subtree.size(0) / t, n = subtree.size(1);
  // Rank q gets rows [q rows, (q + 1) rows) of every rank's subtree, by source rank.
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(t), rows);
  return tree_sum(tp->all_to_all(subtree.contiguous(), counts, counts).view({t, rows, n}));
}

// chunk_sum with autograd: each part's gradient is the output's, whole (gathered under sp).
struct chunk_sum_fn : torch::autograd::Function<chunk_sum_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& parts, const comm_group* tp, bool sp) {
    ctx->saved_data["group"] = reinterpret_cast<std::int64_t>(tp);
    ctx->saved_data["sp"] = sp;
    ctx->saved_data["local"] = parts.size(0);
    return chunk_sum(parts, tp, sp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const comm_group* tp = reinterpret_cast<const comm_group*>(ctx->saved_data["group"].toInt());
    const at::Tensor g = tp != nullptr && ctx->saved_data["sp"].toBool() ? tp->all_gather(grads[0].contiguous(), 0) : grads[0];
    const std::int64_t local = ctx->saved_data["local"].toInt();
    std::vector<std::int64_t> shape = g.sizes().vec();
    shape.insert(shape.begin(), local);
    return {g.unsqueeze(0).expand(shape).contiguous(), {}, {}};
  }
};

thread_local bool invariant_on = false;

// body(first, count) for the blocks of a flattened tensor of n elements zero-padded to whole
// blocks, each on one thread.
void for_blocks(std::int64_t padded, const std::function<void(std::int64_t, std::int64_t)>& body) {
  const std::int64_t block = invariant_pointwise_block, blocks = padded / block;
  at::parallel_for(0, blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) body(i * block, block);
  });
}

// fn over x flattened, zero-padded to whole blocks, one block at a time.
at::Tensor blocked(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  const std::int64_t n = x.numel(), block = invariant_pointwise_block, padded = (n + block - 1) / block * block;
  const at::Tensor flat = at::constant_pad_nd(x.reshape({-1}), {0, padded - n});
  const at::Tensor first = fn(flat.narrow(0, 0, block));
  at::Tensor out = at::empty({padded}, first.options());
  out.narrow(0, 0, block).copy_(first);
  for_blocks(padded - block, [&](std::int64_t at, std::int64_t count) {
    out.narrow(0, block + at, count).copy_(fn(flat.narrow(0, block + at, count)));
  });
  return out.narrow(0, 0, n).view(x.sizes());
}

}  // namespace

invariant_scope::invariant_scope(bool on) : saved_(invariant_on) { invariant_on = on; }
invariant_scope::~invariant_scope() { invariant_on = saved_; }

// On CUDA an element-wise kernel computes every element by the same code, vectorised or not: where
// the element falls cannot choose its bits, so `pointwise` and `exp_in_place` are ATen's own there.
at::Tensor pointwise(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (!invariant_on || x.numel() == 0 || x.is_cuda()) return fn(x);
  at::Tensor fixed;
  {
    const at::NoGradGuard no_grad;
    fixed = blocked(x.detach(), fn);
  }
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return fixed;
  // fn's own graph for the backward, its output's values replaced by the blocked ones (a fresh
  // version counter: the graph's saved tensors are not invalidated).
  at::Tensor y = fn(x);
  const at::NoGradGuard no_grad;
  y.variable_data().copy_(fixed);
  return y;
}

void exp_in_place(at::Tensor& x) {
  if (!invariant_on || x.numel() == 0 || x.is_cuda()) {
    x.exp_();
    return;
  }
  TORCH_CHECK(x.is_contiguous(), "megadsl: exp_in_place takes a contiguous tensor");
  const std::int64_t n = x.numel(), block = invariant_pointwise_block, whole = n / block * block;
  at::Tensor flat = x.view({-1});
  for_blocks(whole, [&](std::int64_t at, std::int64_t count) { flat.narrow(0, at, count).exp_(); });
  if (whole == n) return;
  at::Tensor tail = at::zeros({block}, x.options());  // the last partial block through a whole one
  tail.narrow(0, 0, n - whole).copy_(flat.narrow(0, whole, n - whole));
  tail.exp_();
  flat.narrow(0, whole, n - whole).copy_(tail.narrow(0, 0, n - whole));
}

at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor flat = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  at::Tensor y = subtree_linear_fn::apply(flat, w, at::empty({0}, flat.options()), 1);
  if (b.defined()) y = y + b;
  if (x.dim() == 2) return y;
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return y.view(shape);
}

at::Tensor linear_in(bool invariant, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return invariant ? invariant_linear(x, w, b) : at::linear(x, w, b);
}

at::Tensor tree_sum(const at::Tensor& parts) {
  at::Tensor t = parts;
  while (t.size(0) > 1) {
    const std::int64_t n = t.size(0), pairs = n / 2;
    at::Tensor summed = t.narrow(0, 0, 2 * pairs).unflatten(0, {pairs, 2});
    summed = summed.select(1, 0) + summed.select(1, 1);  // (p0 + p1), (p2 + p3), ...
    t = n % 2 == 0 ? summed : at::cat({summed, t.narrow(0, n - 1, 1)}, 0);
  }
  return t.squeeze(0);
}

at::Tensor invariant_subtree_linear(const at::Tensor& x, const at::Tensor& w, std::int64_t chunks, const at::Tensor& bias) {
  TORCH_CHECK(x.size(-1) % chunks == 0, "megadsl: invariant arithmetic splits ", x.size(-1), " inputs in ", chunks, " chunks");
  return subtree_linear_fn::apply(x, w, bias.defined() ? bias : at::empty({0}, x.options()), chunks);  // (T, N)
}

at::Tensor invariant_chunk_sum(const at::Tensor& parts, const comm_group* tp, bool sp) {
  if (tp != nullptr && tp->size() == 1) tp = nullptr;
  return chunk_sum_fn::apply(parts, tp, sp && tp != nullptr);
}

at::Tensor invariant_row_linear(const at::Tensor& x, const at::Tensor& w, const comm_group* tp, bool sp) {
  const std::int64_t t = tp != nullptr ? tp->size() : 1, local = invariant_k_chunks / t;
  TORCH_CHECK(invariant_k_chunks % t == 0 && x.size(1) % local == 0, "megadsl: the invariant row-parallel linear splits ",
              x.size(1) * t, " inputs into ", invariant_k_chunks, " chunks over tp ", t);
  // This rank's subtree, then the ranks'; the backward is the plain row-parallel one.
  return invariant_chunk_sum(invariant_subtree_linear(x, w, local).unsqueeze(0), tp, sp);
}

}  // namespace megadsl
