// One process of a distributed job: its rank, the rendezvous store, and the groups of a layout.
//
// Environment (torchrun / srun compatible, DESIGN §12): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT; under srun SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID stand in for the first three.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "megadsl/layout.hpp"
#include "megadsl/parallel/comm.hpp"
#include "megadsl/rank_grid.hpp"

namespace c10d {
class Store;
}

namespace megadsl {

struct dist_env {
  std::int64_t rank = 0;
  std::int64_t world = 1;
  std::int64_t local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  // nullopt when no launcher set the variables (a plain single-process run).
  static std::optional<dist_env> from_environment();
};

// The device of this local rank: with `cuda`, CUDA device LOCAL_RANK % device count (made this
// thread's current device, where its NCCL communicators live); else the CPU. Throws when `cuda` is
// asked for on a machine without a GPU.
at::Device local_device(bool cuda);

// Timeout of every collective and of the rendezvous; MEGADSL_TIMEOUT_S overrides (default 120 s).
std::chrono::milliseconds default_timeout();

// Processes of this job on this machine: LOCAL_WORLD_SIZE (torchrun, megadsl's launcher), or 1.
std::int64_t local_world_size();

class distributed {
 public:
  // Connects to the store (rank 0 hosts it) and starts this rank's heartbeat.
  explicit distributed(const dist_env& env, std::chrono::milliseconds timeout = default_timeout());
  // A world of one, with no store or transport (single-process runs and references).
  distributed();
  // Leaves with every other rank (finish() unless fail() was called; errors are printed).
  ~distributed();

  // This rank's part is done: waits until every rank's is (ending this one if a peer dies
  // meanwhile), then leaves; rank 0, the store's host, leaves last. Throws if a rank never finishes.
  void finish();
  // This rank failed with `reason`: every other rank ends at once, printing it.
  void fail(const std::string& reason);

  [[nodiscard]] std::int64_t rank() const { return env_.rank; }
  [[nodiscard]] std::int64_t world() const { return env_.world; }
  [[nodiscard]] std::chrono::milliseconds timeout() const { return timeout_; }
  [[nodiscard]] const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // A group over `ranks` (this rank must be in it). `generation` keeps the rendezvous keys of
  // groups built at different times apart; every member must pass the same one.
  [[nodiscard]] std::unique_ptr<comm_group> make_group(const std::string& name,
                                                       const std::vector<std::int64_t>& ranks,
                                                       std::int64_t generation = 0) const;
  // Numbers the collective group sets this process builds (every rank builds them in one order).
  std::int64_t next_generation() { return ++generation_; }

 private:
  dist_env env_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::int64_t generation_ = 0;
  bool done_ = false;  // finish() or fail() was called
};

// The groups one rank takes part in under a layout (rank grid in Megatron order, DESIGN §3).
struct parallel_groups {
  rank_grid grid;
  rank_coords me{};
  std::unique_ptr<comm_group> tp, pp, dp, embedding;
  std::unique_ptr<comm_group> world;  // every rank: checkpoint barriers and agreement on errors
  // With cp > 1: the ranks sharing one sequence's tokens (Ulysses attention's all-to-all, the
  // outputs' gather), and dp x cp, where the gradients are summed (each cp rank's are partial).
  // Null at cp = 1.
  std::unique_ptr<comm_group> cp, dp_cp;
  // With cp_comm a2a+ring: this rank's all-to-all group (cp_a2a consecutive cp ranks) and its ring
  // (the cp ranks at its place in every all-to-all group). Null otherwise.
  std::unique_ptr<comm_group> cp_a2a, cp_ring;
  // With ep > 1 (Megatron's expert grid, rank_grid.hpp): the ranks whose tokens meet at the
  // experts (all-to-all), and the replicas of one rank's experts (their gradients' sum). Null at
  // ep = 1, where experts are replicated like every other weight: over dp.
  std::unique_ptr<comm_group> ep, edp;

  // Where the gradients of a dense parameter are summed (and the distributed optimizer's slices
  // lie): dp x cp, which is dp at cp = 1.
  [[nodiscard]] const comm_group& gradient_dp() const { return dp_cp ? *dp_cp : *dp; }

  // Checks the layout against the world size with the rules' words (world_fits_layout).
  static parallel_groups build(distributed& d, const layout& l);
  // tp = pp = dp = 1 groups of one: what a single-process reference model uses.
  static parallel_groups single();
};

// Runs `body` on every rank of a job: under torchrun/srun/the megadsl launcher it runs once in
// this process; otherwise it re-executes this program `ranks` times on this machine (ranks from
// `--ranks N` in argv if present) and returns the launcher's exit code.
int run_ranks(int argc, char** argv, int ranks, const std::function<int(distributed&)>& body);

}  // namespace megadsl
