// HF checkpoints in any layout: load_hf and save_hf (include/megadsl/runtime/hf_io.hpp). Over 600
// lines on purpose: loading and saving share the name mapping, the gathering over tp/pp/ep and the
// multimodal carry (one anonymous namespace).
#include "megadsl/runtime/hf_io.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "megadsl/hf_config.hpp"
#include "megadsl/io/atomic_file.hpp"
#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/io/printable.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/runtime/shard_io.hpp"
#include "megadsl/runtime/weight_export.hpp"
#include "checkpoint_dir.hpp"
#include "../spec/json_bounded.hpp"

namespace megadsl {
namespace {

// The HF names a parameter row reads for one layer (and expert).
std::vector<std::string> hf_names(const param_plan& p, param_instance at) {
  std::vector<std::string> out;
  if (p.tied) return {std::string(p.tied_source)};
  for (int i = 0; i < p.row->hf_count; ++i) out.push_back(with_instance(p.row->hf[static_cast<std::size_t>(i)], at));
  return out;
}

bool is_value_head_param(const named_parameter& p) { return p.plan->row->name.rfind("value_head.", 0) == 0; }

// Every HF name any rank of this model reads (to tell unexpected tensors from another head's).
std::set<std::string> expected_names(const runtime_config& c) {
  std::set<std::string> out;
  for (const param_plan& p : plan_params(c.s, c.l, c.head)) {
    if (p.tied || p.row->name.rfind("value_head.", 0) == 0) continue;
    for (std::int64_t i = 0; i < instances(*p.row, c.s); ++i)
      if (exists(*p.row, c.s, i))
        for (auto& n : hf_names(p, instance_of(*p.row, c.s, i))) out.insert(n);
  }
  return out;
}

std::string fail_prefix(const hf_checkpoint& ck) { return "megadsl: " + ck.dir().string() + ": "; }

// Which of the two multimodal forms (io/hf_name_map.hpp) `ck` stores its text model in: the one
// whose prefix holds tensors (transformers 5's when neither does: as_text_model then says so). A
// checkpoint with tensors under both holds two text models, and which transformers keeps depends
// on its key mapping's order: refused, naming both.
hf_name_map multimodal_names_in(const hf_checkpoint& ck) {
  const hf_name_map forms[] = {multimodal_names_v5(), multimodal_names_legacy()};
  std::size_t held[2] = {0, 0};
  for (const std::string& n : ck.names())
    for (std::size_t i = 0; i < 2; ++i)
      if (n.rfind(forms[i].prefixes.front().second, 0) == 0) ++held[i];
  if (held[0] > 0 && held[1] > 0)
    throw checkpoint_error(fail_prefix(ck) + "holds the text model twice, under " +
                           forms[0].prefixes.front().second + "* (" + std::to_string(held[0]) + " tensors) and " +
                           forms[1].prefixes.front().second + "* (" + std::to_string(held[1]) +
                           " tensors); which copy transformers keeps depends on its key mapping's order: keep one "
                           "prefix and remove the other copy");
  return held[1] > 0 ? forms[1] : forms[0];
}

// The checkpoint in `dir` under its text model's names; `names` gets where they are stored.
hf_checkpoint open_as_text_model(const std::filesystem::path& dir, const hf_config& cfg, hf_name_map* names = nullptr) {
  hf_checkpoint ck = hf_checkpoint::open(dir);
  if (cfg.wrapper.empty()) return ck;
  const hf_name_map m = multimodal_names_in(ck);
  ck.as_text_model(m);
  if (names != nullptr) *names = m;
  return ck;
}

// "model.visual.*, mtp.*": the top-level groups of tensors outside the text model, for notes.
std::string groups_of(const std::vector<std::string>& names) {
  std::set<std::string> groups;
  for (const std::string& n : names) {
    const std::size_t dot = n.find('.');
    const std::size_t second = dot == std::string::npos ? dot : n.find('.', dot + 1);
    const std::string_view first = std::string_view(n).substr(0, dot);
    groups.insert((first == "model" && second != std::string::npos ? n.substr(0, second) : std::string(first)) + ".*");
  }
  std::string out;
  for (const std::string& g : groups) out += (out.empty() ? "" : ", ") + printable(g);
  return out;
}

void copy_into(named_parameter& p, const at::Tensor& local) {
  c10::NoGradGuard no_grad;
  if (local.sizes() != p.tensor.sizes())
    throw checkpoint_error("megadsl: " + p.name + ": a shard of shape " + c10::str(local.sizes()) +
                           " does not fit the parameter's " + c10::str(p.tensor.sizes()));
  p.tensor.detach().copy_(local);
}

}  // namespace

namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when unknown (then nothing is refused on memory).
// Read by lines and strtod, not `in >> double`: in the Python module on the GPU image that
// extraction crashed (std::istream::_M_extract<double>, a libstdc++ mismatch with the process's).
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  constexpr std::string_view key = "MemAvailable:";
  while (std::getline(in, line))
    if (line.compare(0, key.size(), key) == 0) return std::strtod(line.c_str() + key.size(), nullptr) * 1024;
  return 0;
}

