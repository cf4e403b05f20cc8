#include "megadsl/parallel/comm.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "megadsl/parallel/liveness.hpp"
#include "nccl_backend.hpp"

namespace megadsl {

comm_stats& global_comm_stats() {
  static comm_stats stats;
  return stats;
}

// Gloo carries CPU tensors; NCCL, built on the first CUDA tensor (every member issues the same
// collective on the same device, so they build it together), carries CUDA tensors.
struct comm_group::impl {
  c10::intrusive_ptr<c10d::Backend> gloo;
  c10::intrusive_ptr<c10d::Backend> nccl;
  c10::intrusive_ptr<c10d::Store> prefixed;
  std::mutex nccl_mu;
};

namespace {
std::string list(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace

comm_group::comm_group(std::string name, std::vector<std::int64_t> ranks, std::int64_t me,
                       const c10::intrusive_ptr<c10d::Store>& store,
                       std::chrono::milliseconds timeout, std::int64_t generation)
    : name_(std::move(name)), ranks_(std::move(ranks)), timeout_(timeout), store_(store),
      impl_(std::make_unique<impl>()) {
  auto it = std::find(ranks_.begin(), ranks_.end(), me);
  if (it == ranks_.end())
    throw std::invalid_argument("megadsl: rank " + std::to_string(me) + " is not in " + name_ +
                                " group " + list(ranks_));
  index_ = static_cast<int>(it - ranks_.begin());
  if (ranks_.size() == 1) return;  // a group of one needs no transport
  impl_->prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "megadsl/g" + std::to_string(generation) + "/" + name_ + list(ranks_), store);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 1;
  impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", impl_->prefixed), index_, size(), options);
}

comm_group::~comm_group() = default;

void comm_group::fail(const char* op, const std::exception& e) const {
  // Woken from a freeze its peers gave up on: the peers are gone because of this rank.
  if (const std::string frozen = frozen_reason(); !frozen.empty())
    throw std::runtime_error("megadsl: " + std::string(op) + " over the " + name_ + " group failed on rank " +
                             std::to_string(ranks_[static_cast<std::size_t>(index_)]) + ": " + frozen);
  std::ostringstream os;
  std::string backend = e.what();
  if (auto cut = backend.find("\nException raised from"); cut != std::string::npos) backend.resize(cut);
  if (auto cut = backend.find(". This is typically caused"); cut != std::string::npos) backend.resize(cut);  // Gloo's advice
  os << "megadsl: " << op << " over the " << name_ << " group " << list(ranks_) << " failed on rank "
     << ranks_[static_cast<std::size_t>(index_)] << ": " << diagnose_peers(store_, ranks_, ranks_[static_cast<std::size_t>(index_)])
     << " (timeout " << timeout_.count() / 1000.0 << " s; backend: " << backend << ")";
  // The job cannot go on: every other rank ends now, naming the failure, instead of waiting in
  // its own next collective for the timeout.
  post_job_failure(os.str().substr(9));  // without "megadsl: "
  throw std::runtime_error(os.str());
}

c10d::Backend& comm_group::backend_for(const at::Tensor& t) const {
  if (!t.is_cuda()) return *impl_->gloo;
  std::lock_guard<std::mutex> lock(impl_->nccl_mu);
  if (!impl_->nccl)
    impl_->nccl = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("nccl", impl_->prefixed),
                                    index_, size(), timeout_, name_);
  return *impl_->nccl;
}

namespace {
thread_local bool counting_checks = false;

// MEGADSL_CUDA_COMM=gloo: CUDA tensors are staged through host memory and carried by Gloo. NCCL
// wants one GPU per rank; this runs more local ranks than GPUs (every layout on one GPU, as the
// CUDA tier's multi-rank tests do). Slow: for tests, never for training.
bool staged(const at::Tensor& t) {
  static const bool on = [] {
    const char* v = std::getenv("MEGADSL_CUDA_COMM");
    return v != nullptr && std::string_view(v) == "gloo";
  }();
  return on && t.is_cuda();
}
}  // namespace

counted_as_checks::counted_as_checks() : previous_(counting_checks) { counting_checks = true; }
counted_as_checks::~counted_as_checks() { counting_checks = previous_; }

template <class Op>
void comm_group::run(const char* op, const at::Tensor& on, std::int64_t bytes, Op&& issue) const {
  if (counting_checks) {
    global_comm_stats().check_calls += 1;
    global_comm_stats().check_bytes += bytes;
  } else {
    global_comm_stats().calls += 1;
    global_comm_stats().bytes += bytes;
    if (name_.rfind("cp", 0) == 0) global_comm_stats().cp_bytes += bytes;  // cp, cp_a2a, cp_ring
  }
  try {
    auto work = issue(backend_for(on));
    work->wait(timeout_);
  } catch (const std::exception& e) {
    fail(op, e);
  }
}

void comm_group::all_reduce(at::Tensor& t, reduce_op op) const {
  if (size() == 1) return;
  if (staged(t)) {
    at::Tensor host = t.cpu();
    all_reduce(host, op);
    t.copy_(host);
    return;
  }
  TORCH_CHECK(t.is_contiguous(), "megadsl: all_reduce needs a contiguous tensor");
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = op == reduce_op::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  o.timeout = timeout_;
  const double n = size(), b = static_cast<double>(t.numel() * t.element_size());
  run("all_reduce", t, static_cast<std::int64_t>(2 * (n - 1) / n * b), [&](auto& g) { return g.allreduce(ts, o); });
}

// Both collectives work on the outermost dimension of a contiguous tensor (one flat buffer, no
// per-rank copies); another `dim` is moved there and back.
at::Tensor comm_group::all_gather(const at::Tensor& t, int64_t dim) const {
  if (size() == 1) return t;
  if (staged(t)) return all_gather(t.cpu(), dim).to(t.device());
  dim = dim < 0 ? dim + t.dim() : dim;
  if (t.scalar_type() == at::kBFloat16 && t.is_cpu() && t.dim() > 0) {
    // Gloo has no bf16 all-gather; gathering moves bits, so gather the bytes (each element's two
    // stay side by side along the last dim, whichever dim is gathered).
    return all_gather(t.contiguous().view(at::kByte), dim).view(at::kBFloat16);
  }
  at::Tensor in = t.movedim(dim, 0).contiguous();                // (n, ...)
  std::vector<std::int64_t> shape = in.sizes().vec();
  shape[0] *= size();
  at::Tensor out = at::empty(shape, in.options());                // (size * n, ...)
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  run("all_gather", in, (size() - 1) * in.numel() * in.element_size(),
      [&](auto& g) {
        if constexpr (requires { g.all_gather_single(out, in, o); }) return g.all_gather_single(out, in, o);
        else return g._allgather_base(out, in, o);  // LibTorch 2.11 names it so
      });
  return dim == 0 ? out : out.movedim(0, dim);
}

at::Tensor comm_group::reduce_scatter(const at::Tensor& t, int64_t dim) const {
  if (size() == 1) return t;
  if (staged(t)) return reduce_scatter(t.cpu(), dim).to(t.device());
  dim = dim < 0 ? dim + t.dim() : dim;
  TORCH_CHECK(t.size(dim) % size() == 0, "megadsl: reduce_scatter over ", name_, " needs dim ", dim,
              " (", t.size(dim), ") divisible by the group size ", size());
  at::Tensor in = t.movedim(dim, 0).contiguous();                 // (size * n, ...)
  std::vector<std::int64_t> shape = in.sizes().vec();
  shape[0] /= size();
  at::Tensor out = at::empty(shape, in.options());                 // (n, ...)
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = timeout_;
  run("reduce_scatter", in, (size() - 1) * out.numel() * out.element_size(),
      [&](auto& g) {
        if constexpr (requires { g.reduce_scatter_single(out, in, o); }) return g.reduce_scatter_single(out, in, o);
        else return g._reduce_scatter_base(out, in, o);  // LibTorch 2.11 names it so
      });
  return dim == 0 ? out : out.movedim(0, dim).contiguous();
}

at::Tensor comm_group::all_to_all(const at::Tensor& t, const std::vector<std::int64_t>& send_rows,
                                  const std::vector<std::int64_t>& recv_rows) const {
  const auto n = static_cast<std::size_t>(size());
  TORCH_CHECK(send_rows.size() == n && recv_rows.size() == n, "megadsl: all_to_all over ", name_, " needs one count per rank (",
              n, "), got ", send_rows.size(), " to send and ", recv_rows.size(), " to receive");
  std::int64_t sent = 0, received = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sent += send_rows[i];
    received += recv_rows[i];
  }
  TORCH_CHECK(sent == t.size(0), "megadsl: all_to_all over ", name_, ": the counts send ", sent, " rows of ", t.size(0));
  if (size() == 1) {
    TORCH_CHECK(received == sent, "megadsl: all_to_all over a group of one receives what it sends (", sent, " rows), not ",
                received);
    return t;
  }
  if (staged(t)) return all_to_all(t.cpu(), send_rows, recv_rows).to(t.device());
  at::Tensor in = t.contiguous();
  std::vector<std::int64_t> shape = in.sizes().vec();
  shape[0] = received;
  at::Tensor out = at::empty(shape, in.options());
  std::int64_t row_bytes = in.element_size();
  for (std::int64_t d = 1; d < in.dim(); ++d) row_bytes *= in.size(d);
  c10d::AllToAllOptions o;
  o.timeout = timeout_;
  std::vector<std::int64_t> out_splits = recv_rows, in_splits = send_rows;
  const std::int64_t leaving = (sent - send_rows[static_cast<std::size_t>(index_)]) * row_bytes;
  run("all_to_all", in, leaving, [&](auto& g) {
    if constexpr (requires { g.all_to_all_single(out, in, out_splits, in_splits, o); })
      return g.all_to_all_single(out, in, out_splits, in_splits, o);
    else return g.alltoall_base(out, in, out_splits, in_splits, o);  // LibTorch 2.11 names it so
  });
  global_comm_stats().all_to_all_bytes += leaving;
  return out;
}

