// LoRA adapters at run time (issue 48): each adapted linear's A and B on this rank, applied by the
// layer context's linears (layer_context::linear, column, row) beside their base, so every block
// that reads its weights through them takes adapters without knowing of them.
//
// A rank holds its adapters in the pieces of its base's shard (runtime/shard_io.hpp's
// shard_pieces, the one description of how a shard maps to HF tensors):
//   pieces along the output (a column-parallel row, or a whole one): the rows of B (out, r) of
//       each piece, A (r, in) whole; the update s (x A^T) B_piece^T lands on the piece's output
//       columns, fused q/k/v interleaved per kv group and replicated kv heads included;
//   pieces along the input (a row-parallel row): the columns of A of each piece, B whole; the
//       update s (x_piece A_piece^T summed over the pieces) B^T is a partial sum over tp like the
//       base's product it is added to, and goes through the base's own reduction.
// The forward is a sum of plain linears (autograd's backward); adapters are fp32 and cast to the
// compute dtype as the base is.
//
// Training (the base frozen, the adapters the model's trainable parameters): the gradient of a
// column base's A, and of a row base's B, is a partial sum over tp (each rank saw its own output
// columns, or its own input columns); a replicated kv head's rows of B are summed over the ranks
// holding that head; the rest is whole on its rank. runtime/decoder_stage.cpp sums them so.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megadsl/lora.hpp"

