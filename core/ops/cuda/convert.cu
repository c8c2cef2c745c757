// Dtype conversion and fill on the GPU: what Tensor::copy_from, clone and fill_ do for cuda tensors.
// Rounding to bf16/f16 is to nearest, ties to even (__float2bfloat16_rn, __float2half_rn): the bits of
// core/tensor/dtype.cpp's f32_to_bf16 / f32_to_f16 for every finite value.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

__device__ inline float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::u8: return float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.0f;
}
__device__ inline void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = uint8_t(fminf(fmaxf(rintf(v), 0.0f), 255.0f)); break;
  }
}

__global__ void convert_k(const void* src, DType st, void* dst, DType dt, int64_t n) {
  DL_GRID_LOOP(i, n) store(dst, dt, i, load(src, st, i));
}
__global__ void fill_k(void* dst, DType t, float v, int64_t n) {
  DL_GRID_LOOP(i, n) store(dst, t, i, v);
}

}  // namespace

void convert_on(cudaStream_t s, const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (n == 0) return;
  if (st == dt) {  // a plain copy, queued on the stream like the kernels around it
    DL_CUDA(cudaMemcpyAsync(dst, src, size_t(n * dtype_size(st)), cudaMemcpyDeviceToDevice, s));
    return;
  }
  convert_k<<<blocks_for(n), kThreads, 0, s>>>(src, st, dst, dt, n);
  DL_CUDA_LAUNCHED("convert");
}

void convert(Runtime& rt, const void* src, DType st, void* dst, DType dt, int64_t n) { convert_on(stream(rt), src, st, dst, dt, n); }

void fill_on(cudaStream_t s, void* dst, DType t, float value, int64_t n) {
  if (n == 0) return;
  fill_k<<<blocks_for(n), kThreads, 0, s>>>(dst, t, value, n);
  DL_CUDA_LAUNCHED("fill");
}

void fill(Runtime& rt, void* dst, DType t, float value, int64_t n) { fill_on(stream(rt), dst, t, value, n); }

}  // namespace distlab::cuda
