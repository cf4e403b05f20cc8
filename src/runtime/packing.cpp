#include "megadsl/runtime/packing.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megadsl {
namespace {

void check_ids(const at::Tensor& ids, const at::Tensor& mask, std::int64_t vocab, const char* what) {
  const at::Tensor bad = ((ids < 0) | (ids >= vocab)) & mask;
  if (!bad.any().item<bool>()) return;
  const at::Tensor where = bad.nonzero()[0];
  const std::int64_t row = where[0].item<std::int64_t>(), col = where[1].item<std::int64_t>();
  throw std::invalid_argument("megadsl: " + std::string(what) + " holds " +
                              std::to_string(ids[row][col].item<std::int64_t>()) + " at (row " +
                              std::to_string(row) + ", position " + std::to_string(col) +
                              "), outside the vocab [0, " + std::to_string(vocab) + ")");
}

}  // namespace

packed_tokens pack_tokens(const batch& b, bool rmpad, std::int64_t multiple, std::int64_t vocab) {
  if (!b.input_ids.defined() || b.input_ids.dim() != 2)
    throw std::invalid_argument("megadsl: input_ids must be a (batch, seq) tensor");
  const at::Tensor ids_in = b.input_ids.to(at::kLong);
  const at::Tensor mask = b.attention_mask.defined() ? b.attention_mask.to(at::kBool) : at::ones_like(ids_in, at::kBool);
  if (mask.sizes() != ids_in.sizes())
    throw std::invalid_argument("megadsl: attention_mask has shape " + c10::str(mask.sizes()) +
                                " but input_ids has " + c10::str(ids_in.sizes()));
  check_ids(ids_in, mask, vocab, "input_ids");

  packed_tokens pk;
  pk.rmpad = rmpad;
  pk.batch = ids_in.size(0);
  pk.seq = ids_in.size(1);
  pk.attention_mask = mask;
  pk.no_padding = mask.numel() == 0 || mask.all().item<bool>();
  const at::Tensor ids = ids_in.masked_fill(mask.logical_not(), 0);
  const at::Tensor positions = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);

  at::Tensor labels, label_valid;
  if (b.labels.defined()) {
    if (b.labels.sizes() != ids_in.sizes())
      throw std::invalid_argument("megadsl: labels must have the shape of input_ids " + c10::str(ids_in.sizes()));
    check_ids(b.labels.to(at::kLong), mask, vocab, "labels");
    labels = b.labels.to(at::kLong).masked_fill(mask.logical_not(), 0);
    label_valid = mask;
  } else {  // the next token of the same sequence
    labels = at::constant_pad_nd(ids.narrow(1, 1, pk.seq - 1), {0, 1});
    label_valid = mask & at::constant_pad_nd(mask.narrow(1, 1, pk.seq - 1), {0, 1});
  }

  const at::Tensor flat_mask = mask.reshape({-1});
  // On the batch's device (a CUDA batch packs on the GPU; decoder_stage moves the result to the model's).
  pk.index = rmpad ? flat_mask.nonzero().squeeze(1) : at::arange(pk.batch * pk.seq, ids_in.options().dtype(at::kLong));
  auto take = [&](const at::Tensor& t) { return t.reshape({-1}).index_select(0, pk.index); };
  at::Tensor s_ids = take(ids), s_pos = take(positions), s_labels = take(labels);
  at::Tensor s_label_valid = take(label_valid).to(at::kFloat);
  if (b.temperature.defined()) {
    const at::Tensor t = b.temperature.to(at::kCPU, at::kFloat);
    if (t.dim() != 1 || t.size(0) != pk.batch)
      throw std::invalid_argument("megadsl: temperature has shape " + c10::str(t.sizes()) + "; per-row temperatures are (" +
                                  std::to_string(pk.batch) + ",), one per row of input_ids");
    if (!(t > 0).all().item<bool>())
      throw std::invalid_argument("megadsl: every row's temperature must be positive");
    pk.temperature = take(t.to(ids_in.device()).unsqueeze(1).expand({pk.batch, pk.seq}).contiguous());
  }
  pk.token_valid = take(mask).to(at::kFloat);
  // The LM head's rows in the padded layout (decoder_stage): found here, where the batch is
  // (usually the CPU), not by a device sync at the head.
  if (!rmpad && !pk.no_padding) pk.real_rows = flat_mask.nonzero().squeeze(1);
  pk.tokens = s_ids.size(0);
  pk.max_position = pk.tokens > 0 ? s_pos.max().item<std::int64_t>() : 0;
  if (rmpad) {
    const at::Tensor lengths = mask.sum(1).cumsum(0).to(at::kCPU, at::kLong);  // one copy, not one per row
    const auto ends = lengths.accessor<std::int64_t, 1>();
    pk.cu_seqlens.push_back(0);
    for (std::int64_t i = 0; i < pk.batch; ++i) pk.cu_seqlens.push_back(ends[i]);
  }
  const std::int64_t padded = (pk.tokens + multiple - 1) / multiple * multiple;
  const std::int64_t extra = std::max<std::int64_t>(padded - pk.tokens, multiple > 1 && pk.tokens == 0 ? multiple : 0);
  pk.ids = at::constant_pad_nd(s_ids, {0, extra});
  pk.positions = at::constant_pad_nd(s_pos, {0, extra});
  pk.labels = at::constant_pad_nd(s_labels, {0, extra});
  pk.label_valid = at::constant_pad_nd(s_label_valid, {0, extra});
  return pk;
}

