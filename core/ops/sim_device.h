// `--device cuda-sim`: the cuda rank's code path with the CPU standing in for the GPU, so that CI, which
// has no GPU, runs everything a cuda rank runs outside the kernels. Its tensors are host memory behind
// poisoned addresses (2^52 above the real one: not a valid address on x86-64 or arm64), so host code that
// reads or writes a device tensor instead of going through a kernel, Tensor::to_host/from_host or OnHost
// crashes on the spot, as it would on a GPU. Its kernel table (core/ops/kernels.h) takes the poison off
// and runs the cpu kernels; a kernel handed a host pointer raises an error naming it (a GPU would read
// garbage or fault). The numbers are the cpu's, bit for bit.
// What it cannot check: the CUDA kernels themselves (tests/cuda/test_cuda_parity.cpp, on a GPU) and
// anything about streams and timing.
#pragma once
#include <cstdint>

#include "core/ops/kernels.h"
#include "core/tensor/memory.h"

namespace distlab {

struct Runtime;

class SimDeviceMemory : public DeviceMemory {
 public:
  void* alloc(int64_t bytes) override;
  void free(void* p, int64_t bytes) override;
  void zero(void* p, int64_t bytes) override;
  void fill(void* p, DType t, float value, int64_t n) override;
  void convert(const void* src, DType src_type, void* dst, DType dst_type, int64_t n) override;
  void to_host(void* host, const void* dev, int64_t bytes) override;
  void from_host(void* dev, const void* host, int64_t bytes) override;
  void upload(void* dev, const void* host, int64_t bytes) override;  // from_host without the wait
  int64_t free_bytes() override;
  // host memory as it is (a real address: host code reads it), standing in for page-locked memory
  void* pinned_alloc(int64_t bytes) override;
  void pinned_free(void* p, int64_t bytes) override;
  // the live blocks' bytes at their most (no cache here: what is freed goes back at once)
  int64_t held_peak() const override { return held_peak_; }
  void reset_held_peak() override { held_peak_ = held_; }

 private:
  int64_t held_ = 0, held_peak_ = 0;
};

// The simulated device's kernels: the cpu kernels on unpoisoned pointers.
const Kernels& sim_kernels();

// The host address behind a simulated device pointer (nullptr stays nullptr). Throws Error naming `what`
// when p is not a device pointer: host memory handed to a kernel.
const void* sim_host_address(const void* p, const char* what);

}  // namespace distlab
