// The optimizers' updates on the GPU, as core/ops/cpu/optim.cpp: one thread per element for SGD and AdamW
// (the same operations, each rounded as the cpu rounds it, so the same bits), and the two reductions the step reads on
// the host: the sum of squares (clip_grad_norm; in double, per block then in one block, in a fixed order)
// and whether everything is finite (the loss scaler's overflow check).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

// nvcc fuses a * b + c into one FMA (one rounding) by default, where the cpu rounds twice: the updates
// spell every operation with its round-to-nearest intrinsic, which nvcc never fuses, in the cpu's order.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

__global__ void sgd_k(float* w, float* buf, const float* g, int64_t n, SgdUpdate u) {
  const float gf = u.factor ? *u.factor : u.grad_factor;  // clip_factor's, where the step clips on the device
  DL_GRID_LOOP(j, n) {
    float d = add(mul(g[j], gf), mul(u.weight_decay, w[j]));
    if (buf) {
      buf[j] = u.first ? d : add(mul(u.momentum, buf[j]), mul(sub(1.0f, u.dampening), d));
      d = u.nesterov ? add(d, mul(u.momentum, buf[j])) : buf[j];
    }
    w[j] = sub(w[j], mul(u.lr, d));
  }
}

// One element of AdamW: the cpu's operations in the cpu's order
__device__ __forceinline__ void adamw_element(float* w, float* m, float* v, float g, int64_t j, const AdamWUpdate& u) {
  const float gj = mul(g, u.grad_factor);
  w[j] = mul(w[j], u.decay);
  m[j] = add(mul(u.beta1, m[j]), mul(sub(1.0f, u.beta1), gj));
  v[j] = add(mul(u.beta2, v[j]), mul(mul(sub(1.0f, u.beta2), gj), gj));
  // sqrt and division are correctly rounded (nvcc's defaults, -prec-sqrt and -prec-div), as the cpu's
  w[j] = sub(w[j], __fdiv_rn(mul(u.step_size, m[j]), add(__fdiv_rn(__fsqrt_rn(v[j]), u.bc2_sqrt), u.eps)));
}

__global__ void adamw_k(float* w, float* m, float* v, const float* g, int64_t n, AdamWUpdate u) {
  DL_GRID_LOOP(j, n) adamw_element(w, m, v, g[j], j, u);
}

// The multi-tensor form (PyTorch's multi_tensor_apply): up to kListTensors tensors travel in the kernel's
// parameters (4 KB at most: this is ~2 KB), and each block updates one chunk of kListChunk elements of
// one of them, so a list of 150 parameters of any sizes is 7 launches, not 150.
constexpr int kListTensors = 24;
constexpr int64_t kListChunk = 65536;
struct AdamWList {
  float* w[kListTensors];
  float* m[kListTensors];
  float* v[kListTensors];
  const void* g[kListTensors];
  int64_t n[kListTensors];
  AdamWUpdate u[kListTensors];
  const float* factor[kListTensors];  // the gradient factor in device memory, or nullptr: u's
  DType g_type[kListTensors];
  int first_block[kListTensors + 1];  // tensor t's chunks are blocks first_block[t] .. first_block[t + 1] - 1
  int count;
};

static_assert(sizeof(AdamWList) <= 4096, "a kernel's parameters are at most 4 KB");

__device__ __forceinline__ float widen(const void* g, DType t, int64_t j) {
  if (t == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(g)[j]);  // exact
  if (t == DType::f16) return __half2float(static_cast<const __half*>(g)[j]);               // exact
  return static_cast<const float*>(g)[j];
}

__global__ void adamw_list_k(const AdamWList list) {
  int t = 0;
  while (t + 1 < list.count && int(blockIdx.x) >= list.first_block[t + 1]) t++;
  const int64_t lo = int64_t(int(blockIdx.x) - list.first_block[t]) * kListChunk;
  const int64_t hi = lo + kListChunk < list.n[t] ? lo + kListChunk : list.n[t];
  AdamWUpdate u = list.u[t];
  if (list.factor[t]) u.grad_factor = *list.factor[t];  // clip_factor's, computed on the device
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
    adamw_element(list.w[t], list.m[t], list.v[t], widen(list.g[t], list.g_type[t], j), j, u);
}

// The cpu's clip_factor in one thread: the same double operations (correctly rounded on the GPU too). A NaN
// norm is the GPU's canonical NaN, not the cpu's payload: equal as NaNs (a metric writes either as null).
__global__ void clip_factor_k(float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0;
  for (int64_t i = 0; i < n; i++) total += sums[i];
  const double g = sqrt(total) / double(loss_scale);
  const float coef = max_norm > 0 && isnan(g) ? __int_as_float(0x7fc00000)
                     : max_norm > 0 && g > max_norm ? __double2float_rn(max_norm / (g + 1e-6))
                                                   : 1.0f;
  *norm = g;
  *factor = __fdiv_rn(coef, loss_scale);
}

__global__ void scale_k(float* x, int64_t n, float s) {
  DL_GRID_LOOP(j, n) x[j] *= s;
}

constexpr int kReduceBlocks = 256;

