// cuda-sim's kernel table (core/ops/sim_device.h): each entry takes the poison off its pointers and runs the
// cpu kernel, the rank a cpu rank for that call (HostKernels). Its device memory: sim_memory.cpp.
#include "core/ops/sim_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/llama.h"
#include "core/ops/cpu/conv.h"
#include "core/ops/cpu/loss.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/nf4.h"
#include "core/ops/cpu/norm.h"
#include "core/ops/cpu/optim.h"
#include "core/ops/cpu/pointwise.h"
#include "core/tensor/runtime.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// A kernel that returns a value to the host waits for the device, as the GPU's does (DeviceMemory::host_waits).
void host_wait(Runtime& rt) {
  if (DeviceMemory* d = rt.memory.device_memory()) d->count_host_wait();
}

template <class T>
T* dev(T* p, const char* kernel) {
  return static_cast<T*>(const_cast<void*>(sim_host_address(p, kernel)));
}

// For the length of one kernel the rank is a cpu rank (HostKernels, core/tensor/runtime.h): the cpu kernel
// does not dispatch back here, and the workspace it allocates (conv's columns, attention's scores) is host
// memory it can use.

namespace sim {

void relu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  HostKernels cpu(rt);
  distlab::relu_forward(rt, dev(out, "relu_forward"), dev(inp, "relu_forward"), n);
}

void relu_backward(Runtime& rt, float* dinp, const float* dout, const float* out, int64_t n) {
  HostKernels cpu(rt);
  distlab::relu_backward(rt, dev(dinp, "relu_backward"), dev(dout, "relu_backward"), dev(out, "relu_backward"), n);
}

void gelu_forward(Runtime& rt, float* out, const float* inp, int64_t n) {
  HostKernels cpu(rt);
  distlab::gelu_forward(rt, dev(out, "gelu_forward"), dev(inp, "gelu_forward"), n);
}

void gelu_forward_16(Runtime& rt, void* out, const void* inp, DType t, int64_t n) {
  HostKernels cpu(rt);
  distlab::gelu_forward_16(rt, dev(out, "gelu_forward_16"), dev(inp, "gelu_forward_16"), t, n);
}

void gelu_backward_16(Runtime& rt, void* dinp, const void* dout, const void* inp, DType t, int64_t n) {
  HostKernels cpu(rt);
  distlab::gelu_backward_16(rt, dev(dinp, "gelu_backward_16"), dev(dout, "gelu_backward_16"), dev(inp, "gelu_backward_16"), t, n);
}

void add_16(Runtime& rt, void* out, const void* a, const void* b, DType t, int64_t n) {
  HostKernels cpu(rt);
  distlab::add_16(rt, dev(out, "add_16"), dev(a, "add_16"), dev(b, "add_16"), t, n);
}

void accumulate_16(Runtime& rt, void* dst, const void* src, DType t, int64_t n) {
  HostKernels cpu(rt);
  distlab::accumulate_16(rt, dev(dst, "accumulate_16"), dev(src, "accumulate_16"), t, n);
}

void gelu_backward(Runtime& rt, float* dinp, const float* dout, const float* inp, int64_t n) {
  HostKernels cpu(rt);
  distlab::gelu_backward(rt, dev(dinp, "gelu_backward"), dev(dout, "gelu_backward"), dev(inp, "gelu_backward"), n);
}

void dropout_forward(Runtime& rt, float* out, float* mask, const float* inp, int64_t n, float p, uint64_t seed) {
  HostKernels cpu(rt);
  distlab::dropout_forward(rt, dev(out, "dropout_forward"), dev(mask, "dropout_forward"), dev(inp, "dropout_forward"), n, p, seed);
}

void dropout_backward(Runtime& rt, float* dinp, const float* dout, const float* mask, int64_t n) {
  HostKernels cpu(rt);
  distlab::dropout_backward(rt, dev(dinp, "dropout_backward"), dev(dout, "dropout_backward"), dev(mask, "dropout_backward"), n);
}

