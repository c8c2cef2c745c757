// NF4 and bitsandbytes' blockwise 8-bit quantization on the CPU. See nf4.h for the format.
#include "core/ops/cpu/nf4.h"

#include <algorithm>
#include <cmath>

#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// The inverse of N(0, 1)'s CDF (what scipy's norm.ppf gives bitsandbytes): Acklam's rational
// approximation (relative error 1.15e-9), then one Halley step on the exact CDF, erfc, to full double precision.
double normal_ppf(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
                             -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
                             4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
  DL_ASSERT(p > 0 && p < 1, "normal_ppf outside (0, 1)");
  const double lo = 0.02425;
  double x;
  if (p < lo) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - lo) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;  // Halley's step
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// torch.linspace(start, end, steps) in float32, as PyTorch computes it (each half from its own end)
std::vector<float> linspace_f32(float start, float end, int steps) {
  std::vector<float> v(static_cast<size_t>(steps));
  const float step = (end - start) / float(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; i++) v[size_t(i)] = i < halfway ? start + step * float(i) : end - step * float(steps - i - 1);
  return v;
}

}  // namespace

// bitsandbytes' create_normal_map(offset, use_extra_value = True): 8 positive levels from the quantiles at
// 9 points from offset down to ½ (the last, 0, dropped), 7 negative ones from 8, and 0; scaled to [-1, 1]
std::array<float, 16> normal_map(float offset) {
  std::vector<float> v;
  const std::vector<float> pos = linspace_f32(offset, 0.5f, 9), neg = linspace_f32(offset, 0.5f, 8);
  for (int i = 0; i < 8; i++) v.push_back(float(normal_ppf(pos[size_t(i)])));
  for (int i = 0; i < 7; i++) v.push_back(float(-normal_ppf(neg[size_t(i)])));
  v.push_back(0.0f);
  std::sort(v.begin(), v.end());
  const float top = v.back();
  std::array<float, 16> out{};
  for (int i = 0; i < 16; i++) out[size_t(i)] = v[size_t(i)] / top;
  return out;
}

namespace {

std::array<float, 256> make_dynamic8() {
  // bitsandbytes' create_dynamic_map(signed = True, max_exponent_bits = 7, total_bits = 8): for exponent
  // i = 0..6, 2^i fractions (the means of 2^i + 1 points from 0.1 to 1) times 10^(i − 6), both signs; 0; 1
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
  DL_ASSERT(v.size() == 256, "the dynamic map has 256 values");
  std::sort(v.begin(), v.end());
  std::array<float, 256> out{};
  std::copy(v.begin(), v.end(), out.begin());
  return out;
}

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

void check_block(int64_t n, int64_t block, const char* what) {
  if (n < 0 || block <= 0)
    throw Error(std::string(what) + ": " + std::to_string(n) + " values in blocks of " + std::to_string(block), "a block holds at least one value");
}

// Blockwise absmax over a code: each value divided by its block's largest magnitude, then the nearest code
template <class Store>
void quantize_blocks(const float* x, int64_t n, int64_t block, const float* code, int levels, int zero_index, float* absmax, Store store) {
  for (int64_t b = 0; b < blocks_of(n, block); b++) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    float m = 0;
    for (int64_t i = lo; i < hi; i++) m = std::max(m, std::fabs(x[i]));
    absmax[b] = m;
    const float inv = m > 0 ? 1.0f / m : 0.0f;  // bitsandbytes multiplies by the reciprocal
    for (int64_t i = lo; i < hi; i++) store(i, m > 0 ? nearest_code(code, levels, x[i] * inv) : zero_index);
  }
}

}  // namespace

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code = normal_map(kNf4Offset);
  return code;
}

const std::array<float, 256>& dynamic8_code() {
  static const std::array<float, 256> code = make_dynamic8();
  return code;
}

int nearest_code(const float* code, int n, float x) {
  // the first value ≥ x, then whichever of it and the one below is nearer (the lower on a tie)
  const int hi = int(std::lower_bound(code, code + n, x) - code);
  if (hi == 0) return 0;
  if (hi == n) return n - 1;
  return x - code[hi - 1] <= code[hi] - x ? hi - 1 : hi;
}

void nf4_quantize(const float* x, int64_t n, int64_t block, uint8_t* q, float* absmax) {
  check_block(n, block, "nf4_quantize");
  std::fill(q, q + (n + 1) / 2, uint8_t(0));
  quantize_blocks(x, n, block, nf4_code().data(), 16, 7, absmax, [&](int64_t i, int level) {
    q[i / 2] |= uint8_t(i % 2 == 0 ? level << 4 : level);  // the first of a pair in the high nibble
  });
}

