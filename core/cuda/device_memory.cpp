#include "core/cuda/device_memory.h"

#include <algorithm>
#include <cstring>

#include "core/cuda/check.h"
#include "core/ops/cuda/ops.h"

namespace distlab {

void* CudaDeviceMemory::alloc(int64_t bytes) { return cx_.allocator().alloc(bytes); }

void CudaDeviceMemory::free(void* p, int64_t bytes) { cx_.allocator().free(p, bytes); }

void CudaDeviceMemory::zero(void* p, int64_t bytes) { DL_CUDA(cudaMemsetAsync(p, 0, size_t(bytes), cx_.compute())); }

void CudaDeviceMemory::fill(void* p, DType t, float value, int64_t n) { cuda::fill_on(cx_.compute(), p, t, value, n); }

void CudaDeviceMemory::convert(const void* src, DType st, void* dst, DType dt, int64_t n) {
  cuda::convert_on(cx_.compute(), src, st, dst, dt, n);
}

void CudaDeviceMemory::to_host(void* host, const void* dev, int64_t bytes) {
  DL_CUDA(cudaMemcpyAsync(host, dev, size_t(bytes), cudaMemcpyDeviceToHost, cx_.compute()));
  DL_CUDA(cudaStreamSynchronize(cx_.compute()));
  count_host_wait();
}

void CudaDeviceMemory::from_host(void* dev, const void* host, int64_t bytes) {
  DL_CUDA(cudaMemcpyAsync(dev, host, size_t(bytes), cudaMemcpyHostToDevice, cx_.compute()));
  DL_CUDA(cudaStreamSynchronize(cx_.compute()));  // the host buffer may be freed once this returns
  count_host_wait();
}

void CudaDeviceMemory::upload(void* dev, const void* host, int64_t bytes) {
  if (bytes <= 0) return;
  if (bytes > kStagedMax) return from_host(dev, host, bytes);
  Staging& s = staging_[next_];
  next_ = (next_ + 1) % staging_.size();
  if (s.queued) {  // its last copy must be done before the buffer is written again
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error: no later launch check may see it
      DL_CUDA(cudaEventSynchronize(s.done));
      count_host_wait();  // the ring is full: the GPU is that far behind
    } else if (q != cudaSuccess) {
      cuda_fail(q, "cudaEventQuery (upload's staging ring)", __FILE__, __LINE__);
    }
    s.queued = false;
  }
  if (s.bytes < bytes) {
    if (s.p) cx_.pinned().free(s.p, s.bytes);
    s.p = nullptr;  // before an alloc that may throw: the slot never names a block it gave back
    s.bytes = 0;
    const int64_t want = std::max<int64_t>(bytes, int64_t(64) << 10);
    s.p = cx_.pinned().alloc(want);
    if (s.p) s.bytes = want;
    if (!s.p) return from_host(dev, host, bytes);  // no page-locked memory to spare: the waiting copy
  }
  std::memcpy(s.p, host, size_t(bytes));
  DL_CUDA(cudaMemcpyAsync(dev, s.p, size_t(bytes), cudaMemcpyHostToDevice, cx_.compute()));
  if (!s.done) DL_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  DL_CUDA(cudaEventRecord(s.done, cx_.compute()));
  s.queued = true;
}

CudaDeviceMemory::~CudaDeviceMemory() {
  for (Staging& s : staging_) {
    if (s.done) {
      cudaEventSynchronize(s.done);  // no throwing from a destructor: a failed GPU is reported elsewhere
      cudaEventDestroy(s.done);
    }
    if (s.p) cx_.pinned().free(s.p, s.bytes);
  }
}

void* CudaDeviceMemory::pinned_alloc(int64_t bytes) { return cx_.pinned().alloc(bytes); }

void CudaDeviceMemory::pinned_free(void* p, int64_t bytes) { cx_.pinned().free(p, bytes); }

int64_t CudaDeviceMemory::free_bytes() {
  size_t free_b = 0, total_b = 0;
  DL_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return int64_t(free_b) + cx_.allocator().cached();  // cached blocks are ours to hand out
}

void attach_cuda(Runtime& rt, CudaContext& cx, CudaDeviceMemory& mem, int64_t capacity) {
  DL_ASSERT(rt.device == DeviceKind::cuda, "attach_cuda on a Runtime that is not a cuda rank");
  rt.cuda = &cx;
  rt.memory.set_device_memory(&mem);
  const int64_t free_now = mem.free_bytes() + rt.memory.stats().current_total;
  rt.memory.set_capacity(capacity < 0 ? free_now : std::min(capacity, free_now));
}

}  // namespace distlab
