#include "core/cuda/allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/check.h"

namespace distlab {

CudaAllocator::~CudaAllocator() { empty_cache(); }

cudaError_t CudaAllocator::raw_alloc(void** p, int64_t bytes) const {
  return kind_ == Kind::device ? cudaMalloc(p, size_t(bytes)) : cudaHostAlloc(p, size_t(bytes), cudaHostAllocDefault);
}

void CudaAllocator::raw_free(void* p) const {
  if (kind_ == Kind::device) cudaFree(p);
  else cudaFreeHost(p);
}

int64_t CudaAllocator::rounded(int64_t bytes) {
  constexpr int64_t kSmall = 512, kLarge = int64_t(2) << 20;
  if (bytes <= 0) return kSmall;
  if (bytes < (int64_t(1) << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CudaAllocator::alloc(int64_t bytes) {
  const int64_t size = rounded(bytes);
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= size;
    return p;
  }
  // Only an out-of-memory answer means "full": empty the cache and retry, then nullptr (the accountant
  // raises OutOfMemoryError with its breakdown). Any other error (an earlier kernel's fault, sticky) is
  // that error, named, not a misleading "out of memory".
  void* p = nullptr;
  cudaError_t e = raw_alloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // the out-of-memory error is not sticky: clear it
    DL_CUDA(cudaDeviceSynchronize());  // a cached block may still be read by queued work
    empty_cache();
    e = raw_alloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
  }
  if (e != cudaSuccess) cuda_fail(e, kind_ == Kind::device ? "cudaMalloc" : "cudaHostAlloc", __FILE__, __LINE__);
  reserved_ += size;
  reserved_peak_ = std::max(reserved_peak_, reserved_);
  return p;
}

void CudaAllocator::free(void* p, int64_t bytes) {
  if (!p) return;
  const int64_t size = rounded(bytes);
  free_blocks_[size].push_back(p);
  cached_ += size;
}

void CudaAllocator::empty_cache() {
  if (cached_ == 0) return;
  cudaDeviceSynchronize();  // a cached block may still be read by queued work
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) raw_free(p);
    reserved_ -= size * int64_t(blocks.size());
    blocks.clear();
  }
  cached_ = 0;
}

}  // namespace distlab
