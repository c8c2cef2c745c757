// Lab 02: everything your ddp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your ddp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside each rank's trainer. The trainer owns the model, the
// data and the process group; it calls your functions at the points where PyTorch's DDP does its work,
// and it runs the collectives you ask for through a Comm:
//   comm.all_reduce(data, n, op)                  blocking: data becomes the sum (or average, or max)
//                                                 over ranks
//   h = comm.all_reduce_async(data, n, op)        starts it and returns at once; the network works while
//                                                 you return to the trainer (backward goes on)
//   comm.wait(h)                                  blocks until it is done and the result is in data
// Every rank must ask for the same collectives in the same order, with the same sizes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lab02 {

enum class ReduceOp { sum = 0, avg = 1, max = 2 };

class Comm {
 public:
  // (how the host wires a Comm up; your code only calls the functions below)
  struct Ops {
    void (*all_reduce)(void* ctx, float* data, int64_t n, ReduceOp op);
    int (*all_reduce_async)(void* ctx, float* data, int64_t n, ReduceOp op);
    void (*wait)(void* ctx, int handle);
  };
  Comm(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}

  int rank() const { return rank_; }
  int size() const { return size_; }  // N, the number of ranks
  void all_reduce(float* data, int64_t n, ReduceOp op) { ops_->all_reduce(ctx_, data, n, op); }
  int all_reduce_async(float* data, int64_t n, ReduceOp op) { return ops_->all_reduce_async(ctx_, data, n, op); }
  void wait(int handle) { ops_->wait(ctx_, handle); }

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

// One parameter's gradient, in the model's order (PyTorch's names: "conv1.weight", "fc.bias", ...).
// The trainer fills data before it calls you and reads it back after: write the averaged gradient there.
struct Grad {
  std::string name;
  float* data;    // (numel)
  int64_t numel;
};

// Task 1 — DistributedSampler (PyTorch's semantics): this rank's indices for `epoch`.
//  shuffle: seeded_permutation(n, seed + epoch), the same on every rank; else 0..n-1.
//  drop_last = false: pad by wrapping around to ceil(n / replicas) · replicas; true: cut to floor(...).
//  rank r takes the indices at positions r, r + replicas, r + 2·replicas, ...
std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last);

// Task 2 — naive DDP: after the whole backward, every rank's gradients become the average over ranks.
void average_gradients(Comm& comm, std::vector<Grad>& grads);

// Task 3 — bucketed DDP, overlapped with backward (see the README). Task 4 — gradient accumulation.
class Bucketed {
 public:
  virtual ~Bucketed() = default;
  // called before every micro-step's backward. sync is false on a micro-step of gradient accumulation that
  // is not the last one (PyTorch's `with model.no_sync():`): the gradients must then stay on this rank
  // (backward adds each micro-step's into grads[i].data) and be averaged once, on the last micro-step.
  // after_backward and finish_backward are called on every micro-step, whatever sync is.
  virtual void begin_backward(bool sync) = 0;
  // called as soon as the gradients grads[i] for i in `ready` are final (backward runs the model in
  // reverse, so the last layer's come first); `unit` is the layer's index in the model
  virtual void after_backward(int unit, const std::vector<int>& ready) = 0;
  // called once backward is over: when it returns, every grads[i].data holds the average over ranks (on a
  // micro-step with sync false: this rank's own accumulated gradients, as backward left them)
  virtual void finish_backward() = 0;
};
Bucketed* make_bucketed(Comm& comm, std::vector<Grad>& grads, double bucket_mb);

// The shuffle every rank shares (the engine's, so that your sampler and PyTorch-style loaders agree).
inline std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

}  // namespace lab02

// The table the grader looks up in your plugin (defined at the bottom of ddp.cpp).
constexpr int kLab02Abi = 3;
struct Lab02Services {  // filled in by the host before any call
  std::vector<int64_t> (*seeded_permutation)(int64_t n, uint64_t seed);
};
struct Lab02Plugin {
  int abi;  // kLab02Abi
  const Lab02Services* services;
  std::vector<int64_t> (*sampler_indices)(int64_t, int, int, uint64_t, int64_t, bool, bool);
  void (*average_gradients)(lab02::Comm&, std::vector<lab02::Grad>&);
  lab02::Bucketed* (*make_bucketed)(lab02::Comm&, std::vector<lab02::Grad>&, double);
};
extern "C" Lab02Plugin distlab_lab02;

inline std::vector<int64_t> lab02::seeded_permutation(int64_t n, uint64_t seed) {
  return distlab_lab02.services->seeded_permutation(n, seed);
}
