// Weights streamed to a rollout engine (runtime/weight_export.hpp).
#include "megadsl/runtime/weight_export.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "megadsl/layers/lora_linear.hpp"
#include "megadsl/runtime/shard_io.hpp"

namespace megadsl {

namespace {

// The names of a parameter's HF tensors; an expert's slice of HF's stacked tensor is "name[e]"
// (merge_stacked joins them).
std::vector<std::string> names_of(const param_plan& p, param_instance at) {
  std::vector<std::string> out;
  for (int i = 0; i < p.row->hf_count; ++i) out.push_back(hf_key(*p.row, i, at));
  return out;
}


// One entry of a bucket's header: how a receiver rebuilds the tensor from the bytes, and how it
// is split for a rollout tp rank (the dim, and the head size for a k or v with fewer heads than
// rollout ranks).
struct entry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
  int split_dim = -1;
  std::int64_t head = 0;  // 0, or the head size of a k or v; -1: several projections in one HF tensor
  std::vector<std::int64_t> slots;  // one HF tensor of sources side by side: each source's rows, split apart
};

std::string header_text(const std::vector<entry>& es, bool stage_done) {
  std::ostringstream os;
  os << (stage_done ? 1 : 0) << '\n';
  for (const entry& e : es) {
    os << e.name << '\t' << static_cast<int>(e.dtype) << '\t' << e.split_dim << '\t' << e.head << '\t' << e.shape.size();
    for (std::int64_t d : e.shape) os << '\t' << d;
    os << '\t' << e.slots.size();
    for (std::int64_t d : e.slots) os << '\t' << d;
    os << '\n';
  }
  return os.str();
}

std::vector<entry> parse_header(const std::string& text, bool& stage_done) {
  std::istringstream is(text);
  int done = 0;
  is >> done;
  stage_done = done != 0;
  std::vector<entry> out;
  std::string line;
  std::getline(is, line);
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    entry e;
    int dtype = 0;
    std::size_t rank = 0;
    std::getline(ls, e.name, '\t');
    ls >> dtype >> e.split_dim >> e.head >> rank;
    e.dtype = static_cast<at::ScalarType>(dtype);
    e.shape.resize(rank);
    for (auto& d : e.shape) ls >> d;
    std::size_t slots = 0;
    ls >> slots;
    e.slots.resize(slots);
    for (auto& d : e.slots) ls >> d;
    out.push_back(std::move(e));
  }
  return out;
}

// The slice of rollout tp rank `rank` of `tp`: even chunks along the split dim; k or v heads
// replicated when there are fewer than `tp` of them (each rollout rank holds its query group's); a
// tensor of slots (Qwen3.5's in_proj_qkv, the DeltaNet's conv) each slot's chunk, side by side
// ([q_r ; k_r ; v_r], as a merged column-parallel layer holds it).
at::Tensor rollout_slice(const at::Tensor& t, const entry& e, std::int64_t tp, std::int64_t rank) {
  if (tp == 1 || e.split_dim < 0) return t;
  if (!e.slots.empty()) {
    for (const std::int64_t rows : e.slots)
      if (rows % tp != 0)
        throw std::invalid_argument("megadsl: weight export: " + e.name + " has a slot of " + std::to_string(rows) +
                                    " rows, which a rollout tp of " + std::to_string(tp) + " does not divide");
    std::vector<at::Tensor> pieces;
    for (const slot_share& x : slot_shares(e.slots, tp, rank)) pieces.push_back(t.narrow(e.split_dim, x.first, x.rows));
    return at::cat(pieces, e.split_dim);
  }
  if (e.head < 0)
    throw std::invalid_argument("megadsl: weight export: " + e.name + " holds several projections in one HF tensor (" +
                                "q/k/v or gate/up), which a rollout engine splits per projection; export full tensors "
                                "(shard_tp = 1) for this family");
  const std::int64_t n = t.size(e.split_dim);
  if (e.head > 0 && n % e.head == 0 && n / e.head < tp && tp % (n / e.head) == 0) {
    const std::int64_t heads = n / e.head;  // fewer kv heads than ranks: each rank its group's head
    return t.narrow(e.split_dim, rank * heads / tp * e.head, e.head).contiguous();
  }
  if (n % tp == 0) return t.narrow(e.split_dim, rank * (n / tp), n / tp).contiguous();
  throw std::invalid_argument("megadsl: weight export: " + e.name + " has " + std::to_string(n) +
                              " rows along its split dimension, which a rollout tp of " + std::to_string(tp) +
                              " does not divide");
}

}  // namespace

