// Pipeline schedules as explicit per-rank operation lists.
//
// What Megatron-Core's forward_backward_{no_pipelining, pipelining_without_interleaving,
// pipelining_with_interleaving} do on one pipeline rank, written out as data: a runtime executes
// the list step by step, the tests compare it with the worked orders of the reference, and `plan`
// simulates it (bubble, idle time) without running a model. Over 600 lines on purpose: the
// schedules, their validation, printing, bubble simulation and exchange all read one list of ops
// (sections below: operations, validation, the schedules, printing, bubbles, the exchange).
//
//   auto ops = megadsl::schedule_ops(megadsl::schedule_kind::one_f_one_b, /*pp*/ 4, /*rank*/ 0, /*m*/ 8);
//   megadsl::compute_order(ops)   // "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
//
// Executing a list. `forward`/`backward` run microbatch `microbatch` through the rank's virtual
// chunk `chunk`. Every other op is ONE Megatron `_communicate` call: up to four transfers issued
// together and all waited for before the next op (batch_isend_irecv; Megatron's batched order is
// send_prev, recv_prev, send_next, recv_next). A transfer names its tensor from this rank's side,
// as the (microbatch, chunk) of the local compute that produced it (sends) or will consume it
// (receives):
//   send_next  output activation of F(mb, c)    -> next_rank    (arrives as recv_prev, see arriving_as)
//   recv_prev  input activation of F(mb, c)     <- prev_rank
//   send_prev  input gradient from B(mb, c)      -> prev_rank
//   recv_next  output gradient for B(mb, c)      <- next_rank
// Pipeline ranks form a ring (Megatron): with vpp > 1 the last rank's chunk c feeds rank 0's
// chunk c + 1. With pp == 2 and vpp > 1 both directions join the same two ranks in one batch
// (Megatron forbids that without p2p overlap); tag transfers by direction (forward activations vs
// backward gradients) so each send meets its own receive. verify_exchange() replays all ranks'
// lists, batched or with blocking transfers in Megatron's even/odd order, and reports a mismatch or
// a deadlock instead of hanging.
//
// (Longer than most headers: the lists, their rules and the two replays, timing and exchange,
// share one op format and are read together.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "megadsl/layout.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/text.hpp"

namespace megadsl {

enum class schedule_kind : std::uint8_t { no_pipelining, one_f_one_b, interleaved };

constexpr std::string_view name_of(schedule_kind k) {
  switch (k) {
    case schedule_kind::no_pipelining: return "no_pipelining";
    case schedule_kind::one_f_one_b: return "one_f_one_b";
    case schedule_kind::interleaved: return "interleaved";
  }
  return "?";
}

// Megatron's get_forward_backward_func: pp > 1 with virtual chunks -> interleaved, pp > 1 -> 1F1B.
constexpr schedule_kind select_schedule(std::int64_t pp, std::int64_t vpp = 1) {
  if (pp > 1) return vpp > 1 ? schedule_kind::interleaved : schedule_kind::one_f_one_b;
  return schedule_kind::no_pipelining;
}

// Training runs forward and backward; forward_only is evaluation (log-probs, values): no
// backward, every microbatch in warmup (Megatron's forward_only=True).
enum class schedule_mode : std::uint8_t { train, forward_only };

// ---- operations ---------------------------------------------------------------------------------

enum class op_kind : std::uint8_t {
  forward,
  backward,
  // One p2p batch, named after the Megatron call with exactly these transfers.
  recv_forward,                                 // recv_prev
  send_forward,                                 // send_next
  recv_backward,                                // recv_next
  send_backward,                                // send_prev
  send_forward_recv_backward,                   // send_next + recv_next
  send_backward_recv_forward,                   // send_prev + recv_prev
  send_forward_recv_forward,                    // send_next + recv_prev (interleaved)
  send_backward_recv_backward,                  // send_prev + recv_next (interleaved)
  send_forward_backward_recv_forward_backward,  // any other combination (interleaved steady state)
};

constexpr std::string_view name_of(op_kind k) {
  constexpr std::string_view names[] = {
      "forward", "backward", "recv_forward", "send_forward", "recv_backward", "send_backward",
      "send_forward_recv_backward", "send_backward_recv_forward", "send_forward_recv_forward",
      "send_backward_recv_backward", "send_forward_backward_recv_forward_backward"};
  return names[static_cast<std::size_t>(k)];
}

// A tensor as the local rank names it: (microbatch, chunk) of the compute that makes or uses it.
struct tensor_id {
  std::int64_t microbatch = -1;  // -1: no transfer
  std::int64_t chunk = -1;
  [[nodiscard]] constexpr bool active() const { return microbatch >= 0; }
  constexpr bool operator==(const tensor_id&) const = default;
};

struct pipeline_op {
  op_kind kind = op_kind::forward;
  std::int64_t microbatch = -1;  // forward / backward
  std::int64_t chunk = -1;
  tensor_id send_next{}, recv_prev{}, send_prev{}, recv_next{};  // p2p: the active ones, one batch

