// GEMMs on the GPU through cuBLAS (and cuBLASLt where a bias rides in the epilogue), in the nn.Linear convention of core/ops/cpu/matmul.cpp (weights are
// (OC, C) = [out, in], everything row-major). cuBLAS is column-major: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so every call passes B before A and N before M.
// Next to it, gemm_naive: the classic 16x16 shared-memory tiling, so the benchmark can show what cuBLAS
// adds (tensor cores, register blocking, pipelined loads).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <memory>

#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::u8: return CUDA_R_8U;
  }
  return CUDA_R_32F;
}

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw ShapeError(std::string("GEMM ") + what + " = " + std::to_string(v) + " does not fit cuBLAS's 32-bit int", "split the product into smaller ones");
  return int(v);
}

// The one place cuBLAS is called. Untraced: callers record their own event.
void blas(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType at, int64_t lda,
          const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc, GemmMath math) {
  if (M == 0 || N == 0) return;
  if (at != bt)
    throw ShapeError(std::string("GEMM operands of different dtypes (") + dtype_name(at) + " and " + dtype_name(bt) + ")",
                     "convert both to the same dtype first");
  const bool low = at != DType::f32;
  const cublasComputeType_t compute = !low && math == GemmMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // K = 0: cuBLAS computes C = beta C, which is the right answer; lda must still be >= 1
  DL_CUBLAS(cublasGemmEx(ctx(rt).blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(N, "N"),
                         as_int(M, "M"), as_int(K, "K"), &alpha, B, cuda_type(bt), as_int(std::max<int64_t>(ldb, 1), "ldb"), A,
                         cuda_type(at), as_int(std::max<int64_t>(lda, 1), "lda"), &beta, C, cuda_type(ct),
                         as_int(std::max<int64_t>(ldc, 1), "ldc"), compute, CUBLAS_GEMM_DEFAULT));
}

