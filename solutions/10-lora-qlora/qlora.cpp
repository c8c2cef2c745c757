// Lab 10 — LoRA and QLoRA: NF4's code book, a weight in 4.127 bits (blockwise absmax, double
// quantization), and LoRA's forward and backward on a frozen 4-bit Linear.
#include <cmath>
#include <cstring>

#include "labs/10-lora-qlora/api.h"

namespace lab10 {

namespace {

// The index of the value of a sorted code nearest to x; halfway between two, the lower one.
int nearest(const std::vector<float>& code, float x) {
  /// BEGIN SOLUTION
  const int n = int(code.size());
  const int hi = int(std::lower_bound(code.begin(), code.end(), x) - code.begin());
  if (hi == 0) return 0;
  if (hi == n) return n - 1;
  return x - code[size_t(hi - 1)] <= code[size_t(hi)] - x ? hi - 1 : hi;
  /// END SOLUTION
}

// Blockwise absmax quantization onto `code`: each block's largest magnitude into absmax[b], each value
// divided by it (times its reciprocal, as bitsandbytes does) and rounded to the nearest level; a block of
// zeros has absmax 0 and every index at the code's 0.
template <class Store>
void quantize_blocks(const float* x, int64_t n, int64_t block, const std::vector<float>& code, float* absmax, Store store) {
  /// BEGIN SOLUTION
  const int zero = nearest(code, 0.0f);
  for (int64_t b = 0; b * block < n; b++) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    float m = 0;
    for (int64_t i = lo; i < hi; i++) m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    const float inv = m > 0 ? 1.0f / m : 0.0f;
    for (int64_t i = lo; i < hi; i++) store(i, m > 0 ? nearest(code, x[i] * inv) : zero);
  }
  /// END SOLUTION
}

// y (N, out) += scale · x (N, k) · Wᵀ, W (out, k) row-major
void matmul_t(float* y, const float* x, const float* w, int64_t N, int64_t k, int64_t out, float scale) {
  /// BEGIN SOLUTION
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < out; o++) {
      float s = 0;
      for (int64_t j = 0; j < k; j++) s += x[i * k + j] * w[o * k + j];
      y[i * out + o] += scale * s;
    }
  /// END SOLUTION
}

}  // namespace

std::vector<float> normal_map(float offset) {
  /// BEGIN SOLUTION
  // bitsandbytes' create_normal_map: 8 positive levels from the quantiles at 9 points from the offset δ
  // down to ½ (the last, ½, is 0: dropped), 7 negative ones from 8 such points, and 0 itself
  const float delta = offset;
  std::vector<float> v;
  const std::vector<float> pos = linspace_f32(delta, 0.5f, 9), neg = linspace_f32(delta, 0.5f, 8);
  for (int i = 0; i < 8; i++) v.push_back(float(normal_ppf(pos[size_t(i)])));
  for (int i = 0; i < 7; i++) v.push_back(float(-normal_ppf(neg[size_t(i)])));
  v.push_back(0.0f);
  std::sort(v.begin(), v.end());
  const float top = v.back();
  for (float& x : v) x /= top;  // scaled to [-1, 1]
  return v;
  /// END SOLUTION
}

Nf4 quantize(const float* w, int64_t n) {
  /// BEGIN SOLUTION
  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();
  Nf4 q;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  q.packed.assign(size_t((n + 1) / 2), 0);
  std::vector<float> absmax(static_cast<size_t>(blocks));
  quantize_blocks(w, n, kBlock, code, absmax.data(), [&](int64_t i, int level) {
    q.packed[size_t(i / 2)] |= uint8_t(i % 2 == 0 ? level << 4 : level);  // the first of a pair in the high nibble
  });
  // double quantization: the constants less their mean, 8 bits each in blocks of 256
  double sum = 0;
  for (float a : absmax) sum += a;
  q.offset = blocks ? float(sum / double(blocks)) : 0.0f;
  for (float& a : absmax) a -= q.offset;
  q.absmax_q.assign(size_t(blocks), 0);
  q.absmax2.assign(size_t((blocks + kBlock2 - 1) / kBlock2), 0.0f);
  quantize_blocks(absmax.data(), blocks, kBlock2, code8, q.absmax2.data(), [&](int64_t i, int level) { q.absmax_q[size_t(i)] = uint8_t(level); });
  return q;
  /// END SOLUTION
}