  [[nodiscard]] constexpr bool is_compute() const {
    return kind == op_kind::forward || kind == op_kind::backward;
  }
  [[nodiscard]] constexpr bool is_p2p() const { return !is_compute(); }
  constexpr bool operator==(const pipeline_op&) const = default;
};

constexpr op_kind p2p_kind(bool send_next, bool recv_prev, bool send_prev, bool recv_next) {
  const int bits = (send_next ? 1 : 0) | (recv_prev ? 2 : 0) | (send_prev ? 4 : 0) | (recv_next ? 8 : 0);
  switch (bits) {
    case 2: return op_kind::recv_forward;
    case 1: return op_kind::send_forward;
    case 8: return op_kind::recv_backward;
    case 4: return op_kind::send_backward;
    case 1 | 8: return op_kind::send_forward_recv_backward;
    case 4 | 2: return op_kind::send_backward_recv_forward;
    case 1 | 2: return op_kind::send_forward_recv_forward;
    case 4 | 8: return op_kind::send_backward_recv_backward;
    default: return op_kind::send_forward_backward_recv_forward_backward;
  }
}

constexpr std::int64_t next_rank(std::int64_t pp, std::int64_t rank) { return (rank + 1) % pp; }
constexpr std::int64_t prev_rank(std::int64_t pp, std::int64_t rank) { return (rank + pp - 1) % pp; }

enum class p2p_direction : std::uint8_t { forward, backward };  // activations to next, grads to prev

// The name the receiving rank gives a tensor `rank` sends: the ring wraps to the next chunk
// forward (last rank's chunk c -> rank 0's chunk c + 1) and to the previous chunk backward.
constexpr tensor_id arriving_as(std::int64_t pp, std::int64_t rank, p2p_direction d, tensor_id id) {
  if (d == p2p_direction::forward && rank == pp - 1) ++id.chunk;
  if (d == p2p_direction::backward && rank == 0) --id.chunk;
  return id;
}

// ---- validation ---------------------------------------------------------------------------------

// Megatron's microbatch_group_size_per_vp_stage (N): 0 means its default, pp.
constexpr std::int64_t group_size_or_default(std::int64_t pp, std::int64_t group_size) {
  return group_size > 0 ? group_size : pp;
}

// The interleaved rules (Megatron): p <= N <= m (ValueError), and m % N == 0 or m % N >= p, else
// the last group of microbatches leaves dependency bubbles (RuntimeError). With N = p both say
// m % p == 0, and the message is rules.hpp's interleaved_microbatches (whose alternatives read
// "use 4 or 4" for m < p; here they are the two smallest multiples of p).
constexpr bool interleaved_group_ok(std::int64_t pp, std::int64_t m, std::int64_t n) {
  return pp <= n && n <= m && (m % n == 0 || m % n >= pp);
}

// Every schedule rule whose inputs are given, worded like rules.hpp (same `violations` type).
constexpr violations check_schedule(std::int64_t pp, std::int64_t microbatches, std::int64_t vpp = 1,
                                    std::int64_t group_size = 0) {
  violations out;
  const struct {
    std::string_view name;
    std::int64_t value;
  } sizes[] = {{"pp", pp}, {"microbatches", microbatches}, {"vpp", vpp}};
  for (const auto& [name, value] : sizes)
    if (value <= 0) out.add("positive_sizes").add(name, " = ", value, " must be positive");
  if (group_size < 0)
    out.add("positive_sizes")
        .add("microbatch_group_size_per_vp_stage = ", group_size, " must be >= 0 (0: pp)");
  if (!out.ok()) return out;
  if (vpp > 1 && pp == 1) {
    detail::check_pipeline(shape{}, layout{.pp = pp, .vpp = vpp}, out);  // vpp_needs_pp
    return out;
  }
  if (vpp == 1) return out;
  const std::int64_t m = microbatches, n = group_size_or_default(pp, group_size);
  if (n == pp) {  // rules.hpp's wording; the alternatives are the nearest positive multiples of pp
    if (m % pp != 0)
      out.add("interleaved_microbatches")
          .add("number of microbatches ", m, " is not divisible by pp = ", pp,
               " with the interleaved schedule; use ", m < pp ? pp : m / pp * pp, " or ",
               m < pp ? 2 * pp : (m / pp + 1) * pp, " microbatches");
    return out;
  }
  if (interleaved_group_ok(pp, m, n)) return out;
  text& msg = out.add("interleaved_microbatches");
  if (n < pp || n > m)
    msg.add("microbatch_group_size_per_vp_stage = ", n, " must lie in [pp, microbatches] = [", pp,
            ", ", m, "] with the interleaved schedule; ");
  else
    msg.add("microbatches = ", m, " leave a last group of ", m % n, " < pp = ", pp,
            " with microbatch_group_size_per_vp_stage = ", n, " (a dependency bubble); ");
  if (m < pp) {
    msg.add("use at least pp = ", pp, " microbatches");
    return out;
  }
  msg.add("valid group sizes: ");
  detail::list_values(msg, m, [&](std::int64_t g) { return interleaved_group_ok(pp, m, g); });
  if (n >= pp) {
    std::int64_t lower = m - 1, upper = m + 1;
    while (lower >= n && !interleaved_group_ok(pp, lower, n)) --lower;
    while (!interleaved_group_ok(pp, upper, n)) ++upper;
    msg.add("; or with this group size use ");
    if (lower >= n) msg.add(lower, " or ");
    msg.add(upper, " microbatches");
  }
  return out;
}

// The run-time twin: throws std::invalid_argument with the same text.
constexpr void require_valid_schedule(std::int64_t pp, std::int64_t microbatches, std::int64_t vpp = 1,
                                      std::int64_t group_size = 0) {
  const violations v = check_schedule(pp, microbatches, vpp, group_size);
  if (!v.ok()) throw std::invalid_argument("megadsl: invalid schedule: " + std::string(v.joined().view()));
}

// ---- the schedules ------------------------------------------------------------------------------

// Megatron's get_schedule_table: for each group of N microbatches, for each chunk, the group's
// microbatches (the last group takes the remainder). Forward step k runs table[k].
constexpr std::vector<tensor_id> schedule_table(std::int64_t microbatches, std::int64_t vpp,
                                                std::int64_t group_size) {
  std::vector<tensor_id> table;
  table.reserve(static_cast<std::size_t>(microbatches * vpp));
  for (std::int64_t first = 0; first < microbatches; first += group_size) {
    const std::int64_t end = first + group_size >= microbatches ? microbatches : first + group_size;
    for (std::int64_t c = 0; c < vpp; ++c)
      for (std::int64_t mb = first; mb < end; ++mb) table.push_back({mb, c});
  }
  return table;
}

// Megatron's num_warmup_microbatches: forward steps before the steady state (whose first step is
// one more forward, then the first backward).
constexpr std::int64_t warmup_microbatches(schedule_kind kind, std::int64_t pp, std::int64_t pp_rank,
                                           std::int64_t microbatches, std::int64_t vpp = 1,
                                           std::int64_t group_size = 0,
                                           schedule_mode mode = schedule_mode::train) {
  switch (kind) {
    case schedule_kind::no_pipelining: return mode == schedule_mode::train ? 0 : microbatches;
    case schedule_kind::one_f_one_b: return std::min(pp - pp_rank - 1, microbatches);
    case schedule_kind::interleaved: {
      const std::int64_t total = microbatches * vpp;
      if (mode == schedule_mode::forward_only) return total;
      const std::int64_t n = group_size_or_default(pp, group_size);
      return std::min(2 * (pp - pp_rank - 1) + (vpp - 1) * n, total);
    }
  }
  return 0;
}

namespace detail {

struct op_list {
  std::vector<pipeline_op> ops;
  constexpr void compute(op_kind k, tensor_id id) { ops.push_back({.kind = k, .microbatch = id.microbatch, .chunk = id.chunk}); }
  // One _communicate call; dropped when it moves nothing (Megatron returns without a transfer).
  constexpr void p2p(tensor_id send_next, tensor_id recv_prev, tensor_id send_prev, tensor_id recv_next) {
    if (!send_next.active() && !recv_prev.active() && !send_prev.active() && !recv_next.active()) return;
    ops.push_back({.kind = p2p_kind(send_next.active(), recv_prev.active(), send_prev.active(), recv_next.active()),
                   .send_next = send_next, .recv_prev = recv_prev, .send_prev = send_prev, .recv_next = recv_next});
  }
};

constexpr std::vector<pipeline_op> no_pipelining_ops(std::int64_t m, schedule_mode mode) {
  op_list out;
  for (std::int64_t i = 0; i < m; ++i) {
    out.compute(op_kind::forward, {i, 0});
    if (mode == schedule_mode::train) out.compute(op_kind::backward, {i, 0});
  }
  return out.ops;
}

// forward_backward_pipelining_without_interleaving. First and last ranks skip the transfers to
// nobody (Megatron's recv_forward(..., is_first_stage) and friends return without communicating).
constexpr std::vector<pipeline_op> one_f_one_b_ops(std::int64_t pp, std::int64_t r, std::int64_t m,
                                                   schedule_mode mode) {
  op_list out;
  const bool first = r == 0, last = r == pp - 1, train = mode == schedule_mode::train;
  const tensor_id none{};
  const auto with_prev = [&](std::int64_t i) { return first ? none : tensor_id{i, 0}; };
  const auto with_next = [&](std::int64_t i) { return last ? none : tensor_id{i, 0}; };
  const std::int64_t warmup = std::min(pp - r - 1, m), remaining = m - warmup;
  for (std::int64_t i = 0; i < warmup; ++i) {
    out.p2p(none, with_prev(i), none, none);  // recv_forward
    out.compute(op_kind::forward, {i, 0});
    out.p2p(with_next(i), none, none, none);  // send_forward
  }
  if (remaining > 0) out.p2p(none, with_prev(warmup), none, none);
  for (std::int64_t i = 0; i < remaining; ++i) {
    const bool last_iteration = i == remaining - 1;
    const std::int64_t f = warmup + i;
    out.compute(op_kind::forward, {f, 0});
    if (!train) {
      out.p2p(with_next(f), none, none, none);
      if (!last_iteration) out.p2p(none, with_prev(f + 1), none, none);
      continue;
    }
    out.p2p(with_next(f), none, none, with_next(i));  // send_forward_recv_backward (oldest: i)
    out.compute(op_kind::backward, {i, 0});
    out.p2p(none, last_iteration ? none : with_prev(f + 1), with_prev(i), none);  // send_backward[_recv_forward]
  }
  if (!train) return out.ops;
  for (std::int64_t i = remaining; i < m; ++i) {
    out.p2p(none, none, none, with_next(i));  // recv_backward
    out.compute(op_kind::backward, {i, 0});
    out.p2p(none, none, with_prev(i), none);  // send_backward
  }
  return out.ops;
}

// forward_backward_pipelining_with_interleaving with Megatron's defaults (overlap_p2p_comm off).
constexpr std::vector<pipeline_op> interleaved_ops(std::int64_t pp, std::int64_t r, std::int64_t m,
                                                   std::int64_t vpp, std::int64_t n, schedule_mode mode) {
  op_list out;
  const tensor_id none{};
  const std::vector<tensor_id> table = schedule_table(m, vpp, n);
  const std::int64_t total = m * vpp;
  const bool first = r == 0, last = r == pp - 1, train = mode == schedule_mode::train;
  const std::int64_t warmup = warmup_microbatches(schedule_kind::interleaved, pp, r, m, vpp, n, mode);
  const std::int64_t remaining = total - warmup;
  const bool all_warmup = remaining == 0;
  const auto at = [&](std::int64_t k) { return table[static_cast<std::size_t>(k)]; };
  const auto fwd = [&](std::int64_t k) { return at(k); };
  const auto bwd = [&](std::int64_t k) { return tensor_id{at(k).microbatch, vpp - 1 - at(k).chunk}; };
  const auto sent_forward = [&](std::int64_t k) {  // nothing leaves the model's last stage
    return last && fwd(k).chunk == vpp - 1 ? none : fwd(k);
  };
  const auto sent_backward = [&](std::int64_t k) {  // nor leaves its first stage
    return first && bwd(k).chunk == 0 ? none : bwd(k);
  };
  // recv_tensor_from_previous_stage: what arrives after step k. The leading rank (first forward,
  // last backward) runs p - 1 steps ahead of the ring's far end, so it receives what that end
  // produced at step k - (p - 1), unless that came out of the far end's last chunk.
  const auto recv_forward_after = [&](std::int64_t k) {
    if (!first) return k + 1 < total ? fwd(k + 1) : none;
    if (k < pp - 1) return none;
    const tensor_id src = fwd(k - (pp - 1));
    return src.chunk == vpp - 1 ? none : tensor_id{src.microbatch, src.chunk + 1};
  };
  const auto recv_backward_after = [&](std::int64_t k) {
    if (!last) return k + 1 < total ? bwd(k + 1) : none;
    if (k < pp - 1) return none;
    const tensor_id src = bwd(k - (pp - 1));
    return src.chunk == 0 ? none : tensor_id{src.microbatch, src.chunk - 1};
  };

  if (!first) out.p2p(none, fwd(0), none, none);  // recv_forward for chunk 0
  for (std::int64_t k = 0; k < warmup; ++k) {
    out.compute(op_kind::forward, fwd(k));
    const tensor_id recv_prev = k == total - 1 ? none : recv_forward_after(k);
    if (k == warmup - 1 && train && !all_warmup)  // also fetch the first backward's gradient
      out.p2p(sent_forward(k), recv_prev, none, last ? none : bwd(0));
    else
      out.p2p(sent_forward(k), recv_prev, none, none);
  }
  for (std::int64_t k = 0; k < remaining; ++k) {
    const std::int64_t f = warmup + k;
    out.compute(op_kind::forward, fwd(f));
    out.compute(op_kind::backward, bwd(k));
    const tensor_id recv_prev = k == remaining - 1 ? none : recv_forward_after(f);
    out.p2p(sent_forward(f), recv_prev, sent_backward(k), recv_backward_after(k));
  }
  if (!train) return out.ops;
  if (all_warmup && !last) out.p2p(none, none, none, bwd(0));  // recv_backward
  for (std::int64_t k = remaining; k < total; ++k) {
    out.compute(op_kind::backward, bwd(k));
    out.p2p(none, none, sent_backward(k), k == total - 1 ? none : recv_backward_after(k));
  }
  return out.ops;
}

}  // namespace detail

// The operations pipeline rank `pp_rank` runs for one step of `microbatches` microbatches. Throws
// std::invalid_argument with the rule's message for an invalid schedule, or when `kind` is not the
// one select_schedule(pp, vpp) picks (1F1B at pp = 1 is accepted: it is no_pipelining's order).
constexpr std::vector<pipeline_op> schedule_ops(schedule_kind kind, std::int64_t pp, std::int64_t pp_rank,
                                                std::int64_t microbatches, std::int64_t vpp = 1,
                                                std::int64_t group_size = 0,
                                                schedule_mode mode = schedule_mode::train) {
  require_valid_schedule(pp, microbatches, vpp, group_size);
  if (pp_rank < 0 || pp_rank >= pp)
    throw std::invalid_argument("megadsl: schedule_ops: pp_rank = " + std::to_string(pp_rank) +
                                " is outside [0, " + std::to_string(pp) + ")");
  const schedule_kind expected = select_schedule(pp, vpp);
  if (kind != expected && !(kind == schedule_kind::one_f_one_b && pp == 1))
    throw std::invalid_argument("megadsl: schedule_ops: pp = " + std::to_string(pp) + " and vpp = " +
                                std::to_string(vpp) + " run the " + std::string(name_of(expected)) +
                                " schedule, not " + std::string(name_of(kind)) +
                                "; use select_schedule(pp, vpp)");
  switch (kind) {
    case schedule_kind::no_pipelining: return detail::no_pipelining_ops(microbatches, mode);
    case schedule_kind::one_f_one_b: return detail::one_f_one_b_ops(pp, pp_rank, microbatches, mode);
    case schedule_kind::interleaved:
      return detail::interleaved_ops(pp, pp_rank, microbatches, vpp,
                                     group_size_or_default(pp, group_size), mode);
  }
  return {};
}

// ---- printing -----------------------------------------------------------------------------------

// "F3" / "B0.1" for compute ops; "send_forward_recv_backward(send_next 3.0,recv_next 0.0)" for p2p
// (transfers in Megatron's batched order).
inline std::string to_string(const pipeline_op& op, bool with_chunk = false) {
  const auto id = [&](const tensor_id& t) {
    std::string s = std::to_string(t.microbatch);
    if (with_chunk || !op.is_compute()) s += "." + std::to_string(t.chunk);
    return s;
  };
  if (op.is_compute())
    return (op.kind == op_kind::forward ? "F" : "B") + id({op.microbatch, op.chunk});
  std::string s(name_of(op.kind));
  const std::pair<std::string_view, const tensor_id*> parts[] = {
      {"send_prev", &op.send_prev}, {"recv_prev", &op.recv_prev},
      {"send_next", &op.send_next}, {"recv_next", &op.recv_next}};
  char sep = '(';
  for (const auto& [name, t] : parts)
    if (t->active()) {
      s += sep;
      s += std::string(name) + " " + id(*t);
      sep = ',';
    }
  return s + ")";
}

// The compute ops alone, space separated: the form of the reference's worked orders.
inline std::string compute_order(const std::vector<pipeline_op>& ops, bool with_chunk = false) {
  std::string s;
  for (const pipeline_op& op : ops)
    if (op.is_compute()) s += (s.empty() ? "" : " ") + to_string(op, with_chunk);
  return s;
}

// ---- bubbles ------------------------------------------------------------------------------------

// Megatron's bubble fraction: pipeline bubble time over ideal compute time, (p-1)/m for 1F1B and
// (p-1)/(v*m) interleaved (Narayanan et al.).
constexpr double bubble_fraction(schedule_kind kind, std::int64_t pp, std::int64_t microbatches,
                                 std::int64_t vpp = 1) {
  const auto p = static_cast<double>(pp), m = static_cast<double>(microbatches);
  switch (kind) {
    case schedule_kind::no_pipelining: return 0.0;
    case schedule_kind::one_f_one_b: return (p - 1) / m;
    case schedule_kind::interleaved: return (p - 1) / (static_cast<double>(vpp) * m);
  }
  return 0.0;
}

// The same bubble as a share of wall time: a rank idles b/(1+b) of the step.
constexpr double idle_fraction(schedule_kind kind, std::int64_t pp, std::int64_t microbatches,
                               std::int64_t vpp = 1) {
  const double b = bubble_fraction(kind, pp, microbatches, vpp);
  return b / (1 + b);
}

// Time of one forward and one backward of one microbatch through one chunk. B = 2F is the usual
// estimate (the backward computes input and weight gradients); any positive values work.
struct op_costs {
  double forward = 1.0;
  double backward = 2.0;
};

struct rank_timing {
  double busy = 0;           // time spent in F and B
  double idle = 0;           // makespan - busy
  double idle_fraction = 0;  // idle / makespan: compare with idle_fraction()
  double bubble = 0;         // idle / busy: compare with bubble_fraction()
};

struct schedule_timing {
  double makespan = 0;
  std::vector<rank_timing> ranks;
};

// Runs every rank's compute ops in its list order, each as early as its dependencies allow:
// F(m) on global stage s after F(m) on s - 1; B(m) on s after B(m) on s + 1 and after F(m) on s
// (stage s = chunk * pp + rank). Communication takes no time and never holds a rank back, so
// this is the schedule's own bubble, the quantity Megatron's formula describes.
inline schedule_timing simulate_schedule(schedule_kind kind, std::int64_t pp, std::int64_t microbatches,
                                         std::int64_t vpp = 1, std::int64_t group_size = 0,
                                         op_costs costs = {}) {
  const std::int64_t stages = pp * vpp;
  std::vector<std::vector<pipeline_op>> lists;
  for (std::int64_t r = 0; r < pp; ++r)
    lists.push_back(schedule_ops(kind, pp, r, microbatches, vpp, group_size));
  // done[dir][stage][mb]: finish time, or -1 while unscheduled.
  std::vector<double> done(static_cast<std::size_t>(2 * stages * microbatches), -1.0);
  const auto slot = [&](int dir, std::int64_t stage, std::int64_t mb) -> double& {
    return done[static_cast<std::size_t>((dir * stages + stage) * microbatches + mb)];
  };
  std::vector<std::size_t> pc(static_cast<std::size_t>(pp), 0);
  std::vector<double> clock(static_cast<std::size_t>(pp), 0.0);
  schedule_timing out;
  out.ranks.resize(static_cast<std::size_t>(pp));
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t r = 0; r < pp; ++r) {
      auto& ops = lists[static_cast<std::size_t>(r)];
      auto& i = pc[static_cast<std::size_t>(r)];
      for (; i < ops.size(); ++i) {
        const pipeline_op& op = ops[i];
        if (!op.is_compute()) continue;
        const std::int64_t s = op.chunk * pp + r, mb = op.microbatch;
        double ready = clock[static_cast<std::size_t>(r)];
        if (op.kind == op_kind::forward) {
          if (s > 0 && slot(0, s - 1, mb) < 0) break;
          if (s > 0) ready = std::max(ready, slot(0, s - 1, mb));
        } else {
          if (slot(0, s, mb) < 0 || (s + 1 < stages && slot(1, s + 1, mb) < 0)) break;
          ready = std::max(ready, slot(0, s, mb));
          if (s + 1 < stages) ready = std::max(ready, slot(1, s + 1, mb));
        }
        const double cost = op.kind == op_kind::forward ? costs.forward : costs.backward;
        clock[static_cast<std::size_t>(r)] = ready + cost;
        slot(op.kind == op_kind::forward ? 0 : 1, s, mb) = ready + cost;
        out.ranks[static_cast<std::size_t>(r)].busy += cost;
        progress = true;
      }
    }
  }
  for (std::int64_t r = 0; r < pp; ++r)
    if (pc[static_cast<std::size_t>(r)] != lists[static_cast<std::size_t>(r)].size())
      throw std::logic_error("megadsl: simulate_schedule: rank " + std::to_string(r) +
                             " waits forever at " +
                             to_string(lists[static_cast<std::size_t>(r)][pc[static_cast<std::size_t>(r)]], true));
  out.makespan = *std::max_element(clock.begin(), clock.end());
  for (rank_timing& t : out.ranks) {
    t.idle = out.makespan - t.busy;
    t.idle_fraction = t.idle / out.makespan;
    t.bubble = t.idle / t.busy;
  }
  return out;
}

