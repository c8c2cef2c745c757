#include "core/ops/cpu/pointwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/ops/cpu/tanh.h"
#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/tensor/dtype.h"
#include "core/util/rng.h"

namespace distlab {

void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  if (rt.kernels) return rt.kernels->relu_forward(rt, out, inp, n);
  OpScope op(rt, "relu_forward", double(n), 8.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] <= 0.0f ? 0.0f : inp[i];  // NaN stays NaN, as in PyTorch
}

void relu_backward(Runtime& rt, float* dinp, const float* dout, const float* out, int64_t n) {
  if (rt.kernels) return rt.kernels->relu_backward(rt, dinp, dout, out, n);
  OpScope op(rt, "relu_backward", double(n), 12.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  // both loads unconditional, so the loop vectorizes (a conditional load of dout[i] became a branch
  // that mispredicts half the time: 10x slower)
  for (int64_t i = 0; i < n; i++) {
    const float d = dout[i];
    dinp[i] = out[i] > 0.0f ? d : 0.0f;
  }
}

static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

void gelu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  if (rt.kernels) return rt.kernels->gelu_forward(rt, out, inp, n);
  OpScope op(rt, "gelu_forward", 10.0 * n, 8.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + fast_tanhf(kGeluScale * (x + cube)));  // std::tanh's to 1.34 ulp (cpu/tanh.h)
  }
}

void gelu_forward_16(Runtime& rt, void* out, const void* inp, DType t, int64_t n) {
  if (rt.kernels) return rt.kernels->gelu_forward_16(rt, out, inp, t, n);
  if (rt.is_meta()) return gelu_forward(rt, nullptr, nullptr, n);  // its event
  std::vector<float> x = widened(inp, t, n), y(x.size());
  gelu_forward(rt, y.data(), x.data(), n);
  convert(y.data(), DType::f32, out, t, n);
}

void gelu_backward_16(Runtime& rt, void* dinp, const void* dout, const void* inp, DType t, int64_t n) {
  if (rt.kernels) return rt.kernels->gelu_backward_16(rt, dinp, dout, inp, t, n);
  if (rt.is_meta()) return gelu_backward(rt, nullptr, nullptr, nullptr, n);
  std::vector<float> dy = widened(dout, t, n), x = widened(inp, t, n), dx(x.size());
  gelu_backward(rt, dx.data(), dy.data(), x.data(), n);
  convert(dx.data(), DType::f32, dinp, t, n);
}

void add_16(Runtime& rt, void* out, const void* a, const void* b, DType t, int64_t n) {
  if (rt.kernels) return rt.kernels->add_16(rt, out, a, b, t, n);
  if (rt.is_meta()) return add_forward(rt, nullptr, nullptr, nullptr, n);
  std::vector<float> x = widened(a, t, n), y = widened(b, t, n), z(x.size());
  add_forward(rt, z.data(), x.data(), y.data(), n);
  convert(z.data(), DType::f32, out, t, n);
}

void accumulate_16(Runtime& rt, void* dst, const void* src, DType t, int64_t n) {
  if (rt.kernels) return rt.kernels->accumulate_16(rt, dst, src, t, n);
  if (rt.is_meta()) return accumulate(rt, nullptr, nullptr, n);
  std::vector<float> d = widened(dst, t, n), s = widened(src, t, n);
  accumulate(rt, d.data(), s.data(), n);
  convert(d.data(), DType::f32, dst, t, n);
}

