#include "dynamic_model.hpp"

#include <ATen/ATen.h>

#include <mutex>

#include "megadsl/require_valid.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/checkpoint_model.hpp"
#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/lora_io.hpp"

namespace megadsl::python {
namespace {

namespace fs = std::filesystem;

template <class Spec>
class model_of final : public dynamic_model {
 public:
  model_of(std::shared_ptr<distributed> world, const shape& s, const hf_model_options& o)
      : dynamic_model(std::move(world), o.l),
        model_(std::make_unique<parallel_model<Spec>>(*groups_, o.options, s, o.l)) {
    config_ = model_->config();
  }
  ~model_of() override { model_.reset(); }

  model_output forward(const batch& b, const forward_options& o) override { return live().forward(b, o); }
  std::vector<model_output> forward(const std::vector<batch>& microbatches, const forward_options& o) override {
    return live().forward(microbatches, o);
  }
  std::vector<named_parameter>& parameters() override { return on_device("its parameters").parameters(); }
  std::vector<named_parameter>& trainable_parameters() override {
    return on_device("its parameters").trainable_parameters();
  }
  void finalize_grads() override { on_device("finalize_grads").finalize_grads(); }
  double grad_norm() override { return on_device("grad_norm").grad_norm(); }
  void offload(bool params, bool grads) override { live().offload(params, grads); }
  void reload() override { live().reload(); }
  bool offloaded() override { return live().offloaded(); }
  std::int64_t parameter_bytes() override { return live().parameter_bytes(); }
  std::int64_t gradient_bytes() override { return live().gradient_bytes(); }
  void attach_lora(std::shared_ptr<lora_set> adapters) override { live().attach_lora(std::move(adapters)); }
  const lora_set* lora() override { return live().lora(); }
  std::unique_ptr<trainer> make_trainer(const optimizer_config& opt, const actor_loss_config& actor,
                                        const critic_loss_config& critic) override {
    // megadsl::make_trainer's body; a trainer cannot be moved into a unique_ptr.
    parallel_model<Spec>& m = on_device("Model.trainer");
    // With LoRA adapters: the adapters (the base frozen).
    auto t = std::make_unique<trainer>(model_hooks_of(m), m.trainable_parameters(), *groups_, Spec::is_actor, opt, actor,
                                       critic);
    t->set_batch_checksum(m.config().options.batch_checksum);
    return t;
  }

 protected:
  void free_model() override { model_.reset(); }

