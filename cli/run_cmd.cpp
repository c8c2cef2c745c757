#include "cli/run_cmd.h"

#include <cmath>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include "core/comm/slurm.h"
#include "core/launch/launcher.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// Inside `srun` (core/comm/slurm.h) the world comes from Slurm, unless the command line says otherwise:
//   one task per node  (srun --ntasks-per-node=1 distlab run -n 8 ...): this launcher is node SLURM_NODEID's,
//                      the step's first node hosts the store;
//   several per node   (srun -n 16 distlab run ...): each task is one rank; task 0's launcher hosts the store.
void take_world_from_slurm(LaunchOptions& o, const SlurmStep& s, bool nproc_given, bool port_given, bool addr_given) {
  if (s.local_tasks == 1) {
    if (!nproc_given) throw ConfigError("distlab run under srun with one task per node: how many ranks per node?", "give -n (e.g. the node's GPUs)");
    o.nnodes = s.nnodes;
    o.node_rank = s.node_index;
    if (!addr_given) o.master_addr = slurm_master_addr(s);
    if (!port_given) o.master_port = s.nnodes == 1 ? 0 : slurm_master_port(s);
  } else {
    if (nproc_given && o.nproc_per_node != 1)
      throw ConfigError(fmt::format("distlab run -n {} under srun with {} tasks on this node: each task is already one rank", o.nproc_per_node, s.local_tasks),
                        "leave -n out (one rank per task), or start one task per node (srun --ntasks-per-node=1) with -n ranks each");
    o.nproc_per_node = 1;
    o.nnodes = s.ntasks;
    o.node_rank = s.procid;
    o.local_rank_base = s.localid;
    o.local_world_size = s.local_tasks;
    if (!addr_given) o.master_addr = slurm_master_addr(s);
    if (!port_given) o.master_port = slurm_master_port(s);
  }
  if (o.node_rank == 0)
    std::cerr << fmt::format("distlab run: Slurm job {} step {}: {} node(s), {} launcher(s) of {} rank(s), store at {}:{}\n", s.job_id, s.step_id,
                             s.nnodes, o.nnodes, o.nproc_per_node, o.master_addr, o.master_port == 0 ? std::string("(a free port)") : std::to_string(o.master_port));
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code, const std::string& self_exe, const std::vector<std::string>& program) {
  auto o = std::make_shared<LaunchOptions>();
  auto job = std::make_shared<SbatchJob>();
  auto script = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("run", "start N ranks of a distlab subcommand or a program (our torchrun); inside srun, Slurm's world");
  auto* nproc = sub->add_option("-n,--nproc-per-node", o->nproc_per_node, "ranks on this node (under srun with several tasks a node: leave it out)")->check(CLI::Range(1, 1024));
  auto* nnodes = sub->add_option("--nnodes", o->nnodes, "nodes in the job (default 1; under srun: Slurm's)")->check(CLI::Range(1, 4096));
  auto* node_rank = sub->add_option("--node-rank", o->node_rank, "this node's index, 0..nnodes-1 (node 0 hosts the rendezvous store)");
  auto* addr = sub->add_option("--master-addr", o->master_addr, "address of node 0 (default 127.0.0.1; under srun: the step's first node)");
  auto* port = sub->add_option("--master-port", o->master_port,
                  "port of distlab's rendezvous store on node 0 (default 29500; 0 = a free one; under srun: MASTER_PORT or one from the job id); "
                  "the program gets MASTER_PORT = another free port (with several nodes: this one + 1) for a store of its own, as PyTorch's rank 0 binds")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--log-dir", o->log_dir, "keep every rank's output in DIR/rank_<r>.log");
  sub->add_option("--max-restarts", o->max_restarts, "restart the whole group up to K times when a rank fails")->check(CLI::Range(0, 1000));
  sub->add_option("--grace", o->grace_s, "seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
      ->check(CLI::Validator(
          [](std::string& v) {  // CLI::Range lets NaN through
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return *end == 0 && std::isfinite(x) && x >= 0 && x <= 3600 ? std::string() : "must be a number of seconds in 0..3600";
          },
          "SECONDS"));
  sub->add_option("--threads-per-rank", o->threads_per_rank, "compute threads per rank (default: OMP_NUM_THREADS when set, as torchrun keeps it, else cores / ranks)")->check(CLI::Range(0, 1024));
  sub->add_flag("--slurm-script", *script, "print an sbatch script that runs this on --nnodes nodes of a Slurm cluster, -n ranks each, instead of running it");
  sub->add_option("--gpus-per-node", job->gpus_per_node, "with --slurm-script: GPUs to ask for on each node")->check(CLI::Range(0, 64));
  sub->add_option("--cpus-per-node", job->cpus_per_node, "with --slurm-script: CPUs to ask for on each node")->check(CLI::Range(0, 4096));
  sub->add_option("--time", job->time, "with --slurm-script: the time limit (default 01:00:00)");
  sub->add_option("--partition", job->partition, "with --slurm-script: the partition (default: the cluster's)");
  sub->add_option("--job-name", job->job_name, "with --slurm-script: the job's name (default distlab)");
  sub->prefix_command();  // everything after the options is the worker's command line
  sub->callback([=, &exit_code]() {
    std::vector<std::string> rest = sub->remaining();
    LaunchOptions opts = *o;
    if (!program.empty()) {
      if (!rest.empty()) throw CLI::ExtrasError(rest);
      rest = program;
    } else if (!rest.empty()) {
      rest.insert(rest.begin(), self_exe);  // a distlab subcommand: run this binary
      opts.own_workers = true;
    }
    opts.argv = rest;
    if (*script) {
      if (!program.empty()) throw ConfigError("--slurm-script writes a script for a distlab subcommand", "put the subcommand after the options: distlab run --slurm-script ... train CONFIG");
      if (*node_rank || *addr || *port) throw ConfigError("--slurm-script: Slurm gives each node its rank and the master", "leave out --node-rank, --master-addr and --master-port");
      SbatchJob j = *job;
      j.nodes = opts.nnodes;
      j.ranks_per_node = opts.nproc_per_node;
      j.command = rest;
      std::cout << sbatch_script(j);
      return;
    }
    const SlurmStep s = read_slurm_step();
    if (s.inside && !*nnodes && !*node_rank) take_world_from_slurm(opts, s, bool(*nproc), bool(*port), bool(*addr));
    else if (!*nproc) throw ConfigError("distlab run: how many ranks? give -n N", "e.g. distlab run -n 2 train configs/gpt-tiny.toml");
    exit_code = launch(opts);
  });
}

}  // namespace distlab