void add_forward(Runtime& rt, float* out, const float* a, const float* b, int64_t n) {
  HostKernels cpu(rt);
  distlab::add_forward(rt, dev(out, "add_forward"), dev(a, "add_forward"), dev(b, "add_forward"), n);
}

void accumulate(Runtime& rt, float* dst, const float* src, int64_t n) {
  HostKernels cpu(rt);
  distlab::accumulate(rt, dev(dst, "accumulate"), dev(src, "accumulate"), n);
}

void maxpool2d_forward(Runtime& rt, float* out, int32_t* argmax, const float* inp, int64_t B, int64_t C, int64_t H, int64_t W, int64_t K, int64_t stride) {
  HostKernels cpu(rt);
  distlab::maxpool2d_forward(rt, dev(out, "maxpool2d_forward"), dev(argmax, "maxpool2d_forward"), dev(inp, "maxpool2d_forward"), B, C, H, W, K, stride);
}

void maxpool2d_backward(Runtime& rt, float* dinp, const float* dout, const int32_t* argmax, int64_t B, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  HostKernels cpu(rt);
  distlab::maxpool2d_backward(rt, dev(dinp, "maxpool2d_backward"), dev(dout, "maxpool2d_backward"), dev(argmax, "maxpool2d_backward"), B, C, H, W, OH, OW);
}

void linear_forward_16(Runtime& rt, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C, int64_t OC) {
  HostKernels cpu(rt);
  distlab::linear_forward_16(rt, dev(out, "linear_forward_16"), dev(inp, "linear_forward_16"), dev(w, "linear_forward_16"),
                             bias ? dev(bias, "linear_forward_16") : nullptr, t, N, C, OC);
}

void linear_gelu_forward_16(Runtime& rt, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                            int64_t C, int64_t OC) {
  HostKernels cpu(rt);
  const char* k = "linear_gelu_forward_16";
  distlab::linear_gelu_forward_16(rt, dev(out, k), dev(pre, k), dev(inp, k), dev(w, k), bias ? dev(bias, k) : nullptr, t, N, C, OC);
}

void linear_backward_16(Runtime& rt, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t, int64_t N,
                        int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  HostKernels cpu(rt);
  auto d = [](auto* p) { return p ? dev(p, "linear_backward_16") : nullptr; };
  distlab::linear_backward_16(rt, d(dinp), d(dw), d(dbias), d(dout), d(inp), d(w), t, N, C, OC, need_dinp, need_dw);
}

void matmul_forward(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C, int64_t OC) {
  HostKernels cpu(rt);
  distlab::matmul_forward(rt, dev(out, "matmul_forward"), dev(inp, "matmul_forward"), dev(w, "matmul_forward"), dev(bias, "matmul_forward"), N, C, OC);
}

void matmul_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  HostKernels cpu(rt);
  distlab::matmul_backward(rt, dev(dinp, "matmul_backward"), dev(dw, "matmul_backward"), dev(dbias, "matmul_backward"), dev(dout, "matmul_backward"), dev(inp, "matmul_backward"), dev(w, "matmul_backward"), N, C, OC, need_dinp, need_dw);
}

void bias_forward(Runtime& rt, float* out, const float* bias, int64_t N, int64_t OC) {
  HostKernels cpu(rt);
  distlab::bias_forward(rt, dev(out, "bias_forward"), dev(bias, "bias_forward"), N, OC);
}

void bias_backward(Runtime& rt, float* dbias, const float* dout, int64_t N, int64_t OC) {
  HostKernels cpu(rt);
  distlab::bias_backward(rt, dev(dbias, "bias_backward"), dev(dout, "bias_backward"), N, OC);
}

void gemm(Runtime& rt, const char* name, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  HostKernels cpu(rt);
  distlab::gemm(rt, name, trans_a, trans_b, M, N, K, alpha, dev(A, "gemm"), lda, dev(B, "gemm"), ldb, beta, dev(C, "gemm"), ldc);
}

