#include "core/tensor/dtype.h"

#include <cstring>

#include "core/util/error.h"

namespace distlab {

int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32" || s == "F32") return DType::f32;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return DType::bf16;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "F16") return DType::f16;
  throw Error("unknown dtype '" + s + "'", "use one of f32, bf16, f16");
}

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN: keep sign, force quiet
  // round to nearest even: add 0x7fff plus the lowest kept bit, then truncate
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return uint16_t(u >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(uint32_t(h) << 16); }

uint16_t f32_to_f16(float f) {
  uint32_t u = bits_of(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {
    // result is subnormal (or zero): value = m * 2^-24, m = round(|f| * 2^24)
    if (absu < 0x33000000u) return uint16_t(sign);  // below half the smallest subnormal (2^-25): 0
    int e = int(absu >> 23);                         // biased f32 exponent, 102..112
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;  // 24-bit significand
    int shift = 126 - e;                             // (e-127) - 23 + 24 = e - 126 -> shift right
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  // normal: rebias exponent (127 -> 15), round mantissa from 23 to 10 bits, ties to even
  uint32_t v = absu - (112u << 23);
  uint32_t lsb = (v >> 13) & 1u;
  v += 0xfffu + lsb;
  return uint16_t(sign | (v >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return float_of(sign);
    // subnormal: mant * 2^-24
    float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

void convert(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, size_t(n) * dtype_size(st));
    return;
  }
  // go through f32
  auto load = [&](int64_t i) -> float {
    switch (st) {
      case DType::f32: return static_cast<const float*>(src)[i];
      case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    }
    return 0;
  };
  for (int64_t i = 0; i < n; i++) {
    float v = load(i);
    switch (dt) {
      case DType::f32: static_cast<float*>(dst)[i] = v; break;
      case DType::bf16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      case DType::f16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
    }
  }
}

}  // namespace distlab
