// The training loop assembled from a RunConfig, on one rank:
//   loader → micro-batch → model.forward → loss → model.backward (hook after each unit)
//   → [accumulate? next micro-batch] → clip → optimizer.step → zero_grad → metrics
// Evaluation runs the test set in eval mode. On the meta device there is no data: batches have shapes only
// and the run reports parameters, FLOPs and memory. The run is assembled in trainer_build.cpp and run in
// trainer.cpp; checkpoints, --init/--save, the checks and the report have files of their own (trainer_*.cpp).
// (The walk through the engine: docs/ENGINE.md.)
// Read next: core/models/model.h (the hooks a step's forward and backward call).
#pragma once
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/data/loader.h"
#include "core/comm/device_group.h"
#include "core/comm/process_group.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/strategy.h"
#include "core/models/model.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "core/optim/reduce.h"
#include "core/config/config.h"
#include "core/train/extension.h"
#include "core/train/metrics.h"

namespace distlab {

struct TrainOutputs {
  std::string init_path;  // --init FILE.safetensors
  std::string save_path;  // --save FILE.safetensors
  std::string save_dtype = "f32";
  std::string init_adapter;  // --init-adapter DIR: PEFT's adapter folder
  std::string save_adapter;  // --save-adapter DIR
};

// The model the config describes, with the sizes the data implies (image shape, classes, vocabulary);
// throws ConfigError when config and data disagree. (trainer_checks.cpp)
ModelSpec spec_for(const RunConfig& c, const DataSets& d, bool meta);
// What [precision] asks of the loss scaler.
LossScaleOptions loss_scale_options(const PrecisionOptions& p);

class Trainer {
 public:
  // pg: the ranks of a data-parallel job (nullptr: one rank). Only rank 0 logs, evaluates and saves.
  // ext: parts of the run in place of the engine's own (core/train/extension.h; nullptr: none). It must
  // outlive the trainer.
  Trainer(const RunConfig& cfg, Runtime& rt, std::ostream& log, ProcessGroup* pg = nullptr, TrainerExtension* ext = nullptr);
  // Runs every step; returns the summary record (also written to the metrics file).
  nlohmann::json run(MetricsWriter& metrics, const TrainOutputs& out = {});
  Model& model() { return *model_; }
  // A progress bar on the log (a terminal's: tqdm's way): one line rewritten every step, the periodic lines
  // printed above it. Off by default (a pipe, a file and the tests get plain lines).
  void show_progress_bar(bool on) { progress_bar_ = on; }
  // The peak FLOP/s of the hardware this rank runs on (its precision's: core/perf/hardware.h), and what it
  // is ("h100-nvlink bf16"): the periodic lines then show the live MFU and HFU (model FLOPs and the kernels'
  // FLOPs per second of the steps so far, over the peak), and the summary keeps them. 0: not shown.
  void set_live_peak(double flops_per_s, std::string what) { live_peak_ = flops_per_s, live_peak_of_ = std::move(what); }
  // One evaluation over (up to eval_batches of) the test set: {"loss", "accuracy", "samples"}.
  nlohmann::json evaluate();
  int64_t total_steps() const { return total_steps_; }

