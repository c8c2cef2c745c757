// The training loop's extension points: the parts of a run a caller may put in place of the engine's own,
// without the trainer knowing whose they are (PyTorch's equivalents in brackets):
//
//   hook              replaces                                    called
//   check_run         nothing: refuses a run shape it can't serve  once the mesh is known, before any build
//   make_sampler      the training set's order (a Sampler)         when the loader is made
//   on_model          layers (layer substitution)                  after the model is built and initialised
//   make_strategy     the data-parallel strategy (DDP, ZeRO, FSDP)  once, after on_model
//   pipeline_executor a stage's pipeline executor (1F1B's loop)    every pipeline step
//   drive_step        one optimizer step (a custom training step)  every step, when drives_steps()
//   save / resume     the checkpoint's state (a custom state_dict) every save; once at the start
//   describe, report  lines in the header, numbers in the summary  once each
//
// Each default is "the engine's own". An extension sees the run through RunParts (the run's pieces) and
// TrainerCalls (the few things only the trainer can do: run a micro-batch, take an optimizer step, write
// its own checkpoint). The course's grader is one user (grader/bridge/): it puts a student's compiled code
// behind these hooks. The engine never names who is behind them.
// The last stop of the walk (docs/ENGINE.md); the kernels, layers and collectives below the strategies are
// listed at its end.
#pragma once
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/data/loader.h"
#include "core/data/sampler.h"
#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/optim/optimizer.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/strategy.h"
#include "core/config/config.h"
#include "core/train/metrics.h"

namespace distlab {

// What one optimizer step did, for its metrics record.
struct StepOutcome {
  double loss = 0, lr = 0, grad_norm = 0;  // grad_norm: unscaled, before clipping (what the step used)
  // the scale this step's backward used (the loss factor times k, as the trainer saw it), and the next step's
  float loss_scale = 1, next_loss_scale = 1;
  bool skipped = false;
  int64_t samples = 0;  // this rank's
};

// Where a resume stands: the step and the folder it continued from.
struct ResumePoint {
  int64_t step = 0;
  std::string dir;
};

// The run's pieces, as a hook sees them (valid during the call). On the meta device `loader` is null.
struct RunParts {
  const RunConfig& cfg;
  Runtime& rt;
  std::ostream& log;   // rank 0's is the console; the others' discard
  ProcessGroup* pg;    // the world (nullptr: one rank)
  Model& model;
  Optimizer& opt;
  Strategy& strategy;
  DataLoader* loader;
  int64_t micro_batch;
  int rank() const { return pg ? pg->rank() : 0; }
  int world() const { return pg ? pg->size() : 1; }
};

// What only the trainer can do for a hook.
class TrainerCalls {
 public:
  virtual ~TrainerCalls() = default;
  // The next micro-batch: forward, loss, backward of loss · loss_factor (gradients add up); sync = false is
  // no_sync. Returns the micro-batch's loss and adds its samples.
  virtual double forward_backward(float loss_factor, bool sync, int64_t& samples) = 0;
  // The strategy's optimizer step on the gradients as they stand, each read times grad_factor; then zero_grad.
  virtual void optimizer_step(float lr, float grad_factor) = 0;
  virtual void zero_grad() = 0;
  // The learning-rate scheduler: its lr now, and one step of it (PyTorch's scheduler.step()). The engine's
  // own step advances it once per optimizer step; a driven step decides. Its position is checkpointed.
  virtual double scheduler_lr() const = 0;
  virtual void scheduler_step() = 0;
  // The engine's checkpoint of this step into `dir` (made afresh; every rank calls it): a reference beside an
  // extension's own files.
  virtual void write_engine_checkpoint(const std::string& dir, int64_t steps, const std::string& why) = 0;
  // DISTLAB_TEST_FAULT: whether a test asked for a fault (`action`) at `where` and this step on this rank.
  virtual bool fault_due(const char* where, int64_t step, const char* action = "kill") const = 0;
};

class TrainerExtension {
 public:
  virtual ~TrainerExtension() = default;
  // Before anything is built: throw a ConfigError for a run this extension cannot serve.
  virtual void check_run(const RunConfig& cfg, const MeshShape& mesh, const Runtime& rt) {}
  // This rank's order of the training set (n samples); nullptr: the engine's sampler.
  virtual std::shared_ptr<Sampler> make_sampler(const RunConfig& cfg, int64_t n, int world, int rank) { return nullptr; }
  // The model is built and initialised: substitute layers. `mesh` is null without parallel.tp / parallel.pp;
  // `micro_batches`: per optimizer step (a pipeline's m).
  virtual void on_model(Model& model, Runtime& rt, Mesh* mesh, int64_t micro_batches) {}
  // The data-parallel strategy over `dp`; nullptr: the engine's for cfg.
  virtual std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup& dp, Model& model, Runtime& rt) { return nullptr; }
  // This stage's executor of a step's micro-batches (its order, sends and receives, data-parallel syncs);
  // nullptr: the engine's schedule.
  virtual const Pipeline::Executor* pipeline_executor() const { return nullptr; }
  // One optimizer step in place of the engine's (Trainer::engine_step), when drives_steps().
  virtual bool drives_steps() const { return false; }
  virtual StepOutcome drive_step(RunParts& run, TrainerCalls& calls, int64_t step) { return {}; }
  // Checkpoints in place of the engine's, when owns_checkpoints(): save into `dir` (made by the trainer;
  // every rank calls it); resume (every rank) from checkpoint.dir, or nothing to resume from.
  virtual bool owns_checkpoints() const { return false; }
  virtual void save(RunParts& run, TrainerCalls& calls, const std::string& dir, int64_t steps, MetricsWriter& metrics) {}
  virtual std::optional<ResumePoint> resume(RunParts& run, TrainerCalls& calls, MetricsWriter& metrics) { return std::nullopt; }
  // Lines for the run's header (rank 0's log), and this rank's numbers for the summary (summary.ranks[r]).
  virtual void describe(std::ostream& log) const {}
  virtual void report(nlohmann::json& rank) const {}
};

}  // namespace distlab
