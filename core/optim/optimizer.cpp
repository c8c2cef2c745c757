#include "core/optim/optimizer.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/ops/cpu/optim.h"
#include "core/ops/op_scope.h"
#include "core/optim/reduce.h"
#include "core/tensor/as_f32.h"

namespace distlab {

const Tensor* Optimizer::master(const Parameter* p) const {
  for (size_t i = 0; i < params_.size(); i++)
    if (params_[i] == p) return master_[i].defined() ? &master_[i] : nullptr;
  return nullptr;
}

float* Optimizer::weights(Runtime& rt, size_t i) {
  Parameter& p = *params_[i];
  if (p.data.dtype() == DType::f32) return p.data.f32();
  if (!master_[i].defined()) {
    master_[i] = new_state(rt, i, "f32 master weights of ", false);
    master_[i].copy_from(p.data);  // on the device of the weights (a no-op on meta)
  }
  return master_[i].f32();
}

Tensor Optimizer::new_state(Runtime& rt, size_t i, const std::string& what, bool zero) {
  const Parameter& p = *params_[i];
  const DeviceKind d = rt.is_meta() ? DeviceKind::meta : p.data.device();
  return zero ? Tensor::zeros(p.data.shape(), rt.memory, d, state_category_, DType::f32, what + p.name)
              : Tensor::empty(p.data.shape(), rt.memory, d, state_category_, DType::f32, what + p.name);
}

void Optimizer::write_back(size_t i) {
  Parameter& p = *params_[i];
  if (master_[i].defined()) p.data.copy_from(master_[i]);
}

void SGD::step(Runtime& rt, float lr, float grad_factor) {
  if (bufs_.empty()) bufs_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); i++) {
    Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    const int64_t n = p.data.numel();
    bool first = false;
    if (o_.momentum != 0.0f && !bufs_[i].defined()) {
      bufs_[i] = new_state(rt, i, "momentum of ", false);
      first = true;
    }
    float* w = weights(rt, i);
    OpScope op(rt, "sgd_step", 4.0 * n, 4.0 * 4 * n, /*scales_with_batch=*/false);
    if (rt.is_meta()) continue;
    AsF32 g(rt, p.grad);
    sgd_update(rt, w, bufs_[i].defined() ? bufs_[i].f32() : nullptr, g.p, n,
               SgdUpdate{lr, grad_factor, o_.weight_decay, o_.momentum, o_.dampening, o_.nesterov, first, device_factor_});
    write_back(i);
  }
  steps_++;
}

std::vector<std::string> SGD::state_names() const {
  if (o_.momentum == 0.0f) return {};
  return {"momentum_buffer"};
}

Tensor* SGD::state(Runtime& rt, size_t i, const std::string& name, bool make) {
  if (name != "momentum_buffer" || o_.momentum == 0.0f) return nullptr;
  if (bufs_.empty()) bufs_.resize(params_.size());
  if (!bufs_[i].defined() && make) bufs_[i] = new_state(rt, i, "momentum of ", true);
  return bufs_[i].defined() ? &bufs_[i] : nullptr;
}

std::string SGD::describe() const {
  return fmt::format("SGD(momentum {}, weight_decay {}{})", o_.momentum, o_.weight_decay, o_.nesterov ? ", nesterov" : "");
}

void AdamW::step(Runtime& rt, float lr, float grad_factor) {
  if (m_.empty()) {
    m_.resize(params_.size());
    v_.resize(params_.size());
    t_.assign(params_.size(), 0);
  }
  steps_++;
  // A device rank queues every parameter's update in one list and launches it at the end (PyTorch's fused
  // AdamW: a few kernels for the model, not one per parameter); the 16-bit gradients are read in place.
  // A cpu rank steps each parameter in turn (the naive form: the same bits).
  const bool many = rt.kernels != nullptr && !rt.is_meta();
  std::vector<AdamWTensor> list;
  std::vector<size_t> listed;
  for (size_t i = 0; i < params_.size(); i++) {
    Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    const int64_t n = p.data.numel();
    const int64_t t = ++t_[i];
    const double bc1 = 1.0 - std::pow(double(o_.beta1), double(t));
    const double bc2 = 1.0 - std::pow(double(o_.beta2), double(t));
    const float step_size = float(lr / bc1);
    const float bc2_sqrt = float(std::sqrt(bc2));
    if (!m_[i].defined()) {
      m_[i] = new_state(rt, i, "exp_avg of ", true);
      v_[i] = new_state(rt, i, "exp_avg_sq of ", true);
    }
    float* w = weights(rt, i);
    // each parameter's FLOPs and bytes, listed or not (a listed one's time is the list's launch, after the loop)
    OpScope op(rt, "adamw_step", 12.0 * n, 4.0 * 7 * n, /*scales_with_batch=*/false);
    if (rt.is_meta()) continue;
    const float decay = p.decay ? 1.0f - lr * o_.weight_decay : 1.0f;
    const AdamWUpdate u{grad_factor, decay, o_.beta1, o_.beta2, step_size, bc2_sqrt, o_.eps};
    if (many) {
      list.push_back({w, m_[i].f32(), v_[i].f32(), p.grad.data(), p.grad.dtype(), n, u, device_factor_});
      listed.push_back(i);
      continue;
    }
    DL_ASSERT(!device_factor_, "AdamW's device factor on a rank that steps parameter by parameter");
    AsF32 g(rt, p.grad);
    adamw_update(rt, w, m_[i].f32(), v_[i].f32(), g.p, n, u);
    write_back(i);
  }
  if (list.empty()) return;
  adamw_update_many(rt, list.data(), int64_t(list.size()));
  for (size_t i : listed) write_back(i);  // queued after the update: the 16-bit weights from the new masters
}