std::string shape_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The shape HF stores source `i` of a parameter in: a 0-dim scalar (xIELU's beta, held as (1)),
// every expert of the layer in one tensor (gpt-oss: (experts, in, out) or (experts, out)), or the
// plan's nn.Linear shape.
std::vector<std::int64_t> stored_shape(const param_plan& p, int i, const shape& s) {
  const stored_dims d = hf_stored_shape(p, i, s);
  return {d.size.begin(), d.size.begin() + d.rank};
}

}  // namespace

void check_before_load(const std::filesystem::path& dir, const shape& s, const layout& l, head_info head,
                       double bytes_per_parameter, std::int64_t local_ranks) {
  const std::string config = (dir / "config.json").string();
  const hf_config cfg = read_hf_config(dir);
  const hf_checkpoint ck = open_as_text_model(dir, cfg);
  // Sizes in double: a hostile config.json's products must not wrap around.
  const double h = static_cast<double>(s.hidden.get()), v = static_cast<double>(s.vocab.get());
  const double hd = static_cast<double>(effective_head_dim(s).get());
  const double q = static_cast<double>(s.heads.get()) * hd, kv = static_cast<double>(s.kv_heads.get()) * hd;
  const double f = static_cast<double>(s.ffn.get()), layers = static_cast<double>(s.layers.get());
  auto expect = [&](const std::string& name, std::vector<std::int64_t> want, const char* keys) {
    const tensor_info* t = ck.find(name);
    if (t == nullptr || t->shape == want) return;  // a missing tensor is load_hf's to name
    throw checkpoint_error("megadsl: " + config + ": its " + keys + " give " + name + " the shape " + shape_text(want) +
                           ", but " + ck.file_of(name).path().filename().string() + " holds " + shape_text(t->shape) +
                           "; this config.json does not describe these weights (use the checkpoint's own config.json)");
  };
  // Every HF tensor of the embedding and of layer 0, as the family's parameter rows bind them (the
  // shapes at tp 1 are HF's). Sizes beyond 2^40 are left to the memory check below: the plan's
  // integer products of them could overflow.
  const double limit = 1099511627776.0;
  if (h <= limit && v <= limit && q <= limit && kv <= limit && f <= limit) {
    for (const param_plan& p : plan_params(s, layout{}, head)) {
      if (p.tied || p.row->where == placement::last_stage) continue;  // heads: load_hf checks them
      for (int i = 0; i < p.row->hf_count; ++i)
        expect(with_instance(p.row->hf[static_cast<std::size_t>(i)], {}), stored_shape(p, i, s),
               "sizes (hidden_size, heads, head_dim, kv heads, intermediate_size, vocab_size, experts)");
    }
  }
  std::int64_t last = -1;
  const std::string layers_prefix(arch_of(s).hf_layers);
  const std::int64_t mtp = cfg.mtp_layers;  // stored after the decoder's, not loaded
  for (const std::string& n : ck.names())
    if (n.rfind(layers_prefix, 0) == 0) last = std::max<std::int64_t>(last, std::atoll(n.c_str() + layers_prefix.size()));
  if (last >= s.layers.get() && last - s.layers.get() < mtp) last = s.layers.get() - 1;  // (no overflow for a hostile count)
  if (last >= 0 && last + 1 != s.layers.get())
    throw checkpoint_error("megadsl: " + config + ": num_hidden_layers is " + std::to_string(s.layers.get()) +
                           ", but the weights hold layers 0.." + std::to_string(last) +
                           "; this config.json does not describe these weights (use the checkpoint's own config.json)");

  // An estimate in doubles from the architecture's facts (a plain MLP has two matrices, a gated
  // three; a mixture every expert, its router and shared expert), not the plan's integer products.
  const double mlp_matrices = has_geometry(s, &geo::ffn_rows<false>) ? 2 : 3;
  const bool moe = routes_any(s);
  const double experts = static_cast<double>(s.experts.get());
  const double mlp = moe ? experts * (h + 3 * h * static_cast<double>(expert_ffn_of(s).get())) +
                               (has_shared_expert(s) ? 3 * h * static_cast<double>(s.shared_expert_ffn.get()) + h : 0)
                         : mlp_matrices * h * f;
  const double per_layer = h * (q + 2 * kv) + q * h + mlp + 2 * h + (s.qkv_bias.get() ? q + 2 * kv : 0);
  const double head_params = head.actor ? (s.tie_embeddings.get() ? 0 : v * h) : h + 1;
  const double params = v * h + layers * per_layer + h + head_params;
  const double split = static_cast<double>(l.tp.get() * l.pp.get());  // (experts over ep not counted: an upper bound)
  const double need = params / split * bytes_per_parameter * static_cast<double>(std::max<std::int64_t>(local_ranks, 1));
  const double have = available_memory();
  const double one_rank = params / split * bytes_per_parameter;
  if (have > 0 && need > have && one_rank <= have) {
    // The model fits one rank: the number of ranks on this machine is what does not fit.
    std::ostringstream m;
    m.precision(1);
    m << std::fixed << "megadsl: " << local_ranks << " ranks on this machine (--ranks, or LOCAL_WORLD_SIZE under a "
      << "launcher) would each hold " << one_rank / (1ull << 30) << " GiB of " << config << "'s model (tp "
      << l.tp.get() << " x pp " << l.pp.get() << ", " << bytes_per_parameter << " bytes per parameter), "
      << need / (1ull << 30) << " GiB in all, more than the " << have / (1ull << 30) << " GiB available; start at most "
      << static_cast<long long>(have / one_rank) << " ranks here";
    throw checkpoint_error(m.str());
  }
  if (have > 0 && need > have) {
    std::ostringstream m;
    m.precision(1);
    m << std::fixed << "megadsl: " << config << ": the model it describes has " << params / 1e9
      << " B parameters; the " << std::max<std::int64_t>(local_ranks, 1) << " rank(s) on this machine would hold "
      << need / (1ull << 30) << " GiB of them (tp " << l.tp.get() << " x pp " << l.pp.get() << ", "
      << bytes_per_parameter << " bytes each), more than the " << have / (1ull << 30)
      << " GiB available; check hidden_size, num_hidden_layers, intermediate_size and vocab_size, or spread the "
         "model over more machines (tp, pp)";
    throw checkpoint_error(m.str());
  }
}