// ---- executing the exchange ---------------------------------------------------------------------

enum class p2p_semantics : std::uint8_t {
  batched,           // an op's transfers posted together, then all waited for (batch_isend_irecv)
  blocking_even_odd  // one blocking transfer at a time in Megatron's _p2p_ops order (p2p_order)
};

struct p2p_transfer {
  bool send = false;
  p2p_direction direction = p2p_direction::forward;
  tensor_id id{};  // as this rank names it
};

// The order to issue an op's transfers: batched, Megatron's send_prev, recv_prev, send_next,
// recv_next; blocking, even ranks send_next, recv_prev, send_prev, recv_next and odd ranks
// recv_prev, send_next, recv_next, send_prev, so that neighbours never both wait to send.
inline std::vector<p2p_transfer> p2p_order(const pipeline_op& op, std::int64_t rank,
                                           p2p_semantics semantics = p2p_semantics::batched) {
  using d = p2p_direction;
  const p2p_transfer sn{true, d::forward, op.send_next}, rp{false, d::forward, op.recv_prev},
      sp{true, d::backward, op.send_prev}, rn{false, d::backward, op.recv_next};
  std::vector<p2p_transfer> all = semantics == p2p_semantics::batched ? std::vector{sp, rp, sn, rn}
                                  : rank % 2 == 0                    ? std::vector{sn, rp, sp, rn}
                                                                     : std::vector{rp, sn, rn, sp};
  std::erase_if(all, [](const p2p_transfer& t) { return !t.id.active(); });
  return all;
}

