// A lab's student code in a training run. The plugin is never loaded into the trainer: it runs in its own
// sandboxed process (grader/bridge/plugin_process.h), and the classes here stand in for it behind the engine's
// interfaces — a Sampler whose indices come from the student's sampler_indices, and a DataParallel whose
// hooks send the gradients over, run the collectives the student asks for on this rank's real process
// group (counted and traced like the engine's own), and take the averaged gradients back.
// An entry the student left empty fails with a message naming it: the engine's own code never stands in.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/data/sampler.h"
#include "grader/bridge/plugin_process.h"
#include "core/parallel/ddp.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/tensor_parallel.h"

namespace distlab {

// What lab 03's train_step may ask of the trainer, one call per request of the student's Step
// (labs/03-amp-accum/api.h). The trainer implements it (grader/labs/03-amp-accum/bridge.cpp) and checks the
// order.
class LabStepOps {
 public:
  virtual ~LabStepOps() = default;
  virtual double forward_backward(int64_t micro, float loss_factor) = 0;  // gradients += d(loss·factor)
  virtual std::vector<Parameter*> parameters() = 0;
  virtual void optimizer_step(const std::vector<float>& grads) = 0;       // every gradient, f32, model order
  virtual void skip_step() = 0;
  virtual void scheduler_step() = 0;
};

struct LabStepResult {
  float scale_used = 1, scale_after = 1;  // the student's loss scale in this step, and after its update
};

struct LabPluginOptions {
  std::string host_exe;  // distlab-labhost
  std::string plugin;    // the .so
  std::string lab_name;  // "02-ddp-cifar"
  std::string sandbox = "auto";  // auto | require | off
  double timeout_s = 300;        // for one answer of the plugin
  // lab.memory_cgroup: a memory cgroup folder this rank may create a cgroup in; the plugin's process runs
  // in one of its own there, so that all it holds is measured (PluginMemory). "": resident sets instead
  std::string memory_cgroup;
};

class LabPlugin {
 public:
  explicit LabPlugin(const LabPluginOptions& o);  // starts the host and waits for the plugin to load
  // Waits for every all_reduce_async the plugin never waited for: their buffers are freed only once the
  // process group is done with them (an error ends the wait, never the wait for the buffer's last use).
  ~LabPlugin();
  LabPlugin(const LabPlugin&) = delete;
  LabPlugin& operator=(const LabPlugin&) = delete;

  std::shared_ptr<Sampler> make_sampler(int64_t n, int world, int rank, uint64_t seed, bool shuffle);
  // naive ("naive") or bucketed DDP by the student; broadcasts rank 0's weights first, as the engine's does
  std::unique_ptr<DataParallel> make_ddp(const std::string& mode, ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb);

  // Lab 04: the student's ZeRO-1 (stage 1) or ZeRO-2 (stage 2) — grader/labs/04-zero/bridge.cpp
  // and its sharded AdamW (clipping to max_norm, 0: none)
  std::unique_ptr<Strategy> make_zero(int stage, ProcessGroup& pg, Model& model, Runtime& rt, double max_norm);
  // Lab 05: the student's FSDP hooks driving the engine's ZeRO-3 machinery — grader/labs/05-fsdp-1b/bridge.cpp
  // `unit_seed`: the numbers the plugin's units go by are drawn from it (lab.unit_seed); `gather_budget`: the
  // elements its gathered weights may hold at once (lab.gather_budget, 0: none), measured against its peak
  std::unique_ptr<Strategy> make_fsdp(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& sharding, bool prefetch, bool offload,
                                      uint64_t unit_seed, int64_t gather_budget = 0);

  // Lab 06: the student's column- and row-parallel arithmetic (plain and sequence parallel), run in the
  // plugin, its collectives on the layer's tensor-parallel group — grader/labs/06-tp-pp/bridge.cpp
  std::unique_ptr<TpKernels> make_tp_kernels(Runtime& rt);
  // Lab 06: the student's pipeline executor (train_step_1f1b), driving a stage's step through the
  // engine's Pipeline::Driver
  Pipeline::Executor pipeline_executor();
  const std::string& pipeline_ran() const { return pipeline_ran_; }  // the last step's order and syncs ("" before)

  // Lab 03: the student's train_step drives this optimizer step through `ops`. A 1-rank run (pg null)
  // answers the student's all_reduces with their own data.
  bool drives_steps() const { return is("03"); }
  bool is(const char* lab_id) const { return opt_.lab_name.rfind(lab_id, 0) == 0; }  // "02": lab 02's plugin
  const std::string& name() const { return opt_.lab_name; }
  LabStepResult train_step(LabStepOps& ops, int accum_steps, double max_norm, const float scaler_config[3],
                           int32_t growth_interval, ProcessGroup* pg, Runtime& rt);

  // Runs one function of the plugin; collectives it asks for on the way run on *pg (may be null). Other
  // requests go to `serve` (lab 03's and lab 04's Step), which answers them.
  using Serve = std::function<void(const wire::Frame&, std::vector<char>&)>;
  std::vector<char> call(labproto::Fn fn, std::initializer_list<int64_t> args, const void* in, size_t in_bytes, ProcessGroup* pg,
                         Runtime* rt, const char* during, const Serve& serve = nullptr);
  void reply(labproto::Op op, const void* data, size_t bytes, int64_t arg, const char* during);

  // The largest message the plugin may send from now on (a request's payload or a function's answer), once
  // the trainer knows its model: a few times the parameters' bytes, never over labproto::kMaxPayload. A larger
  // one is a protocol error, before the trainer allocates for it.
  void limit_messages(uint64_t bytes) { max_message_ = std::min(bytes, labproto::kMaxPayload); }
  uint64_t message_limit() const { return max_message_; }
  // The largest all_reduce the plugin asked for (bytes): lab 02's grader checks a bucket against bucket_mb
  uint64_t largest_all_reduce_bytes() const { return largest_all_reduce_; }
  // What the plugin's process held (PluginMemory) and what of it the trainer counts already: buffers the
  // host keeps for the student and the trainer counts as this rank's (lab 04's state). The rest is the
  // plugin's own memory, which the grader adds to the rank's.
  nlohmann::json memory_report() const;
  void count_host_bytes(int64_t bytes) { host_counted_ += bytes; }

 private:
  struct Pending {
    Tensor buffer;  // comm_buffers: what the wait answers with
    Tensor input;   // a reduce_scatter's input, alive until the collective is done
    size_t bytes = 0;  // of the plugin's vector
    std::shared_ptr<Work> work;
  };
  void serve_collective(const wire::Frame& f, std::vector<char>& payload, ProcessGroup* pg, Runtime* rt, const char* during,
                        bool one_rank_ok);
  void serve_scatter_gather(const wire::Frame& f, std::vector<char>& payload, ProcessGroup& pg, Runtime& rt, const char* during);

  LabPluginOptions opt_;
  std::unique_ptr<PluginProcess> proc_;
  std::map<int64_t, Pending> pending_;
  int64_t next_handle_ = 1;
  uint64_t max_message_ = labproto::kMaxPayload;
  uint64_t largest_all_reduce_ = 0;
  uint64_t largest_message_ = 0;  // the largest payload that crossed the socket, either way
  int64_t host_counted_ = 0;
  std::string cgroup_dir_;        // the plugin's own memory cgroup (made here, removed with it)
  std::string pipeline_ran_;
};

}  // namespace distlab
