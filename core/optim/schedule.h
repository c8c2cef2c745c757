// Learning-rate schedules, as a pure function of the optimizer step (0-based): constant; step (×gamma every
// step_size steps, torch's StepLR); cosine with linear warmup (lr rises linearly to base over warmup steps,
// then follows half a cosine from base down to min_lr at total_steps); linear (after the warmup, a straight
// line from base down to min_lr at total_steps).
#pragma once
#include <cstdint>
#include <string>

#include "core/util/choice.h"

namespace distlab {

// optim.schedule
enum class LrSchedule { constant, step, cosine, linear };
template <>
struct ChoiceTable<LrSchedule> {
  static constexpr std::array names = {choice(LrSchedule::constant, "constant"), choice(LrSchedule::step, "step"),
                                       choice(LrSchedule::cosine, "cosine"), choice(LrSchedule::linear, "linear")};
};

struct Schedule {
  LrSchedule kind = LrSchedule::constant;
  double base_lr = 0.1;
  int64_t warmup_steps = 0;       // linear warmup (all kinds)
  int64_t step_size = 1;          // step
  double gamma = 0.1;             // step
  double min_lr = 0.0;            // cosine, linear
  int64_t total_steps = 1;        // cosine, linear
  double lr_at(int64_t step) const;
};

}  // namespace distlab
