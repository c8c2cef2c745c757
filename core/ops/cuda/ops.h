// The CUDA kernels: one function for each kernel of core/ops/cpu, with the same name, arguments and
// meaning, in namespace distlab::cuda. Pointers are device pointers; `rt.cuda` is the rank's GPU (its
// compute stream and cuBLAS handle). Each records the same trace event (name, FLOPs, bytes) as its cpu
// twin, so the cost model sees one model whatever the device.
//
// The kernels are the naive, readable first version: one thread per output element, a block per row for
// the reductions, GEMMs through cuBLAS. No atomics: every result is summed in a fixed order, so a run is
// bitwise repeatable on the same GPU (the embedding's backward pays for this: see attention.cu).
// Files: pointwise.cu (activations, dropout, add, max-pool), matmul.cu (cuBLAS GEMM in f32, TF32, bf16,
// fp16), conv.cu (im2col + GEMM), norm.cu, loss.cu, attention.cu (+ embedding, flash attention), attention_tc.cu
// (flash attention on tensor cores), llama.cu
// (RMSNorm, RoPE, SwiGLU, repeat_kv), convert.cu (dtypes, fill),
// optim.cu (SGD, AdamW, the norm and overflow reductions), nf4.cu (QLoRA's dequantize); core/cuda/kernel_table.cpp lists them for rt.kernels.
// tests/cuda/test_cuda_parity.cpp runs each against the cpu kernel on random inputs.
#pragma once
#include <cstdint>

#include "core/cuda/context.h"
#include "core/ops/cpu/conv.h"  // ConvShape
#include "core/ops/kernels.h"   // SgdUpdate, AdamWUpdate
#include "core/tensor/runtime.h"

namespace distlab::cuda {

// ---- pointwise.cu ----
void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n);
void relu_backward(Runtime& rt, float* dinp, const float* dout, const float* out, int64_t n);
void gelu_forward(Runtime& rt, float* out, const float* inp, int64_t n);
void gelu_backward(Runtime& rt, float* dinp, const float* dout, const float* inp, int64_t n);
void gelu_forward_16(Runtime& rt, void* out, const void* inp, DType t, int64_t n);
void gelu_backward_16(Runtime& rt, void* dinp, const void* dout, const void* inp, DType t, int64_t n);
void add_16(Runtime& rt, void* out, const void* a, const void* b, DType t, int64_t n);
void accumulate_16(Runtime& rt, void* dst, const void* src, DType t, int64_t n);
// The mask comes from a counter-based hash of (seed, i), not the cpu kernel's sequential stream: the same
// seed gives the same mask on every run and GPU, but not the cpu's mask (as torch's CPU and CUDA
// generators differ).
void dropout_forward(Runtime& rt, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed);
void dropout_backward(Runtime& rt, float* dinp, const float* dout, const float* mask, int64_t n);
void add_forward(Runtime& rt, float* out, const float* a, const float* b, int64_t n);
void accumulate(Runtime& rt, float* dst, const float* src, int64_t n);
void maxpool2d_forward(Runtime& rt, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t K, int64_t stride);
void maxpool2d_backward(Runtime& rt, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                        int64_t H, int64_t W, int64_t OH, int64_t OW);

// ---- matmul.cu ----
void matmul_forward(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t C, int64_t OC);
// the cpu's linear_forward_16 (core/ops/cpu/matmul.h) in one cublasLtMatmul on the 16-bit tensors
void linear_forward_16(Runtime& rt, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C,
                       int64_t OC);
void linear_backward_16(Runtime& rt, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t,
                        int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw);
