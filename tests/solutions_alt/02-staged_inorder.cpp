// Lab 02, alternative solution "staged_inorder" (written from api.h/README only, to show the grader has no
// false negatives). What it does differently from the obvious transcription:
//  - sampler: never builds the padded list; position p of the padded/cut list is base[p % n], so each rank
//    computes its own entries directly (wrap-around padding by modulo);
//  - naive DDP: all_reduce(sum) per gradient, then multiply by the float 1/N instead of dividing;
//  - buckets: greedy packing of the parameters in reverse order (cap in bytes), each bucket with its own
//    staging vector; a bucket is launched only after every earlier bucket (strict in-order queue, like
//    PyTorch's reducer), reduced with the SUM op, and scaled by 1/N while it is copied back.
#include <cstring>
#include <numeric>

#include <stdexcept>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last) {
  // per-rank count: ceil(n/N) when padding, floor(n/N) when cutting
  const int64_t per_rank = drop_last ? n / replicas : (n + replicas - 1) / replicas;
  std::vector<int64_t> base;
  if (shuffle) {
    base = seeded_permutation(n, seed + uint64_t(epoch));  // one shuffle, shared by every rank
  } else {
    base.resize(size_t(n));
    std::iota(base.begin(), base.end(), int64_t{0});
  }
  std::vector<int64_t> mine;
  mine.reserve(size_t(per_rank));
  for (int64_t j = 0; j < per_rank; j++) {
    const int64_t p = int64_t(rank) + j * replicas;  // position in the (virtual) padded list
    mine.push_back(base[size_t(p % n)]);             // p >= n only when padding: wrap to the front
  }
  return mine;
}

void average_gradients(Comm& comm, std::vector<Grad>& grads) {
  const float inv_n = 1.0f / float(comm.size());
  for (Grad& g : grads) {
    comm.all_reduce(g.data, g.numel, ReduceOp::sum);  // every rank: the sum over ranks
    for (int64_t i = 0; i < g.numel; i++) g.data[i] *= inv_n;
  }
}

class BucketedDDP : public Bucketed {
 public:
  BucketedDDP(Comm& comm, std::vector<Grad>& grads, double bucket_mb) : comm_(comm), grads_(grads) {
    // Backward makes the last layer's gradients final first, so buckets are filled walking the parameters
    // from the last to the first; a bucket is closed when the next gradient would push it past the cap
    // (a gradient larger than the cap gets a bucket of its own). Every rank computes the same buckets.
    const double cap_bytes = bucket_mb * 1024.0 * 1024.0;
    bucket_of_.assign(grads.size(), -1);
    double bytes = 0;
    for (int i = int(grads.size()) - 1; i >= 0; i--) {
      const double b = 4.0 * double(grads[size_t(i)].numel);
      if (buckets_.empty() || (bytes + b > cap_bytes && !buckets_.back().params.empty())) {
        buckets_.emplace_back();
        bytes = 0;
      }
      Bucket& bk = buckets_.back();
      bucket_of_[size_t(i)] = int(buckets_.size()) - 1;
      bk.params.push_back(i);
      bk.offset.push_back(bk.numel);
      bk.numel += grads[size_t(i)].numel;
      bytes += b;
    }
    for (Bucket& bk : buckets_) bk.buf.resize(size_t(bk.numel));
    reset();
  }

  void begin_backward(bool sync) override {
    sync_ = sync;
    reset();
  }

  void after_backward(int /*unit*/, const std::vector<int>& ready) override {
    if (!sync_) return;  // no_sync: gradients accumulate locally, nothing is sent
    for (int i : ready) {
      const int b = bucket_of_[size_t(i)];
      Bucket& bk = buckets_[size_t(b)];
      size_t slot = 0;
      while (bk.params[slot] != i) slot++;
      std::memcpy(bk.buf.data() + bk.offset[slot], grads_[size_t(i)].data, sizeof(float) * size_t(grads_[size_t(i)].numel));
      bk.pending--;
    }
    launch_ready_prefix();
  }

  void finish_backward() override {
    if (!sync_) return;  // this rank's accumulated gradients stay as backward left them
    // anything never reported (should not happen) is staged now, so that every rank still sends every bucket
    for (Bucket& bk : buckets_) {
      if (bk.pending == 0) continue;
      for (size_t s = 0; s < bk.params.size(); s++)
        std::memcpy(bk.buf.data() + bk.offset[s], grads_[size_t(bk.params[s])].data,
                    sizeof(float) * size_t(grads_[size_t(bk.params[s])].numel));
      bk.pending = 0;
    }
    launch_ready_prefix();
    const float inv_n = 1.0f / float(comm_.size());
    for (Bucket& bk : buckets_) {
      comm_.wait(bk.handle);
      for (size_t s = 0; s < bk.params.size(); s++) {
        Grad& g = grads_[size_t(bk.params[s])];
        const float* src = bk.buf.data() + bk.offset[s];
        for (int64_t k = 0; k < g.numel; k++) g.data[k] = src[k] * inv_n;
      }
    }
    reset();
  }

 private:
  struct Bucket {
    std::vector<int> params;       // parameter indices, in the order they were packed (reverse model order)
    std::vector<int64_t> offset;   // where each one starts in buf
    int64_t numel = 0;
    std::vector<float> buf;        // staging: the all-reduce runs on this copy
    int pending = 0;               // gradients not yet final
    int handle = -1;
  };

  void reset() {
    for (Bucket& bk : buckets_) {
      bk.pending = int(bk.params.size());
      bk.handle = -1;
    }
    next_launch_ = 0;
  }

  // launch buckets strictly in index order: bucket b goes only once buckets 0..b-1 have gone
  void launch_ready_prefix() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      Bucket& bk = buckets_[next_launch_];
      bk.handle = comm_.all_reduce_async(bk.buf.data(), bk.numel, ReduceOp::sum);
      next_launch_++;
    }
  }

  Comm& comm_;
  std::vector<Grad>& grads_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  size_t next_launch_ = 0;
  bool sync_ = true;
};

Bucketed* make_bucketed(Comm& comm, std::vector<Grad>& grads, double bucket_mb) { return new BucketedDDP(comm, grads, bucket_mb); }

}  // namespace lab02

extern "C" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};
