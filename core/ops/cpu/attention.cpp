#include "core/ops/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/ops/cpu/matmul.h"
#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"

namespace distlab {

// Per (batch, head): q, k, v are (T, hs) slices of qkv with row stride 3C, so they feed BLAS directly.
void attention_forward(Runtime& rt, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  if (rt.kernels) return rt.kernels->attention_forward(rt, out, att, qkv, B, T, C, NH);
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "attention_forward", 4.0 * B * NH * T * T * hs + 5.0 * B * NH * T * T,
             4.0 * (B * T * C3 + B * NH * T * T + B * T * C));
  if (rt.is_meta()) return;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (b * NH + h) * T * T;
      // a (T, T) = scale * q @ k^T
      blas_sgemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
      // causal softmax, row by row: position t sees 0..t
      for (int64_t t = 0; t < T; t++) {
        float* row = a + t * T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s <= t; s++) mx = row[s] > mx ? row[s] : mx;
        double sum = 0;
        for (int64_t s = 0; s <= t; s++) {
          row[s] = std::exp(row[s] - mx);
          sum += row[s];
        }
        float inv = float(1.0 / sum);
        for (int64_t s = 0; s <= t; s++) row[s] *= inv;
        for (int64_t s = t + 1; s < T; s++) row[s] = 0.0f;
      }
      // out (T, hs) slice = a @ v
      blas_sgemm(false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
    }
  }
}

void attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH) {
  if (rt.kernels) return rt.kernels->attention_backward(rt, dqkv, dout, qkv, att, B, T, C, NH);
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "attention_backward", 8.0 * B * NH * T * T * hs + 4.0 * B * NH * T * T,
             4.0 * (2 * B * T * C3 + 2 * B * NH * T * T + B * T * C));
  Tensor datt_t = rt.empty({T, T}, Category::other, "attention backward workspace");
  if (rt.is_meta()) return;
  std::memset(dqkv, 0, sizeof(float) * size_t(B * T * C3));
  const float scale = 1.0f / std::sqrt(float(hs));
  float* datt = datt_t.f32();
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (b * NH + h) * T * T;
      const float* dy = dout + b * T * C + h * hs;
      // datt (T, T) = dy @ v^T ; dv (T, hs) = a^T @ dy
      blas_sgemm(false, true, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, datt, T);
      blas_sgemm(true, false, T, hs, T, 1.0f, a, T, dy, C, 0.0f, dv, C3);
      // softmax backward in place: dpre[t,s] = a[t,s] * (datt[t,s] - Σ_s' a[t,s'] datt[t,s'])
      for (int64_t t = 0; t < T; t++) {
        const float* ar = a + t * T;
        float* dr = datt + t * T;
        double dot = 0;
        for (int64_t s = 0; s <= t; s++) dot += double(ar[s]) * dr[s];
        for (int64_t s = 0; s <= t; s++) dr[s] = ar[s] * (dr[s] - float(dot));
        for (int64_t s = t + 1; s < T; s++) dr[s] = 0.0f;
      }
      // dq = scale * dpre @ k ; dk = scale * dpre^T @ q
      blas_sgemm(false, false, T, hs, T, scale, datt, T, k, C3, 0.0f, dq, C3);
      blas_sgemm(true, false, T, hs, T, scale, datt, T, q, C3, 0.0f, dk, C3);
    }
  }
}

void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C) {
  if (rt.kernels) return rt.kernels->embedding_forward(rt, out, tokens, wte, wpe, B, T, C);
  OpScope op(rt, "embedding_forward", double(B * T * C), 4.0 * 3 * B * T * C);
  if (rt.is_meta()) return;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      float* o = out + (b * T + t) * C;
      const int32_t tok = tokens[b * T + t];
      if (tok < 0) {  // another rank's row: it writes the sum
        for (int64_t i = 0; i < C; i++) o[i] = 0.0f;
        continue;
      }
      const float* e = wte + int64_t(tok) * C;
      for (int64_t i = 0; i < C; i++) o[i] = e[i] + (wpe ? wpe[t * C + i] : 0.0f);
    }
}

void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  if (rt.kernels) return rt.kernels->embedding_backward(rt, dwte, dwpe, dout, tokens, B, T, C);
  OpScope op(rt, "embedding_backward", 2.0 * B * T * C, 4.0 * 3 * B * T * C);
  if (rt.is_meta()) return;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const float* d = dout + (b * T + t) * C;
      const int32_t tok = tokens[b * T + t];
      if (tok >= 0)
        for (int64_t i = 0; i < C; i++) dwte[int64_t(tok) * C + i] += d[i];
      if (dwpe)
        for (int64_t i = 0; i < C; i++) dwpe[t * C + i] += d[i];
    }
}

}  // namespace distlab