hf_tensor_list gather_parameter(const named_parameter& p, const runtime_config& c, const parallel_groups& g,
                                at::ScalarType dtype) {
  if (p.plan->tied) return {};  // the last stage's copy of the embedding
  c10::NoGradGuard no_grad;
  // Cast first (elementwise, so the same bits as casting after), then gather fewer bytes, where
  // the parameter lives (NCCL on a GPU); the HF tensors then go to the CPU.
  const at::Tensor local = p.tensor.detach().to(dtype);
  const auto hf = gather_hf(*p.plan, c.s, c.l, g.tp.get(), local);  // every tp rank takes part
  hf_tensor_list out;
  if (p.plan->row->where == placement::expert && g.ep != nullptr) {
    // The ep group's ranks hold the layer's other experts, in the same order: rank r's j-th is
    // expert r * experts / ep + j. Every rank of the group takes part.
    const std::int64_t per = c.s.experts.get() / g.ep->size(), slot = p.at.expert % per;
    for (std::size_t i = 0; i < hf.size(); ++i) {
      const at::Tensor all = g.ep->all_gather(hf[i].contiguous().unsqueeze(0), 0);  // (ep, ...)
      for (std::int64_t r = 0; r < g.ep->size(); ++r)
        out.emplace_back(names_of(*p.plan, {p.at.layer, r * per + slot})[i],
                         hf_stored_form(*p.plan->row, all[r]).to(at::kCPU).contiguous());
    }
    return out;
  }
  const auto names = names_of(*p.plan, p.at);
  for (std::size_t i = 0; i < names.size(); ++i)
    out.emplace_back(names[i], hf_stored_form(*p.plan->row, hf[i]).to(at::kCPU).contiguous());
  return out;
}

struct weight_stream::state {
  std::vector<named_parameter>* params = nullptr;
  runtime_config c;
  const parallel_groups* g = nullptr;
  export_options o;
  std::int64_t stage = 0;   // the pipeline stage whose parameters are being sent
  std::size_t cursor = 0;   // on that stage: its next parameter
  std::int64_t sent = 0;
  ~state() {
    if (o.merge != nullptr) o.merge->release_whole();  // the whole adapters gathered for the merge
  }
};

weight_stream::weight_stream(std::vector<named_parameter>& params, const runtime_config& c, const parallel_groups& g,
                             export_options o)
    : s_(std::make_unique<state>()) {
  if (o.bucket_bytes < 1) throw std::invalid_argument("megadsl: weight export: bucket_bytes must be positive");
  if (o.shard_tp < 1 || o.shard_rank < 0 || o.shard_rank >= o.shard_tp)
    throw std::invalid_argument("megadsl: weight export: shard_rank " + std::to_string(o.shard_rank) +
                                " is not a rank of a rollout tp of " + std::to_string(o.shard_tp));
  s_->params = &params;
  s_->c = c;
  s_->g = &g;
  s_->o = o;
  if (o.merge != nullptr) o.merge->gather_whole(g.tp.get(), g.ep.get());  // trained adapters, whole (every tp rank takes part)
}

weight_stream::~weight_stream() = default;
weight_stream::weight_stream(weight_stream&&) noexcept = default;
weight_stream& weight_stream::operator=(weight_stream&&) noexcept = default;

bool weight_stream::done() const { return s_->stage >= s_->c.l.pp.get(); }
std::int64_t weight_stream::bytes_sent() const { return s_->sent; }