struct exchange_report {
  bool ok = true;
  std::string error;           // the first mismatch, missing input or deadlock, naming ranks and ops
  std::int64_t transfers = 0;  // matched send/receive pairs
};

// Replays all ranks' lists together (lists[r] is pipeline rank r's, chunks of vpp): the k-th send
// on a channel (src, dst, direction) must meet the k-th receive there and carry the tensor the
// receiver expects, every F must have received its input and every B its output gradient, and the
// exchange must finish. Rendezvous semantics: a transfer completes once its partner is posted.
inline exchange_report verify_exchange(const std::vector<std::vector<pipeline_op>>& lists, std::int64_t vpp,
                                       p2p_semantics semantics = p2p_semantics::batched) {
  using channel = std::tuple<std::int64_t, std::int64_t, p2p_direction>;
  const auto pp = static_cast<std::int64_t>(lists.size());
  std::map<channel, std::vector<tensor_id>> posted[2];  // [send?]: tensors as the receiver names them
  struct wait {
    channel ch;
    bool send;
    std::size_t index;
  };
  struct rank_state {
    std::size_t pc = 0;
    bool started = false;
    std::vector<p2p_transfer> pending;
    std::vector<wait> waits;
    std::map<std::pair<std::int64_t, std::int64_t>, int> have;  // 1 F ran, 2 input in, 4 B ran, 8 grad in
  };
  std::vector<rank_state> ranks(lists.size());
  exchange_report report;
  const auto fail = [&](std::int64_t r, const std::string& why) {
    const auto& st = ranks[static_cast<std::size_t>(r)];
    report.ok = false;
    report.error = "rank " + std::to_string(r) + " op " + std::to_string(st.pc) + " " +
                   to_string(lists[static_cast<std::size_t>(r)][st.pc], true) + ": " + why;
    return report;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::int64_t r = 0; r < pp; ++r) {
      rank_state& st = ranks[static_cast<std::size_t>(r)];
      const auto& ops = lists[static_cast<std::size_t>(r)];
      for (; st.pc < ops.size(); ++st.pc, st.started = false, progress = true) {
        const pipeline_op& op = ops[st.pc];
        const std::int64_t stage = op.chunk * pp + r;
        if (op.kind == op_kind::forward) {
          int& h = st.have[{op.microbatch, op.chunk}];
          if (stage > 0 && !(h & 2)) return fail(r, "its input activation was never received");
          h |= 1;
          continue;
        }
        if (op.kind == op_kind::backward) {
          int& h = st.have[{op.microbatch, op.chunk}];
          if (!(h & 1)) return fail(r, "runs before its forward");
          if (stage + 1 < pp * vpp && !(h & 8)) return fail(r, "its output gradient was never received");
          h |= 4;
          continue;
        }
        if (!st.started) {
          st.started = true;
          st.pending = p2p_order(op, r, semantics);
          for (const p2p_transfer& t : st.pending)
            if (t.send && !(st.have[{t.id.microbatch, t.id.chunk}] & (t.direction == p2p_direction::forward ? 1 : 4)))
              return fail(r, "sends a tensor its compute has not produced yet");
        }
        while (!st.pending.empty() && (semantics == p2p_semantics::batched || st.waits.empty())) {
          const p2p_transfer t = st.pending.front();
          st.pending.erase(st.pending.begin());
          const bool towards_next = (t.direction == p2p_direction::forward) == t.send;
          const std::int64_t peer = towards_next ? next_rank(pp, r) : prev_rank(pp, r);
          const channel ch = t.send ? channel{r, peer, t.direction} : channel{peer, r, t.direction};
          auto& queue = posted[t.send ? 1 : 0][ch];
          queue.push_back(t.send ? arriving_as(pp, r, t.direction, t.id) : t.id);
          st.waits.push_back({ch, t.send, queue.size() - 1});
          progress = true;
        }
        for (std::size_t w = 0; w < st.waits.size();) {
          const wait x = st.waits[w];
          const auto& theirs = posted[x.send ? 0 : 1][x.ch];
          if (theirs.size() <= x.index) {
            ++w;
            continue;
          }
          const tensor_id sent = posted[1][x.ch][x.index], expected = posted[0][x.ch][x.index];
          if (!(sent == expected))
            return fail(r, "rank " + std::to_string(std::get<0>(x.ch)) + " sends " +
                               std::to_string(sent.microbatch) + "." + std::to_string(sent.chunk) +
                               " where rank " + std::to_string(std::get<1>(x.ch)) + " expects " +
                               std::to_string(expected.microbatch) + "." + std::to_string(expected.chunk));
          if (x.send)
            ++report.transfers;
          else
            st.have[{expected.microbatch, expected.chunk}] |= std::get<2>(x.ch) == p2p_direction::forward ? 2 : 8;
          st.waits.erase(st.waits.begin() + static_cast<std::ptrdiff_t>(w));
          progress = true;
        }
        if (!st.pending.empty() || !st.waits.empty()) break;  // blocked in this op
      }
    }
  }
  std::string stuck;
  for (std::int64_t r = 0; r < pp; ++r) {
    const rank_state& st = ranks[static_cast<std::size_t>(r)];
    if (st.pc < lists[static_cast<std::size_t>(r)].size())
      stuck += (stuck.empty() ? "deadlock: rank " : "; rank ") + std::to_string(r) + " waits in op " +
               std::to_string(st.pc) + " " + to_string(lists[static_cast<std::size_t>(r)][st.pc], true);
  }
  if (!stuck.empty()) report = {false, stuck, report.transfers};
  return report;
}

// The same for the lists schedule_ops produces on every rank.
inline exchange_report verify_exchange(schedule_kind kind, std::int64_t pp, std::int64_t microbatches,
                                       std::int64_t vpp = 1, std::int64_t group_size = 0,
                                       schedule_mode mode = schedule_mode::train,
                                       p2p_semantics semantics = p2p_semantics::batched) {
  std::vector<std::vector<pipeline_op>> lists;
  for (std::int64_t r = 0; r < pp; ++r)
    lists.push_back(schedule_ops(kind, pp, r, microbatches, vpp, group_size, mode));
  return verify_exchange(lists, vpp, semantics);
}

}  // namespace megadsl