void comm_group::broadcast(at::Tensor& t, int root_index) const {
  if (size() == 1) return;
  if (staged(t)) {
    at::Tensor host = t.cpu();
    broadcast(host, root_index);
    t.copy_(host);
    return;
  }
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root_index;
  o.timeout = timeout_;
  run("broadcast", t, t.numel() * t.element_size(), [&](auto& g) { return g.broadcast(ts, o); });
}

comm_group::pending_send comm_group::send(const at::Tensor& t, int dst_index, int tag) const {
  pending_send p;
  p.group_ = this;
  p.tensor_ = staged(t) ? t.cpu().contiguous() : t.contiguous();
  global_comm_stats().calls += 1;
  global_comm_stats().bytes += p.tensor_.numel() * p.tensor_.element_size();
  if (name_.rfind("cp", 0) == 0) global_comm_stats().cp_bytes += p.tensor_.numel() * p.tensor_.element_size();  // the ring's blocks
  std::vector<at::Tensor> ts{p.tensor_};
  try {
    auto work = backend_for(p.tensor_).send(ts, dst_index, tag);
    p.work_ = std::shared_ptr<void>(new c10::intrusive_ptr<c10d::Work>(std::move(work)),
                                    [](void* w) { delete static_cast<c10::intrusive_ptr<c10d::Work>*>(w); });
  } catch (const std::exception& e) {
    fail("send", e);
  }
  return p;
}

void comm_group::pending_send::wait() {
  if (work_ == nullptr) return;
  try {
    (*static_cast<c10::intrusive_ptr<c10d::Work>*>(work_.get()))->wait(group_->timeout_);
  } catch (const std::exception& e) {
    group_->fail("send", e);
  }
  work_.reset();
  tensor_ = at::Tensor();
}

void comm_group::recv(at::Tensor& into, int src_index, int tag) const {
  TORCH_CHECK(into.is_contiguous(), "megadsl: recv needs a contiguous buffer");
  if (staged(into)) {
    at::Tensor host = at::empty(into.sizes(), into.options().device(at::kCPU));
    recv(host, src_index, tag);
    into.copy_(host);
    return;
  }
  std::vector<at::Tensor> ts{into};
  const auto start = std::chrono::steady_clock::now();
  run("recv", into, 0, [&](auto& g) { return g.recv(ts, src_index, tag); });
  global_comm_stats().recv_wait_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

void comm_group::barrier() const {
  if (size() == 1) return;
  at::Tensor one = at::zeros({1});  // on the CPU: Gloo, whatever device the model uses
  all_reduce(one);
}

}  // namespace megadsl
