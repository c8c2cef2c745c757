// Storage types. Arithmetic on the CPU is done in f32; bf16 and f16 are storage formats whose conversions
// round to nearest, ties to even — the same bits PyTorch produces, so safetensors files match exactly.
// u8 holds bytes that are not numbers to compute with: QLoRA's 4-bit weights, two indices a byte, and their
// 8-bit constants (core/nn/qlora.h). It converts to and from f32 as the integers 0..255, exactly, so the code
// that moves tensors as f32 (a checkpoint, a broadcast) carries them bit for bit.
#pragma once
#include <cstdint>
#include <vector>
#include <string>

namespace distlab {

enum class DType { f32, bf16, f16, u8 };

int dtype_size(DType t);                       // bytes per element
const char* dtype_name(DType t);               // "f32", "bf16", "f16", "u8"
const char* dtype_safetensors_name(DType t);   // "F32", "BF16", "F16", "U8"
DType parse_dtype(const std::string& s);       // accepts f32/fp32/float32, bf16/bfloat16, f16/fp16/float16, U8
// A float type for values to compute with (f32, bf16, f16; not u8): precision.mode and --save's dtype
DType parse_float_dtype(const std::string& s);

// bf16 keeps the top 16 bits of an f32 (8-bit exponent, 7-bit mantissa). NaN stays a quiet NaN.
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
// IEEE half: 5-bit exponent, 10-bit mantissa; overflow -> inf, small values -> subnormals -> 0.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Converts n elements between storage types (src and dst may not overlap). To u8: rounded, clamped to 0..255.
void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);
// n values of type t as f32, in a vector of their own (empty for nullptr): the cpu's 16-bit kernel forms
// widen their operands with it, run the f32 kernel and convert the result back once
std::vector<float> widened(const void* src, DType t, int64_t n);

// The f32 value nearest to what storing v as `t` and reading it back gives (v itself for f32): fp16 turns
// 65520 and above into inf and 2^-25 and below into 0; bf16 keeps f32's range and drops 16 mantissa bits.
float round_to(float v, DType t);
// dst[i] = round_to(src[i], t); src and dst may be the same.
void round_f32(const float* src, float* dst, int64_t n, DType t);
// The largest finite value and the smallest positive (subnormal) value of a type: f16 65504 and 2^-24.
float dtype_max(DType t);
float dtype_min_subnormal(DType t);

}  // namespace distlab