void conv2d_forward(Runtime& rt, float* out, float* col, const float* inp, const float* w, const float* bias, const ConvShape& s) {
  HostKernels cpu(rt);
  distlab::conv2d_forward(rt, dev(out, "conv2d_forward"), dev(col, "conv2d_forward"), dev(inp, "conv2d_forward"), dev(w, "conv2d_forward"), dev(bias, "conv2d_forward"), s);
}

void conv2d_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* col, const float* w, const ConvShape& s, bool need_dinp) {
  HostKernels cpu(rt);
  distlab::conv2d_backward(rt, dev(dinp, "conv2d_backward"), dev(dw, "conv2d_backward"), dev(dbias, "conv2d_backward"), dev(dout, "conv2d_backward"), dev(col, "conv2d_backward"), dev(w, "conv2d_backward"), s, need_dinp);
}

void layernorm_forward_16(Runtime& rt, void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias, DType t,
                          int64_t N, int64_t C, float eps) {
  HostKernels cpu(rt);
  const char* k = "layernorm_forward_16";
  distlab::layernorm_forward_16(rt, dev(out, k), dev(mean, k), dev(rstd, k), dev(inp, k), dev(weight, k), dev(bias, k), t, N, C, eps);
}

void layernorm_forward(Runtime& rt, float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
  HostKernels cpu(rt);
  distlab::layernorm_forward(rt, dev(out, "layernorm_forward"), dev(mean, "layernorm_forward"), dev(rstd, "layernorm_forward"), dev(inp, "layernorm_forward"), dev(weight, "layernorm_forward"), dev(bias, "layernorm_forward"), N, C, eps);
}

void layernorm_backward_16(Runtime& rt, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight, const float* mean,
                           const float* rstd, DType t, int64_t N, int64_t C) {
  HostKernels cpu(rt);
  const char* k = "layernorm_backward_16";
  distlab::layernorm_backward_16(rt, dev(dinp, k), dev(dweight, k), dev(dbias, k), dev(dout, k), dev(inp, k), dev(weight, k), dev(mean, k),
                                 dev(rstd, k), t, N, C);
}

void layernorm_backward(Runtime& rt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  HostKernels cpu(rt);
  distlab::layernorm_backward(rt, dev(dinp, "layernorm_backward"), dev(dweight, "layernorm_backward"), dev(dbias, "layernorm_backward"), dev(dout, "layernorm_backward"), dev(inp, "layernorm_backward"), dev(weight, "layernorm_backward"), dev(mean, "layernorm_backward"), dev(rstd, "layernorm_backward"), N, C);
}

void batchnorm_stats(Runtime& rt, float* mean, float* var, const float* inp, int64_t B, int64_t C, int64_t HW) {
  HostKernels cpu(rt);
  distlab::batchnorm_stats(rt, dev(mean, "batchnorm_stats"), dev(var, "batchnorm_stats"), dev(inp, "batchnorm_stats"), B, C, HW);
}

void batchnorm_apply(Runtime& rt, float* out, const float* inp, const float* mean, const float* rstd, const float* weight, const float* bias, int64_t B, int64_t C, int64_t HW) {
  HostKernels cpu(rt);
  distlab::batchnorm_apply(rt, dev(out, "batchnorm_apply"), dev(inp, "batchnorm_apply"), dev(mean, "batchnorm_apply"), dev(rstd, "batchnorm_apply"), dev(weight, "batchnorm_apply"), dev(bias, "batchnorm_apply"), B, C, HW);
}

void batchnorm_backward_reduce(Runtime& rt, float* sum_dy, float* sum_dy_xhat, const float* dout, const float* inp, const float* mean, const float* rstd, int64_t B, int64_t C, int64_t HW) {
  HostKernels cpu(rt);
  distlab::batchnorm_backward_reduce(rt, dev(sum_dy, "batchnorm_backward_reduce"), dev(sum_dy_xhat, "batchnorm_backward_reduce"), dev(dout, "batchnorm_backward_reduce"), dev(inp, "batchnorm_backward_reduce"), dev(mean, "batchnorm_backward_reduce"), dev(rstd, "batchnorm_backward_reduce"), B, C, HW);
}

