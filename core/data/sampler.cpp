#include "core/data/sampler.h"

#include <numeric>

#include "core/util/rng.h"

namespace distlab {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed);
  for (int64_t i = n - 1; i > 0; i--) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i) + 1))]);
  return p;
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), 0);
  return p;
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return seeded_permutation(n_, seed_ + uint64_t(epoch));
}

}  // namespace distlab
