// Lab 02 — DDP on CIFAR with two ranks: a DistributedSampler, gradient averaging, and buckets that
// overlap communication with backward.
#include <cstring>
#include <numeric>

#include <stdexcept>

#include "labs/02-ddp-cifar/api.h"

namespace lab02 {

std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last) {
  // TODO(02-ddp-cifar): implement sampler_indices. Read labs/02-ddp-cifar/README.md.
  throw std::logic_error("02-ddp-cifar: sampler_indices is not implemented yet: "
                         "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
}

void average_gradients(Comm& comm, std::vector<Grad>& grads) {
  // TODO(02-ddp-cifar): implement average_gradients. Read labs/02-ddp-cifar/README.md.
  throw std::logic_error("02-ddp-cifar: average_gradients is not implemented yet: "
                         "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
}

class BucketedDDP : public Bucketed {
 public:
  BucketedDDP(Comm& comm, std::vector<Grad>& grads, double bucket_mb) : comm_(comm), grads_(grads) {
    // TODO(02-ddp-cifar): implement the buckets (BucketedDDP's constructor). Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: the buckets (BucketedDDP's constructor) is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

  void begin_backward(bool sync) override {
    // TODO(02-ddp-cifar): implement begin_backward. Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: begin_backward is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

  void after_backward(int unit, const std::vector<int>& ready) override {
    // TODO(02-ddp-cifar): implement after_backward. Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: after_backward is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

  void finish_backward() override {
    // TODO(02-ddp-cifar): implement finish_backward. Read labs/02-ddp-cifar/README.md.
    throw std::logic_error("02-ddp-cifar: finish_backward is not implemented yet: "
                           "fill in the TODO in labs/02-ddp-cifar/student/ddp.cpp");
  }

 private:
  Comm& comm_;
  std::vector<Grad>& grads_;
};

Bucketed* make_bucketed(Comm& comm, std::vector<Grad>& grads, double bucket_mb) { return new BucketedDDP(comm, grads, bucket_mb); }

}  // namespace lab02

extern "C" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};
