#include "megadsl/require_valid.hpp"
#include "megadsl/parallel/distributed.hpp"

#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/util/Logging.h>

#include <algorithm>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "megadsl/parallel/agreement.hpp"
#include "megadsl/parallel/launcher.hpp"
#include "megadsl/parallel/liveness.hpp"
#include "megadsl/rules.hpp"

namespace megadsl {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::int64_t env_int(const char* name, const std::string& value) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used != value.size()) throw std::invalid_argument("trailing characters");
    return v;
  } catch (const std::exception&) {
    throw std::invalid_argument(std::string("megadsl: environment variable ") + name + "='" + value +
                                "' is not an integer");
  }
}

}  // namespace

std::optional<dist_env> dist_env::from_environment() {
  dist_env e;
  const auto rank = env("RANK") ? env("RANK") : env("SLURM_PROCID");
  const auto world = env("WORLD_SIZE") ? env("WORLD_SIZE") : env("SLURM_NTASKS");
  if (!rank || !world) return std::nullopt;
  e.rank = env_int("RANK", *rank);
  e.world = env_int("WORLD_SIZE", *world);
  if (auto l = env("LOCAL_RANK") ? env("LOCAL_RANK") : env("SLURM_LOCALID")) e.local_rank = env_int("LOCAL_RANK", *l);
  if (auto a = env("MASTER_ADDR")) e.master_addr = *a;
  else if (e.world > 1)
    throw std::invalid_argument("megadsl: MASTER_ADDR is not set; set it to the address of rank 0 (torchrun and the megadsl launcher do)");
  if (auto p = env("MASTER_PORT")) e.master_port = static_cast<int>(env_int("MASTER_PORT", *p));
  if (e.world < 1 || e.rank < 0 || e.rank >= e.world)
    throw std::invalid_argument("megadsl: RANK=" + std::to_string(e.rank) + " is outside WORLD_SIZE=" +
                                std::to_string(e.world));
  return e;
}

at::Device local_device(bool cuda) {
  if (!cuda) return at::kCPU;
  const bool has = at::detail::getCUDAHooks().hasCUDA();
  const c10::DeviceIndex count = has ? at::accelerator::deviceCount() : 0;
  if (count == 0)
    throw std::runtime_error("megadsl: a CUDA device was asked for, but this machine has none (or the "
                             "LibTorch in use was built without CUDA); run on the CPU instead");
  std::int64_t local = 0;
  if (auto l = env("LOCAL_RANK") ? env("LOCAL_RANK") : env("SLURM_LOCALID")) local = env_int("LOCAL_RANK", *l);
  const auto index = static_cast<c10::DeviceIndex>(local % count);
  at::accelerator::setDeviceIndex(index);  // NCCL communicators and kernels of this rank go there
  return {at::kCUDA, index};
}

std::int64_t local_world_size() {
  if (auto l = env("LOCAL_WORLD_SIZE")) return std::max<std::int64_t>(1, env_int("LOCAL_WORLD_SIZE", *l));
  return 1;
}