void nf4_dequantize(const uint8_t* q, const float* absmax, int64_t n, int64_t block, float* out) {
  check_block(n, block, "nf4_dequantize");
  const float* code = nf4_code().data();
  for (int64_t i = 0; i < n; i++) {
    const int level = i % 2 == 0 ? q[i / 2] >> 4 : q[i / 2] & 0xF;
    out[i] = code[level] * absmax[i / block];
  }
}

void dynamic8_quantize(const float* x, int64_t n, int64_t block, uint8_t* q, float* absmax) {
  check_block(n, block, "dynamic8_quantize");
  const float* code = dynamic8_code().data();
  const int zero = int(std::find(code, code + 256, 0.0f) - code);
  quantize_blocks(x, n, block, code, 256, zero, absmax, [&](int64_t i, int level) { q[i] = uint8_t(level); });
}

void dynamic8_dequantize(const uint8_t* q, const float* absmax, int64_t n, int64_t block, float* out) {
  check_block(n, block, "dynamic8_dequantize");
  const float* code = dynamic8_code().data();
  for (int64_t i = 0; i < n; i++) out[i] = code[q[i]] * absmax[i / block];
}

int64_t Nf4Weights::bytes() const {
  return int64_t(packed.size() + absmax_q.size()) + 4 * int64_t(absmax.size() + absmax2.size()) + (double_quant ? 4 : 0);
}

Nf4Weights nf4_quantize_weights(const float* w, int64_t n, bool double_quant, int64_t block) {
  Nf4Weights q;
  q.numel = n;
  q.block = block;
  q.double_quant = double_quant;
  q.packed.resize(size_t((n + 1) / 2));
  std::vector<float> absmax(size_t(blocks_of(n, block)));
  nf4_quantize(w, n, block, q.packed.data(), absmax.data());
  if (!double_quant) {
    q.absmax = std::move(absmax);
    return q;
  }
  // bitsandbytes' compress_statistics: the constants less their mean, 8-bit in blocks of 256
  double sum = 0;
  for (float a : absmax) sum += a;
  q.offset = absmax.empty() ? 0.0f : float(sum / double(absmax.size()));
  for (float& a : absmax) a -= q.offset;
  q.absmax_q.resize(absmax.size());
  q.absmax2.resize(size_t(blocks_of(int64_t(absmax.size()), q.block2)));
  dynamic8_quantize(absmax.data(), int64_t(absmax.size()), q.block2, q.absmax_q.data(), q.absmax2.data());
  return q;
}

std::vector<float> nf4_absmax(const Nf4Weights& q) {
  if (!q.double_quant) return q.absmax;
  std::vector<float> absmax(q.absmax_q.size());
  dynamic8_dequantize(q.absmax_q.data(), q.absmax2.data(), int64_t(absmax.size()), q.block2, absmax.data());
  for (float& a : absmax) a += q.offset;
  return absmax;
}

void nf4_dequantize_weights(const Nf4Weights& q, float* out) {
  const std::vector<float> absmax = nf4_absmax(q);
  nf4_dequantize(q.packed.data(), absmax.data(), q.numel, q.block, out);
}

void dequantize_nf4(Runtime& rt, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                    int64_t n, int64_t block, int64_t block2) {
  if (rt.kernels) return rt.kernels->dequantize_nf4(rt, out, packed, absmax_q, absmax, offset, n, block, block2);
  // reads half a byte a weight and a byte a block, writes the weight in the compute dtype; not batch-sized
  OpScope op(rt, "dequantize_nf4", 2.0 * double(n), 0.5 * double(n) + double(blocks_of(n, block)) + double(n) * dtype_size(rt.dtype), false);
  if (rt.is_meta()) return;
  check_block(n, block, "dequantize_nf4");
  const float* code = nf4_code().data();
  const float* code8 = dynamic8_code().data();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks_of(n, block); b++) {
    float c = absmax[absmax_q ? b / block2 : b];
    if (absmax_q) {
      c = code8[absmax_q[b]] * c;  // two statements: no fused multiply-add, the bits of nf4_absmax
      c = c + offset;
    }
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); i++) {
      const int level = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
      out[i] = code[level] * c;
    }
  }
}

}  // namespace distlab
