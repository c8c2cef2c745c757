// The one interface every parallel strategy implements, and the only thing the trainer knows of them.
// A training step, as the trainer calls it (core/train/trainer.cpp):
//
//   for each micro-step:  strategy.begin_backward(last micro-step?)     (false: PyTorch's no_sync)
//                         model.forward ... loss ... model.backward(strategy)
//                              └ strategy.after_layer_backward(unit, params) after each unit's gradients
//                         strategy.finish_backward()                  (gradients synchronised if it syncs)
//   unscale, clip, then   strategy.step(optimizer, lr, grad_factor)   (on the shard this rank owns)
//
// The model calls before_forward(unit) before each unit's forward and after_layer_backward(unit, params)
// after each unit's backward — ordinary calls in its loops (core/models/), no hidden hooks.
//
// The interface is two: StepHooks (what runs during a step) and StrategyState (what it holds, for the
// optimizer, a checkpoint, an evaluation, the report); a Strategy is both.
// none.h is the single-device strategy (every hook does nothing); ddp.h averages gradients across ranks;
// zero1.h, zero2.h and zero3.h shard the optimizer state, then the gradients, then the parameters (ZeRO-3's
// before_forward gathers a unit's shards, step updates only this rank's). FSDP, TP and PP implement the
// same calls. Which strategy a run gets is make_strategy's decision
// (core/train/strategies.cpp), from the config — the trainer never compares a strategy's name.
// Read next: none.h, then ddp.h.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/models/model.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "core/parallel/tensor_parallel.h"
#include "core/util/choice.h"

namespace distlab {

// parallel.strategy: which of the files in this folder holds the data-parallel step
enum class StrategyKind { none, ddp, zero1, zero2, zero3, fsdp };
template <>
struct ChoiceTable<StrategyKind> {
  static constexpr std::array names = {choice(StrategyKind::none, "none"),   choice(StrategyKind::ddp, "ddp"),
                                       choice(StrategyKind::zero1, "zero1"), choice(StrategyKind::zero2, "zero2"),
                                       choice(StrategyKind::zero3, "zero3"), choice(StrategyKind::fsdp, "fsdp")};
};

// What a strategy does during a step: the hooks the model's loops and the trainer's step call, in the
// order drawn above. 12 virtuals.
class StepHooks : public ForwardHook, public BackwardHook {
 public:
  ~StepHooks() override = default;
  // Before unit `unit`'s forward (ZeRO-3 gathers its parameters here) and after it; before its backward.
  // Nothing for none and DDP.
  void before_forward(int unit) override {}
  void after_forward(int unit) override {}
  void before_layer_backward(int unit) override {}
  // Each micro-step: `sync` false on all but the last one of an accumulation (gradients stay local).
  virtual void begin_backward(bool sync) {}
  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override {}
  virtual void finish_backward(Runtime& rt) {}
  // true: the gradients are reduced in finish_backward alone, nothing during the backward (ZeRO-1). A
  // pipeline can then reduce once after every backward of the step, when the tied embedding's two copies
  // have been summed; DDP's buckets leave during the backward instead, and the sum comes after.
  virtual bool reduces_after_backward() const { return false; }
  // The global L2 norm of the gradients the step will read, and whether any holds an inf or a NaN on any
  // rank — over the whole gradients here, over every rank's slice where they are sharded.
  virtual double grad_norm(Runtime& rt, Model& model) { return distlab::grad_norm(rt, model.parameters()); }
  virtual bool found_inf(Runtime& rt, Model& model, ProcessGroup* pg) { return GradScaler::found_inf(rt, model.parameters(), pg); }
  // The same norm for a model split by tensor and pipeline parallelism (tp, pp: those axes' groups, or
  // nullptr): this rank's gradients counted as model_parallel_grad_norm counts them (split ones always,
  // whole ones on TP rank 0, a tied copy never), over the data-parallel axis where they are held in parts.
  virtual double split_grad_norm(Runtime& rt, Model& model, ProcessGroup* tp, ProcessGroup* pp) {
    return model_parallel_grad_norm(rt, model.parameters(), tp, pp);
  }
  // The optimizer step over the parameters this rank owns (all of them for none and DDP). grad_factor:
  // 1/loss_scale × the clip coefficient, applied as the optimizer reads each gradient.
  virtual void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) { opt.step(rt, lr, grad_factor); }
  // After every optimizer step, taken or skipped: the gradients released (set_to_none), the parts of them
  // a ZeRO rank keeps too.
  virtual void zero_grad(Model& model) { model.zero_grad(); }
  // true where grad_norm and step above are exactly these defaults (none, the engine's DDP, which set it
  // in their constructors): the trainer may then take the norm and the clip on the device and call
  // opt.step_device_factor (no wait for the norm). Any other strategy, a lab's too, keeps false.
  bool plain_optimizer_step() const { return plain_optimizer_step_; }

