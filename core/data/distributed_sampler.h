// DistributedSampler with PyTorch's semantics (torch.utils.data.DistributedSampler):
//  - shuffle: one permutation of the whole data set from (seed + epoch), the same on every rank;
//    set_epoch(e) changes it — forget it and every epoch visits the same order;
//  - drop_last = false: pad by wrapping around to the first indices so every rank gets
//    ceil(n / replicas) samples; drop_last = true: drop the tail so every rank gets floor(n / replicas);
//  - rank r takes every replicas-th index starting at r (interleaved, not contiguous blocks).
// With the same seed, step s of N ranks together covers exactly what step s covers on one rank with
// RandomSampler and the same global batch: the union of the interleaved slices of a contiguous block.
#pragma once
#include "core/data/sampler.h"

namespace distlab {

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const override;  // uses `epoch` (the loader passes it)
  int64_t size() const override { return num_samples_; }
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  std::vector<int64_t> indices() const { return indices(epoch_); }  // PyTorch's __iter__
  int64_t total_size() const { return total_size_; }

 private:
  int64_t n_;
  int replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0, num_samples_, total_size_;
};

}  // namespace distlab
