// The optimizers' arithmetic on one tensor, as kernels (so a cuda rank runs them on the GPU, where its
// weights are): SGD with momentum, AdamW, and the reductions that gradient clipping and the loss scaler's
// overflow check need. core/optim/optimizer.cpp decides what to call them with; the formulas are
// PyTorch's torch.optim.SGD / AdamW (foreach=False) step for step.
#pragma once
#include <cstdint>

#include "core/ops/kernels.h"
#include "core/tensor/runtime.h"

namespace distlab {

// d = g * grad_factor + weight_decay * w; with momentum: buf = first ? d : momentum * buf + (1 - dampening) * d,
// d = nesterov ? d + momentum * buf : buf; then w -= lr * d. buf is nullptr without momentum.
void sgd_update(Runtime& rt, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u);
// g' = g * grad_factor; w *= decay; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
// w -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
void adamw_update(Runtime& rt, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u);
// adamw_update on every tensor of the list, the same bits: PyTorch's fused AdamW (one kernel over many
// tensors). On a GPU a few launches for the whole model instead of one per parameter, most of which are
// too small to keep it busy for as long as a launch takes; the naive form is the loop here.
void adamw_update_many(Runtime& rt, const AdamWTensor* ts, int64_t count);
// sum of x[i]^2, accumulated in double in index order
double sum_squares(Runtime& rt, const float* x, int64_t n);
// x *= s
void scale(Runtime& rt, float* x, int64_t n, float s);
// false when some x[i] is inf or NaN
bool all_finite(Runtime& rt, const float* x, int64_t n);
// The same two without a wait: the result goes to `out` / `flag` in the rank's device memory (the host's on
// a cpu rank), where a step gathers one per gradient and reads them back at once (core/optim/reduce.h).
// *out = sum_squares(x), the same bits; *flag = 1 when some x[i] is inf or NaN, left as it was otherwise.
void sum_squares_into(Runtime& rt, const float* x, int64_t n, double* out);
void flag_nonfinite(Runtime& rt, const float* x, int64_t n, float* flag);
// The step's gradient norm and factor from the gradients' sums of squares (sum_squares_into's n slots),
// where they are, without a wait: *norm = sqrt(Σ sums, in order) / loss_scale; *factor = the clip
// coefficient (max_norm / (norm + 1e-6) when max_norm > 0 and norm is above it, NaN for a NaN norm, else 1)
// divided by loss_scale. The trainer's host arithmetic (clip_coefficient, core/optim/optimizer.cpp), the same
// bits, for AdamW to read (AdamWTensor::factor).
void clip_factor(Runtime& rt, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm);

}  // namespace distlab
