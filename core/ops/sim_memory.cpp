// cuda-sim's device memory (core/ops/sim_device.h): host blocks behind poisoned addresses, and the copies
// across, each counted as a GPU's would wait. Its kernels are in sim_device.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/ops/sim_device.h"
#include "core/tensor/dtype.h"
#include "core/util/error.h"

namespace distlab {

namespace {

constexpr uintptr_t kPoison = uintptr_t(1) << 52;

void* poison(void* host) { return host ? reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) + kPoison) : nullptr; }

}  // namespace

const void* sim_host_address(const void* p, const char* what) {
  if (!p) return nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a < kPoison)
    throw Error(fmt::format("{}: a host pointer reached a cuda-sim kernel (on a GPU it would read garbage or fault)", what),
                "a kernel's arguments must be the rank's tensors (AsF32, Indices), not host memory");
  return reinterpret_cast<const void*>(a - kPoison);
}

void* SimDeviceMemory::alloc(int64_t bytes) {
  // 64-byte aligned, as the cpu's tensors are (aligned_alloc wants a multiple of the alignment)
  const int64_t size = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size_t(size));
  if (!p) return nullptr;
  held_ += size;
  held_peak_ = std::max(held_peak_, held_);
  return poison(p);
}

void SimDeviceMemory::free(void* p, int64_t bytes) {
  if (!p) return;
  std::free(const_cast<void*>(sim_host_address(p, "free")));
  held_ -= (bytes + 63) / 64 * 64;
}

void SimDeviceMemory::zero(void* p, int64_t bytes) { std::memset(const_cast<void*>(sim_host_address(p, "zero")), 0, size_t(bytes)); }

void SimDeviceMemory::fill(void* p, DType t, float value, int64_t n) {
  void* h = const_cast<void*>(sim_host_address(p, "fill"));
  if (t == DType::f32) {
    for (int64_t i = 0; i < n; i++) static_cast<float*>(h)[i] = value;
    return;
  }
  const uint16_t bits = t == DType::bf16 ? f32_to_bf16(value) : f32_to_f16(value);
  for (int64_t i = 0; i < n; i++) static_cast<uint16_t*>(h)[i] = bits;
}

void SimDeviceMemory::convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) {
  distlab::convert(sim_host_address(src, "convert"), src_type, const_cast<void*>(sim_host_address(dst, "convert")), dst_type, n);
}

void SimDeviceMemory::to_host(void* host, const void* dev, int64_t bytes) {
  std::memcpy(host, sim_host_address(dev, "to_host"), size_t(bytes));
  count_host_wait();  // as a GPU's copy waits for the work queued before it
}

void SimDeviceMemory::from_host(void* dev, const void* host, int64_t bytes) {
  std::memcpy(const_cast<void*>(sim_host_address(dev, "from_host")), host, size_t(bytes));
  count_host_wait();
}

void SimDeviceMemory::upload(void* dev, const void* host, int64_t bytes) {
  std::memcpy(const_cast<void*>(sim_host_address(dev, "upload")), host, size_t(bytes));  // a GPU's queued copy: no wait
}

void* SimDeviceMemory::pinned_alloc(int64_t bytes) { return std::aligned_alloc(64, size_t((bytes + 63) / 64 * 64)); }

void SimDeviceMemory::pinned_free(void* p, int64_t) { std::free(p); }

// a simulated 80 GiB card: the capacity is then what --device-mem says, as on a GPU
int64_t SimDeviceMemory::free_bytes() { return int64_t(80) << 30; }

}  // namespace distlab
