// Lab 10: everything your qlora.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your qlora.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own. The grader hands it weights to quantize, 4-bit weights to
// dequantize, and a LoRA layer's inputs to run forward and backward; it trains a small model whose every
// Linear is yours against the engine's QLoRA, and it measures, from outside your process, every byte that
// process holds.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lab10 {

// ---- given: the two pieces of numerics that are not the lesson, exactly as bitsandbytes computes them ----

// The inverse of N(0, 1)'s CDF (scipy.stats.norm.ppf), to double precision, for 0 < p < 1.
inline double normal_ppf(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
                             -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
                             4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - 0.02425) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;  // one Halley step on the exact CDF
  const double u = e * std::sqrt(2 * 3.14159265358979323846) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// torch.linspace(start, end, steps) in float32, as PyTorch computes it (each half from its own end)
inline std::vector<float> linspace_f32(float start, float end, int steps) {
  std::vector<float> v(static_cast<size_t>(steps));
  const float step = (end - start) / float(steps - 1);
  for (int i = 0; i < steps; i++) v[size_t(i)] = i < steps / 2 ? start + step * float(i) : end - step * float(steps - i - 1);
  return v;
}

// bitsandbytes' signed "dynamic" 8-bit code (create_dynamic_map), ascending, 256 values in [-1, 1]: for
// i = 0..6, the means of 2^i + 1 points from 0.1 to 1, times 10^(i − 6), both signs; then 0 and 1.
inline std::vector<float> dynamic8_code() {
  std::vector<float> v;
  for (int i = 0; i < 7; i++) {
    const std::vector<float> bounds = linspace_f32(0.1f, 1.0f, (1 << i) + 1);
    const float scale = float(std::pow(10.0, i - 6));
    for (size_t j = 0; j + 1 < bounds.size(); j++) {
      const float mean = (bounds[j] + bounds[j + 1]) / 2.0f;
      v.push_back(scale * mean);
      v.push_back(-(scale * mean));
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  std::sort(v.begin(), v.end());
  return v;
}

// ---- Task 1: the code book ----
// bitsandbytes' create_normal_map(offset, use_extra_value = True): 16 levels, ascending, −1 first, 0 exact
// at index 7, 1 last, from the normal quantiles at points spaced from `offset` down to ½ (README: how). The
// grader asks for other offsets than NF4's too.
std::vector<float> normal_map(float offset);
// NF4's levels: the paper's δ = 1 − ½(1/30 + 1/32). (Given: use it in quantize and dequantize.)
constexpr float kNf4Offset = 0.9677083f;
inline std::vector<float> nf4_code() { return normal_map(kNf4Offset); }

// ---- Task 2: a weight in 4.127 bits ----
constexpr int64_t kBlock = 64;    // weights per absmax
constexpr int64_t kBlock2 = 256;  // absmax constants per second-level absmax
struct Nf4 {
  std::vector<uint8_t> packed;    // (n + 1) / 2 bytes: each weight's level (0..15), two a byte, weight 2k in the high nibble
  std::vector<uint8_t> absmax_q;  // one per block of 64 weights: (its absmax − offset) as an index into dynamic8_code()
  std::vector<float> absmax2;     // one per 256 of those: the block's largest |absmax − offset|
  float offset = 0;               // the mean of all the blocks' absmax
};
// Quantizes n weights. Everything the weight is from now on is what this returns: nothing else may be kept.
Nf4 quantize(const float* w, int64_t n);
// out[i] = level(i) × its block's absmax, the absmax itself recovered as dynamic8[absmax_q] × absmax2 + offset
void dequantize(const Nf4& q, int64_t n, float* out);

// ---- Task 3: LoRA on a frozen 4-bit Linear (PEFT's LoraLayer on bitsandbytes' Linear4bit) ----
struct Frozen {
  const Nf4* weight;  // W (out, in), row-major, in 4 bits: never changed
  const float* bias;  // (out), or nullptr: never changed
  int64_t in, out;
};
struct Adapter {
  const float* A;  // (r, in)
  const float* B;  // (out, r)
  int64_t r;
  float scaling;   // alpha / r
};
// y (N, out) = x Wᵀ + bias + scaling · (x Aᵀ) Bᵀ, for x (N, in)
void lora_forward(const Frozen& base, const Adapter& ad, const float* x, int64_t N, float* y);
// Given dy (N, out): dA (r, in) and dB (out, r) ADD this batch's gradients to what they hold; dx (N, in)
// is written (nullptr: not needed, the first layer). W and the bias get no gradient.
void lora_backward(const Frozen& base, const Adapter& ad, const float* x, const float* dy, int64_t N, float* dx, float* dA, float* dB);

}  // namespace lab10

// The table the grader looks up in your plugin (defined at the bottom of qlora.cpp).
constexpr int kLab10Abi = 2;
struct Lab10Plugin {
  int abi;  // kLab10Abi
  std::vector<float> (*normal_map)(float);
  lab10::Nf4 (*quantize)(const float*, int64_t);
  void (*dequantize)(const lab10::Nf4&, int64_t, float*);
  void (*lora_forward)(const lab10::Frozen&, const lab10::Adapter&, const float*, int64_t, float*);
  void (*lora_backward)(const lab10::Frozen&, const lab10::Adapter&, const float*, const float*, int64_t, float*, float*, float*);
};
extern "C" Lab10Plugin distlab_lab10;
