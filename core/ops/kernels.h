// How an op reaches the kernels of the rank's device: a table of function pointers, one per kernel, with
// the cpu kernels' signatures. `rt.kernels` is nullptr on cpu and meta (the cpu kernels run, or record
// their cost and return); a cuda rank points it at libdistlab_cuda.so's table (core/cuda/entry.cpp), which
// is loaded at run time, so the rest of distlab is built and linked without any GPU library.
//
// Each cpu kernel starts with the one line that forwards the call:
//
//   void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
//     if (rt.kernels) return rt.kernels->relu_forward(rt, out, inp, n);
//     ...the cpu loop...
//
// so a layer calls relu_forward(rt, ...) and runs on whatever device its tensors are on: this is
// PyTorch's dispatcher with one key (the device) and no autograd. A pointer handed to a kernel is on the
// rank's device; code outside the kernels must not read through it (core/ops/sim_device.h makes a read
// crash, so CI can check that without a GPU).
#pragma once
#include <cstdint>

#include "core/tensor/dtype.h"

namespace distlab {

struct Runtime;
struct ConvShape;

// The optimizers' per-tensor updates (core/ops/cpu/optim.h), as arguments.
struct SgdUpdate {
  float lr, grad_factor, weight_decay, momentum, dampening;
  bool nesterov;
  bool first;  // the momentum buffer is new: it starts as the first gradient (PyTorch)
  const float* factor = nullptr;  // where set, grad_factor in device memory (clip_factor's), read in its place
};
struct AdamWUpdate {
  float grad_factor, decay, beta1, beta2, step_size, bc2_sqrt, eps;  // decay = 1 - lr * weight_decay (or 1)
};
// One tensor of a multi-tensor AdamW step: what adamw_update takes, the gradient in its own dtype (f32,
// bf16, f16: read as f32, which every 16-bit value is exactly). factor: where set, the gradient factor in
// the rank's device memory (clip_factor's), read in place of u.grad_factor, so the host never waits for it.
struct AdamWTensor {
  float *w, *m, *v;
  const void* g;
  DType g_type;
  int64_t n;
  AdamWUpdate u;
  const float* factor = nullptr;
};

struct Kernels {
  const char* device;  // "cuda", "cuda-sim": for messages