namespace {

// Buffers that older exports saved beside the parameters and that transformers 5 does not read:
// RoPE's inverse frequencies, and GPT-NeoX's causal mask and its fill value (Pythia's checkpoints
// hold `attention.bias`, a lower-triangular (1, 1, P, P) bool, and `attention.masked_bias`). The
// mask they held is always the causal one every attention here applies, so they change nothing.
bool is_stale_buffer(std::string_view n) {
  const auto ends_with = [&](std::string_view suffix) {
    return n.size() >= suffix.size() && n.substr(n.size() - suffix.size()) == suffix;
  };
  if (ends_with(".rotary_emb.inv_freq")) return true;
  return n.rfind("gpt_neox.layers.", 0) == 0 && (ends_with(".attention.bias") || ends_with(".attention.masked_bias"));
}

// A tied actor reads its LM head from the embedding. A checkpoint that says the two are tied but
// also stores an LM head with other values is ambiguous: transformers 5 keeps the stored head
// (untied, with a warning), a tied model would drop it, and the log-probs differ. Refused, naming
// both tensors. Every rank compares the whole tensors, so every rank refuses alike.
void refuse_untied_head(const hf_checkpoint& ck, const runtime_config& c, const std::filesystem::path& config) {
  if (!c.s.tie_embeddings.get()) return;
  for (const param_plan& p : plan_params(c.s, c.l, c.head)) {
    if (!p.tied) continue;
    const std::string head = with_instance(p.row->hf[0], {}), embedding(p.tied_source);
    if (ck.find(head) == nullptr || ck.find(embedding) == nullptr) return;
    const at::Tensor e = ck.view(embedding), h = ck.view(head);
    if (e.sizes() == h.sizes() && at::equal(e, h.to(e.scalar_type()))) return;  // a stored copy of the tie
    throw checkpoint_error(fail_prefix(ck) + "tie_word_embeddings is true in " + config.string() + ", but " +
                           ck.file_of(head).path().filename().string() + " holds a " + head + " " +
                           c10::str(h.sizes()) + " that differs from " + embedding + " " + c10::str(e.sizes()) +
                           "; transformers would use the stored head, a tied model the embedding: set "
                           "tie_word_embeddings to false to use " + head + ", or remove it from the checkpoint to tie");
  }
}

}  // namespace

