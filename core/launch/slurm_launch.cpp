#include "core/launch/slurm_launch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "core/comm/errors.h"
#include "core/util/error.h"

namespace distlab {

void take_world_from_slurm(LaunchOptions& o, const SlurmStep& s, const GivenOnCommandLine& given) {
  if (s.ntasks == s.nnodes) {  // one task on every node: it launches that node's ranks
    if (!given.nproc) throw ConfigError("distlab run under srun with one task per node: how many ranks per node?", "give -n (e.g. the node's GPUs)");
    o.nnodes = s.nnodes;
    o.node_rank = s.node_index;
  } else {  // each task is one rank
    if (given.nproc && o.nproc_per_node != 1)
      throw ConfigError(fmt::format("distlab run -n {} under srun with {} tasks on {} node(s): each task is already one rank", o.nproc_per_node, s.ntasks, s.nnodes),
                        "leave -n out (one rank per task), or start one task per node (srun --ntasks-per-node=1) with -n ranks each");
    o.nproc_per_node = 1;
    o.nnodes = s.ntasks;
    o.node_rank = s.procid;
    o.local_rank_base = s.localid;
    o.local_world_size = s.local_tasks;
  }
  if (!given.addr) o.master_addr = slurm_master_addr(s);
  if (!given.port && o.nnodes == 1) o.master_port = 0;
  if (!given.port && o.nnodes > 1) {
    const std::vector<int> ports = slurm_master_ports(s);
    o.master_port = ports.front();
    if (ports.size() > 1) o.master_ports = ports;
  }
  // the first node's own name may resolve to 127.0.1.1 there (Debian's /etc/hosts): serve on every interface
  if (s.nnodes > 1) o.store_bind = "0.0.0.0";
  const char* cpus = std::getenv("SLURM_CPUS_PER_TASK");
  if (!given.threads && !std::getenv("OMP_NUM_THREADS") && cpus && std::atoi(cpus) > 0)
    o.threads_per_rank = std::max(1, std::atoi(cpus) / o.nproc_per_node);
  const char* token = std::getenv("DISTLAB_STORE_TOKEN");
  o.store_token = token && *token ? token : slurm_job_token(s);
}

std::unique_ptr<TcpStoreServer> serve_node0_store(const LaunchOptions& o, const std::string& token) {
  const std::string host = o.store_bind.empty() ? o.master_addr : o.store_bind;
  if (o.master_ports.size() <= 1) return std::make_unique<TcpStoreServer>(host, o.master_port, token);
  return serve_on_first_free(host, o.master_ports, token, true);  // and the port after it, the program's
}

}  // namespace distlab
