// Optimizers with PyTorch's update rules (torch.optim.SGD and torch.optim.AdamW), stepping over the
// parameters they were given (a ZeRO rank gives only its shard). State is created on the first step, as in
// PyTorch, in the optim_state memory category.
//
// Mixed precision (parameters held in bf16/f16): the optimizer keeps an f32 master copy of each such
// parameter in its state, made from the parameter on the first step (DeepSpeed's fp16/bf16 optimizers do the
// same). It steps the master and writes the rounded result back, so the 16-bit weights never accumulate
// rounding error: an update smaller than half a bf16 ulp still moves the master. With AdamW that is the
// course's 16 bytes per parameter: 2 (weights) + 2 (gradients) + 4 (master) + 4 + 4 (moments).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/runtime.h"
#include "core/util/choice.h"

namespace distlab {

// optim.name
enum class OptimizerKind { sgd, adamw };
template <>
struct ChoiceTable<OptimizerKind> {
  static constexpr std::array names = {choice(OptimizerKind::sgd, "sgd"), choice(OptimizerKind::adamw, "adamw")};
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter*> params) : params_(std::move(params)), master_(params_.size()) {}
  virtual ~Optimizer() = default;
  // Skips parameters without a gradient. Every gradient is read times grad_factor: 1/loss_scale and the
  // clip coefficient under mixed precision (the 16-bit gradients themselves are never rescaled in place,
  // where fp16 would lose the small ones), 1 otherwise.
  virtual void step(Runtime& rt, float lr, float grad_factor = 1.0f) = 0;
  // The same step with its gradient factor in the rank's device memory (grad_norm_on_device's), read there
  // by the kernels: the host queues the step without waiting for the norm (PyTorch's clip_grad_norm_ +
  // fused AdamW). Only where reads_device_factor(rt): AdamW on a device rank.
  virtual bool reads_device_factor(const Runtime& rt) const { return false; }
  virtual void step_device_factor(Runtime& rt, float lr, const float* factor);
  virtual std::string describe() const = 0;
  int64_t steps() const { return steps_; }
  // The f32 master weights of a 16-bit parameter once the first step made them; nullptr otherwise.
  const Tensor* master(const Parameter* p) const;
  // How the state is counted: optim_state, or host under CPU offload (set before the first step). It lives
  // where its parameter does (PyTorch's rule): a cuda rank's offloaded parts, and their state, in host memory.
  void set_state_category(Category c) { state_category_ = c; }

  // For checkpoints (core/train/trainer_ckpt.cpp). The parameters stepped, in order:
  size_t size() const { return params_.size(); }
  Parameter& param(size_t i) const { return *params_[i]; }
  // The f32 weights of parameter i a step updates (its master, made now if the first step has not, or its
  // own data when it is f32); after writing them, sync_param(i) rounds them into a 16-bit parameter.
  Tensor f32_weights(Runtime& rt, size_t i) {
    weights(rt, i);  // makes the master if needed
    return params_[i]->data.dtype() == DType::f32 ? params_[i]->data : master_[i];
  }
  void sync_param(size_t i) { write_back(i); }
  // The per-parameter state by PyTorch's names (state_dict()["state"][i]): "exp_avg" and "exp_avg_sq"
  // (AdamW), "momentum_buffer" (SGD with momentum); f32, shaped as parameter i. nullptr where it does not
  // exist yet (before the first step), unless `make`: then it is made, zeroed, as that step would.
  virtual std::vector<std::string> state_names() const = 0;
  virtual Tensor* state(Runtime& rt, size_t i, const std::string& name, bool make) = 0;
  // Steps taken by parameter i (AdamW's per-parameter t, which its bias corrections read) and in all.
  virtual int64_t param_steps(size_t i) const { return steps_; }
  virtual void set_param_steps(size_t i, int64_t t) {}
  void set_steps(int64_t s) { steps_ = s; }

 protected:
  // The f32 weights a step updates: the parameter's own (f32), or its master copy (16-bit).
  float* weights(Runtime& rt, size_t i);
  // After updating weights(rt, i): rounds the master into the 16-bit parameter.
  void write_back(size_t i);
  // New f32 state for parameter i ("exp_avg of <name>"), on the parameter's device, zeroed or not.
  Tensor new_state(Runtime& rt, size_t i, const std::string& what, bool zero);
  std::vector<Parameter*> params_;
  std::vector<Tensor> master_;  // f32 masters of 16-bit parameters (optim_state), undefined for f32 ones
  int64_t steps_ = 0;
  Category state_category_ = Category::optim_state;
};

struct SGDOptions {
  float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};

// g = grad + wd·p; buf = g on the first step, else momentum·buf + (1 − dampening)·g;
// g = g + momentum·buf (nesterov) or buf; p -= lr·g
class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter*> params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {}
  void step(Runtime& rt, float lr, float grad_factor = 1.0f) override;
  bool reads_device_factor(const Runtime& rt) const override { return rt.kernels != nullptr && !rt.is_meta(); }
  void step_device_factor(Runtime& rt, float lr, const float* factor) override;
  std::string describe() const override;
  std::vector<Tensor>& momentum_buffers() { return bufs_; }
  std::vector<std::string> state_names() const override;
  Tensor* state(Runtime& rt, size_t i, const std::string& name, bool make) override;

 private:
  SGDOptions o_;
  std::vector<Tensor> bufs_;
  const float* device_factor_ = nullptr;  // during step_device_factor
};

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};

// p -= lr·wd·p (decoupled, only for p.decay); m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
// p -= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions o) : Optimizer(std::move(params)), o_(o) {}
  const AdamWOptions& options() const { return o_; }
  void step(Runtime& rt, float lr, float grad_factor = 1.0f) override;
  bool reads_device_factor(const Runtime& rt) const override { return rt.kernels != nullptr && !rt.is_meta(); }
  void step_device_factor(Runtime& rt, float lr, const float* factor) override;
  std::string describe() const override;
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  Tensor* state(Runtime& rt, size_t i, const std::string& name, bool make) override;
  int64_t param_steps(size_t i) const override { return i < t_.size() ? t_[i] : 0; }
  void set_param_steps(size_t i, int64_t t) override;

 private:
  AdamWOptions o_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> t_;  // steps taken per parameter (PyTorch's state["step"]): bias corrections use it
  const float* device_factor_ = nullptr;  // during step_device_factor: the factor every listed tensor reads
};

// Global L2 norm of all gradients (accumulated in double); when max_norm > 0 and the norm is above it,
// scales every gradient by max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_. Returns the norm
// before clipping.
double clip_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, double max_norm);
// The same norm without touching the gradients (any dtype), and the coefficient clip_grad_norm would apply
// (1 when max_norm <= 0 or the norm is below it; NaN for a NaN norm, as PyTorch's clip_grad_norm_ multiplies
// every gradient by NaN then: never a silent step without clipping). The trainer hands the coefficient to step().
double grad_norm(Runtime& rt, const std::vector<Parameter*>& params);
float clip_coefficient(double norm, double max_norm);
// Both left in the rank's device memory without a wait (a device rank's step; core/optim/reduce.h):
// *norm = grad_norm / loss_scale, *factor = clip_coefficient(*norm, max_norm) / loss_scale, the bits the
// host computes from them (the kernel clip_factor).
void grad_norm_on_device(Runtime& rt, const std::vector<Parameter*>& params, float loss_scale, double max_norm, double* norm,
                         float* factor);

}  // namespace distlab