hf_load_report load_hf(std::vector<named_parameter>& params, const runtime_config& c,
                       const parallel_groups& g, const std::filesystem::path& dir) {
  hf_load_report report;
  const hf_config cfg = read_hf_config(dir);
  if (const auto diff = mismatches(c.s, cfg.s, cfg.file.string()); !diff.empty()) {
    std::ostringstream os;
    os << "megadsl: " << cfg.file.string() << " disagrees with the model: ";
    for (std::size_t i = 0; i < diff.size(); ++i) os << (i ? "; " : "") << diff[i];
    throw checkpoint_error(os.str());
  }
  if (cfg.attention_window != c.options.attention_window)
    throw checkpoint_error("megadsl: " + cfg.file.string() + " has " + describe(cfg.attention_window) +
                           " (sliding_window, layer_types) but the model was built with " +
                           describe(c.options.attention_window) +
                           "; build it with model_options::attention_window = hf_config::attention_window");
  if (cfg.dropout != c.options.dropout && !c.options.dropout_chosen)
    throw checkpoint_error("megadsl: " + cfg.file.string() + " trains with " + describe(cfg.dropout) +
                           " but the model was built with " + describe(c.options.dropout) +
                           "; build it with model_options::dropout = hf_config::dropout, or set "
                           "model_options::dropout_chosen to train at the model's rates (0: without dropout)");
  const hf_checkpoint ck = open_as_text_model(dir, cfg, &report.names);
  const std::int64_t tp_rank = g.tp->rank();
  // (Not in report.ignored: an HF checkpoint saved from this directory carries them.)
  if (!ck.outside().empty())
    report.notes.push_back(std::to_string(ck.outside().size()) + " tensor(s) outside the text model (" + groups_of(ck.outside()) +
                           ") not loaded: megadsl trains the text model of this " + cfg.wrapper +
                           " checkpoint; an HF checkpoint saved with this directory as carry_from copies them, "
                           "a distributed checkpoint does not hold them");

  // Unexpected tensors: not this model's, not another head's, not a stale buffer.
  const std::set<std::string> expected = expected_names(c);
  std::vector<std::string> unexpected;
  // The multi-token-prediction layers after the decoder's (DeepSeek-V3, GLM-4.5): not run here,
  // not loaded by transformers either.
  const std::string layers_prefix(arch_of(c.s).hf_layers);
  const auto mtp_layer = [&](const std::string& n) {
    if (cfg.mtp_layers == 0 || n.rfind(layers_prefix, 0) != 0) return false;
    const char* at = n.c_str() + layers_prefix.size();
    char* end = nullptr;
    const long long i = std::strtoll(at, &end, 10);
    return end != at && *end == '.' && i >= c.s.layers.get() && i - c.s.layers.get() < cfg.mtp_layers;
  };
  std::int64_t mtp_tensors = 0;
  for (const std::string& n : ck.names()) {
    if (expected.count(n) != 0) continue;
    if (mtp_layer(n) || (!cfg.ignored_tensors.empty() && n.find(cfg.ignored_tensors) != std::string::npos)) {
      report.ignored.push_back(n);
      ++mtp_tensors;
      continue;
    }
    const bool head = n.rfind("lm_head.", 0) == 0 || n.rfind("score.", 0) == 0 || n.rfind("v_head.", 0) == 0 ||
                      n.rfind("value_head.", 0) == 0 || n.rfind("reward_head.", 0) == 0 ||
                      n.rfind("embed_out.", 0) == 0 || n.rfind("classifier.", 0) == 0;
    if (head || is_stale_buffer(n)) report.ignored.push_back(n);
    else unexpected.push_back(n);
  }
  if (mtp_tensors > 0)
    report.notes.push_back(std::to_string(mtp_tensors) + " tensor(s) of the multi-token-prediction layer(s) " +
                           (cfg.mtp_layers > 0 ? layers_prefix + std::to_string(c.s.layers.get()) + (cfg.mtp_layers > 1 ? " on" : "")
                                               : "(names with \"" + std::string(cfg.ignored_tensors) + "\")") +
                           " not loaded: megadsl trains the decoder's layers only, as transformers loads them");
  for (const std::string& n : unexpected)
    if (n.ends_with("_blocks") || n.ends_with("_scales"))
      throw checkpoint_error(fail_prefix(ck) + "tensor " + printable(n) +
                             " is a quantised weight (MXFP4 blocks and scales, as gpt-oss is published); megadsl trains "
                             "bf16 or fp32 weights: dequantize the checkpoint first (transformers: from_pretrained with "
                             "quantization_config=Mxfp4Config(dequantize=True), then save_pretrained)");
  if (!unexpected.empty()) {
    std::ostringstream os;
    os << fail_prefix(ck) << unexpected.size() << " unexpected tensor(s) for this " << (c.head.actor ? "actor" : "critic")
       << " (layers " << c.s.layers.get() << "): ";
    for (std::size_t i = 0; i < std::min<std::size_t>(unexpected.size(), 5); ++i) os << (i ? ", " : "") << printable(unexpected[i]);
    os << "; is it a checkpoint of another model?";
    throw checkpoint_error(os.str());
  }

  if (c.head.actor) refuse_untied_head(ck, c, cfg.file);

  // The critic's value head: the first source that exists (DESIGN §7).
  std::string value_prefix;
  for (std::string_view prefix : value_head_sources) {
    const std::string w = std::string(prefix) + ".weight";
    if (const tensor_info* t = ck.find(w); t != nullptr && t->shape.size() == 2 && t->shape[0] == 1 &&
                                           t->shape[1] == c.s.hidden.get()) {
      value_prefix = prefix;
      break;
    }
  }
  if (!c.head.actor) {
    if (value_prefix.empty())
      report.notes.push_back("value head initialised: the checkpoint has none of score.weight, v_head.weight, "
                             "value_head.weight, reward_head.weight or an lm_head.weight of shape (1, " +
                             std::to_string(c.s.hidden.get()) + ")");
    else
      report.notes.push_back("value head loaded from " + value_prefix + ".*");
  }

  for (named_parameter& p : params) {
    std::vector<std::string> names = hf_names(*p.plan, p.at);
    if (is_value_head_param(p)) {
      if (value_prefix.empty()) continue;  // keeps its initialisation (reported)
      const bool bias = p.plan->row->name == "value_head.bias";
      const std::string n = value_prefix + (bias ? ".bias" : ".weight");
      if (bias && ck.find(n) == nullptr) {
        c10::NoGradGuard no_grad;
        p.tensor.detach().zero_();
        report.notes.push_back("value head bias: " + n + " is not in the checkpoint; set to 0");
        continue;
      }
      names = {n};
    }
    std::vector<at::Tensor> sources;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string& n = names[i];
      if (ck.find(n) == nullptr)
        throw checkpoint_error(fail_prefix(ck) + "tensor " + n + " is missing (needed by " + p.name + ")");
      at::Tensor v = ck.view(n);
      const std::vector<std::int64_t> want = stored_shape(*p.plan, i, c.s);
      if (v.sizes().vec() != want)
        throw checkpoint_error(fail_prefix(ck) + "tensor " + n + " has shape " + c10::str(v.sizes()) + ", but config.json implies " +
                               shape_text(want) + (want.empty() ? " (a scalar)" : ""));
      v = held_form(*p.plan->row, v);  // HF's 0-dim buffer, conv weight or one row, as megadsl holds it
      // gpt-oss's experts: one tensor per layer holds them all; this one's slice, as nn.Linear holds it.
      if (p.plan->row->stacking != hf_stacking::none) v = expert_from_stack(v, *p.plan->row, p.at.expert);
      if (!at::isFloatingType(v.scalar_type()))
        throw checkpoint_error(fail_prefix(ck) + "tensor " + n + " is stored as " + std::string(c10::toString(v.scalar_type())) +
                               ", not a floating-point type: a weight cast from integers would be meaningless "
                               "(a quantised checkpoint?); megadsl loads fp32, bf16 and fp16 weights");
      sources.push_back(v);
    }
    const at::Tensor local = shard_from_hf(*p.plan, c.s, c.l, tp_rank, sources);
    // This rank's slice only (each rank checks what it reads): NaN or Inf would make every output
    // NaN without a word.
    if (!at::isfinite(local).all().item<bool>()) {
      const at::Tensor bad = at::isfinite(local).logical_not().nonzero();
      throw checkpoint_error(fail_prefix(ck) + "tensor " + names.front() + (names.size() > 1 ? " (or its fused partners)" : "") +
                             " holds NaN or Inf (" + std::to_string(bad.size(0)) + " element(s) in this rank's slice of " +
                             p.name + "); the checkpoint is corrupt or diverged");
    }
    copy_into(p, local.to(p.tensor.scalar_type()));
  }
  return report;
}

