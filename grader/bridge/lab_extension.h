// A lab's student code in a training run: the bridge between the engine's extension points
// (core/train/extension.h) and the student's plugin (lab_plugin.h, which runs it in a sandboxed process).
// Which hook each lab takes (a lab's own trainer side is grader/labs/NN-name/bridge.cpp):
//
//   lab  hook                          the student's code in place of
//   02   make_sampler, make_strategy   DistributedSampler and DDP (parallel.strategy = "ddp"; lab_plugin.cpp)
//   03   drive_step                    the optimizer step: accumulation, the loss scaler, clipping (03-amp-accum)
//   04   make_strategy                 ZeRO-1 and ZeRO-2 (04-zero)
//   05   make_strategy                 FSDP's hooks (05-fsdp-1b)
//   06   on_model, pipeline_executor   the column- and row-parallel layers, a stage's 1F1B executor (06-tp-pp)
//   07   save, resume                  the optimizer / RNG / sampler checkpoint (07-checkpoint)
//
// check_run refuses what a lab cannot run (lab 06 without a split, lab 02 in fp16, ...) before anything is
// built. The engine never learns it is a lab.
// Read next: lab_plugin.h (the student's process behind it), then the lab's own bridge.cpp above.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "core/train/extension.h"
#include "grader/bridge/lab_plugin.h"

namespace distlab {

class LabExtension : public TrainerExtension {
 public:
  explicit LabExtension(std::unique_ptr<LabPlugin> plugin);
  LabPlugin& plugin() { return *plugin_; }
  const std::string& name() const { return plugin_->name(); }

  void check_run(const RunConfig& cfg, const MeshShape& mesh, const Runtime& rt) override;
  std::shared_ptr<Sampler> make_sampler(const RunConfig& cfg, int64_t n, int world, int rank) override;
  void on_model(Model& model, Runtime& rt, Mesh* mesh, int64_t micro_batches) override;
  std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup& dp, Model& model, Runtime& rt) override;
  const Pipeline::Executor* pipeline_executor() const override { return executor_ ? &*executor_ : nullptr; }
  bool drives_steps() const override { return plugin_->is("03"); }
  StepOutcome drive_step(RunParts& run, TrainerCalls& calls, int64_t step) override;  // grader/labs/03-amp-accum/bridge.cpp
  bool owns_checkpoints() const override { return plugin_->is("07"); }
  void save(RunParts& run, TrainerCalls& calls, const std::string& dir, int64_t steps, MetricsWriter& metrics) override;  // grader/labs/07-checkpoint/bridge.cpp
  std::optional<ResumePoint> resume(RunParts& run, TrainerCalls& calls, MetricsWriter& metrics) override;                // grader/labs/07-checkpoint/bridge.cpp
  void describe(std::ostream& log) const override;
  void report(nlohmann::json& rank) const override;

 private:
  // lab 07 (grader/labs/07-checkpoint/bridge.cpp): the State the student's code sees, and what load_state
  // left unlike the save
  std::vector<char> snapshot(RunParts& run, int64_t step);
  nlohmann::json restore_problems(RunParts& run, const std::string& dir);

  std::unique_ptr<LabPlugin> plugin_;
  std::unique_ptr<TpKernels> tp_;       // lab 06: the student's column- and row-parallel arithmetic
  std::optional<Pipeline::Executor> executor_;  // lab 06: this stage's executor, the student's
};

// The sections a lab's config (labs/NN-name/lab.toml) adds to a run config: [lab] (its description, and
// plugin and sandbox, which a run reads) and the grader's [[check]] list. Every program that loads a lab's
// config passes these to load_config / parse_config; the engine keeps them in RunConfig::extra unread.
ConfigExtras lab_config_sections();
// The lab a config belongs to: its folder's name when the file has a [lab] section ("" otherwise).
std::string lab_name(const RunConfig& cfg);

// A lab's config runs the student's code: the plugin `distlab lab build` made under `build_dir` (or
// lab.plugin), in a process of its own beside this rank. nullptr: not a lab's config, or lab.plugin = "none".
std::unique_ptr<LabExtension> start_lab_extension(const RunConfig& cfg, const std::string& build_dir);

}  // namespace distlab
