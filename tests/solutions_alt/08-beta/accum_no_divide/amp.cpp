// clinic alt (beta): the micro-batches' backward carries the loss scale only; the accumulated f32 gradients
// are divided by k afterwards, before unscaling (the mean of the k micro-batch means, applied once).
// Lab 03 — mixed precision and accumulation: the loss scaler that keeps fp16's small gradients alive,
// clipping, and one optimizer step over k micro-batches.
#include <cmath>

#include "labs/03-amp-accum/api.h"

namespace lab03 {

ScalerState scaler_init(const ScalerConfig& c) {
  /// BEGIN SOLUTION
  ScalerState s;
  s.scale = c.init_scale;
  s.growth_tracker = 0;
  return s;
  /// END SOLUTION
}

bool unscale_(Comm& comm, const ScalerState& s, std::vector<Grad>& grads) {
  /// BEGIN SOLUTION
  // in f32: divided here, where 2^-24 is no floor (the fp16 gradients themselves would flush to zero)
  const float inv = 1.0f / s.scale;
  float found = 0;
  for (auto& g : grads)
    for (int64_t i = 0; i < g.numel; i++) {
      g.data[i] *= inv;
      if (!std::isfinite(g.data[i])) found = 1;
    }
  // one rank's overflow is every rank's: a step skipped on some ranks only splits the replicas
  comm.all_reduce(&found, 1, ReduceOp::max);
  return found != 0;
  /// END SOLUTION
}

void scaler_update(const ScalerConfig& c, ScalerState& s, bool found_inf) {
  /// BEGIN SOLUTION
  if (found_inf) {
    s.scale *= c.backoff_factor;
    s.growth_tracker = 0;
    return;
  }
  if (++s.growth_tracker == c.growth_interval) {
    const float grown = s.scale * c.growth_factor;
    if (std::isfinite(grown)) s.scale = grown;
    s.growth_tracker = 0;
  }
  /// END SOLUTION
}

double clip_grad_norm(std::vector<Grad>& grads, double max_norm) {
  /// BEGIN SOLUTION
  double ss = 0;
  for (const auto& g : grads)
    for (int64_t i = 0; i < g.numel; i++) ss += double(g.data[i]) * g.data[i];
  const double norm = std::sqrt(ss);
  if (max_norm > 0 && norm > max_norm) {
    const float coef = float(max_norm / (norm + 1e-6));
    for (auto& g : grads)
      for (int64_t i = 0; i < g.numel; i++) g.data[i] *= coef;
  }
  return norm;
  /// END SOLUTION
}

void train_step(Step& step, const ScalerConfig& c, ScalerState& s) {
  /// BEGIN SOLUTION
  const int k = step.accum_steps();
  // the big batch's loss is the mean of the k micro-batches' means: each backward carries 1/k, times the scale
  for (int micro = 0; micro < k; micro++) step.forward_backward(micro, s.scale);
  std::vector<Grad>& grads = step.grads();
  const float inv_k = 1.0f / float(k);  // the sum over micro-batches -> their mean
  for (auto& g : grads)
    for (int64_t i = 0; i < g.numel; i++) g.data[i] *= inv_k;
  // unscale first: the clip threshold is about the true gradient, not the scaled one
  const bool overflow = unscale_(step.comm(), s, grads);
  if (overflow) {
    step.skip_step();
  } else {
    clip_grad_norm(grads, step.max_norm());  // once, on the accumulated gradient
    step.optimizer_step();
  }
  scaler_update(c, s, overflow);
  step.scheduler_step();  // once per optimizer step, never per micro-batch
  /// END SOLUTION
}

}  // namespace lab03

extern "C" Lab03Plugin distlab_lab03 = {kLab03Abi, lab03::scaler_init, lab03::unscale_, lab03::scaler_update,
                                        lab03::clip_grad_norm, lab03::train_step};