void batchnorm_backward_apply(Runtime& rt, float* dinp, const float* dout, const float* inp, const float* mean, const float* rstd, const float* weight, const float* sum_dy, const float* sum_dy_xhat, double count, int64_t B, int64_t C, int64_t HW) {
  HostKernels cpu(rt);
  distlab::batchnorm_backward_apply(rt, dev(dinp, "batchnorm_backward_apply"), dev(dout, "batchnorm_backward_apply"), dev(inp, "batchnorm_backward_apply"), dev(mean, "batchnorm_backward_apply"), dev(rstd, "batchnorm_backward_apply"), dev(weight, "batchnorm_backward_apply"), dev(sum_dy, "batchnorm_backward_apply"), dev(sum_dy_xhat, "batchnorm_backward_apply"), count, B, C, HW);
}

double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets, int64_t N, int64_t V, int64_t* correct, double* loss_out) {
  if (!loss_out) host_wait(rt);  // into a device slot: nothing comes back now
  DL_ASSERT(!(correct && loss_out), "softmax_crossentropy_forward: `correct` is read back, a slot is not: one or the other");
  HostKernels cpu(rt);
  const double mean = distlab::softmax_crossentropy_forward(rt, dev(probs, "softmax_crossentropy_forward"), dev(logits, "softmax_crossentropy_forward"), dev(targets, "softmax_crossentropy_forward"), N, V, correct, loss_out ? dev(loss_out, "softmax_crossentropy_forward") : nullptr);
  return loss_out ? 0.0 : mean;  // as a GPU: the value is in the slot, not here
}

void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V, float scale) {
  HostKernels cpu(rt);
  distlab::softmax_crossentropy_backward(rt, dev(dlogits, "softmax_crossentropy_backward"), dev(probs, "softmax_crossentropy_backward"), dev(targets, "softmax_crossentropy_backward"), N, V, scale);
}

double softmax_crossentropy_forward_16(Runtime& rt, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N, int64_t V,
                                       int64_t* correct, double* loss_out) {
  if (!loss_out) host_wait(rt);
  DL_ASSERT(!(correct && loss_out), "softmax_crossentropy_forward_16: `correct` is read back, a slot is not: one or the other");
  HostKernels cpu(rt);
  const char* k = "softmax_crossentropy_forward_16";
  const double mean = distlab::softmax_crossentropy_forward_16(rt, dev(probs, k), dev(logits, k), t, dev(targets, k), N, V, correct,
                                                               loss_out ? dev(loss_out, k) : nullptr);
  return loss_out ? 0.0 : mean;
}

void softmax_crossentropy_backward_16(Runtime& rt, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                      float scale) {
  HostKernels cpu(rt);
  const char* k = "softmax_crossentropy_backward_16";
  distlab::softmax_crossentropy_backward_16(rt, dev(dlogits, k), t, dev(probs, k), dev(targets, k), N, V, scale);
}

void attention_forward(Runtime& rt, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  HostKernels cpu(rt);
  distlab::attention_forward(rt, dev(out, "attention_forward"), dev(att, "attention_forward"), dev(qkv, "attention_forward"), B, T, C, NH);
}

void attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  HostKernels cpu(rt);
  distlab::attention_backward(rt, dev(dqkv, "attention_backward"), dev(dout, "attention_backward"), dev(qkv, "attention_backward"), dev(att, "attention_backward"), B, T, C, NH);
}

void flash_attention_forward(Runtime& rt, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  HostKernels cpu(rt);
  distlab::flash_attention_forward(rt, dev(out, "flash_attention_forward"), dev(lse, "flash_attention_forward"),
                                   dev(qkv, "flash_attention_forward"), B, T, C, NH);
}

