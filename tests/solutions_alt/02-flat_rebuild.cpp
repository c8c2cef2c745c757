// Lab 02, alternative solution "flat_rebuild" (written from api.h/README only, to show the grader has no
// false negatives). What it does differently from the obvious transcription:
//  - sampler: materialises the padded list the way PyTorch's code reads (append whole copies of the list,
//    then trim to total_size) and slices it with a stride;
//  - naive DDP: packs every gradient into ONE flat buffer and issues a single all_reduce with the AVG op;
//  - buckets: all gradients live in one flat buffer, buckets are contiguous slices of it (PyTorch's bucket
//    views). The first synchronised backward uses buckets in reverse parameter order; it records the order
//    in which the trainer actually reported gradients ready and then REBUILDS the buckets in that order
//    (PyTorch's Reducer::rebuild_buckets). A bucket is launched the moment its last gradient lands,
//    whatever its index, and is reduced with the AVG op (no scaling afterwards).
#include <algorithm>
#include <cstring>
#include <numeric>

#include <stdexcept>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  if (shuffle)
    all = seeded_permutation(n, seed + uint64_t(epoch));
  else
    std::iota(all.begin(), all.end(), int64_t{0});

  const int64_t num_samples = drop_last ? n / replicas : (n + replicas - 1) / replicas;
  const size_t total = size_t(num_samples) * size_t(replicas);
  if (all.size() > total) {
    all.resize(total);  // drop_last: the tail is cut
  } else {
    const std::vector<int64_t> once = all;  // pad with the first indices, again and again if n is tiny
    while (all.size() < total) {
      const size_t take = std::min(once.size(), total - all.size());
      all.insert(all.end(), once.begin(), once.begin() + std::ptrdiff_t(take));
    }
  }
  std::vector<int64_t> mine;
  for (size_t p = size_t(rank); p < total; p += size_t(replicas)) mine.push_back(all[p]);
  return mine;
}

void average_gradients(Comm& comm, std::vector<Grad>& grads) {
  int64_t total = 0;
  for (const Grad& g : grads) total += g.numel;
  std::vector<float> flat(static_cast<size_t>(total));
  int64_t off = 0;
  for (const Grad& g : grads) {
    std::copy(g.data, g.data + g.numel, flat.begin() + off);
    off += g.numel;
  }
  comm.all_reduce(flat.data(), total, ReduceOp::avg);  // one collective for the whole model
  off = 0;
  for (Grad& g : grads) {
    std::copy(flat.begin() + off, flat.begin() + off + g.numel, g.data);
    off += g.numel;
  }
}

class BucketedDDP : public Bucketed {
 public:
  BucketedDDP(Comm& comm, std::vector<Grad>& grads, double bucket_mb)
      : comm_(comm), grads_(grads), cap_elems_(int64_t(bucket_mb * 1024.0 * 1024.0 / sizeof(float))) {
    std::vector<int> order(grads.size());
    std::iota(order.rbegin(), order.rend(), 0);  // first guess: backward runs the model in reverse
    layout(order);
  }

  void begin_backward(bool sync) override {
    sync_ = sync;
    for (Bucket& b : buckets_) b.missing = b.count, b.handle = -1;
    seen_.clear();
  }

  void after_backward(int /*unit*/, const std::vector<int>& ready) override {
    if (!sync_) return;  // inside no_sync: keep accumulating locally
    for (int i : ready) {
      const Grad& g = grads_[size_t(i)];
      std::memcpy(flat_.data() + offset_[size_t(i)], g.data, sizeof(float) * size_t(g.numel));
      Bucket& b = buckets_[size_t(bucket_of_[size_t(i)])];
      if (--b.missing == 0) b.handle = comm_.all_reduce_async(flat_.data() + b.begin, b.numel, ReduceOp::avg);
      if (!rebuilt_) seen_.push_back(i);
    }
  }

  void finish_backward() override {
    if (!sync_) return;
    for (Bucket& b : buckets_) {
      if (b.handle < 0) {  // a gradient never reported: send what it holds so the ranks stay in step
        for (size_t i = 0; i < grads_.size(); i++)
          if (bucket_of_[i] == int(&b - buckets_.data()))
            std::memcpy(flat_.data() + offset_[i], grads_[i].data, sizeof(float) * size_t(grads_[i].numel));
        b.handle = comm_.all_reduce_async(flat_.data() + b.begin, b.numel, ReduceOp::avg);
      }
    }
    for (Bucket& b : buckets_) comm_.wait(b.handle);
    for (size_t i = 0; i < grads_.size(); i++)
      std::memcpy(grads_[i].data, flat_.data() + offset_[i], sizeof(float) * size_t(grads_[i].numel));
    // after the first synchronised backward, rebuild the buckets in the order gradients really arrived
    // (identical on every rank: backward runs the same model the same way everywhere)
    if (!rebuilt_) {
      rebuilt_ = true;
      std::vector<int> sorted = seen_;
      std::sort(sorted.begin(), sorted.end());
      bool permutation = sorted.size() == grads_.size();
      for (size_t i = 0; permutation && i < sorted.size(); i++) permutation = sorted[i] == int(i);
      if (permutation) layout(seen_);  // else keep the reverse-order buckets
      seen_.clear();
    }
  }

 private:
  struct Bucket {
    int64_t begin = 0, numel = 0;  // a slice of flat_
    int count = 0, missing = 0;
    int handle = -1;
  };

  // place the gradients in flat_ in `order`, cutting a new bucket when the next one would not fit
  void layout(const std::vector<int>& order) {
    buckets_.clear();
    offset_.assign(grads_.size(), 0);
    bucket_of_.assign(grads_.size(), 0);
    int64_t pos = 0;
    for (int i : order) {
      const int64_t n = grads_[size_t(i)].numel;
      if (buckets_.empty() || (buckets_.back().numel > 0 && buckets_.back().numel + n > cap_elems_)) {
        buckets_.push_back(Bucket{pos, 0, 0, 0, -1});
      }
      Bucket& b = buckets_.back();
      offset_[size_t(i)] = pos;
      bucket_of_[size_t(i)] = int(buckets_.size()) - 1;
      b.numel += n;
      b.count++;
      pos += n;
    }
    flat_.assign(size_t(pos), 0.0f);
    for (Bucket& b : buckets_) b.missing = b.count;
  }

  Comm& comm_;
  std::vector<Grad>& grads_;
  int64_t cap_elems_;
  std::vector<float> flat_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> offset_;
  std::vector<int> bucket_of_;
  std::vector<int> seen_;
  bool sync_ = true, rebuilt_ = false;
};

Bucketed* make_bucketed(Comm& comm, std::vector<Grad>& grads, double bucket_mb) { return new BucketedDDP(comm, grads, bucket_mb); }

}  // namespace lab02

extern "C" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};
