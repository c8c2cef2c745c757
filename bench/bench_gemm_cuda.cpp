// GEMM on the GPU: distlab's cuda::gemm_ex / cuda::gemm against raw cuBLAS on the same operands, at
// 4096^3 (and 8192^3 for bf16), in bf16 (tensor cores, f32 sums), TF32 and f32; and the tiled naive
// kernel, to show what cuBLAS adds. TFLOP/s from CUDA events over 20 timed calls after 3 warm-ups.
// Then causal attention, forward and backward, at GPT-2 124M's shape (B 8, T 1024, 12 heads of 64) and
// LLaMA-3-8B's (B 1, T 8192, 32 heads of 128): the naive kernels (scores through cuBLAS in bf16, softmax
// in f32), flash on CUDA cores (f32) and flash on tensor cores (bf16, attention_tc.cu), in FlashAttention-2's
// FLOPs (the causal half), so the three compare.
// Operands are random, N(0, 1) (a GEMM on constants or zeros flips fewer bits, draws less power and so keeps a
// higher clock: up to 15 % faster, Horace He 2024; this bench filled constants before 2026-12-07, and the
// README's 872/894 TFLOP/s figures of 2026-12-04 were measured so).
// Prints two tables and writes bench/results/gemm_cuda.json. Without a GPU it says why and exits 0.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/ops/cpu/attention.h"
#include "core/ops/cuda/ops.h"

using namespace distlab;

