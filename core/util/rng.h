// A small, portable random number generator. std::mt19937 is portable but std's distributions are not
// (their outputs differ between standard libraries), so the distributions are written here: the same seed
// gives the same numbers on every machine, which is what "deterministic by default" needs.
#pragma once
#include <cmath>
#include <cstdint>

namespace distlab {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    // splitmix64 expands the seed into the xoshiro256** state
    uint64_t z = seed;
    for (auto& s : s_) {
      z += 0x9e3779b97f4a7c15ULL;
      uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
      s = x ^ (x >> 31);
    }
    has_spare_ = false;
  }
  uint64_t next_u64() {  // xoshiro256**
    uint64_t result = rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // uniform in [0, 1) with 24 random bits, exactly representable as float
  float uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // uniform integer in [0, n) without modulo bias
  uint64_t below(uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
      uint64_t r = next_u64();
      if (r >= threshold) return r % n;
    }
  }
  float normal() {  // Box-Muller in double, cached pair
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
    double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = float(r * std::sin(2.0 * M_PI * u2));
    has_spare_ = true;
    return float(r * std::cos(2.0 * M_PI * u2));
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  bool has_spare_ = false;
  float spare_ = 0;
};

}  // namespace distlab
