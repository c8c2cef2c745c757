// CPU offload (ZeRO-Offload, DeepSpeed's offload_optimizer, PyTorch FSDP's CPUOffload): the f32 parts, their
// gradients and the optimizer state live in host memory, and the host's CPU runs the optimizer step. What
// the offload changes in ZeRO-2 (zero2.cpp) and ZeRO-3/FSDP (zero3.cpp) is all here:
//   - where a part and its reduced gradient live (category host: not counted against the device);
//   - each reduced gradient part crosses PCIe to the host, each updated part (ZeRO-2) or each part a
//     gather needs (ZeRO-3) crosses back — traced as copies, which the cost model charges at the profile's
//     host link bandwidth;
//   - the step runs with the host's kernels on a cuda rank (HostKernels), for real.
// Off, every call here does nothing and the categories are the device's.
// Read next: flat_masters.h (a save from the f32 masters).
#pragma once
#include "core/optim/optimizer.h"
#include "core/parallel/flat_param.h"
#include "core/tensor/runtime.h"
#include "core/util/choice.h"

namespace distlab {

// parallel.offload: where the shards and the optimizer state live between steps
enum class OffloadTo { none, cpu };
template <>
struct ChoiceTable<OffloadTo> {
  static constexpr std::array names = {choice(OffloadTo::none, "none"), choice(OffloadTo::cpu, "cpu")};
};

struct Offload {
  bool on = false;

  Category parts(Category on_device) const { return on ? Category::host : on_device; }  // a part's category
  Category grads() const { return parts(Category::grads); }                             // a reduced gradient part's
  Category optimizer_state() const { return parts(Category::optim_state); }

  void gradient_to_host(Runtime& rt, const FlatParam& f) const {
    if (on) rt.trace.record_copy("offload: gradient part to the host", double(f.local.grad.nbytes()));
  }
  void updated_part_to_device(Runtime& rt, const FlatParam& f) const {  // ZeRO-2: in the parameters' dtype
    if (on) rt.trace.record_copy("offload: updated part to the device", double(f.shard) * dtype_size(rt.dtype));
  }
  void part_to_device(Runtime& rt, const FlatParam& f) const {  // ZeRO-3: a part its all-gather needs
    if (on) rt.trace.record_copy("offload: parameters to the device", double(f.local.data.nbytes()));
  }
  // The optimizer's step over this rank's parts: by the host's CPU where they are host memory.
  void step(Runtime& rt, Optimizer& opt, const FlatParams& flats, float lr, float grad_factor) const {
    rt.trace.set_on_host(on);  // offloaded: the host's CPU steps the host's state
    {
      HostKernels host(rt, flats.parts_on_host());  // a cuda rank's offloaded parts: with the host's kernels
      opt.step(rt, lr, grad_factor);                 // this rank's parts only: the optimizer was built on them
    }
    rt.trace.set_on_host(false);
  }
};

}  // namespace distlab
