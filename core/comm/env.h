// What a worker learns from its launcher: torchrun's environment variables.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/comm/tcp_store.h"

namespace distlab {

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;       // MASTER_PORT: the program's own (PyTorch's rank 0 binds its store there)
  int store_port = 0;        // distlab's rendezvous store: DISTLAB_STORE_PORT, else MASTER_PORT
  std::vector<int> store_ports;  // from_slurm without MASTER_PORT: the step's candidates (store_port the first)
  std::string store_token;   // DISTLAB_STORE_TOKEN: what the store asks of every client ("" = none)
  int launcher_pid = 0;      // DISTLAB_LAUNCHER_PID: the launcher this worker watches (0 = none)
  bool launched = false;  // false: no RANK/WORLD_SIZE set, a program run on its own is rank 0 of 1
  bool from_slurm = false;   // no RANK/WORLD_SIZE, but a task of `srun -n N` (core/comm/slurm.h): each task a rank
  bool hosts_store = false;  // from_slurm and rank 0: this process serves the rendezvous store (as PyTorch's rank 0)
  bool token_derived = false;  // from_slurm without DISTLAB_STORE_TOKEN: the token is the job's and step's ids
};

// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's) and
// DISTLAB_STORE_PORT, DISTLAB_STORE_TOKEN, DISTLAB_LAUNCHER_PID (distlab run's); a missing or malformed
// variable (when some are set) is an error naming it. Without RANK and WORLD_SIZE, a task srun started takes
// its world from Slurm: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the step's first node as the
// master (core/comm/slurm.h), MASTER_PORT or a port from the job's id, DISTLAB_STORE_TOKEN when exported
// (else one from the job's and step's ids).
LaunchEnv read_launch_env();
// The store a srun-started rank 0 serves (nullptr for every other rank, and under a launcher, which serves
// it): on every interface at the step's port, asking the job's token of each client.
std::unique_ptr<TcpStoreServer> serve_store_if_first(const LaunchEnv& e);
// This rank's client of the job's store: at store_port, or the first of store_ports whose store takes the
// job's token (another job may hold the others: core/comm/slurm.h).
std::unique_ptr<TcpStore> connect_store(const LaunchEnv& e, Millis timeout);
// The address of this machine that reaches `master_addr` (127.0.0.1 for a loopback master): what Gloo
// advertises to the other ranks.
std::string local_address_for(const std::string& master_addr);

}  // namespace distlab
