// `distlab run` inside srun (core/comm/slurm.h): which world this launcher joins.
//   one task on every node  (srun --ntasks-per-node=1 distlab run -n 8 ...): a launcher per node, node
//                           rank = the node's place in the step, 8 ranks each;
//   otherwise               (srun -n 16 distlab run ...): a launcher per task, each one rank, its LOCAL_RANK
//                           Slurm's; -n must then be left out (or 1).
// The step decides, not this node: with 2 tasks on one node and 1 on another, every launcher is one rank.
// Read next: core/launch/launcher.h.
#pragma once
#include <memory>

#include "core/comm/slurm.h"
#include "core/comm/tcp_store.h"
#include "core/launch/launcher.h"

namespace distlab {

struct GivenOnCommandLine {
  bool nproc = false, port = false, addr = false, threads = false;
};

// Fills nnodes, node_rank, nproc_per_node (and the local rank's base), the master address and port, the
// store's bind address, the threads per rank (SLURM_CPUS_PER_TASK, when OMP_NUM_THREADS is not set) and
// the store's token (DISTLAB_STORE_TOKEN, else one from the job and step: no secret, but no other job's
// ranks join by mistake). ConfigError when -n contradicts the step.
void take_world_from_slurm(LaunchOptions& o, const SlurmStep& s, const GivenOnCommandLine& given);

// Node 0's store: at master_port, or at the first of Slurm's derived ports (o.master_ports) free on this
// node with the port after it (the program's), so that two jobs whose first ports collide both run. The
// other nodes' launchers find it by the token (TcpStore over the same ports).
std::unique_ptr<TcpStoreServer> serve_node0_store(const LaunchOptions& o, const std::string& token);

}  // namespace distlab
