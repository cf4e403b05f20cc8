#include "megadsl/parallel/comm.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "megadsl/parallel/liveness.hpp"
#include "megadsl/torch_compat.hpp"

namespace megadsl {

comm_stats& global_comm_stats() {
  static comm_stats stats;
  return stats;
}

struct comm_group::impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
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
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      "megadsl/g" + std::to_string(generation) + "/" + name_ + list(ranks_), store);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 1;
  impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, index_, size(), options);
}

comm_group::~comm_group() = default;

void comm_group::fail(const char* op, const std::exception& e) const {
  std::ostringstream os;
  std::string backend = e.what();
  if (auto cut = backend.find("\nException raised from"); cut != std::string::npos) backend.resize(cut);
  os << "megadsl: " << op << " over the " << name_ << " group " << list(ranks_) << " failed on rank "
     << ranks_[static_cast<std::size_t>(index_)] << ": " << diagnose_peers(store_, ranks_, ranks_[static_cast<std::size_t>(index_)])
     << " (timeout " << timeout_.count() / 1000.0 << " s; backend: " << backend << ")";
  throw std::runtime_error(os.str());
}

template <class Op>
void comm_group::run(const char* op, std::int64_t bytes, Op&& issue) const {
  global_comm_stats().calls += 1;
  global_comm_stats().bytes += bytes;
  try {
    auto work = issue(*impl_->gloo);
    work->wait(timeout_);
  } catch (const std::exception& e) {
    fail(op, e);
  }
}

void comm_group::all_reduce(at::Tensor& t, reduce_op op) const {
  if (size() == 1) return;
  TORCH_CHECK(t.is_contiguous(), "megadsl: all_reduce needs a contiguous tensor");
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = op == reduce_op::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  o.timeout = timeout_;
  run("all_reduce", t.numel() * t.element_size(), [&](auto& g) { return g.allreduce(ts, o); });
}

at::Tensor comm_group::all_gather(const at::Tensor& t, int64_t dim) const {
  if (size() == 1) return t;
  at::Tensor in = t.contiguous();
  std::vector<at::Tensor> inputs{in};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < size(); ++i) outputs[0].push_back(at::empty_like(in));
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  run("all_gather", in.numel() * in.element_size(), [&](auto& g) { return g.allgather(outputs, inputs, o); });
  return at::cat(outputs[0], dim);
}

at::Tensor comm_group::reduce_scatter(const at::Tensor& t, int64_t dim) const {
  if (size() == 1) return t;
  TORCH_CHECK(t.size(dim) % size() == 0, "megadsl: reduce_scatter over ", name_, " needs dim ", dim,
              " (", t.size(dim), ") divisible by the group size ", size());
  // Gloo has no reduce-scatter: an all-reduce, then this rank's chunk (counted as what it moves).
  at::Tensor sum = t.contiguous().clone();
  all_reduce(sum, reduce_op::sum);
  return sum.chunk(size(), dim)[static_cast<std::size_t>(index_)].contiguous();
}

void comm_group::broadcast(at::Tensor& t, int root_index) const {
  if (size() == 1) return;
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root_index;
  o.timeout = timeout_;
  run("broadcast", t.numel() * t.element_size(), [&](auto& g) { return g.broadcast(ts, o); });
}

comm_group::pending_send comm_group::send(const at::Tensor& t, int dst_index, int tag) const {
  pending_send p;
  p.group_ = this;
  p.tensor_ = t.contiguous();
  global_comm_stats().calls += 1;
  global_comm_stats().bytes += p.tensor_.numel() * p.tensor_.element_size();
  std::vector<at::Tensor> ts{p.tensor_};
  try {
    auto work = impl_->gloo->send(ts, dst_index, tag);
    p.work_ = std::shared_ptr<void>(new c10::intrusive_ptr<compat::work>(std::move(work)),
                                    [](void* w) { delete static_cast<c10::intrusive_ptr<compat::work>*>(w); });
  } catch (const std::exception& e) {
    fail("send", e);
  }
  return p;
}

void comm_group::pending_send::wait() {
  if (work_ == nullptr) return;
  try {
    (*static_cast<c10::intrusive_ptr<compat::work>*>(work_.get()))->wait(group_->timeout_);
  } catch (const std::exception& e) {
    group_->fail("send", e);
  }
  work_.reset();
  tensor_ = at::Tensor();
}

void comm_group::recv(at::Tensor& into, int src_index, int tag) const {
  TORCH_CHECK(into.is_contiguous(), "megadsl: recv needs a contiguous buffer");
  std::vector<at::Tensor> ts{into};
  const auto start = std::chrono::steady_clock::now();
  run("recv", 0, [&](auto& g) { return g.recv(ts, src_index, tag); });
  global_comm_stats().recv_wait_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

void comm_group::barrier() const {
  if (size() == 1) return;
  at::Tensor one = at::zeros({1});
  all_reduce(one);
}

}  // namespace megadsl
