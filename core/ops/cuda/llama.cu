// LLaMA's kernels on the GPU, as core/ops/cpu/llama.cpp: RMSNorm one block per row (the weight's gradient
// in fixed-order chunks, as LayerNorm's), RoPE one thread per pair, SwiGLU and repeat_kv elementwise. The
// kv heads' gradient sums its query heads in order: no atomics, the same bits every run.
#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

__global__ void rmsnorm_forward_k(float* out, float* rstd, const float* inp, const float* weight, int64_t C, float eps) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
  const float r = rsqrtf(block_sum(ss) / float(C) + eps);
  float* o = out + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) o[i] = (x[i] * r) * weight[i];
  if (threadIdx.x == 0) rstd[n] = r;
}

// dx = rstd · (g − xhat · mean(g · xhat)), g = dout · weight
__global__ void rmsnorm_backward_dx_k(float* dinp, const float* dout, const float* inp, const float* weight, const float* rstd, int64_t C) {
  const int64_t n = blockIdx.x;
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float s = rstd[n];
  float b = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) b += weight[i] * dy[i] * (x[i] * s);
  const float gx = block_sum(b) / float(C);
  float* dx = dinp + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dx[i] = s * (weight[i] * dy[i] - (x[i] * s) * gx);
}

// dweight's partial sums per chunk of kChunkRows rows, rows in order (add_column_sums adds the chunks)
__global__ void rmsnorm_backward_dw_partials_k(float* pdw, const float* dout, const float* inp, const float* rstd, int64_t N, int64_t C) {
  for (int64_t chunk = blockIdx.y; chunk * kChunkRows < N; chunk += gridDim.y) {
    const int64_t end = (chunk + 1) * kChunkRows < N ? (chunk + 1) * kChunkRows : N;
    DL_GRID_LOOP(i, C) {
      float dw = 0.0f;
      for (int64_t n = chunk * kChunkRows; n < end; n++) dw += inp[n * C + i] * rstd[n] * dout[n * C + i];
      pdw[chunk * C + i] = dw;
    }
  }
}

// one thread per (row, head, pair i): angle t · θ^(-2i/hd) in float, as the cpu (and Hugging Face)
__global__ void rope_k(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, float sign) {
  const int64_t half = hd / 2;
  DL_GRID_LOOP(j, B * T * H * half) {
    const int64_t i = j % half, h = (j / half) % H, bt = j / (half * H), t = bt % T;
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(hd));
    const float a = float(t) * inv_freq, c = cosf(a), s = sign * sinf(a);
    float* p = x + bt * ld + h * hd;
    const float u = p[i], v = p[i + half];
    p[i] = u * c - v * s;
    p[i + half] = v * c + u * s;
  }
}

