// A cuda rank's tensors in GPU memory: the tensor layer's DeviceMemory (core/tensor/memory.h) over the
// rank's CudaContext. Allocation goes through the context's caching allocator; zero, fill and dtype
// conversion are queued on the compute stream like the kernels around them; copies to and from the host
// wait for what was queued before them (loss.item()'s synchronization, in PyTorch's terms), except
// upload(), which goes through a ring of page-locked staging buffers and does not wait.
// attach_cuda() is how a Runtime becomes a cuda rank.
#pragma once
#include <array>

#include "core/cuda/context.h"
#include "core/tensor/runtime.h"

namespace distlab {

class CudaDeviceMemory : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(CudaContext& cx) : cx_(cx) {}
  ~CudaDeviceMemory() override;
  CudaDeviceMemory(const CudaDeviceMemory&) = delete;
  CudaDeviceMemory& operator=(const CudaDeviceMemory&) = delete;
  void* alloc(int64_t bytes) override;
  void free(void* p, int64_t bytes) override;
  void zero(void* p, int64_t bytes) override;
  void fill(void* p, DType t, float value, int64_t n) override;
  void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) override;
  void to_host(void* host, const void* dev, int64_t bytes) override;
  void from_host(void* dev, const void* host, int64_t bytes) override;
  void upload(void* dev, const void* host, int64_t bytes) override;
  int64_t free_bytes() override;
  void* pinned_alloc(int64_t bytes) override;
  void pinned_free(void* p, int64_t bytes) override;
  int64_t held_peak() const override { return cx_.allocator().reserved_peak(); }
  void reset_held_peak() override { cx_.allocator().reset_reserved_peak(); }

 private:
  // upload()'s ring: the host's bytes are copied into the next buffer and queued from there; a buffer is
  // written again only once the copy queued from it has finished (its event: normally long since, k
  // uploads later). Uploads larger than kStagedMax take from_host's waiting copy instead, so the ring
  // stays small (a batch's token ids are ~64 KiB; images a few MiB).
  struct Staging {
    void* p = nullptr;
    int64_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool queued = false;
  };
  static constexpr int64_t kStagedMax = int64_t(16) << 20;
  CudaContext& cx_;
  std::array<Staging, 4> staging_{};
  size_t next_ = 0;
};

// Makes `rt` a rank on the GPU of `cx`: its kernels use cx (rt.cuda), its tensors live in `mem`, and its
// capacity is what the GPU has free now, or `capacity` when that is smaller (--device-mem; < 0: none).
void attach_cuda(Runtime& rt, CudaContext& cx, CudaDeviceMemory& mem, int64_t capacity = -1);

}  // namespace distlab