// The largest power of two up to 256 that divides p's address: what cuBLASLt's heuristic may assume
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// cuBLASLt's descriptors of one call, destroyed on every path out
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// out (N, OC) = x (N, C) @ w (OC, C)ᵀ + bias in one cublasLtMatmul, the bias added in its epilogue: no
// broadcast pass before it and no read of out (beta 0), where cuBLAS's GEMM needs both (2 of a biased
// layer's 3 passes over its f32 output). x and w are of type t (f32, or 16-bit); out and bias of type
// out_t (the epilogue's bias has the output's type): f32, or t itself (linear_forward_16: the 16-bit
// tensors as they are, rounded once from the f32 sums). bias nullptr: no epilogue. Column-major, as
// blas() below: D (OC x N) = wᵀ-op x. gelu_aux (out's type and shape): out becomes the GELU of the sums and
// gelu_aux takes the sums themselves (linear_gelu_forward_16). Returns false, having done nothing, where
// cuBLASLt has no kernel for the call (the caller does it another way).
bool lt_bias(Runtime& rt, void* out, DType out_t, const void* x, const void* w, DType t, const void* bias, int64_t N, int64_t C,
             int64_t OC, GemmMath math, void* gelu_aux = nullptr) {
  if (N > INT_MAX || C > INT_MAX || OC > INT_MAX) return false;
  // the epilogue reads the bias in 16-byte vectors (a misaligned one is a fatal launch error, not
  // NOT_SUPPORTED), and a flat parameter buffer packs biases at any 2- or 4-byte offset
  if (bias && alignment_of(bias) < 16) return false;
  // the GELU epilogue's aux output (the pre-activation): aligned, its leading dimension a multiple of 8
  if (gelu_aux && (alignment_of(gelu_aux) < 16 || OC % 8 != 0)) return false;
  const cudaDataType type = cuda_type(t);
  const cublasComputeType_t compute = t == DType::f32 && math == GemmMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtCall c;
  DL_CUBLAS(cublasLtMatmulDescCreate(&c.desc, compute, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = gelu_aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                                : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias) DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (gelu_aux) {  // aux: the pre-activation (OC x N, column-major as D), in D's type
    const int64_t aux_ld = OC;
    DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &gelu_aux, sizeof(gelu_aux)));
    DL_CUBLAS(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }
  DL_CUBLAS(cublasLtMatrixLayoutCreate(&c.a, type, uint64_t(C), uint64_t(OC), int64_t(C)));  // w: (C x OC), op T
  DL_CUBLAS(cublasLtMatrixLayoutCreate(&c.b, type, uint64_t(C), uint64_t(N), int64_t(C)));   // x: (C x N)
  DL_CUBLAS(cublasLtMatrixLayoutCreate(&c.d, cuda_type(out_t), uint64_t(OC), uint64_t(N), int64_t(OC)));
  DL_CUBLAS(cublasLtMatmulPreferenceCreate(&c.pref));
  const uint64_t workspace = CudaContext::kBlasWorkspace;
  const uint32_t align_a = alignment_of(w), align_b = alignment_of(x), align_d = alignment_of(out);
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  // split-K partial sums in f32 only (the cuBLAS handle's DISALLOW_REDUCED_PRECISION_REDUCTION, which
  // cuBLASLt does not read): a 16-bit output is rounded once
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  DL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t pick{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(ctx(rt).blas_lt(), c.desc, c.a, c.b, c.d, c.d, c.pref, 1, &pick, &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(ctx(rt).blas_lt(), c.desc, &alpha, w, c.a, x, c.b, &beta, out, c.d, out, c.d, &pick.algo,
                                           ctx(rt).blas_workspace(), workspace, stream(rt));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  DL_CUBLAS(st);
  return true;
}

__global__ void to_bf16_k(__nv_bfloat16* dst, const float* src, int64_t n) {
  DL_GRID_LOOP(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void to_f16_k(__half* dst, const float* src, int64_t n) {
  DL_GRID_LOOP(i, n) dst[i] = __float2half_rn(src[i]);
}

// A 16-bit copy of `n` f32 values (a stored matrix, or a batch of them with its strides kept), in scratch
// that goes back to the cache when the copy goes out of scope. Stream order keeps the reuse safe.
struct Narrow {
  Runtime& rt;
  void* p = nullptr;
  int64_t bytes = 0;
  Narrow(Runtime& r, const float* src, int64_t n, DType to) : rt(r) {
    bytes = std::max<int64_t>(n, 1) * 2;
    p = ctx(rt).allocator().alloc(bytes);
    if (!p) throw OutOfMemoryError("no GPU memory for a " + std::to_string(bytes) + "-byte 16-bit copy of a GEMM operand", "a smaller batch");
    if (n == 0) return;
    if (to == DType::bf16) to_bf16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<__nv_bfloat16*>(p), src, n);
    else to_f16_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<__half*>(p), src, n);
    DL_CUDA_LAUNCHED("narrow");
  }
  ~Narrow() { ctx(rt).allocator().free(p, bytes); }
  Narrow(const Narrow&) = delete;
  Narrow& operator=(const Narrow&) = delete;
};

// The values a stored operand spans: `batch` matrices of rows x ld (the last row needs only `cols`),
// `stride` apart (the spans of attention's heads overlap: they sit hs columns apart in rows of 3C).
int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride = 0, int64_t batch = 1) {
  return rows == 0 || cols == 0 || batch == 0 ? 0 : (batch - 1) * stride + (rows - 1) * ld + cols;
}

__global__ void broadcast_rows_k(float* out, const float* bias, int64_t N, int64_t OC) {
  DL_GRID_LOOP(i, N * OC) out[i] = bias[i % OC];
}
__global__ void add_rows_k(float* out, const float* bias, int64_t N, int64_t OC) {
  DL_GRID_LOOP(i, N * OC) out[i] += bias[i % OC];
}

// dbias[o] += Σ_n dout[n, o], in two passes with a fixed order (the same bits every run): the rows in
// chunks of kChunkRows, each chunk's column sums in row order, then each column's chunks in order. One
// thread per column over all N rows in order (the cpu's order) would keep a GPT-2 dbias (N = 8192 rows,
// 768 columns) on 3 of an H200's 132 SMs for 8192 dependent steps. T: x's and out's type (f32, or a 16-bit
// type read as f32 exactly and out rounded once): the 16-bit sums are the f32 sums of the same values.
template <class T>
__global__ void column_partials_k(float* partial, const T* x, int64_t N, int64_t OC) {
  for (int64_t chunk = blockIdx.y; chunk * kChunkRows < N; chunk += gridDim.y) {
    const int64_t end = (chunk + 1) * kChunkRows < N ? (chunk + 1) * kChunkRows : N;
    DL_GRID_LOOP(o, OC) {
      float acc = 0.0f;
      for (int64_t n = chunk * kChunkRows; n < end; n++) acc += wide(x[n * OC + o]);
      partial[chunk * OC + o] = acc;
    }
  }
}
template <class T>
__global__ void add_chunk_sums_k(T* out, const float* partial, int64_t chunks, int64_t OC) {
  DL_GRID_LOOP(o, OC) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; k++) acc += partial[k * OC + o];
    out[o] = narrow<T>(wide(out[o]) + acc);
  }
}