  // ---- pointwise.h ----
  void (*relu_forward)(Runtime&, float* out, const float* inp, int64_t n);
  void (*relu_backward)(Runtime&, float* dinp, const float* dout, const float* out, int64_t n);
  void (*gelu_forward)(Runtime&, float* out, const float* inp, int64_t n);
  void (*gelu_backward)(Runtime&, float* dinp, const float* dout, const float* inp, int64_t n);
  void (*gelu_forward_16)(Runtime&, void* out, const void* inp, DType t, int64_t n);
  void (*gelu_backward_16)(Runtime&, void* dinp, const void* dout, const void* inp, DType t, int64_t n);
  void (*add_16)(Runtime&, void* out, const void* a, const void* b, DType t, int64_t n);
  void (*layernorm_forward_16)(Runtime&, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                               DType t, int64_t N, int64_t C, float eps);
  void (*accumulate_16)(Runtime&, void* dst, const void* src, DType t, int64_t n);
  void (*dropout_forward)(Runtime&, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed);
  void (*dropout_backward)(Runtime&, float* dinp, const float* dout, const float* mask, int64_t n);
  void (*add_forward)(Runtime&, float* out, const float* a, const float* b, int64_t n);
  void (*accumulate)(Runtime&, float* dst, const float* src, int64_t n);
  void (*maxpool2d_forward)(Runtime&, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C, int64_t H,
                            int64_t W, int64_t K, int64_t stride);
  void (*maxpool2d_backward)(Runtime&, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C,
                             int64_t H, int64_t W, int64_t OH, int64_t OW);
  // ---- matmul.h ----
  void (*matmul_forward)(Runtime&, float* out, const float* inp, const float* w, const float* bias, int64_t N,
                         int64_t C, int64_t OC);
  void (*matmul_backward)(Runtime&, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                          const float* w, int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw);
  void (*linear_forward_16)(Runtime&, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C,
                            int64_t OC);
  void (*linear_backward_16)(Runtime&, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t,
                             int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw);
  void (*linear_gelu_forward_16)(Runtime&, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                                 int64_t C, int64_t OC);
  void (*bias_forward)(Runtime&, float* out, const float* bias, int64_t N, int64_t OC);
  void (*bias_backward)(Runtime&, float* dbias, const float* dout, int64_t N, int64_t OC);
  void (*gemm)(Runtime&, const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
  // ---- conv.h ----
  void (*conv2d_forward)(Runtime&, float* out, float* col, const float* inp, const float* w, const float* bias,
                         const ConvShape& s);
  void (*conv2d_backward)(Runtime&, float* dinp, float* dw, float* dbias, const float* dout, const float* col,
                          const float* w, const ConvShape& s, bool need_dinp);
  // ---- norm.h ----
  void (*layernorm_forward)(Runtime&, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int64_t N, int64_t C, float eps);
  void (*layernorm_backward)(Runtime&, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);
  void (*layernorm_backward_16)(Runtime&, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                                const float* mean, const float* rstd, DType t, int64_t N, int64_t C);
  void (*batchnorm_stats)(Runtime&, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW);
  void (*batchnorm_apply)(Runtime&, float* out, const float* inp, const float* mean, const float* rstd,
                          const float* weight, const float* bias, int64_t B, int64_t C, int64_t HW);
  void (*batchnorm_backward_reduce)(Runtime&, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp,
                                    const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW);
  void (*batchnorm_backward_apply)(Runtime&, float* dinp, const float* dout, const float* inp, const float* mean,
                                   const float* rstd, const float* weight, const float* sum_dy,
                                   const float* sum_dy_xhat, double count, int64_t B, int64_t C, int64_t HW);
  // ---- loss.h ----
  double (*softmax_crossentropy_forward)(Runtime&, float* probs, const float* logits, const int32_t* targets, int64_t N,
                                         int64_t V, int64_t* correct, double* loss_out);
  void (*softmax_crossentropy_backward)(Runtime&, float* dlogits, const float* probs, const int32_t* targets, int64_t N,
                                        int64_t V, float scale);
  double (*softmax_crossentropy_forward_16)(Runtime&, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N,
                                            int64_t V, int64_t* correct, double* loss_out);
  void (*softmax_crossentropy_backward_16)(Runtime&, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N,
                                           int64_t V, float scale);
  void (*vocab_ce_max)(Runtime&, float* mx, const float* logits, int64_t N, int64_t V);
  void (*vocab_ce_exp)(Runtime&, float* probs, float* sum, float* zt, const float* logits, const float* mx,
                       const int32_t* targets, int64_t first, int64_t N, int64_t V);
  double (*vocab_ce_finish)(Runtime&, float* probs, const float* sum, const float* zt, const float* mx,
                            const int32_t* targets, int64_t N, int64_t V, int64_t* correct, double* loss_out);
  // ---- attention.h ----
  void (*attention_forward)(Runtime&, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                            int64_t NH);
  void (*attention_backward)(Runtime&, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                             int64_t T, int64_t C, int64_t NH);
  void (*flash_attention_forward)(Runtime&, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                                  int64_t NH);  // nullptr: the device has none (model.attention = "flash" is refused there)
  void (*flash_attention_backward)(Runtime&, float* dqkv, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
  // the 16-bit forms (bf16, f16: qkv, out, dout, dqkv in t; lse f32)
  void (*flash_attention_forward_16)(Runtime&, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                     int64_t NH);
  void (*flash_attention_backward_16)(Runtime&, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                      DType t, int64_t B, int64_t T, int64_t C, int64_t NH);
  void (*embedding_forward)(Runtime&, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                            int64_t T, int64_t C);
  void (*embedding_forward_16)(Runtime&, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                               int64_t C);
  void (*embedding_backward)(Runtime&, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                             int64_t T, int64_t C);
  // ---- llama.h (nullptr: the device has none yet; the op says so) ----
  void (*rmsnorm_forward)(Runtime&, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps);
  void (*rmsnorm_backward)(Runtime&, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t N, int64_t C);
  void (*rope_apply)(Runtime&, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse);
  void (*swiglu_forward)(Runtime&, float* out, const float* gate, const float* up, int64_t n);
  void (*swiglu_backward)(Runtime&, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);
  void (*repeat_kv_forward)(Runtime&, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                            int64_t KV, int64_t hd);
  void (*repeat_kv_backward)(Runtime&, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t hd);
  // the 16-bit forms (t: bf16 or f16; rstd f32): core/ops/cpu/llama.h
  void (*rmsnorm_forward_16)(Runtime&, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps);
  void (*rmsnorm_backward_16)(Runtime&, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd,
                              DType t, int64_t N, int64_t C);
  void (*swiglu_forward_16)(Runtime&, void* out, const void* gate, const void* up, DType t, int64_t n);
  void (*swiglu_backward_16)(Runtime&, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n);
  void (*rope_repeat_kv_forward_16)(Runtime&, void* qkv, void* q, void* k, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                                    int64_t hd, float theta, bool rotate_q);
  void (*rope_repeat_kv_backward_16)(Runtime&, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                                     int64_t KV, int64_t hd, float theta);
  // ---- nf4.h ----
  void (*dequantize_nf4)(Runtime&, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                         int64_t n, int64_t block, int64_t block2);
  // ---- optim.h ----
  void (*sgd_update)(Runtime&, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u);
  void (*adamw_update)(Runtime&, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u);
  void (*adamw_update_many)(Runtime&, const AdamWTensor* ts, int64_t count);
  double (*sum_squares)(Runtime&, const float* x, int64_t n);
  void (*scale)(Runtime&, float* x, int64_t n, float s);
  bool (*all_finite)(Runtime&, const float* x, int64_t n);
  void (*sum_squares_into)(Runtime&, const float* x, int64_t n, double* out);  // out: device memory, nothing waits
  void (*flag_nonfinite)(Runtime&, const float* x, int64_t n, float* flag);
  void (*clip_factor)(Runtime&, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm);
};

}  // namespace distlab
