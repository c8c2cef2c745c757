// Normalization kernels: LayerNorm over the last dimension, BatchNorm2d over (B, H, W) per channel.
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// out (N, C) = (inp - mean) * rstd * weight + bias, per row; mean, rstd (N) saved for backward.
void layernorm_forward(Runtime& rt, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
// The same on 16-bit out, inp, weight and bias (t: bf16 or f16; the statistics f32), as a device rank's
// LayerNorm calls it: widened exactly, the f32 kernel, the output rounded once. The cpu form for cuda-sim.
void layernorm_forward_16(Runtime& rt, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                          DType t, int64_t N, int64_t C, float eps);
// dinp (N, C) overwritten; dweight, dbias (C) accumulated
void layernorm_backward(Runtime& rt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);
// The same on 16-bit dinp, dweight, dbias, dout, inp and weight (t: bf16 or f16; mean and rstd f32): the f32
// kernel between an exact widening and one rounding of each result (dweight and dbias: old value plus the
// sums, rounded once). The cpu form for cuda-sim; a GPU's reads and writes the 16 bits in its kernels.
void layernorm_backward_16(Runtime& rt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight, const float* mean,
                           const float* rstd, DType t, int64_t N, int64_t C);

// BatchNorm2d statistics of inp (B, C, HW): mean (C) and biased variance (C), accumulated in double.
void batchnorm_stats(Runtime& rt, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW);
// out (B, C, HW) = (inp - mean) * rstd * weight + bias; rstd = 1/sqrt(var + eps) (C)
void batchnorm_apply(Runtime& rt, float* out, const float* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int64_t B, int64_t C, int64_t HW);
// Per-channel sums needed by backward: sum_dy (C) = Σ dout, sum_dy_xhat (C) = Σ dout * xhat.
void batchnorm_backward_reduce(Runtime& rt, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW);
// dinp (B, C, HW) overwritten from the sums over `count` elements per channel (count = B*HW on one rank;
// the global count under SyncBatchNorm).
void batchnorm_backward_apply(Runtime& rt, float* dinp, const float* dout, const float* inp, const float* mean,
                              const float* rstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat,
                              double count, int64_t B, int64_t C, int64_t HW);

}  // namespace distlab