void Optimizer::step_device_factor(Runtime&, float, const float*) {
  throw Error(fmt::format("{} cannot read its gradient factor from device memory", describe()),
              "check reads_device_factor() first: the step then takes a factor computed on the host");
}

void SGD::step_device_factor(Runtime& rt, float lr, const float* factor) {
  DL_ASSERT(reads_device_factor(rt), "SGD::step_device_factor on a rank without device kernels");
  struct Clear {
    const float*& p;
    ~Clear() { p = nullptr; }
  } clear{device_factor_};
  device_factor_ = factor;
  step(rt, lr, 1.0f);  // each parameter's update reads *factor where grad_factor would be
}

void AdamW::step_device_factor(Runtime& rt, float lr, const float* factor) {
  DL_ASSERT(reads_device_factor(rt), "AdamW::step_device_factor on a rank without device kernels");
  struct Clear {  // the pointer is this step's only, even when the step throws
    const float*& p;
    ~Clear() { p = nullptr; }
  } clear{device_factor_};
  device_factor_ = factor;
  step(rt, lr, 1.0f);  // every listed tensor reads *factor where u.grad_factor would be
}

Tensor* AdamW::state(Runtime& rt, size_t i, const std::string& name, bool make) {
  if (name != "exp_avg" && name != "exp_avg_sq") return nullptr;
  if (m_.empty()) {
    if (!make) return nullptr;
    m_.resize(params_.size());
    v_.resize(params_.size());
    t_.assign(params_.size(), 0);
  }
  if (!m_[i].defined() && make) {
    m_[i] = new_state(rt, i, "exp_avg of ", true);
    v_[i] = new_state(rt, i, "exp_avg_sq of ", true);
  }
  Tensor& t = name == "exp_avg" ? m_[i] : v_[i];
  return t.defined() ? &t : nullptr;
}

void AdamW::set_param_steps(size_t i, int64_t t) {
  if (m_.empty()) {
    m_.resize(params_.size());
    v_.resize(params_.size());
    t_.assign(params_.size(), 0);
  }
  t_[i] = t;
}

std::string AdamW::describe() const {
  return fmt::format("AdamW(betas ({}, {}), eps {}, weight_decay {})", o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
}

double grad_norm(Runtime& rt, const std::vector<Parameter*>& params) {
  int64_t n = 0;
  for (auto* p : params)
    if (p->grad.defined()) n += p->grad.numel();
  OpScope op(rt, "grad_norm", 2.0 * n, 4.0 * n, /*scales_with_batch=*/false);
  if (rt.is_meta()) return 0.0;
  // each gradient's squares into a slot of its own, read back at once (core/optim/reduce.h): one wait
  DeviceScalars sums(rt, int64_t(params.size()), "the gradient norm's sums");
  for (size_t i = 0; i < params.size(); i++) {
    if (!params[i]->grad.defined()) continue;
    AsF32 g(rt, params[i]->grad);
    sum_squares_into(rt, g.p, params[i]->grad.numel(), sums.sum(int64_t(i)));
  }
  return std::sqrt(sums.total());  // the parameters in order
}

void grad_norm_on_device(Runtime& rt, const std::vector<Parameter*>& params, float loss_scale, double max_norm, double* norm,
                         float* factor) {
  int64_t n = 0;
  for (auto* p : params)
    if (p->grad.defined()) n += p->grad.numel();
  OpScope op(rt, "grad_norm", 2.0 * n, 4.0 * n, /*scales_with_batch=*/false);
  DeviceScalars sums(rt, int64_t(params.size()), "the gradient norm's sums");  // freed in stream order after clip_factor
  for (size_t i = 0; i < params.size(); i++) {
    if (!params[i]->grad.defined()) continue;
    AsF32 g(rt, params[i]->grad);
    sum_squares_into(rt, g.p, params[i]->grad.numel(), sums.sum(int64_t(i)));
  }
  clip_factor(rt, factor, norm, params.empty() ? nullptr : sums.sum(0), int64_t(params.size()), loss_scale, max_norm);
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm > 0 && std::isnan(norm)) return std::numeric_limits<float>::quiet_NaN();  // PyTorch's too: a NaN poisons every gradient
  return max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
}

double clip_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, double max_norm) {
  const double norm = grad_norm(rt, params);
  const float coef = clip_coefficient(norm, max_norm);
  if (coef == 1.0f || rt.is_meta()) return norm;
  for (auto* p : params) {
    if (!p->grad.defined()) continue;
    AsF32 g(rt, p->grad, AsF32::inout);
    scale(rt, g.p, p->grad.numel(), coef);
    g.store();
  }
  return norm;
}

}  // namespace distlab