template <class T>
void column_sums_into(Runtime& rt, T* out, const T* x, int64_t N, int64_t OC, const char* name) {
  if (N == 0 || OC == 0) return;
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  Scratch partial(rt, chunks * OC, "column sums' partial sums");
  const dim3 grid(blocks_for(OC), unsigned(std::min<int64_t>(chunks, 65535)));
  column_partials_k<<<grid, kThreads, 0, stream(rt)>>>(partial.p, x, N, OC);
  DL_CUDA_LAUNCHED(name);
  add_chunk_sums_k<<<blocks_for(OC), kThreads, 0, stream(rt)>>>(out, partial.p, chunks, OC);
  DL_CUDA_LAUNCHED(name);
}

constexpr int kTile = 16;
__global__ void gemm_tiled_k(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  __shared__ float as[kTile][kTile], bs[kTile][kTile];
  const int64_t row = int64_t(blockIdx.y) * kTile + threadIdx.y, col = int64_t(blockIdx.x) * kTile + threadIdx.x;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    // each thread loads one element of op(A)'s tile (row, k0 + tx) and of op(B)'s tile (k0 + ty, col)
    const int64_t ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = row < M && ka < K ? (ta ? A[ka * lda + row] : A[row * lda + ka]) : 0.0f;
    bs[threadIdx.y][threadIdx.x] = kb < K && col < N ? (tb ? B[col * ldb + kb] : B[kb * ldb + col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile; k++) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) {
    float* c = C + row * ldc + col;
    *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;  // beta 0 never reads C (it may hold NaN)
  }
}

}  // namespace

void add_column_sums(Runtime& rt, float* out, const float* x, int64_t N, int64_t OC, const char* name) {
  column_sums_into(rt, out, x, N, OC, name);
}

void add_column_sums_16(Runtime& rt, void* out, const void* x, DType t, int64_t N, int64_t OC, const char* name) {
  require_16bit(t, name);
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    column_sums_into(rt, static_cast<T*>(out), static_cast<const T*>(x), N, OC, name);
  });
}

// f32 operands in the context's math: as they are (f32, tf32), or rounded to 16 bits first (bf16, f16).
void blas_f32(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const GemmMath math = gemm_math(rt);
  if (math == GemmMath::f32 || math == GemmMath::tf32) {
    blas(rt, ta, tb, M, N, K, alpha, A, DType::f32, lda, B, DType::f32, ldb, beta, C, DType::f32, ldc, math);
    return;
  }
  const DType low = math == GemmMath::bf16 ? DType::bf16 : DType::f16;
  Narrow a(rt, A, span(ta ? K : M, ta ? M : K, lda), low), b(rt, B, span(tb ? N : K, tb ? K : N, ldb), low);
  blas(rt, ta, tb, M, N, K, alpha, a.p, low, lda, b.p, low, ldb, beta, C, DType::f32, ldc, math);
}

