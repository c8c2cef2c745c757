#include "core/ops/cpu/llama.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// A device whose kernel table lacks one of these (a GPU build that has not got them yet) refuses plainly
template <class F>
F need(F f, const char* op) {
  if (!f) throw ConfigError(std::string(op) + ": model.name = \"llama\" has no kernel for it on this device yet", "train llama on the cpu");
  return f;
}

}  // namespace

void rmsnorm_forward(Runtime& rt, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
  if (rt.kernels) return need(rt.kernels->rmsnorm_forward, "rmsnorm_forward")(rt, out, rstd, inp, weight, N, C, eps);
  OpScope op(rt, "rmsnorm_forward", 4.0 * N * C, 4.0 * (2 * N * C + C + N));
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    double ss = 0;
    for (int64_t i = 0; i < C; i++) ss += double(x[i]) * x[i];
    const float s = float(1.0 / std::sqrt(ss / double(C) + eps));
    float* o = out + n * C;
    for (int64_t i = 0; i < C; i++) o[i] = (x[i] * s) * weight[i];
    rstd[n] = s;
  }
}

// dx = rstd · (g − xhat · mean(g · xhat)), g = dout · weight, xhat = x · rstd; dweight += Σ_rows dout · xhat
void rmsnorm_backward(Runtime& rt, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C) {
  if (rt.kernels) return need(rt.kernels->rmsnorm_backward, "rmsnorm_backward")(rt, dinp, dweight, dout, inp, weight, rstd, N, C);
  OpScope op(rt, "rmsnorm_backward", 8.0 * N * C, 4.0 * (3 * N * C + 2 * C + N));
  if (rt.is_meta()) return;
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    const float s = rstd[n];
    double gx = 0;
    for (int64_t i = 0; i < C; i++) gx += double(weight[i] * dy[i]) * (x[i] * s);
    const float mean_gx = float(gx / double(C));
    float* dx = dinp + n * C;
    for (int64_t i = 0; i < C; i++) {
      const float xhat = x[i] * s;
      dweight[i] += xhat * dy[i];
      dx[i] = s * (weight[i] * dy[i] - xhat * mean_gx);
    }
  }
}

void rope_apply(Runtime& rt, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse,
                const int32_t* pos) {
  if (rt.kernels && pos) throw ConfigError("RoPE at a context-parallel rank's positions has no kernel on this device yet", "run parallel.cp on the CPU device");
  if (rt.kernels) return need(rt.kernels->rope_apply, "rope_apply")(rt, x, B, T, H, hd, ld, theta, inverse);
  OpScope op(rt, inverse ? "rope_backward" : "rope_forward", 6.0 * B * T * H * hd / 2, 4.0 * 2 * B * T * H * hd);
  if (rt.is_meta()) return;
  if (hd % 2 != 0) throw ShapeError("RoPE: head size " + std::to_string(hd) + " is odd", "RoPE turns pairs: use an even head size");
  const int64_t half = hd / 2;
  // Hugging Face's: inv_freq = 1 / θ^(arange(0, hd, 2) / hd) in float32; angle = t · inv_freq in float32
  std::vector<float> cs(size_t(T * half)), sn(size_t(T * half));
  for (int64_t i = 0; i < half; i++) {
    const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(hd));
    for (int64_t t = 0; t < T; t++) {
      const float a = float(pos ? pos[t] : t) * inv_freq;
      cs[size_t(t * half + i)] = std::cos(a);
      sn[size_t(t * half + i)] = inverse ? -std::sin(a) : std::sin(a);
    }
  }
#pragma omp parallel for schedule(static) if (B * T * H * hd > 32768)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const int64_t t = bt % T;
    for (int64_t h = 0; h < H; h++) {
      float* p = x + bt * ld + h * hd;
      for (int64_t i = 0; i < half; i++) {
        const float c = cs[size_t(t * half + i)], s = sn[size_t(t * half + i)];
        const float a = p[i], b = p[i + half];
        p[i] = a * c - b * s;
        p[i + half] = b * c + a * s;
      }
    }
  }
}

