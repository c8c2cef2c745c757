// The course's seeded fp16 case: a gradient that fp16 loses without a loss scale. The gradient of
// 1e-3 · cross-entropy (an auxiliary loss's weight) w.r.t. a Linear(8 -> 4) weight, for 64 inputs of size
// ~1e-4, peaks around 1e-8 — under fp16's smallest value 2^-24 ≈ 6e-8, so in fp16 every value is 0; with
// the loss scaled by 2^16 it lands around 1e-3, well inside fp16's range. Lab 03's first check and
// tests/test_precision.cpp run it. Read core/optim/grad_scaler.h for the scaler that rescues it.
#pragma once
#include <vector>

#include "core/tensor/dtype.h"

namespace distlab {

// The weight's gradient after one backward of loss × loss_scale, computed with parameters, gradients and
// activations in `dt`, returned as f32 and still scaled (divide by loss_scale for the true gradient).
std::vector<float> underflow_case_gradient(DType dt, float loss_scale);

}  // namespace distlab
