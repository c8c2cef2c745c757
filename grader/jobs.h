// Training jobs for a lab's checks: real runs of the lab's config through `distlab run`, the trainers the
// engine's own, the student's plugin beside them (lab.plugin). The trainers measure losses, parameters,
// collectives and modeled times where the plugin can't reach them. A job's result is shared by the checks
// of one grading that need it (a hanging job costs one timeout, not one per check), and a student's job
// may take a few times the engine's own run of the same job.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grader/check.h"

namespace distlab::grader {

struct Job {
  bool ok = false;
  std::string failure;  // why not ok (sanitized output tail)
  std::string status;   // for CheckAbort when not ok: timeout | error
  double seconds = 0;
  std::vector<double> losses, lrs;
  std::vector<nlohmann::json> steps;  // every step record
  nlohmann::json summary, first_step;
  bool diverged = false;  // failed because the ranks' parameters differed at the end (losses are still there)
  std::vector<nlohmann::json> records;  // every record of the metrics file (resume, checkpoint, ...)
  std::string saved;                    // with JobOptions::save: the final weights' safetensors file
  std::string output;                   // the launcher's output (sanitized tail)
};

// Lab 07's runs: an environment (DISTLAB_TEST_FAULT=...), restarts, the final weights.
struct JobOptions {
  std::vector<std::string> env;  // NAME=value
  int restarts = 0;              // distlab run --max-restarts
  bool save = false;             // --save the final weights into Job::saved
  std::string config;            // a config file to run instead of the lab's lab.toml (lab 08's config cases)
};

// One `distlab run` of the lab's config; plugin "none" runs the engine's own implementation. Where the
// grader is root, the job runs as kJobUid (nobody, grader/bridge/sandbox.h), in a folder of its own that holds
// its own copy of the plugin: a request that got past the trainer's checks would find an unprivileged
// process, not root. When the engine's files are not readable by that user (a build under /root), the job
// runs as root and the first job of the grading says why.
Job run_job(CheckContext& ctx, int ranks, const std::string& plugin, const std::vector<std::string>& sets, double limit_s,
            const JobOptions& jo = {});

// run_job of the engine's own implementation (plugin "none"). Its result depends only on the engine's build,
// the config, the ranks and the --set keys: kept on disk under build/labs/<lab>/engine-jobs/ by their content
// and reused by every later grading (a job with an environment or --save runs every time).
Job engine_job(CheckContext& ctx, int ranks, const std::vector<std::string>& sets, double limit_s, const JobOptions& jo = {});

// "" when kJobUid can run the engine's jobs from these paths; else the first path it can't reach.
std::string unreachable_for_job_user(const Paths& p, const Lab& lab);
// A folder a job writes into (lab 07's checkpoints): given, with everything in it, to kJobUid when root.
void hand_to_job_user(const std::string& path);

// Who runs a job from the folder `dir`: where the grader is root and kJobUid can reach the engine, a copy
// of `plugin` (unless "none") in `dir`, the folder given to kJobUid, and run_as = kJobUid; else the plugin
// as it is and run_as = 0, with `as_root` naming the path kJobUid can't reach (root only).
struct JobUser {
  std::string plugin;
  uid_t run_as = 0;
  std::string as_root;
};
JobUser prepare_job_user(const Paths& p, const Lab& lab, const std::string& dir, const std::string& plugin);


// A job shared by the checks of one grading: run once, its result (or failure) reused; a failed one throws
// CheckAbort. student: with the student's plugin (limited to a few times the engine's run of the same job),
// else the engine's own (shared by the whole batch). allow_diverged: a run that trained to the end but whose
// replicas differed is returned (its losses are evidence for a curve check), not thrown.
const Job& job(CheckContext& ctx, const std::string& key, int ranks, bool student, const std::vector<std::string>& sets,
               bool allow_diverged = false);

inline std::vector<std::string> with(std::vector<std::string> v, const std::string& s) {
  v.push_back(s);
  return v;
}

}  // namespace distlab::grader
