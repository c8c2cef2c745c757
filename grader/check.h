// What a check is: a function that runs in the grader's own process (never in one that loads a plugin),
// starts the student's plugin in sandboxed processes (grader/bridge/plugin_process.h), feeds them inputs, takes
// back data, computes the references from the engine itself, and decides. The plugin never sees a verdict
// and can't forge one: whatever it prints is only shown, never parsed.
#pragma once
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>

#include "grader/bridge/plugin_process.h"
#include "grader/lab.h"

namespace distlab::grader {

struct Paths {
  std::string source_dir;  // the repository (labs/, solutions/)
  std::string build_dir;   // where plugins go (build/labs/...)
  std::string self_exe;    // this distlab binary
  std::string scratch;     // the grading's temporary root (grader/scratch.h); empty: /tmp
  std::string host_exe() const;  // distlab-labhost beside it
};

struct CheckResult {
  bool passed = false;
  std::string expected, seen;  // what should have happened, what did
  std::string detail;          // extra evidence (optional)
  std::string hint;            // replaces lab.toml's hint when what was seen calls for another one
};

// A check that cannot finish: the plugin crashed, hung, deadlocked or threw. `status` is the report's word.
struct CheckAbort : std::runtime_error {
  std::string status;  // crash | timeout | deadlock | error
  CheckAbort(std::string status_, const std::string& what) : std::runtime_error(what), status(std::move(status_)) {}
};

// Results keyed by name, each computed once by whoever asks first. Locked: with `distlab grade
// --submissions DIR --jobs N` several gradings ask at once, and a second asker waits for the first one's
// result instead of computing it again. A computation that throws leaves nothing behind: the next asker
// tries again (as a grading that hangs in a student job must not fail the next student's).
class ResultStore {
 public:
  template <class T, class Make>
  const T& get(const std::string& key, Make&& make) {
    std::unique_lock<std::mutex> lk(mu_);
    for (auto it = items_.find(key); it != items_.end(); it = items_.find(key)) {
      if (it->second) return *static_cast<const T*>(it->second.get());
      done_.wait(lk);  // another grading is computing it
    }
    items_.emplace(key, nullptr);  // taken: a second asker waits
    lk.unlock();
    std::shared_ptr<T> value;
    try {
      value = std::make_shared<T>(make());
    } catch (...) {
      lk.lock();
      items_.erase(key);
      done_.notify_all();
      throw;
    }
    lk.lock();
    items_[key] = value;
    done_.notify_all();
    return *value;
  }

 private:
  std::mutex mu_;
  std::condition_variable done_;
  std::map<std::string, std::shared_ptr<void>> items_;  // null: being computed
};

// What a lab's checks share during one grading (lab 02's training jobs) and what a batch of gradings
// shares (the engine's reference runs, the reference solution's times), and the grading's seed: every
// scenario a check draws (inputs, sizes, scales, where an overflow or a kill happens) comes from it. It is
// drawn from the machine's entropy for each `distlab grade` (or given with --seed to reproduce one), never
// passed to a plugin, so a submission can't predict what it will be asked.
struct SharedResults {
  // Keys that start with "engine:", "reference:" or "note:" are the batch's (they do not depend on the
  // student); every other key is this grading's own (a student's job is keyed by its plugin's path).
  std::shared_ptr<ResultStore> batch = std::make_shared<ResultStore>();
  std::shared_ptr<ResultStore> own = std::make_shared<ResultStore>();
  uint64_t seed = draw_seed();
  // How much slower gradings side by side (--jobs N) make each other: N gradings of up to two processes
  // each on C cores, max(1, 2N/C). Each time measured alone (the reference solution's on a check, the
  // engine's on a job) is multiplied by it before it becomes a limit, so a slower turn is not a timeout.
  double load = 1;
  int jobs = 1;  // gradings side by side: a training job then gets cores / (jobs x ranks) threads per rank
  // Where the training jobs run (--device): cpu ranks; cuda, a GPU per rank (shared when there are fewer
  // GPUs than ranks); cuda-sim, the GPU's code path on the CPU. Collectives over Gloo in each (grader/jobs.cpp)
  std::string device = "cpu";
  int gpus = 0;  // the GPUs a cuda grading has (0 on cpu and cuda-sim)
  // Lab 02's speed-up measured on this machine (2 ranks against 1) beside the modeled one: by default where
  // each rank has a GPU of its own (cuda, 2 GPUs or more) and one grading runs at a time; --measure-speedup
  // asks for it anywhere (cpu ranks: a core's share each)
  bool measure_speedup = false;
  // Why this grading's machine may be shared with other gradings it cannot see ("" when it is its own):
  // a Slurm array task's node. Nothing is timed then.
  std::string shared_machine;