void swiglu_forward(Runtime& rt, float* out, const float* gate, const float* up, int64_t n) {
  if (rt.kernels) return need(rt.kernels->swiglu_forward, "swiglu_forward")(rt, out, gate, up, n);
  OpScope op(rt, "swiglu_forward", 6.0 * n, 12.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_backward(Runtime& rt, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  if (rt.kernels) return need(rt.kernels->swiglu_backward, "swiglu_backward")(rt, dgate, dup, dout, gate, up, n);
  OpScope op(rt, "swiglu_backward", 12.0 * n, 20.0 * n);
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i], sig = 1.0f / (1.0f + std::exp(-g));
    dgate[i] = dout[i] * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    dup[i] = dout[i] * (g * sig);
  }
}

void repeat_kv_forward(Runtime& rt, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd) {
  if (rt.kernels) return need(rt.kernels->repeat_kv_forward, "repeat_kv_forward")(rt, qkv, q, k, v, B, T, H, KV, hd);
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  OpScope op(rt, "repeat_kv_forward", 0.0, 4.0 * (B * T * (C + 2 * Ckv) + 3 * B * T * C));
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (B * T * C > 32768)
  for (int64_t bt = 0; bt < B * T; bt++) {
    float* row = qkv + bt * 3 * C;
    std::memcpy(row, q + bt * C, sizeof(float) * size_t(C));
    for (int64_t h = 0; h < H; h++) {
      std::memcpy(row + C + h * hd, k + bt * Ckv + (h / group) * hd, sizeof(float) * size_t(hd));
      std::memcpy(row + 2 * C + h * hd, v + bt * Ckv + (h / group) * hd, sizeof(float) * size_t(hd));
    }
  }
}

void repeat_kv_backward(Runtime& rt, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd) {
  if (rt.kernels) return need(rt.kernels->repeat_kv_backward, "repeat_kv_backward")(rt, dq, dk, dv, dqkv, B, T, H, KV, hd);
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  OpScope op(rt, "repeat_kv_backward", double(2 * B * T * C), 4.0 * (3 * B * T * C + B * T * (C + 2 * Ckv)));
  if (rt.is_meta()) return;
#pragma omp parallel for schedule(static) if (B * T * C > 32768)
  for (int64_t bt = 0; bt < B * T; bt++) {
    const float* row = dqkv + bt * 3 * C;
    std::memcpy(dq + bt * C, row, sizeof(float) * size_t(C));
    for (int64_t g = 0; g < KV; g++)
      for (int64_t d = 0; d < hd; d++) {
        float sk = 0, sv = 0;
        for (int64_t j = 0; j < group; j++) {  // the group's query heads, in order
          sk += row[C + (g * group + j) * hd + d];
          sv += row[2 * C + (g * group + j) * hd + d];
        }
        dk[bt * Ckv + g * hd + d] = sk;
        dv[bt * Ckv + g * hd + d] = sv;
      }
  }
}

// ---- the 16-bit forms: widened, the f32 kernels, each result rounded once ----

void rmsnorm_forward_16(Runtime& rt, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps) {
  if (rt.kernels) return need(rt.kernels->rmsnorm_forward_16, "rmsnorm_forward_16")(rt, out, rstd, inp, weight, t, N, C, eps);
  if (rt.is_meta()) return rmsnorm_forward(rt, nullptr, nullptr, nullptr, nullptr, N, C, eps);  // its event
  std::vector<float> x = widened(inp, t, N * C), w = widened(weight, t, C), y(x.size());
  rmsnorm_forward(rt, y.data(), rstd, x.data(), w.data(), N, C, eps);
  convert(y.data(), DType::f32, out, t, N * C);
}

void rmsnorm_backward_16(Runtime& rt, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd, DType t,
                         int64_t N, int64_t C) {
  if (rt.kernels) return need(rt.kernels->rmsnorm_backward_16, "rmsnorm_backward_16")(rt, dinp, dweight, dout, inp, weight, rstd, t, N, C);
  if (rt.is_meta()) return rmsnorm_backward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, C);
  std::vector<float> dy = widened(dout, t, N * C), x = widened(inp, t, N * C), w = widened(weight, t, C), dw = widened(dweight, t, C);
  std::vector<float> dx(x.size());
  rmsnorm_backward(rt, dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd, N, C);
  convert(dx.data(), DType::f32, dinp, t, N * C);
  convert(dw.data(), DType::f32, dweight, t, C);
}