std::chrono::milliseconds default_timeout() {
  if (auto t = env("MEGADSL_TIMEOUT_S")) return std::chrono::milliseconds(env_int("MEGADSL_TIMEOUT_S", *t) * 1000);
  return std::chrono::milliseconds(120'000);
}

distributed::distributed(const dist_env& e, std::chrono::milliseconds timeout) : env_(e), timeout_(timeout) {
  if (env_.world == 1) {
    store_ = c10::make_intrusive<c10d::HashStore>();
    return;
  }
  // A peer that dies makes c10d's store client log a warning with a whole C++ backtrace before it
  // throws, ahead of megadsl's one line naming the rank: c10's log warnings are off in a job unless
  // TORCH_CPP_LOG_LEVEL asks for them (errors still print).
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
  // A write to a peer that has died must fail as an error the rank can name, not end the process
  // silently: Gloo writes its sockets with writev, which raises SIGPIPE on a closed connection
  // (a rank continued after a freeze, its peers gone, died that way before saying it was frozen).
  // Python ignores SIGPIPE already; a C++ program that chose its own handler keeps it.
  if (struct sigaction old{}; ::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env_.master_port);
  opts.isServer = env_.rank == 0;
  opts.numWorkers = static_cast<std::size_t>(env_.world);
  opts.waitWorkers = true;
  opts.timeout = timeout_;
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, opts);
  } catch (const std::exception& err) {
    throw std::runtime_error("megadsl: rank " + std::to_string(env_.rank) + " could not join the rendezvous at " +
                             env_.master_addr + ":" + std::to_string(env_.master_port) + " within " +
                             std::to_string(timeout_.count() / 1000) + " s (" + err.what() + ")");
  }
  // The watch talks over a connection of its own, so a main thread blocked in the store (a group's
  // rendezvous) or in a collective never delays a heartbeat or a verdict.
  c10d::TCPStoreOptions watch_opts;
  watch_opts.port = opts.port;
  watch_opts.isServer = false;
  watch_opts.waitWorkers = false;
  watch_opts.timeout = std::chrono::milliseconds(10'000);
  start_watch(c10::make_intrusive<c10d::TCPStore>(env_.master_addr, watch_opts),
              {.rank = env_.rank, .world = env_.world, .peer_timeout = default_peer_timeout()});
}

distributed::distributed() : timeout_(default_timeout()), store_(c10::make_intrusive<c10d::HashStore>()) {}

