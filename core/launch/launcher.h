// The launcher behind `distlab run` — our torchrun. It hosts the rendezvous store (on node 0), starts one
// worker process per local rank with torchrun's environment, shows rank 0's output, keeps every rank's
// output (the last lines in memory, all of it under --log-dir), and supervises: when a worker fails it stops
// the others (SIGTERM, then SIGKILL after a grace period), says which rank failed, how, and its last lines,
// and exits non-zero. Ctrl-C stops everything. --max-restarts restarts the whole group.
#pragma once
#include <string>
#include <vector>

namespace distlab {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;      // 0 picks a free port (single node only)
  // Slurm's derived ports (core/comm/slurm.h), master_port the first: node 0's store takes the first free
  // one (and the program the port after it), the other nodes' launchers find it by the job's token
  std::vector<int> master_ports;
  std::string log_dir;          // every rank's output, rank_<r>.log (and attempt suffixes on restarts)
  int max_restarts = 0;
  double grace_s = 5.0;         // between SIGTERM and SIGKILL
  int tail_lines = 20;          // lines of a failed rank's output to show
  std::vector<std::string> argv;  // the worker's command line (argv[0] is the program)
  int threads_per_rank = 0;     // OMP_NUM_THREADS for workers (0: the launcher's own, else cores / local ranks)
  bool own_workers = false;      // argv is a distlab subcommand (distlab run ... train): see OPENBLAS_NUM_THREADS
  // srun starting a launcher per rank (core/comm/slurm.h): its worker's LOCAL_RANK and LOCAL_WORLD_SIZE are
  // Slurm's, not 0 and 1 (0 here: this launcher's own ranks are the node's)
  int local_rank_base = 0, local_world_size = 0;
  std::string store_bind;   // where node 0's store listens ("": master_addr; "0.0.0.0": every interface)
  std::string store_token;  // the job's token ("": DISTLAB_STORE_TOKEN, else a random one on one node)
};
inline int local_world(const LaunchOptions& o) { return o.local_world_size > 0 ? o.local_world_size : o.nproc_per_node; }
// The cores this process may run on (its affinity mask: Slurm's and taskset's limits), at least 1.
int usable_cores();

// Runs the job to completion; returns the launcher's exit code (0 all ranks succeeded, 1 a rank failed,
// 130 interrupted). Prints to stdout/stderr.
int launch(const LaunchOptions& opts);

}  // namespace distlab