packed_tokens cp_share(const packed_tokens& whole, std::int64_t cp, std::int64_t rank) {
  const std::int64_t rows = whole.ids.size(0) / cp, first = rank * rows;
  packed_tokens mine = whole;
  mine.tokens = std::clamp<std::int64_t>(whole.tokens - first, 0, rows);
  const auto real = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, std::min(first, whole.tokens), mine.tokens) : t; };
  for (at::Tensor* t : {&mine.ids, &mine.positions, &mine.labels, &mine.label_valid}) *t = t->narrow(0, first, rows);
  mine.token_valid = real(whole.token_valid);
  mine.index = real(whole.index);
  mine.temperature = real(whole.temperature);
  mine.real_rows = at::Tensor();  // (the head finds a share's own)
  return mine;
}

cp_ring_split ring_split(packed_tokens& whole, std::int64_t cp, std::int64_t multiple) {
  // The sequences' stretches of the stream: a batch row's real tokens (packed) or its positions (padded).
  const at::Tensor row = at::floor_divide(whole.index, whole.seq).to(at::kCPU, at::kLong).contiguous();  // (T,)
  const auto* r = row.data_ptr<std::int64_t>();
  std::vector<std::vector<std::int64_t>> shares(static_cast<std::size_t>(cp));
  for (std::int64_t start = 0; start < whole.tokens;) {
    std::int64_t end = start;
    while (end < whole.tokens && r[end] == r[start]) ++end;
    const std::int64_t len = end - start, chunk = (len + 2 * cp - 1) / (2 * cp);
    for (std::int64_t i = 0; i < cp; ++i)
      for (const std::int64_t c : {i, 2 * cp - 1 - i})
        for (std::int64_t t = start + c * chunk; t < std::min(end, start + (c + 1) * chunk); ++t)
          shares[static_cast<std::size_t>(i)].push_back(t);
    start = end;
  }
  cp_ring_split out;
  std::int64_t most = 0;
  for (const auto& sh : shares) most = std::max<std::int64_t>(most, static_cast<std::int64_t>(sh.size()));
  out.rows = std::max<std::int64_t>(multiple, (most + multiple - 1) / multiple * multiple);
  // The stream padded to cp rows (padding rows: id, position, label 0, no label).
  const std::int64_t total = cp * out.rows, have = whole.ids.size(0);
  if (total > have)
    for (at::Tensor* t : {&whole.ids, &whole.positions, &whole.labels, &whole.label_valid})
      *t = at::constant_pad_nd(*t, {0, total - have});
  std::vector<std::int64_t> order, places(static_cast<std::size_t>(whole.tokens), 0);
  order.reserve(static_cast<std::size_t>(total));
  std::int64_t pad = whole.tokens;  // the next padding row to hand out
  for (std::int64_t i = 0; i < cp; ++i) {
    const auto& sh = shares[static_cast<std::size_t>(i)];
    out.real.push_back(static_cast<std::int64_t>(sh.size()));
    for (const std::int64_t t : sh) {
      places[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(order.size());
      order.push_back(t);
    }
    for (std::int64_t k = static_cast<std::int64_t>(sh.size()); k < out.rows; ++k) order.push_back(pad++);
  }
  const at::Device device = whole.ids.device();
  out.order = at::tensor(order, at::kLong).to(device);
  out.places = at::tensor(places, at::kLong).to(device);
  return out;
}

packed_tokens ring_share(const packed_tokens& whole, const cp_ring_split& split, std::int64_t rank) {
  const at::Tensor rows = split.order.narrow(0, rank * split.rows, split.rows);
  const std::int64_t real = split.real[static_cast<std::size_t>(rank)];
  const at::Tensor real_rows = rows.narrow(0, 0, real);
  packed_tokens mine = whole;
  mine.tokens = real;
  for (at::Tensor* t : {&mine.ids, &mine.positions, &mine.labels, &mine.label_valid}) *t = t->index_select(0, rows);
  const auto pick = [&](const at::Tensor& t) { return t.defined() ? t.index_select(0, real_rows) : t; };
  mine.token_valid = pick(whole.token_valid);
  mine.index = pick(whole.index);
  mine.temperature = pick(whole.temperature);
  mine.real_rows = at::Tensor();
  return mine;
}

void packed_tokens::to(const at::Device& device) {
  for (at::Tensor* t : {&ids, &positions, &labels, &label_valid, &attention_mask, &token_valid, &index, &temperature,
                        &real_rows})
    if (t->defined() && t->device() != device) *t = t->to(device, /*non_blocking=*/true);
}

at::Tensor packed_tokens::unpack(const at::Tensor& per_token) const {
  std::vector<std::int64_t> out_shape{batch * seq};
  for (std::int64_t d = 1; d < per_token.dim(); ++d) out_shape.push_back(per_token.size(d));
  at::Tensor masked = per_token;
  std::vector<std::int64_t> view{tokens};
  for (std::int64_t d = 1; d < per_token.dim(); ++d) view.push_back(1);
  masked = per_token * token_valid.view(view).to(per_token.scalar_type());
  at::Tensor out = rmpad ? at::zeros(out_shape, per_token.options()).index_copy(0, index, masked) : masked;
  std::vector<std::int64_t> final_shape{batch, seq};
  for (std::int64_t d = 1; d < per_token.dim(); ++d) final_shape.push_back(per_token.size(d));
  return out.reshape(final_shape);
}

}  // namespace megadsl