 private:
  Batch next_batch();
  Batch meta_batch(int64_t B);
  double train_step(int64_t step, MetricsWriter& metrics);  // returns the mean loss of the step
  double micro_step(float loss_factor, bool sync, int64_t& samples);
  StepOutcome engine_step(int64_t step);  // accumulate, unscale, skip or clip and step (an extension may drive it instead)
  nlohmann::json model_time(int64_t step);                  // the modeled time of the traced step
  // The run's log and summary (trainer_report.cpp): the opening lines, the summary record, the closing report.
  struct RunTotals {
    double loss = 0, steady_samples = 0, steady_s = 0, wall_s = 0;  // steady: the steps after the first
    int64_t steady_steps = 0, whole_params = 0, nparams = 0;
    nlohmann::json last_eval;
  };
  void log_header(int64_t whole_params, int64_t nparams);
  nlohmann::json summary_record(const RunTotals& t);
  void log_report(const nlohmann::json& summary, int64_t nparams, double wall);
  // Every rank must hold the same tensors (`when`: "at the start" after --init, "at the end") and, at the
  // start, the same data: any difference throws, naming the first tensor (or the data) that differs.
  // metrics (at the end): a {"kind": "diverged"} record is written before the throw, so that a reader (the
  // grader) learns of it from the trainer's own file, never from output a plugin could print. Every group's
  // verdict reaches every rank: a divergence in a group without rank 0 fails every rank and is recorded too.
  void check_replicas(const std::string& when, bool with_buffers_and_data, MetricsWriter* metrics = nullptr);
  // Checkpoints (trainer_ckpt.cpp): find and load the one to resume from (checkpoint.resume), save this
  // rank's part of the state after `steps` steps (a collective: every rank calls it), and what a save
  // weighs per rank (bytes by category, the modeled write time) without writing it.
  void resume(MetricsWriter& metrics);
  void load_checkpoint(const std::string& step_dir);
  void save_checkpoint(int64_t steps, MetricsWriter& metrics, const std::string& why);
  void make_step_dir(const std::string& dir, int64_t steps);                        // rank 0 makes it afresh
  int64_t write_checkpoint(const std::string& dir, int64_t steps, const std::string& why, bool fault = true);  // the files; bytes
  nlohmann::json checkpoint_estimate();
  nlohmann::json rank_state(int64_t steps);
  void fault_point(const char* where, int64_t step);  // DISTLAB_TEST_FAULT: the resume tests' kill -9, a skewed replica
  bool fault_due(const char* where, int64_t step, const char* action = "kill") const;
  // what an extension's hooks see of the run, and may ask of the trainer (core/train/extension.h)
  RunParts parts();
  class Calls;
  bool is_rank0() const { return !pg_ || pg_->rank() == 0; }
  int world() const { return pg_ ? pg_->size() : 1; }
  // the data-parallel ranks: the world without a mesh; its dp axis with one (parallel.tp, parallel.pp)
  int dp_world() const { return dp_ ? dp_->size() : 1; }
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }
  ProcessGroup* tp_group() const { return mesh_ && mesh_->shape().tp > 1 ? &mesh_->group(MeshAxis::tp) : nullptr; }
  // the model itself is split (tensor or pipeline parallel): --init and --save go through a whole one on the side
  bool split_model() const { return mesh_ && (mesh_->shape().tp > 1 || mesh_->shape().pp > 1); }
  ProcessGroup* cp_group() const { return mesh_ && mesh_->shape().cp > 1 ? &mesh_->group(MeshAxis::cp) : nullptr; }
  // a micro-batch as this rank trains on it: the whole (B, T), or (context parallel) its shard (B, T/cp)
  Batch shard(Batch b) const;
  ProcessGroup* pp_group() const { return mesh_ && mesh_->shape().pp > 1 ? &mesh_->group(MeshAxis::pp) : nullptr; }
  // the loss of a micro-batch's logits and its gradient (× factor): vocab-parallel when the logits are split.
  // In an engine step on a device rank the loss goes to the next of step_losses_' slots and 0 comes back.
  double loss_and_grad(const Tensor& logits, const Batch& b, float factor, Tensor& dlogits);
  // The step's norm, clip and optimizer step (on the device where it can: no wait); and, after the step's
  // closing synchronize, the values a device rank left in step_losses_ and step_norm_ (trainer_step.cpp)
  void clip_and_step(StepOutcome& o);
  void read_step_values(StepOutcome& o);
  // every group's collectives so far (the world's and the mesh's axes)
  CommCounters comm_totals() const;
  std::map<std::string, CommCounters> comm_by_op() const;
  // --init and --save (trainer_weights.cpp); under tensor and pipeline parallelism the whole model is built
  // on the side (load_whole_model, save_whole_model)
  void load_init(const std::string& path);
  void save_weights(const std::string& path, const std::string& dtype);
  void load_adapter_dir(const std::string& dir);  // --init-adapter
  void save_adapter_dir(const std::string& dir, const std::string& dtype);  // --save-adapter
  void load_whole_model(const std::string& path);
  void save_whole_model(const std::string& path, DType dtype);
  // the whole model of --init and --save under tensor and pipeline parallelism, on `side`: spec_'s layers,
  // LoRA's adapters on the same Linears as model_'s
  std::unique_ptr<Model> whole_model(Runtime& side);

