#include "core/parallel/zero2.h"

#include "core/parallel/ddp.h"

#include <algorithm>

namespace distlab {

ZeRO2::ZeRO2(ProcessGroup& pg, Model& model, Runtime& rt, bool offload)
    : ShardedStrategy(rt, pg, model, "zero2", offload ? Category::host : Category::optim_state, DType::f32), pg_(pg), rt_(rt),
      offload_(offload) {
  broadcast_model(pg, model);  // every replica starts equal, as DDP's; the parts are taken at the first step
}

nlohmann::json ZeRO2::report() const {
  const auto& all = shards_.all();
  int64_t padded = 0, part = 0;
  for (const auto& s : all) padded += s.padded, part += s.shard;
  return {{"name", describe()}, {"offload", offload_}, {"flat_vectors", all.size()}, {"padded_elements", padded}, {"elements_per_rank", part},
          {"collectives_per_step", "reduce_scatter per unit during backward + all_gather per unit after the step"}};
}

void ZeRO2::after_layer_backward(int unit, const std::vector<Parameter*>&) {
  if (!sync_) return;  // accumulation: whole gradients stay local until the last micro-step (no_sync)
  finish_reduces();    // the unit before this one (in backward), whose reduce overlapped this unit's backward
  for (FlatShard* s : shards_.of_unit(unit)) {
    shards_.issue_reduce(*s, offload_ ? Category::host : Category::grads);
    reducing_.push_back(s);
  }
}

void ZeRO2::finish_reduces() {
  shards_.finish_reduces();
  if (offload_)  // each reduced part goes to the host, where the optimizer waits for it
    for (FlatShard* s : reducing_) rt_.trace.record_copy("offload: gradient part to the host", double(s->local.grad.nbytes()));
  reducing_.clear();
}

void ZeRO2::finish_backward(Runtime&) { finish_reduces(); }

void ZeRO2::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  if (!loaded_) {  // the f32 parts start from the parameters (after --init), at the first step
    for (auto& s : shards_.all()) shards_.load_local(s);
    loaded_ = true;
  }
  rt.trace.set_on_host(offload_);  // offloaded: the host's CPU steps the host's state
  {
    HostKernels host(rt, shards_.parts_on_host());  // a cuda rank's offloaded parts: with the host's kernels, for real
    opt.step(rt, lr, grad_factor);                   // this rank's parts only: the optimizer was built on them
  }
  rt.trace.set_on_host(false);
  for (auto& s : shards_.all()) {
    s.local.grad = Tensor();
    if (offload_)  // the updated part, in the parameters' dtype, back to the device for the all-gather
      rt.trace.record_copy("offload: updated part to the device", double(s.shard) * dtype_size(rt.dtype));
    Tensor flat, part;
    shards_.gather_async(s, flat, part, rt.dtype)->wait();  // in the parameters' dtype: half the bytes in 16 bits
    UnitShards::unpack(rt, s, flat.f32());
  }
}

// The f32 parts are the master weights: lend them, whole, to the parameters (for a save), and put the
// parameters' own (16-bit) data back afterwards.
void ZeRO2::gather_full_params(Runtime& rt, const Optimizer*) {
  if (loaded_) lend_masters(rt, pg_, shards_.all(), set_aside_);  // before the first step the parameters are the truth
}

void ZeRO2::release_full_params(Runtime&, bool keep_changes) {
  restore_params(shards_.all(), set_aside_);
  if (keep_changes) loaded_ = false;  // the parts are taken from the parameters again at the next step
}

}  // namespace distlab