namespace {

// Files of an HF model directory that travel with the weights: tokenizer, generation settings,
// chat template. Weights, their index and config.json are written anew.
bool carried(const std::string& name) {
  if (name == "config.json" || name == "model.safetensors.index.json") return false;
  if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") return false;
  if (name.rfind("pytorch_model", 0) == 0 || name.rfind(".", 0) == 0) return false;
  return name == "generation_config.json" || name.rfind("tokenizer", 0) == 0 || name == "special_tokens_map.json" ||
         name == "added_tokens.json" || name == "vocab.json" || name == "merges.txt" || name == "vocab.txt" ||
         name.rfind("chat_template", 0) == 0 || name == "preprocessor_config.json";
}

// config.json: megadsl's keys over the source's, so the fields megadsl does not model (token ids,
// architectures' extras) survive a conversion; the dtype keys follow the saved dtype. A multimodal
// source (its text_config the model's): with `wrapped` the source's config with megadsl's keys
// over its text_config and its tie, else the text model's own config.
std::string merged_config(const std::string& ours, const std::filesystem::path& carry_from, bool wrapped) {
  const std::filesystem::path src = carry_from / "config.json";
  std::error_code ec;
  if (carry_from.empty() || !std::filesystem::is_regular_file(src, ec)) return ours;
  std::ifstream in(src);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json root = parse_json_bounded(text, 16 << 20, [&](const std::string& problem) {
    throw checkpoint_error("megadsl: " + src.string() + ": " + problem);
  });
  if (!root.is_object()) return ours;
  const nlohmann::json mine = nlohmann::json::parse(ours);
  const auto inner = root.find("text_config");
  const bool multimodal = inner != root.end() && inner->is_object() && root.value("model_type", "") != mine.at("model_type") &&
                          inner->value("model_type", "") == mine.at("model_type");
  if (multimodal && !wrapped) root = nlohmann::json(*inner);
  nlohmann::json& base = multimodal && wrapped ? root["text_config"] : root;
  for (auto it = mine.begin(); it != mine.end(); ++it)
    if (!(multimodal && wrapped && (it.key() == "architectures" || it.key() == "torch_dtype"))) base[it.key()] = it.value();
  if (multimodal && wrapped) {
    root["tie_word_embeddings"] = mine.at("tie_word_embeddings");
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (root.contains(key)) root[key] = mine.at("torch_dtype");
      if (base.contains(key)) base[key] = mine.at("torch_dtype");
    }
  } else if (base.contains("dtype")) {
    base["dtype"] = mine.at("torch_dtype");
  }
  // transformers 5's form of RoPE, when the source had it, must say what megadsl wrote.
  if (mine.contains("rope_parameters")) {
    base["rope_parameters"] = mine.at("rope_parameters");  // the family writes its own (GPT-NeoX)
  } else if (base.contains("rope_parameters")) {
    nlohmann::json rp = mine.at("rope_scaling").is_object() ? mine.at("rope_scaling") : nlohmann::json{{"rope_type", "default"}};
    rp["rope_theta"] = mine.at("rope_theta");
    base["rope_parameters"] = rp;
  }
  return root.dump(2) + "\n";
}

