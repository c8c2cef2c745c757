#include "core/ops/cpu/optim.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/tensor/dtype.h"

namespace distlab {

void sgd_update(Runtime& rt, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u) {
  if (rt.kernels) return rt.kernels->sgd_update(rt, w, buf, g, n, u);
  const float gf = u.factor ? *u.factor : u.grad_factor;
  for (int64_t j = 0; j < n; j++) {
    float d = g[j] * gf + u.weight_decay * w[j];
    if (buf) {
      buf[j] = u.first ? d : u.momentum * buf[j] + (1.0f - u.dampening) * d;
      d = u.nesterov ? d + u.momentum * buf[j] : buf[j];
    }
    w[j] -= u.lr * d;
  }
}

void adamw_update(Runtime& rt, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u) {
  if (rt.kernels) return rt.kernels->adamw_update(rt, w, m, v, g, n, u);
  for (int64_t j = 0; j < n; j++) {
    const float gj = g[j] * u.grad_factor;
    w[j] *= u.decay;
    m[j] = u.beta1 * m[j] + (1.0f - u.beta1) * gj;
    v[j] = u.beta2 * v[j] + (1.0f - u.beta2) * gj * gj;
    w[j] -= u.step_size * m[j] / (std::sqrt(v[j]) / u.bc2_sqrt + u.eps);
  }
}

void adamw_update_many(Runtime& rt, const AdamWTensor* ts, int64_t count) {
  if (rt.kernels) return rt.kernels->adamw_update_many(rt, ts, count);
  std::vector<float> g32;
  for (int64_t i = 0; i < count; i++) {
    const AdamWTensor& t = ts[i];
    const float* g = static_cast<const float*>(t.g);
    if (t.g_type != DType::f32) {  // a 16-bit gradient, widened exactly
      g32.resize(size_t(t.n));
      convert(t.g, t.g_type, g32.data(), DType::f32, t.n);
      g = g32.data();
    }
    AdamWUpdate u = t.u;
    if (t.factor) u.grad_factor = *t.factor;  // clip_factor's, where the trainer left it
    adamw_update(rt, t.w, t.m, t.v, g, t.n, u);
  }
}

double sum_squares(Runtime& rt, const float* x, int64_t n) {
  if (rt.kernels) return rt.kernels->sum_squares(rt, x, n);
  double ss = 0;
  for (int64_t j = 0; j < n; j++) ss += double(x[j]) * x[j];
  return ss;
}

void scale(Runtime& rt, float* x, int64_t n, float s) {
  if (rt.kernels) return rt.kernels->scale(rt, x, n, s);
  for (int64_t j = 0; j < n; j++) x[j] *= s;
}

void sum_squares_into(Runtime& rt, const float* x, int64_t n, double* out) {
  if (rt.kernels) return rt.kernels->sum_squares_into(rt, x, n, out);
  *out = sum_squares(rt, x, n);
}

void flag_nonfinite(Runtime& rt, const float* x, int64_t n, float* flag) {
  if (rt.kernels) return rt.kernels->flag_nonfinite(rt, x, n, flag);
  if (!all_finite(rt, x, n)) *flag = 1.0f;
}

void clip_factor(Runtime& rt, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm) {
  if (rt.kernels) return rt.kernels->clip_factor(rt, factor, norm, sums, n, loss_scale, max_norm);
  double total = 0;
  for (int64_t i = 0; i < n; i++) total += sums[i];
  const double g = std::sqrt(total) / double(loss_scale);
  const float coef = max_norm > 0 && std::isnan(g) ? std::numeric_limits<float>::quiet_NaN()
                     : max_norm > 0 && g > max_norm ? float(max_norm / (g + 1e-6))
                                                   : 1.0f;
  *norm = g;
  *factor = coef / loss_scale;
}

bool all_finite(Runtime& rt, const float* x, int64_t n) {
  if (rt.kernels) return rt.kernels->all_finite(rt, x, n);
  for (int64_t j = 0; j < n; j++)
    if (!std::isfinite(x[j])) return false;
  return true;
}

}  // namespace distlab
