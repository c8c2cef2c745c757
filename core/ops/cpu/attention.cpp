#include "core/ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/ops/cpu/matmul.h"
#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/util/error.h"

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

// ---- FlashAttention-2: tiles and an online softmax ----

double flash_attention_flops(int64_t B, int64_t T, int64_t C, int64_t NH, bool backward) {
  const double hs = double(C / NH);
  double f = 0;
  for (int64_t i0 = 0; i0 < T; i0 += kFlashTile)
    for (int64_t j0 = 0; j0 <= i0 && j0 < T; j0 += kFlashTile) {  // tiles at or below the diagonal
      const double r = double(std::min(kFlashTile, T - i0)), c = double(std::min(kFlashTile, T - j0));
      f += backward ? 10.0 * r * c * hs + 4.0 * r * c : 4.0 * r * c * hs + 6.0 * r * c;
    }
  return f * double(B * NH);
}

// Per (batch, head) and tile of queries [i0, i1): walk the key tiles [j0, j1) up to the diagonal, keeping per
// row the running max m and sum l of exp(score - m), and the output so far scaled by the same exp(-m):
//   S = scale q_i k_jᵀ            (r, c), the future masked to -inf
//   m' = max(m, rowmax S);  P = exp(S - m');  l = exp(m - m') l + rowsum P;  O = exp(m - m') O + P v_j
// and at the end O / l and lse = m + log l.
void flash_attention_forward(Runtime& rt, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH) {
  if (rt.kernels) {
    if (!rt.kernels->flash_attention_forward)
      throw ConfigError("model.attention = \"flash\" has no kernel on this device yet", "use model.attention = \"naive\" here");
    return rt.kernels->flash_attention_forward(rt, out, lse, qkv, B, T, C, NH);
  }
  const int64_t hs = C / NH, C3 = 3 * C, Bt = kFlashTile;
  OpScope op(rt, "flash_attention_forward", flash_attention_flops(B, T, C, NH, false), 4.0 * (B * T * C3 + B * T * C + B * NH * T));
  op.attention(B * NH, T, hs);
  Tensor work = rt.empty({Bt * Bt + Bt * hs + 2 * Bt}, Category::other, "flash attention tiles");
  if (rt.is_meta()) return;
  const float scale = 1.0f / std::sqrt(float(hs)), ninf = -std::numeric_limits<float>::infinity();
  float* S = work.f32();      // (Bt, Bt): scores, then P
  float* O = S + Bt * Bt;     // (Bt, hs): the output so far
  float* m = O + Bt * hs;     // (Bt): running max
  float* l = m + Bt;          // (Bt): running sum
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      for (int64_t i0 = 0; i0 < T; i0 += Bt) {
        const int64_t r = std::min(Bt, T - i0);
        std::fill(O, O + r * hs, 0.0f);
        std::fill(m, m + r, ninf);
        std::fill(l, l + r, 0.0f);
        for (int64_t j0 = 0; j0 < i0 + r; j0 += Bt) {
          const int64_t c = std::min(Bt, T - j0);
          blas_sgemm(false, true, r, c, hs, scale, q + i0 * C3, C3, k + j0 * C3, C3, 0.0f, S, Bt);
          for (int64_t t = 0; t < r; t++) {
            float* row = S + t * Bt;
            const int64_t valid = std::min(c, i0 + t - j0 + 1);  // keys j0 .. i0+t are not in the future
            float mx = m[t];
            for (int64_t s = 0; s < valid; s++) mx = row[s] > mx ? row[s] : mx;
            const float alpha = m[t] == ninf ? 0.0f : std::exp(m[t] - mx);
            float sum = 0;
            for (int64_t s = 0; s < valid; s++) {
              row[s] = std::exp(row[s] - mx);
              sum += row[s];
            }
            for (int64_t s = std::max<int64_t>(valid, 0); s < c; s++) row[s] = 0.0f;
            l[t] = alpha * l[t] + sum;
            m[t] = mx;
            if (alpha != 1.0f)
              for (int64_t d = 0; d < hs; d++) O[t * hs + d] *= alpha;
          }
          blas_sgemm(false, false, r, hs, c, 1.0f, S, Bt, v + j0 * C3, C3, 1.0f, O, hs);  // O += P v_j
        }
        for (int64_t t = 0; t < r; t++) {
          float* o = out + b * T * C + (i0 + t) * C + h * hs;
          const float inv = 1.0f / l[t];
          for (int64_t d = 0; d < hs; d++) o[d] = O[t * hs + d] * inv;
          lse[(b * NH + h) * T + i0 + t] = m[t] + std::log(l[t]);
        }
      }
    }
}

