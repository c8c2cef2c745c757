// Lab 02 — DDP on CIFAR with two ranks: a DistributedSampler, gradient averaging, and buckets that
// overlap communication with backward.
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

using namespace distlab;

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

void average_gradients(ProcessGroup& pg, const std::vector<Parameter*>& params) {
  /// BEGIN SOLUTION
  // the sum over ranks, then / N: the gradient of the mean loss over the global batch
  for (auto* p : params) {
    float* g = p->grad.f32();
    const int64_t n = p->grad.numel();
    pg.all_reduce(g, n, ReduceOp::sum);
    for (int64_t i = 0; i < n; i++) g[i] /= float(pg.size());
  }
  /// END SOLUTION
}

// Buckets: parameters in REVERSE order (the order backward finishes them), about bucket_mb each. When the
// model reports a unit's gradients ready and that completes the next bucket, copy the bucket's gradients
// into its flat buffer and start an async all_reduce: the network works while backward goes on.
class Bucketed : public DataParallel {
 public:
  Bucketed(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) : pg_(pg) {
    /// BEGIN SOLUTION the buckets (Bucketed's constructor)
    auto params = model.parameters();
    const int64_t cap = int64_t(bucket_mb * 1024 * 1024);
    int64_t bytes = 0;
    for (size_t k = params.size(); k-- > 0;) {
      if (buckets_.empty() || (bytes > 0 && bytes + params[k]->data.nbytes() > cap)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().params.push_back(params[k]);
      bucket_of_[params[k]] = buckets_.size() - 1;
      bytes += params[k]->data.nbytes();
    }
    for (auto& b : buckets_) {
      int64_t n = 0;
      for (auto* p : b.params) n += p->data.numel();
      b.flat.resize(static_cast<size_t>(n));
    }
    /// END SOLUTION
  }

  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override {
    /// BEGIN SOLUTION after_layer_backward
    if (!sync_) return;
    for (auto* p : params) buckets_[bucket_of_.at(p)].ready++;
    // start buckets strictly in order, so every rank issues the same all_reduces in the same order
    while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].params.size()) {
      Bucket& b = buckets_[next_++];
      size_t off = 0;
      for (auto* p : b.params) {
        std::memcpy(b.flat.data() + off, p->grad_for_accumulate().f32(), size_t(p->data.numel()) * 4);
        off += size_t(p->data.numel());
      }
      b.work = pg_.all_reduce_async(b.flat.data(), int64_t(b.flat.size()), ReduceOp::avg);
    }
    /// END SOLUTION
  }

  void finish_backward(Runtime& rt) override {
    /// BEGIN SOLUTION finish_backward
    if (!sync_) return;
    for (auto& b : buckets_) {
      b.work->wait();  // before the optimizer touches the gradients
      size_t off = 0;
      for (auto* p : b.params) {
        std::memcpy(p->grad.f32(), b.flat.data() + off, size_t(p->data.numel()) * 4);
        off += size_t(p->data.numel());
      }
      b.work.reset();
      b.ready = 0;
    }
    next_ = 0;
    /// END SOLUTION
  }

  int64_t all_reduces_per_step() const override { return int64_t(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<Parameter*> params;
    std::vector<float> flat;
    std::shared_ptr<Work> work;
    size_t ready = 0;
  };
  ProcessGroup& pg_;
  std::vector<Bucket> buckets_;
  std::map<Parameter*, size_t> bucket_of_;
  size_t next_ = 0;
};

DataParallel* make_bucketed(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) {
  return new Bucketed(pg, model, rt, bucket_mb);
}

}  // namespace lab02

extern "C" distlab::LabHooks distlab_lab_hooks = {lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};
