// GEMM on the GPU: distlab's cuda::gemm_ex / cuda::gemm against raw cuBLAS on the same operands, at
// 4096^3 (and 8192^3 for bf16), in bf16 (tensor cores, f32 sums), TF32 and f32; and the tiled naive
// kernel, to show what cuBLAS adds. TFLOP/s from CUDA events over 20 timed calls after 3 warm-ups.
// Prints a table and writes bench/results/gemm_cuda.json. Without a GPU it says why and exits 0.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
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
    cuda::fill(rt, A, DType::f32, 0.01f, int64_t(elems));
    cuda::fill(rt, B, DType::f32, 0.02f, int64_t(elems));
    cuda::fill(rt, Ah, DType::bf16, 0.01f, int64_t(elems));
    cuda::fill(rt, Bh, DType::bf16, 0.02f, int64_t(elems));
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
