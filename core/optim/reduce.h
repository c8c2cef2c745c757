// Values a step's kernels leave in the rank's device memory for the host to read back together: the
// squares of every gradient for the gradient norm, the overflow flag of every gradient for the loss scaler.
// Reading each gradient's value as it is computed stops a GPU once per parameter (~150 times a step for
// GPT-2): the host waits for the queue to drain, and the GPU idles until the host queues the next kernel.
// Queued into slots here and read once, the step waits once (DeviceMemory::host_waits counts them), or
// not at all where the value is needed only on the device: the clip factor (clip_factor, read by AdamW and
// SGD in place) and the micro-batches' losses, read by the trainer after the step's closing synchronize.
// On a cpu rank the slots are host memory and the read is a copy: the same numbers, bit for bit.
//
//   DeviceScalars ss(rt, params.size(), "the gradient norm's sums");
//   for (size_t i = ...) sum_squares_into(rt, g_i, n_i, ss.sum(i));   // queued, no wait
//   const double total = ss.total();                                    // one wait, the slots in order
//
// Next: core/optim/optimizer.cpp (grad_norm, grad_norm_on_device), core/optim/grad_scaler.cpp (found_inf)
// and core/train/trainer.cpp (the step's losses and norm) use it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor/runtime.h"

namespace distlab {

class DeviceScalars {
 public:
  // `count` slots of 8 bytes, zeroed: in the rank's device memory (straight from its allocator, not counted
  // as a tensor: 8 bytes a parameter, as cuBLAS's workspace is not), in host memory on a cpu rank
  DeviceScalars(Runtime& rt, int64_t count, const char* what);
  ~DeviceScalars();
  DeviceScalars(const DeviceScalars&) = delete;
  DeviceScalars& operator=(const DeviceScalars&) = delete;
  double* sum(int64_t i);  // slot i as a double (sum_squares_into's out)
  float* flag(int64_t i);  // slot i as a float (flag_nonfinite's flag); a slot holds a sum or a flag, not both
  // every slot, after the work queued before: one wait on a device rank
  std::vector<double> read_sums();
  double total();  // the slots' sums added in slot order (an unused slot is +0.0): one wait
  bool any_flag();  // some slot's flag is set

 private:
  int64_t count_;
  DeviceMemory* device_ = nullptr;  // a device rank's memory, and its slots (8 bytes each)
  void* slots_ = nullptr;
  std::vector<double> sums_;  // a cpu rank's sums, and a device rank's once read
  std::vector<float> flags_;  // the same for the flags
};

}  // namespace distlab
