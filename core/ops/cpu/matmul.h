// Matrix multiply kernels on OpenBLAS, in the nn.Linear convention: weights are (OC, C) = [out, in].
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// out (N, OC) = inp (N, C) @ w^T + bias; w is (OC, C), bias (OC) or nullptr.
void matmul_forward(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t C, int64_t OC);
// matmul_forward on 16-bit tensors (t: bf16 or f16, out, inp, w and bias all of it), as a device rank's
// nn.Linear calls it: the values widened to f32 (exactly), matmul_forward, the result rounded once. The
// naive form of what a GPU does in one GEMM (16-bit operands, f32 sums, the bias in the epilogue, a 16-bit
// output), with no f32 copies of the operands. Not called on a cpu rank (AsF32 and matmul_forward are).
void linear_forward_16(Runtime& rt, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C,
                       int64_t OC);
// matmul_backward on 16-bit tensors the same way: dinp written, dw and dbias accumulated (each rounded
// once from f32: its old value plus the f32 product or sums), every operand read as it is.
void linear_backward_16(Runtime& rt, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t,
                        int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw);
// GPT's MLP up-projection and its GELU (tanh) in one: pre (N, OC) = inp @ wᵀ + bias, as linear_forward_16
// writes it, and out = gelu(pre), as gelu_forward_16 computes it from pre. A GPU does both in one cuBLASLt
// call (the GELU_AUX_BIAS epilogue: pre written as the aux output GELU's backward reads, out = the GELU
// of the f32 sums, rounded once: within a rounding of these); here, the two kernels.
void linear_gelu_forward_16(Runtime& rt, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                            int64_t C, int64_t OC);
// The same with three loops, for tests and the benchmark's baseline.
void matmul_forward_naive(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C,
                          int64_t OC);
// dinp (N, C) = dout @ w   (overwritten; skipped unless need_dinp)
// dw (OC, C) += dout^T @ inp (skipped unless need_dw: a frozen weight under LoRA); dbias (OC) += column
// sums of dout (skipped when nullptr)
// FLOPs count the matrix products only (the convention of MFU tables), so they don't depend on pointers
// and a meta run records exactly what a cpu run does.
void matmul_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t C, int64_t OC, bool need_dinp = true, bool need_dw = true);

// out (N, OC) += bias (OC) on every row: a bias added on its own, after the product (a row-parallel layer
// adds it once, after the all-reduce of its ranks' partial products; core/parallel/tensor_parallel.h)
void bias_forward(Runtime& rt, float* out, const float* bias, int64_t N, int64_t OC);
// dbias (OC) += column sums of dout (N, OC), the rows in order: matmul_backward's bias part on its own
void bias_backward(Runtime& rt, float* dbias, const float* dout, int64_t N, int64_t OC);

// Row-major C (M, N) = alpha * op(A) @ op(B) + beta * C, recorded as one trace event named `name`.
void gemm(Runtime& rt, const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same without a trace event, for kernels that record their own (conv2d, attention).
void blas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace distlab
