// 2-D convolution on the GPU as on the cpu (core/ops/cpu/conv.cpp): im2col, one GEMM over the whole batch,
// and a transpose that adds the bias. im2col is one thread per column element; col2im is one thread per
// input pixel gathering the columns that read it, so no two threads write the same value (no atomics).
#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

// ConvShape's OH()/OW() are host functions: the kernels spell them out
__device__ inline int64_t out_h(const ConvShape& s) { return (s.H + 2 * s.pad - s.K) / s.stride + 1; }
__device__ inline int64_t out_w(const ConvShape& s) { return (s.W + 2 * s.pad - s.K) / s.stride + 1; }

// col (C*K*K, B*OH*OW): row (c, kh, kw), column (b, oh, ow)
__global__ void im2col_k(float* col, const float* inp, ConvShape s) {
  const int64_t OH = out_h(s), OW = out_w(s), N = s.B * OH * OW;
  DL_GRID_LOOP(i, s.C * s.K * s.K * N) {
    const int64_t r = i / N, j = i % N;
    const int64_t c = r / (s.K * s.K), kh = (r / s.K) % s.K, kw = r % s.K;
    const int64_t b = j / (OH * OW), oh = (j / OW) % OH, ow = j % OW;
    const int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
    col[i] = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W ? inp[((b * s.C + c) * s.H + ih) * s.W + iw] : 0.0f;
  }
}

// dinp (B, C, H, W): each pixel sums the column entries that read it, kh then kw (the cpu's order)
__global__ void col2im_k(float* dinp, const float* col, ConvShape s) {
  const int64_t OH = out_h(s), OW = out_w(s), N = s.B * OH * OW;
  DL_GRID_LOOP(i, s.B * s.C * s.H * s.W) {
    const int64_t b = i / (s.C * s.H * s.W), c = (i / (s.H * s.W)) % s.C, ih = (i / s.W) % s.H, iw = i % s.W;
    float acc = 0.0f;
    for (int64_t kh = 0; kh < s.K; kh++) {
      const int64_t y = ih + s.pad - kh;  // = oh * stride
      if (y < 0 || y % s.stride != 0 || y / s.stride >= OH) continue;
      const int64_t oh = y / s.stride;
      for (int64_t kw = 0; kw < s.K; kw++) {
        const int64_t x = iw + s.pad - kw;
        if (x < 0 || x % s.stride != 0 || x / s.stride >= OW) continue;
        const int64_t ow = x / s.stride;
        acc += col[((c * s.K + kh) * s.K + kw) * N + (b * OH + oh) * OW + ow];
      }
    }
    dinp[i] = acc;
  }
}

// out (B, OC, OHW) = tmp (OC, B, OHW) + bias
__global__ void unfold_bias_k(float* out, const float* tmp, const float* bias, int64_t B, int64_t OC, int64_t OHW) {
  DL_GRID_LOOP(i, B * OC * OHW) {
    const int64_t b = i / (OC * OHW), o = (i / OHW) % OC, p = i % OHW;
    out[i] = tmp[(o * B + b) * OHW + p] + (bias ? bias[o] : 0.0f);
  }
}

// doutT (OC, B, OHW) from dout (B, OC, OHW)
__global__ void fold_k(float* doutT, const float* dout, int64_t B, int64_t OC, int64_t OHW) {
  DL_GRID_LOOP(i, B * OC * OHW) {
    const int64_t o = i / (B * OHW), b = (i / OHW) % B, p = i % OHW;
    doutT[i] = dout[(b * OC + o) * OHW + p];
  }
}

// dbias[o] += Σ doutT[o, :], in order
__global__ void row_sums_k(float* dbias, const float* doutT, int64_t OC, int64_t N) {
  DL_GRID_LOOP(o, OC) {
    float acc = 0.0f;
    for (int64_t j = 0; j < N; j++) acc += doutT[o * N + j];
    dbias[o] += acc;
  }
}

}  // namespace

void im2col(Runtime& rt, float* col, const float* inp, const ConvShape& s) {
  const int64_t n = s.CKK() * s.B * s.OH() * s.OW();
  im2col_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(col, inp, s);
  DL_CUDA_LAUNCHED("im2col");
}

void col2im(Runtime& rt, float* dinp, const float* col, const ConvShape& s) {
  col2im_k<<<blocks_for(s.B * s.C * s.H * s.W), kThreads, 0, stream(rt)>>>(dinp, col, s);
  DL_CUDA_LAUNCHED("col2im");
}

void conv2d_forward(Runtime& rt, float* out, float* col, const float* inp, const float* w, const float* bias, const ConvShape& s) {
  const int64_t OHW = s.OH() * s.OW(), N = s.B * OHW, CKK = s.CKK();
  OpScope op(rt, "conv2d_forward", 2.0 * s.OC * CKK * N, 4.0 * (s.B * s.C * s.H * s.W + s.OC * CKK + s.OC * N));
  Scratch tmp(rt, s.OC * N, "conv2d output workspace");
  im2col(rt, col, inp, s);
  // tmp (OC, B*OHW) = w (OC, CKK) @ col (CKK, B*OHW)
  blas_f32(rt, false, false, s.OC, N, CKK, 1.0f, w, CKK, col, N, 0.0f, tmp.p, N);
  unfold_bias_k<<<blocks_for(s.B * s.OC * OHW), kThreads, 0, stream(rt)>>>(out, tmp.p, bias, s.B, s.OC, OHW);
  DL_CUDA_LAUNCHED("conv2d_forward");
}

void conv2d_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* col, const float* w,
                     const ConvShape& s, bool need_dinp) {
  const int64_t OHW = s.OH() * s.OW(), N = s.B * OHW, CKK = s.CKK();
  OpScope op(rt, "conv2d_backward", 2.0 * s.OC * CKK * N * (need_dinp ? 2 : 1), 4.0 * (2 * CKK * N + 2 * s.OC * CKK + 2 * s.OC * N));
  Scratch doutT(rt, s.OC * N, "conv2d grad workspace");
  // doutT (OC, B*OHW) from dout (B, OC, OHW); the bias gradient is its row sums
  fold_k<<<blocks_for(s.OC * N), kThreads, 0, stream(rt)>>>(doutT.p, dout, s.B, s.OC, OHW);
  DL_CUDA_LAUNCHED("conv2d_backward fold");
  if (dbias) {
    row_sums_k<<<blocks_for(s.OC), kThreads, 0, stream(rt)>>>(dbias, doutT.p, s.OC, N);
    DL_CUDA_LAUNCHED("conv2d_backward bias");
  }
  // dw (OC, CKK) += doutT (OC, N) @ col^T (N, CKK)
  blas_f32(rt, false, true, s.OC, CKK, N, 1.0f, doutT.p, N, col, N, 1.0f, dw, CKK);
  if (need_dinp) {
    // dcol (CKK, N) = w^T (CKK, OC) @ doutT (OC, N), then gathered back into images
    Scratch dcol(rt, CKK * N, "conv2d column-gradient workspace");
    blas_f32(rt, true, false, CKK, N, s.OC, 1.0f, w, CKK, doutT.p, N, 0.0f, dcol.p, N);
    col2im(rt, dinp, dcol.p, s);
  }
}

}  // namespace distlab::cuda
