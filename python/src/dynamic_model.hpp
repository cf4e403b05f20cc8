// A model whose shape comes from an HF config.json and whose layout is chosen at run time: the
// `parallel_model<checkpoint_actor>` (or a critic; models/checkpoint_model.hpp) that `megadsl run` and
// `convert` build, behind one interface, with the process groups and the job it runs in. No
// Python here; model_bindings.cpp wraps it.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "megadsl/lora.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/trainer.hpp"

namespace megadsl::python {

struct hf_model_options {
  layout l;                // every field static
  head_info head;          // actor unless head.actor is false
  model_options options;   // dtype, compute dtype, device
  std::filesystem::path lora_adapter;  // a PEFT LoRA adapter directory applied in the forward; empty: none
  lora new_lora;                       // fresh adapters to train (rank 0: none); not with lora_adapter
};

class dynamic_model {
 public:
  // Builds the groups of `o.l` over `world` (checking the layout against config.json and the
  // world size first) and loads `dir` (an HF model directory or its config.json) on every rank.
  // The model is registered, so that close_all_models() can free it.
  static std::shared_ptr<dynamic_model> from_hf(std::shared_ptr<distributed> world, const std::filesystem::path& dir,
                                                const hf_model_options& o);
  virtual ~dynamic_model();
  dynamic_model(const dynamic_model&) = delete;
  dynamic_model& operator=(const dynamic_model&) = delete;

  // Each throws std::runtime_error once the model is closed.
  virtual model_output forward(const batch& b, const forward_options& o) = 0;
  // Each micro-batch's outputs; pipelined over the stages at pp > 1.
  virtual std::vector<model_output> forward(const std::vector<batch>& microbatches, const forward_options& o) = 0;
  virtual std::vector<named_parameter>& parameters() = 0;
  // What training updates: parameters(), or the LoRA adapters' tensors (parallel_model's).
  virtual std::vector<named_parameter>& trainable_parameters() = 0;
  virtual void finalize_grads() = 0;  // over dp too (after a backward of the caller's own)
  virtual double grad_norm() = 0;
  // A trainer of this model; it refers to the model, which must outlive it (and stay open).
  virtual std::unique_ptr<trainer> make_trainer(const optimizer_config& opt, const actor_loss_config& actor,
                                                const critic_loss_config& critic) = 0;
  // parallel_model's offload between phases (runtime/offload.hpp) and its device bytes.
  virtual void offload(bool params, bool grads) = 0;
  virtual void reload() = 0;
  virtual bool offloaded() = 0;
  virtual std::int64_t parameter_bytes() = 0;
  virtual std::int64_t gradient_bytes() = 0;
  // LoRA adapters on this rank's linears (runtime/lora_io.hpp); null: none. With them the base is
  // frozen and make_trainer's trainer updates the adapters.
  virtual void attach_lora(std::shared_ptr<lora_set> adapters) = 0;
  virtual const lora_set* lora() = 0;
  // The adapters in PEFT's format (runtime/lora_io.hpp's save_peft_adapter); refused without them.
  void save_lora(const std::filesystem::path& dir);
  // The adapters, whole, under PEFT's names, on every rank (a collective); refused without them.
  std::vector<std::pair<std::string, at::Tensor>> export_lora();

  // merge_lora: a LoRA adapter's updates merged into its bases' tensors (it refuses a model
  // without one).
  void save_hf(const std::filesystem::path& dir, at::ScalarType dtype, bool merge_lora = false);
  void save_distributed(const std::filesystem::path& dir, const trainer* t);
  void load_distributed(const std::filesystem::path& dir, trainer* t);

  // Frees the shards and the process groups (no collective); the job is left when the last model
  // and megadsl.init()'s hold on it are gone. Idempotent. The caller must not hold the GIL: a
  // Gloo worker may need it to drop a tensor that Python also refers to.
  void close();
  [[nodiscard]] bool closed() const { return groups_ == nullptr; }

  [[nodiscard]] const runtime_config& config() const { return config_; }  // also once closed
  [[nodiscard]] parallel_groups& groups();
  [[nodiscard]] std::int64_t rank() const { return rank_; }
  [[nodiscard]] std::int64_t world_size() const { return world_size_; }
  [[nodiscard]] rank_coords coords() const { return coords_; }
  [[nodiscard]] std::int64_t dp_size() const { return dp_size_; }
  [[nodiscard]] const hf_load_report& load_report() const { return report_; }
  [[nodiscard]] const std::string& model_type() const { return model_type_; }
  [[nodiscard]] const std::filesystem::path& source() const { return source_; }
  // The names the checkpoint it came from stores its tensors under (weight export sends those).
  [[nodiscard]] const hf_name_map& hf_names() const { return report_.names; }

 protected:
  dynamic_model(std::shared_ptr<distributed> world, const layout& l);
  virtual void free_model() = 0;  // the model, before its groups
  [[noreturn]] static void throw_closed();

  std::shared_ptr<distributed> world_;  // outlives the groups, which outlive the model
  std::unique_ptr<parallel_groups> groups_;
  runtime_config config_;
  std::int64_t rank_ = 0, world_size_ = 1, dp_size_ = 1;
  rank_coords coords_{};
  hf_load_report report_;
  std::string model_type_;
  std::filesystem::path source_;  // the HF directory from_hf loaded: save_hf never writes there
  std::filesystem::path carry_;   // the HF files (config.json, tokenizer) save_hf and save_distributed carry
};

// Closes every model from_hf built that is still alive (megadsl.shutdown() and exit). Call it
// without the GIL.
void close_all_models();

}  // namespace megadsl::python
