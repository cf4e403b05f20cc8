// The run-time side of a block (DESIGN decision 16): a module owns its bound parameters and runs
// its forward on a layer context. Each module class is compiled once, in its own source file
// (src/layers/), whatever the family, shape or layout; the stage holds a layer as one module (its
// residual combinator, which holds the rest) and calls it once per layer: one virtual call, no
// switch over block kinds.
//
//   class my_block final : public layer_module {
//    public:
//     explicit my_block(const module_params& p) : w_(p.require("my_block.weight")) {}
//     at::Tensor forward(const at::Tensor& x, layer_context& c) override {
//       return c.row(at::gelu(c.column(x, w_)), ...);   // x: (T'/tp or T', h) token-major
//     }
//   };
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "megadsl/layout.hpp"
#include "megadsl/parallel/comm.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

struct packed_tokens;
struct rope_tables;
struct model_options;

// One layer's parameters as the blocks bind them: by the local name of the row (the megadsl name
// without its `layers.{layer}.` prefix, experts with their global index: `experts.5.down.weight`).
class module_params {
 public:
  void add(std::string local_name, at::Tensor t) { tensors_[std::move(local_name)] = std::move(t); }
  // The tensor, or undefined when this model has no such row (an optional bias, say).
  [[nodiscard]] at::Tensor find(std::string_view local_name) const;
  // The tensor; a missing one is a bug in the block's rows: said with the layer and the name.
  [[nodiscard]] at::Tensor require(std::string_view local_name) const;
  std::int64_t layer = 0;

 private:
  std::map<std::string, at::Tensor, std::less<>> tensors_;
};

// What every block of a layer may add to the run beyond its output: the auxiliary losses (summed
// into a running total once per forward, not again in a recompute) and the routing of a mixture.
struct run_state {
  bool training = false;   // inside forward_backward: auxiliary losses apply
  bool rerun = false;      // the layer runs again in the backward (full recompute)
  double aux_scale = 1.0;  // the auxiliary losses' scale in this forward_backward
  at::Tensor aux_total;    // (1,) fp64: their sum so far (this rank's share)
};

// Everything a block's forward sees: the groups and sp, the micro-batch's tokens (padded or
// packed, with positions and cu_seqlens) and RoPE tables, the compute dtype, the layer.
struct layer_context {
  const shape& s;
  const layout& l;
  const model_options& options;
  const comm_group* tp = nullptr;  // null at tp = 1
  std::int64_t tp_size = 1, tp_rank = 0;
  bool sp = false;
  const comm_group* ep = nullptr;  // null at ep = 1
  at::ScalarType compute;
  const packed_tokens& pk;   // this rank's tokens (its cp share of the stream)
  const rope_tables& rope;   // RoPE at the positions of the whole stream (sequences())
  std::int64_t layer = 0;
  run_state& run;
  // A mixture of experts: the routing to replay (T, layers, k) (undefined: route live) and the
  // routing each layer took (T, layers, k), written as the layers run.
  const at::Tensor& replay;
  const at::Tensor& routed;
  // Context parallelism: the cp group (null at cp = 1) and the whole stream `pk` is a share of,
  // whose sequences the attention core runs over after its all-to-all (null: `pk` itself).
  const comm_group* cp = nullptr;
  const packed_tokens* whole = nullptr;

  [[nodiscard]] const packed_tokens& sequences() const { return whole != nullptr ? *whole : pk; }

  // A parameter as the blocks use it: cast to the compute dtype (a no-op without mixed precision).
  [[nodiscard]] at::Tensor w(const at::Tensor& p) const;
  // The whole token stream on every tp rank: gathered from SP shards, or copied into tp
  // (identity forward, gradient summed over tp). (T'/tp or T', n) -> (T', n).
  [[nodiscard]] at::Tensor to_tp(const at::Tensor& x) const;
  // Back from partial sums over tp: reduce-scattered to SP shards, or all-reduced.
  [[nodiscard]] at::Tensor from_tp(const at::Tensor& y) const;
  // Column-parallel linear: its input replicated (or gathered from SP shards) first.
  [[nodiscard]] at::Tensor column(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Row-parallel linear: partial sums reduced over tp; its bias added once after the reduction.
  [[nodiscard]] at::Tensor row(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Real tokens in the stream (T); the stream has T' >= T rows under SP.
  [[nodiscard]] std::int64_t tokens() const;
};

// A block's run-time module: a sublayer, a layer, a residual combinator around others.
class layer_module {
 public:
  virtual ~layer_module() = default;
  virtual at::Tensor forward(const at::Tensor& x, layer_context& c) = 0;
};

// A norm over the last dimension. Its weight step is separate from the normalisation, so that a
// block normalising over a width split across tp (OLMo2's full-width q/k norm) sums its squares
// over tp and then applies the same step.
class norm_module : public layer_module {
 public:
  // This norm's weight step on fp32 normalised values, cast to `dtype`.
  virtual at::Tensor apply_weight(const at::Tensor& normed, at::ScalarType dtype, const layer_context& c) const = 0;
};

// An activation of an MLP: a function compiled in its own block file.
using activation_fn = at::Tensor (*)(const at::Tensor&);

}  // namespace megadsl
