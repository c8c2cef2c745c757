// One rank's GPU: which device, the two streams (compute, and communication so that NCCL's collectives
// overlap backward as DDP's buckets need), the cuBLAS handle bound to the compute stream (and cuBLASLt's), the GEMM math
// mode, and the caching allocator that backs the rank's tensors. Passed explicitly (Runtime::cuda), never
// global: two contexts in one process are two ranks.
// probe_cuda() is what `distlab env` and --device cuda ask first: is there a usable GPU, and if not, why.
// Read next: allocator.h, then core/ops/cuda/ops.h (the kernels).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "core/cuda/allocator.h"

namespace distlab {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;       // "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t total_bytes = 0;  // not the free bytes: asking would create a context (hundreds of MiB) on every GPU
};

struct CudaProbe {
  bool usable = false;
  std::string reason;  // why not, when !usable: "cudaGetDeviceCount: insufficient driver (35)" ...
  int runtime_version = 0, driver_version = 0;
  std::vector<CudaDeviceInfo> devices;
};
// Never throws: a machine without a driver or a GPU is an answer, not an error.
CudaProbe probe_cuda();

// How a GEMM multiplies (PyTorch's torch.backends.cuda.matmul.allow_tf32 and autocast's dtypes):
//   f32   full fp32 (cuBLAS's pedantic-free default, CUBLAS_COMPUTE_32F)
//   tf32  fp32 in and out, products on 10-bit mantissas (Ampere and later), fp32 accumulation
//   bf16, f16  inputs rounded to 16 bits, fp32 accumulation (what autocast's matmuls do)
enum class GemmMath { f32, tf32, bf16, f16 };
const char* gemm_math_name(GemmMath m);

class CudaContext {
 public:
  // Selects `device`, creates the streams and the cuBLAS handle. Throws CudaError naming the device.
  explicit CudaContext(int device);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cublasHandle_t blas() const { return blas_; }
  // cuBLASLt (GEMMs with a fused epilogue), sharing cuBLAS's workspace: both run on the compute stream only
  cublasLtHandle_t blas_lt() const { return blas_lt_; }
  void* blas_workspace() const { return blas_workspace_; }
  static constexpr size_t kBlasWorkspace = size_t(32) << 20;  // 32 MiB covers Hopper's kernels
  GemmMath math = GemmMath::f32;
  CudaAllocator& allocator() { return alloc_; }
  CudaAllocator& pinned() { return pinned_; }  // page-locked host memory (CPU offload's), cached the same way
  // Waits for everything queued on the compute stream; errors from earlier kernels surface here.
  void sync();

 private:
  int device_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t blas_lt_ = nullptr;
  void* blas_workspace_ = nullptr;
  CudaAllocator alloc_;
  CudaAllocator pinned_{CudaAllocator::Kind::pinned};
};

}  // namespace distlab
