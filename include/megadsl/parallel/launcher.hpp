// The local launcher: starts N processes of a program on this machine (the CPU path's torchrun).
//
// Each child gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT.
// When a child fails, the launcher names it ("rank 2 was killed by signal 9"), gives the others
// `grace` to report their own errors, then stops them: a failed job never hangs. A SIGTERM, SIGINT
// or SIGHUP to the launcher is passed on to every rank (which removes what it was writing), and a
// rank not gone 2 s later is killed, before the launcher ends by that signal; a launcher
// killed outright takes its ranks with it (PR_SET_PDEATHSIG): no rank outlives the command.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace megadsl {

struct launch_options {
  int ranks = 2;
  // After the first rank fails: the others read the job's failure within a second (liveness.hpp)
  // and end; one still running after `grace` (stopped, or hung) is killed, so a job whose rank is
  // declared dead ends within the peer timeout (5 s) and this.
  std::chrono::seconds grace{3};
  std::vector<std::pair<std::string, std::string>> extra_env;
};

// Returns 0 when every rank exited 0, else the first failing rank's exit code (or 128 + signal).
int launch_local(const std::vector<std::string>& argv, const launch_options& options);

// A free TCP port on 127.0.0.1.
int free_port();

}  // namespace megadsl