void distributed::finish() {
  if (env_.world == 1 || done_) return;
  done_ = true;
  // Leave together: until every rank has finished, this one still ends if a peer dies (the watch
  // runs), so no rank of a job that lost one exits 0.
  store_->add("megadsl/finished", 1);
  const auto start = std::chrono::steady_clock::now();
  while (store_->add("megadsl/finished", 0) < env_.world) {
    if (std::chrono::steady_clock::now() - start > timeout_)
      throw std::runtime_error("megadsl: rank " + std::to_string(env_.rank) + " finished, but not every rank did within " +
                               std::to_string(timeout_.count() / 1000) + " s (a rank is stuck; MEGADSL_TIMEOUT_S)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop_watch();
  // Rank 0 hosts the store: it leaves last, so that no peer's last request meets a closed store.
  store_->add("megadsl/left", 1);
  if (env_.rank == 0) {
    const auto left = std::chrono::steady_clock::now();
    while (store_->add("megadsl/left", 0) < env_.world &&
           std::chrono::steady_clock::now() - left < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void distributed::fail(const std::string& reason) {
  if (env_.world == 1 || done_) return;
  done_ = true;
  post_job_failure("rank " + std::to_string(env_.rank) + " failed: " + reason);
  wait_for_failure_readers();
}

distributed::~distributed() {
  if (env_.world == 1) return;
  if (!done_) {
    try {
      finish();
    } catch (const std::exception& e) {
      std::cerr << "[rank " << env_.rank << "] " << e.what() << "\n";
    }
  }
  stop_watch();
}

std::unique_ptr<comm_group> distributed::make_group(const std::string& name,
                                                    const std::vector<std::int64_t>& ranks,
                                                    std::int64_t generation) const {
  return std::make_unique<comm_group>(name, ranks, env_.rank, store_, timeout_, generation);
}

parallel_groups parallel_groups::build(distributed& d, const layout& l) {
  require_valid(dynamic_shape, l, run_facts{.world = d.world()});  // the layout alone: no model yet
  const std::int64_t gen = d.next_generation();
  parallel_groups g;
  g.grid = rank_grid::from(l, d.world());
  const std::int64_t r = d.rank();
  g.me = g.grid.coords(r);
  // The world group first: every rank builds it whatever its layout, and over it the ranks check
  // that they asked for the same layout before any group of the layout is built (ranks that
  // disagree would wait for each other's groups until the store's timeout).
  std::vector<std::int64_t> all(static_cast<std::size_t>(d.world()));
  for (std::int64_t i = 0; i < d.world(); ++i) all[static_cast<std::size_t>(i)] = i;
  g.world = d.make_group("world", all, gen);
  agree_on(*g.world, "asked for different layouts", fields_of(l), "every rank of the job must use the same layout");
  g.tp = d.make_group("tp", g.grid.tp_group(r), gen);
  g.pp = d.make_group("pp", g.grid.pp_group(r), gen);
  g.dp = d.make_group("dp", g.grid.dp_group(r), gen);
  if (g.grid.cp > 1) {
    g.cp = d.make_group("cp", g.grid.cp_group(r), gen);
    g.dp_cp = d.make_group("dp_cp", g.grid.dp_cp_group(r), gen);
    if (megadsl::cp_ring(l) && cp_a2a_size(l) > 1) {
      // Hierarchical cp: all-to-all groups of cp_a2a consecutive cp ranks, and rings of the ranks
      // at one place in each of them (Megatron's hierarchical_context_parallel_sizes order).
      const rank_list all_cp = g.grid.cp_group(r);
      const std::int64_t a2a = cp_a2a_size(l), first = g.me.cp / a2a * a2a;
      rank_list a2a_ranks(all_cp.begin() + first, all_cp.begin() + first + a2a), ring_ranks;
      for (std::int64_t i = g.me.cp % a2a; i < g.grid.cp; i += a2a) ring_ranks.push_back(all_cp[static_cast<std::size_t>(i)]);
      g.cp_a2a = d.make_group("cp_a2a", a2a_ranks, gen);
      g.cp_ring = d.make_group("cp_ring", ring_ranks, gen);
    }
  }
  if (g.grid.in_embedding_group(r)) g.embedding = d.make_group("embedding", g.grid.embedding_group(r), gen);
  if (l.ep.get() > 1) {
    const expert_grid experts = expert_grid::from(l, d.world());
    g.ep = d.make_group("ep", experts.ep_group(r), gen);
    g.edp = d.make_group("edp", experts.edp_group(r), gen);
  }
  return g;
}

parallel_groups parallel_groups::single() {
  parallel_groups g;
  static const distributed alone;
  g.grid = rank_grid{};
  g.tp = alone.make_group("tp", {0});
  g.pp = alone.make_group("pp", {0});
  g.dp = alone.make_group("dp", {0});
  g.embedding = alone.make_group("embedding", {0});
  g.world = alone.make_group("world", {0});
  return g;
}

int run_ranks(int argc, char** argv, int ranks, const std::function<int(distributed&)>& body) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--ranks") == 0) ranks = std::atoi(argv[i + 1]);
  if (auto e = dist_env::from_environment()) {
    // Several ranks on one machine share its cores: without this each would start one intra-op
    // thread per core and they would oversubscribe the machine. MEGADSL_THREADS overrides.
    if (auto t = env("MEGADSL_THREADS")) at::set_num_threads(static_cast<int>(env_int("MEGADSL_THREADS", *t)));
    else if (auto local = env("LOCAL_WORLD_SIZE"))
      at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                          static_cast<int>(env_int("LOCAL_WORLD_SIZE", *local))));
    std::optional<distributed> d;
    try {
      d.emplace(*e);
      const int status = body(*d);
      d->finish();
      return status;
    } catch (const std::exception& err) {
      std::string what = err.what();
      if (auto cut = what.find("\nException raised from"); cut != std::string::npos) what.resize(cut);
      std::cerr << "[rank " << e->rank << "] " << what << "\n" << std::flush;
      // The other ranks end at once rather than wait in a collective for this one.
      if (d) d->fail(what.substr(0, what.find('\n')));
      return 1;
    }
  }
  std::vector<std::string> args(argv, argv + argc);
  launch_options o;
  o.ranks = ranks;
  return launch_local(args, o);
}

}  // namespace megadsl