namespace megadsl {

struct layer_context;
class comm_group;

// One HF module's adapter on this rank's shard of its base.
struct lora_shard {
  struct piece {
    std::int64_t local_offset = 0, extent = 0;  // the base shard's columns (output) or inputs it covers
    std::int64_t global_offset = 0;             // where they sit in the HF module (B's rows or A's columns)
    // A kv source with fewer heads than tp ranks: its head count (the ranks of one head sum its
    // gradient); 0: not replicated.
    std::int64_t replica_units = 0;
    bool main = true;  // this rank is the piece's main replica: counted in the norm, written when gathered
    at::Tensor part;   // B's rows (extent, r) or A's columns (r, extent)
  };
  std::string module;           // its HF module ("model.layers.3.self_attn.q_proj"; a mixture's experts:
                                // their fused parameter, "model.layers.3.mlp.experts.gate_up_proj"): errors name it
  bool along_output = true;     // pieces of B (output columns); false: pieces of A (input columns)
  double scaling = 1.0;         // PEFT's alpha / r (alpha / sqrt(r) under rsLoRA)
  double dropout = 0.0;         // lora_dropout on its input in training steps (layers/dropout.hpp)
  bool base_split = true;       // the base is split over tp (else whole on every tp rank)
  std::int64_t out = 0, in = 0; // the HF module's outputs and inputs: B is (out, r), A (r, in)
  at::Tensor whole;             // A (r, in) when along_output, else B (out, r)
  std::vector<piece> pieces;
  // A mixture's experts: this shard's expert of `experts` (PEFT stacks their adapters in one A and
  // B, lora.hpp), and the per-expert HF tensors of its layer's experts with the rows of B they
  // take (a merge writes each); a linear: -1, 0, none (its HF tensor is "<module>.weight").
  std::int64_t expert = -1, experts = 0;
  struct hf_part {
    std::string name;  // "model.layers.3.mlp.experts.{expert}.up_proj.weight"
    std::int64_t offset = 0, rows = 0;
  };
  std::vector<hf_part> hf_parts;
};

// The adapters of this rank's layers, by the base parameter they wrap (the tensor a block passes
// to layer_context::linear / row). A base with several adapted HF sources (megadsl's fused q/k/v
// adapting q_proj and v_proj) holds one shard per source.
class lora_set {
 public:
  explicit lora_set(const lora& settings = {}) : settings_(settings) {}
  void add(const at::Tensor& base, std::int64_t layer, lora_shard adapter);
  // The settings the adapters were made with (rank, alpha, targets: adapter_config.json's).
  [[nodiscard]] const lora& settings() const { return settings_; }
  // The adapters on `base` for training (nothing marked); null if none.
  std::vector<lora_shard>* adapters_of(const at::Tensor& base);
  // Off: the forwards skip the adapters (the base alone: verl's disable_adapter for the reference
  // policy's log-probs when it is the actor without its adapters). On by default.
  void set_enabled(bool on) { enabled_ = on; }
  [[nodiscard]] bool enabled() const { return enabled_; }
  // The adapters on `base`, null if none; marks them applied.
  const std::vector<lora_shard>* use(const at::Tensor& base) const;
  // Whether `base` has adapters (nothing marked).
  [[nodiscard]] bool adapts(const at::Tensor& base) const;
  // Computes every adapted HF module's whole A (r, in) and B (out, r) in fp32 from this rank's
  // shards (a mixture's experts: PEFT's stacked A (r E, in) and B (out, r E), every expert's), for
  // merged() and saving: a collective over `tp` and `ep` (null: one rank), every rank of them
  // calling with the same adapters. Called where they are merged or saved (they move in training).
  void gather_whole(const comm_group* tp, const comm_group* ep) const;
  // Every adapter tensor of this rank in training order (each base's adapters in the order added:
  // the whole matrix, then its pieces), the order of the model's trainable_parameters().
  [[nodiscard]] std::vector<at::Tensor> tensors() const;
  // The same adapters holding `values` (in tensors()' order, the same shapes) in their place: a
  // moment of AdamW shaped as the adapters, to gather or shard as they are.
  [[nodiscard]] std::shared_ptr<lora_set> with_tensors(const std::vector<at::Tensor>& values) const;
  // The whole (A, B) of `module` on this stage (a mixture's experts: stacked); null if it has none here.
  [[nodiscard]] std::pair<at::Tensor, at::Tensor> whole(const std::string& module) const;
  // The HF tensor `hf_name` ("<module>.weight") with its module's update merged: w + s B A in
  // fp32 (w as is when the module has no adapter here), from the last gather_whole.
  [[nodiscard]] at::Tensor merged(std::string_view hf_name, const at::Tensor& w) const;
  // Frees what gather_whole computed (every expert's adapters: large), once merged or saved.
  void release_whole() const { whole_.clear(); }
  // After layer `layer` ran a forward: throws std::logic_error naming an adapter of that layer
  // that its block did not apply (it reads that weight some other way), once per layer.
  void check_applied(std::int64_t layer) const;
  [[nodiscard]] std::size_t size() const { return count_; }
  [[nodiscard]] bool empty() const { return count_ == 0; }

 private:
  struct entry {
    std::vector<lora_shard> adapters;
    std::int64_t layer = 0;
    mutable bool applied = false;
  };
  struct whole_adapter {
    at::Tensor a, b;
    double scaling = 1.0;
    std::int64_t experts = 0;
  };
  struct expert_part {  // an expert's HF tensor: its module's stacked adapter, the expert, B's rows
    std::string module;
    std::int64_t expert = 0, offset = 0, rows = 0;
  };
  lora settings_;
  bool enabled_ = true;
  std::vector<entry> entries_;  // in the order added: the same on every rank of a stage
  std::unordered_map<const void*, std::size_t> by_base_;  // base TensorImpl -> entries_ index
  mutable std::unordered_map<std::string, whole_adapter> whole_;  // by HF module
  std::unordered_map<std::string, expert_part> expert_parts_;    // by per-expert HF tensor name
  mutable std::unordered_map<std::int64_t, bool> checked_;
  std::size_t count_ = 0;
};

// y (rows, n_local) of x (rows, in or in/tp) through a base with adapters, plus their updates:
// y + sum over adapters of s * (x A^T) B^T in their pieces (see above), in c's compute dtype.
at::Tensor with_lora(const at::Tensor& y, const at::Tensor& x, const std::vector<lora_shard>& adapters, const layer_context& c);

}  // namespace megadsl