// The multimodal part a distributed checkpoint's hf/ carries (carry_multimodal_part).
constexpr const char* multimodal_part_file = "multimodal.safetensors";
constexpr const char* text_prefix_key = "megadsl.text_model_prefix";

// The multimodal checkpoint an actor is written as (save_hf): `carry_from` when it is one whose
// text model is this model's and holds its other tensors: an HF checkpoint with its weights, or a
// distributed checkpoint's hf/ with the part it carries.
struct multimodal_source {
  std::optional<hf_checkpoint> checkpoint;  // the source, under its own names
  std::optional<safetensors_file> part;     // or the part a distributed checkpoint carries
  hf_name_map names;                        // where the text model's tensors go
  std::vector<std::string> outside;         // the source's other tensors, copied
  at::Tensor view(const std::string& n) const { return checkpoint ? checkpoint->view(n) : part->view(n); }
};
std::optional<multimodal_source> multimodal_source_of(const std::filesystem::path& carry_from, const std::string& model_type) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (carry_from.empty() || !fs::is_regular_file(carry_from / "config.json", ec)) return std::nullopt;
  const bool weights = fs::exists(carry_from / "model.safetensors", ec) || fs::exists(carry_from / "model.safetensors.index.json", ec);
  const bool part = !weights && fs::is_regular_file(carry_from / multimodal_part_file, ec);
  if (!weights && !part) return std::nullopt;  // a distributed checkpoint's hf/ of a text model
  hf_config cfg;
  try {
    cfg = read_hf_config(carry_from);
  } catch (const config_error&) {
    return std::nullopt;  // not a config megadsl reads: its files are carried, not its form
  }
  if (cfg.wrapper.empty() || cfg.model_type != model_type) return std::nullopt;
  if (part) {
    safetensors_file f = safetensors_file::open(carry_from / multimodal_part_file);
    const auto prefix = f.metadata().find(text_prefix_key);
    std::optional<hf_name_map> names;
    for (const hf_name_map& m : {multimodal_names_v5(), multimodal_names_legacy()})
      if (prefix != f.metadata().end() && m.prefixes.front().second == prefix->second) names = m;
    if (!names)
      throw checkpoint_error("megadsl: " + f.path().string() + ": no known \"" + text_prefix_key +
                             "\" in its metadata (where the text model's tensors are stored); it is not one megadsl "
                             "wrote: remove it to save the text model alone");
    std::vector<std::string> outside;
    for (const auto& t : f.tensors()) outside.push_back(t.name);
    return multimodal_source{std::nullopt, std::move(f), *names, std::move(outside)};
  }
  hf_checkpoint ck = hf_checkpoint::open(carry_from);
  hf_name_map names = multimodal_names_in(ck);
  std::vector<std::string> outside;
  for (const std::string& n : ck.names())
    if (!names.text_name(n)) outside.push_back(n);  // what as_text_model leaves out
  return multimodal_source{std::move(ck), std::nullopt, std::move(names), std::move(outside)};
}

}  // namespace

