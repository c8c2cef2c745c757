// A cuda rank's tensors in GPU memory: the tensor layer's DeviceMemory (core/tensor/memory.h) over the
// rank's CudaContext. Allocation goes through the context's caching allocator; zero, fill and dtype
// conversion are queued on the compute stream like the kernels around them; copies to and from the host
// wait for what was queued before them (loss.item()'s synchronization, in PyTorch's terms).
// attach_cuda() is how a Runtime becomes a cuda rank.
#pragma once
#include "core/cuda/context.h"
#include "core/tensor/runtime.h"

namespace distlab {

class CudaDeviceMemory : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(CudaContext& cx) : cx_(cx) {}
  void* alloc(int64_t bytes) override;
  void free(void* p, int64_t bytes) override;
  void zero(void* p, int64_t bytes) override;
  void fill(void* p, DType t, float value, int64_t n) override;
  void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) override;
  void to_host(void* host, const void* dev, int64_t bytes) override;
  void from_host(void* dev, const void* host, int64_t bytes) override;
  int64_t free_bytes() override;
  void* pinned_alloc(int64_t bytes) override;
  void pinned_free(void* p, int64_t bytes) override;
  int64_t held_peak() const override { return cx_.allocator().reserved_peak(); }
  void reset_held_peak() override { cx_.allocator().reset_reserved_peak(); }

 private:
  CudaContext& cx_;
};

// Makes `rt` a rank on the GPU of `cx`: its kernels use cx (rt.cuda), its tensors live in `mem`, and its
// capacity is what the GPU has free now, or `capacity` when that is smaller (--device-mem; < 0: none).
void attach_cuda(Runtime& rt, CudaContext& cx, CudaDeviceMemory& mem, int64_t capacity = -1);

}  // namespace distlab