// partial[b] = the sum of squares of block b's grid-strided share, in double (a tree in shared memory)
__global__ void sum_squares_k(double* partial, const float* x, int64_t n) {
  __shared__ double s[kThreads];
  double acc = 0;
  DL_GRID_LOOP(j, n) acc += double(x[j]) * double(x[j]);
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

// *out = the partials' sum, in block order: the bits of sum_squares' host loop
__global__ void sum_partials_k(double* out, const double* partial) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0;
  for (int b = 0; b < kReduceBlocks; b++) total += partial[b];
  *out = total;
}

// flag = 1 when some x[j] is inf or NaN (every writer writes 1: no race on the value)
__global__ void nonfinite_k(float* flag, const float* x, int64_t n) {
  DL_GRID_LOOP(j, n) if (!isfinite(x[j])) *flag = 1.0f;
}

}  // namespace

void sgd_update(Runtime& rt, float* w, float* buf, const float* g, int64_t n, const SgdUpdate& u) {
  if (n == 0) return;
  sgd_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(w, buf, g, n, u);
  DL_CUDA_LAUNCHED("sgd_update");
}

void adamw_update(Runtime& rt, float* w, float* m, float* v, const float* g, int64_t n, const AdamWUpdate& u) {
  if (n == 0) return;
  adamw_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(w, m, v, g, n, u);
  DL_CUDA_LAUNCHED("adamw_update");
}

void adamw_update_many(Runtime& rt, const AdamWTensor* ts, int64_t count) {
  AdamWList list{};
  int blocks = 0;
  auto launch = [&] {
    if (list.count == 0) return;
    list.first_block[list.count] = blocks;
    adamw_list_k<<<unsigned(blocks), kThreads, 0, stream(rt)>>>(list);
    DL_CUDA_LAUNCHED("adamw_update_many");
    list = AdamWList{};
    blocks = 0;
  };
  for (int64_t i = 0; i < count; i++) {
    const AdamWTensor& t = ts[i];
    if (t.n == 0) continue;
    if (t.g_type != DType::f32 && t.g_type != DType::bf16 && t.g_type != DType::f16)
      throw ShapeError(std::string("adamw_update_many: a ") + dtype_name(t.g_type) + " gradient", "gradients are f32, bf16 or f16");
    const int64_t chunks = (t.n + kListChunk - 1) / kListChunk;
    if (list.count == kListTensors || blocks + chunks > (int64_t(1) << 30)) launch();
    const int k = list.count++;
    list.w[k] = t.w, list.m[k] = t.m, list.v[k] = t.v, list.g[k] = t.g, list.n[k] = t.n, list.u[k] = t.u, list.g_type[k] = t.g_type;
    list.factor[k] = t.factor;
    list.first_block[k] = blocks;
    blocks += int(chunks);
  }
  launch();
}

void scale(Runtime& rt, float* x, int64_t n, float s) {
  if (n == 0) return;
  scale_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(x, n, s);
  DL_CUDA_LAUNCHED("scale");
}

double sum_squares(Runtime& rt, const float* x, int64_t n) {
  if (n == 0) return 0.0;
  Scratch partial(rt, 2 * kReduceBlocks, "sum of squares' partial sums");  // doubles: 2 floats each
  auto* d = reinterpret_cast<double*>(partial.p);
  sum_squares_k<<<kReduceBlocks, kThreads, 0, stream(rt)>>>(d, x, n);
  DL_CUDA_LAUNCHED("sum_squares");
  double host[kReduceBlocks];
  DL_CUDA(cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyDeviceToHost, stream(rt)));
  host_wait(rt);
  double total = 0;
  for (double p : host) total += p;  // the blocks in order: the same bits every run
  return total;
}

void sum_squares_into(Runtime& rt, const float* x, int64_t n, double* out) {
  if (n == 0) {
    DL_CUDA(cudaMemsetAsync(out, 0, sizeof(double), stream(rt)));  // +0.0
    return;
  }
  Scratch partial(rt, 2 * kReduceBlocks, "sum of squares' partial sums");  // freed in stream order: safe
  auto* d = reinterpret_cast<double*>(partial.p);
  sum_squares_k<<<kReduceBlocks, kThreads, 0, stream(rt)>>>(d, x, n);
  DL_CUDA_LAUNCHED("sum_squares_into");
  sum_partials_k<<<1, 32, 0, stream(rt)>>>(out, d);
  DL_CUDA_LAUNCHED("sum_squares_into");
}

void clip_factor(Runtime& rt, float* factor, double* norm, const double* sums, int64_t n, float loss_scale, double max_norm) {
  clip_factor_k<<<1, 32, 0, stream(rt)>>>(factor, norm, sums, n, loss_scale, max_norm);
  DL_CUDA_LAUNCHED("clip_factor");
}

void flag_nonfinite(Runtime& rt, const float* x, int64_t n, float* flag) {
  if (n == 0) return;
  nonfinite_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(flag, x, n);
  DL_CUDA_LAUNCHED("flag_nonfinite");
}

bool all_finite(Runtime& rt, const float* x, int64_t n) {
  if (n == 0) return true;
  Scratch flag(rt, 1, "the overflow flag");
  DL_CUDA(cudaMemsetAsync(flag.p, 0, sizeof(float), stream(rt)));
  nonfinite_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(flag.p, x, n);
  DL_CUDA_LAUNCHED("all_finite");
  float host = 0;
  DL_CUDA(cudaMemcpyAsync(&host, flag.p, sizeof host, cudaMemcpyDeviceToHost, stream(rt)));
  host_wait(rt);
  return host == 0.0f;
}

}  // namespace distlab::cuda
