#include "cli/run_cmd.h"

#include <cmath>
#include <cstdlib>

#include "core/launch/launcher.h"

namespace distlab {

void add_run_command(CLI::App& app, int& exit_code, const std::string& self_exe, const std::vector<std::string>& program) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* sub = app.add_subcommand("run", "start N ranks of a distlab subcommand or a program (our torchrun)");
  sub->add_option("-n,--nproc-per-node", o->nproc_per_node, "ranks on this node")->required()->check(CLI::Range(1, 1024));
  sub->add_option("--nnodes", o->nnodes, "nodes in the job (default 1)")->check(CLI::Range(1, 4096));
  sub->add_option("--node-rank", o->node_rank, "this node's index, 0..nnodes-1 (node 0 hosts the rendezvous store)");
  sub->add_option("--master-addr", o->master_addr, "address of node 0 (default 127.0.0.1)");
  sub->add_option("--master-port", o->master_port,
                  "port of distlab's rendezvous store on node 0 (default 29500; 0 = a free one); the program gets MASTER_PORT = "
                  "another free port (with several nodes: this one + 1) for a store of its own, as PyTorch's rank 0 binds")
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
  sub->prefix_command();  // everything after the options is the worker's command line
  sub->callback([o, sub, &exit_code, self_exe, program]() {
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
    exit_code = launch(opts);
  });
}

}  // namespace distlab
