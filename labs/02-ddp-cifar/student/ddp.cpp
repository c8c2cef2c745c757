// Lab 02 — DDP on CIFAR with two ranks: a DistributedSampler, gradient averaging, and buckets that
// overlap communication with backward.
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include <stdexcept>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

using namespace distlab;

std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last) {
  // TODO(02-ddp-cifar): implement sampler_indices. Read labs/02-ddp-cifar/README.md.
  throw std::logic_error("02-ddp-cifar: sampler_indices is not implemented yet: "
                         "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
}

void average_gradients(ProcessGroup& pg, const std::vector<Parameter*>& params) {
  // TODO(02-ddp-cifar): implement average_gradients. Read labs/02-ddp-cifar/README.md.
  throw std::logic_error("02-ddp-cifar: average_gradients is not implemented yet: "
                         "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
}

// Buckets: parameters in REVERSE order (the order backward finishes them), about bucket_mb each. When the
// model reports a unit's gradients ready and that completes the next bucket, copy the bucket's gradients
// into its flat buffer and start an async all_reduce: the network works while backward goes on.
class Bucketed : public DataParallel {
 public:
  Bucketed(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) : pg_(pg) {
    // TODO(02-ddp-cifar): implement the buckets (Bucketed's constructor). Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: the buckets (Bucketed's constructor) is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override {
    // TODO(02-ddp-cifar): implement after_layer_backward. Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: after_layer_backward is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

  void finish_backward(Runtime& rt) override {
    // TODO(02-ddp-cifar): implement finish_backward. Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: finish_backward is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
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