 private:
  parallel_model<Spec>& live() {
    if (!model_) throw_closed();
    return *model_;
  }
  // The model, whose tensors are about to be read: refused while they are offloaded.
  parallel_model<Spec>& on_device(const char* what) {
    parallel_model<Spec>& m = live();
    if (m.offloaded())
      throw std::runtime_error(std::string("megadsl: ") + what + ": the model's parameters or gradients are offloaded to "
                               "host memory; call Model.reload() first");
    return m;
  }
  std::unique_ptr<parallel_model<Spec>> model_;
};

std::mutex registry_mutex;
std::vector<std::weak_ptr<dynamic_model>> registry;  // guarded by registry_mutex

}  // namespace

dynamic_model::dynamic_model(std::shared_ptr<distributed> world, const layout& l)
    : world_(std::move(world)), groups_(std::make_unique<parallel_groups>(parallel_groups::build(*world_, l))) {
  rank_ = world_->rank();
  world_size_ = world_->world();
  coords_ = groups_->me;
  dp_size_ = groups_->dp->size();
}

dynamic_model::~dynamic_model() { groups_.reset(); }

void dynamic_model::throw_closed() {
  throw std::runtime_error("megadsl: this Model is closed (Model.close(), megadsl.shutdown() or exit)");
}

parallel_groups& dynamic_model::groups() {
  if (!groups_) throw_closed();
  return *groups_;
}

void dynamic_model::close() {
  free_model();
  groups_.reset();
  world_.reset();
}

std::shared_ptr<dynamic_model> dynamic_model::from_hf(std::shared_ptr<distributed> world, const fs::path& path,
                                                      const hf_model_options& options) {
  const hf_config cfg = read_hf_config(path);
  hf_model_options o = options;
  o.options.attention_window = cfg.attention_window;  // applied on its layers
  if (!o.options.dropout_chosen) o.options.dropout = cfg.dropout;  // in training steps
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  // Every rule against config.json and the job's size, before any group is built: one message.
  require_valid(cfg.s, o.l, run_facts{.world = world->world()});
  // Weights present and readable, described by config.json, and fitting in memory: before allocating.
  check_before_load(dir, cfg.s, o.l, o.head, at::elementSize(o.options.dtype), local_world_size());
  std::shared_ptr<dynamic_model> m;
  m = with_checkpoint_model(o.head, [&](auto spec) -> std::shared_ptr<dynamic_model> {
    return std::make_shared<model_of<typename decltype(spec)::type>>(std::move(world), cfg.s, o);
  });
  m->model_type_ = cfg.model_type;
  m->source_ = dir;
  m->carry_ = dir;
  m->report_ = megadsl::load_hf(m->parameters(), m->config(), *m->groups_, dir);
  if (!o.lora_adapter.empty())
    m->attach_lora(load_peft_adapter(o.lora_adapter, m->config(), m->coords().tp, m->parameters(), m->hf_names()));
  else if (o.new_lora.enabled())
    m->attach_lora(new_adapters(o.new_lora, m->config(), m->coords().tp, m->parameters(), o.options.seed));
  std::lock_guard lock(registry_mutex);
  std::erase_if(registry, [](const std::weak_ptr<dynamic_model>& w) { return w.expired(); });
  registry.push_back(m);
  return m;
}

void close_all_models() {
  std::vector<std::shared_ptr<dynamic_model>> live;
  {
    std::lock_guard lock(registry_mutex);
    for (const auto& w : registry)
      if (auto m = w.lock()) live.push_back(std::move(m));
    registry.clear();
  }
  for (const auto& m : live) m->close();
}

void dynamic_model::save_hf(const fs::path& dir, at::ScalarType dtype, bool merge_lora) {
  if (closed()) throw_closed();
  if (merge_lora && lora() == nullptr)
    throw std::invalid_argument("megadsl: save_hf(merge_lora=True): this model carries no LoRA adapter (from_hf's lora_adapter=)");
  std::error_code ec;
  if (fs::exists(dir, ec) && fs::equivalent(dir, source_, ec))
    throw checkpoint_error("megadsl: save_hf: " + dir.string() +
                           " is the directory this model was loaded from (Model.from_hf), and saving would replace "
                           "its weights and every file megadsl does not write (README.md, ...); save to another "
                           "directory: the tokenizer files, generation_config.json and config.json's other fields "
                           "are copied there");
  megadsl::save_hf(parameters(), config(), groups(), dir, dtype, model_type_, carry_, merge_lora ? lora() : nullptr);
}

void dynamic_model::save_lora(const fs::path& dir) {
  if (closed()) throw_closed();
  if (lora() == nullptr)
    throw std::invalid_argument("megadsl: save_lora: this model carries no LoRA adapter (from_hf's lora_adapter= or lora_rank=)");
  save_peft_adapter(dir, *lora(), config(), groups(), hf_names());
}

std::vector<std::pair<std::string, at::Tensor>> dynamic_model::export_lora() {
  if (closed()) throw_closed();
  if (lora() == nullptr)
    throw std::invalid_argument("megadsl: export_lora: this model carries no LoRA adapter (from_hf's lora_adapter= or lora_rank=)");
  return gather_peft_adapter(*lora(), config(), groups(), hf_names());
}

void dynamic_model::save_distributed(const fs::path& dir, const trainer* t) {
  if (closed()) throw_closed();
  checkpoint_extras extras;
  extras.hf_files = carry_;
  if (t != nullptr) extras.training = t->export_state();
  save_model_checkpoint(parameters(), lora(), config(), groups(), dir, std::move(extras), hf_names());
}

void dynamic_model::load_distributed(const fs::path& dir, trainer* t) {
  if (closed()) throw_closed();
  checkpoint_extras extras = load_model_checkpoint(parameters(), const_cast<lora_set*>(lora()), config(), groups(), dir,
                                                   t != nullptr, hf_names());
  if (const fs::path files = hf_files_of(dir); !files.empty()) carry_ = files;  // what save_hf writes with them
  if (t == nullptr) return;
  if (!extras.training)
    throw checkpoint_error("megadsl: distributed checkpoint " + dir.string() +
                           " holds no training state; load it without a trainer, or save it with one");
  t->import_state(*extras.training);
}

}  // namespace megadsl::python