__global__ void swiglu_forward_k(float* out, const float* gate, const float* up, int64_t n) {
  DL_GRID_LOOP(i, n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void swiglu_backward_k(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  DL_GRID_LOOP(i, n) {
    const float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = dout[i] * up[i] * (sig * (1.0f + g * (1.0f - sig)));
    dup[i] = dout[i] * (g * sig);
  }
}

__global__ void repeat_kv_forward_k(float* qkv, const float* q, const float* k, const float* v, int64_t BT, int64_t H, int64_t KV, int64_t hd) {
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  DL_GRID_LOOP(j, BT * 3 * C) {
    const int64_t bt = j / (3 * C), c = j % (3 * C), part = c / C, h = (c % C) / hd, d = c % hd;
    qkv[j] = part == 0 ? q[bt * C + c] : (part == 1 ? k : v)[bt * Ckv + (h / group) * hd + d];
  }
}

__global__ void repeat_kv_backward_k(float* dq, float* dk, float* dv, const float* dqkv, int64_t BT, int64_t H, int64_t KV, int64_t hd) {
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  DL_GRID_LOOP(j, BT * (C + 2 * Ckv)) {
    const int64_t bt = j / (C + 2 * Ckv), c = j % (C + 2 * Ckv);
    const float* row = dqkv + bt * 3 * C;
    if (c < C) {
      dq[bt * C + c] = row[c];
      continue;
    }
    const int64_t part = (c - C) / Ckv, g = ((c - C) % Ckv) / hd, d = (c - C) % hd;
    float s = 0.0f;
    for (int64_t r = 0; r < group; r++) s += row[(1 + part) * C + (g * group + r) * hd + d];  // in order, as the cpu
    (part == 0 ? dk : dv)[bt * Ckv + g * hd + d] = s;
  }
}

}  // namespace

void rmsnorm_forward(Runtime& rt, float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C, float eps) {
  OpScope op(rt, "rmsnorm_forward", 4.0 * N * C, 4.0 * (2 * N * C + C + N));
  if (N == 0) return;
  rmsnorm_forward_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(out, rstd, inp, weight, C, eps);
  DL_CUDA_LAUNCHED("rmsnorm_forward");
}

void rmsnorm_backward(Runtime& rt, float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd,
                      int64_t N, int64_t C) {
  OpScope op(rt, "rmsnorm_backward", 8.0 * N * C, 4.0 * (3 * N * C + 2 * C + N));
  if (N == 0) return;
  rmsnorm_backward_dx_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(dinp, dout, inp, weight, rstd, C);
  DL_CUDA_LAUNCHED("rmsnorm_backward dx");
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  Scratch partial(rt, chunks * C, "rmsnorm backward's partial sums");
  const dim3 grid(blocks_for(C), unsigned(std::min<int64_t>(chunks, 65535)));
  rmsnorm_backward_dw_partials_k<<<grid, kThreads, 0, stream(rt)>>>(partial.p, dout, inp, rstd, N, C);
  DL_CUDA_LAUNCHED("rmsnorm_backward dw");
  add_column_sums(rt, dweight, partial.p, chunks, C, "rmsnorm_backward dweight");
}

void rope_apply(Runtime& rt, float* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, bool inverse) {
  OpScope op(rt, inverse ? "rope_backward" : "rope_forward", 6.0 * B * T * H * hd / 2, 4.0 * 2 * B * T * H * hd);
  if (hd % 2 != 0) throw ShapeError("RoPE: head size " + std::to_string(hd) + " is odd", "RoPE turns pairs: use an even head size");
  rope_k<<<blocks_for(B * T * H * (hd / 2)), kThreads, 0, stream(rt)>>>(x, B, T, H, hd, ld, theta, inverse ? -1.0f : 1.0f);
  DL_CUDA_LAUNCHED("rope_apply");
}

void swiglu_forward(Runtime& rt, float* out, const float* gate, const float* up, int64_t n) {
  OpScope op(rt, "swiglu_forward", 6.0 * n, 12.0 * n);
  swiglu_forward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, gate, up, n);
  DL_CUDA_LAUNCHED("swiglu_forward");
}

void swiglu_backward(Runtime& rt, float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  OpScope op(rt, "swiglu_backward", 12.0 * n, 20.0 * n);
  swiglu_backward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(dgate, dup, dout, gate, up, n);
  DL_CUDA_LAUNCHED("swiglu_backward");
}

void repeat_kv_forward(Runtime& rt, float* qkv, const float* q, const float* k, const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd) {
  const int64_t C = H * hd, Ckv = KV * hd;
  OpScope op(rt, "repeat_kv_forward", 0.0, 4.0 * (B * T * (C + 2 * Ckv) + 3 * B * T * C));
  repeat_kv_forward_k<<<blocks_for(B * T * 3 * C), kThreads, 0, stream(rt)>>>(qkv, q, k, v, B * T, H, KV, hd);
  DL_CUDA_LAUNCHED("repeat_kv_forward");
}

void repeat_kv_backward(Runtime& rt, float* dq, float* dk, float* dv, const float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t hd) {
  const int64_t C = H * hd, Ckv = KV * hd;
  OpScope op(rt, "repeat_kv_backward", double(2 * B * T * C), 4.0 * (3 * B * T * C + B * T * (C + 2 * Ckv)));
  repeat_kv_backward_k<<<blocks_for(B * T * (C + 2 * Ckv)), kThreads, 0, stream(rt)>>>(dq, dk, dv, dqkv, B * T, H, KV, hd);
  DL_CUDA_LAUNCHED("repeat_kv_backward");
}

}  // namespace distlab::cuda
