// DataLoader: cuts a sampler's order into batches (the last short one kept or dropped).
#pragma once
#include <memory>

#include "core/data/dataset.h"
#include "core/data/sampler.h"

namespace distlab {

class DataLoader {
 public:
  // check_finite: every batch's inputs are checked, and a NaN or Inf fails the run naming the record (the NaN
  // ladder's "check the input"), before the model turns it into a NaN loss somewhere downstream.
  DataLoader(const Dataset& data, std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last, bool check_finite = false);
  int64_t batches_per_epoch() const;
  void start_epoch(int64_t epoch);                        // draws the epoch's order
  bool next(Runtime& rt, Batch& out);                     // false at the end of the epoch
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return pos_; }               // batches taken in this epoch
  // A resumed run: the epoch's order drawn again (the sampler's order is a function of seed and epoch)
  // and its first `batches` batches skipped without loading them.
  void seek(int64_t epoch, int64_t batches);
  const Dataset& dataset() const { return data_; }

 private:
  const Dataset& data_;
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_, epoch_ = -1, pos_ = 0;
  bool drop_last_, check_finite_;
  std::vector<int64_t> order_;
  void check(const Batch& b, const std::vector<int64_t>& idx) const;  // check_finite
};

}  // namespace distlab
