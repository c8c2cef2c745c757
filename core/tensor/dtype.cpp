#include "core/tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/util/error.h"

namespace distlab {

int dtype_size(DType t) { return t == DType::f32 ? 4 : t == DType::u8 ? 1 : 2; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::u8: return "u8";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::u8: return "U8";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32" || s == "F32") return DType::f32;
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return DType::bf16;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "F16") return DType::f16;
  if (s == "u8" || s == "uint8" || s == "U8") return DType::u8;
  throw Error("unknown dtype '" + s + "'", "use one of f32, bf16, f16");
}

DType parse_float_dtype(const std::string& s) {
  const DType t = parse_dtype(s);
  if (t == DType::u8) throw Error("dtype '" + s + "' holds bytes, not values to compute with", "use one of f32, bf16, f16");
  return t;
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

static inline uint16_t to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN: keep sign, force quiet
  // round to nearest even: add 0x7fff plus the lowest kept bit, then truncate
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return uint16_t(u >> 16);
}

static inline float from_bf16(uint16_t h) { return float_of(uint32_t(h) << 16); }

static inline uint16_t to_f16(float f) {
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

static inline float from_f16(uint16_t h) {
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

// the exported names; the loops below call the inline ones (a call through the PLT per value cost 20 %)
uint16_t f32_to_bf16(float f) { return to_bf16(f); }
float bf16_to_f32(uint16_t h) { return from_bf16(h); }
uint16_t f32_to_f16(float f) { return to_f16(f); }
float f16_to_f32(uint16_t h) { return from_f16(h); }

#if defined(__x86_64__)
// x86's F16C instructions convert 8 values at once, IEEE round-to-nearest-even with subnormals, inf and
// NaN as the scalar code (tests/test_dtype.cpp checks every f16 value and a sweep of f32 ones against it);
// every AVX2 machine has them. They make fp16 emulation cost about what bf16's does.
__attribute__((target("avx,f16c"))) static void to_f16_x8(const float* f, uint16_t* h, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) h[i] = to_f16(f[i]);
}
__attribute__((target("avx,f16c"))) static void from_f16_x8(const uint16_t* h, float* f, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; i++) f[i] = from_f16(h[i]);
}
static bool has_f16c() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("f16c"));
  return yes;
}
#else
static bool has_f16c() { return false; }
static void to_f16_x8(const float*, uint16_t*, int64_t) {}
static void from_f16_x8(const uint16_t*, float*, int64_t) {}
#endif

std::vector<float> widened(const void* src, DType t, int64_t n) {
  std::vector<float> v(src ? static_cast<size_t>(n) : 0);
  if (src) convert(src, t, v.data(), DType::f32, n);
  return v;
}

void convert(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, size_t(n) * dtype_size(st));
    return;
  }
  if (st == DType::u8 || dt == DType::u8) {  // bytes as the integers 0..255 (QLoRA's indices and constants)
    for (int64_t i = 0; i < n; i++) {
      float v = 0;
      if (st == DType::u8) v = float(static_cast<const uint8_t*>(src)[i]);
      else convert(static_cast<const char*>(src) + i * dtype_size(st), st, &v, DType::f32, 1);
      if (dt == DType::u8) static_cast<uint8_t*>(dst)[i] = uint8_t(std::clamp(std::nearbyint(v), 0.0f, 255.0f));
      else convert(&v, DType::f32, static_cast<char*>(dst) + i * dtype_size(dt), dt, 1);
    }
    return;
  }
  // one loop per pair: mixed precision converts at every op's boundary, so these run over every activation
  const auto* f = static_cast<const float*>(src);
  const auto* h = static_cast<const uint16_t*>(src);
  auto* fo = static_cast<float*>(dst);
  auto* ho = static_cast<uint16_t*>(dst);
  if (st == DType::f32 && dt == DType::bf16) {
    for (int64_t i = 0; i < n; i++) ho[i] = to_bf16(f[i]);
  } else if (st == DType::bf16 && dt == DType::f32) {
    for (int64_t i = 0; i < n; i++) fo[i] = from_bf16(h[i]);
  } else if (st == DType::f32 && dt == DType::f16) {
    if (has_f16c()) return to_f16_x8(f, ho, n);
    for (int64_t i = 0; i < n; i++) ho[i] = to_f16(f[i]);
  } else if (st == DType::f16 && dt == DType::f32) {
    if (has_f16c()) return from_f16_x8(h, fo, n);
    for (int64_t i = 0; i < n; i++) fo[i] = from_f16(h[i]);
  } else {  // bf16 <-> f16, through f32
    for (int64_t i = 0; i < n; i++) {
      const float v = st == DType::bf16 ? from_bf16(h[i]) : from_f16(h[i]);
      ho[i] = dt == DType::bf16 ? to_bf16(v) : to_f16(v);
    }
  }
}

float round_to(float v, DType t) {
  switch (t) {
    case DType::f32: return v;
    case DType::bf16: return from_bf16(to_bf16(v));
    case DType::f16: return from_f16(to_f16(v));
    case DType::u8: return std::clamp(std::nearbyint(v), 0.0f, 255.0f);
  }
  return v;
}

void round_f32(const float* src, float* dst, int64_t n, DType t) {
  if (t == DType::f32) {
    if (src != dst) std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  uint16_t tmp[256];
  for (int64_t at = 0; at < n; at += 256) {
    const int64_t m = std::min<int64_t>(256, n - at);
    convert(src + at, DType::f32, tmp, t, m);
    convert(tmp, t, dst + at, DType::f32, m);
  }
}

float dtype_max(DType t) {
  switch (t) {
    case DType::f32: return 3.40282347e38f;
    case DType::bf16: return from_bf16(0x7f7fu);  // 3.3895e38
    case DType::f16: return 65504.0f;
    case DType::u8: return 255.0f;
  }
  return 0;
}

float dtype_min_subnormal(DType t) {
  switch (t) {
    case DType::f32: return float_of(1u);       // 2^-149
    case DType::bf16: return from_bf16(1u);   // 2^-133
    case DType::f16: return from_f16(1u);     // 2^-24
    case DType::u8: return 1.0f;
  }
  return 0;
}

}  // namespace distlab
