// ZeRO stage 2 (Rajbhandari et al., P_os+g): ZeRO-1 (zero1.h) and the GRADIENTS split N ways too. During
// backward, as soon as a unit's gradients are complete (after_layer_backward), they are reduce-scattered:
// each rank keeps the average of its 1/N part and releases the whole gradients at once — so whole gradients
// exist only for the unit being reduced, never for the whole model.
//
//   backward, unit u done:  flat(u's grads) ──reduce_scatter(avg)──> local.grad (S/N)   whole grads freed
//                           (async: it overlaps the next unit's backward, as DDP's buckets do)
//   step:                   the optimizer steps each f32 part (local.data: the master, optim_state), then
//                           all_gather(parts) ──> every parameter, whole, on every rank (as ZeRO-1)
//
// Memory per rank, with bf16 parameters and Adam (Ψ parameters, K = 12): 2Ψ (parameters) + 2Ψ/N (gradient
// parts) + 12Ψ/N (master + moments) — the paper's 2Ψ + 14Ψ/N — plus the whole gradients of the unit in
// flight (GPT's root unit holds its embedding's gradient all through backward: the tied lm_head starts it).
// Communication: a reduce-scatter and an all-gather of every parameter: DDP's one all-reduce.
// Accumulation: on no_sync micro-steps the whole gradients add up locally, as DDP's (PyTorch FSDP's no_sync);
// the last micro-step reduces them.
// CPU offload (ZeRO-Offload, DeepSpeed's offload_optimizer): the f32 parts, their gradients and the
// optimizer state live in host memory, and the host's CPU runs the step; each reduced gradient part
// crosses PCIe to the host and each updated part crosses back before the all-gather. Device memory:
// 2Ψ of parameters plus the unit in flight; the price is those copies, every step.
// The layout is flat_param.h's, one flat vector per unit; offload.h holds what CPU offload changes.
// Read next: offload.h (what CPU offload changes), then zero3.h (the parameters split too).
#pragma once
#include <memory>
#include <vector>

#include "core/parallel/offload.h"
#include "core/parallel/sharded_strategy.h"

namespace distlab {

class ZeRO2 : public ShardedStrategy {
 public:
  ZeRO2(ProcessGroup& pg, Model& model, Runtime& rt, bool offload = false);
  std::string describe() const override { return offload_.on ? "zero2 (cpu offload)" : "zero2"; }
  Category optimizer_state_category() const override { return offload_.optimizer_state(); }
  nlohmann::json report() const override;

  void begin_backward(bool sync) override { sync_ = sync; }
  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override;
  void finish_backward(Runtime& rt) override;
  void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) override;
  void checkpoint_loaded() override { loaded_ = true; }
  void gather_full_params(Runtime& rt, const Optimizer* masters) override;
  void release_full_params(Runtime& rt, bool keep_changes) override;

 private:
  void finish_reduces();  // wait for the reduce-scatters in flight, keep each rank's part

  struct Reduce {  // a unit's gradients on their way: the whole flat vector, this rank's averaged part
    FlatParam* f;
    Tensor flat, part;
    std::shared_ptr<Work> work;
  };
  ProcessGroup& pg_;
  Runtime& rt_;
  Offload offload_;
  std::vector<Reduce> reducing_;
  bool sync_ = true;
  bool loaded_ = false;            // the parts hold the parameters' values (at the first step, after --init)
  std::vector<Tensor> set_aside_;  // the parameters' own data while gather_full_params lends f32 masters
};

}  // namespace distlab
