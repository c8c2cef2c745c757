// A kernel's view of a tensor's values whatever their storage: wide(x) is the value as f32 (a bf16 or f16
// widens exactly), narrow<T>(v) an f32 result stored as T (rounded to nearest even). A 16-bit kernel is its
// f32 kernel's arithmetic between the two, so it rounds each result once. Not a public header: include ops.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/tensor/dtype.h"

namespace distlab::cuda {

__device__ __forceinline__ float wide(float v) { return v; }
__device__ __forceinline__ float wide(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float wide(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }

// p[i] as f32, and v stored at p[i]: a kernel's arithmetic on any storage type
template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i) { return wide(p[i]); }
template <class T>
__device__ __forceinline__ void st(T* p, int64_t i, float v) { p[i] = narrow<T>(v); }

// One switch from a 16-bit DType to its CUDA type: body(__nv_bfloat16{}) or body(__half{}); false for any
// other type (the caller names it in its error).
template <class F>
bool with_16bit_type(DType t, F&& body) {
  if (t == DType::bf16) body(__nv_bfloat16{});
  else if (t == DType::f16) body(__half{});
  else return false;
  return true;
}

}  // namespace distlab::cuda
