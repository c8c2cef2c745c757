#include "core/ops/cpu/conv.h"

#include <algorithm>
#include <cstring>

#include "core/ops/cpu/matmul.h"
#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"

namespace distlab {

// Division rounding toward -inf / +inf (C++'s / rounds toward zero, wrong for negative numerators).
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Images [b0, b0 + nb) into col (C*K*K, nb*OH*OW): column j = (b - b0, oh, ow).
static void im2col_images(float* col, const float* inp, const ConvShape& s, int64_t b0, int64_t nb) {
  const int64_t OH = s.OH(), OW = s.OW(), N = nb * OH * OW;
#pragma omp parallel for collapse(2) schedule(static) if (s.C * s.K * s.K * N > 32768)
  for (int64_t c = 0; c < s.C; c++) {
    for (int64_t kk = 0; kk < s.K * s.K; kk++) {
      const int64_t kh = kk / s.K, kw = kk % s.K;
      // output columns ow in [lo, hi) read inside the image: iw = ow*stride - pad + kw in [0, W)
      const int64_t lo = std::min(OW, std::max<int64_t>(0, ceil_div(s.pad - kw, s.stride)));
      const int64_t hi = std::max(lo, std::min(OW, floor_div(s.W - 1 + s.pad - kw, s.stride) + 1));
      float* row = col + (c * s.K * s.K + kk) * N;
      for (int64_t b = 0; b < nb; b++) {
        const float* img = inp + ((b0 + b) * s.C + c) * s.H * s.W;
        for (int64_t oh = 0; oh < OH; oh++) {
          const int64_t ih = oh * s.stride - s.pad + kh;
          float* d = row + (b * OH + oh) * OW;
          if (ih < 0 || ih >= s.H) {
            std::memset(d, 0, sizeof(float) * size_t(OW));
            continue;
          }
          const float* src = img + ih * s.W - s.pad + kw;  // src[ow * stride] is the input pixel
          for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.0f;
          if (s.stride == 1) std::memcpy(d + lo, src + lo, sizeof(float) * size_t(hi - lo));
          else
            for (int64_t ow = lo; ow < hi; ow++) d[ow] = src[ow * s.stride];
          for (int64_t ow = hi; ow < OW; ow++) d[ow] = 0.0f;
        }
      }
    }
  }
}

void im2col(float* col, const float* inp, const ConvShape& s) { im2col_images(col, inp, s, 0, s.B); }

// The adjoint of im2col_images: images [b0, b0 + nb) of dinp (overwritten) from col (C*K*K, nb*OH*OW).
static void col2im_images(float* dinp, const float* col, const ConvShape& s, int64_t b0, int64_t nb) {
  const int64_t OH = s.OH(), OW = s.OW(), N = nb * OH * OW;
  std::memset(dinp + b0 * s.C * s.H * s.W, 0, sizeof(float) * size_t(nb * s.C * s.H * s.W));
  // each (b, c) image plane is written by one thread only: parallel over planes
#pragma omp parallel for collapse(2) schedule(static) if (nb * s.C * s.H * s.W > 32768)
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t c = 0; c < s.C; c++) {
      float* img = dinp + ((b0 + b) * s.C + c) * s.H * s.W;
      for (int64_t kk = 0; kk < s.K * s.K; kk++) {
        const int64_t kh = kk / s.K, kw = kk % s.K;
        const int64_t lo = std::min(OW, std::max<int64_t>(0, ceil_div(s.pad - kw, s.stride)));
        const int64_t hi = std::max(lo, std::min(OW, floor_div(s.W - 1 + s.pad - kw, s.stride) + 1));
        const float* src = col + (c * s.K * s.K + kk) * N + b * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
          const int64_t ih = oh * s.stride - s.pad + kh;
          if (ih < 0 || ih >= s.H) continue;
          float* d = img + ih * s.W - s.pad + kw;
          const float* sr = src + oh * OW;
          if (s.stride == 1)  // contiguous: the compiler vectorizes it
            for (int64_t ow = lo; ow < hi; ow++) d[ow] += sr[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) d[ow * s.stride] += sr[ow];
        }
      }
    }
  }
}

void col2im(float* dinp, const float* col, const ConvShape& s) { col2im_images(dinp, col, s, 0, s.B); }

