// LayerNorm and BatchNorm2d on the GPU, the formulas of core/ops/cpu/norm.cpp. A row (LayerNorm) or a
// channel (BatchNorm) is one block of 256 threads reducing with block_sum; the per-column sums of the
// LayerNorm weight gradients are one thread per column over the rows in order. The cpu kernels sum in
// double, these in f32 pairwise (a tree): the parity test allows 1e-5 relative.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

template <class T>
__global__ void layernorm_forward_k(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t C,
                                    float eps) {
  const int64_t n = blockIdx.x;
  const T* x = inp + n * C;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += ld(x, i);
  const float m = block_sum(s) / float(C);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) v += (ld(x, i) - m) * (ld(x, i) - m);
  const float r = rsqrtf(block_sum(v) / float(C) + eps);
  T* o = out + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) st(o, i, ((ld(x, i) - m) * r) * ld(weight, i) + ld(bias, i));
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one block per row
template <class T>
__global__ void layernorm_backward_dx_k(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean, const float* rstd,
                                        int64_t C) {
  const int64_t n = blockIdx.x;
  const T* x = inp + n * C;
  const T* dy = dout + n * C;
  const float m = mean[n], s = rstd[n];
  float a = 0.0f, b = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float g = ld(weight, i) * ld(dy, i);
    a += g;
    b += g * ((ld(x, i) - m) * s);
  }
  const float gm = block_sum(a) / float(C), gxm = block_sum(b) / float(C);
  T* dx = dinp + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    const float xhat = (ld(x, i) - m) * s;
    st(dx, i, s * (ld(weight, i) * ld(dy, i) - gm - xhat * gxm));
  }
}

// dweight[i] += Σ_n xhat * dy, dbias[i] += Σ_n dy, chunked as add_column_sums (common.cuh): this kernel
// writes each chunk's sums, rows in order; add_column_sums then adds the chunks in order
template <class T>
__global__ void layernorm_backward_dw_partials_k(float* pdw, float* pdb, const T* dout, const T* inp, const float* mean,
                                                 const float* rstd, int64_t N, int64_t C) {
  for (int64_t chunk = blockIdx.y; chunk * kChunkRows < N; chunk += gridDim.y) {
    const int64_t end = (chunk + 1) * kChunkRows < N ? (chunk + 1) * kChunkRows : N;
    DL_GRID_LOOP(i, C) {
      float dw = 0.0f, db = 0.0f;
      for (int64_t n = chunk * kChunkRows; n < end; n++) {
        const float dy = ld(dout, n * C + i);
        db += dy;
        dw += (ld(inp, n * C + i) - mean[n]) * rstd[n] * dy;
      }
      pdw[chunk * C + i] = dw;
      pdb[chunk * C + i] = db;
    }
  }
}

// one block per channel: mean, then the biased variance around it (two passes, as the cpu kernel)
__global__ void batchnorm_stats_k(float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW) {
  const int64_t c = blockIdx.x, count = B * HW;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) s += inp[((j / HW) * C + c) * HW + j % HW];
  const float m = block_sum(s) / float(count);
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float d = inp[((j / HW) * C + c) * HW + j % HW] - m;
    ss += d * d;
  }
  const float v = block_sum(ss) / float(count);
  if (threadIdx.x == 0) {
    mean[c] = m;
    var[c] = v;
  }
}

__global__ void batchnorm_apply_k(float* out, const float* inp, const float* mean, const float* rstd, const float* weight,
                                  const float* bias, int64_t B, int64_t C, int64_t HW) {
  DL_GRID_LOOP(i, B * C * HW) {
    const int64_t c = (i / HW) % C;
    const float scale = rstd[c] * weight[c], shift = bias[c] - mean[c] * scale;
    out[i] = inp[i] * scale + shift;
  }
}

__global__ void batchnorm_backward_reduce_k(float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW) {
  const int64_t c = blockIdx.x, count = B * HW;
  float a = 0.0f, b = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t k = ((j / HW) * C + c) * HW + j % HW;
    a += dout[k];
    b += dout[k] * ((inp[k] - mean[c]) * rstd[c]);
  }
  a = block_sum(a);
  b = block_sum(b);
  if (threadIdx.x == 0) {
    sum_dy[c] = a;
    sum_dy_xhat[c] = b;
  }
}

__global__ void batchnorm_backward_apply_k(float* dinp, const float* dout, const float* inp, const float* mean, const float* rstd,
                                           const float* weight, const float* sum_dy, const float* sum_dy_xhat, double count,
                                           int64_t B, int64_t C, int64_t HW) {
  DL_GRID_LOOP(i, B * C * HW) {
    const int64_t c = (i / HW) % C;
    const float k = weight[c] * rstd[c];
    const float mdy = float(sum_dy[c] / count), mdyx = float(sum_dy_xhat[c] / count);
    const float xhat = (inp[i] - mean[c]) * rstd[c];
    dinp[i] = k * (dout[i] - mdy - xhat * mdyx);
  }
}

}  // namespace

void layernorm_forward(Runtime& rt, float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int64_t C, float eps) {
  OpScope op(rt, "layernorm_forward", 8.0 * N * C, 4.0 * (2 * N * C + 2 * C + 2 * N));
  if (N == 0) return;
  layernorm_forward_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(out, mean, rstd, inp, weight, bias, C, eps);
  DL_CUDA_LAUNCHED("layernorm_forward");
}

