// Catch2 inside every rank: `mp_tests --ranks N [catch args]` starts N local ranks (megadsl's
// launcher), each running the same test cases in the same order, so their collectives meet.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "mp_support.hpp"

namespace megadsl::test {
distributed* current = nullptr;
distributed& dist() { return *current; }
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
    return rc;
  });
}