namespace {

double time_ms(CudaContext& cx, const std::function<void()>& f, int reps) {
  for (int i = 0; i < 3; i++) f();
  cudaEvent_t a, b;
  DL_CUDA(cudaEventCreate(&a));
  DL_CUDA(cudaEventCreate(&b));
  DL_CUDA(cudaEventRecord(a, cx.compute()));
  for (int i = 0; i < reps; i++) f();
  DL_CUDA(cudaEventRecord(b, cx.compute()));
  DL_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  DL_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

// n values of N(0, 1) into device memory of type t (f32 or bf16): a pool of 2^20 draws laid over the buffer,
// shifted each pass
void fill_normal(void* dst, DType t, int64_t n, uint64_t seed) {
  constexpr int64_t kPool = int64_t(1) << 20;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> pool(kPool);
  for (float& x : pool) x = normal(gen);
  std::vector<float> f(t == DType::f32 ? size_t(n) : 0);
  std::vector<__nv_bfloat16> h(t == DType::bf16 ? size_t(n) : 0);
  for (int64_t i = 0; i < n; i++) {
    const float v = pool[size_t((i + (i / kPool) * 7919) % kPool)];
    if (t == DType::f32) f[size_t(i)] = v;
    else h[size_t(i)] = __float2bfloat16(v);
  }
  DL_CUDA(cudaMemcpy(dst, t == DType::f32 ? (const void*)f.data() : (const void*)h.data(), size_t(n) * (t == DType::f32 ? 4 : 2),
                     cudaMemcpyHostToDevice));
}

}  // namespace

int main() {
  const CudaProbe probe = probe_cuda();
  if (!probe.usable) {
    fmt::print("bench_gemm_cuda: skipped: no usable GPU ({})\n", probe.reason);
    return 0;
  }
  fmt::print("GPU 0: {}, sm {}{}\n", probe.devices[0].name, probe.devices[0].sm_major, probe.devices[0].sm_minor);
  CudaContext cx(0);
  Runtime rt(DeviceKind::cuda);
  rt.cuda = &cx;
  nlohmann::json results = nlohmann::json::array();
  fmt::print("{:>6} {:>6} {:>14} {:>12} {:>12} {:>7}\n", "n", "math", "distlab TF/s", "cuBLAS TF/s", "naive TF/s", "ratio");
  for (int64_t n : {int64_t(4096), int64_t(8192)}) {
    const double flops = 2.0 * double(n) * double(n) * double(n);
    const size_t elems = size_t(n * n);
    float *A, *B, *C;
    __nv_bfloat16 *Ah, *Bh, *Ch;
    DL_CUDA(cudaMalloc(&A, elems * 4));
    DL_CUDA(cudaMalloc(&B, elems * 4));
    DL_CUDA(cudaMalloc(&C, elems * 4));
    DL_CUDA(cudaMalloc(&Ah, elems * 2));
    DL_CUDA(cudaMalloc(&Bh, elems * 2));
    DL_CUDA(cudaMalloc(&Ch, elems * 2));
    fill_normal(A, DType::f32, int64_t(elems), 1);
    fill_normal(B, DType::f32, int64_t(elems), 2);
    fill_normal(Ah, DType::bf16, int64_t(elems), 3);
    fill_normal(Bh, DType::bf16, int64_t(elems), 4);
    const int reps = n == 4096 ? 20 : 5;
    const float one = 1.0f, zero = 0.0f;
    for (GemmMath math : {GemmMath::bf16, GemmMath::tf32, GemmMath::f32}) {
      if (n == 8192 && math != GemmMath::bf16) continue;
      const bool low = math == GemmMath::bf16;
      const cublasComputeType_t compute = math == GemmMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      const double ours = time_ms(cx, [&] {
        if (low)
          cuda::gemm_ex(rt, "gemm", false, false, n, n, n, 1.0f, Ah, DType::bf16, n, Bh, DType::bf16, n, 0.0f, Ch, DType::bf16, n, math);
        else {
          cx.math = math;
          cuda::gemm(rt, "gemm", false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        }
      }, reps);
      const double raw = time_ms(cx, [&] {
        DL_CUBLAS(cublasGemmEx(cx.blas(), CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &one, low ? (void*)Bh : (void*)B,
                               low ? CUDA_R_16BF : CUDA_R_32F, int(n), low ? (void*)Ah : (void*)A, low ? CUDA_R_16BF : CUDA_R_32F,
                               int(n), &zero, low ? (void*)Ch : (void*)C, low ? CUDA_R_16BF : CUDA_R_32F, int(n), compute,
                               CUBLAS_GEMM_DEFAULT));
      }, reps);
      double naive = 0;
      if (math == GemmMath::f32)
        naive = time_ms(cx, [&] { cuda::gemm_naive(rt, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n); }, 3);
      const double t_ours = flops / ours / 1e9, t_raw = flops / raw / 1e9, t_naive = naive > 0 ? flops / naive / 1e9 : 0;
      fmt::print("{:>6} {:>6} {:>14.1f} {:>12.1f} {:>12} {:>6.1f}%\n", n, gemm_math_name(math), t_ours, t_raw,
                 naive > 0 ? fmt::format("{:.1f}", t_naive) : "-", 100 * t_ours / t_raw);
      results.push_back({{"n", n}, {"math", gemm_math_name(math)}, {"distlab_tflops", t_ours}, {"cublas_tflops", t_raw},
                         {"naive_tflops", t_naive}, {"ratio", t_ours / t_raw}});
    }
    cx.sync();
    for (void* p : {(void*)A, (void*)B, (void*)C, (void*)Ah, (void*)Bh, (void*)Ch}) cudaFree(p);
  }
  fmt::print("\n{:>10} {:>30} {:>10} {:>10} {:>12}\n", "shape", "attention kernel", "fwd ms", "bwd ms", "fwd+bwd TF/s");
  struct Shape { const char* name; int64_t B, T, C, NH; };
  for (const Shape& sh : {Shape{"gpt2-124m", 8, 1024, 768, 12}, Shape{"llama3-8b", 1, 8192, 4096, 32}}) {
    const int64_t B = sh.B, T = sh.T, C = sh.C, NH = sh.NH, hs = C / NH;
    float *qkv, *out, *lse, *dout, *dqkv, *att = nullptr;
    DL_CUDA(cudaMalloc(&qkv, size_t(B * T * 3 * C) * 4));
    DL_CUDA(cudaMalloc(&dqkv, size_t(B * T * 3 * C) * 4));
    DL_CUDA(cudaMalloc(&out, size_t(B * T * C) * 4));
    DL_CUDA(cudaMalloc(&dout, size_t(B * T * C) * 4));
    DL_CUDA(cudaMalloc(&lse, size_t(B * NH * T) * 4));
    fill_normal(qkv, DType::f32, B * T * 3 * C, 5);
    fill_normal(dout, DType::f32, B * T * C, 6);
    const double ffwd = flash_attention_flops(B, T, C, NH, false), fbwd = flash_attention_flops(B, T, C, NH, true);
    const double att_bytes = double(B * NH) * double(T) * double(T) * 4;
    const bool naive_fits = att_bytes <= 4e9;  // the naive kernels hold every score: 8.6 GB at LLaMA's shape
    if (naive_fits) DL_CUDA(cudaMalloc(&att, size_t(att_bytes)));
    for (const char* kernel : {"naive (cuBLAS bf16, f32 softmax)", "flash, CUDA cores (f32)", "flash, tensor cores (bf16)"}) {
      const bool naive = kernel[0] == 'n', tc = std::string(kernel).find("tensor") != std::string::npos;
      cx.math = naive || tc ? GemmMath::bf16 : GemmMath::f32;
      if ((naive && !naive_fits) || (tc && !cuda::flash_tensor_cores(rt, hs))) {
        fmt::print("{:>10} {:>30} {:>10} {:>10} {:>12}\n", sh.name, kernel, "-", "-", naive ? "(too big)" : "(not here)");
        continue;
      }
      const double fwd = time_ms(cx, [&] {
        if (naive) cuda::attention_forward(rt, out, att, qkv, B, T, C, NH);
        else cuda::flash_attention_forward(rt, out, lse, qkv, B, T, C, NH);
      }, 5);
      const double bwd = time_ms(cx, [&] {
        if (naive) cuda::attention_backward(rt, dqkv, dout, qkv, att, B, T, C, NH);
        else cuda::flash_attention_backward(rt, dqkv, dout, qkv, out, lse, B, T, C, NH);
      }, 5);
      const double tflops = (ffwd + fbwd) / (fwd + bwd) / 1e9;
      fmt::print("{:>10} {:>30} {:>10.2f} {:>10.2f} {:>12.1f}\n", sh.name, kernel, fwd, bwd, tflops);
      results.push_back({{"attention", kernel}, {"shape", sh.name}, {"fwd_ms", fwd}, {"bwd_ms", bwd}, {"tflops", tflops}});
    }
    cx.math = GemmMath::f32;
    cx.sync();
    for (void* p : {(void*)qkv, (void*)dqkv, (void*)out, (void*)dout, (void*)lse, (void*)att}) cudaFree(p);
  }
  std::filesystem::create_directories("bench/results");
  std::ofstream out("bench/results/gemm_cuda.json");
  out << results.dump(2) << "\n";
  if (!out) {
    fmt::print(stderr, "bench_gemm_cuda: cannot write bench/results/gemm_cuda.json\n");
    return 1;
  }
  fmt::print("wrote bench/results/gemm_cuda.json\n");
  return 0;
}