void blas_f32_batched(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                      int64_t stride_c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmMath math = gemm_math(rt);
  // under bf16/f16 math the operands are rounded to 16 bits once, the whole batch's span each (one pass over
  // attention's qkv, not one per head), and multiplied in one call with f32 sums
  const void *a = A, *b = B;
  cudaDataType type = CUDA_R_32F;
  cublasComputeType_t compute = math == GemmMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  std::unique_ptr<Narrow> na, nb;
  if (math == GemmMath::bf16 || math == GemmMath::f16) {
    const DType low = math == GemmMath::bf16 ? DType::bf16 : DType::f16;
    na = std::make_unique<Narrow>(rt, A, span(ta ? K : M, ta ? M : K, lda, stride_a, batch), low);
    nb = std::make_unique<Narrow>(rt, B, span(tb ? N : K, tb ? K : N, ldb, stride_b, batch), low);
    a = na->p;
    b = nb->p;
    type = cuda_type(low);
    compute = CUBLAS_COMPUTE_32F;
  }
  DL_CUBLAS(cublasGemmStridedBatchedEx(ctx(rt).blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), &alpha, b, type,
                                       as_int(std::max<int64_t>(ldb, 1), "ldb"), stride_b, a, type,
                                       as_int(std::max<int64_t>(lda, 1), "lda"), stride_a, &beta, C, CUDA_R_32F,
                                       as_int(std::max<int64_t>(ldc, 1), "ldc"), stride_c, as_int(batch, "batch"), compute,
                                       CUBLAS_GEMM_DEFAULT));
}

void gemm_ex(Runtime& rt, const char* name, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
             DType at, int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
             GemmMath math) {
  const double e = double(dtype_size(at));
  OpScope op(rt, name, 2.0 * M * N * K, e * (M * K + K * N) + 2.0 * dtype_size(ct) * M * N);
  op.gemm(0, M, N, K);
  blas(rt, ta, tb, M, N, K, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, math);
}

