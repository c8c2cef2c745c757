#include "core/optim/grad_scaler.h"

#include <fmt/format.h>

#include <cmath>

#include "core/comm/process_group.h"
#include "core/ops/cpu/optim.h"
#include "core/optim/reduce.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

GradScaler::GradScaler(LossScaleOptions o)
    : o_(o), scale_(o.mode == LossScaleOptions::Mode::none ? 1.0f : float(o.init_scale)), hysteresis_left_(o.hysteresis) {}

bool GradScaler::found_inf(Runtime& rt, const std::vector<Parameter*>& params, ProcessGroup* pg) {
  float flag = 0;
  if (!rt.is_meta() && !params.empty()) {  // every gradient checked into one flag, read back once (core/optim/reduce.h)
    DeviceScalars found(rt, 1, "the overflow flag");
    for (auto* p : params) {
      if (!p->grad.defined()) continue;
      AsF32 g(rt, p->grad);
      flag_nonfinite(rt, g.p, p->grad.numel(), found.flag(0));
    }
    flag = found.any_flag() ? 1.0f : 0.0f;
  }
  // one rank's overflow is every rank's: a step skipped on some ranks only would split the replicas
  if (pg && pg->size() > 1) pg->all_reduce(&flag, 1, ReduceOp::max);
  return flag != 0;
}

// torch's _amp_update_scale_ (growth tracker; no growth past f32's range) + DeepSpeed's hysteresis: with
// hysteresis h, the first h-1 overflows after a growth only skip their step; the h-th backs off.
void GradScaler::update(bool found_inf) {
  if (o_.mode != LossScaleOptions::Mode::dynamic) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (hysteresis_left_ > 1) {
      hysteresis_left_--;
      return;
    }
    if (scale_ <= o_.min_scale)
      throw Error(fmt::format("fp16 overflow at the minimum loss scale {}: the gradients hold inf/NaN however small "
                              "the scale", o_.min_scale),
                  "the model leaves fp16's range (65504) on its own: use precision.mode = \"bf16\", lower optim.lr, or "
                  "clip (optim.clip_grad_norm)");
    scale_ = float(std::max(double(scale_) * o_.backoff_factor, o_.min_scale));
    return;
  }
  if (++growth_tracker_ == o_.growth_interval) {
    const float grown = float(double(scale_) * o_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
    hysteresis_left_ = o_.hysteresis;  // DeepSpeed restores the hysteresis when the scale grows
  }
}

std::string GradScaler::describe() const {
  switch (o_.mode) {
    case LossScaleOptions::Mode::none: return "no loss scaling";
    case LossScaleOptions::Mode::fixed: return fmt::format("static loss scale {}", o_.init_scale);
    case LossScaleOptions::Mode::dynamic:
      return fmt::format("dynamic loss scale (init {}, x{} every {} clean steps, x{} on {}overflow, min {})", o_.init_scale,
                         o_.growth_factor, o_.growth_interval, o_.backoff_factor,
                         o_.hysteresis > 1 ? fmt::format("the {}th ", o_.hysteresis) : "", o_.min_scale);
  }
  return "";
}

}  // namespace distlab