void layernorm_forward_16(Runtime& rt, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                          DType t, int64_t N, int64_t C, float eps) {
  require_16bit(t, "layernorm_forward_16");
  OpScope op(rt, "layernorm_forward", 8.0 * N * C, 4.0 * (2 * N * C + 2 * C + 2 * N));  // layernorm_forward's event
  if (N == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    layernorm_forward_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                                                                   static_cast<const T*>(weight), static_cast<const T*>(bias), C, eps);
  });
  DL_CUDA_LAUNCHED("layernorm_forward_16");
}

namespace {

// dx, then the chunks' partial sums of dweight and dbias (f32, in `partial`: 2 x chunks x C)
template <class T>
int64_t layernorm_backward_kernels(Runtime& rt, const Scratch& partial, T* dinp, const T* dout, const T* inp, const T* weight,
                                   const float* mean, const float* rstd, int64_t N, int64_t C) {
  layernorm_backward_dx_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(dinp, dout, inp, weight, mean, rstd, C);
  DL_CUDA_LAUNCHED("layernorm_backward dx");
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  const dim3 grid(blocks_for(C), unsigned(std::min<int64_t>(chunks, 65535)));
  layernorm_backward_dw_partials_k<<<grid, kThreads, 0, stream(rt)>>>(partial.p, partial.p + chunks * C, dout, inp, mean, rstd, N, C);
  DL_CUDA_LAUNCHED("layernorm_backward dw");
  return chunks;
}

}  // namespace

void layernorm_backward(Runtime& rt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  OpScope op(rt, "layernorm_backward", 12.0 * N * C, 4.0 * (3 * N * C + 4 * C + 2 * N));
  if (N == 0) return;
  Scratch partial(rt, 2 * ((N + kChunkRows - 1) / kChunkRows) * C, "layernorm backward's partial sums");
  const int64_t chunks = layernorm_backward_kernels(rt, partial, dinp, dout, inp, weight, mean, rstd, N, C);
  add_column_sums(rt, dweight, partial.p, chunks, C, "layernorm_backward dweight");
  add_column_sums(rt, dbias, partial.p + chunks * C, chunks, C, "layernorm_backward dbias");
}

// The 16-bit tensors read and written as they are (dx rounded once); dweight and dbias take the partial
// sums through f32 copies of their C values (the old value plus the sums, rounded once), where the f32 way
// copied dout, inp, weight and dinp (4 N x C passes more).
void layernorm_backward_16(Runtime& rt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                           const float* mean, const float* rstd, DType t, int64_t N, int64_t C) {
  require_16bit(t, "layernorm_backward_16");
  OpScope op(rt, "layernorm_backward", 12.0 * N * C, 4.0 * (3 * N * C + 4 * C + 2 * N));  // layernorm_backward's event
  if (N == 0) return;
  Scratch partial(rt, 2 * ((N + kChunkRows - 1) / kChunkRows) * C, "layernorm backward's partial sums");
  int64_t chunks = 0;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    chunks = layernorm_backward_kernels(rt, partial, static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
                                        static_cast<const T*>(weight), mean, rstd, N, C);
  });
  F32 dw(rt, dweight, t, C), db(rt, dbias, t, C);
  add_column_sums(rt, dw.p, partial.p, chunks, C, "layernorm_backward dweight");
  add_column_sums(rt, db.p, partial.p + chunks * C, chunks, C, "layernorm_backward dbias");
  convert_on(stream(rt), dw.p, DType::f32, dweight, t, C);
  convert_on(stream(rt), db.p, DType::f32, dbias, t, C);
}

void batchnorm_stats(Runtime& rt, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW) {
  OpScope op(rt, "batchnorm_stats", 3.0 * B * C * HW, 4.0 * B * C * HW);
  if (C == 0) return;
  batchnorm_stats_k<<<unsigned(C), kThreads, 0, stream(rt)>>>(mean, var, inp, B, C, HW);
  DL_CUDA_LAUNCHED("batchnorm_stats");
}

void batchnorm_apply(Runtime& rt, float* out, const float* inp, const float* mean, const float* rstd, const float* weight,
                     const float* bias, int64_t B, int64_t C, int64_t HW) {
  OpScope op(rt, "batchnorm_apply", 2.0 * B * C * HW, 8.0 * B * C * HW);
  batchnorm_apply_k<<<blocks_for(B * C * HW), kThreads, 0, stream(rt)>>>(out, inp, mean, rstd, weight, bias, B, C, HW);
  DL_CUDA_LAUNCHED("batchnorm_apply");
}

void batchnorm_backward_reduce(Runtime& rt, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW) {
  OpScope op(rt, "batchnorm_backward_reduce", 4.0 * B * C * HW, 8.0 * B * C * HW);
  if (C == 0) return;
  batchnorm_backward_reduce_k<<<unsigned(C), kThreads, 0, stream(rt)>>>(sum_dy, sum_dy_xhat, dout, inp, mean, rstd, B, C, HW);
  DL_CUDA_LAUNCHED("batchnorm_backward_reduce");
}

void batchnorm_backward_apply(Runtime& rt, float* dinp, const float* dout, const float* inp, const float* mean,
                              const float* rstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat,
                              double count, int64_t B, int64_t C, int64_t HW) {
  OpScope op(rt, "batchnorm_backward_apply", 6.0 * B * C * HW, 12.0 * B * C * HW);
  batchnorm_backward_apply_k<<<blocks_for(B * C * HW), kThreads, 0, stream(rt)>>>(dinp, dout, inp, mean, rstd, weight, sum_dy,
                                                                                   sum_dy_xhat, count, B, C, HW);
  DL_CUDA_LAUNCHED("batchnorm_backward_apply");
}

}  // namespace distlab::cuda
