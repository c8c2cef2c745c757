// Lab 03: everything your amp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your amp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside the trainer. The trainer owns the model (weights and
// gradients in fp16 or fp32), the data, the optimizer with its f32 master weights, the lr schedule and
// the process group. You write the loss scaler and the control of one optimizer step: the trainer calls
// your train_step once per optimizer step, and runs what you ask of it through a Step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lab03 {

enum class ReduceOp { sum = 0, avg = 1, max = 2 };

// The ranks of the job. all_reduce blocks: data becomes the sum (average, max) over ranks. Every rank
// must ask for the same all_reduces in the same order, with the same sizes.
class Comm {
 public:
  // (how the host wires a Comm up; your code only calls the functions below)
  struct Ops {
    void (*all_reduce)(void* ctx, float* data, int64_t n, ReduceOp op);
  };
  Comm(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  void all_reduce(float* data, int64_t n, ReduceOp op) { ops_->all_reduce(ctx_, data, n, op); }

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

// One parameter's gradient as f32, in the model's order (PyTorch's names: "conv1.weight", ...).
struct Grad {
  std::string name;
  float* data;  // (numel)
  int64_t numel;
};

// torch.cuda.amp.GradScaler's knobs (its defaults) and its state.
struct ScalerConfig {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int32_t growth_interval = 2000;
};
struct ScalerState {
  float scale = 0;             // what the loss is multiplied by this step
  int32_t growth_tracker = 0;  // clean steps in a row since the scale last changed
};

// Task 1 — the loss scaler.
ScalerState scaler_init(const ScalerConfig& c);
// unscale_: divides every gradient by s.scale, in place; returns true when a gradient holds an inf or a
// NaN on ANY rank of comm (every rank must then skip the step).
bool unscale_(Comm& comm, const ScalerState& s, std::vector<Grad>& grads);
// The update after a step: on an overflow, scale × backoff_factor and the tracker back to 0; after
// growth_interval clean steps in a row, scale × growth_factor (unless that is inf) and the tracker to 0.
void scaler_update(const ScalerConfig& c, ScalerState& s, bool found_inf);

// Task 2 — torch.nn.utils.clip_grad_norm_: the global L2 norm of all gradients; when max_norm > 0 and the
// norm is above it, every gradient × max_norm / (norm + 1e-6). Returns the norm before clipping.
double clip_grad_norm(std::vector<Grad>& grads, double max_norm);

// What the trainer does for your step. Every call runs the engine's code, in the trainer's process.
class Step {
 public:
  virtual ~Step() = default;
  virtual int accum_steps() const = 0;  // k: micro-batches per optimizer step (train.accum_steps)
  virtual double max_norm() const = 0;  // optim.clip_grad_norm (0: no clipping)
  // Micro-batch `micro` (0..k-1) of this step: forward, the loss (the mean over the micro-batch), and
  // backward of loss × loss_factor. The gradients ADD UP over calls, held in the model's dtype (fp16:
  // what is under 2^-24 ≈ 6e-8 becomes 0, what is over 65504 becomes inf). Returns the loss itself.
  virtual double forward_backward(int micro, float loss_factor) = 0;
  // The accumulated gradients as f32 (fp16 ones converted), after the last forward_backward. Change them
  // in place: optimizer_step steps with these f32 values.
  virtual std::vector<Grad>& grads() = 0;
  virtual void optimizer_step() = 0;  // SGD/AdamW (f32 master weights) at the current lr, then zero_grad
  virtual void skip_step() = 0;       // zero_grad, weights untouched: instead of optimizer_step
  virtual void scheduler_step() = 0;  // PyTorch's scheduler.step(): the next lr
  virtual Comm& comm() = 0;
};

// Task 3 — one optimizer step: k micro-batches whose mean loss is the big batch's, scaled; unscale; skip
// on an overflow, else clip and step; update the scaler; advance the schedule.
void train_step(Step& step, const ScalerConfig& c, ScalerState& s);

}  // namespace lab03

// The table the grader looks up in your plugin (defined at the bottom of amp.cpp).
constexpr int kLab03Abi = 1;
struct Lab03Plugin {
  int abi;  // kLab03Abi
  lab03::ScalerState (*scaler_init)(const lab03::ScalerConfig&);
  bool (*unscale)(lab03::Comm&, const lab03::ScalerState&, std::vector<lab03::Grad>&);
  void (*scaler_update)(const lab03::ScalerConfig&, lab03::ScalerState&, bool);
  double (*clip_grad_norm)(std::vector<lab03::Grad>&, double);
  void (*train_step)(lab03::Step&, const lab03::ScalerConfig&, lab03::ScalerState&);
};
extern "C" Lab03Plugin distlab_lab03;