// the cpu's linear_gelu_forward_16 in one cublasLtMatmul (the GELU_AUX_BIAS epilogue), where cuBLASLt has it
void linear_gelu_forward_16(Runtime& rt, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                            int64_t C, int64_t OC);
void matmul_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t C, int64_t OC, bool need_dinp = true, bool need_dw = true);
void bias_forward(Runtime& rt, float* out, const float* bias, int64_t N, int64_t OC);
// the column sums in matmul_backward's two deterministic passes (the same bits every run; not the cpu's order)
void bias_backward(Runtime& rt, float* dbias, const float* dout, int64_t N, int64_t OC);
// Row-major C (M, N) = alpha op(A) op(B) + beta C in rt.cuda->math: f32; tf32; or bf16/f16, where A and B
// are first rounded to 16 bits (into scratch) and the products accumulate in f32 (what the cpu emulates).
void gemm(Runtime& rt, const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same on typed operands (each f32, bf16 or f16), no conversion: the path whose speed is cuBLAS's own.
// `math` tf32 applies to f32 operands only; 16-bit operands always multiply on tensor cores with f32 sums.
void gemm_ex(Runtime& rt, const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, DType a_type, int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C,
             DType c_type, int64_t ldc, GemmMath math);
// A 16x16-tiled shared-memory GEMM in f32, written out: the baseline the benchmark sets against cuBLAS.
void gemm_naive(Runtime& rt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// ---- conv.cu ----
void im2col(Runtime& rt, float* col, const float* inp, const ConvShape& s);
void col2im(Runtime& rt, float* dinp, const float* col, const ConvShape& s);
void conv2d_forward(Runtime& rt, float* out, float* col, const float* inp, const float* w, const float* bias,
                    const ConvShape& s);
void conv2d_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* col,
                     const float* w, const ConvShape& s, bool need_dinp = true);

// ---- norm.cu ----
void layernorm_forward_16(Runtime& rt, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                          DType t, int64_t N, int64_t C, float eps);
void layernorm_forward(Runtime& rt, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(Runtime& rt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);
void layernorm_backward_16(Runtime& rt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight, const float* mean,
                           const float* rstd, DType t, int64_t N, int64_t C);
void batchnorm_stats(Runtime& rt, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW);
void batchnorm_apply(Runtime& rt, float* out, const float* inp, const float* mean, const float* rstd,
                     const float* weight, const float* bias, int64_t B, int64_t C, int64_t HW);
void batchnorm_backward_reduce(Runtime& rt, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW);
void batchnorm_backward_apply(Runtime& rt, float* dinp, const float* dout, const float* inp, const float* mean,
                              const float* rstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat,
                              double count, int64_t B, int64_t C, int64_t HW);

// ---- loss.cu ----
// As the cpu kernel. Without loss_out the mean loss and `correct` come back to the host (a wait, as
// loss.item() is PyTorch's) and a target >= V raises the cpu kernel's DataError; with loss_out (training)
// the mean stays in that device slot, read after the step, and the caller has checked the targets.
double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets, int64_t N,
                                    int64_t V, int64_t* correct, double* loss_out);
void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets, int64_t N,
                                   int64_t V, float scale);
// ... on 16-bit logits and dlogits, read and written in the kernels (no f32 copy of the logits)
double softmax_crossentropy_forward_16(Runtime& rt, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N, int64_t V,
                                       int64_t* correct, double* loss_out);
void softmax_crossentropy_backward_16(Runtime& rt, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                      float scale);
// The vocabulary-parallel loss's three steps (core/ops/cpu/loss.h): a block per row; the sums in f32 by the
// block (the cpu adds in double); vocab_ce_finish brings the mean loss and `correct` to the host, or leaves
// the mean in loss_out.
void vocab_ce_max(Runtime& rt, float* mx, const float* logits, int64_t N, int64_t V);
void vocab_ce_exp(Runtime& rt, float* probs, float* sum, float* zt, const float* logits, const float* mx,
                  const int32_t* targets, int64_t first, int64_t N, int64_t V);
double vocab_ce_finish(Runtime& rt, float* probs, const float* sum, const float* zt, const float* mx, const int32_t* targets,
                       int64_t N, int64_t V, int64_t* correct, double* loss_out);

