// The run-time side of a block (DESIGN decision 16): a module owns its bound parameters and runs
// its forward on a layer context. Each module class is compiled once, in its own source file
// (src/layers/), whatever the family, shape or layout. The block type names its factory
// (layers/blocks.hpp); the stage builds each layer by walking its kind's nodes of the architecture
// (layers/layer_plan.hpp), holds it as one module (its residual combinator, which holds the rest)
// and calls it once per layer: one virtual call, no switch over block kinds.
//
//   class my_block final : public layer_module {
//    public:
//     explicit my_block(const block_build& b) : w_(b.require("weight")), act_(b.child_as<layer_module>(0)) {}
//     at::Tensor forward(const at::Tensor& x, layer_context& c) override {
//       return c.row(at::gelu(c.column(x, w_)), ...);   // x: (T'/tp or T', h) token-major
//     }
//   };
//   std::unique_ptr<block_module> make_my_block(const block_build& b) { return std::make_unique<my_block>(b); }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "megadsl/architecture.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/parallel/comm.hpp"
#include "megadsl/shape.hpp"

namespace megadsl {

struct packed_tokens;
struct rope_tables;
struct model_options;
struct expert_load;
struct dropout_draw;
struct ring_tokens;
class lora_set;

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
  // A training step with dropout: its masks' keys and rates (layers/dropout.hpp); null otherwise.
  const dropout_draw* dropout = nullptr;
  // LoRA adapters on this rank's linears, applied by linear / column / row (layers/lora_linear.hpp); null: none.
  const lora_set* lora = nullptr;
  // Ring context parallelism (layout cp_comm ring): where each whole-stream token sits among the cp
  // ranks' shares (runtime/packing.hpp's cp_ring_split::places), for gather_from_cp; null otherwise.
  // `pk` is then this rank's load-balanced share and `rope` its rows' tables.
  const at::Tensor* cp_places = nullptr;
  // Ring context parallelism's attention: the ring (the cp group, or under a2a+ring the ranks at
  // this rank's place in every all-to-all group), the all-to-all group before it (a2a+ring: cp_a2a
  // consecutive cp ranks; null otherwise), and the ring's view of the rows this rank's queries are
  // (its share, or under a2a+ring its all-to-all group's shares end to end). Null off the ring.
  const comm_group* ring = nullptr;
  const comm_group* ring_a2a = nullptr;
  const ring_tokens* ring_rows = nullptr;

  [[nodiscard]] const packed_tokens& sequences() const { return whole != nullptr ? *whole : pk; }

  // A parameter as the blocks use it: cast to the compute dtype (a no-op without mixed precision).
  [[nodiscard]] at::Tensor w(const at::Tensor& p) const;
  // The whole token stream on every tp rank: gathered from SP shards, or copied into tp
  // (identity forward, gradient summed over tp). (T'/tp or T', n) -> (T', n).
  [[nodiscard]] at::Tensor to_tp(const at::Tensor& x) const;
  // Back from partial sums over tp: reduce-scattered to SP shards, or all-reduced.
  [[nodiscard]] at::Tensor from_tp(const at::Tensor& y) const;
  // x @ weight^T + bias on this rank's rows, in the layout's arithmetic (invariant or not).
  [[nodiscard]] at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Column-parallel linear: its input replicated (or gathered from SP shards) first.
  [[nodiscard]] at::Tensor column(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Row-parallel linear: partial sums reduced over tp; its bias added once after the reduction.
  [[nodiscard]] at::Tensor row(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Real tokens in the stream (T); the stream has T' >= T rows under SP.
  [[nodiscard]] std::int64_t tokens() const;
};

// Every block's run-time module: what a factory returns.
class block_module {
 public:
  virtual ~block_module() = default;
};

// A module on the residual stream: a sublayer, a layer, a residual combinator around others.
class layer_module : public block_module {
 public:
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

// Where a model's modules are built: its shape, layout and options, this rank's tp rank and experts.
struct layer_plan_args {
  const shape& s;
  const layout& l;
  const model_options& options;
  std::int64_t tp_rank = 0;
  std::int64_t first_expert = 0, experts_per_rank = 0;  // this ep rank's experts of a mixture
  // Where a router with an expert bias registers its load counts (the stage's, for the balancing
  // update in finalize_grads); null: nowhere (the bias is then never updated).
  std::vector<expert_load*>* expert_loads = nullptr;
};

// What a block's factory builds its module from: the layer's parameters (or the model's outside
// the layers), this rank's place, and the block's node of the architecture (its parameters'
// prefix, its setting, the blocks it wraps).
class block_build {
 public:
  block_build(const module_params& p, const layer_plan_args& a, const architecture& arch, int node)
      : params(p), args(a), arch_(arch), node_(arch.nodes[static_cast<std::size_t>(node)]), index_(node) {}
  const module_params& params;
  const layer_plan_args& args;

  [[nodiscard]] const shape& s() const { return args.s; }
  // The layer-local name of the block's parameter `local` ("attn_norm" + "weight").
  [[nodiscard]] std::string name(std::string_view local) const;
  [[nodiscard]] at::Tensor require(std::string_view local) const { return params.require(name(local)); }
  [[nodiscard]] at::Tensor find(std::string_view local) const { return params.find(name(local)); }
  // The block's constexpr knobs, as the type its module reads (blocks::attention_knobs, ...); a
  // block that handed its module other knobs (or none) is a logic error, said in one line.
  template <class T>
  [[nodiscard]] const T& knobs() const {
    if (node_.knobs.object == nullptr || node_.knobs.type != T::knobs_name) knobs_mismatch(T::knobs_name);
    return *static_cast<const T*>(node_.knobs.object);
  }
  // The value of a config.json key the composition's blocks declare (architecture.hpp's
  // config_setting): config.json's, or the key's default.
  [[nodiscard]] double setting(std::string_view key) const {
    if (s().arch == nullptr || setting_index(*s().arch, key) < 0) no_setting(key);
    return megadsl::setting(s(), key);
  }
  [[nodiscard]] int children() const { return node_.child_count; }
  // The block's node number in its architecture: the same on every rank (dropout's place).
  [[nodiscard]] int node() const { return index_; }
  // The module of the i-th block this one wraps.
  [[nodiscard]] std::unique_ptr<block_module> child(int i) const;
  // ... as the module class this block expects (a norm, a q/k norm); a mismatch is said in one line.
  template <class T>
  [[nodiscard]] std::unique_ptr<T> child_as(int i) const {
    std::unique_ptr<block_module> m = child(i);
    if (auto* t = dynamic_cast<T*>(m.get())) {
      m.release();
      return std::unique_ptr<T>(t);
    }
    throw std::logic_error(wrong_child(i));
  }

 private:
  [[nodiscard]] std::string wrong_child(int i) const;
  [[noreturn]] void knobs_mismatch(std::string_view wanted) const;
  [[noreturn]] void no_setting(std::string_view key) const;
  const architecture& arch_;
  const module_node& node_;
  int index_;
};

// Node `node` of `arch` as a module, with the blocks it wraps (layers/layer_plan.hpp).
std::unique_ptr<block_module> build_node(const module_params& p, const layer_plan_args& a, const architecture& arch, int node);

}  // namespace megadsl