void flash_attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                              int64_t T, int64_t C, int64_t NH) {
  HostKernels cpu(rt);
  distlab::flash_attention_backward(rt, dev(dqkv, "flash_attention_backward"), dev(dout, "flash_attention_backward"),
                                    dev(qkv, "flash_attention_backward"), dev(out, "flash_attention_backward"),
                                    dev(lse, "flash_attention_backward"), B, T, C, NH);
}

void flash_attention_forward_16(Runtime& rt, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                int64_t NH) {
  HostKernels cpu(rt);
  distlab::flash_attention_forward_16(rt, dev(out, "flash_attention_forward_16"), dev(lse, "flash_attention_forward_16"),
                                      dev(qkv, "flash_attention_forward_16"), t, B, T, C, NH);
}

void flash_attention_backward_16(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                 DType t, int64_t B, int64_t T, int64_t C, int64_t NH) {
  HostKernels cpu(rt);
  distlab::flash_attention_backward_16(rt, dev(dqkv, "flash_attention_backward_16"), dev(dout, "flash_attention_backward_16"),
                                       dev(qkv, "flash_attention_backward_16"), dev(out, "flash_attention_backward_16"),
                                       dev(lse, "flash_attention_backward_16"), t, B, T, C, NH);
}

void rmsnorm_forward_16(Runtime& rt, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps) {
  HostKernels cpu(rt);
  const char* k = "rmsnorm_forward_16";
  distlab::rmsnorm_forward_16(rt, dev(out, k), dev(rstd, k), dev(inp, k), dev(weight, k), t, N, C, eps);
}

void rmsnorm_backward_16(Runtime& rt, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd,
                         DType t, int64_t N, int64_t C) {
  HostKernels cpu(rt);
  const char* k = "rmsnorm_backward_16";
  distlab::rmsnorm_backward_16(rt, dev(dinp, k), dev(dweight, k), dev(dout, k), dev(inp, k), dev(weight, k), dev(rstd, k), t, N, C);
}

void swiglu_forward_16(Runtime& rt, void* out, const void* gate, const void* up, DType t, int64_t n) {
  HostKernels cpu(rt);
  const char* k = "swiglu_forward_16";
  distlab::swiglu_forward_16(rt, dev(out, k), dev(gate, k), dev(up, k), t, n);
}

void swiglu_backward_16(Runtime& rt, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n) {
  HostKernels cpu(rt);
  const char* k = "swiglu_backward_16";
  distlab::swiglu_backward_16(rt, dev(dgate, k), dev(dup, k), dev(dout, k), dev(gate, k), dev(up, k), t, n);
}

void rope_repeat_kv_forward_16(Runtime& rt, void* qkv, void* q, void* kk, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd, float theta, bool rotate_q) {
  HostKernels cpu(rt);
  const char* k = "rope_repeat_kv_forward_16";
  distlab::rope_repeat_kv_forward_16(rt, dev(qkv, k), dev(q, k), dev(kk, k), dev(v, k), t, B, T, H, KV, hd, theta, rotate_q);
}

void rope_repeat_kv_backward_16(Runtime& rt, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                                int64_t KV, int64_t hd, float theta) {
  HostKernels cpu(rt);
  const char* k = "rope_repeat_kv_backward_16";
  distlab::rope_repeat_kv_backward_16(rt, dev(dq, k), dev(dk, k), dev(dv, k), dev(dqkv, k), t, B, T, H, KV, hd, theta);
}

void rmsnorm_forward(Runtime& rt, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
  HostKernels cpu(rt);
  distlab::rmsnorm_forward(rt, dev(out, "rmsnorm_forward"), dev(rstd, "rmsnorm_forward"), dev(inp, "rmsnorm_forward"), dev(weight, "rmsnorm_forward"),
                           N, C, eps);
}

void rmsnorm_backward(Runtime& rt, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                      int64_t N, int64_t C) {
  HostKernels cpu(rt);
  distlab::rmsnorm_backward(rt, dev(dinp, "rmsnorm_backward"), dev(dweight, "rmsnorm_backward"), dev(dout, "rmsnorm_backward"),
                            dev(inp, "rmsnorm_backward"), dev(weight, "rmsnorm_backward"), dev(rstd, "rmsnorm_backward"), N, C);
}

