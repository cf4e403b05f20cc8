// The CUDA tier: `cuda_tests [--ranks N] [--need-gpus K] [catch args]`. Without K CUDA devices
// it prints why and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), never as passed.
// Otherwise it runs like mp_tests: N local ranks, each on CUDA device LOCAL_RANK % count.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../mp/mp_support.hpp"

namespace megadsl::test {
distributed* current = nullptr;
distributed& dist() { return *current; }
}  // namespace megadsl::test

int main(int argc, char** argv) {
  int need = 1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--need-gpus") == 0) need = std::atoi(argv[i + 1]);
  const int have = at::detail::getCUDAHooks().hasCUDA() ? static_cast<int>(at::accelerator::deviceCount()) : 0;
  if (have < need) {
    std::printf("skipped: this test needs %d CUDA device(s), this machine has %d\n", need, have);
    return 77;
  }
  return megadsl::run_ranks(argc, argv, 1, [&](megadsl::distributed& d) {
    megadsl::test::current = &d;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      if (std::strcmp(argv[i], "--ranks") == 0 || std::strcmp(argv[i], "--need-gpus") == 0) {
        ++i;
        continue;
      }
      args.push_back(argv[i]);
    }
    Catch::Session session;
    session.configData().name = "rank " + std::to_string(d.rank());
    return session.run(static_cast<int>(args.size()), args.data());
  });
}
