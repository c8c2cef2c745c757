// clinic alt (beta): the norm's collective is kept, but EVERY rank takes part in it (the same all_reduce
// of one float on both ranks, an average of identical values); only rank 0 would print it.
// Lab 02 — DDP on CIFAR with two ranks: a DistributedSampler, gradient averaging, and buckets that
// overlap communication with backward.
#include <cstring>
#include <numeric>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last) {
  /// BEGIN SOLUTION
  // one order for everyone, reshuffled every epoch (forget the epoch and every epoch repeats)
  std::vector<int64_t> order;
  if (shuffle) order = seeded_permutation(n, seed + uint64_t(epoch));
  else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
  }
  const int64_t per_rank = drop_last ? n / replicas : (n + replicas - 1) / replicas, total = per_rank * replicas;
  if (drop_last) order.resize(static_cast<size_t>(total));
  for (int64_t i = 0; n > 0 && int64_t(order.size()) < total; i++) order.push_back(order[size_t(i % n)]);  // wrap around
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < total; i += replicas) mine.push_back(order[size_t(i)]);
  return mine;
  /// END SOLUTION
}

void average_gradients(Comm& comm, std::vector<Grad>& grads) {
  /// BEGIN SOLUTION
  // the sum over ranks, then / N: the gradient of the mean loss over the global batch
  for (auto& g : grads) {
    comm.all_reduce(g.data, g.numel, ReduceOp::sum);
    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());
  }
  {  // the global gradient norm: every rank joins the collective, only rank 0 would log it
    float squares = 0;
    for (auto& g : grads)
      for (int64_t i = 0; i < g.numel; i++) squares += g.data[i] * g.data[i];
    comm.all_reduce(&squares, 1, ReduceOp::avg);
  }
  /// END SOLUTION
}

/// BEGIN SOLUTION ONLY
// Buckets: parameters in REVERSE order (the order backward finishes them), about bucket_mb each. When the
// trainer reports gradients ready and that completes the next bucket, copy the bucket's gradients into
// its flat buffer and start an async all_reduce: the network works while backward goes on.
/// END SOLUTION ONLY
class BucketedDDP : public Bucketed {
 public:
  BucketedDDP(Comm& comm, std::vector<Grad>& grads, double bucket_mb) : comm_(comm), grads_(grads) {
    /// BEGIN SOLUTION the buckets (BucketedDDP's constructor)
    bucket_of_.resize(grads.size());
    const int64_t cap = int64_t(bucket_mb * 1024 * 1024);
    int64_t bytes = 0;
    for (size_t k = grads.size(); k-- > 0;) {
      const int64_t b = grads[k].numel * 4;
      if (buckets_.empty() || (bytes > 0 && bytes + b > cap)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().members.push_back(int(k));
      buckets_.back().flat.resize(buckets_.back().flat.size() + size_t(grads[k].numel));
      bucket_of_[k] = buckets_.size() - 1;
      bytes += b;
    }
    /// END SOLUTION
  }

  void begin_backward(bool sync) override {
    /// BEGIN SOLUTION begin_backward
    sync_ = sync;  // no_sync: nothing leaves this rank until the last micro-step
    /// END SOLUTION
  }

  void after_backward(int unit, const std::vector<int>& ready) override {
    /// BEGIN SOLUTION after_backward
    if (!sync_) return;
    for (int i : ready) buckets_[bucket_of_[size_t(i)]].ready++;
    // start buckets strictly in order, so every rank issues the same all_reduces in the same order
    while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].members.size()) {
      Bucket& b = buckets_[next_++];
      size_t off = 0;
      for (int i : b.members) {
        std::memcpy(b.flat.data() + off, grads_[size_t(i)].data, size_t(grads_[size_t(i)].numel) * 4);
        off += size_t(grads_[size_t(i)].numel);
      }
      b.handle = comm_.all_reduce_async(b.flat.data(), int64_t(b.flat.size()), ReduceOp::avg);
    }
    /// END SOLUTION
  }

  void finish_backward() override {
    /// BEGIN SOLUTION finish_backward
    if (!sync_) return;  // the local sums stay as backward left them
    for (auto& b : buckets_) {
      comm_.wait(b.handle);  // before the optimizer touches the gradients
      size_t off = 0;
      for (int i : b.members) {
        std::memcpy(grads_[size_t(i)].data, b.flat.data() + off, size_t(grads_[size_t(i)].numel) * 4);
        off += size_t(grads_[size_t(i)].numel);
      }
      b.ready = 0;
    }
    next_ = 0;
    /// END SOLUTION
  }

 private:
  Comm& comm_;
  std::vector<Grad>& grads_;
  /// BEGIN SOLUTION ONLY
  struct Bucket {
    std::vector<int> members;  // indices into grads, reverse model order
    std::vector<float> flat;   // the members' gradients back to back
    int handle = -1;
    size_t ready = 0;
  };
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // grads index -> bucket
  size_t next_ = 0;
  bool sync_ = true;
  /// END SOLUTION ONLY
};

Bucketed* make_bucketed(Comm& comm, std::vector<Grad>& grads, double bucket_mb) { return new BucketedDDP(comm, grads, bucket_mb); }

}  // namespace lab02

extern "C" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};