void dequantize(const Nf4& q, int64_t n, float* out) {
  /// BEGIN SOLUTION
  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();
  for (int64_t b = 0; b * kBlock < n; b++) {
    float c = code8[q.absmax_q[size_t(b)]] * q.absmax2[size_t(b / kBlock2)];
    c = c + q.offset;
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); i++) {
      const int level = i % 2 == 0 ? q.packed[size_t(i / 2)] >> 4 : q.packed[size_t(i / 2)] & 0xF;
      out[i] = code[size_t(level)] * c;
    }
  }
  /// END SOLUTION
}

void lora_forward(const Frozen& base, const Adapter& ad, const float* x, int64_t N, float* y) {
  /// BEGIN SOLUTION
  // W for this GEMM only: 4 bytes a weight while it lives, then gone
  std::vector<float> w(static_cast<size_t>(base.out * base.in));
  dequantize(*base.weight, base.out * base.in, w.data());
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < base.out; o++) y[i * base.out + o] = base.bias ? base.bias[o] : 0.0f;
  matmul_t(y, x, w.data(), N, base.in, base.out, 1.0f);
  std::vector<float> h(static_cast<size_t>(N * ad.r), 0.0f);  // x Aᵀ (N, r): the narrow side
  matmul_t(h.data(), x, ad.A, N, base.in, ad.r, 1.0f);
  matmul_t(y, h.data(), ad.B, N, ad.r, base.out, ad.scaling);
  /// END SOLUTION
}

void lora_backward(const Frozen& base, const Adapter& ad, const float* x, const float* dy, int64_t N, float* dx, float* dA, float* dB) {
  /// BEGIN SOLUTION
  const int64_t in = base.in, out = base.out, r = ad.r;
  std::vector<float> h(static_cast<size_t>(N * r), 0.0f), g(static_cast<size_t>(N * r), 0.0f);
  matmul_t(h.data(), x, ad.A, N, in, r, 1.0f);  // h = x Aᵀ (recomputed: cheaper than keeping it)
  // g = scaling · dy B (N, r): the gradient reaching h
  for (int64_t i = 0; i < N; i++)
    for (int64_t k = 0; k < r; k++) {
      float s = 0;
      for (int64_t o = 0; o < out; o++) s += dy[i * out + o] * ad.B[o * r + k];
      g[size_t(i * r + k)] = ad.scaling * s;
    }
  for (int64_t o = 0; o < out; o++)  // dB += scaling · dyᵀ h
    for (int64_t k = 0; k < r; k++) {
      float s = 0;
      for (int64_t i = 0; i < N; i++) s += dy[i * out + o] * h[size_t(i * r + k)];
      dB[o * r + k] += ad.scaling * s;
    }
  for (int64_t k = 0; k < r; k++)  // dA += gᵀ x
    for (int64_t j = 0; j < in; j++) {
      float s = 0;
      for (int64_t i = 0; i < N; i++) s += g[size_t(i * r + k)] * x[i * in + j];
      dA[k * in + j] += s;
    }
  if (!dx) return;
  // dx = dy W + g A: W dequantized again (nothing 32-bit was kept from the forward)
  std::vector<float> w(static_cast<size_t>(out * in));
  dequantize(*base.weight, out * in, w.data());
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < in; j++) {
      float s = 0;
      for (int64_t o = 0; o < out; o++) s += dy[i * out + o] * w[size_t(o * in + j)];
      for (int64_t k = 0; k < r; k++) s += g[size_t(i * r + k)] * ad.A[k * in + j];
      dx[i * in + j] = s;
    }
  /// END SOLUTION
}

}  // namespace lab10

extern "C" Lab10Plugin distlab_lab10 = {kLab10Abi, lab10::normal_map, lab10::quantize, lab10::dequantize, lab10::lora_forward,
                                        lab10::lora_backward};