std::filesystem::path hf_files_of(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return {};
  if (fs::exists(dir / "metadata.json", ec)) return fs::is_directory(dir / "hf", ec) ? dir / "hf" : fs::path();
  return dir;
}

void copy_hf_files(const std::filesystem::path& from, const std::filesystem::path& to, bool with_config) {
  namespace fs = std::filesystem;
  if (from.empty()) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || !(carried(name) || (with_config && name == "config.json"))) continue;
    fs::create_directories(to, ec);
    if (!fs::copy_file(e.path(), to / name, fs::copy_options::overwrite_existing, ec))
      throw checkpoint_error("megadsl: cannot copy " + e.path().string() + " to " + to.string() + ": " + ec.message());
  }
}

void carry_multimodal_part(const std::filesystem::path& from, const std::filesystem::path& to,
                           const std::string& model_type) {
  namespace fs = std::filesystem;
  const std::optional<multimodal_source> mm = multimodal_source_of(from, model_type);
  if (!mm) return;
  std::error_code ec;
  fs::create_directories(to, ec);
  if (mm->part) {  // another distributed checkpoint's: the same file
    if (!fs::copy_file(mm->part->path(), to / multimodal_part_file, fs::copy_options::overwrite_existing, ec))
      throw checkpoint_error("megadsl: cannot copy " + mm->part->path().string() + " to " + to.string() + ": " + ec.message());
    return;
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const std::string& n : mm->outside) tensors.emplace_back(n, mm->view(n));  // as stored
  write_safetensors(to / multimodal_part_file, tensors,
                    {{"format", "pt"}, {text_prefix_key, mm->names.prefixes.front().second}});
}

// The model_type whose config class describes this model (hf_config_json refuses a mismatch).
static std::string default_model_type(const runtime_config& c) {
  const std::string_view t = model_type_for(c.s, c.options.attention_window, c.options.dropout);
  if (t.empty())
    throw checkpoint_error("megadsl: save_hf: this model's composition (" + to_string(c.s) +
                           ") is that of no HF config class; save it as a distributed checkpoint (save_distributed)");
  return std::string(t);
}

