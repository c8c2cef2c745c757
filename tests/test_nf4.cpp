// QLoRA's NF4 weights in bitsandbytes' layout (core/ops/cpu/nf4.h): the code book built from N(0, 1)'s
// quantiles against bitsandbytes' published table, the dynamic 8-bit map's shape, every weight rounded to
// its nearest level within the code book's bound, double quantization's error on the constants, the
// memory a weight costs (the paper's 4.127 bits) and the packing of two indices a byte.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "core/ops/cpu/nf4.h"
#include "core/util/error.h"

using namespace distlab;

namespace {

// bitsandbytes' NF4 table (bitsandbytes/functional.py, get_4bit_type("nf4"); the QLoRA paper's appendix E)
constexpr double kBitsandbytesNf4[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                                         -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                                         0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                         0.7229568362236023, 1.0};

std::vector<float> normal_weights(int64_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& x : w) x = d(rng);
  return w;
}

// half the gap between a level and its farther neighbour: the most a value rounded to it can be off
double half_gap(const float* code, int n, int k) {
  const double below = k > 0 ? code[k] - code[k - 1] : 0, above = k + 1 < n ? code[k + 1] - code[k] : 0;
  return std::max(below, above) / 2;
}

}  // namespace

TEST_CASE("NF4: the 16 levels are N(0, 1)'s quantiles as bitsandbytes builds them, and the dynamic 8-bit map", "[nf4]") {
  const auto& code = nf4_code();
  for (int i = 0; i < 16; i++) {
    INFO("level " << i);
    CHECK(code[size_t(i)] == Approx(kBitsandbytesNf4[i]).margin(2e-7));
  }
  CHECK(code[7] == 0.0f);  // zero exact
  CHECK(code[0] == -1.0f);
  CHECK(code[15] == 1.0f);
  for (int i = 1; i < 16; i++) CHECK(code[size_t(i)] > code[size_t(i - 1)]);
  // the dynamic map: 256 sorted values, 0 and 1 among them, the rest in ± pairs (7 decades of 2^i fractions)
  const auto& d8 = dynamic8_code();
  for (int i = 1; i < 256; i++) CHECK(d8[size_t(i)] >= d8[size_t(i - 1)]);
  CHECK(d8[255] == 1.0f);
  CHECK(d8[0] == Approx(-(0.9859375 + 1.0) / 2));  // the largest fraction of the top decade, negated
  CHECK(std::count(d8.begin(), d8.end(), 0.0f) == 1);
  int pairs = 0;
  for (float v : d8)
    if (v > 0 && v < 1) pairs += std::count(d8.begin(), d8.end(), -v) == 1;
  CHECK(pairs == 127);
  CHECK(d8[128] == Approx(5.5e-7));  // the smallest positive value: 10^-6 × the mean of 0.1 and 1
  // nearest_code: the nearer neighbour, the lower on a tie, clamped at the ends
  const float three[] = {-1.0f, 0.0f, 1.0f};
  CHECK(nearest_code(three, 3, -0.6f) == 0);
  CHECK(nearest_code(three, 3, -0.5f) == 0);
  CHECK(nearest_code(three, 3, 0.4f) == 1);
  CHECK(nearest_code(three, 3, 7.0f) == 2);
  CHECK(nearest_code(three, 3, -7.0f) == 0);
}