  const RunConfig& cfg_;
  Runtime& rt_;
  std::ostream& log_;
  void log_progress(int64_t step, double loss, double samples, double elapsed_s, bool last);
  bool progress_bar_ = false;
  double live_peak_ = 0;      // set_live_peak
  std::string live_peak_of_;
  // the FLOPs one rank's step needs (the model's: 6N + attention per token for a GPT, the kernels' otherwise)
  // and the FLOPs its kernels ran; MFU and HFU over `elapsed_s` for `steps` steps (trainer_report.cpp)
  double model_flops_per_rank_step() const;
  std::pair<double, double> live_mfu_hfu(double steps, double elapsed_s) const;
  bool bar_shown_ = false;  // the bar's line is on screen (cleared before the next plain line)
  DataSets data_;
  ModelSpec spec_;
  std::unique_ptr<Model> model_;
  std::vector<std::string> lora_modules_;  // [lora]: the adapted Linears' module names
  LoraSpec lora_;                          // [lora] as this run applies it (PEFT's default targets filled in)
  int64_t quantized_ = 0;                  // [quantization]: the Linears whose frozen weight is NF4 (QLoRA)
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<DataLoader> loader_;
  ProcessGroup* pg_;
  std::unique_ptr<Mesh> mesh_;  // dp × cp × tp × pp when parallel.tp, pp or cp > 1 (core/parallel/mesh.h)
  ProcessGroup* dp_ = nullptr;  // what data parallelism (the sampler, the samples counted) runs over
  ProcessGroup* grad_ = nullptr;  // the ranks that hold the same weights, which the strategy reduces over: dp_, or dp × cp
  std::unique_ptr<RingAttention> ring_;  // parallel.cp > 1: the CP group's ring; spec_.context points at it
  std::unique_ptr<Pipeline> pipeline_;  // parallel.pp > 1: this rank's stage runs the schedule
  Parameter* tied_ = nullptr;           // the pipeline's tied embedding on the first and last stage
  int64_t accum_ = 1;                   // micro-batches per optimizer step: train.accum_steps, or parallel.micro_batches
  Pipeline::StepResult pipe_peak_;      // the largest in-flight count and held bytes of any step
  // A device rank's micro-batch losses during an engine step, one slot each, in the order they were
  // computed: read once the step's work is done (train_step), so the host never waits for a loss inside
  // a step. Null on a cpu rank and in an extension's step (its forward_backward returns the loss).
  std::unique_ptr<DeviceScalars> step_losses_;
  int64_t next_loss_slot_ = 0;
  // The same for the gradient norm (slot 0, a double) and the factor AdamW reads (slot 1, a float) where
  // the step clips on the device (Strategy::plain_optimizer_step, Optimizer::reads_device_factor).
  std::unique_ptr<DeviceScalars> step_norm_;
  TrainerExtension* ext_;               // parts in place of the engine's (nullptr: none)
  std::unique_ptr<DeviceBackend> device_group_;  // dist.backend = "nccl": dp_'s device backend (before strategy_: it outlives it)
  std::unique_ptr<DeviceBackend> tp_device_group_;  // and the TP group's, for the split layers' activations (parallel.tp > 1)
  std::unique_ptr<Strategy> strategy_;  // the only thing the loop knows of parallelism (strategies.h)
  GradScaler scaler_;                   // fp16's loss scale (disabled for fp32 and bf16 by default)
  int64_t skipped_steps_ = 0;           // steps whose gradients overflowed
  int64_t sched_steps_ = 0;             // the lr scheduler's position (PyTorch's last_epoch): the steps taken, or a driven step's calls
  float loss_scale_ = 1;                // for the progress line: the scale of the next step
  nlohmann::json modeled_;  // the cost model's verdict on the traced step
  Schedule schedule_;
  int64_t micro_batch_ = 0, total_steps_ = 0, epoch_ = 0;
  std::array<int64_t, kNumCategories> peak_{};
  int64_t peak_total_ = 0;
  int64_t peak_reserved_ = 0;  // what PyTorch's caching allocator would reserve (MemoryStats::reserved_peak)
  int64_t peak_held_ = -1;     // measured over the same steps: the device's own allocator (DeviceMemory::held_peak); -1 without one
  int64_t last_step_comm_bytes_ = 0, last_step_comm_calls_ = 0;  // the last step's collectives on this rank
  double last_step_comm_s_ = 0;                                    // and their measured time (CommCounters::seconds)
  std::array<int64_t, kNumCategories> peak_at_{};  // the categories at the moment of peak_total_ (they sum to it)
  double last_step_flops_ = 0, last_step_recompute_flops_ = 0;  // the kernels' FLOPs; the recompute's part
  int64_t start_step_ = 0;       // steps done before this run: the resumed checkpoint's
  int64_t saved_step_ = -1;      // the step of the last checkpoint written (or resumed from)
  bool stop_agreed_ = false;     // every rank saw a stop request (SIGTERM) by the end of this step
  int stop_rank_ = -1;           // the rank that was sent it, when exactly one was (-1: none, or several)
  std::string resumed_from_;
  nlohmann::json ckpt_report_ = nlohmann::json::object();  // saves made, their bytes and seconds
};

// What an extension's hook may ask of the trainer (core/train/extension.h), on the trainer's own parts.
class Trainer::Calls : public TrainerCalls {
 public:
  explicit Calls(Trainer& t) : t_(t) {}
  double forward_backward(float loss_factor, bool sync, int64_t& samples) override { return t_.micro_step(loss_factor, sync, samples); }
  void optimizer_step(float lr, float grad_factor) override { t_.strategy_->step(t_.rt_, *t_.opt_, lr, grad_factor); }
  void zero_grad() override { t_.strategy_->zero_grad(*t_.model_); }
  double scheduler_lr() const override { return t_.schedule_.lr_at(t_.sched_steps_); }
  void scheduler_step() override { t_.sched_steps_++; }
  void write_engine_checkpoint(const std::string& dir, int64_t steps, const std::string& why) override {
    t_.make_step_dir(dir, steps);
    t_.write_checkpoint(dir, steps, why, false);
  }
  bool fault_due(const char* where, int64_t step, const char* action) const override { return t_.fault_due(where, step, action); }

 private:
  Trainer& t_;
};

// One rank of a planned job on the meta device: rank 0 of the fake world of cfg.dist.fake_world_size ranks
// (or 1), what `distlab plan` runs for a row, `bench published` for a run and `bench calibrate` for its
// shapes. Returns the summary record; `events`, when given, gets the traced step's events (log.trace_step).
nlohmann::json run_planned(const RunConfig& cfg, std::vector<TraceEvent>* events = nullptr);

}  // namespace distlab
