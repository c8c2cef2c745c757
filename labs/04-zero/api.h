// Lab 04: everything your zero.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your zero.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside the trainer. The trainer owns the model, the data and the
// forward and backward. You own everything ZeRO is: the partition, the collectives, and the sharded AdamW —
// its master weights and moments, for the part of each flat this rank owns, in buffers you ask the trainer
// for (Step::state), so that the memory a rank holds and the bytes it sends are counted where your code
// can't reach them. Your process is measured too, from outside (its own memory cgroup's peak): beyond the
// state buffers it may hold working copies only — the parts this rank kept, and one flat's whole gradient
// or gathered weights at a time. Optimizer state, master weights or whole gradients kept in your own
// vectors count as this rank's memory, and the memory checks fail on them.
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
    int (*reduce_scatter_async)(void* ctx, const float* in, float* out, int64_t n, ReduceOp op);
    void (*wait)(void* ctx, int handle);
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
  // reduce_scatter, started and returned from at once: `in` is sent now (it may be freed on return); `out`
  // is written by wait(handle), which blocks until the collective is done. Every handle is waited for once.
  int reduce_scatter_async(const float* in, float* out, int64_t n, ReduceOp op) { return ops_->reduce_scatter_async(ctx_, in, out, n, op); }
  void wait(int handle) { ops_->wait(ctx_, handle); }

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

// PyTorch's torch.optim.AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization") as the run's
// config sets it, for this optimizer step.
struct AdamW {
  float lr = 0;                // this step's learning rate (the schedule's, already applied)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0;      // applies only to flats whose decay(flat) is true
  float max_norm = 0;          // clip the gradient's global 2-norm to this first (clip_grad_norm_); 0: no clipping
  int64_t t = 1;               // the step's number, 1 for the first step: what the bias corrections use
};

// Task 2 — one AdamW step on n elements, in place: w (the f32 master weights), m and v (the moments) are
// updated from g times grad_scale (the clipping coefficient). Where decay is false, no weight decay. The
// grader asks it directly, with its own numbers, and compares it with PyTorch's AdamW as the engine computes
// it: in float32, from the float hyper-parameters exactly as given here (beta2 = 0.999f is 0.99900001287...,
// not the decimal 0.999; use the values you are handed). Any precision from float up passes, in any order
// of operations: each of w, m and v is compared within 1e-6 of the size of the terms it is the sum of, not
// of the result, which two nearly cancelling terms can make tiny. With m, v and w as they were before the
// step, gs = g·grad_scale, and m^, v^ the new moments divided by 1 - beta1^t and 1 - beta2^t:
//   m: 1e-6 · (beta1·|m| + (1 - beta1)·|gs|)        v: 1e-6 · (beta2·v + (1 - beta2)·gs^2)
//   w: 1e-6 · (|w|·(1 - lr·weight_decay) + u), u = lr·|m^|/(sqrt(v^) + eps); |w| alone where decay is false
// and w may differ by a further 2^-22 · (beta1^t/(1 - beta1^t) + beta2^t/(2(1 - beta2^t))) · u: what
// rounding beta^t to float does to 1 - beta^t (about 500 float epsilons of u at t = 2, beta2 = 0.999).
void adamw_step(const AdamW& h, bool decay, float grad_scale, float* w, float* m, float* v, const float* g, int64_t n);

