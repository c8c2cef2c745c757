// Elementwise kernels: activations, dropout, residual adds, and max pooling.
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// out (n) = max(inp, 0)
void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n);
// dinp (n) = dout where out > 0 (overwritten)
void relu_backward(Runtime& rt, float* dinp, const float* dout, const float* out, int64_t n);

// GELU, tanh approximation (PyTorch's approximate="tanh", GPT-2's)
void gelu_forward(Runtime& rt, float* out, const float* inp, int64_t n);
void gelu_backward(Runtime& rt, float* dinp, const float* dout, const float* inp, int64_t n);
// The same on 16-bit tensors (t: bf16 or f16), as a device rank's GELU calls them: each value widened
// (exactly), the f32 formula, the result rounded once; a GPU reads and writes 2 bytes an element where the
// f32 kernel behind f32 copies moves 20. The cpu forms are the naive ones (cuda-sim runs them).
void gelu_forward_16(Runtime& rt, void* out, const void* inp, DType t, int64_t n);
void gelu_backward_16(Runtime& rt, void* dinp, const void* dout, const void* inp, DType t, int64_t n);
// add_forward and accumulate on 16-bit tensors the same way (the residual stream's adds)
void add_16(Runtime& rt, void* out, const void* a, const void* b, DType t, int64_t n);
void accumulate_16(Runtime& rt, void* dst, const void* src, DType t, int64_t n);

// Inverted dropout: mask[i] = 0 or 1/(1-p), out = inp * mask. mask drawn from `seed` (deterministic).
void dropout_forward(Runtime& rt, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed);
void dropout_backward(Runtime& rt, float* dinp, const float* dout, const float* mask, int64_t n);

// out (n) = a + b
void add_forward(Runtime& rt, float* out, const float* a, const float* b, int64_t n);
// dst (n) += src
void accumulate(Runtime& rt, float* dst, const float* src, int64_t n);

// Max pooling, (B, C, H, W) -> (B, C, OH, OW) with OH = (H - K) / stride + 1; argmax (B, C, OH, OW) keeps the
// flat index within the plane of the winning input, for backward. Ties go to the first (PyTorch's rule).
void maxpool2d_forward(Runtime& rt, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C,
                       int64_t H, int64_t W, int64_t K, int64_t stride);
// dinp (B, C, H, W) overwritten
void maxpool2d_backward(Runtime& rt, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                        int64_t H, int64_t W, int64_t OH, int64_t OW);

}  // namespace distlab
