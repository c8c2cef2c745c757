// The per-rank accounting allocator. Every byte of tensor storage a rank holds is tagged with a category,
// counted (current and peak, per category and in total) and checked against the simulated device's
// capacity. Going over raises OutOfMemoryError shaped like CUDA's message, with the breakdown. A meta
// device does the same accounting without allocating, so a 70B model can be "allocated" on a laptop.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor/allocator_model.h"
#include "core/tensor/dtype.h"

namespace distlab {

// host: what CPU offload keeps in the host's memory (ZeRO-Offload, FSDP's CPUOffload): counted, but not
// against the device's capacity, and not in the device's total. On a cuda rank it is page-locked
// (DeviceMemory::pinned_alloc).
enum class Category { params, grads, optim_state, activations, comm_buffers, other, host };
constexpr int kNumCategories = 7;
const char* category_name(Category c);  // "params", "grads", "optim_state", ...

struct MemoryStats {
  std::array<int64_t, kNumCategories> current{};
  std::array<int64_t, kNumCategories> peak{};  // each category's own high-water mark
  int64_t current_total = 0;                   // the device's: every category but host
  int64_t peak_total = 0;                      // high-water mark of the sum (not the sum of peaks)
  std::array<int64_t, kNumCategories> at_peak{};  // breakdown at the moment of peak_total
  // what PyTorch's caching allocator would reserve for the same allocations (CachingAllocatorModel)
  int64_t reserved_current = 0;
  int64_t reserved_peak = 0;
};

// A device with memory of its own, as the tensor layer sees it: core/cuda/device_memory.h implements it
// for a GPU. Virtual calls keep this layer free of GPU headers; a cpu or meta rank has none.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* alloc(int64_t bytes) = 0;  // nullptr when the device is full (the accountant then raises OOM)
  virtual void free(void* p, int64_t bytes) = 0;
  virtual void zero(void* p, int64_t bytes) = 0;
  virtual void fill(void* p, DType t, float value, int64_t n) = 0;
  virtual void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) = 0;  // on the device
  virtual void to_host(void* host, const void* dev, int64_t bytes) = 0;    // after the work queued before it
  virtual void from_host(void* dev, const void* host, int64_t bytes) = 0;  // the host buffer is free on return
  // The same copy queued in the compute stream's order, without waiting for the work queued before it: a
  // step's inputs (token ids, targets, images), as PyTorch's pin_memory + .to(device, non_blocking=True).
  // The host buffer is free on return here too (a GPU copies it into page-locked staging first).
  virtual void upload(void* dev, const void* host, int64_t bytes) { from_host(dev, host, bytes); }
  virtual int64_t free_bytes() = 0;  // what the device has free now (cudaMemGetInfo)
  // Page-locked host memory (cudaHostAlloc; PyTorch's pin_memory(), DeepSpeed's pin_memory: true): what CPU
  // offload keeps on the host of a cuda rank, so that its copies to and from the device run at the bus's
  // full speed, straight from and into place. nullptr when the host has none to give.
  virtual void* pinned_alloc(int64_t bytes) = 0;
  virtual void pinned_free(void* p, int64_t bytes) = 0;
  // Measured, not modeled: the most the device's own allocator has held since it was made (a GPU: the bytes
  // its caching allocator took with cudaMalloc, in use or cached, kernels' scratch included; not the CUDA
  // context, cuBLAS's workspace or NCCL's buffers). What MemoryStats::reserved_peak models.
  virtual int64_t held_peak() const = 0;
  virtual void reset_held_peak() = 0;  // the peak := what it holds now (MemoryAccountant::reset_peaks)
  // Times the host waited for the device's compute queue within a step: a copy to or from host memory, a
  // value read back (a loss, a norm). Each drains the queue, which then idles until the host queues more; a
  // step should have few (the trainer reports them per step as host_waits). The implementations count
  // theirs; a kernel that returns a value to the host calls count_host_wait(). Not counted: the wait that
  // ends a measured step (AttachedDevice::synchronize, for its time) and waits for a collective to finish.
  int64_t host_waits() const { return host_waits_; }
  void count_host_wait() { host_waits_++; }

 private:
  int64_t host_waits_ = 0;
};

class MemoryAccountant {
 public:
  // capacity < 0 means unlimited; device_name appears in the out-of-memory message ("cpu", "meta").
  explicit MemoryAccountant(int rank = 0, std::string device_name = "cpu", int64_t capacity = -1)
      : rank_(rank), device_(std::move(device_name)), capacity_(capacity) {}
  ~MemoryAccountant();
  MemoryAccountant(const MemoryAccountant&) = delete;
  MemoryAccountant& operator=(const MemoryAccountant&) = delete;

  // Counts `bytes` in `category`; throws OutOfMemoryError (nothing counted) if it would exceed capacity.
  // Returns the block's id in the caching allocator's model (-1 for host memory and empty tensors), which
  // release() takes back.
  int64_t allocate(int64_t bytes, Category category, const std::string& what);
  void release(int64_t bytes, Category category, int64_t model_block = -1);

  const MemoryStats& stats() const { return stats_; }
  int64_t current(Category c) const { return stats_.current[int(c)]; }
  int64_t peak(Category c) const { return stats_.peak[int(c)]; }
  int64_t capacity() const { return capacity_; }
  void set_capacity(int64_t bytes) { capacity_ = bytes; }
  void reset_peaks();  // peaks := current (e.g. at the start of a measured step), the device's measured one too
  int rank() const { return rank_; }
  const std::string& device_name() const { return device_; }
  std::string breakdown() const;  // "params 1.2 GiB, grads ..., ..." of current bytes

  // Host blocks for cpu tensors, cached by size like PyTorch's CUDA caching allocator: a training step
  // frees and re-allocates the same sizes every step, and handing them back to the OS each time costs a
  // page fault per 4 KiB on the next touch (it doubled the CNN's step time). Cached blocks are "reserved",
  // not "allocated": they don't count against the capacity.
  void* host_alloc(int64_t bytes);
  void host_free(void* p, int64_t bytes);
  int64_t host_reserved() const { return reserved_; }
  // Hands the cached blocks back to the OS (torch.cuda.empty_cache()): after a one-off large release, such
  // as ZeRO-3 freeing the whole model it was built as.
  void empty_cache();

  // The device's own memory, for tensors of a cuda rank (set where the Runtime gets its CudaContext).
  void set_device_memory(DeviceMemory* m) { device_memory_ = m; }
  DeviceMemory* device_memory() const { return device_memory_; }

 private:
  int rank_;
  std::string device_;
  int64_t capacity_;
  MemoryStats stats_;
  CachingAllocatorModel model_;  // the device categories' allocations, as PyTorch would reserve them
  std::map<int64_t, std::vector<void*>> free_blocks_;  // rounded size -> cached blocks
  int64_t reserved_ = 0;                               // bytes held: in use + cached
  DeviceMemory* device_memory_ = nullptr;
};

}  // namespace distlab
