// What every .cu file of core/ops/cuda shares: the rank's context, launch sizes, and the block-wide sum
// and max used by the row reductions. Not a public header: include ops.h.
// No fmt here: nvcc's front end rejects fmt 9's compile-time format strings, so messages are concatenated.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/cuda/check.h"
#include "core/ops/cuda/ops.h"
#include "core/ops/op_scope.h"

namespace distlab::cuda {

inline CudaContext& ctx(Runtime& rt) {
  DL_ASSERT(rt.cuda != nullptr, "a cuda kernel was called on a Runtime without a CudaContext");
  return *rt.cuda;
}
inline cudaStream_t stream(Runtime& rt) { return ctx(rt).compute(); }

// The host waits for the rank's queued work: a value read back (a loss, a norm) is ready after it. Counted
// (DeviceMemory::host_waits): each one leaves the GPU idle until the host queues more.
inline void host_wait(Runtime& rt) {
  DL_CUDA(cudaStreamSynchronize(stream(rt)));
  if (DeviceMemory* d = rt.memory.device_memory()) d->count_host_wait();
}
// The math of an f32-operand GEMM: a 16-bit run (rt.dtype bf16/f16, autocast's low list) multiplies in its
// 16 bits with f32 sums, as the cpu emulates; an f32 run in the context's math (f32, or tf32 if asked).
inline GemmMath gemm_math(Runtime& rt) {
  if (rt.dtype == DType::bf16) return GemmMath::bf16;
  if (rt.dtype == DType::f16) return GemmMath::f16;
  return ctx(rt).math;
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b));
}

// A grid-stride loop: correct for any n and any grid size.
#define DL_GRID_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum (or max) of one value per thread over the whole block, returned to every thread. blockDim.x is a
// multiple of 32 and at most 1024. The order is fixed by the thread layout: repeatable bit for bit.
__device__ inline float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

// The GEMM of matmul.cu without a trace event, in the context's math (f32, tf32, or rounded to bf16/f16):
// for kernels that record their own event (conv2d, attention), as blas_sgemm is on the cpu.
void blas_f32(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same on `batch` products whose operands sit `stride_*` elements apart (cublasGemmStridedBatchedEx).
void blas_f32_batched(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                      int64_t stride_c, int64_t batch);

// out[o] += Σ_n x[n, o] for x (N, OC), deterministic: chunks of kChunkRows rows in order, then the
// chunks in order (matmul.cu); layernorm's dweight and dbias are chunked the same way (norm.cu).
constexpr int64_t kChunkRows = 256;
void add_column_sums(Runtime& rt, float* out, const float* x, int64_t N, int64_t OC, const char* name);
// the same on a 16-bit x and out (t: bf16, f16): x read as f32, out's old value plus the sum rounded once
void add_column_sums_16(Runtime& rt, void* out, const void* x, DType t, int64_t N, int64_t OC, const char* name);

// A 16-bit form's check of its type: bf16 or f16, else an error naming the kernel
inline void require_16bit(DType t, const char* name) {
  if (t != DType::bf16 && t != DType::f16)
    throw ShapeError(std::string(name) + " on " + dtype_name(t) + " tensors", "bf16 or f16: f32 takes the f32 kernel");
}

// A kernel's f32 workspace in device memory, counted by the rank's accountant under `other` as the cpu
// kernel's rt.empty() workspace is, and back to the cache when it goes out of scope.
struct Scratch {
  Runtime& rt;
  float* p = nullptr;
  int64_t bytes;
  Scratch(Runtime& r, int64_t n, const char* what) : rt(r), bytes(std::max<int64_t>(n, 1) * 4) {
    rt.memory.allocate(bytes, Category::other, what);
    p = static_cast<float*>(ctx(rt).allocator().alloc(bytes));
    if (!p) {
      rt.memory.release(bytes, Category::other);
      throw OutOfMemoryError(std::string("the GPU has no room for the ") + what + " (" + std::to_string(bytes) + " bytes)", "a smaller micro-batch");
    }
  }
  ~Scratch() {
    ctx(rt).allocator().free(p, bytes);
    rt.memory.release(bytes, Category::other);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// An f32 copy of n values of type st (nullptr: uninitialized) in the device's cache, uncounted as AsF32's
// scratch is: a 16-bit kernel's way where the fast path has no kernel for its operands as they are (cuBLAS's
// shapes, the tensor cores' head sizes): the f32 kernel between a widening and a rounding.
struct F32 {
  Runtime& rt;
  float* p = nullptr;
  int64_t bytes;
  F32(Runtime& r, const void* src, DType st, int64_t n) : rt(r), bytes(std::max<int64_t>(n, 1) * 4) {
    p = static_cast<float*>(ctx(rt).allocator().alloc(bytes));
    if (!p) throw OutOfMemoryError("no GPU memory for an f32 copy of a 16-bit operand (" + std::to_string(bytes) + " bytes)", "a smaller batch");
    if (src && n > 0) convert_on(stream(rt), src, st, p, DType::f32, n);
  }
  ~F32() { ctx(rt).allocator().free(p, bytes); }
  F32(const F32&) = delete;
  F32& operator=(const F32&) = delete;
};

}  // namespace distlab::cuda
