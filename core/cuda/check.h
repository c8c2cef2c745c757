// Every CUDA, cuBLAS and NCCL call goes through one of these checks: a failure becomes a CudaError that
// names the call, where it was made, and what the library said, with a hint. Nothing is retried and
// nothing is ignored: an asynchronous kernel error shows up at the next checked call on that stream.
// Read next: context.h (the rank's GPU, streams and cuBLAS handle).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/util/error.h"

namespace distlab {

struct CudaError : Error { using Error::Error; };

[[noreturn]] void cuda_fail(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t s);

}  // namespace distlab

#define DL_CUDA(call)                                                              \
  do {                                                                             \
    const cudaError_t dl_e_ = (call);                                              \
    if (dl_e_ != cudaSuccess) ::distlab::cuda_fail(dl_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define DL_CUBLAS(call)                                                                    \
  do {                                                                                     \
    const cublasStatus_t dl_s_ = (call);                                                   \
    if (dl_s_ != CUBLAS_STATUS_SUCCESS) ::distlab::cublas_fail(dl_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration (too many threads, too much shared memory) is reported here.
// `name` is the kernel's: "the launch of relu_forward" is what the error says was called.
#define DL_CUDA_LAUNCHED(name)                                                                           \
  do {                                                                                                   \
    const cudaError_t dl_e_ = cudaGetLastError();                                                        \
    if (dl_e_ != cudaSuccess) ::distlab::cuda_fail(dl_e_, ("the launch of " + std::string(name)).c_str(), __FILE__, __LINE__); \
  } while (0)
