#include "core/ops/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/ops/cpu/pointwise.h"
#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/tensor/dtype.h"

namespace distlab {

static void sgemm_1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha,
              A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// One thread pool: OpenBLAS runs single-threaded inside each OpenMP thread, and a large product is split
// into slabs of C's rows or columns, one per thread. Two pools (OpenBLAS's and OpenMP's) spinning on
// 2 cores made 2 threads slower than 1. Each element of C is still one whole dot product over K computed by
// one call, so the result does not depend on the number of threads.
void blas_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS rejects lda = 0; the product is empty, so C = beta * C
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  const int threads = omp_get_max_threads();
  if (threads <= 1 || omp_in_parallel() || double(M) * double(N) * double(K) < 4e6) {
    sgemm_1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? M : N;
  const int64_t slab = ((extent + threads - 1) / threads + 15) / 16 * 16;
  const int64_t slabs = (extent + slab - 1) / slab;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < slabs; t++) {
    const int64_t lo = t * slab, n = std::min(slab, extent - lo);
    if (split_rows)  // rows lo..lo+n of C and of op(A)
      sgemm_1(ta, tb, n, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else             // columns lo..lo+n of C and of op(B)
      sgemm_1(ta, tb, M, n, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  }
}

void gemm(Runtime& rt, const char* name, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (rt.kernels) return rt.kernels->gemm(rt, name, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  OpScope op(rt, name, 2.0 * M * N * K, 4.0 * (M * K + K * N + 2 * M * N));
  op.gemm(0, M, N, K);
  if (rt.is_meta()) return;
  blas_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N,
                    int64_t C, int64_t OC) {
  if (rt.kernels) return rt.kernels->matmul_forward(rt, out, inp, w, bias, N, C, OC);
  OpScope op(rt, "matmul_forward", 2.0 * N * C * OC, 4.0 * (N * C + OC * C + N * OC));
  op.gemm(0, N, OC, C);  // (N, C) @ (C, OC)
  if (rt.is_meta()) return;
  if (bias) {  // start from the broadcast bias, then C = 1 * inp @ w^T + 1 * C
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) out[n * OC + o] = bias[o];
  }
  blas_sgemm(false, true, N, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
}

void linear_forward_16(Runtime& rt, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C,
                       int64_t OC) {
  if (rt.kernels) return rt.kernels->linear_forward_16(rt, out, inp, w, bias, t, N, C, OC);
  if (rt.is_meta()) return matmul_forward(rt, nullptr, nullptr, nullptr, nullptr, N, C, OC);  // its event, no values
  std::vector<float> x = widened(inp, t, N * C), wf = widened(w, t, OC * C), b = widened(bias, t, OC), y(size_t(N * OC));
  matmul_forward(rt, y.data(), x.data(), wf.data(), bias ? b.data() : nullptr, N, C, OC);
  convert(y.data(), DType::f32, out, t, N * OC);
}

void linear_backward_16(Runtime& rt, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t,
                        int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  if (rt.kernels) return rt.kernels->linear_backward_16(rt, dinp, dw, dbias, dout, inp, w, t, N, C, OC, need_dinp, need_dw);
  if (rt.is_meta()) return matmul_backward(rt, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, C, OC, need_dinp, need_dw);
  std::vector<float> dy = widened(dout, t, N * OC), x = widened(inp, t, N * C), wf = widened(w, t, OC * C), dwf = widened(dw, t, OC * C),
                     dbf = widened(dbias, t, OC);
  std::vector<float> dx(dinp ? size_t(N * C) : 0);
  matmul_backward(rt, dinp ? dx.data() : nullptr, dw ? dwf.data() : nullptr, dbias ? dbf.data() : nullptr, dy.data(),
                  x.empty() ? nullptr : x.data(), wf.empty() ? nullptr : wf.data(), N, C, OC, need_dinp, need_dw);
  if (dinp) convert(dx.data(), DType::f32, dinp, t, N * C);
  if (dw) convert(dwf.data(), DType::f32, dw, t, OC * C);
  if (dbias) convert(dbf.data(), DType::f32, dbias, t, OC);
}

void linear_gelu_forward_16(Runtime& rt, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                            int64_t C, int64_t OC) {
  if (rt.kernels) return rt.kernels->linear_gelu_forward_16(rt, out, pre, inp, w, bias, t, N, C, OC);
  linear_forward_16(rt, pre, inp, w, bias, t, N, C, OC);
  gelu_forward_16(rt, out, pre, t, N * OC);
}

void matmul_forward_naive(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C,
                          int64_t OC) {
  for (int64_t n = 0; n < N; n++) {
    for (int64_t o = 0; o < OC; o++) {
      float acc = bias ? bias[o] : 0.0f;
      for (int64_t c = 0; c < C; c++) acc += inp[n * C + c] * w[o * C + c];
      out[n * OC + o] = acc;
    }
  }
}

void matmul_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  if (rt.kernels) return rt.kernels->matmul_backward(rt, dinp, dw, dbias, dout, inp, w, N, C, OC, need_dinp, need_dw);
  double flops = 2.0 * N * C * OC * ((need_dinp ? 1 : 0) + (need_dw ? 1 : 0));
  OpScope op(rt, "matmul_backward", flops, 4.0 * ((need_dinp ? N * C : 0) + (need_dw ? N * C + 2 * OC * C : OC * C) + N * OC));
  int g = 0;
  if (need_dw) op.gemm(g++, OC, C, N);     // dW = dYᵀ X: (OC, N) @ (N, C)
  if (need_dinp) op.gemm(g++, N, C, OC);   // dX = dY W: (N, OC) @ (OC, C)
  if (rt.is_meta()) return;
  if (need_dinp) blas_sgemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);   // (N,OC)@(OC,C)
  if (dw && need_dw) blas_sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);       // (OC,N)@(N,C)
  if (dbias) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
  }
}

void bias_forward(Runtime& rt, float* out, const float* bias, int64_t N, int64_t OC) {
  if (rt.kernels) return rt.kernels->bias_forward(rt, out, bias, N, OC);
  OpScope op(rt, "bias_forward", double(N * OC), 4.0 * (2 * N * OC + OC));
  if (rt.is_meta()) return;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
}

void bias_backward(Runtime& rt, float* dbias, const float* dout, int64_t N, int64_t OC) {
  if (rt.kernels) return rt.kernels->bias_backward(rt, dbias, dout, N, OC);
  OpScope op(rt, "bias_backward", double(N * OC), 4.0 * (N * OC + 2 * OC));
  if (rt.is_meta()) return;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
}

}  // namespace distlab
