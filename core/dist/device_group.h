// A cuda rank's collectives on device memory: `dist.backend = "nccl"`. DDP's buckets are all-reduced
// where they are, on the GPU, instead of crossing to the host for Gloo. Two implementations:
//   - on a GPU, libdistlab_cuda.so's NcclGroup (core/cuda/nccl_group.h): the collective runs on the
//     communication stream after what the compute stream has queued, so backward overlaps it;
//   - on cuda-sim, the rank's Gloo group over host copies of the same buffers, with the same calls in the
//     same order: how CI runs DDP's NCCL path without a GPU.
// The host-side collectives (the loss average, the overflow flag, SyncBatchNorm's statistics, the initial
// broadcast) stay on the Gloo group, as PyTorch jobs keep a gloo group beside the nccl one for CPU tensors.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/dist/process_group.h"

namespace distlab {

struct Runtime;

class DeviceWork {
 public:
  virtual ~DeviceWork() = default;
  // The result is in place for whatever the rank queues next (a GPU: the compute stream waits for the
  // collective). A peer that never joins is a CommError naming the collective, after the timeout.
  virtual void wait() = 0;
};

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "NCCL 2.28.9 over 2 GPUs"
  // data (n f32 on the device) := op over the ranks; `wire` bf16/f16 sends 16 bits (reduce_dtype)
  virtual std::shared_ptr<DeviceWork> all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) = 0;
  // what this group moved itself (its all-reduces), beside the Gloo group's counters; cuda-sim's traffic
  // is the Gloo group's, already counted there
  virtual CommCounters counters() const = 0;
};

// The device group of a cuda (or cuda-sim) rank beside its Gloo group `pg` (whose store, rank, size and
// timeout it shares). Throws ConfigError for a cpu or meta rank, Error/CommError when NCCL cannot start.
std::unique_ptr<DeviceGroup> make_device_group(Runtime& rt, const std::string& device, ProcessGroup& pg, Millis timeout);

}  // namespace distlab
