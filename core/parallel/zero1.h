// ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", P_os): every rank holds the whole model and computes whole gradients, as DDP; the OPTIMIZER
// STATE is split N ways. Each rank steps only its 1/N slice of the parameters and then all-gathers the
// updated slices, so the replicas stay equal.
//
//   parameters, by weight decay, flattened into one vector per group and padded to a multiple of N:
//     group g: [ p0 | p1 | ... | pad ]      rank r owns elements [r·S/N, (r+1)·S/N) of it
//   after backward:  reduce_scatter(avg) the flat gradient  → this rank's slice of the averaged gradient
//                    (bucket by bucket: parallel.bucket_mb of f32 per collective, never a whole-model copy)
//                    (mode "all_reduce": all_reduce it whole and keep the slice — the naive form, same numbers)
//   step:            the optimizer steps the f32 slice it owns (its master weights: 4 bytes, + Adam's 8, per
//                    parameter / N), then all_gather(slices) → every parameter, on every rank
//
// Memory per rank (Ψ parameters, K bytes of optimizer state per parameter): params + grads as DDP (the
// whole gradients are released once reduced; the slice is kept in the parameters' dtype), and optimizer
// state K·Ψ/N instead of K·Ψ — the paper's 4Ψ + 12Ψ/N with bf16 parameters and Adam.
// Communication: reduce_scatter + all_gather = one all_reduce's worth, so ZeRO-1 costs what DDP costs.
// The layout is flat_param.h's, with the whole model as one unit; this file issues its collectives.
// Read next: zero2.h (the gradients split too).
#pragma once
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/parallel/sharded_strategy.h"

namespace distlab {

// parallel.zero_reduce: how ZeRO-1 brings each rank its part of the gradients
enum class ZeroReduce { reduce_scatter, all_reduce };
template <>
struct ChoiceTable<ZeroReduce> {
  static constexpr std::array names = {choice(ZeroReduce::reduce_scatter, "reduce_scatter"), choice(ZeroReduce::all_reduce, "all_reduce")};
};

class ZeRO1 : public ShardedStrategy {
 public:
  // mode: "reduce_scatter" (the default) or "all_reduce" (all-reduce the whole gradient, then slice).
  // bucket_mb: the f32 bytes reduced (and gathered) per collective — DeepSpeed's reduce_bucket_size.
  ZeRO1(ProcessGroup& pg, Model& model, Runtime& rt, ZeroReduce mode, double bucket_mb = 25);
  std::string describe() const override { return fmt::format("zero1 ({})", mode_); }
  nlohmann::json report() const override;

  void begin_backward(bool sync) override { sync_ = sync; }
  void finish_backward(Runtime& rt) override;  // this rank's slice of the averaged gradient
  bool reduces_after_backward() const override { return true; }
  void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) override;
  // for a save: the f32 slices (the master weights) gathered and lent to the parameters, then put back
  void checkpoint_loaded() override { loaded_ = true; }
  void gather_full_params(Runtime& rt, const Optimizer* masters) override;
  void release_full_params(Runtime& rt, bool keep_changes) override;

 private:
  ProcessGroup& pg_;
  ZeroReduce mode_;
  int64_t bucket_;  // elements of each rank's slice per collective (bucket_mb / 4 bytes / N)
  // flats_ (ShardedStrategy's): one flat vector per weight-decay group over the whole model; local.data is
  // this rank's f32 slice (optim_state), local.grad its slice of the averaged gradient
  bool sync_ = true;
  bool loaded_ = false;  // the slices hold the parameters' values (done at the first step, after --init)
  std::vector<Tensor> set_aside_;  // the parameters' own data while gather_full_params lends the masters
};

}  // namespace distlab
