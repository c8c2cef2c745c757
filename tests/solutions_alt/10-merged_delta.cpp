// Lab 10, alternative solution "merged_delta" (written from api.h/README only, to show the grader has no
// false negatives). What it does differently from the obvious transcription:
//  - normal_map: the quantiles in double, scaled in double, then rounded to f32;
//  - quantize: a linear scan for the nearest level, each weight divided by its absmax in double (not times
//    the f32 reciprocal); the offset summed in long double; the packing written nibble by nibble;
//  - dequantize: the block's absmax in double, rounded once;
//  - lora_forward: W + scaling · B A merged first (one dequantized buffer, then one GEMM in double sums);
//  - lora_backward: dx through the same merged weight, dA and dB from the chain rule in double.
#include <cmath>
#include <numeric>

#include "labs/10-lora-qlora/api.h"

namespace lab10 {

namespace {

int nearest_scan(const std::vector<float>& code, double t) {
  int best = 0;
  for (int k = 1; k < int(code.size()); k++)
    if (std::abs(t - double(code[size_t(k)])) < std::abs(t - double(code[size_t(best)]))) best = k;
  return best;
}

// W + scaling · B A, (out, in), W dequantized
std::vector<float> merged(const Frozen& base, const Adapter& ad) {
  std::vector<float> w(static_cast<size_t>(base.out * base.in));
  dequantize(*base.weight, base.out * base.in, w.data());
  for (int64_t o = 0; o < base.out; o++)
    for (int64_t j = 0; j < base.in; j++) {
      double d = 0;
      for (int64_t k = 0; k < ad.r; k++) d += double(ad.B[o * ad.r + k]) * double(ad.A[k * base.in + j]);
      w[size_t(o * base.in + j)] = float(double(w[size_t(o * base.in + j)]) + double(ad.scaling) * d);
    }
  return w;
}

}  // namespace

std::vector<float> normal_map(float offset) {
  const std::vector<float> pos = linspace_f32(offset, 0.5f, 9), neg = linspace_f32(offset, 0.5f, 8);
  std::vector<double> v = {0.0};
  for (int i = 0; i < 8; i++) v.push_back(normal_ppf(double(pos[size_t(i)])));
  for (int i = 0; i < 7; i++) v.push_back(-normal_ppf(double(neg[size_t(i)])));
  std::sort(v.begin(), v.end());
  std::vector<float> out;
  for (double x : v) out.push_back(float(double(float(x)) / double(float(v.back()))));
  return out;
}

Nf4 quantize(const float* w, int64_t n) {
  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<float> absmax(static_cast<size_t>(blocks), 0.0f);
  for (int64_t i = 0; i < n; i++) absmax[size_t(i / kBlock)] = std::max(absmax[size_t(i / kBlock)], std::fabs(w[i]));
  Nf4 q;
  q.packed.resize(size_t((n + 1) / 2));
  for (int64_t i = 0; i < n; i++) {
    const double m = absmax[size_t(i / kBlock)];
    const int level = nearest_scan(code, m > 0 ? double(w[i]) / m : 0.0);
    uint8_t& byte = q.packed[size_t(i / 2)];
    byte = i % 2 == 0 ? uint8_t((byte & 0x0F) | (level << 4)) : uint8_t((byte & 0xF0) | level);
  }
  long double sum = 0;
  for (float a : absmax) sum += a;
  q.offset = blocks ? float(sum / blocks) : 0.0f;
  const int64_t groups = (blocks + kBlock2 - 1) / kBlock2;
  q.absmax2.assign(size_t(groups), 0.0f);
  for (int64_t b = 0; b < blocks; b++) q.absmax2[size_t(b / kBlock2)] = std::max(q.absmax2[size_t(b / kBlock2)], std::fabs(absmax[size_t(b)] - q.offset));
  for (int64_t b = 0; b < blocks; b++) {
    const double m = q.absmax2[size_t(b / kBlock2)];
    q.absmax_q.push_back(uint8_t(nearest_scan(code8, m > 0 ? double(absmax[size_t(b)] - q.offset) / m : 0.0)));
  }
  return q;
}

void dequantize(const Nf4& q, int64_t n, float* out) {
  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();
  for (int64_t i = 0; i < n; i++) {
    const int64_t b = i / kBlock;
    const float a = float(double(code8[q.absmax_q[size_t(b)]]) * double(q.absmax2[size_t(b / kBlock2)]) + double(q.offset));
    const uint8_t byte = q.packed[size_t(i / 2)];
    out[i] = code[size_t(i % 2 == 0 ? byte >> 4 : byte & 0x0F)] * a;
  }
}

void lora_forward(const Frozen& base, const Adapter& ad, const float* x, int64_t N, float* y) {
  const std::vector<float> w = merged(base, ad);
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < base.out; o++) {
      double s = base.bias ? double(base.bias[o]) : 0.0;
      for (int64_t j = 0; j < base.in; j++) s += double(x[i * base.in + j]) * double(w[size_t(o * base.in + j)]);
      y[i * base.out + o] = float(s);
    }
}

void lora_backward(const Frozen& base, const Adapter& ad, const float* x, const float* dy, int64_t N, float* dx, float* dA, float* dB) {
  const int64_t in = base.in, out = base.out, r = ad.r;
  for (int64_t k = 0; k < r; k++) {
    // h_k = x A_kᵀ and g_k = scaling · dy B_k, per row
    std::vector<double> h(static_cast<size_t>(N)), g(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) {
      double hs = 0, gs = 0;
      for (int64_t j = 0; j < in; j++) hs += double(x[i * in + j]) * double(ad.A[k * in + j]);
      for (int64_t o = 0; o < out; o++) gs += double(dy[i * out + o]) * double(ad.B[o * r + k]);
      h[size_t(i)] = hs, g[size_t(i)] = double(ad.scaling) * gs;
    }
    for (int64_t o = 0; o < out; o++) {
      double s = 0;
      for (int64_t i = 0; i < N; i++) s += double(dy[i * out + o]) * h[size_t(i)];
      dB[o * r + k] += float(double(ad.scaling) * s);
    }
    for (int64_t j = 0; j < in; j++) {
      double s = 0;
      for (int64_t i = 0; i < N; i++) s += g[size_t(i)] * double(x[i * in + j]);
      dA[k * in + j] += float(s);
    }
  }
  if (!dx) return;
  const std::vector<float> w = merged(base, ad);  // dx = dy (W + s·BA)
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < in; j++) {
      double s = 0;
      for (int64_t o = 0; o < out; o++) s += double(dy[i * out + o]) * double(w[size_t(o * in + j)]);
      dx[i * in + j] = float(s);
    }
}

}  // namespace lab10

extern "C" Lab10Plugin distlab_lab10 = {kLab10Abi, lab10::normal_map, lab10::quantize, lab10::dequantize, lab10::lora_forward,
                                        lab10::lora_backward};
