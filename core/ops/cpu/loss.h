// Softmax cross-entropy over class logits, fused like PyTorch's F.cross_entropy (mean reduction).
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// logits (N, V), targets (N) -> probs (N, V) saved for backward; returns the mean loss over rows whose
// target is >= 0 (a negative target is ignored, like ignore_index). `correct` counts argmax == target.
double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets,
                                    int64_t N, int64_t V, int64_t* correct);
// dlogits (N, V) = scale * (probs - onehot(target)) / count, zero rows for ignored targets. `scale` lets a
// caller fold in 1/accum_steps.
void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets,
                                   int64_t N, int64_t V, float scale);

}  // namespace distlab
