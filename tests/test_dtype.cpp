#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/tensor/dtype.h"
#include "core/tensor/runtime.h"

using namespace distlab;

static float f_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

TEST_CASE("bf16 rounds to nearest even on known bit patterns", "[dtype]") {
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(-2.0f) == 0xc000);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 (0x3f80) and 1.0078125 (0x3f81): ties to even -> 0x3f80
  CHECK(f32_to_bf16(f_of(0x3f808000)) == 0x3f80);
  // halfway above an odd mantissa rounds up to even
  CHECK(f32_to_bf16(f_of(0x3f818000)) == 0x3f82);
  // just above halfway rounds up
  CHECK(f32_to_bf16(f_of(0x3f808001)) == 0x3f81);
  CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(f32_to_bf16(3.4028235e38f) == 0x7f80);  // max float rounds to inf in bf16
  uint16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_f32(nan)));
  CHECK(bf16_to_f32(0x4049) == 3.140625f);
}

TEST_CASE("f16 rounds to nearest even, with subnormals and overflow", "[dtype]") {
  CHECK(f32_to_f16(1.0f) == 0x3c00);
  CHECK(f32_to_f16(-2.0f) == 0xc000);
  CHECK(f32_to_f16(65504.0f) == 0x7bff);          // largest half
  CHECK(f32_to_f16(65519.0f) == 0x7bff);          // below the midpoint to inf
  CHECK(f32_to_f16(65520.0f) == 0x7c00);          // the midpoint ties to even: inf
  CHECK(f32_to_f16(1e6f) == 0x7c00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // half of it ties to even: 0
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);  // above half rounds up
  CHECK(f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 subnormal units: tie to even 2
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // halfway: even
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // halfway above odd: up
  CHECK(f32_to_f16(0.1f) == 0x2e66);
  CHECK(f16_to_f32(0x2e66) == 0.0999755859375f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(f16_to_f32(0x7c00)));
  CHECK(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("every f16 and bf16 value survives a round trip through f32", "[dtype]") {
  for (uint32_t h = 0; h < 65536; h++) {
    uint16_t v = uint16_t(h);
    float f = f16_to_f32(v);
    if (!std::isnan(f)) REQUIRE(f32_to_f16(f) == v);
    float g = bf16_to_f32(v);
    if (!std::isnan(g)) REQUIRE(f32_to_bf16(g) == v);
  }
}

TEST_CASE("a slice views its tensor's storage: counted once, alive while any view is, bounds checked", "[dtype][tensor]") {
  Runtime rt;
  Tensor flat = rt.empty({10}, Category::params, "flat", DType::bf16);  // a gathered flat vector, 16 bits
  flat.fill_(0.0f);
  Tensor w = flat.slice(4, {2, 3});  // a layer's weight: elements [4, 10)
  CHECK(w.numel() == 6);
  CHECK(w.shape() == Shape{2, 3});
  CHECK(static_cast<char*>(w.data()) == static_cast<char*>(flat.data()) + 8);
  w.fill_(1.5f);
  const auto* h = static_cast<const uint16_t*>(flat.data());
  CHECK(bf16_to_f32(h[3]) == 0.0f);
  CHECK(bf16_to_f32(h[4]) == 1.5f);
  CHECK(bf16_to_f32(h[9]) == 1.5f);
  CHECK(flat.slice(4, {6}).slice(1, {2}).data() == static_cast<char*>(flat.data()) + 10);  // a slice of a slice
  CHECK_THROWS(flat.slice(8, {3}));
  CHECK_THROWS(flat.slice(-1, {2}));
  CHECK(rt.memory.current(Category::params) == 20);
  flat = Tensor();  // the view keeps the storage
  CHECK(rt.memory.current(Category::params) == 20);
  w.release();  // the last one: freed
  CHECK(rt.memory.current(Category::params) == 0);
  CHECK(w.numel() == 6);  // the shape stays
}