void save_hf(std::vector<named_parameter>& params, const runtime_config& c, const parallel_groups& g,
             const std::filesystem::path& dir, at::ScalarType dtype, std::string model_type,
             const std::filesystem::path& carry_from, const lora_set* merge) {
  namespace fs = std::filesystem;
  if (model_type.empty()) model_type = default_model_type(c);
  refuse_target_over_source(dir, carry_from, "an HF checkpoint", /*overwrite_checkpoint=*/false);
  // config.json is written by one rank at the end; a model it cannot describe is refused here, on
  // every rank alike, before any collective (not on one rank while the others wait for it).
  (void)hf_config_json(c.s, model_type, !c.head.actor, "float32", c.options.attention_window, c.options.dropout);
  const bool writer = g.tp->rank() == 0 && g.dp->rank() == 0 && g.me.cp == 0;
  if (merge != nullptr) merge->gather_whole(g.tp.get(), g.ep.get());  // trained adapters, whole (every tp rank takes part)
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (named_parameter& p : params) {
    // An adapted base is gathered in fp32 and merged before the cast.
    const bool merging = merge != nullptr && merge->adapts(p.tensor);
    hf_tensor_list hf = gather_parameter(p, c, g, merging ? at::kFloat : dtype);  // every tp (and ep) rank takes part
    if (merging && writer)
      for (auto& [n, t] : hf) t = merge->merged(n, t).to(dtype);
    if (writer) std::move(hf.begin(), hf.end(), std::back_inserter(tensors));
  }
  if (merge != nullptr) merge->release_whole();
  if (!writer) return;
  merge_stacked(tensors);  // gpt-oss's experts: each layer's slices into HF's one tensor per projection
  // A multimodal source: the text model under its names, its other tensors (in the first stage's file).
  const std::optional<multimodal_source> mm = c.head.actor ? multimodal_source_of(carry_from, model_type) : std::nullopt;
  const hf_name_map names = mm ? mm->names : hf_name_map{};
  for (auto& [n, t] : tensors) n = names.stored(n);
  // The writers (one per stage: the pp group of tp, dp and cp rank 0) fill one staging directory,
  // which replaces `dir` in one rename: a reader sees the old checkpoint or the new one.
  const comm_group& stages = *g.pp;
  const std::int64_t pp = c.l.pp.get(), pp_rank = stages.rank();
  const bool first = pp_rank == 0;
  fs::path target = dir;
  if (!target.has_filename()) target = target.parent_path();
  const fs::path staging = staging_name(stages, target);
  const cleanup_on_signal staging_cleanup(staging, /*directory=*/true);  // a SIGTERM leaves no half-written copy
  std::optional<target_lock> lock;
  auto step = [&](const std::function<void()>& f) { save_step(stages, staging, f); };
  step([&] {
    if (!first) return;
    lock.emplace(target);
    remove_stale_staging(target);
    std::error_code ec;
    if (fs::exists(target, ec)) {
      if (!fs::is_directory(target, ec))
        throw checkpoint_error("megadsl: cannot save an HF checkpoint to " + target.string() + ": it exists and is not a directory");
      if (!fs::is_empty(target, ec) && !fs::exists(target / "config.json", ec))
        throw checkpoint_error("megadsl: cannot save an HF checkpoint to " + target.string() +
                               ": it holds files but no config.json, and saving would replace them; choose a new or "
                               "empty directory");
    }
    fs::create_directories(target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec);
    if (!fs::create_directory(staging, ec) || ec)
      throw checkpoint_error("megadsl: cannot save an HF checkpoint to " + target.string() + ": cannot create " +
                             staging.string() + (ec ? ": " + ec.message() : ": it exists"));
  });
  const std::string dtype_name = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  auto file_of = [&](std::int64_t r) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(r + 1),
                  static_cast<long long>(pp));
    return std::string(buf);
  };
  std::int64_t bytes = 0;
  if (mm && pp_rank == 0) {
    for (const std::string& n : mm->outside) {
      const at::Tensor t = mm->view(n);
      tensors.emplace_back(n, at::isFloatingType(t.scalar_type()) ? t.to(dtype).contiguous() : t.clone());
    }
  }
  step([&] {
    if (pp == 1) write_hf_checkpoint(staging, tensors);
    else write_safetensors(staging / file_of(pp_rank), tensors, {{"format", "pt"}});
    for (auto& [n, t] : tensors) bytes += t.numel() * t.element_size();
  });
  at::Tensor total = at::full({1}, bytes, at::kLong);
  if (pp > 1) stages.all_reduce(total);
  step([&] {
    if (!first) return;
    if (pp > 1) {
      std::ostringstream os;
      os << "{\n  \"metadata\": {\"total_size\": " << total.item<std::int64_t>() << "},\n  \"weight_map\": {\n";
      std::vector<std::pair<std::string, std::string>> map;
      for (const param_plan& p : plan_params(c.s, c.l, c.head)) {
        if (p.tied) continue;
        for (std::int64_t i = 0; i < instances(*p.row, c.s); ++i) {
          if (!exists(*p.row, c.s, i)) continue;
          const param_instance at = instance_of(*p.row, c.s, i);
          const std::int64_t owner = p.row->where == placement::first_stage ? 0
                                     : p.row->where == placement::last_stage ? pp - 1
                                                                             : place_of_layer(c.s, c.l, at.layer).pp_rank;
          for (auto& n : hf_names(p, at)) map.emplace_back(names.stored(n), file_of(owner));
        }
      }
      if (mm)
        for (const std::string& n : mm->outside) map.emplace_back(n, file_of(0));
      std::sort(map.begin(), map.end());
      map.erase(std::unique(map.begin(), map.end()), map.end());  // a stack of experts is one tensor
      for (std::size_t i = 0; i < map.size(); ++i)
        os << "    \"" << map[i].first << "\": \"" << map[i].second << "\"" << (i + 1 < map.size() ? ",\n" : "\n");
      os << "  }\n}\n";
      write_file_atomically(staging / "model.safetensors.index.json", os.str());
    }
    write_file_atomically(staging / "config.json",
                          merged_config(hf_config_json(c.s, model_type, !c.head.actor, dtype_name, c.options.attention_window,
                                                       c.options.dropout), carry_from,
                                        mm.has_value()));
    copy_hf_files(carry_from, staging, /*with_config=*/false);
    fsync_dir(staging);
    move_into_place(staging, target);
  });
}

}  // namespace megadsl