// Per (batch, head), D = rowsum(dO ∘ O) first (softmax's backward term Σ_s P dP, without P), then per key tile
// j and query tile i at or below the diagonal, the probabilities recomputed from lse:
//   P = exp(scale q_i k_jᵀ - lse_i) (future 0);  dv_j += Pᵀ dO_i;  dP = dO_i v_jᵀ;  dS = P ∘ (dP - D_i)
//   dq_i += scale dS k_j;  dk_j += scale dSᵀ q_i
void flash_attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (rt.kernels) {
    if (!rt.kernels->flash_attention_backward)
      throw ConfigError("model.attention = \"flash\" has no kernel on this device yet", "use model.attention = \"naive\" here");
    return rt.kernels->flash_attention_backward(rt, dqkv, dout, qkv, out, lse, B, T, C, NH);
  }
  const int64_t hs = C / NH, C3 = 3 * C, Bt = kFlashTile;
  OpScope op(rt, "flash_attention_backward", flash_attention_flops(B, T, C, NH, true),
             4.0 * (2 * B * T * C3 + 2 * B * T * C + B * NH * T));
  op.attention(B * NH, T, hs);
  Tensor work = rt.empty({2 * Bt * Bt + T}, Category::other, "flash attention backward tiles");
  if (rt.is_meta()) return;
  std::memset(dqkv, 0, sizeof(float) * size_t(B * T * C3));
  const float scale = 1.0f / std::sqrt(float(hs));
  float* P = work.f32();     // (Bt, Bt)
  float* dS = P + Bt * Bt;   // (Bt, Bt): dP, then dS
  float* D = dS + Bt * Bt;   // (T)
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* dO = dout + b * T * C + h * hs;
      const float* O = out + b * T * C + h * hs;
      const float* L = lse + (b * NH + h) * T;
      float* dq = dqkv + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      for (int64_t t = 0; t < T; t++) {
        double dot = 0;
        for (int64_t d = 0; d < hs; d++) dot += double(dO[t * C + d]) * O[t * C + d];
        D[t] = float(dot);
      }
      for (int64_t j0 = 0; j0 < T; j0 += Bt) {
        const int64_t c = std::min(Bt, T - j0);
        for (int64_t i0 = j0 - j0 % Bt; i0 < T; i0 += Bt) {  // query tiles at or below the diagonal
          const int64_t r = std::min(Bt, T - i0);
          blas_sgemm(false, true, r, c, hs, scale, q + i0 * C3, C3, k + j0 * C3, C3, 0.0f, P, Bt);
          for (int64_t t = 0; t < r; t++) {
            const int64_t valid = std::min(c, i0 + t - j0 + 1);
            float* row = P + t * Bt;
            for (int64_t s = 0; s < valid; s++) row[s] = std::exp(row[s] - L[i0 + t]);
            for (int64_t s = std::max<int64_t>(valid, 0); s < c; s++) row[s] = 0.0f;
          }
          blas_sgemm(true, false, c, hs, r, 1.0f, P, Bt, dO + i0 * C, C, 1.0f, dv + j0 * C3, C3);   // dv_j += Pᵀ dO_i
          blas_sgemm(false, true, r, c, hs, 1.0f, dO + i0 * C, C, v + j0 * C3, C3, 0.0f, dS, Bt);   // dP = dO_i v_jᵀ
          for (int64_t t = 0; t < r; t++)
            for (int64_t s = 0; s < c; s++) dS[t * Bt + s] = P[t * Bt + s] * (dS[t * Bt + s] - D[i0 + t]);
          blas_sgemm(false, false, r, hs, c, scale, dS, Bt, k + j0 * C3, C3, 1.0f, dq + i0 * C3, C3);  // dq_i += scale dS k_j
          blas_sgemm(true, false, c, hs, r, scale, dS, Bt, q + i0 * C3, C3, 1.0f, dk + j0 * C3, C3);   // dk_j += scale dSᵀ q_i
        }
      }
    }
}

void flash_attention_forward_16(Runtime& rt, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                int64_t NH) {
  if (rt.kernels) {
    if (!rt.kernels->flash_attention_forward_16)
      throw ConfigError("model.attention = \"flash\" has no 16-bit kernel on this device yet", "use model.attention = \"naive\" here");
    return rt.kernels->flash_attention_forward_16(rt, out, lse, qkv, t, B, T, C, NH);
  }
  if (rt.is_meta()) return flash_attention_forward(rt, nullptr, nullptr, nullptr, B, T, C, NH);  // its event
  std::vector<float> q = widened(qkv, t, B * T * 3 * C), y(static_cast<size_t>(B * T * C));
  flash_attention_forward(rt, y.data(), lse, q.data(), B, T, C, NH);
  convert(y.data(), DType::f32, out, t, B * T * C);
}

