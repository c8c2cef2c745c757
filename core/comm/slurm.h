// Slurm's view of a job step: which task this process is, how many there are and where the others run.
// `srun` sets these variables for every task it starts (srun(1), "OUTPUT ENVIRONMENT VARIABLES"); torchrun
// users on Slurm turn them into RANK, WORLD_SIZE and MASTER_ADDR by hand, distlab reads them itself:
//   srun -n 4 distlab train CONFIG             every task is a rank (core/comm/env.h: rank 0 hosts the store)
//   srun --ntasks-per-node=1 distlab run -n 8 train CONFIG
//                                              one launcher per node, 8 ranks each (core/launch/launcher.h)
// Read next: core/comm/env.h (what a worker learns), cli/run_cmd.cpp (`distlab run` inside an allocation,
// and `--slurm-script`), cli/slurm_grade.cpp (a class graded as an array job).
#pragma once
#include <string>
#include <vector>

namespace distlab {

struct SlurmStep {
  bool inside = false;       // a task srun started (SLURM_STEP_NUM_TASKS and SLURM_PROCID are set)
  int procid = 0;            // SLURM_PROCID: this task, 0..ntasks-1
  int ntasks = 1;            // SLURM_STEP_NUM_TASKS: the step's tasks
  int localid = 0;           // SLURM_LOCALID: this task among the step's tasks on this node
  int node_index = 0;        // this node among the step's nodes (SLURMD_NODENAME's place in the node list)
  int nnodes = 1;            // SLURM_STEP_NUM_NODES
  int local_tasks = 1;       // the step's tasks on this node (SLURM_STEP_TASKS_PER_NODE at node_index)
  std::vector<std::string> nodes;  // SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), expanded
  long job_id = 0, step_id = 0;    // SLURM_JOB_ID, SLURM_STEP_ID
};

// The step this process belongs to; `inside` false outside srun (in an sbatch script's own shell, too) and
// when DISTLAB_SLURM=0 (each task then runs on its own: a sweep of separate runs). A malformed variable is
// an error naming it.
SlurmStep read_slurm_step();

// Slurm's host list syntax: "node[01-03,07],gpu-a,rack[1-2]" -> node01 node02 node03 node07 gpu-a rack1
// rack2 (zero padding kept, as `scontrol show hostnames` prints them). Throws on a malformed list.
std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what);
// SLURM_STEP_TASKS_PER_NODE's syntax: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_tasks_per_node(const std::string& text, const std::string& what);

// The step's rendezvous: MASTER_ADDR when set, else the step's first node (127.0.0.1 when it has one).
std::string slurm_master_addr(const SlurmStep& s);
// Where the step's store may listen: MASTER_PORT alone when it is set; else kSlurmPortCandidates even ports
// from the job and step ids, in order (each with the odd one after it, the program's own). Two jobs on a
// node whose first ports collide are not rare (8,000 pairs; ten jobs share one with 0.6 % odds): the
// store takes the first it can bind, and its clients try each in turn, refused by another job's token.
constexpr int kSlurmPortCandidates = 8;
std::vector<int> slurm_master_ports(const SlurmStep& s);
bool slurm_port_given();  // MASTER_PORT is exported: one port, no candidates
// The store's token when DISTLAB_STORE_TOKEN is not exported: "slurm-<job>.<step>". Not a secret (anyone on
// the cluster can read job ids), but another job's ranks that reach the same port are refused.
std::string slurm_job_token(const SlurmStep& s);

// `distlab run --slurm-script`: an sbatch script that runs `command` with one launcher per node.
struct SbatchJob {
  int nodes = 1, ranks_per_node = 1;
  int gpus_per_node = 0;      // 0: no GPU request
  int cpus_per_node = 0;      // 0: the whole node (--exclusive)
  std::vector<std::string> launcher_args;  // distlab run's own options after -n (--log-dir, --max-restarts, ...)
  std::string time = "01:00:00", partition, job_name = "distlab", output = "distlab-%j.out";
  std::vector<std::string> command;  // distlab run's worker command: the distlab binary and its arguments
};
std::string sbatch_script(const SbatchJob& job);
// One word for a shell: 'it''s' quoting, so a path or --set value with spaces or quotes survives.
std::string shell_quote(const std::string& s);
// Slurm's time limit formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; throws naming `what`.
void check_slurm_time(const std::string& t, const std::string& what);

}  // namespace distlab
