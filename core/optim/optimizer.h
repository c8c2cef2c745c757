// Optimizers with PyTorch's update rules (torch.optim.SGD and torch.optim.AdamW), stepping over the
// parameters they were given (a ZeRO rank gives only its shard). State is created on the first step, as in
// PyTorch, in the optim_state memory category.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/runtime.h"

namespace distlab {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(Runtime& rt, float lr) = 0;  // skips parameters without a gradient
  virtual std::string describe() const = 0;
  int64_t steps() const { return steps_; }

 protected:
  int64_t steps_ = 0;
};

struct SGDOptions {
  float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};

// g = grad + wd·p; buf = g on the first step, else momentum·buf + (1 − dampening)·g;
// g = g + momentum·buf (nesterov) or buf; p -= lr·g
class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter*> params, SGDOptions o) : params_(std::move(params)), o_(o) {}
  void step(Runtime& rt, float lr) override;
  std::string describe() const override;
  std::vector<Tensor>& momentum_buffers() { return bufs_; }

 private:
  std::vector<Parameter*> params_;
  SGDOptions o_;
  std::vector<Tensor> bufs_;
};

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};

// p -= lr·wd·p (decoupled, only for p.decay); m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
// p -= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions o) : params_(std::move(params)), o_(o) {}
  void step(Runtime& rt, float lr) override;
  std::string describe() const override;
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }

 private:
  std::vector<Parameter*> params_;
  AdamWOptions o_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> t_;  // steps taken per parameter (PyTorch's state["step"]): bias corrections use it
};

// Global L2 norm of all gradients (accumulated in double); when max_norm > 0 and the norm is above it,
// scales every gradient by max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_. Returns the norm
// before clipping.
double clip_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, double max_norm);

}  // namespace distlab
