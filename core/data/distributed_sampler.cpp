#include "core/data/distributed_sampler.h"

#include <fmt/format.h>

#include <numeric>

#include "core/util/error.h"

namespace distlab {

DistributedSampler::DistributedSampler(int64_t n, int replicas, int rank, bool shuffle, uint64_t seed, bool drop_last)
    : n_(n), replicas_(replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (replicas < 1 || rank < 0 || rank >= replicas)
    throw ConfigError(fmt::format("DistributedSampler: rank {} is not in 0..{}", rank, replicas - 1));
  num_samples_ = drop_last ? n / replicas : (n + replicas - 1) / replicas;
  total_size_ = num_samples_ * replicas;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (shuffle_) all = seeded_permutation(n_, seed_ + uint64_t(epoch));
  else {
    all.resize(size_t(n_));
    std::iota(all.begin(), all.end(), 0);
  }
  if (drop_last_) {
    all.resize(size_t(total_size_));
  } else if (n_ > 0) {
    for (int64_t i = 0; int64_t(all.size()) < total_size_; i++) all.push_back(all[size_t(i % n_)]);  // wrap around
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank_; i < total_size_; i += replicas_) mine.push_back(all[size_t(i)]);
  return mine;
}

}  // namespace distlab