TEST_CASE("NF4: every weight goes to its nearest level, off by at most half a gap times its block's absmax", "[nf4]") {
  const int64_t n = 64 * 37 + 21;  // a last block of 21, an odd count
  const std::vector<float> w = normal_weights(n, 0.02f, 7);
  std::vector<uint8_t> q(static_cast<size_t>((n + 1) / 2));
  std::vector<float> absmax(static_cast<size_t>((n + 63) / 64)), back(static_cast<size_t>(n));
  nf4_quantize(w.data(), n, 64, q.data(), absmax.data());
  nf4_dequantize(q.data(), absmax.data(), n, 64, back.data());
  const float* code = nf4_code().data();
  for (int64_t i = 0; i < n; i++) {
    const int level = i % 2 == 0 ? q[size_t(i / 2)] >> 4 : q[size_t(i / 2)] & 0xF;  // the first of a pair: the high nibble
    const double a = absmax[size_t(i / 64)], x = w[size_t(i)] / a;
    INFO("weight " << i << " = " << w[size_t(i)] << ", level " << level);
    CHECK(back[size_t(i)] == code[level] * absmax[size_t(i / 64)]);
    for (int k = 0; k < 16; k++) CHECK(std::fabs(x - code[level]) <= std::fabs(x - code[k]) + 1e-6);  // the nearest
    CHECK(std::fabs(w[size_t(i)] - back[size_t(i)]) <= half_gap(code, 16, level) * a * (1 + 1e-6));
  }
  // each block's largest magnitude comes back exactly (it is ±1 × absmax)
  for (int64_t b = 0; b < int64_t(absmax.size()); b++) {
    int64_t at = b * 64;
    for (int64_t i = b * 64; i < std::min(n, b * 64 + 64); i++)
      if (std::fabs(w[size_t(i)]) > std::fabs(w[size_t(at)])) at = i;
    CHECK(back[size_t(at)] == w[size_t(at)]);
  }
  // quantizing what came back gives the same bytes (a saved model loads back bitwise)
  std::vector<uint8_t> q2(q.size());
  std::vector<float> absmax2(absmax.size());
  nf4_quantize(back.data(), n, 64, q2.data(), absmax2.data());
  CHECK(q2 == q);
  CHECK(absmax2 == absmax);
  // a block of zeros: absmax 0, every index the zero level, zeros back
  std::vector<float> zeros(64, 0.0f), out(64, 1.0f);
  std::vector<uint8_t> zq(32);
  float za = -1;
  nf4_quantize(zeros.data(), 64, 64, zq.data(), &za);
  nf4_dequantize(zq.data(), &za, 64, 64, out.data());
  CHECK(za == 0.0f);
  CHECK(zq[0] == 0x77);
  CHECK(out == zeros);
  CHECK_THROWS_AS(nf4_quantize(zeros.data(), 64, 0, zq.data(), &za), Error);
}

TEST_CASE("NF4 with double quantization: the constants within the 8-bit code's bound, 4.127 bits a weight", "[nf4]") {
  const int64_t n = 64 * 256 * 12;  // 12 blocks of 256 constants
  const std::vector<float> w = normal_weights(n, 0.02f, 11);
  const Nf4Weights single = nf4_quantize_weights(w.data(), n, false), dq = nf4_quantize_weights(w.data(), n, true);
  REQUIRE(single.absmax.size() == size_t(n / 64));
  REQUIRE(dq.absmax_q.size() == size_t(n / 64));
  REQUIRE(dq.absmax2.size() == 12);
  CHECK(dq.packed == single.packed);  // the 4-bit indices are the same: only the constants are compressed
  double mean = 0;
  for (float a : single.absmax) mean += a;
  CHECK(dq.offset == Approx(mean / double(single.absmax.size())));
  const std::vector<float> back = nf4_absmax(dq);
  const float* d8 = dynamic8_code().data();
  for (size_t b = 0; b < back.size(); b++) {
    INFO("constant " << b);
    const double bound = half_gap(d8, 256, dq.absmax_q[b]) * dq.absmax2[b / 256];
    CHECK(std::fabs(back[b] - single.absmax[b]) <= bound * (1 + 1e-5) + 1e-9);
  }
  // the weights: a level times a constant that is itself off by that bound
  std::vector<float> wq(static_cast<size_t>(n));
  nf4_dequantize_weights(dq, wq.data());
  const float* code = nf4_code().data();
  for (int64_t i = 0; i < n; i += 97) {
    const int level = i % 2 == 0 ? dq.packed[size_t(i / 2)] >> 4 : dq.packed[size_t(i / 2)] & 0xF;
    CHECK(wq[size_t(i)] == code[level] * back[size_t(i / 64)]);
  }
  // memory: 4 bits + 8/64 + 32/(64·256) a weight, plus the one f32 offset: the paper's 4.127 bits
  CHECK(dq.bytes() == n / 2 + n / 64 + 4 * 12 + 4);
  CHECK(8.0 * double(dq.bytes()) / double(n) == Approx(4.0 + 8.0 / 64 + 32.0 / (64 * 256)).epsilon(1e-4));
  CHECK(8.0 * double(single.bytes()) / double(n) == Approx(4.5));  // f32 constants: half a bit more
}
