// QLoRA's 4-bit weights (Dettmers et al., 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", §3), in
// bitsandbytes' layout, so that a base model quantized here is the one a QLoRA user has:
//   - NormalFloat4 (NF4): 16 levels, the quantiles of N(0, 1) scaled to [-1, 1], zero exact: 8 positive
//     levels from the quantiles at 9 points evenly spaced from δ = 1 - ½(1/30 + 1/32) down to ½, 7 negative
//     ones from 8 such points, then all divided by the largest;
//   - blockwise absmax: each 64 weights are divided by their largest magnitude, then rounded to the nearest
//     level (on a tie, the lower one); two 4-bit indices a byte, the first in the high nibble;
//   - double quantization: the absmax constants, less their mean, are quantized again to 8 bits in blocks of
//     256 with bitsandbytes' signed "dynamic" code (an exponent and a shrinking fraction,
//     create_dynamic_map), each block with an f32 absmax of its own.
// A weight then costs 4 + 8/64 + 32/(64·256) = 4.127 bits (the paper's 0.127 bits of constants).
// Dequantizing gives back level × absmax: the error of a weight is at most half the gap between the two
// levels around it, times its block's absmax.
// Read next: core/nn/qlora.h (a QLoRA layer's base weight: quantized once, dequantized for each GEMM).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace distlab {

struct Runtime;

// bitsandbytes' create_normal_map(offset, use_extra_value = True): 16 levels, ascending, [7] == 0, [0] == -1,
// [15] == 1. NF4's are normal_map(kNf4Offset), the paper's δ = 1 − ½(1/30 + 1/32)
constexpr float kNf4Offset = 0.9677083f;
std::array<float, 16> normal_map(float offset);
const std::array<float, 16>& nf4_code();        // normal_map(kNf4Offset), computed once
const std::array<float, 256>& dynamic8_code();  // bitsandbytes' signed dynamic map, ascending, in [-1, 1]

// Index of the code value nearest to x (a sorted code; a tie goes to the lower one)
int nearest_code(const float* code, int n, float x);

// Blockwise absmax quantization of n values: q holds ceil(n/2) bytes (NF4) or n bytes (8-bit), absmax
// ceil(n/block) f32 constants. A block of zeros has absmax 0 and dequantizes to zeros.
void nf4_quantize(const float* x, int64_t n, int64_t block, uint8_t* q, float* absmax);
void nf4_dequantize(const uint8_t* q, const float* absmax, int64_t n, int64_t block, float* out);
void dynamic8_quantize(const float* x, int64_t n, int64_t block, uint8_t* q, float* absmax);
void dynamic8_dequantize(const uint8_t* q, const float* absmax, int64_t n, int64_t block, float* out);

// A tensor's NF4 state, as bitsandbytes' Params4bit keeps it with compress_statistics (double quantization).
struct Nf4Weights {
  int64_t numel = 0, block = 64, block2 = 256;
  bool double_quant = true;
  std::vector<uint8_t> packed;    // ceil(numel/2): the 4-bit indices
  std::vector<float> absmax;      // without double quantization: ceil(numel/block) constants
  std::vector<uint8_t> absmax_q;  // with it: the constants less `offset`, 8-bit indices into dynamic8_code()
  std::vector<float> absmax2;     // with it: one f32 per block2 constants
  float offset = 0;               // with it: the constants' mean
  int64_t bytes() const;          // what it holds: packed + constants
};
Nf4Weights nf4_quantize_weights(const float* w, int64_t n, bool double_quant = true, int64_t block = 64);
void nf4_dequantize_weights(const Nf4Weights& q, float* out);  // numel values
std::vector<float> nf4_absmax(const Nf4Weights& q);             // the block constants, double quantization undone

// The kernel a QLoRA layer runs before each GEMM (bitsandbytes' dequantize_4bit), on the rank's device:
//   out[i] = nf4[level i] × c[i / block],  c[b] = absmax[b]                                (absmax_q null)
//                                          c[b] = dynamic8[absmax_q[b]] × absmax[b / block2] + offset
// n values (out in f32; the layer rounds them to the compute dtype). The same products in the same order as
// nf4_dequantize_weights, so every device gives the same bits.
void dequantize_nf4(Runtime& rt, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                    int64_t n, int64_t block, int64_t block2);

}  // namespace distlab