void swiglu_forward_16(Runtime& rt, void* out, const void* gate, const void* up, DType t, int64_t n) {
  if (rt.kernels) return need(rt.kernels->swiglu_forward_16, "swiglu_forward_16")(rt, out, gate, up, t, n);
  if (rt.is_meta()) return swiglu_forward(rt, nullptr, nullptr, nullptr, n);
  std::vector<float> g = widened(gate, t, n), u = widened(up, t, n), h(g.size());
  swiglu_forward(rt, h.data(), g.data(), u.data(), n);
  convert(h.data(), DType::f32, out, t, n);
}

void swiglu_backward_16(Runtime& rt, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n) {
  if (rt.kernels) return need(rt.kernels->swiglu_backward_16, "swiglu_backward_16")(rt, dgate, dup, dout, gate, up, t, n);
  if (rt.is_meta()) return swiglu_backward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, n);
  std::vector<float> dh = widened(dout, t, n), g = widened(gate, t, n), u = widened(up, t, n), dg(g.size()), du(g.size());
  swiglu_backward(rt, dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
  convert(dg.data(), DType::f32, dgate, t, n);
  convert(du.data(), DType::f32, dup, t, n);
}

void rope_repeat_kv_forward_16(Runtime& rt, void* qkv, void* q, void* k, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, float theta, bool rotate_q) {
  if (rt.kernels)
    return need(rt.kernels->rope_repeat_kv_forward_16, "rope_repeat_kv_forward_16")(rt, qkv, q, k, v, t, B, T, H, KV, hd, theta, rotate_q);
  const int64_t Cq = H * hd, Ckv = KV * hd;
  if (rt.is_meta()) {  // their events
    if (rotate_q) rope_apply(rt, nullptr, B, T, H, hd, Cq, theta, false);
    rope_apply(rt, nullptr, B, T, KV, hd, Ckv, theta, false);
    return repeat_kv_forward(rt, nullptr, nullptr, nullptr, nullptr, B, T, H, KV, hd);
  }
  std::vector<float> qf = widened(q, t, B * T * Cq), kf = widened(k, t, B * T * Ckv), vf = widened(v, t, B * T * Ckv);
  std::vector<float> out(static_cast<size_t>(B * T * 3 * Cq));
  if (rotate_q) rope_apply(rt, qf.data(), B, T, H, hd, Cq, theta, false);
  rope_apply(rt, kf.data(), B, T, KV, hd, Ckv, theta, false);
  repeat_kv_forward(rt, out.data(), qf.data(), kf.data(), vf.data(), B, T, H, KV, hd);
  convert(out.data(), DType::f32, qkv, t, B * T * 3 * Cq);
  if (rotate_q) convert(qf.data(), DType::f32, q, t, B * T * Cq);
  convert(kf.data(), DType::f32, k, t, B * T * Ckv);
}

void rope_repeat_kv_backward_16(Runtime& rt, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                               int64_t KV, int64_t hd, float theta) {
  if (rt.kernels)
    return need(rt.kernels->rope_repeat_kv_backward_16, "rope_repeat_kv_backward_16")(rt, dq, dk, dv, dqkv, t, B, T, H, KV, hd, theta);
  const int64_t Cq = H * hd, Ckv = KV * hd;
  if (rt.is_meta()) {
    repeat_kv_backward(rt, nullptr, nullptr, nullptr, nullptr, B, T, H, KV, hd);
    rope_apply(rt, nullptr, B, T, H, hd, Cq, theta, true);
    return rope_apply(rt, nullptr, B, T, KV, hd, Ckv, theta, true);
  }
  std::vector<float> g = widened(dqkv, t, B * T * 3 * Cq), dqf(static_cast<size_t>(B * T * Cq)), dkf(static_cast<size_t>(B * T * Ckv)),
      dvf(static_cast<size_t>(B * T * Ckv));
  repeat_kv_backward(rt, dqf.data(), dkf.data(), dvf.data(), g.data(), B, T, H, KV, hd);
  rope_apply(rt, dqf.data(), B, T, H, hd, Cq, theta, true);  // a rotation's backward turns back
  rope_apply(rt, dkf.data(), B, T, KV, hd, Ckv, theta, true);
  convert(dqf.data(), DType::f32, dq, t, B * T * Cq);
  convert(dkf.data(), DType::f32, dk, t, B * T * Ckv);
  convert(dvf.data(), DType::f32, dv, t, B * T * Ckv);
}

}  // namespace distlab