// ---- attention.cu ----
void attention_forward(Runtime& rt, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
void attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH);
// FlashAttention-2 (core/ops/cpu/attention.h): head size up to 256. Under 16-bit GEMM math on sm 80 and
// later, for head sizes 32, 64, 96 and 128, they run attention_tc.cu's tensor-core kernels (16-bit
// products, f32 sums); elsewhere CUDA cores in f32.
void flash_attention_forward(Runtime& rt, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH);
void flash_attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
// The GPU's 16-bit forms (core/ops/cpu/attention.h): the tensor-core kernels on the tensors as they are
// (lse f32), where the run's 16-bit type is t and the tensor cores take the head size; elsewhere the f32
// kernels between copies.
void flash_attention_forward_16(Runtime& rt, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                int64_t NH);
void flash_attention_backward_16(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                 DType t, int64_t B, int64_t T, int64_t C, int64_t NH);
// ---- attention_tc.cu ----
// Whether flash attention takes the tensor cores on this rank for head size hs (the math, the GPU, the
// shared memory it gives); the two kernels below, untraced (the callers above record the event).
// io16: qkv, out, dout and dqkv are the run's 16-bit type (flash_attention_*_16's), else f32.
bool flash_tensor_cores(Runtime& rt, int64_t hs);
void flash_tc_forward(Runtime& rt, void* out, float* lse, const void* qkv, bool io16, int64_t B, int64_t T, int64_t C, int64_t NH);
void flash_tc_backward(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, bool io16,
                       int64_t B, int64_t T, int64_t C, int64_t NH);
void embedding_forward_16(Runtime& rt, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                          int64_t C);
void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C);
void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

// ---- llama.cu (core/ops/cpu/llama.h) ----
void rmsnorm_forward(Runtime& rt, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
void rmsnorm_backward(Runtime& rt, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);
void rope_apply(Runtime& rt, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse);
void rmsnorm_forward_16(Runtime& rt, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps);
void rmsnorm_backward_16(Runtime& rt, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd,
                         DType t, int64_t N, int64_t C);
void swiglu_forward_16(Runtime& rt, void* out, const void* gate, const void* up, DType t, int64_t n);
void swiglu_backward_16(Runtime& rt, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n);
void rope_repeat_kv_forward_16(Runtime& rt, void* qkv, void* q, void* k, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd, float theta, bool rotate_q);
void rope_repeat_kv_backward_16(Runtime& rt, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                                int64_t KV, int64_t hd, float theta);
void swiglu_forward(Runtime& rt, float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(Runtime& rt, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);
void repeat_kv_forward(Runtime& rt, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd);
void repeat_kv_backward(Runtime& rt, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd);

// ---- optim.cu ----
void sgd_update(Runtime& rt, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u);
void adamw_update(Runtime& rt, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u);
void adamw_update_many(Runtime& rt, const AdamWTensor* ts, int64_t count);
// these two read their result back to the host (a synchronization, as .item() is)
double sum_squares(Runtime& rt, const float* x, int64_t n);
bool all_finite(Runtime& rt, const float* x, int64_t n);
void sum_squares_into(Runtime& rt, const float* x, int64_t n, double* out);
void flag_nonfinite(Runtime& rt, const float* x, int64_t n, float* flag);
void clip_factor(Runtime& rt, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm);
void scale(Runtime& rt, float* x, int64_t n, float s);

// ---- nf4.cu ----
void dequantize_nf4(Runtime& rt, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                    int64_t n, int64_t block, int64_t block2);

// The table of these kernels that a cuda rank's Runtime points at (rt.kernels; core/ops/kernels.h).
const Kernels& kernel_table();

// ---- convert.cu ----
// dst[i] = src[i] converted, rounding to nearest even into 16 bits (the bits of core/tensor/dtype.h)
void convert(Runtime& rt, const void* src, DType src_type, void* dst, DType dst_type, int64_t n);
void fill(Runtime& rt, void* dst, DType type, float value, int64_t n);
// convert() and fill() on a given stream, for code that has a stream but no Runtime (the NCCL group's
// 16-bit wire, the tensors' device memory)
void convert_on(cudaStream_t stream, const void* src, DType src_type, void* dst, DType dst_type, int64_t n);
void fill_on(cudaStream_t stream, void* dst, DType type, float value, int64_t n);

}  // namespace distlab::cuda
