#include "core/ops/cpu/norm.h"

#include <cmath>
#include <vector>

#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/tensor/dtype.h"

namespace distlab {

void layernorm_forward_16(Runtime& rt, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                          DType t, int64_t N, int64_t C, float eps) {
  if (rt.kernels) return rt.kernels->layernorm_forward_16(rt, out, mean, rstd, inp, weight, bias, t, N, C, eps);
  if (rt.is_meta()) return layernorm_forward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, C, eps);
  std::vector<float> x = widened(inp, t, N * C), w = widened(weight, t, C), b = widened(bias, t, C), y(x.size());
  layernorm_forward(rt, y.data(), mean, rstd, x.data(), w.data(), b.data(), N, C, eps);
  convert(y.data(), DType::f32, out, t, N * C);
}

void layernorm_backward_16(Runtime& rt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight, const float* mean,
                           const float* rstd, DType t, int64_t N, int64_t C) {
  if (rt.kernels) return rt.kernels->layernorm_backward_16(rt, dinp, dweight, dbias, dout, inp, weight, mean, rstd, t, N, C);
  if (rt.is_meta()) return layernorm_backward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, C);
  std::vector<float> dy = widened(dout, t, N * C), x = widened(inp, t, N * C), w = widened(weight, t, C);
  std::vector<float> dw = widened(dweight, t, C), db = widened(dbias, t, C), dx(x.size());
  layernorm_backward(rt, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean, rstd, N, C);
  convert(dx.data(), DType::f32, dinp, t, N * C);
  convert(dw.data(), DType::f32, dweight, t, C);
  convert(db.data(), DType::f32, dbias, t, C);
}

void layernorm_forward(Runtime& rt, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
  if (rt.kernels) return rt.kernels->layernorm_forward(rt, out, mean, rstd, inp, weight, bias, N, C, eps);
  OpScope op(rt, "layernorm_forward", 8.0 * N * C, 4.0 * (2 * N * C + 2 * C + 2 * N));
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    double m = 0;
    for (int64_t i = 0; i < C; i++) m += x[i];
    m /= double(C);
    double v = 0;
    for (int64_t i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= double(C);
    float s = float(1.0 / std::sqrt(v + eps));
    float* o = out + n * C;
    for (int64_t i = 0; i < C; i++) o[i] = (float(x[i] - m) * s) * weight[i] + bias[i];
    mean[n] = float(m);
    rstd[n] = s;
  }
}

void layernorm_backward(Runtime& rt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (rt.kernels) return rt.kernels->layernorm_backward(rt, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  OpScope op(rt, "layernorm_backward", 12.0 * N * C, 4.0 * (3 * N * C + 4 * C + 2 * N));
  if (rt.is_meta()) return;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dout * weight
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    float m = mean[n], s = rstd[n];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t i = 0; i < C; i++) {
      float xhat = (x[i] - m) * s;
      float g = weight[i] * dy[i];
      dnorm_mean += g;
      dnorm_norm_mean += double(g) * xhat;
    }
    dnorm_mean /= double(C);
    dnorm_norm_mean /= double(C);
    float* dx = dinp + n * C;
    for (int64_t i = 0; i < C; i++) {
      float xhat = (x[i] - m) * s;
      float g = weight[i] * dy[i];
      dbias[i] += dy[i];
      dweight[i] += xhat * dy[i];
      dx[i] = s * (g - float(dnorm_mean) - xhat * float(dnorm_norm_mean));
    }
  }
}

// The per-channel sums below run over B*H*W values (131,072 for the CIFAR CNN's first layer at batch 128).
// One running double sum waits for each add to finish (4 cycles); kLanes independent partial sums -- lane j
// takes the values at positions i = j (mod kLanes) of every plane -- keep the adder busy and vectorize, and
// the sums run at memory speed (the batch-norm CNN, batch 128, one thread: statistics and backward sums
// 10.6 ms a step; BatchNorm's cost over the plain CNN went from 22.7 to ~14 ms). The lanes are then added in
// one fixed order, so a sum is the same on every run and for any number of threads (threads split the
// channels, never a channel's sum).
static constexpr int kLanes = 8;
static double add_lanes(const double* acc) {
  double s = 0;
  for (int j = 0; j < kLanes; j++) s += acc[j];
  return s;
}