void rope_apply(Runtime& rt, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse) {
  HostKernels cpu(rt);
  distlab::rope_apply(rt, dev(x, "rope_apply"), B, T, H, hd, ld, theta, inverse);
}

void swiglu_forward(Runtime& rt, float* out, const float* gate, const float* up, int64_t n) {
  HostKernels cpu(rt);
  distlab::swiglu_forward(rt, dev(out, "swiglu_forward"), dev(gate, "swiglu_forward"), dev(up, "swiglu_forward"), n);
}

void swiglu_backward(Runtime& rt, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  HostKernels cpu(rt);
  distlab::swiglu_backward(rt, dev(dgate, "swiglu_backward"), dev(dup, "swiglu_backward"), dev(dout, "swiglu_backward"), dev(gate, "swiglu_backward"),
                           dev(up, "swiglu_backward"), n);
}

void repeat_kv_forward(Runtime& rt, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd) {
  HostKernels cpu(rt);
  distlab::repeat_kv_forward(rt, dev(qkv, "repeat_kv_forward"), dev(q, "repeat_kv_forward"), dev(k, "repeat_kv_forward"), dev(v, "repeat_kv_forward"),
                             B, T, H, KV, hd);
}

void repeat_kv_backward(Runtime& rt, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd) {
  HostKernels cpu(rt);
  distlab::repeat_kv_backward(rt, dev(dq, "repeat_kv_backward"), dev(dk, "repeat_kv_backward"), dev(dv, "repeat_kv_backward"),
                              dev(dqkv, "repeat_kv_backward"), B, T, H, KV, hd);
}

void vocab_ce_max(Runtime& rt, float* mx, const float* logits, int64_t N, int64_t V) {
  HostKernels cpu(rt);
  distlab::vocab_ce_max(rt, dev(mx, "vocab_ce_max"), dev(logits, "vocab_ce_max"), N, V);
}

void vocab_ce_exp(Runtime& rt, float* probs, float* sum, float* zt, const float* logits, const float* mx, const int32_t* targets, int64_t first, int64_t N, int64_t V) {
  HostKernels cpu(rt);
  distlab::vocab_ce_exp(rt, dev(probs, "vocab_ce_exp"), dev(sum, "vocab_ce_exp"), dev(zt, "vocab_ce_exp"), dev(logits, "vocab_ce_exp"), dev(mx, "vocab_ce_exp"), dev(targets, "vocab_ce_exp"), first, N, V);
}

double vocab_ce_finish(Runtime& rt, float* probs, const float* sum, const float* zt, const float* mx, const int32_t* targets, int64_t N, int64_t V, int64_t* correct, double* loss_out) {
  if (!loss_out) host_wait(rt);
  DL_ASSERT(!(correct && loss_out), "vocab_ce_finish: `correct` is read back, a slot is not: one or the other");
  HostKernels cpu(rt);
  const double mean = distlab::vocab_ce_finish(rt, dev(probs, "vocab_ce_finish"), dev(sum, "vocab_ce_finish"), dev(zt, "vocab_ce_finish"), dev(mx, "vocab_ce_finish"), dev(targets, "vocab_ce_finish"), N, V, correct, loss_out ? dev(loss_out, "vocab_ce_finish") : nullptr);
  return loss_out ? 0.0 : mean;
}

void embedding_forward_16(Runtime& rt, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                          int64_t C) {
  HostKernels cpu(rt);
  const char* k = "embedding_forward_16";
  distlab::embedding_forward_16(rt, dev(out, k), dev(tokens, k), dev(wte, k), wpe ? dev(wpe, k) : nullptr, t, B, T, C);
}

void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C) {
  HostKernels cpu(rt);
  distlab::embedding_forward(rt, dev(out, "embedding_forward"), dev(tokens, "embedding_forward"), dev(wte, "embedding_forward"), dev(wpe, "embedding_forward"), B, T, C);
}