void flash_attention_backward_16(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                 DType t, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (rt.kernels) {
    if (!rt.kernels->flash_attention_backward_16)
      throw ConfigError("model.attention = \"flash\" has no 16-bit kernel on this device yet", "use model.attention = \"naive\" here");
    return rt.kernels->flash_attention_backward_16(rt, dqkv, dout, qkv, out, lse, t, B, T, C, NH);
  }
  if (rt.is_meta()) return flash_attention_backward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, B, T, C, NH);
  std::vector<float> dy = widened(dout, t, B * T * C), q = widened(qkv, t, B * T * 3 * C), y = widened(out, t, B * T * C);
  std::vector<float> dq(q.size());
  flash_attention_backward(rt, dq.data(), dy.data(), q.data(), y.data(), lse, B, T, C, NH);
  convert(dq.data(), DType::f32, dqkv, t, B * T * 3 * C);
}

// ---- ring attention's blocks (context parallelism) ----

// the keys of a tile at or before position p: kpos ascends, so they are a prefix
static int64_t visible_keys(const int32_t* kpos, int64_t c, int32_t p) { return std::upper_bound(kpos, kpos + c, p) - kpos; }

// the tiles a block computes: those with a key at or before the tile's last query
static double block_flops(const int32_t* qpos, const int32_t* kpos, int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, bool backward) {
  const double hs = double(C / NH);
  double f = 0;
  for (int64_t i0 = 0; i0 < Tq; i0 += kFlashTile) {
    const int64_t r = std::min(kFlashTile, Tq - i0);
    for (int64_t j0 = 0; j0 < Tk && kpos[j0] <= qpos[i0 + r - 1]; j0 += kFlashTile) {
      const double c = double(std::min(kFlashTile, Tk - j0));
      f += backward ? 10.0 * double(r) * c * hs + 4.0 * double(r) * c : 4.0 * double(r) * c * hs + 6.0 * double(r) * c;
    }
  }
  return f * double(B * NH);
}

// flash_attention_forward's loop, with q and k, v from different tensors and the mask by position
void attention_block_forward(Runtime& rt, float* out, float* lse, const float* q, int64_t ldq, const float* k, const float* v,
                             int64_t ldkv, const int32_t* qpos, const int32_t* kpos, int64_t B, int64_t Tq, int64_t Tk, int64_t C,
                             int64_t NH, int64_t group) {
  if (rt.kernels) throw ConfigError("ring attention (parallel.cp) has no kernel on this device yet", "run context parallelism on the CPU device");
  const int64_t hs = C / NH, Bt = kFlashTile;
  OpScope op(rt, "flash_attention_block_forward", block_flops(qpos, kpos, B, Tq, Tk, C, NH, false),
             4.0 * (B * Tq * C + 2 * B * Tk * C / group + B * Tq * C + B * NH * Tq));
  op.attention(B * NH, std::max(Tq, Tk), hs);
  Tensor work = rt.empty({Bt * Bt + Bt * hs + 2 * Bt}, Category::other, "ring attention tiles");
  if (rt.is_meta()) return;
  const float scale = 1.0f / std::sqrt(float(hs)), ninf = -std::numeric_limits<float>::infinity();
  float* S = work.f32();   // (Bt, Bt): scores, then P
  float* O = S + Bt * Bt;  // (Bt, hs): the output so far
  float* m = O + Bt * hs;  // (Bt): running max
  float* l = m + Bt;       // (Bt): running sum
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* qb = q + b * Tq * ldq + h * hs;
      const float* kb = k + b * Tk * ldkv + (h / group) * hs;
      const float* vb = v + b * Tk * ldkv + (h / group) * hs;
      for (int64_t i0 = 0; i0 < Tq; i0 += Bt) {
        const int64_t r = std::min(Bt, Tq - i0);
        std::fill(O, O + r * hs, 0.0f);
        std::fill(m, m + r, ninf);
        std::fill(l, l + r, 0.0f);
        for (int64_t j0 = 0; j0 < Tk && kpos[j0] <= qpos[i0 + r - 1]; j0 += Bt) {  // later tiles: all in the future
          const int64_t c = std::min(Bt, Tk - j0);
          blas_sgemm(false, true, r, c, hs, scale, qb + i0 * ldq, ldq, kb + j0 * ldkv, ldkv, 0.0f, S, Bt);
          for (int64_t t = 0; t < r; t++) {
            float* row = S + t * Bt;
            const int64_t valid = visible_keys(kpos + j0, c, qpos[i0 + t]);
            if (valid == 0) {  // this row sees none of the tile's keys
              std::fill(row, row + c, 0.0f);
              continue;
            }
            float mx = m[t];
            for (int64_t s = 0; s < valid; s++) mx = row[s] > mx ? row[s] : mx;
            const float alpha = m[t] == ninf ? 0.0f : std::exp(m[t] - mx);
            float sum = 0;
            for (int64_t s = 0; s < valid; s++) {
              row[s] = std::exp(row[s] - mx);
              sum += row[s];
            }
            std::fill(row + valid, row + c, 0.0f);
            l[t] = alpha * l[t] + sum;
            m[t] = mx;
            if (alpha != 1.0f)
              for (int64_t d = 0; d < hs; d++) O[t * hs + d] *= alpha;
          }
          blas_sgemm(false, false, r, hs, c, 1.0f, S, Bt, vb + j0 * ldkv, ldkv, 1.0f, O, hs);  // O += P v_j
        }
        for (int64_t t = 0; t < r; t++) {
          float* o = out + b * Tq * C + (i0 + t) * C + h * hs;
          const bool none = l[t] == 0.0f;
          const float inv = none ? 0.0f : 1.0f / l[t];
          for (int64_t d = 0; d < hs; d++) o[d] = O[t * hs + d] * inv;
          lse[(b * NH + h) * Tq + i0 + t] = none ? ninf : m[t] + std::log(l[t]);
        }
      }
    }
}

