// A cuda rank's collectives on device memory: `dist.backend = "nccl"`. The strategies' flat buffers (DDP's
// buckets, ZeRO's and FSDP's reduce-scatters and all-gathers) are reduced and gathered where they are, on
// the GPU, instead of crossing to the host for Gloo. The rank's ProcessGroup holds its DeviceGroup as its
// device backend (ProcessGroup::set_device_backend), and core/parallel/comm_buffers.h dispatches by where a
// buffer lives. Two implementations:
//   - on a GPU, libdistlab_cuda.so's NcclGroup (core/cuda/nccl_group.h): the collective runs on the
//     communication stream after what the compute stream has queued, so backward overlaps it;
//   - on cuda-sim, the rank's Gloo group over host copies of the same buffers, with the same calls in the
//     same order: how CI runs the NCCL path without a GPU.
// The host-side collectives (the loss average, the overflow flag, the grad norm's sum, SyncBatchNorm's
// statistics, the initial broadcast) stay on the Gloo group, as PyTorch jobs keep a gloo group beside the
// nccl one for CPU tensors.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/comm/process_group.h"
#include "core/util/choice.h"

namespace distlab {

// dist.backend: what the strategy's flat buffers are reduced and gathered over
enum class CommBackend { gloo, nccl };
template <>
struct ChoiceTable<CommBackend> {
  static constexpr std::array names = {choice(CommBackend::gloo, "gloo"), choice(CommBackend::nccl, "nccl")};
};

struct Runtime;
class DeviceMemory;

// The collectives of ProcessGroup, on device pointers, asynchronous. A Work's wait() returns once the
// result is in place for whatever the rank queues next; a peer that never joins is a CommError naming the
// collective, after the group's timeout.
class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "NCCL 2.28.9 over 2 GPUs"
  // As ProcessGroup's: data (n f32) := op over the ranks; in (size·n) -> out (n); in (n) -> out (size·n).
  // `wire` bf16/f16 sends 16 bits (precision.reduce_dtype; the 16-bit parameters' all-gathers).
  virtual std::shared_ptr<Work> all_reduce_async(float* data, int64_t n, ReduceOp op, DType wire) = 0;
  virtual std::shared_ptr<Work> reduce_scatter_async(float* out, const float* in, int64_t n, ReduceOp op, DType wire) = 0;
  virtual std::shared_ptr<Work> all_gather_async(float* out, const float* in, int64_t n, DType wire) = 0;
  // what this group moved itself, per operation, beside the Gloo group's counters; cuda-sim's traffic is
  // the Gloo group's, already counted there
  virtual std::map<std::string, CommCounters> counters() const = 0;
};

// The device group of a cuda (or cuda-sim) rank beside its Gloo group `pg` (whose store, rank, size and
// timeout it shares). Throws ConfigError for a cpu or meta rank, Error/CommError when NCCL cannot start.
std::unique_ptr<DeviceGroup> make_device_group(Runtime& rt, const std::string& device, ProcessGroup& pg, Millis timeout);

// A DeviceGroup installed as pg's device backend for as long as this lives (ProcessGroup::set_device_backend),
// uninstalled first when it goes (a constructor that throws included).
class DeviceBackend {
 public:
  DeviceBackend() = default;
  DeviceBackend(ProcessGroup& pg, std::unique_ptr<DeviceGroup> group) : pg_(&pg), group_(std::move(group)) {
    pg.set_device_backend(group_.get());
  }
  ~DeviceBackend() {
    if (pg_) pg_->set_device_backend(nullptr);
  }
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;
  DeviceGroup* get() const { return group_.get(); }

 private:
  ProcessGroup* pg_ = nullptr;
  std::unique_ptr<DeviceGroup> group_;
};

// Gloo over host copies of device buffers: the input comes down now, Gloo runs the collective, the result
// goes up when the Work is waited for (through Work::then). PyTorch's gloo backend does the same with CUDA
// tensors. A cuda rank's collectives without a device backend, and cuda-sim's device backend.
std::shared_ptr<Work> via_host_all_reduce_async(DeviceMemory& mem, ProcessGroup& pg, float* data, int64_t n, ReduceOp op, DType wire);
std::shared_ptr<Work> via_host_reduce_scatter_async(DeviceMemory& mem, ProcessGroup& pg, float* out, const float* in, int64_t n,
                                                    ReduceOp op, DType wire);
std::shared_ptr<Work> via_host_all_gather_async(DeviceMemory& mem, ProcessGroup& pg, float* out, const float* in, int64_t n, DType wire);

}  // namespace distlab
