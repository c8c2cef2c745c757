#include "core/cuda/context.h"

#include <fmt/format.h>

#include "core/cuda/check.h"

namespace distlab {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_?";
}

void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  std::string hint = "see the CUDA error above; CUDA_LAUNCH_BLOCKING=1 makes an asynchronous kernel error point at its launch";
  if (e == cudaErrorMemoryAllocation) hint = "the GPU is full: a smaller micro-batch, activation checkpointing, or ZeRO/FSDP";
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
    hint = "no usable GPU here: run with --device cpu, or check nvidia-smi and the driver";
  throw CudaError(fmt::format("{} failed: {} ({}, {}) at {}:{}", call, cudaGetErrorString(e), cudaGetErrorName(e), int(e), file, line), hint);
}

void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line) {
  throw CudaError(fmt::format("{} failed: {} at {}:{}", call, cublas_status_name(s), file, line),
                  s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH
                      ? "this GPU does not support the requested math (bf16 needs sm 80, tf32 sm 80): use precision f32"
                      : "check the shapes and leading dimensions passed to the GEMM");
}

const char* gemm_math_name(GemmMath m) {
  switch (m) {
    case GemmMath::f32: return "f32";
    case GemmMath::tf32: return "tf32";
    case GemmMath::bf16: return "bf16";
    case GemmMath::f16: return "f16";
  }
  return "?";
}

CudaProbe probe_cuda() {
  CudaProbe p;
  cudaRuntimeGetVersion(&p.runtime_version);
  cudaDriverGetVersion(&p.driver_version);  // 0 when there is no driver
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {  // the count is left untouched on error: the code, not the count, says so
    p.reason = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(e), int(e));
    (void)cudaGetLastError();
    return p;
  }
  if (count == 0) {
    p.reason = "the CUDA driver sees no GPU";
    return p;
  }
  for (int i = 0; i < count; i++) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.multiprocessors = prop.multiProcessorCount;
    d.total_bytes = int64_t(prop.totalGlobalMem);  // free memory needs a context on the device: asked by attach_cuda
    p.devices.push_back(d);
  }
  p.usable = !p.devices.empty();
  if (!p.usable) p.reason = "no GPU answered cudaGetDeviceProperties";
  return p;
}

CudaContext::CudaContext(int device) : device_(device) {
  DL_CUDA(cudaSetDevice(device));
  DL_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  DL_CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  DL_CUBLAS(cublasCreate(&blas_));
  DL_CUBLAS(cublasSetStream(blas_, compute_));
  // cuBLAS's own workspace from us, so that its use is bound to our stream
  DL_CUDA(cudaMalloc(&blas_workspace_, kBlasWorkspace));
  DL_CUBLAS(cublasSetWorkspace(blas_, blas_workspace_, kBlasWorkspace));
  // a GEMM with a 16-bit output adds split-K partial sums in f32, never in 16 bits (PyTorch allows the
  // latter by default): the output is rounded once from the f32 sums, as the cpu's forms round it
  DL_CUBLAS(cublasSetMathMode(blas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  DL_CUBLAS(cublasLtCreate(&blas_lt_));
}

CudaContext::~CudaContext() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(compute_);
  cudaStreamSynchronize(comm_);
  alloc_.empty_cache();
  pinned_.empty_cache();
  if (blas_) cublasDestroy(blas_);
  if (blas_lt_) cublasLtDestroy(blas_lt_);
  if (blas_workspace_) cudaFree(blas_workspace_);
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_) cudaStreamDestroy(comm_);
}

void CudaContext::sync() { DL_CUDA(cudaStreamSynchronize(compute_)); }

}  // namespace distlab