void attention_merge(Runtime& rt, float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t T, int64_t C,
                     int64_t NH) {
  if (rt.kernels) throw ConfigError("ring attention (parallel.cp) has no kernel on this device yet", "run context parallelism on the CPU device");
  OpScope op(rt, "attention_merge", 4.0 * B * T * C + 6.0 * B * NH * T, 4.0 * (3 * B * T * C + 3 * B * NH * T));
  if (rt.is_meta()) return;
  const int64_t hs = C / NH;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++)
      for (int64_t t = 0; t < T; t++) {
        float& la = lse[(b * NH + h) * T + t];
        const float lb = lse_b[(b * NH + h) * T + t];
        if (lb == ninf) continue;  // b saw no key: nothing to add
        const float mx = std::max(la, lb), l = mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
        const float wa = la == ninf ? 0.0f : std::exp(la - l), wb = std::exp(lb - l);
        float* o = out + (b * T + t) * C + h * hs;
        const float* ob = out_b + (b * T + t) * C + h * hs;
        for (int64_t d = 0; d < hs; d++) o[d] = wa * o[d] + wb * ob[d];
        la = l;
      }
}

void attention_out_dot(Runtime& rt, float* D, const float* dout, const float* out, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (rt.kernels) throw ConfigError("ring attention (parallel.cp) has no kernel on this device yet", "run context parallelism on the CPU device");
  OpScope op(rt, "attention_out_dot", 2.0 * B * T * C, 4.0 * (2 * B * T * C + B * NH * T));
  if (rt.is_meta()) return;
  const int64_t hs = C / NH;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++)
      for (int64_t t = 0; t < T; t++) {
        double dot = 0;  // as flash_attention_backward's D
        for (int64_t d = 0; d < hs; d++) dot += double(dout[(b * T + t) * C + h * hs + d]) * out[(b * T + t) * C + h * hs + d];
        D[(b * NH + h) * T + t] = float(dot);
      }
}

