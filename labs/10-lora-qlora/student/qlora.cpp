// Lab 10 — LoRA and QLoRA: NF4's code book, a weight in 4.127 bits (blockwise absmax, double
// quantization), and LoRA's forward and backward on a frozen 4-bit Linear.
#include <cmath>
#include <cstring>

#include <stdexcept>

#include "labs/10-lora-qlora/api.h"

namespace lab10 {

namespace {

// The index of the value of a sorted code nearest to x; halfway between two, the lower one.
int nearest(const std::vector<float>& code, float x) {
  // TODO(10-lora-qlora): implement nearest. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: nearest is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

// Blockwise absmax quantization onto `code`: each block's largest magnitude into absmax[b], each value
// divided by it (times its reciprocal, as bitsandbytes does) and rounded to the nearest level; a block of
// zeros has absmax 0 and every index at the code's 0.
template <class Store>
void quantize_blocks(const float* x, int64_t n, int64_t block, const std::vector<float>& code, float* absmax, Store store) {
  // TODO(10-lora-qlora): implement quantize_blocks. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: quantize_blocks is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

// y (N, out) += scale · x (N, k) · Wᵀ, W (out, k) row-major
void matmul_t(float* y, const float* x, const float* w, int64_t N, int64_t k, int64_t out, float scale) {
  // TODO(10-lora-qlora): implement matmul_t. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: matmul_t is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

}  // namespace

std::vector<float> normal_map(float offset) {
  // TODO(10-lora-qlora): implement normal_map. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: normal_map is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

Nf4 quantize(const float* w, int64_t n) {
  // TODO(10-lora-qlora): implement quantize. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: quantize is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

void dequantize(const Nf4& q, int64_t n, float* out) {
  // TODO(10-lora-qlora): implement dequantize. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: dequantize is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

void lora_forward(const Frozen& base, const Adapter& ad, const float* x, int64_t N, float* y) {
  // TODO(10-lora-qlora): implement lora_forward. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: lora_forward is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

void lora_backward(const Frozen& base, const Adapter& ad, const float* x, const float* dy, int64_t N, float* dx, float* dA, float* dB) {
  // TODO(10-lora-qlora): implement lora_backward. Read labs/10-lora-qlora/README.md.
  throw std::logic_error("10-lora-qlora: lora_backward is not implemented yet: "
                         "fill in the TODO in labs/10-lora-qlora/student/qlora.cpp");
}

}  // namespace lab10

extern "C" Lab10Plugin distlab_lab10 = {kLab10Abi, lab10::normal_map, lab10::quantize, lab10::dequantize, lab10::lora_forward,
                                        lab10::lora_backward};
