// Softmax cross-entropy over class logits, fused like PyTorch's F.cross_entropy (mean reduction).
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// logits (N, V), targets (N) -> probs (N, V) saved for backward; returns the mean loss over rows whose
// target is >= 0 (a negative target is ignored, like ignore_index). `correct` counts argmax == target.
// loss_out (a slot of DeviceScalars, core/optim/reduce.h): the mean goes there instead, and a device rank
// returns 0 without waiting for it (the trainer reads a step's losses after the step); the caller has
// checked the targets against V on the host, since a device rank cannot raise from there. A cpu rank
// writes the slot and returns the mean as well.
double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets,
                                    int64_t N, int64_t V, int64_t* correct, double* loss_out = nullptr);
// dlogits (N, V) = scale * (probs - onehot(target)) / count, zero rows for ignored targets. `scale` lets a
// caller fold in 1/accum_steps.
void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets,
                                   int64_t N, int64_t V, float scale);
// The same on 16-bit logits and dlogits (t: bf16, f16; probs f32, autocast's rule for the loss), as a device
// rank's 16-bit run calls them: the logits widened exactly, the gradient rounded once. The cpu forms for
// cuda-sim; a GPU's read and write the 16 bits in its kernels, so neither holds an f32 copy of the logits.
double softmax_crossentropy_forward_16(Runtime& rt, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N, int64_t V,
                                       int64_t* correct, double* loss_out);
void softmax_crossentropy_backward_16(Runtime& rt, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                      float scale);


// Megatron's vocabulary-parallel cross-entropy (core/parallel/tensor_parallel.h) as three kernels, with
// the TP group's all-reduces between them. logits (N, V) are this rank's columns [first, first + V) of the
// vocabulary; mx, sum and zt are (N).
// mx = each row's max over this rank's columns (then all-reduced with max: the whole row's)
void vocab_ce_max(Runtime& rt, float* mx, const float* logits, int64_t N, int64_t V);
// probs (N, V) = exp(logits - mx); sum = each row's Σ probs, added in double; zt = the target's logit where
// this rank holds the target, else 0 (both then all-reduced with sum)
void vocab_ce_exp(Runtime& rt, float* probs, float* sum, float* zt, const float* logits, const float* mx,
                  const int32_t* targets, int64_t first, int64_t N, int64_t V);
// probs /= sum; returns the mean of log(sum) + mx - zt over rows whose target is >= 0. `correct` counts the
// rows whose target's logit is the whole row's max (no extra communication). loss_out: as above.
double vocab_ce_finish(Runtime& rt, float* probs, const float* sum, const float* zt, const float* mx, const int32_t* targets,
                       int64_t N, int64_t V, int64_t* correct, double* loss_out = nullptr);
}  // namespace distlab