void gemm(Runtime& rt, const char* name, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  OpScope op(rt, name, 2.0 * M * N * K, 4.0 * (M * K + K * N + 2 * M * N));
  op.gemm(0, M, N, K);
  blas_f32(rt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_naive(Runtime& rt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  OpScope op(rt, "gemm_naive", 2.0 * M * N * K, 4.0 * (M * K + K * N + 2 * M * N));
  if (M == 0 || N == 0) return;
  if ((M + kTile - 1) / kTile > 65535)
    throw ShapeError("gemm_naive with M = " + std::to_string(M) + ": its grid's y dimension (M / 16) is at most 65535", "use gemm (cuBLAS)");
  const dim3 threads(kTile, kTile), grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
  gemm_tiled_k<<<grid, threads, 0, stream(rt)>>>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  DL_CUDA_LAUNCHED("gemm_naive");
}

namespace {

// matmul_forward's work, untraced (its callers record the event)
void matmul_forward_f32(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C,
                        int64_t OC) {
  if (bias && N > 0 && OC > 0 && C > 0) {  // the bias in cuBLASLt's epilogue: one pass over out
    const GemmMath math = gemm_math(rt);
    if (math == GemmMath::f32 || math == GemmMath::tf32) {
      if (lt_bias(rt, out, DType::f32, inp, w, DType::f32, bias, N, C, OC, math)) return;
    } else {
      const DType low = math == GemmMath::bf16 ? DType::bf16 : DType::f16;
      Narrow x16(rt, inp, N * C, low), w16(rt, w, OC * C, low);
      if (lt_bias(rt, out, DType::f32, x16.p, w16.p, low, bias, N, C, OC, math)) return;
      broadcast_rows_k<<<blocks_for(N * OC), kThreads, 0, stream(rt)>>>(out, bias, N, OC);  // the copies made, in two
      DL_CUDA_LAUNCHED("matmul_forward bias");
      blas(rt, false, true, N, OC, C, 1.0f, x16.p, low, C, w16.p, low, C, 1.0f, out, DType::f32, OC, math);
      return;
    }
  }
  if (bias) {  // where cuBLASLt has no kernel: start from the broadcast bias, then out = 1 * inp @ w^T + 1 * out
    broadcast_rows_k<<<blocks_for(N * OC), kThreads, 0, stream(rt)>>>(out, bias, N, OC);
    DL_CUDA_LAUNCHED("matmul_forward bias");
  }
  blas_f32(rt, false, true, N, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
}

}  // namespace

void matmul_forward(Runtime& rt, float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C,
                    int64_t OC) {
  OpScope op(rt, "matmul_forward", 2.0 * N * C * OC, 4.0 * (N * C + OC * C + N * OC));
  op.gemm(0, N, OC, C);  // (N, C) @ (C, OC)
  matmul_forward_f32(rt, out, inp, w, bias, N, C, OC);
}


// The cpu's linear_forward_16 in one cublasLtMatmul: the 16-bit operands as they are (no f32 copies to
// narrow again), f32 sums, the 16-bit bias in the epilogue, and the output rounded once, where matmul_forward
// would take f32 copies of x, w and the bias and write an f32 output to round: five passes over the
// operands and the output fewer. Where cuBLASLt has no kernel for it, that f32 way.
void linear_forward_16(Runtime& rt, void* out, const void* inp, const void* w, const void* bias, DType t, int64_t N, int64_t C,
                       int64_t OC) {
  require_16bit(t, "linear_forward_16");
  const GemmMath math = t == DType::bf16 ? GemmMath::bf16 : GemmMath::f16;
  OpScope op(rt, "matmul_forward", 2.0 * N * C * OC, 4.0 * (N * C + OC * C + N * OC));  // matmul_forward's event
  op.gemm(0, N, OC, C);
  if (N > 0 && C > 0 && OC > 0) {
    if (bias && alignment_of(bias) < 16) {  // a flat buffer's bias at any 2-byte offset: the epilogue's copy of it
      void* aligned = ctx(rt).allocator().alloc(OC * 2);  // the allocator's blocks are 256-byte aligned or more
      if (aligned) {
        DL_CUDA(cudaMemcpyAsync(aligned, bias, size_t(OC * 2), cudaMemcpyDeviceToDevice, stream(rt)));
        const bool done = lt_bias(rt, out, t, inp, w, t, aligned, N, C, OC, math);
        ctx(rt).allocator().free(aligned, OC * 2);  // stream-ordered: after the GEMM that reads it
        if (done) return;
      }
    } else if (lt_bias(rt, out, t, inp, w, t, bias, N, C, OC, math)) {
      return;
    }
  }
  F32 x32(rt, inp, t, N * C), w32(rt, w, t, OC * C), b32(rt, bias, t, bias ? OC : 0), y32(rt, nullptr, t, N * OC);
  matmul_forward_f32(rt, y32.p, x32.p, w32.p, bias ? b32.p : nullptr, N, C, OC);  // in rt.dtype's math: as the cpu's
  if (N * OC > 0) convert_on(stream(rt), y32.p, DType::f32, out, t, N * OC);
}

// The cpu's linear_backward_16: dX and dW as two GEMMs on the 16-bit tensors (dW accumulated with beta 1:
// its old value plus the f32 product, rounded once), the bias gradient's column sums read from dY's 16 bits
// (the two-pass sums of add_column_sums), where matmul_backward took f32 copies of dY, X, W, dW and the
// bias gradient, narrowed three of them again and rounded two f32 results.
void linear_backward_16(Runtime& rt, void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w, DType t,
                        int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  require_16bit(t, "linear_backward_16");
  const GemmMath math = t == DType::bf16 ? GemmMath::bf16 : GemmMath::f16;
  OpScope op(rt, "matmul_backward", 2.0 * N * C * OC * ((need_dinp ? 1 : 0) + (need_dw ? 1 : 0)),
             4.0 * ((need_dinp ? N * C : 0) + (need_dw ? N * C + 2 * OC * C : OC * C) + N * OC));  // matmul_backward's event
  int g = 0;
  if (need_dw) op.gemm(g++, OC, C, N);
  if (need_dinp) op.gemm(g++, N, C, OC);
  if (need_dinp && dinp) blas(rt, false, false, N, C, OC, 1.0f, dout, t, OC, w, t, C, 0.0f, dinp, t, C, math);  // (N,OC)@(OC,C)
  if (need_dw && dw) blas(rt, true, false, OC, C, N, 1.0f, dout, t, OC, inp, t, C, 1.0f, dw, t, C, math);       // (OC,N)@(N,C)
  if (dbias) add_column_sums_16(rt, dbias, dout, t, N, OC, "matmul_backward bias");
}

// One cublasLtMatmul with the GELU_AUX_BIAS epilogue: out = gelu(inp @ wᵀ + bias) from the f32 sums, rounded
// once, and pre = inp @ wᵀ + bias rounded once (the aux output GELU's backward reads). On sm 90 and later
// (H100, H200) only: llm.c found cuBLASLt's fused GELU slower than the two kernels on Ampere and Ada (its
// matmul_forward_cublaslt). Elsewhere, or where cuBLASLt has no kernel for it (or the bias or pre is not
// 16-byte aligned), linear_forward_16 then gelu_forward_16. Both ways record the two kernels' events.
void linear_gelu_forward_16(Runtime& rt, void* out, void* pre, const void* inp, const void* w, const void* bias, DType t, int64_t N,
                            int64_t C, int64_t OC) {
  require_16bit(t, "linear_gelu_forward_16");
  const GemmMath math = t == DType::bf16 ? GemmMath::bf16 : GemmMath::f16;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx(rt).device()) != cudaSuccess) {
    cudaGetLastError();
    major = 0;
  }
  if (major >= 9 && N > 0 && C > 0 && OC > 0) {
    // a bias at a 2-byte offset (a flat buffer's) goes to the epilogue as an aligned copy, as in linear_forward_16
    void* aligned = bias && alignment_of(bias) < 16 ? ctx(rt).allocator().alloc(OC * 2) : nullptr;
    if (aligned) DL_CUDA(cudaMemcpyAsync(aligned, bias, size_t(OC * 2), cudaMemcpyDeviceToDevice, stream(rt)));
    const void* b = aligned ? aligned : bias;
    const bool fused = (!b || alignment_of(b) >= 16) && lt_bias(rt, out, t, inp, w, t, b, N, C, OC, math, pre);
    if (aligned) ctx(rt).allocator().free(aligned, OC * 2);  // stream-ordered: after the GEMM that reads it
    if (fused) {
      {
        OpScope op(rt, "matmul_forward", 2.0 * N * C * OC, 4.0 * (N * C + OC * C + N * OC));  // linear_forward_16's event
        op.gemm(0, N, OC, C);
      }
      OpScope g(rt, "gelu_forward", 10.0 * N * OC, 8.0 * N * OC);  // and gelu_forward_16's, done in the epilogue
      return;
    }
  }
  cuda::linear_forward_16(rt, pre, inp, w, bias, t, N, C, OC);
  cuda::gelu_forward_16(rt, out, pre, t, N * OC);
}

void matmul_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int64_t N, int64_t C, int64_t OC, bool need_dinp, bool need_dw) {
  OpScope op(rt, "matmul_backward", 2.0 * N * C * OC * ((need_dinp ? 1 : 0) + (need_dw ? 1 : 0)),
             4.0 * ((need_dinp ? N * C : 0) + (need_dw ? N * C + 2 * OC * C : OC * C) + N * OC));
  int g = 0;
  if (need_dw) op.gemm(g++, OC, C, N);    // dW = dYᵀ X: (OC, N) @ (N, C)
  if (need_dinp) op.gemm(g++, N, C, OC);  // dX = dY W: (N, OC) @ (OC, C)
  if (need_dinp) blas_f32(rt, false, false, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);  // (N,OC)@(OC,C)
  if (dw && need_dw) blas_f32(rt, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);           // (OC,N)@(N,C)
  if (dbias) add_column_sums(rt, dbias, dout, N, OC, "matmul_backward bias");
}

void bias_forward(Runtime& rt, float* out, const float* bias, int64_t N, int64_t OC) {
  OpScope op(rt, "bias_forward", double(N * OC), 4.0 * (2 * N * OC + OC));
  if (N * OC == 0) return;
  add_rows_k<<<blocks_for(N * OC), kThreads, 0, stream(rt)>>>(out, bias, N, OC);
  DL_CUDA_LAUNCHED("bias_forward");
}

void bias_backward(Runtime& rt, float* dbias, const float* dout, int64_t N, int64_t OC) {
  OpScope op(rt, "bias_backward", double(N * OC), 4.0 * (N * OC + 2 * OC));
  add_column_sums(rt, dbias, dout, N, OC, "bias_backward");
}

}  // namespace distlab::cuda
