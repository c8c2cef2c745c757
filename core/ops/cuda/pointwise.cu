// Elementwise kernels on the GPU: one thread per element (a grid-stride loop), the formulas of
// core/ops/cpu/pointwise.cpp. Read that file first; only what differs is commented here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__global__ void relu_forward_k(float* out, const float* inp, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = inp[i] <= 0.0f ? 0.0f : inp[i];  // NaN stays NaN
}
__global__ void relu_backward_k(float* dinp, const float* dout, const float* out, int64_t n) {
  DL_GRID_LOOP(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}
__device__ __forceinline__ float gelu_of(float x) {
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
}
__device__ __forceinline__ float gelu_grad(float x, float dy) {
  const float cube = 0.044715f * x * x * x;
  const float t = tanhf(kGeluScale * (x + cube)), sech2 = 1.0f - t * t;
  const float local = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  return local * dy;
}
__global__ void gelu_forward_k(float* out, const float* inp, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = gelu_of(inp[i]);
}
__global__ void gelu_backward_k(float* dinp, const float* dout, const float* inp, int64_t n) {
  DL_GRID_LOOP(i, n) dinp[i] = gelu_grad(inp[i], dout[i]);
}
// The 16-bit forms: the same f32 formula between an exact widening and one round-to-nearest narrowing (dtype16.cuh)
template <class T>
__global__ void gelu_forward16_k(T* out, const T* inp, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = narrow<T>(gelu_of(wide(inp[i])));
}
template <class T>
__global__ void gelu_backward16_k(T* dinp, const T* dout, const T* inp, int64_t n) {
  DL_GRID_LOOP(i, n) dinp[i] = narrow<T>(gelu_grad(wide(inp[i]), wide(dout[i])));
}
template <class T>
__global__ void add16_k(T* out, const T* a, const T* b, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = narrow<T>(__fadd_rn(wide(a[i]), wide(b[i])));
}
template <class T>
__global__ void accumulate16_k(T* dst, const T* src, int64_t n) {
  DL_GRID_LOOP(i, n) dst[i] = narrow<T>(__fadd_rn(wide(dst[i]), wide(src[i])));
}
// splitmix64 of (seed, i): element i's random number depends on nothing else, so threads need no state
__device__ inline float uniform_at(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);  // 24 bits, in [0, 1)
}
__global__ void dropout_forward_k(float* out, float* mask, const float* inp, int64_t n, float p, float keep_scale, uint64_t seed) {
  DL_GRID_LOOP(i, n) {
    mask[i] = uniform_at(seed, uint64_t(i)) < p ? 0.0f : keep_scale;
    out[i] = inp[i] * mask[i];
  }
}
__global__ void mul_k(float* out, const float* a, const float* b, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = a[i] * b[i];
}
__global__ void add_k(float* out, const float* a, const float* b, int64_t n) {
  DL_GRID_LOOP(i, n) out[i] = a[i] + b[i];
}
__global__ void accumulate_k(float* dst, const float* src, int64_t n) {
  DL_GRID_LOOP(i, n) dst[i] += src[i];
}
// One thread per output pixel; ties go to the first, NaN wins (the cpu kernel's rules).
__global__ void maxpool_forward_k(float* out, int32_t* argmax, const float* inp, int64_t BC, int64_t H, int64_t W,
                                  int64_t OH, int64_t OW, int64_t K, int64_t stride) {
  DL_GRID_LOOP(o, BC * OH * OW) {
    const int64_t bc = o / (OH * OW), oh = (o / OW) % OH, ow = o % OW;
    const float* plane = inp + bc * H * W;
    int64_t best = (oh * stride) * W + ow * stride;
    float v = plane[best];
    for (int64_t kh = 0; kh < K; kh++)
      for (int64_t kw = 0; kw < K; kw++) {
        const int64_t idx = (oh * stride + kh) * W + ow * stride + kw;
        const float x = plane[idx];
        const bool better = (x > v) || (x != x);
        v = better ? x : v;
        best = better ? idx : best;
      }
    out[o] = v;
    argmax[o] = int32_t(best);
  }
}
// One thread per (batch, channel) plane running the cpu kernel's loop: every input pixel sums the windows
// that chose it in the same order as on the cpu, with no atomics. (The signature carries no window size,
// so a thread per input pixel could not tell which windows cover it.)
__global__ void maxpool_backward_k(float* dinp, const float* dout, const int32_t* argmax, int64_t BC, int64_t HW, int64_t OHW) {
  DL_GRID_LOOP(bc, BC) {
    float* plane = dinp + bc * HW;
    for (int64_t i = 0; i < HW; i++) plane[i] = 0.0f;
    for (int64_t i = 0; i < OHW; i++) plane[argmax[bc * OHW + i]] += dout[bc * OHW + i];
  }
}

}  // namespace