void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  HostKernels cpu(rt);
  distlab::embedding_backward(rt, dev(dwte, "embedding_backward"), dev(dwpe, "embedding_backward"), dev(dout, "embedding_backward"), dev(tokens, "embedding_backward"), B, T, C);
}

void sgd_update(Runtime& rt, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u) {
  HostKernels cpu(rt);
  SgdUpdate h = u;
  h.factor = u.factor ? dev(u.factor, "sgd_update") : nullptr;
  distlab::sgd_update(rt, dev(w, "sgd_update"), dev(buf, "sgd_update"), dev(g, "sgd_update"), n, h);
}

void adamw_update(Runtime& rt, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u) {
  HostKernels cpu(rt);
  distlab::adamw_update(rt, dev(w, "adamw_update"), dev(m, "adamw_update"), dev(v, "adamw_update"), dev(g, "adamw_update"), n, u);
}

void adamw_update_many(Runtime& rt, const AdamWTensor* ts, int64_t count) {
  std::vector<AdamWTensor> host(ts, ts + count);
  for (AdamWTensor& t : host) {
    t.w = dev(t.w, "adamw_update_many");
    t.m = dev(t.m, "adamw_update_many");
    t.v = dev(t.v, "adamw_update_many");
    t.g = dev(t.g, "adamw_update_many");
    t.factor = t.factor ? dev(t.factor, "adamw_update_many") : nullptr;
  }
  HostKernels cpu(rt);
  distlab::adamw_update_many(rt, host.data(), count);
}

double sum_squares(Runtime& rt, const float* x, int64_t n) {
  host_wait(rt);
  HostKernels cpu(rt);
  return distlab::sum_squares(rt, dev(x, "sum_squares"), n);
}

void scale(Runtime& rt, float* x, int64_t n, float s) {
  HostKernels cpu(rt);
  distlab::scale(rt, dev(x, "scale"), n, s);
}

void dequantize_nf4(Runtime& rt, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                    int64_t n, int64_t block, int64_t block2) {
  HostKernels cpu(rt);
  distlab::dequantize_nf4(rt, dev(out, "dequantize_nf4"), dev(packed, "dequantize_nf4"), dev(absmax_q, "dequantize_nf4"),
                          dev(absmax, "dequantize_nf4"), offset, n, block, block2);
}

bool all_finite(Runtime& rt, const float* x, int64_t n) {
  host_wait(rt);
  HostKernels cpu(rt);
  return distlab::all_finite(rt, dev(x, "all_finite"), n);
}

void sum_squares_into(Runtime& rt, const float* x, int64_t n, double* out) {
  HostKernels cpu(rt);
  distlab::sum_squares_into(rt, dev(x, "sum_squares_into"), n, dev(out, "sum_squares_into"));
}

void clip_factor(Runtime& rt, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm) {
  HostKernels cpu(rt);
  distlab::clip_factor(rt, dev(factor, "clip_factor"), dev(norm, "clip_factor"), n ? dev(sums, "clip_factor") : nullptr, n, loss_scale, max_norm);
}

void flag_nonfinite(Runtime& rt, const float* x, int64_t n, float* flag) {
  HostKernels cpu(rt);
  distlab::flag_nonfinite(rt, dev(x, "flag_nonfinite"), n, dev(flag, "flag_nonfinite"));
}

}  // namespace sim

}  // namespace

