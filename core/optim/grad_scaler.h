// Loss scaling: what keeps fp16's small gradients from flushing to zero. torch.cuda.amp.GradScaler's
// algorithm with DeepSpeed's hysteresis; the trainer (core/train/trainer.cpp) uses it each step as
//
//   loss · S  → backward: every gradient is S times larger (fp16's smallest value is 2^-24 ≈ 6e-8: a
//               gradient of 1e-9 is 0 in fp16, and 1e-9 · 65536 ≈ 6.6e-5 is not)
//   found_inf(grads)       any inf/NaN on any rank (the flag is all-reduced with MAX: every rank agrees)
//     yes → skip the step  (the weights are not touched; the gradients are thrown away)
//     no  → unscale: the gradient norm and the optimizer read grad / S (the clip threshold applies to the
//           true gradient, so unscaling must come before clipping), then step
//   update(found_inf)      overflow: S · backoff_factor (after `hysteresis` overflows), growth counter 0;
//                          growth_interval clean steps in a row: S · growth_factor
//
// bf16 has f32's exponent range (down to 2^-133), so it needs no scaler: only fp16's 5 exponent bits do.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"
#include "core/tensor/runtime.h"

namespace distlab {

class ProcessGroup;

struct LossScaleOptions {
  enum class Mode { none, fixed, dynamic };
  Mode mode = Mode::none;
  double init_scale = 65536.0;  // the fixed scale when mode is fixed
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  double min_scale = 1.0;
};

class GradScaler {
 public:
  explicit GradScaler(LossScaleOptions o = {});
  bool enabled() const { return o_.mode != LossScaleOptions::Mode::none; }
  bool dynamic() const { return o_.mode == LossScaleOptions::Mode::dynamic; }
  // What the loss's gradient is multiplied by this step (1 when disabled).
  float scale() const { return scale_; }
  // True when any gradient of `params` holds an inf or a NaN on this rank or, with `pg`, on any rank.
  // Every rank must call it (it is a collective when pg has more than one rank).
  static bool found_inf(Runtime& rt, const std::vector<Parameter*>& params, ProcessGroup* pg);
  // The scale for the next step. Dynamic only; throws when an overflow happens at min_scale (the model's
  // gradients don't fit fp16 at any scale).
  void update(bool found_inf);
  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps since the last change
  int64_t hysteresis_left() const { return hysteresis_left_; }
  // A checkpoint's state put back (the scale, the clean steps since its last change, the overflows left).
  void restore(float scale, int64_t growth_tracker, int64_t hysteresis_left) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    hysteresis_left_ = hysteresis_left;
  }
  std::string describe() const;  // "dynamic loss scale (init 65536, x2 every 2000 clean steps, x0.5 on overflow)"

 private:
  LossScaleOptions o_;
  float scale_;  // f32, rounded at every update, as PyTorch's scale tensor
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_left_;
};

}  // namespace distlab