// The model as your ZeRO sees it: a list of flats. A flat is one unit's parameters (a transformer block,
// the embeddings) of one weight-decay group, one after the other in a single vector — PyTorch FSDP's
// FlatParameter. Positions: 0..numel(flat)-1; padding, if you add it, comes after.
class Step {
 public:
  virtual ~Step() = default;
  virtual int num_flats() const = 0;
  virtual int64_t numel(int flat) const = 0;
  virtual std::string name(int flat) const = 0;  // "unit 1 (decayed): h.0.ln_1.weight ... h.0.mlp.c_proj.weight"
  virtual bool decay(int flat) const = 0;        // does weight decay apply to this flat (PyTorch's param groups)
  virtual int unit(int flat) const = 0;          // the unit (embeddings 0, block k: k + 1, ...) it belongs to
  // The flat's whole gradient on THIS rank, before any averaging (numel floats). Only while it is complete
  // and not yet released: in zero1_reduce, every flat; in zero2_reduce(step, flat), that flat.
  virtual std::vector<float> grad(int flat) = 0;
  // Hand the trainer this rank's averaged gradient part: elements [begin, begin + n) of the padded flat,
  // n = part's length in floats. The trainer releases the flat's whole gradient here (nothing else needs
  // it) and keeps the part, counted as this rank's gradients, in the run's dtype (as a GPU would hold it).
  // Once per flat per step, in zero1_reduce, zero2_reduce or zero2_finish.
  virtual void keep_grad(int flat, int64_t begin, const float* part, int64_t n) = 0;
  // Optional: you are done reading `flat`'s whole gradient (grad() copied it into your own vector, the one a
  // reduction in flight sends from), and the trainer frees it now instead of at keep_grad — as the engine's
  // ZeRO-2 frees a gradient once it is packed. After it, grad(flat) is an error this step; keep_grad is still
  // due. In zero1_reduce, or in zero2_reduce / zero2_finish for a flat zero2_reduce was called for; again, or
  // after keep_grad, it does nothing.
  virtual void release_grad(int flat) = 0;
  // In zero_step: the part kept for `flat` this step (n floats, as the trainer holds it).
  virtual std::vector<float> kept_grad(int flat) = 0;
  // The flat's weights as the model holds them now (numel floats; in a bf16 run, bf16 values). A master
  // copy starts from these.
  virtual std::vector<float> weights(int flat) = 0;
  // A buffer of n floats for `flat`'s optimizer state, zeroed when first asked for, the same buffer on
  // every later call with the same (flat, name) for the rest of the run. Counted as this rank's optimizer
  // state (4 bytes per float). Name the moments "exp_avg" and "exp_avg_sq" (PyTorch's state_dict names)
  // and, in a bf16 run, the f32 master weights "master": the trainer reads them back after every step and
  // checks that they are AdamW's moments, and master weights, of the part this rank kept.
  virtual float* state(int flat, const std::string& name, int64_t n) = 0;
  // Writes weights into this rank's model: elements [begin, begin + n) of the padded flat (positions at or
  // past numel(flat), the padding, are dropped; rounded into the model's dtype). In zero_step only.
  virtual void set_weights(int flat, int64_t begin, const float* weights, int64_t n) = 0;
  virtual const AdamW& hyper() const = 0;  // this step's settings (zero_step)
  virtual Comm& comm() = 0;
};

// Task 3 — ZeRO-1 (the optimizer state sharded). After the whole backward: for every flat, average the
// gradient over ranks so that this rank gets exactly its part, and keep it.
void zero1_reduce(Step& step);
// Task 4 — the sharded optimizer step (both stages): clip by the global norm, step this rank's parts with
// its own state, then make every rank's model whole and equal again.
void zero_step(Step& step);
// Task 5 — ZeRO-2 (the gradients sharded too): the same reduction, flat by flat, DURING backward: called
// as soon as `flat`'s gradient is complete (the last layers first; a unit's flats one after the other, as
// soon as the unit's backward is done). A reduction may still be running when it returns (backward goes on
// meanwhile); its part is kept by the end of zero2_finish.
void zero2_reduce(Step& step, int flat);
// Called once backward is over, before the step: when it returns, every flat's part is kept.
void zero2_finish(Step& step);

}  // namespace lab04

// The table the grader looks up in your plugin (defined at the bottom of zero.cpp).
constexpr int kLab04Abi = 2;
struct Lab04Plugin {
  int abi;  // kLab04Abi
  lab04::Shard (*shard_of)(int64_t, int, int);
  void (*adamw_step)(const lab04::AdamW&, bool, float, float*, float*, float*, const float*, int64_t);
  void (*zero1_reduce)(lab04::Step&);
  void (*zero_step)(lab04::Step&);
  void (*zero2_reduce)(lab04::Step&, int);
  void (*zero2_finish)(lab04::Step&);
};
extern "C" Lab04Plugin distlab_lab04;