const Kernels& sim_kernels() {
  static const Kernels k = [] {
    Kernels t{};
    t.device = "cuda-sim";
    t.relu_forward = sim::relu_forward;
    t.relu_backward = sim::relu_backward;
    t.gelu_forward = sim::gelu_forward;
    t.gelu_backward = sim::gelu_backward;
    t.gelu_forward_16 = sim::gelu_forward_16;
    t.gelu_backward_16 = sim::gelu_backward_16;
    t.add_16 = sim::add_16;
    t.accumulate_16 = sim::accumulate_16;
    t.dropout_forward = sim::dropout_forward;
    t.dropout_backward = sim::dropout_backward;
    t.add_forward = sim::add_forward;
    t.accumulate = sim::accumulate;
    t.maxpool2d_forward = sim::maxpool2d_forward;
    t.maxpool2d_backward = sim::maxpool2d_backward;
    t.matmul_forward = sim::matmul_forward;
    t.linear_forward_16 = sim::linear_forward_16;
    t.linear_backward_16 = sim::linear_backward_16;
    t.linear_gelu_forward_16 = sim::linear_gelu_forward_16;
    t.matmul_backward = sim::matmul_backward;
    t.bias_forward = sim::bias_forward;
    t.bias_backward = sim::bias_backward;
    t.gemm = sim::gemm;
    t.conv2d_forward = sim::conv2d_forward;
    t.conv2d_backward = sim::conv2d_backward;
    t.layernorm_forward = sim::layernorm_forward;
    t.layernorm_forward_16 = sim::layernorm_forward_16;
    t.layernorm_backward = sim::layernorm_backward;
    t.layernorm_backward_16 = sim::layernorm_backward_16;
    t.batchnorm_stats = sim::batchnorm_stats;
    t.batchnorm_apply = sim::batchnorm_apply;
    t.batchnorm_backward_reduce = sim::batchnorm_backward_reduce;
    t.batchnorm_backward_apply = sim::batchnorm_backward_apply;
    t.softmax_crossentropy_forward = sim::softmax_crossentropy_forward;
    t.softmax_crossentropy_backward = sim::softmax_crossentropy_backward;
    t.softmax_crossentropy_forward_16 = sim::softmax_crossentropy_forward_16;
    t.softmax_crossentropy_backward_16 = sim::softmax_crossentropy_backward_16;
    t.attention_forward = sim::attention_forward;
    t.attention_backward = sim::attention_backward;
    t.flash_attention_forward = sim::flash_attention_forward;
    t.flash_attention_backward = sim::flash_attention_backward;
    t.flash_attention_forward_16 = sim::flash_attention_forward_16;
    t.flash_attention_backward_16 = sim::flash_attention_backward_16;
    t.rmsnorm_forward = sim::rmsnorm_forward;
    t.rmsnorm_backward = sim::rmsnorm_backward;
    t.rope_apply = sim::rope_apply;
    t.rmsnorm_forward_16 = sim::rmsnorm_forward_16;
    t.rmsnorm_backward_16 = sim::rmsnorm_backward_16;
    t.swiglu_forward_16 = sim::swiglu_forward_16;
    t.swiglu_backward_16 = sim::swiglu_backward_16;
    t.rope_repeat_kv_forward_16 = sim::rope_repeat_kv_forward_16;
    t.rope_repeat_kv_backward_16 = sim::rope_repeat_kv_backward_16;
    t.swiglu_forward = sim::swiglu_forward;
    t.swiglu_backward = sim::swiglu_backward;
    t.repeat_kv_forward = sim::repeat_kv_forward;
    t.repeat_kv_backward = sim::repeat_kv_backward;
    t.vocab_ce_max = sim::vocab_ce_max;
    t.vocab_ce_exp = sim::vocab_ce_exp;
    t.vocab_ce_finish = sim::vocab_ce_finish;
    t.embedding_forward = sim::embedding_forward;
    t.embedding_forward_16 = sim::embedding_forward_16;
    t.embedding_backward = sim::embedding_backward;
    t.sgd_update = sim::sgd_update;
    t.adamw_update = sim::adamw_update;
    t.adamw_update_many = sim::adamw_update_many;
    t.sum_squares = sim::sum_squares;
    t.scale = sim::scale;
    t.all_finite = sim::all_finite;
    t.sum_squares_into = sim::sum_squares_into;
    t.flag_nonfinite = sim::flag_nonfinite;
    t.clip_factor = sim::clip_factor;
    t.dequantize_nf4 = sim::dequantize_nf4;
    return t;
  }();
  return k;
}

}  // namespace distlab
