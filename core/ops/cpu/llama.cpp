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

}  // namespace distlab
