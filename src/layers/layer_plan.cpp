// The architecture's nodes as modules: each node's factory (defined in its block's own file) is
// called with the layer's parameters and the node, and builds the nodes it wraps through
// `block_build::child`. No block kind is named here.
#include "megadsl/layers/layer_plan.hpp"

#include <stdexcept>
#include <string>

#include "megadsl/architecture.hpp"
#include "megadsl/layers/block_factories.hpp"
#include "megadsl/models/registry.hpp"

namespace megadsl {

// Every core block's factory, referenced strongly here (this file is linked whenever modules are
// built): the architectures name them through weak references (layers/block_factories.hpp). The
// blocks under models/<family>/ are linked through the registry's architectures, referenced here
// below: this file is compiled with strong factory references, so each family's nodes pull in
// their modules' objects.
[[gnu::used]] extern const module_factory library_block_factories[] = {
    &modules::rms_norm,  &modules::rms_norm_1p, &modules::rms_norm_wmul, &modules::layer_norm, &modules::layer_norm_no_bias,
    &modules::per_head_qk_norm, &modules::full_width_qk_norm, &modules::attention, &modules::gated_delta_net,
    &modules::gated_mlp,
    &modules::plain_mlp, &modules::moe_mlp, &modules::softmax_router, &modules::grouped_sigmoid_router, &modules::embedding, &modules::pre_norm, &modules::post_norm,
    &modules::sandwich, &modules::branch, &modules::parallel_sum, &modules::sequence,
    &modules::parallel_shared_norm};

[[gnu::used]] extern const void* const registry_architectures = &families;

std::string block_build::name(std::string_view local) const {
  if (node_.prefix.empty()) return std::string(local);
  return std::string(node_.prefix) + "." + std::string(local);
}

std::unique_ptr<block_module> block_build::child(int i) const {
  if (i < 0 || i >= node_.child_count)
    throw std::logic_error("megadsl: a block's module asks for its child " + std::to_string(i) + " of " +
                           std::to_string(node_.child_count) + " (its block type and its module disagree)");
  return build_node(params, args, arch_, node_.children[static_cast<std::size_t>(i)]);
}

std::string block_build::wrong_child(int i) const {
  const module_node& c = arch_.nodes[static_cast<std::size_t>(node_.children[static_cast<std::size_t>(i)])];
  return "megadsl: the block wrapped at child " + std::to_string(i) + " (" + std::string(c.label.empty() ? c.prefix : c.label) +
         ") does not build the kind of module its parent expects (a norm where a norm is wrapped, a layer module where a "
         "sublayer is); check the composition in layers/blocks.hpp terms";
}

void block_build::no_setting(std::string_view key) const {
  throw std::logic_error("megadsl: the module of " + std::string(node_.prefix) + " reads config setting \"" + std::string(key) +
                         "\", which no block of the composition declares; declare it in the block's lower (b.setting)");
}

void block_build::knobs_mismatch(std::string_view wanted) const {
  throw std::logic_error("megadsl: the module of block " + std::string(node_.label.empty() ? node_.prefix : node_.label) +
                         " reads its knobs as " + std::string(wanted) + ", and its block handed it " +
                         (node_.knobs.object == nullptr ? std::string("none") : std::string(node_.knobs.type)) +
                         " (its block type and its module disagree)");
}

std::unique_ptr<block_module> build_node(const module_params& p, const layer_plan_args& a, const architecture& arch, int node) {
  if (node < 0 || static_cast<std::size_t>(node) >= arch.nodes.size())
    throw std::logic_error("megadsl: architecture " + std::string(arch.name) + " has no node " + std::to_string(node));
  const module_node& n = arch.nodes[static_cast<std::size_t>(node)];
  if (n.make == nullptr) throw std::logic_error("megadsl: a block of " + std::string(arch.name) + " names no module factory");
  return n.make(block_build(p, a, arch, node));
}

namespace {
std::unique_ptr<layer_module> as_layer(std::unique_ptr<block_module> m, std::string_view what) {
  if (auto* l = dynamic_cast<layer_module*>(m.get())) {
    m.release();
    return std::unique_ptr<layer_module>(l);
  }
  throw std::logic_error("megadsl: the " + std::string(what) + "'s block does not build a module on the residual stream");
}
}  // namespace

std::unique_ptr<layer_module> build_layer(const module_params& p, const layer_plan_args& a) {
  const architecture& arch = arch_of(a.s);
  return as_layer(build_node(p, a, arch, arch.kinds[static_cast<std::size_t>(kind_of_layer(a.s, p.layer))].root), "layer");
}

std::unique_ptr<layer_module> build_final_norm(const module_params& p, const layer_plan_args& a) {
  return as_layer(build_node(p, a, arch_of(a.s), arch_of(a.s).final_norm), "final norm");
}

std::unique_ptr<layer_module> build_embedding(const module_params& p, const layer_plan_args& a) {
  return as_layer(build_node(p, a, arch_of(a.s), arch_of(a.s).embedding), "embedding");
}

std::int64_t routing_slots(const shape& s) { return routes_any(s) ? s.top_k.get() : 0; }

}  // namespace megadsl
