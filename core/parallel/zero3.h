// ZeRO stage 3 (Rajbhandari et al., P_os+g+p): ZeRO-2 (zero2.h) and the PARAMETERS split N ways too.
// Between uses a rank holds only its 1/N part of each unit's weights; a unit is made whole by an
// all-gather just before its forward and again just before its backward, and freed right after each.
//
//   before_forward(u)        all_gather u's parts ──> u's parameters, whole        (prefetch: issue u+1's now)
//   after_forward(u)         u waits to be freed: freed when the next unit starts (the unit that ends the
//                            forward is kept: its backward comes first — PyTorch FSDP's root rule)
//   before_layer_backward(u) all_gather u again                                    (prefetch: the next one back)
//   after_layer_backward(u)  reduce_scatter u's gradients ──> local.grad (S/N), async: it overlaps the
//                            next unit's backward; whole gradients and whole parameters freed
//   step                     the optimizer steps each part (its f32 master when parameters are 16-bit);
//                            nothing to gather: the next forward does it
//
// Memory per rank, bf16 parameters and Adam (K = 12): 16Ψ/N of model state (2 + 2 + 12, all divided by N)
// plus the working set: the units whole at one time (the one computing, the one prefetched, GPT's root with
// the tied embedding) and their gradients until reduced.
// Communication: parameters gathered twice (forward, backward) and gradients reduce-scattered once: 1.5x
// DDP's bytes in fp32 — the price of the paper's Nx memory saving. 16-bit parameters travel in 16 bits.
// Prefetch: the unit the forward (or backward) will need next is gathered asynchronously while this one
// computes; the order is recorded on the first step (exec_order.h: PyTorch FSDP records its order the same way).
// Below, a "unit" is the model's (Model::units()); a "group" is one flat vector's worth of units (flat_param.h):
// the same thing unless FSDP's size-based wrap policy merges consecutive units.
// Read next: fsdp.h (the same machinery in PyTorch's words).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "core/parallel/exec_order.h"
#include "core/parallel/offload.h"
#include "core/parallel/sharded_strategy.h"

namespace distlab {

// What FSDP (fsdp.h) varies in the same machinery; ZeRO-3 is the default.
struct ShardedOptions {
  bool reshard_after_forward = true;  // false (FSDP's SHARD_GRAD_OP): a unit gathered for its forward stays
                                      // whole until its backward is done — one all-gather per step, not two
  bool prefetch = true;               // gather the next unit (in forward and in backward) while this one computes
  bool offload = false;               // CPU offload (offload.h): the parts, their gradients and the optimizer
                                      // state live in host memory; the step runs on the host's CPU
  int64_t min_params = 0;             // FSDP's size_based_auto_wrap_policy: consecutive units share one flat
                                      // vector until it holds this many parameters (0: one per unit)
  bool forward_prefetch = true;       // with prefetch, in forward too (PyTorch FSDP's forward_prefetch); false:
                                      // backward only (BACKWARD_PRE without forward_prefetch, FSDP's default)
  int prefetch_depth = 1;             // with prefetch: how many units ahead are gathered (FSDP2's lists of modules
                                      // to prefetch; DeepSpeed's stage3_prefetch_bucket_size in units): each one
                                      // more holds another unit whole, and lets a slow gather start earlier
};

class ZeRO3 : public ShardedStrategy {
 public:
  ZeRO3(ProcessGroup& pg, Model& model, Runtime& rt, ShardedOptions o, std::string name = "zero3");
  std::string describe() const override;
  nlohmann::json report() const override;
  bool shards_parameters() const override { return true; }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void begin_backward(bool sync) override;
  void before_layer_backward(int unit) override;
  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override;
  void finish_backward(Runtime& rt) override;
  void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) override;
  void gather_full_params(Runtime& rt, const Optimizer* masters) override;
  void release_full_params(Runtime& rt, bool keep_changes) override;
  void visit_full_params(Runtime& rt, Model& model, const std::function<void(const std::vector<Parameter*>&)>& fn) override;
  Category optimizer_state_category() const override { return offload_.parts(Category::optim_state); }

 protected:
  struct InFlight {  // a group's all-gathers, issued and not yet waited for
    std::vector<std::shared_ptr<Work>> work;
    std::vector<Tensor> flat, part;
    std::vector<bool> f32;  // per flat vector: from the optimizer's f32 masters (a save), into f32 parameters
  };
  struct Reduce {  // a group's gradients on their way: the whole flat vector, this rank's averaged part
    FlatParam* f;
    Tensor flat, part;
    std::shared_ptr<Work> work;
  };
  void issue(int group, const Optimizer* masters = nullptr);  // the group's all-gathers, async
  void gather(int group);                                      // whole parameters (waits for a prefetch)
  void prefetch(const ExecOrder& order, int group);            // issue the prefetch_depth groups after `group` in `order`
  void release(int group);                                     // back to its parts: the whole weights freed
  void release_waiting(int keep_a, int keep_b);                // after_forward's groups, but these two
  void reduce(int group);                                      // the group's reduce-scatters, async
  void finish_reduces();                                       // the reduces in flight, each rank's part kept

  ProcessGroup& pg_;
  Runtime& rt_;
  ShardedOptions o_;
  Offload offload_;
  std::string name_;
  bool sync_ = true;
  std::vector<bool> whole_;            // per group: its parameters are whole now
  std::map<int, InFlight> in_flight_;  // per group
  std::vector<int> waiting_;           // forward done, parameters not yet freed
  std::vector<Reduce> reducing_;
  ExecOrder fwd_order_, bwd_order_;    // of groups, recorded on the first step
  int64_t gathers_ = 0, prefetches_ = 0;
};

}  // namespace distlab