hf_tensor_list weight_stream::next() {
  state& s = *s_;
  const std::int64_t pp = s.c.l.pp.get();
  if (s.stage >= pp) return {};
  const comm_group& stages = *s.g->pp;
  const bool owner = stages.rank() == s.stage;

  // The owner stage gathers parameters until the bucket is full, into one byte buffer.
  std::vector<entry> entries;
  bool stage_done = false;
  at::Tensor flat = at::empty({0}, at::kByte);
  if (owner) {
    // The bucket's parameters, by their HF sizes (known before gathering), then one buffer that
    // each gathered tensor is copied into: the bucket is the only copy held beyond the model.
    std::vector<named_parameter>& params = *s.params;
    const std::size_t first = s.cursor;
    std::int64_t bytes = 0;
    const std::int64_t element = static_cast<std::int64_t>(c10::elementSize(s.o.dtype));
    // A stack of experts (gpt-oss) travels whole: the bucket takes the rest of its layer's slices.
    const auto same_stack = [&](std::size_t j) {
      const named_parameter& last = params[j - 1];
      return last.plan->row->stacking != hf_stacking::none && params[j].plan == last.plan && params[j].at.layer == last.at.layer;
    };
    while (s.cursor < params.size() && (bytes < s.o.bucket_bytes || (s.cursor > first && same_stack(s.cursor)))) {
      const named_parameter& p = params[s.cursor++];
      if (p.plan->tied) continue;
      const std::int64_t copies = p.plan->row->where == placement::expert && s.g->ep != nullptr ? s.g->ep->size() : 1;
      for (int i = 0; i < p.plan->row->hf_count; ++i)
        bytes += p.plan->hf_shapes[static_cast<std::size_t>(i)].numel() * element * copies;
    }
    stage_done = s.cursor == params.size();
    flat = at::empty({bytes}, at::kByte);
    hf_tensor_list stack_parts;  // a stack's slices until its layer's last
    std::int64_t at = 0;
    for (std::size_t j = first; j < s.cursor; ++j) {
      const named_parameter& p = params[j];
      const bool merging = s.o.merge != nullptr && s.o.merge->adapts(p.tensor);  // gathered in fp32, merged, cast
      hf_tensor_list gathered = gather_parameter(p, s.c, *s.g, merging ? at::kFloat : s.o.dtype);
      if (merging)
        for (auto& [name, t] : gathered) t = s.o.merge->merged(name, t).to(s.o.dtype);
      if (p.plan->row->stacking != hf_stacking::none) {
        // The stack's slices so far; the last one of the layer writes the stack.
        for (auto& x : gathered) stack_parts.push_back(std::move(x));
        if (j + 1 < s.cursor && params[j + 1].plan == p.plan && params[j + 1].at.layer == p.at.layer) continue;
        merge_stacked(stack_parts);
        gathered = std::move(stack_parts);
        stack_parts.clear();
      }
      const row_geometry& geo = p.plan->geo;
      std::size_t source = 0;  // which of the row's HF sources `name` is (in order)
      for (auto& [name, t] : gathered) {
        // A source replicated over tp ranks when it has fewer units than ranks (a k or v projection,
        // a k norm's weight per kv head) carries its unit; one HF tensor of several sources side by
        // side (Phi-3's gate_up_proj, Qwen3.5's in_proj_qkv) its sources' rows, split apart; one
        // grouped per kv head (Phi-3's qkv_proj) cannot be sliced evenly.
        const bool one_tensor = p.plan->row->concatenated && geo.source_count() > 1;
        const geometry_source& x = geo.sources[std::min<std::size_t>(source++, 2)];
        const std::int64_t head = one_tensor && geo.grouped         ? -1
                                  : !one_tensor && x.replicated_when_fewer ? x.unit
                                                                             : 0;
        // A stack of experts goes whole to every rollout rank (its engine splits its experts itself).
        const int split = p.plan->row->stacking != hf_stacking::none ? -1 : p.plan->split_dim;
        std::vector<std::int64_t> slots;
        if (one_tensor && !geo.grouped)
          for (const geometry_source& y : geo.sources)
            if (y.units > 0) slots.push_back(y.extent());
        entries.push_back({name, t.scalar_type(), t.sizes().vec(), split, head, std::move(slots)});
        const std::int64_t n = t.numel() * t.element_size();
        flat.narrow(0, at, n).copy_(t.reshape({-1}).view(at::kByte));
        at += n;
      }
    }
  }
  if (pp > 1) {
    // The header (names, dtypes, shapes), then every tensor's bytes in one broadcast.
    std::string header = owner ? header_text(entries, stage_done) : std::string();
    at::Tensor sizes = at::tensor({static_cast<std::int64_t>(header.size()), flat.numel()}, at::kLong);
    stages.broadcast(sizes, static_cast<int>(s.stage));
    at::Tensor text = at::empty({std::max<std::int64_t>(1, sizes[0].item<std::int64_t>())}, at::kByte);
    if (owner) std::memcpy(text.data_ptr(), header.data(), header.size());
    stages.broadcast(text, static_cast<int>(s.stage));
    if (!owner) {
      header.assign(static_cast<const char*>(text.data_ptr()), static_cast<std::size_t>(sizes[0].item<std::int64_t>()));
      entries = parse_header(header, stage_done);
      flat = at::empty({sizes[1].item<std::int64_t>()}, at::kByte);
    }
    if (flat.numel() > 0) stages.broadcast(flat, static_cast<int>(s.stage));
  }
  if (stage_done) {
    ++s.stage;
    s.cursor = 0;
  }
  hf_tensor_list out;
  std::int64_t at = 0;
  for (const entry& e : entries) {
    const std::int64_t numel = c10::multiply_integers(e.shape);
    const std::int64_t bytes = numel * static_cast<std::int64_t>(c10::elementSize(e.dtype));
    const at::Tensor t = flat.narrow(0, at, bytes).view(e.dtype).view(e.shape);
    at += bytes;
    s.sent += bytes;
    out.emplace_back(s.o.names.stored(e.name), rollout_slice(t, e, s.o.shard_tp, s.o.shard_rank));
  }
  return out;
}

}  // namespace megadsl