void batchnorm_stats(Runtime& rt, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW) {
  if (rt.kernels) return rt.kernels->batchnorm_stats(rt, mean, var, inp, B, C, HW);
  OpScope op(rt, "batchnorm_stats", 3.0 * B * C * HW, 4.0 * B * C * HW);
  if (rt.is_meta()) return;
  const int64_t body = HW / kLanes * kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double s[kLanes] = {}, ss[kLanes] = {};
    for (int64_t b = 0; b < B; b++) {
      const float* x = inp + (b * C + c) * HW;
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; j++) s[j] += x[i + j];
      for (int64_t i = body; i < HW; i++) s[i - body] += x[i];
    }
    const double m = add_lanes(s) / double(B * HW);
    for (int64_t b = 0; b < B; b++) {  // the second pass: the squared deviations from the mean (no cancellation)
      const float* x = inp + (b * C + c) * HW;
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; j++) ss[j] += (x[i + j] - m) * (x[i + j] - m);
      for (int64_t i = body; i < HW; i++) ss[i - body] += (x[i] - m) * (x[i] - m);
    }
    mean[c] = float(m);
    var[c] = float(add_lanes(ss) / double(B * HW));
  }
}

void batchnorm_apply(Runtime& rt, float* out, const float* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int64_t B, int64_t C, int64_t HW) {
  if (rt.kernels) return rt.kernels->batchnorm_apply(rt, out, inp, mean, rstd, weight, bias, B, C, HW);
  OpScope op(rt, "batchnorm_apply", 2.0 * B * C * HW, 8.0 * B * C * HW);
  if (rt.is_meta()) return;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t c = 0; c < C; c++) {
      const float scale = rstd[c] * weight[c], shift = bias[c] - mean[c] * scale;
      const float* x = inp + (b * C + c) * HW;
      float* o = out + (b * C + c) * HW;
      for (int64_t i = 0; i < HW; i++) o[i] = x[i] * scale + shift;
    }
  }
}

void batchnorm_backward_reduce(Runtime& rt, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW) {
  if (rt.kernels) return rt.kernels->batchnorm_backward_reduce(rt, sum_dy, sum_dy_xhat, dout, inp, mean, rstd, B, C, HW);
  OpScope op(rt, "batchnorm_backward_reduce", 4.0 * B * C * HW, 8.0 * B * C * HW);
  if (rt.is_meta()) return;
  const int64_t body = HW / kLanes * kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double a[kLanes] = {}, bsum[kLanes] = {};  // the lanes of batchnorm_stats
    const float m = mean[c], r = rstd[c];
    for (int64_t b = 0; b < B; b++) {
      const float* x = inp + (b * C + c) * HW;
      const float* dy = dout + (b * C + c) * HW;
      for (int64_t i = 0; i < body; i += kLanes)
        for (int j = 0; j < kLanes; j++) {
          a[j] += dy[i + j];
          bsum[j] += double(dy[i + j]) * ((x[i + j] - m) * r);
        }
      for (int64_t i = body; i < HW; i++) {
        a[i - body] += dy[i];
        bsum[i - body] += double(dy[i]) * ((x[i] - m) * r);
      }
    }
    sum_dy[c] = float(add_lanes(a));
    sum_dy_xhat[c] = float(add_lanes(bsum));
  }
}

void batchnorm_backward_apply(Runtime& rt, float* dinp, const float* dout, const float* inp, const float* mean,
                              const float* rstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat,
                              double count, int64_t B, int64_t C, int64_t HW) {
  if (rt.kernels) return rt.kernels->batchnorm_backward_apply(rt, dinp, dout, inp, mean, rstd, weight, sum_dy, sum_dy_xhat, count, B, C, HW);
  OpScope op(rt, "batchnorm_backward_apply", 6.0 * B * C * HW, 12.0 * B * C * HW);
  if (rt.is_meta()) return;
  // dx = weight * rstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count)
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t c = 0; c < C; c++) {
      const float k = weight[c] * rstd[c];
      const float mdy = float(sum_dy[c] / count), mdyx = float(sum_dy_xhat[c] / count);
      const float* x = inp + (b * C + c) * HW;
      const float* dy = dout + (b * C + c) * HW;
      float* dx = dinp + (b * C + c) * HW;
      for (int64_t i = 0; i < HW; i++) {
        float xhat = (x[i] - mean[c]) * rstd[c];
        dx[i] = k * (dy[i] - mdy - xhat * mdyx);
      }
    }
  }
}

}  // namespace distlab