void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  OpScope op(rt, "relu_forward", double(n), 8.0 * n);
  relu_forward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, inp, n);
  DL_CUDA_LAUNCHED("relu_forward");
}

void relu_backward(Runtime& rt, float* dinp, const float* dout, const float* out, int64_t n) {
  OpScope op(rt, "relu_backward", double(n), 12.0 * n);
  relu_backward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(dinp, dout, out, n);
  DL_CUDA_LAUNCHED("relu_backward");
}

void gelu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  OpScope op(rt, "gelu_forward", 10.0 * n, 8.0 * n);
  gelu_forward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, inp, n);
  DL_CUDA_LAUNCHED("gelu_forward");
}

void gelu_backward(Runtime& rt, float* dinp, const float* dout, const float* inp, int64_t n) {
  OpScope op(rt, "gelu_backward", 20.0 * n, 12.0 * n);
  gelu_backward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(dinp, dout, inp, n);
  DL_CUDA_LAUNCHED("gelu_backward");
}

void gelu_forward_16(Runtime& rt, void* out, const void* inp, DType t, int64_t n) {
  require_16bit(t, "gelu_forward_16");
  OpScope op(rt, "gelu_forward", 10.0 * n, 8.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    gelu_forward16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
  });
  DL_CUDA_LAUNCHED("gelu_forward_16");
}

void gelu_backward_16(Runtime& rt, void* dinp, const void* dout, const void* inp, DType t, int64_t n) {
  require_16bit(t, "gelu_backward_16");
  OpScope op(rt, "gelu_backward", 20.0 * n, 12.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    gelu_backward16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), n);
  });
  DL_CUDA_LAUNCHED("gelu_backward_16");
}

void add_16(Runtime& rt, void* out, const void* a, const void* b, DType t, int64_t n) {
  require_16bit(t, "add_16");
  OpScope op(rt, "add", double(n), 12.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    add16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
  DL_CUDA_LAUNCHED("add_16");
}

void accumulate_16(Runtime& rt, void* dst, const void* src, DType t, int64_t n) {
  require_16bit(t, "accumulate_16");
  OpScope op(rt, "accumulate", double(n), 12.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    accumulate16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(dst), static_cast<const T*>(src), n);
  });
  DL_CUDA_LAUNCHED("accumulate_16");
}

void dropout_forward(Runtime& rt, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed) {
  OpScope op(rt, "dropout_forward", double(n), 12.0 * n);
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  dropout_forward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, mask, inp, n, p, keep_scale, seed);
  DL_CUDA_LAUNCHED("dropout_forward");
}

void dropout_backward(Runtime& rt, float* dinp, const float* dout, const float* mask, int64_t n) {
  OpScope op(rt, "dropout_backward", double(n), 12.0 * n);
  mul_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(dinp, dout, mask, n);
  DL_CUDA_LAUNCHED("dropout_backward");
}

void add_forward(Runtime& rt, float* out, const float* a, const float* b, int64_t n) {
  OpScope op(rt, "add", double(n), 12.0 * n);
  add_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, a, b, n);
  DL_CUDA_LAUNCHED("add");
}

void accumulate(Runtime& rt, float* dst, const float* src, int64_t n) {
  OpScope op(rt, "accumulate", double(n), 12.0 * n);
  accumulate_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(dst, src, n);
  DL_CUDA_LAUNCHED("accumulate");
}

void maxpool2d_forward(Runtime& rt, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t K, int64_t stride) {
  const int64_t OH = (H - K) / stride + 1, OW = (W - K) / stride + 1;
  OpScope op(rt, "maxpool2d_forward", double(B * C * OH * OW * K * K), 4.0 * (B * C * H * W + 2 * B * C * OH * OW));
  maxpool_forward_k<<<blocks_for(B * C * OH * OW), kThreads, 0, stream(rt)>>>(out, argmax, inp, B * C, H, W, OH, OW, K, stride);
  DL_CUDA_LAUNCHED("maxpool2d_forward");
}

void maxpool2d_backward(Runtime& rt, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                        int64_t H, int64_t W, int64_t OH, int64_t OW) {
  OpScope op(rt, "maxpool2d_backward", double(B * C * OH * OW), 4.0 * (B * C * H * W + 2 * B * C * OH * OW));
  maxpool_backward_k<<<blocks_for(B * C, 64), 64, 0, stream(rt)>>>(dinp, dout, argmax, B * C, H * W, OH * OW);
  DL_CUDA_LAUNCHED("maxpool2d_backward");
}

}  // namespace distlab::cuda
