// Dropout masks computed from keys (layers/dropout.hpp). The hash is a 32-bit integer mix (the
// "lowbias32" finalizer) in int64 tensor ops on any device: a value stays below 2^32 and a product
// below 2^49 (constants are multiplied 16 bits at a time), so no op overflows. An element is kept
// when the top 24 bits of its hash are at least p * 2^24.
#include "megadsl/layers/dropout.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "megadsl/layers/module.hpp"
#include "megadsl/runtime/packing.hpp"
#include "../runtime/name_seed.hpp"

namespace megadsl {
namespace {

constexpr std::int64_t low32 = 0xFFFFFFFFLL;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::int64_t low_half(std::uint64_t x) { return static_cast<std::int64_t>(x & 0xFFFFFFFFULL); }
std::int64_t high_half(std::uint64_t x) { return static_cast<std::int64_t>(x >> 32); }

// x * c mod 2^32 for x in [0, 2^32).
at::Tensor mul32(const at::Tensor& x, std::uint32_t c) {
  const std::int64_t lo = c & 0xFFFFu, hi = c >> 16;
  return at::bitwise_and(x * lo + at::bitwise_left_shift(at::bitwise_and(x * hi, 0xFFFF), 16), low32);
}

at::Tensor xor_shift(const at::Tensor& x, int bits) { return at::bitwise_xor(x, at::bitwise_right_shift(x, bits)); }

// A 32-bit mix of x in [0, 2^32).
at::Tensor hash32(const at::Tensor& x) {
  return xor_shift(mul32(xor_shift(mul32(xor_shift(x, 16), 0x7FEB352Du), 15), 0x846CA68Bu), 16);
}

at::Tensor mix(const at::Tensor& x, std::int64_t salt) { return hash32(at::bitwise_xor(x, salt)); }

// Kept (1 / (1 - p)) or dropped (0) by the hash's top 24 bits, in `dtype`.
at::Tensor keep_of(const at::Tensor& hashed, double p, at::ScalarType dtype) {
  const auto threshold = static_cast<std::int64_t>(std::llround(p * 16777216.0));
  return at::bitwise_right_shift(hashed, 8).ge(threshold).to(dtype).mul_(1.0 / (1.0 - p));
}

std::uint64_t place_salt(std::uint64_t salt, std::int64_t layer, std::int64_t place) {
  return splitmix64(salt ^ splitmix64(static_cast<std::uint64_t>(layer + 1) * 0x100000001B3ULL +
                                      static_cast<std::uint64_t>(place)));
}

// The attention's place in a layer: beyond any block node's number.
constexpr std::int64_t attention_place = 1 << 20;

// This rank's keys of `rows` residual-stream rows: its cp share's, of that its SP shard.
at::Tensor residual_keys(const layer_context& c, std::int64_t rows) {
  const at::Tensor& keys = c.dropout->keys;
  if (keys.size(0) == rows) return keys;
  TORCH_CHECK(c.sp && rows * c.tp_size == keys.size(0), "megadsl: dropout on ", rows, " rows of a stream of ",
              keys.size(0), " (tp ", c.tp_size, ", sp ", c.sp, ")");
  return keys.narrow(0, c.tp_rank * rows, rows);
}

}  // namespace

std::uint64_t dropout_step_salt(std::uint64_t seed, std::uint64_t call) { return splitmix64(splitmix64(seed) ^ call); }

at::Tensor dropout_token_keys(const packed_tokens& pk) {
  const std::int64_t tokens = pk.tokens, stream = pk.ids.size(0);
  const at::Tensor ids = at::bitwise_and(pk.ids.narrow(0, 0, tokens), low32);
  const at::Tensor pos = pk.positions.narrow(0, 0, tokens);
  const at::Tensor real = pk.token_valid.narrow(0, 0, tokens).gt(0).to(at::kLong);
  const at::Tensor row = at::floor_divide(pk.index, pk.seq);                    // (T,) the token's batch row
  const at::Tensor where = hash32(mul32(at::bitwise_and(pos, low32), 0x9E3779B1u));  // (T,) the position's
  // The row's key: the sum (mod 2^32) of its real tokens' hashes of (token, position).
  const at::Tensor each = hash32(at::bitwise_xor(ids, where)) * real;
  const at::Tensor sums = at::zeros({pk.batch}, each.options()).index_add_(0, row, each);
  const at::Tensor row_key = hash32(at::bitwise_and(sums, low32));                // (b,)
  const at::Tensor keys = hash32(at::bitwise_xor(row_key.index_select(0, row), where));  // (T,)
  return stream > tokens ? at::constant_pad_nd(keys, {0, stream - tokens}) : keys;
}

at::Tensor dropout_keep(const at::Tensor& keys, std::int64_t width, double p, std::uint64_t salt, at::ScalarType dtype,
                        std::int64_t first_column) {
  const std::uint64_t s = splitmix64(salt);
  const at::Tensor row = mix(keys, low_half(s));                                               // (n,)
  const at::Tensor col = mix(mul32(at::arange(first_column, first_column + width, keys.options()), 0x9E3779B1u),
                             high_half(s));                                                    // (width,)
  return keep_of(hash32(at::bitwise_xor(row.unsqueeze(1), col.unsqueeze(0))), p, dtype);       // (n, width)
}

at::Tensor attention_keep(const at::Tensor& query_keys, const at::Tensor& key_positions, std::int64_t heads,
                          const attention_dropout& d) {
  const std::uint64_t s = splitmix64(d.salt), t = splitmix64(s);
  const std::int64_t b = query_keys.size(0), sq = query_keys.size(1), sk = key_positions.size(1);
  const at::Tensor q = mix(query_keys, low_half(s));                                                     // (b, sq)
  const at::Tensor head = mix(mul32(at::arange(d.first_head, d.first_head + heads, query_keys.options()), 0x85EBCA77u),
                              high_half(s));                                                             // (H,)
  const at::Tensor qh = hash32(at::bitwise_xor(q.unsqueeze(1), head.view({1, heads, 1})));              // (b, H, sq)
  const at::Tensor col = mix(mul32(at::bitwise_and(key_positions, low32), 0x9E3779B1u), low_half(t));  // (b, sk)
  return keep_of(hash32(at::bitwise_xor(qh.unsqueeze(-1), col.view({b, 1, 1, sk}))), d.p, at::kFloat);  // (b, H, sq, sk)
}

at::Tensor residual_dropout(const at::Tensor& y, const layer_context& c, std::int64_t place) {
  if (c.dropout == nullptr || c.dropout->rates.residual == 0.0) return y;
  const double p = c.dropout->rates.residual;
  return y * dropout_keep(residual_keys(c, y.size(0)), y.size(1), p, place_salt(c.dropout->salt, c.layer, place),
                          y.scalar_type());
}

at::Tensor lora_input_dropout(const at::Tensor& x, const layer_context& c, std::string_view module, double p,
                              std::int64_t first_column) {
  if (c.dropout == nullptr || p == 0.0) return x;
  TORCH_CHECK(x.dim() == 2, "megadsl: LoRA dropout on ", module, ": its input is ", x.dim(), "-dimensional, not (rows, in)");
  // The module's place: its name's hash (a fused q/k/v's q_proj and v_proj draw their own masks).
  const auto place = static_cast<std::int64_t>(detail::name_seed(module, 0) >> 1);
  // x's rows: this rank's stream, its real tokens alone (a mixture's shared expert runs on them),
  // or its SP shard.
  const at::Tensor& keys = c.dropout->keys;
  const std::int64_t rows = x.size(0);
  const at::Tensor row_keys = rows == keys.size(0) ? keys : rows == c.pk.tokens ? keys.narrow(0, 0, rows) : residual_keys(c, rows);
  return x * dropout_keep(row_keys, x.size(1), p, place_salt(c.dropout->salt, c.layer, place), x.scalar_type(), first_column);
}

at::Tensor embedding_dropout(const at::Tensor& x, const layer_context& c) {
  if (c.dropout == nullptr || c.dropout->rates.embedding == 0.0) return x;
  const double p = c.dropout->rates.embedding;
  return x * dropout_keep(residual_keys(c, x.size(0)), x.size(1), p, place_salt(c.dropout->salt, -1, 0), x.scalar_type());
}

attention_dropout attention_dropout_of(const layer_context& c, std::int64_t first_head) {
  if (c.dropout == nullptr || c.dropout->rates.attention == 0.0) return {};
  const packed_tokens& pk = c.sequences();
  return {c.dropout->rates.attention, place_salt(c.dropout->salt, c.layer, attention_place), first_head,
          c.dropout->sequence_keys().narrow(0, 0, pk.tokens), pk.positions.narrow(0, 0, pk.tokens)};
}

}  // namespace megadsl
