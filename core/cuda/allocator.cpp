#include "core/cuda/allocator.h"

#include <cuda_runtime.h>

namespace distlab {

CudaAllocator::~CudaAllocator() { empty_cache(); }

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
  void* p = nullptr;
  if (cudaMalloc(&p, size_t(size)) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free out-of-memory error, then retry with the cache emptied
    empty_cache();
    if (cudaMalloc(&p, size_t(size)) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
  }
  reserved_ += size;
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
    for (void* p : blocks) cudaFree(p);
    reserved_ -= size * int64_t(blocks.size());
    blocks.clear();
  }
  cached_ = 0;
}

}  // namespace distlab
