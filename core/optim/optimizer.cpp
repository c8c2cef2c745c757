#include "core/optim/optimizer.h"

#include <fmt/format.h>

#include <cmath>

#include "core/ops/op_scope.h"

namespace distlab {

void SGD::step(Runtime& rt, float lr) {
  if (bufs_.empty()) bufs_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); i++) {
    Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    const int64_t n = p.data.numel();
    bool first = false;
    if (o_.momentum != 0.0f && !bufs_[i].defined()) {
      bufs_[i] = rt.empty(p.data.shape(), Category::optim_state, "momentum of " + p.name);
      first = true;
    }
    OpScope op(rt, "sgd_step", 4.0 * n, 4.0 * 4 * n, /*scales_with_batch=*/false);
    if (rt.is_meta()) continue;
    float* w = p.data.f32();
    const float* g = p.grad.f32();
    float* buf = bufs_[i].defined() ? bufs_[i].f32() : nullptr;
    for (int64_t j = 0; j < n; j++) {
      float d = g[j] + o_.weight_decay * w[j];
      if (buf) {
        buf[j] = first ? d : o_.momentum * buf[j] + (1.0f - o_.dampening) * d;
        d = o_.nesterov ? d + o_.momentum * buf[j] : buf[j];
      }
      w[j] -= lr * d;
    }
  }
  steps_++;
}

std::string SGD::describe() const {
  return fmt::format("SGD(momentum {}, weight_decay {}{})", o_.momentum, o_.weight_decay, o_.nesterov ? ", nesterov" : "");
}

void AdamW::step(Runtime& rt, float lr) {
  if (m_.empty()) {
    m_.resize(params_.size());
    v_.resize(params_.size());
    t_.assign(params_.size(), 0);
  }
  steps_++;
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
      m_[i] = rt.zeros(p.data.shape(), Category::optim_state, "exp_avg of " + p.name);
      v_[i] = rt.zeros(p.data.shape(), Category::optim_state, "exp_avg_sq of " + p.name);
    }
    OpScope op(rt, "adamw_step", 12.0 * n, 4.0 * 7 * n, /*scales_with_batch=*/false);
    if (rt.is_meta()) continue;
    float* w = p.data.f32();
    const float* g = p.grad.f32();
    float* m = m_[i].f32();
    float* v = v_[i].f32();
    const float decay = p.decay ? 1.0f - lr * o_.weight_decay : 1.0f;
    for (int64_t j = 0; j < n; j++) {
      w[j] *= decay;
      m[j] = o_.beta1 * m[j] + (1.0f - o_.beta1) * g[j];
      v[j] = o_.beta2 * v[j] + (1.0f - o_.beta2) * g[j] * g[j];
      w[j] -= step_size * m[j] / (std::sqrt(v[j]) / bc2_sqrt + o_.eps);
    }
  }
}

std::string AdamW::describe() const {
  return fmt::format("AdamW(betas ({}, {}), eps {}, weight_decay {})", o_.beta1, o_.beta2, o_.eps, o_.weight_decay);
}

double clip_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, double max_norm) {
  int64_t n = 0;
  for (auto* p : params)
    if (p->grad.defined()) n += p->grad.numel();
  OpScope op(rt, "grad_norm", 2.0 * n, 4.0 * n, /*scales_with_batch=*/false);
  if (rt.is_meta()) return 0.0;
  double ss = 0;
  for (auto* p : params) {
    if (!p->grad.defined()) continue;
    const float* g = p->grad.f32();
    for (int64_t j = 0; j < p->grad.numel(); j++) ss += double(g[j]) * g[j];
  }
  double norm = std::sqrt(ss);
  if (max_norm > 0 && norm > max_norm) {
    float coef = float(max_norm / (norm + 1e-6));
    for (auto* p : params) {
      if (!p->grad.defined()) continue;
      float* g = p->grad.f32();
      for (int64_t j = 0; j < p->grad.numel(); j++) g[j] *= coef;
    }
  }
  return norm;
}

}  // namespace distlab
