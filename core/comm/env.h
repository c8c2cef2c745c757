// What a worker learns from its launcher: torchrun's environment variables.
#pragma once
#include <string>

namespace distlab {

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;       // MASTER_PORT: the program's own (PyTorch's rank 0 binds its store there)
  int store_port = 0;        // distlab's rendezvous store: DISTLAB_STORE_PORT, else MASTER_PORT
  std::string store_token;   // DISTLAB_STORE_TOKEN: what the store asks of every client ("" = none)
  int launcher_pid = 0;      // DISTLAB_LAUNCHER_PID: the launcher this worker watches (0 = none)
  bool launched = false;  // false: no RANK/WORLD_SIZE set, a program run on its own is rank 0 of 1
};

// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's) and
// DISTLAB_STORE_PORT, DISTLAB_STORE_TOKEN, DISTLAB_LAUNCHER_PID (distlab run's); a missing or malformed
// variable (when some are set) is an error naming it.
LaunchEnv read_launch_env();
// The address of this machine that reaches `master_addr` (127.0.0.1 for a loopback master): what Gloo
// advertises to the other ranks.
std::string local_address_for(const std::string& master_addr);

}  // namespace distlab
