// Lab 10's checks, what checks.cpp (the NF4 and layer checks) and training.cpp (the training run and the
// memory check) share: the 4-bit form as it crosses to the plugin, a drawn layer and its float64 reference,
// one call into the plugin.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "grader/bridge/sandbox.h"
#include "grader/check.h"

namespace distlab::grader::checks10 {

struct Nf4Wire {
  std::vector<uint8_t> packed, absmax_q;
  std::vector<float> absmax2;
  float offset = 0;
};

// A layer's drawn scenario and its float64 reference
struct LayerCase {
  int64_t N, in, out, r;
  bool bias;
  float scaling;
  std::vector<float> w, x, A, B, b, dy, dA0, dB0;
  std::vector<double> y, dx, dA, dB;
};

void append(std::vector<char>& out, const void* p, size_t bytes);
void append(std::vector<char>& out, const std::vector<float>& v);
std::vector<char> to_wire(const Nf4Wire& q);
// An Nf4 as the plugin returned it; nullopt when its sizes do not add up
std::optional<Nf4Wire> from_wire(const std::vector<char>& b);
std::vector<float> as_floats(const std::vector<char>& b, size_t at, size_t n);
Nf4Wire engine_nf4(const std::vector<float>& w);
std::vector<float> engine_dequantize(const Nf4Wire& q, int64_t n);
// sqrt(mean((a - b)²)) over two vectors of one size
double rms_error(const std::vector<float>& a, const std::vector<float>& b);
std::vector<float> drawn(std::mt19937_64& rng, int64_t n, float sigma);
// One call into the plugin: its outputs, or a CheckAbort saying what went wrong during `during`.
std::vector<char> call(CheckContext& ctx, PluginProcess& p, labproto::Fn fn, std::initializer_list<int64_t> args, const std::vector<char>& in,
                       uint64_t max_bytes, const std::string& during);
// c's y, dx, dA and dB in float64, for the frozen weight W (out, in) as the layer sees it
void reference(LayerCase& c, const std::vector<float>& W);
// "" when got is within 1e-5 of want (relative to want's largest magnitude), else where it is not
std::string compare(const std::vector<float>& got, size_t at, const std::vector<double>& want, const char* name);

// training.cpp's checks
CheckResult qlora_trains_as_engine(CheckContext& ctx);
CheckResult qlora_8b_on_24gb(CheckContext& ctx);

}  // namespace distlab::grader::checks10
