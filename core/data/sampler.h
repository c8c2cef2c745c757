// Samplers decide the order in which a loader visits a data set, epoch by epoch. The next issue adds
// DistributedSampler on the same interface.
#pragma once
#include <cstdint>
#include <vector>

namespace distlab {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;  // the visiting order of one epoch
  virtual int64_t size() const = 0;                                // indices per epoch
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 drawn from (seed, epoch): the same on every machine and every run.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// Fisher-Yates shuffle of 0..n-1 from a seed.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

}  // namespace distlab
