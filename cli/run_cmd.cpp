#include "cli/run_cmd.h"

#include <cmath>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "core/comm/slurm.h"
#include "core/launch/launcher.h"
#include "core/launch/slurm_launch.h"
#include "core/util/error.h"
#include "grader/bridge/sandbox.h"

namespace distlab {

void add_run_command(CLI::App& app, int& exit_code, const std::string& self_exe, const std::vector<std::string>& program) {
  auto o = std::make_shared<LaunchOptions>();
  auto job = std::make_shared<SbatchJob>();
  auto script = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("run", "start N ranks of a distlab subcommand or a program (our torchrun); inside srun, Slurm's world");
  auto* nproc = sub->add_option("-n,--nproc-per-node,--nproc_per_node", o->nproc_per_node, "ranks on this node (under srun with several tasks a node: leave it out)")->check(CLI::Range(1, 1024));
  auto* nnodes = sub->add_option("--nnodes", o->nnodes, "nodes in the job (default 1; under srun: Slurm's)")->check(CLI::Range(1, 4096));
  auto* node_rank = sub->add_option("--node-rank,--node_rank", o->node_rank, "this node's index, 0..nnodes-1 (node 0 hosts the rendezvous store)");
  auto* addr = sub->add_option("--master-addr,--master_addr", o->master_addr, "address of node 0 (default 127.0.0.1; under srun: the step's first node)");
  auto* port = sub->add_option("--master-port,--master_port", o->master_port,
                  "port of distlab's rendezvous store on node 0 (default 29500; 0 = a free one; under srun: MASTER_PORT or one from the job id); "
                  "the program gets MASTER_PORT = another free port (with several nodes: this one + 1) for a store of its own, as PyTorch's rank 0 binds")
      ->check(CLI::Range(0, 65535));
  auto* log_dir = sub->add_option("--log-dir,--log_dir", o->log_dir, "keep every rank's output in DIR/rank_<r>.log");
  auto* restarts = sub->add_option("--max-restarts,--max_restarts", o->max_restarts, "restart the whole group up to K times when a rank fails")->check(CLI::Range(0, 1000));
  auto* grace = sub->add_option("--grace", o->grace_s, "seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
      ->check(CLI::Validator(
          [](std::string& v) {  // CLI::Range lets NaN through
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return *end == 0 && std::isfinite(x) && x >= 0 && x <= 3600 ? std::string() : "must be a number of seconds in 0..3600";
          },
          "SECONDS"));
  auto* threads = sub->add_option("--threads-per-rank", o->threads_per_rank, "compute threads per rank (default: OMP_NUM_THREADS when set, as torchrun keeps it, else cores / ranks)")->check(CLI::Range(0, 1024));
  // torchrun's spellings of the same (its users type them): --standalone is one node on a free port, as
  // torchrun's own c10d store on localhost; --rdzv-endpoint HOST:PORT is --master-addr and --master-port
  auto standalone = std::make_shared<bool>(false);
  auto endpoint = std::make_shared<std::string>();
  auto* standalone_opt = sub->add_flag("--standalone", *standalone, "torchrun's: one node, the store on a free port (--nnodes 1 --master-port 0)");
  auto* endpoint_opt = sub->add_option("--rdzv-endpoint,--rdzv_endpoint", *endpoint, "torchrun's HOST:PORT: --master-addr HOST --master-port PORT");
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
    if (*standalone) {
      if (*nnodes && opts.nnodes != 1) throw ConfigError("--standalone is one node: leave out --nnodes", "torchrun's --standalone runs a single node");
      if (*port || *endpoint_opt) throw ConfigError("--standalone picks a free port itself", "leave out --master-port / --rdzv-endpoint");
      opts.nnodes = 1;
      opts.master_port = 0;
    }
    if (*endpoint_opt) {
      const size_t colon = endpoint->rfind(':');
      char* end = nullptr;
      const long p = colon == std::string::npos ? -1 : std::strtol(endpoint->c_str() + colon + 1, &end, 10);
      if (colon == std::string::npos || colon == 0 || !end || *end || p < 0 || p > 65535)
        throw ConfigError(fmt::format("--rdzv-endpoint '{}' is not HOST:PORT", *endpoint), "e.g. --rdzv-endpoint 10.0.0.1:29500");
      if (*addr || *port) throw ConfigError("--rdzv-endpoint and --master-addr/--master-port say the same thing", "give one of them");
      opts.master_addr = endpoint->substr(0, colon);
      opts.master_port = int(p);
    }
    (void)standalone_opt;
    // `distlab run -n 2 CONFIG`: a config file where the subcommand goes means `train CONFIG`
    if (program.empty() && !rest.empty()) {
      const std::string& first = rest.front();
      const bool config = (first.ends_with(".toml") || first.ends_with(".json") || first.ends_with(".yaml") || first.ends_with(".yml")) &&
                          std::filesystem::is_regular_file(first);
      if (config) rest.insert(rest.begin(), "train");
    }
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
      if (*node_rank || *addr || *port || *endpoint_opt) throw ConfigError("--slurm-script: Slurm gives each node its rank and the master", "leave out --node-rank, --master-addr and --master-port");
      if (!*nproc) throw ConfigError("--slurm-script: how many ranks per node? give -n N", "e.g. -n 8 for 8 GPUs a node");
      SbatchJob j = *job;
      j.nodes = opts.nnodes;
      j.ranks_per_node = opts.nproc_per_node;
      j.command = rest;
      // the launcher's own options travel into the script (each node's launcher gets them)
      for (CLI::Option* opt : {log_dir, restarts, grace, threads})
        if (*opt) j.launcher_args.insert(j.launcher_args.end(), {opt->get_name(), opt->as<std::string>()});
      std::cout << sbatch_script(j);
      return;
    }
    const SlurmStep s = read_slurm_step();
    if (s.inside && !*nnodes && !*node_rank) {
      take_world_from_slurm(opts, s, {bool(*nproc), bool(*port) || bool(*endpoint_opt) || *standalone, bool(*addr) || bool(*endpoint_opt), bool(*threads)});
      if (opts.node_rank == 0)
        std::cerr << fmt::format("distlab run: Slurm job {} step {}: {} node(s), {} launcher(s) of {} rank(s), store at {}:{}\n", s.job_id, s.step_id, s.nnodes,
                                 opts.nnodes, opts.nproc_per_node, opts.master_addr, opts.master_port == 0 ? std::string("(a free port)") : std::to_string(opts.master_port));
    }
    else if (!*nproc) throw ConfigError("distlab run: how many ranks? give -n N", "e.g. distlab run -n 2 train configs/gpt-tiny.toml");
    // a distlab subcommand's arguments, checked once here: a typo is said once, not once per rank
    if (opts.own_workers && !opts.argv.empty()) {
      setenv("DISTLAB_ARGS_ONLY", "1", 1);
      const RunResult check = run_to_end(opts.argv, SpawnOptions{}, 60, 8000);
      unsetenv("DISTLAB_ARGS_ONLY");
      if (!check.timed_out && WIFEXITED(check.status) && WEXITSTATUS(check.status) != 0) {
        std::cerr << check.output << (check.output.empty() || check.output.back() == '\n' ? "" : "\n")
                  << "distlab run: the arguments after the options were refused (above): no rank was started\n";
        exit_code = 2;
        return;
      }
    }
    exit_code = launch(opts);
  });
}

}  // namespace distlab