// flash_attention_backward's loop, for one block, from the whole row's lse and D
void attention_block_backward(Runtime& rt, float* dq, int64_t lddq, float* dk, float* dv, int64_t lddkv, const float* dout,
                              const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv, const float* lse,
                              const float* D, const int32_t* qpos, const int32_t* kpos, int64_t B, int64_t Tq, int64_t Tk, int64_t C,
                              int64_t NH, int64_t group) {
  if (rt.kernels) throw ConfigError("ring attention (parallel.cp) has no kernel on this device yet", "run context parallelism on the CPU device");
  const int64_t hs = C / NH, Bt = kFlashTile;
  OpScope op(rt, "flash_attention_block_backward", block_flops(qpos, kpos, B, Tq, Tk, C, NH, true),
             4.0 * (2 * B * Tq * C + 4 * B * Tk * C / group + B * Tq * C + 2 * B * NH * Tq));
  op.attention(B * NH, std::max(Tq, Tk), hs);
  Tensor work = rt.empty({2 * Bt * Bt}, Category::other, "ring attention backward tiles");
  if (rt.is_meta()) return;
  const float scale = 1.0f / std::sqrt(float(hs)), ninf = -std::numeric_limits<float>::infinity();
  float* P = work.f32();    // (Bt, Bt)
  float* dS = P + Bt * Bt;  // (Bt, Bt): dP, then dS
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* qb = q + b * Tq * ldq + h * hs;
      const float* kb = k + b * Tk * ldkv + (h / group) * hs;
      const float* vb = v + b * Tk * ldkv + (h / group) * hs;
      const float* dO = dout + b * Tq * C + h * hs;
      const float* L = lse + (b * NH + h) * Tq;
      const float* Dr = D + (b * NH + h) * Tq;
      float* dqb = dq + b * Tq * lddq + h * hs;
      float* dkb = dk + b * Tk * lddkv + (h / group) * hs;
      float* dvb = dv + b * Tk * lddkv + (h / group) * hs;
      for (int64_t j0 = 0; j0 < Tk; j0 += Bt) {
        const int64_t c = std::min(Bt, Tk - j0);
        for (int64_t i0 = 0; i0 < Tq; i0 += Bt) {
          const int64_t r = std::min(Bt, Tq - i0);
          if (kpos[j0] > qpos[i0 + r - 1]) continue;  // every key after every query
          blas_sgemm(false, true, r, c, hs, scale, qb + i0 * ldq, ldq, kb + j0 * ldkv, ldkv, 0.0f, P, Bt);
          for (int64_t t = 0; t < r; t++) {
            const int64_t valid = L[i0 + t] == ninf ? 0 : visible_keys(kpos + j0, c, qpos[i0 + t]);
            float* row = P + t * Bt;
            for (int64_t s = 0; s < valid; s++) row[s] = std::exp(row[s] - L[i0 + t]);
            std::fill(row + valid, row + c, 0.0f);
          }
          blas_sgemm(true, false, c, hs, r, 1.0f, P, Bt, dO + i0 * C, C, 1.0f, dvb + j0 * lddkv, lddkv);  // dv_j += Pᵀ dO_i
          blas_sgemm(false, true, r, c, hs, 1.0f, dO + i0 * C, C, vb + j0 * ldkv, ldkv, 0.0f, dS, Bt);    // dP = dO_i v_jᵀ
          for (int64_t t = 0; t < r; t++)
            for (int64_t s = 0; s < c; s++) dS[t * Bt + s] = P[t * Bt + s] * (dS[t * Bt + s] - Dr[i0 + t]);
          blas_sgemm(false, false, r, hs, c, scale, dS, Bt, kb + j0 * ldkv, ldkv, 1.0f, dqb + i0 * lddq, lddq);  // dq_i += scale dS k_j
          blas_sgemm(true, false, c, hs, r, scale, dS, Bt, qb + i0 * ldq, ldq, 1.0f, dkb + j0 * lddkv, lddkv);   // dk_j += scale dSᵀ q_i
        }
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

void embedding_forward_16(Runtime& rt, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                          int64_t C) {
  if (rt.kernels) {
    if (!rt.kernels->embedding_forward_16) throw ConfigError("the 16-bit embedding has no kernel on this device yet", "run in f32 here");
    return rt.kernels->embedding_forward_16(rt, out, tokens, wte, wpe, t, B, T, C);
  }
  OpScope op(rt, "embedding_forward", double(B * T * C), 4.0 * 3 * B * T * C);  // embedding_forward's event
  if (rt.is_meta()) return;
  std::vector<float> o(static_cast<size_t>(C));
  for (int64_t b = 0; b < B; b++)
    for (int64_t p = 0; p < T; p++) {  // embedding_forward's loop on one row at a time, widened
      const int32_t tok = tokens[b * T + p];
      if (tok < 0) std::fill(o.begin(), o.end(), 0.0f);
      else {
        const std::vector<float> e = widened(static_cast<const char*>(wte) + int64_t(tok) * C * dtype_size(t), t, C);
        const std::vector<float> w = wpe ? widened(static_cast<const char*>(wpe) + p * C * dtype_size(t), t, C) : std::vector<float>();
        for (int64_t i = 0; i < C; i++) o[size_t(i)] = e[size_t(i)] + (wpe ? w[size_t(i)] : 0.0f);
      }
      convert(o.data(), DType::f32, static_cast<char*>(out) + (b * T + p) * C * dtype_size(t), t, C);
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
