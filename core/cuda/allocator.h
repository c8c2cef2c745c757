// A caching allocator for device memory, the idea of PyTorch's CUDACachingAllocator in its simplest form:
// a training step frees and allocates the same sizes every step, and cudaMalloc/cudaFree synchronize the
// device, so freed blocks are kept by rounded size and handed out again. Cached blocks are "reserved", not
// "allocated" (torch.cuda.memory_reserved vs memory_allocated); the rank's MemoryAccountant counts what
// tensors hold, per category, exactly as on cpu and meta.
// One stream: a block freed on the compute stream is reused by work queued after it on the same stream,
// so stream order makes the reuse safe. A block used by another stream must not be freed before that
// stream is done with it (what PyTorch's record_stream tracks): the NCCL process group keeps its buffers
// alive until its work completes.
// Kind::pinned is the same cache over page-locked host memory (cudaHostAlloc; PyTorch's
// CachingHostAllocator), what CPU offload keeps on the host: cudaHostAlloc is slow, and cudaFreeHost
// synchronizes the device, while a step makes and drops its offloaded gradient parts every step. The
// offload's copies to and from these blocks are synchronous, so a freed block is never still being read;
// CudaDeviceMemory::upload's staging buffers queue theirs, and wait for each copy's event before a buffer
// is written again or given back.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <vector>

namespace distlab {

class CudaAllocator {
 public:
  enum class Kind { device, pinned };
  explicit CudaAllocator(Kind kind = Kind::device) : kind_(kind) {}
  ~CudaAllocator();
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // Sizes round up to 512 B below 1 MiB and to 2 MiB above (PyTorch's rounding). nullptr when the device
  // is full even after the cache was emptied: the caller raises the out-of-memory error with its breakdown.
  void* alloc(int64_t bytes);
  void free(void* p, int64_t bytes);
  void empty_cache();  // torch.cuda.empty_cache(): cached blocks back to the driver
  int64_t reserved() const { return reserved_; }  // in use + cached
  int64_t reserved_peak() const { return reserved_peak_; }  // its high-water mark: torch.cuda.max_memory_reserved
  void reset_reserved_peak() { reserved_peak_ = reserved_; }  // torch.cuda.reset_peak_memory_stats
  int64_t cached() const { return cached_; }
  static int64_t rounded(int64_t bytes);

 private:
  cudaError_t raw_alloc(void** p, int64_t bytes) const;
  void raw_free(void* p) const;

  Kind kind_;
  std::map<int64_t, std::vector<void*>> free_blocks_;  // rounded size -> cached blocks
  int64_t reserved_ = 0, cached_ = 0, reserved_peak_ = 0;
};

}  // namespace distlab