void conv2d_forward(Runtime& rt, float* out, float* col, const float* inp, const float* w, const float* bias,
                    const ConvShape& s) {
  if (rt.kernels) return rt.kernels->conv2d_forward(rt, out, col, inp, w, bias, s);
  const int64_t OHW = s.OH() * s.OW(), N = s.B * OHW, CKK = s.CKK();
  OpScope op(rt, "conv2d_forward", 2.0 * s.OC * CKK * N,
             4.0 * (s.B * s.C * s.H * s.W + s.OC * CKK + s.OC * N));
  if (rt.is_meta()) return;
  const int64_t block = std::min(s.B, kConvImageBlock);
  for (int64_t b0 = 0; b0 < s.B; b0 += block) {
    const int64_t nb = std::min(block, s.B - b0), Nb = nb * OHW;
    float* cb = col + b0 * CKK * OHW;  // this block's columns: (CKK, nb*OHW)
    im2col_images(cb, inp, s, b0, nb);
    // Image by image, straight into PyTorch's layout: out_b (OC, OHW) = w (OC, CKK) @ cb[:, b*OHW, +OHW]
    // (a slice of the block's columns, row stride Nb), started from the broadcast bias. Each output value
    // is one product computed by one thread, whatever the number of threads.
#pragma omp parallel for schedule(static) if (nb > 1)
    for (int64_t b = 0; b < nb; b++) {
      float* ob = out + (b0 + b) * s.OC * OHW;
      if (bias)
        for (int64_t o = 0; o < s.OC; o++) std::fill(ob + o * OHW, ob + (o + 1) * OHW, bias[o]);
      blas_sgemm(false, false, s.OC, OHW, CKK, 1.0f, w, CKK, cb + b * OHW, Nb, bias ? 1.0f : 0.0f, ob, OHW);
    }
  }
}

// Per channel, the sum of dout over the batch: kLanes running sums (lane j takes positions i = j mod kLanes
// of every plane) where one sum would wait for each add; the lanes added in one fixed order.
static void bias_grad(float* dbias, const float* dout, int64_t B, int64_t OC, int64_t OHW) {
  constexpr int kLanes = 8;
  const int64_t body = OHW / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (OC * B * OHW > 32768)
  for (int64_t o = 0; o < OC; o++) {
    double acc[kLanes] = {};
    for (int64_t b = 0; b < B; b++) {
      const float* src = dout + (b * OC + o) * OHW;
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; j++) acc[j] += src[i + j];
      for (int64_t i = body; i < OHW; i++) acc[i - body] += src[i];
    }
    double sum = 0;
    for (int j = 0; j < kLanes; j++) sum += acc[j];
    dbias[o] += float(sum);
  }
}

void conv2d_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* col,
                     const float* w, const ConvShape& s, bool need_dinp) {
  if (rt.kernels) return rt.kernels->conv2d_backward(rt, dinp, dw, dbias, dout, col, w, s, need_dinp);
  const int64_t OHW = s.OH() * s.OW(), N = s.B * OHW, CKK = s.CKK();
  OpScope op(rt, "conv2d_backward", 2.0 * s.OC * CKK * N * (need_dinp ? 2 : 1),
             4.0 * (2 * CKK * N + 2 * s.OC * CKK + 2 * s.OC * N));
  const int64_t block = std::min(s.B, kConvImageBlock);
  Tensor dcol = need_dinp ? rt.empty({CKK, block * OHW}, Category::other, "conv2d column-gradient workspace (a block of images)") : Tensor();
  if (rt.is_meta()) return;
  if (dbias) bias_grad(dbias, dout, s.B, s.OC, OHW);
  for (int64_t b0 = 0; b0 < s.B; b0 += block) {
    const int64_t nb = std::min(block, s.B - b0), Nb = nb * OHW;
    const float* cb = col + b0 * CKK * OHW;
    // dw (OC, CKK) += dout_b (OC, OHW) @ cb[:, b*OHW, +OHW]^T, image after image in batch order (blas_sgemm
    // splits each product's rows over the threads, never the sum over images)
    for (int64_t b = 0; b < nb; b++)
      blas_sgemm(false, true, s.OC, CKK, OHW, 1.0f, dout + (b0 + b) * s.OC * OHW, OHW, cb + b * OHW, Nb, 1.0f, dw, CKK);
    if (need_dinp) {
      // dcol[:, b*OHW, +OHW] (CKK, OHW) = w^T (CKK, OC) @ dout_b (OC, OHW), then folded back into the images
      float* dc = dcol.f32();
#pragma omp parallel for schedule(static) if (nb > 1)
      for (int64_t b = 0; b < nb; b++)
        blas_sgemm(true, false, CKK, OHW, s.OC, 1.0f, w, CKK, dout + (b0 + b) * s.OC * OHW, OHW, 0.0f, dc + b * OHW, Nb);
      col2im_images(dinp, dc, s, b0, nb);
    }
  }
}

void conv2d_forward_naive(float* out, const float* inp, const float* w, const float* bias, const ConvShape& s) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t o = 0; o < s.OC; o++)
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double acc = bias ? bias[o] : 0.0;
          for (int64_t c = 0; c < s.C; c++)
            for (int64_t kh = 0; kh < s.K; kh++)
              for (int64_t kw = 0; kw < s.K; kw++) {
                int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += double(inp[((b * s.C + c) * s.H + ih) * s.W + iw]) * w[((o * s.C + c) * s.K + kh) * s.K + kw];
              }
          out[((b * s.OC + o) * OH + oh) * OW + ow] = float(acc);
        }
}

}  // namespace distlab
