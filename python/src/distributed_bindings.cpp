// megadsl.init() / shutdown() / rank() / world_size(): one `megadsl::distributed` per process,
// joined from the launcher's environment (torchrun, srun, megadsl.launch_local). The Python side
// (megadsl/_dist.py) reads the environment and settles the rendezvous port; this file holds the
// process's one `distributed`.
#include <ATen/Parallel.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "bindings.hpp"
#include "dynamic_model.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "world.hpp"

namespace py = pybind11;

namespace megadsl::python {
namespace {

std::mutex world_mutex;
std::shared_ptr<distributed> world;  // guarded by world_mutex

// Several ranks on one machine share its cores (what run_ranks does for the C++ programs):
// MEGADSL_THREADS wins; else an OMP_NUM_THREADS the launcher or user set is kept; else the cores
// are split over LOCAL_WORLD_SIZE ranks.
void share_cores(std::int64_t local_world) {
  if (const char* t = std::getenv("MEGADSL_THREADS")) {
    at::set_num_threads(std::max(1, std::atoi(t)));
    return;
  }
  if (std::getenv("OMP_NUM_THREADS") != nullptr || local_world <= 1) return;
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  at::set_num_threads(std::max(1, cores / static_cast<int>(local_world)));
}

}  // namespace

std::shared_ptr<distributed> joined_world() {
  std::lock_guard lock(world_mutex);
  return world;
}

std::shared_ptr<distributed> world_or_single() {
  if (auto w = joined_world()) return w;
  return std::make_shared<distributed>();
}

void bind_distributed(py::module_& m) {
  m.def(
      "_init",
      [](std::int64_t rank, std::int64_t world_size, std::int64_t local_rank, std::int64_t local_world_size,
         const std::string& master_addr, int master_port, std::optional<double> timeout_s) {
        {
          std::lock_guard lock(world_mutex);
          if (world)
            throw std::runtime_error("megadsl.init: this process already joined a job (rank " +
                                     std::to_string(world->rank()) + " of " + std::to_string(world->world()) +
                                     "); call megadsl.shutdown() first");
        }
        dist_env e;
        e.rank = rank;
        e.world = world_size;
        e.local_rank = local_rank;
        e.master_addr = master_addr;
        e.master_port = master_port;
        if (world_size < 1 || rank < 0 || rank >= world_size)
          throw py::value_error("megadsl.init: RANK=" + std::to_string(rank) + " is outside WORLD_SIZE=" +
                                std::to_string(world_size));
        const auto timeout = timeout_s ? std::chrono::milliseconds(static_cast<std::int64_t>(*timeout_s * 1000))
                                       : default_timeout();
        share_cores(local_world_size);
        std::shared_ptr<distributed> d;
        {
          py::gil_scoped_release release;  // the rendezvous waits for every rank
          d = std::make_shared<distributed>(e, timeout);
        }
        std::lock_guard lock(world_mutex);
        world = std::move(d);
      },
      py::arg("rank"), py::arg("world_size"), py::arg("local_rank"), py::arg("local_world_size"),
      py::arg("master_addr"), py::arg("master_port"), py::arg("timeout_s") = py::none());
  m.def(
      "shutdown",
      [] {
        std::shared_ptr<distributed> d;
        {
          std::lock_guard lock(world_mutex);
          d = std::move(world);
        }
        py::gil_scoped_release release;  // Gloo's threads may need it while the groups go
        close_all_models();
        d.reset();  // leaves together with the peers
      },
      R"(Closes every Model of this process and leaves the job megadsl.init() joined (together with the
other ranks, which should call it too). Registered to run at exit.)");
  m.def("is_initialized", [] { return joined_world() != nullptr; }, "Whether megadsl.init() joined a job.");
  m.def(
      "rank", [] { auto w = joined_world(); return w ? w->rank() : std::int64_t{0}; },
      "This process's global rank (0 when megadsl.init() was not called).");
  m.def(
      "world_size", [] { auto w = joined_world(); return w ? w->world() : std::int64_t{1}; },
      "Ranks in the job (1 when megadsl.init() was not called).");
}

}  // namespace megadsl::python