void gelu_backward(Runtime& rt, float* dinp, const float* dout, const float* inp, int64_t n) {
  if (rt.kernels) return rt.kernels->gelu_backward(rt, dinp, dout, inp, n);
  OpScope op(rt, "gelu_backward", 20.0 * n, 12.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float t = fast_tanhf(kGeluScale * (x + cube));
    float sech2 = 1.0f - t * t;
    float local = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

void dropout_forward(Runtime& rt, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed) {
  if (rt.kernels) return rt.kernels->dropout_forward(rt, out, mask, inp, n, p, seed);
  OpScope op(rt, "dropout_forward", double(n), 12.0 * n);
  if (rt.is_meta()) return;
  Rng rng(seed);
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for (int64_t i = 0; i < n; i++) {
    mask[i] = rng.uniform() < p ? 0.0f : keep_scale;
    out[i] = inp[i] * mask[i];
  }
}

void dropout_backward(Runtime& rt, float* dinp, const float* dout, const float* mask, int64_t n) {
  if (rt.kernels) return rt.kernels->dropout_backward(rt, dinp, dout, mask, n);
  OpScope op(rt, "dropout_backward", double(n), 12.0 * n);
  if (rt.is_meta()) return;
  for (int64_t i = 0; i < n; i++) dinp[i] = dout[i] * mask[i];
}

void add_forward(Runtime& rt, float* out, const float* a, const float* b, int64_t n) {
  if (rt.kernels) return rt.kernels->add_forward(rt, out, a, b, n);
  OpScope op(rt, "add", double(n), 12.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void accumulate(Runtime& rt, float* dst, const float* src, int64_t n) {
  if (rt.kernels) return rt.kernels->accumulate(rt, dst, src, n);
  OpScope op(rt, "accumulate", double(n), 12.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

void maxpool2d_forward(Runtime& rt, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t K, int64_t stride) {
  if (rt.kernels) return rt.kernels->maxpool2d_forward(rt, out, argmax, inp, B, C, H, W, K, stride);
  const int64_t OH = (H - K) / stride + 1, OW = (W - K) / stride + 1;
  OpScope op(rt, "maxpool2d_forward", double(B * C * OH * OW * K * K), 4.0 * (B * C * H * W + 2 * B * C * OH * OW));
  if (rt.is_meta()) return;
  if (K == 2 && stride == 2) {  // the common case, without the inner loops
#pragma omp parallel for schedule(static)
    for (int64_t bc = 0; bc < B * C; bc++) {
      const float* plane = inp + bc * H * W;
      for (int64_t oh = 0; oh < OH; oh++) {
        const float* r0 = plane + 2 * oh * W;
        const float* r1 = r0 + W;
        float* o = out + (bc * OH + oh) * OW;
        int32_t* a = argmax + (bc * OH + oh) * OW;
        for (int64_t ow = 0; ow < OW; ow++) {
          const int32_t i0 = int32_t(2 * oh * W + 2 * ow);
          float v = r0[2 * ow];
          int32_t best = i0;
          const float x1 = r0[2 * ow + 1], x2 = r1[2 * ow], x3 = r1[2 * ow + 1];
          bool b1 = (x1 > v) | (x1 != x1);
          v = b1 ? x1 : v;
          best = b1 ? i0 + 1 : best;
          bool b2 = (x2 > v) | (x2 != x2);
          v = b2 ? x2 : v;
          best = b2 ? i0 + int32_t(W) : best;
          bool b3 = (x3 > v) | (x3 != x3);
          v = b3 ? x3 : v;
          best = b3 ? i0 + int32_t(W) + 1 : best;
          o[ow] = v;
          a[ow] = best;
        }
      }
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t bc = 0; bc < B * C; bc++) {
    const float* plane = inp + bc * H * W;
    for (int64_t oh = 0; oh < OH; oh++) {
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t best = (oh * stride) * W + ow * stride;
        float v = plane[best];
        for (int64_t kh = 0; kh < K; kh++) {
          for (int64_t kw = 0; kw < K; kw++) {
            const int64_t idx = (oh * stride + kh) * W + ow * stride + kw;
            const float x = plane[idx];
            const bool better = (x > v) | (x != x);  // NaN propagates, as in PyTorch; selects, not branches
            v = better ? x : v;
            best = better ? idx : best;
          }
        }
        out[(bc * OH + oh) * OW + ow] = v;
        argmax[(bc * OH + oh) * OW + ow] = int32_t(best);
      }
    }
  }
}

void maxpool2d_backward(Runtime& rt, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                        int64_t H, int64_t W, int64_t OH, int64_t OW) {
  if (rt.kernels) return rt.kernels->maxpool2d_backward(rt, dinp, dout, argmax, B, C, H, W, OH, OW);
  OpScope op(rt, "maxpool2d_backward", double(B * C * OH * OW), 4.0 * (B * C * H * W + 2 * B * C * OH * OW));
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static)
  for (int64_t bc = 0; bc < B * C; bc++) {
    float* plane = dinp + bc * H * W;
    std::memset(plane, 0, sizeof(float) * size_t(H * W));
    for (int64_t i = 0; i < OH * OW; i++) plane[argmax[bc * OH * OW + i]] += dout[bc * OH * OW + i];
  }
}

}  // namespace distlab