 protected:
  bool plain_optimizer_step_ = false;
};

// What a strategy holds, and how to reach it whole: for the optimizer it builds, a save and a load
// (core/train/trainer_ckpt.cpp), an evaluation, and the run's report. 12 virtuals.
class StrategyState {
 public:
  virtual ~StrategyState() = default;
  virtual std::string describe() const = 0;  // for the run's header: "none", "ddp (bucketed)"
  // What the strategy did, for the run's summary ("strategy_report"): its name, the collectives it issues
  // per optimizer step, the buffers it holds. The trainer adds the communication counters and the memory
  // per category of the whole run; this is what only the strategy knows.
  virtual nlohmann::json report() const { return {{"name", describe()}}; }
  // What the optimizer steps: the model's parameters (none, DDP) or this rank's slices of them (ZeRO).
  virtual std::vector<Parameter*> optimizer_parameters(Model& model) { return trainable(model.parameters()); }
  // Where the optimizer keeps its state: on the device, or in host memory under CPU offload.
  virtual Category optimizer_state_category() const { return Category::optim_state; }

  // ZeRO-3: between uses a rank holds only its part of the parameters; the model is whole only inside
  // the forward and backward that the hooks drive. An evaluation then runs on every rank, through them.
  virtual bool shards_parameters() const { return false; }
  // Every parameter whole on every rank (a collective: all ranks call it) — for --init, a save, the check
  // that replicas agree — from the optimizer's f32 master weights where `masters` has them (a save writes
  // those); release_full_params puts things back. keep_changes: the whole weights were changed (--init
  // loaded them) and the shards take them. Nothing to do where the parameters are whole anyway.
  virtual void gather_full_params(Runtime& rt, const Optimizer* masters) {}
  virtual void release_full_params(Runtime& rt, bool keep_changes) {}
  // Calls fn on every parameter, whole, a unit at a time where they are sharded (a check that replicas
  // agree needs no more than one unit whole at once). A collective under ZeRO-3: every rank calls it.
  virtual void visit_full_params(Runtime& rt, Model& model, const std::function<void(const std::vector<Parameter*>&)>& fn) {
    fn(model.parameters());
  }

  // For checkpoints: what each of the optimizer's parameters holds, as elements [param_offset,
  // param_offset + numel) of a model parameter (flattened) at local_offset of its own. The default: the
  // optimizer steps the model's parameters, whole.
  struct Slice {
    Parameter* param;
    int64_t param_offset, local_offset, numel;
  };
  virtual std::vector<std::vector<Slice>> optimizer_slices(Model& model) {
    std::vector<std::vector<Slice>> v;
    for (Parameter* p : trainable(model.parameters())) v.push_back({Slice{p, 0, 0, p->data.numel()}});
    return v;
  }
  // true: every rank holds the same optimizer state (none, DDP), which rank 0 alone writes; false: each
  // rank holds its own part (ZeRO, FSDP) and writes it.
  virtual bool replicates_optimizer() const { return true; }
  // After a checkpoint's values were put into the optimizer's parameters (and the model's, where whole):
  // ZeRO-1 and 2 must not take their f32 parts from the rounded parameters again at the next step.
  virtual void checkpoint_loaded() {}
  // Why this strategy cannot be checkpointed ("" when it can).
  virtual std::string checkpoint_refusal() const { return ""; }
};

// A strategy is both: the loop holds it as StepHooks, the checkpoint code and the report as StrategyState.
class Strategy : public StepHooks, public StrategyState {};

}  // namespace distlab
