// How a rank gets a device with memory of its own: `cuda` (a GPU through libdistlab_cuda.so: its context,
// caching allocator and kernels) or `cuda-sim` (the same code path on the CPU: core/ops/sim_device.h).
// cpu and meta need nothing: their Runtime is complete as constructed.
//
//   Runtime rt(parse_device(cfg.train.device), rank);
//   auto gpu = attach_device(rt, cfg.train.device, local_rank);   // before the first tensor
//   ... train ...                                                  // gpu outlives every tensor of rt
#pragma once
#include <memory>
#include <string>

#include "core/tensor/runtime.h"

namespace distlab {

class AttachedDevice {
 public:
  virtual ~AttachedDevice() = default;
  // Waits for the work queued on the device so far: a measured time that ends here is the device's.
  virtual void synchronize() = 0;
  // "cuda:0 NVIDIA H200 (sm 90, 139.8 GiB free)" or "cuda-sim (the cpu kernels behind device pointers)"
  virtual std::string describe() const = 0;
};

// `device` is train.device. For "cuda" and "cuda-sim" (rt.device must be cuda) the rank takes GPU
// `local_rank` modulo the GPUs present, its tensors live there, and its capacity is the GPU's free memory
// (train.device_mem can only lower it). nullptr for cpu and meta. Throws Error with the reason when the
// GPU cannot be used.
std::unique_ptr<AttachedDevice> attach_device(Runtime& rt, const std::string& device, int local_rank);

}  // namespace distlab
