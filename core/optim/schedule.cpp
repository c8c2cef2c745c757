#include "core/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace distlab {

double Schedule::lr_at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return base_lr * double(step + 1) / double(warmup_steps);
  if (kind == LrSchedule::step) return base_lr * std::pow(gamma, double(step / std::max<int64_t>(step_size, 1)));
  if (kind == LrSchedule::cosine) {
    int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
    double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  if (kind == LrSchedule::linear) {  // DeepSpeed's WarmupDecayLR, transformers' get_linear_schedule_with_warmup
    int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
    double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
    return base_lr + (min_lr - base_lr) * progress;
  }
  return base_lr;
}

}  // namespace distlab
