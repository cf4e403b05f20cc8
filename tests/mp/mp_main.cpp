// Catch2 inside every rank: `mp_tests --ranks N [catch args]` starts N local ranks (megadsl's
// launcher), each running the same test cases in the same order, so their collectives meet.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include <ATen/ATen.h>

#include "megadsl/parallel/comm.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
distributed* current = nullptr;
distributed& dist() { return *current; }

namespace {

// The scratch directories the cases wrote under the temp directory (test_hf_checkpoint.cpp's
// scratch: megadsl-test-<pid>-<rank>-*, and the ranks' shared ones: megadsl-test-<port>-*) go once
// every rank has passed; a failure keeps them to look at. Every rank calls it, whatever its result.
void remove_scratch(distributed& d, int rc) {
  namespace fs = std::filesystem;
  std::vector<std::int64_t> ranks(static_cast<std::size_t>(d.world()));
  std::iota(ranks.begin(), ranks.end(), 0);
  at::Tensor failed = at::full({1}, rc != 0 ? 1 : 0, at::kLong);
  d.make_group("mp-main-scratch", ranks, d.next_generation())->all_reduce(failed);  // also: no rank still reads them
  if (failed.item<std::int64_t>() != 0) return;
  const char* port = std::getenv("MASTER_PORT");
  std::vector<std::string> mine{"megadsl-test-" + std::to_string(::getpid()) + "-" + std::to_string(d.rank()) + "-"};
  if (d.rank() == 0) mine.push_back("megadsl-test-" + std::string(port ? port : "0") + "-");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    for (const std::string& prefix : mine)
      if (name.rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
}

}  // namespace
}  // namespace megadsl::test

int main(int argc, char** argv) {
  return megadsl::run_ranks(argc, argv, 1, [&](megadsl::distributed& d) {
    megadsl::test::current = &d;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      if (std::strcmp(argv[i], "--ranks") == 0) {
        ++i;
        continue;
      }
      args.push_back(argv[i]);
    }
    std::string name = "rank " + std::to_string(d.rank());
    Catch::Session session;
    session.configData().name = name;
    const int rc = session.run(static_cast<int>(args.size()), args.data());
    megadsl::test::remove_scratch(d, rc);
    return rc;
  });
}