  template <class T, class Make>
  const T& get(const std::string& key, Make&& make) {
    const bool batch_key = key.rfind("engine:", 0) == 0 || key.rfind("reference:", 0) == 0 || key.rfind("note:", 0) == 0;
    return (batch_key ? *batch : *own).get<T>(key, std::forward<Make>(make));
  }
  // The next student's: the batch's results and seed, nothing of this student's own.
  SharedResults next_student() const {
    return {batch, std::make_shared<ResultStore>(), seed, load, jobs, device, gpus, measure_speedup, shared_machine};
  }
  static uint64_t draw_seed();
};

// A generator for one scenario of a check: the grading's seed mixed with the scenario's own numbers, so
// that each (check, world, size, ...) gets its own stream and reruns of one grading agree.
std::mt19937_64 scenario_rng(uint64_t seed, std::initializer_list<int64_t> salt);

struct CheckContext {
  const Paths& paths;
  const Lab& lab;
  const CheckSpec& spec;
  std::string plugin;  // the student's .so
  const SandboxSupport& sandbox;
  const CheckCgroup& cgroup;  // every process of this check joins it
  wire::Clock::time_point deadline;
  double limit_s;  // the wall clock this check was given (deadline - its start)
  SharedResults& shared;
  // how to start the plugin for this check (`name` appears in messages: "rank 1's plugin")
  PluginLaunch launch(const std::string& name) const;
  double seconds_left() const;
  std::mt19937_64 rng(std::initializer_list<int64_t> salt) const { return scenario_rng(shared.seed, salt); }
};

using CheckFn = std::function<CheckResult(CheckContext&)>;

// A check and where its wall-clock limit comes from. Most checks are quick calls into the plugin: their
// limit is a few times what the reference solution took on the same check in this batch (harness.cpp),
// so a hanging submission costs seconds, not lab.toml's ceiling. A check that runs references of its own
// (lab 02's training jobs against the engine's) sets its limits itself.
struct CheckDef {
  CheckFn fn;
  bool times_itself = false;
};

// The checks a lab's lab.toml may name, picked by the lab's number (harness.cpp); empty for an unknown lab.
// Each labNN_checks() is at the bottom of its lab's grader/labs/NN-name/checks.cpp (docs/GRADER.md).
std::map<std::string, CheckDef> checks_for_lab(const std::string& lab_id);
std::map<std::string, CheckDef> lab01_checks();
std::map<std::string, CheckDef> lab02_checks();
std::map<std::string, CheckDef> lab03_checks();
std::map<std::string, CheckDef> lab09_checks();
// A case of the clinic (lab 08): its file built as the plugin of the lab it comes from, graded by the checks
// that see its symptom (spec.case_lab, spec.case_file, spec.case_checks).
CheckResult clinic_case(CheckContext& ctx);
std::map<std::string, CheckDef> lab04_checks();
std::map<std::string, CheckDef> lab05_checks();
std::map<std::string, CheckDef> lab06_checks();
std::map<std::string, CheckDef> lab07_checks();
std::map<std::string, CheckDef> lab10_checks();

}  // namespace distlab::grader
