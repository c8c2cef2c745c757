// The kernels LLaMA adds to GPT-2's (Touvron et al. 2023; Hugging Face's modeling_llama.py):
//   RMSNorm   y = x / sqrt(mean(x²) + eps) · w            no mean subtracted, no bias (Zhang & Sennrich 2019)
//   RoPE      q, k rotated by position: pairs (i, i + d/2) of each head turn by t·θ^(-2i/d)  (Su et al. 2021;
//             Hugging Face's rotate_half layout, not the interleaved pairs of the original code)
//   SwiGLU    h = silu(gate) · up                          the MLP's gated activation (Shazeer 2020)
//   repeat_kv grouped-query attention's kv heads, each repeated for the n_head / n_kv_head query heads that
//             share it (Hugging Face's eager path), so that the fused attention kernels of attention.h run
// Read next: core/nn/llama.h (the layers built from them), core/ops/cpu/attention.h (the attention core).
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// out (N, C) = inp · rstd · weight per row; rstd (N) = 1 / sqrt(mean(inp²) + eps), saved for backward
void rmsnorm_forward(Runtime& rt, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
// dinp (N, C) overwritten; dweight (C) accumulated
void rmsnorm_backward(Runtime& rt, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);

// In place on x (B, T, H, hd) — row stride `ld` floats, heads at x + h·hd — for positions 0..T-1:
//   x[i] ← x[i]·cos(t·f_i) − x[i + hd/2]·sin(t·f_i),  x[i + hd/2] ← x[i + hd/2]·cos(t·f_i) + x[i]·sin(t·f_i)
// with f_i = θ^(-2i/hd), i < hd/2, in float as Hugging Face computes it. `inverse` turns the other way: the
// backward of a rotation is the rotation back (dx = Rᵀ dy).
// `pos` (T): the positions of the T tokens in the whole sequence (context parallel); nullptr: 0..T-1
void rope_apply(Runtime& rt, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse,
                const int32_t* pos = nullptr);

// out (n) = silu(gate) · up, silu(g) = g · σ(g)
void swiglu_forward(Runtime& rt, float* out, const float* gate, const float* up, int64_t n);
// dgate, dup (n) overwritten: dgate = dout · up · σ(g)(1 + g(1 − σ(g))), dup = dout · silu(g)
void swiglu_backward(Runtime& rt, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// qkv (B, T, 3·H·hd) from q (B, T, H·hd) and k, v (B, T, KV·hd): query head h meets kv head h / (H/KV)
void repeat_kv_forward(Runtime& rt, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd);
// dq (B, T, H·hd), dk, dv (B, T, KV·hd) overwritten from dqkv: a kv head's gradient sums its query heads', in order
void repeat_kv_backward(Runtime& rt, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd);

// The 16-bit forms a device rank's 16-bit LLaMA calls (t: bf16 or f16; rstd f32): the f32 kernels above
// between an exact widening and one rounding of each result, so a device's run takes the cpu's very steps
// where the cpu goes through f32 copies. The cpu forms run on cuda-sim; a GPU's read and write the 16 bits
// in its kernels (core/ops/cuda/llama.cu).
void rmsnorm_forward_16(Runtime& rt, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps);
void rmsnorm_backward_16(Runtime& rt, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd, DType t,
                         int64_t N, int64_t C);
void swiglu_forward_16(Runtime& rt, void* out, const void* gate, const void* up, DType t, int64_t n);
void swiglu_backward_16(Runtime& rt, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n);
// Attention's inputs (positions 0..T-1): k (and q where rotate_q) turned by RoPE in place, each rotated
// value rounded once, then qkv (B, T, 3·H·hd) = [q, k repeated, v repeated] (repeat_kv_forward: copies)
void rope_repeat_kv_forward_16(Runtime& rt, void* qkv, void* q, void* k, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, float theta, bool rotate_q);
// ... and its backward: dq, dk, dv (overwritten) = repeat_kv_backward of dqkv (a kv head's gradient the sum
// of its query heads' in f32), dq and dk turned back by RoPE, then each rounded once
void rope_repeat_kv_backward_16(Runtime& rt, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                               int64_t KV, int64_t hd, float theta);

}  // namespace distlab
