// Lab 04: everything your zero.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your zero.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside the trainer. The trainer owns the model, the data, the
// forward and backward, and the optimizer's arithmetic (PyTorch's AdamW or SGD, f32 master weights). You
// decide WHAT each rank keeps and WHAT it sends: the partition, the collectives, and which part of the
// optimizer each rank steps. The trainer keeps whatever you hand it and measures it — so the memory a rank
// holds and the bytes it sends are your design's, counted where your code can't reach.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lab04 {

enum class ReduceOp { sum = 0, avg = 1 };

// The ranks of the job. Every call blocks; every rank must make the same calls in the same order, with the
// same n.
class Comm {
 public:
  // (how the host wires a Comm up; your code only calls the functions below)
  struct Ops {
    void (*all_reduce)(void* ctx, float* data, int64_t n, ReduceOp op);
    void (*reduce_scatter)(void* ctx, const float* in, float* out, int64_t n, ReduceOp op);
    void (*all_gather)(void* ctx, const float* in, float* out, int64_t n);
  };
  Comm(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  // data (n): becomes the sum (average) over ranks. Moves 2(N-1)/N · n floats per rank.
  void all_reduce(float* data, int64_t n, ReduceOp op) { ops_->all_reduce(ctx_, data, n, op); }
  // in (size()·n) -> out (n): out = the sum (average) over ranks of their in[rank()·n, (rank()+1)·n).
  // Moves (N-1)/N · size()·n floats per rank: half an all_reduce.
  void reduce_scatter(const float* in, float* out, int64_t n, ReduceOp op) { ops_->reduce_scatter(ctx_, in, out, n, op); }
  // in (n) -> out (size()·n): out[r·n, (r+1)·n) = rank r's in. The other half of an all_reduce.
  void all_gather(const float* in, float* out, int64_t n) { ops_->all_gather(ctx_, in, out, n); }

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

// Task 1 — the partition. A flat vector of `numel` elements, padded with zeros to the smallest multiple of
// `world` (padded), is split into world equal parts; rank r owns elements [begin, end) of the padded vector.
struct Shard {
  int64_t padded = 0, begin = 0, end = 0;
};
Shard shard_of(int64_t numel, int rank, int world);

// The model as your ZeRO sees it: a list of flats. A flat is one unit's parameters (a transformer block,
// the embeddings) of one weight-decay group, one after the other in a single vector — PyTorch FSDP's
// FlatParameter. Positions: 0..numel(flat)-1; padding, if you add it, comes after.
class Step {
 public:
  virtual ~Step() = default;
  virtual int num_flats() const = 0;
  virtual int64_t numel(int flat) const = 0;
  virtual std::string name(int flat) const = 0;  // "unit 1 (decayed): h.0.ln_1.weight ... h.0.mlp.c_proj.weight"
  // The flat's whole gradient on THIS rank, before any averaging (numel floats). Only while its gradient
  // is complete: in zero1_reduce, every flat; in zero2_reduce(step, flat), that flat.
  virtual std::vector<float> grad(int flat) = 0;
  // Hand the trainer this rank's averaged gradient part: elements [begin, begin + n) of the padded flat.
  // The trainer releases the flat's whole gradient here (nothing else needs it), keeps the part (in the
  // run's dtype), and its optimizer keeps state — f32 master weights and moments — for exactly these n
  // elements. Once per flat per step; the same part every step (its optimizer state stays on this rank).
  // A rank that owns nothing of a flat keeps n = 0.
  virtual void keep_grad(int flat, int64_t begin, const float* part, int64_t n) = 0;
  // The trainer's optimizer steps every part kept (after clipping, at this step's lr). Once per zero_step.
  virtual void optimizer_step() = 0;
  // After optimizer_step: the new weights of the part this rank kept of `flat` (n floats, f32).
  virtual std::vector<float> part_weights(int flat) = 0;
  // Writes weights into this rank's model: elements [begin, begin + n) of the padded flat (positions at or
  // past numel(flat), the padding, are dropped). In zero_step only.
  virtual void set_weights(int flat, int64_t begin, const float* weights, int64_t n) = 0;
  virtual Comm& comm() = 0;
};

// Task 2 — ZeRO-1 (the optimizer state sharded). After the whole backward: for every flat, average the
// gradient over ranks so that this rank gets exactly its part, and keep it.
void zero1_reduce(Step& step);
// Task 3 — the sharded optimizer step (both stages): step the parts, then make every rank's model whole
// and equal again.
void zero_step(Step& step);
// Task 4 — ZeRO-2 (the gradients sharded too): the same reduction, flat by flat, DURING backward: called
// as soon as `flat`'s gradient is complete (the last layers first).
void zero2_reduce(Step& step, int flat);

}  // namespace lab04

// The table the grader looks up in your plugin (defined at the bottom of zero.cpp).
constexpr int kLab04Abi = 1;
struct Lab04Plugin {
  int abi;  // kLab04Abi
  lab04::Shard (*shard_of)(int64_t, int, int);
  void (*zero1_reduce)(lab04::Step&);
  void (*zero_step)(lab04::Step&);
  void (*zero2_reduce)(lab04::Step&, int);
};
extern "C" Lab04Plugin distlab_lab04;
