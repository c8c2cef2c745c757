// LLaMA's kernels on the GPU, as core/ops/cpu/llama.cpp, in f32 and on 16-bit tensors (the *_16 forms): RMSNorm one block per row (the weight's gradient
// in fixed-order chunks, as LayerNorm's), RoPE one thread per pair, SwiGLU and repeat_kv elementwise. The
// kv heads' gradient sums its query heads in order: no atomics, the same bits every run.
#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

// Every kernel is a template on its tensors' storage type T (f32, or bf16/f16 read as f32 exactly and each
// result rounded once: dtype16.cuh): the f32 instances are the f32 kernels, the 16-bit ones their forms.

template <class T>
__global__ void rmsnorm_forward_k(T* out, float* rstd, const T* inp, const T* weight, int64_t C, float eps) {
  const int64_t n = blockIdx.x;
  const T* x = inp + n * C;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) ss += ld(x, i) * ld(x, i);
  const float r = rsqrtf(block_sum(ss) / float(C) + eps);
  T* o = out + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) st(o, i, (ld(x, i) * r) * ld(weight, i));
  if (threadIdx.x == 0) rstd[n] = r;
}

// dx = rstd · (g − xhat · mean(g · xhat)), g = dout · weight
template <class T>
__global__ void rmsnorm_backward_dx_k(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd, int64_t C) {
  const int64_t n = blockIdx.x;
  const T* x = inp + n * C;
  const T* dy = dout + n * C;
  const float s = rstd[n];
  float b = 0.0f;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) b += ld(weight, i) * ld(dy, i) * (ld(x, i) * s);
  const float gx = block_sum(b) / float(C);
  T* dx = dinp + n * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) st(dx, i, s * (ld(weight, i) * ld(dy, i) - (ld(x, i) * s) * gx));
}

// dweight's partial sums per chunk of kChunkRows rows, rows in order (add_column_sums adds the chunks)
template <class T>
__global__ void rmsnorm_backward_dw_partials_k(float* pdw, const T* dout, const T* inp, const float* rstd, int64_t N, int64_t C) {
  for (int64_t chunk = blockIdx.y; chunk * kChunkRows < N; chunk += gridDim.y) {
    const int64_t end = (chunk + 1) * kChunkRows < N ? (chunk + 1) * kChunkRows : N;
    DL_GRID_LOOP(i, C) {
      float dw = 0.0f;
      for (int64_t n = chunk * kChunkRows; n < end; n++) dw += ld(inp, n * C + i) * rstd[n] * ld(dout, n * C + i);
      pdw[chunk * C + i] = dw;
    }
  }
}

// the pair (u, v) = (x[i], x[i + hd/2]) at position t turned by the angle t · θ^(-2i/hd) in float, as the cpu
// (and Hugging Face) computes it; sign -1 turns it back
__device__ __forceinline__ void rope_turn(float& u, float& v, int64_t t, int64_t i, int64_t hd, float theta, float sign) {
  const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(hd));
  const float a = float(t) * inv_freq, c = cosf(a), s = sign * sinf(a);
  const float u2 = u * c - v * s, v2 = v * c + u * s;
  u = u2;
  v = v2;
}

// one thread per (row, head, pair i), in place
template <class E>
__global__ void rope_k(E* x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t ld, float theta, float sign) {
  const int64_t half = hd / 2;
  DL_GRID_LOOP(j, B * T * H * half) {
    const int64_t i = j % half, h = (j / half) % H, bt = j / (half * H), t = bt % T;
    const int64_t at = bt * ld + h * hd;
    float u = wide(x[at + i]), v = wide(x[at + i + half]);
    rope_turn(u, v, t, i, hd, theta, sign);
    x[at + i] = narrow<E>(u);
    x[at + i + half] = narrow<E>(v);
  }
}

template <class T>
__global__ void swiglu_forward_k(T* out, const T* gate, const T* up, int64_t n) {
  DL_GRID_LOOP(i, n) {
    const float g = ld(gate, i);
    st(out, i, g / (1.0f + expf(-g)) * ld(up, i));
  }
}

template <class T>
__global__ void swiglu_backward_k(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  DL_GRID_LOOP(i, n) {
    const float g = ld(gate, i), sig = 1.0f / (1.0f + expf(-g)), d = ld(dout, i);
    st(dgate, i, d * ld(up, i) * (sig * (1.0f + g * (1.0f - sig))));
    st(dup, i, d * (g * sig));
  }
}

// a copy: any type
template <class T>
__global__ void repeat_kv_forward_k(T* qkv, const T* q, const T* k, const T* v, int64_t BT, int64_t H, int64_t KV, int64_t hd) {
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

void rope_check(int64_t hd) {
  if (hd % 2 != 0) throw ShapeError("RoPE: head size " + std::to_string(hd) + " is odd", "RoPE turns pairs: use an even head size");
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
  rope_check(hd);
  rope_k<<<blocks_for(B * T * H * (hd / 2)), kThreads, 0, stream(rt)>>>(x, B, T, H, hd, ld, theta,
                                                                       inverse ? -1.0f : 1.0f);
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

// ---- the 16-bit forms (core/ops/cpu/llama.h): the kernels above on bf16/fp16 tensors, each result rounded once,
// where the f32 way widened every input to an f32 copy and rounded f32 outputs. Each records its f32 kernel's
// event(s).

void rmsnorm_forward_16(Runtime& rt, void* out, float* rstd, const void* inp, const void* weight, DType t, int64_t N, int64_t C, float eps) {
  require_16bit(t, "rmsnorm_forward_16");
  OpScope op(rt, "rmsnorm_forward", 4.0 * N * C, 4.0 * (2 * N * C + C + N));
  if (N == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    rmsnorm_forward_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(static_cast<T*>(out), rstd, static_cast<const T*>(inp),
                                                                 static_cast<const T*>(weight), C, eps);
  });
  DL_CUDA_LAUNCHED("rmsnorm_forward_16");
}

// dweight takes the partial sums through an f32 copy of its C values (the old value plus the sums, rounded once)
void rmsnorm_backward_16(Runtime& rt, void* dinp, void* dweight, const void* dout, const void* inp, const void* weight, const float* rstd,
                         DType t, int64_t N, int64_t C) {
  require_16bit(t, "rmsnorm_backward_16");
  OpScope op(rt, "rmsnorm_backward", 8.0 * N * C, 4.0 * (3 * N * C + 2 * C + N));
  if (N == 0) return;
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  Scratch partial(rt, chunks * C, "rmsnorm backward's partial sums");
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    rmsnorm_backward_dx_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(static_cast<T*>(dinp), static_cast<const T*>(dout),
                                                                     static_cast<const T*>(inp), static_cast<const T*>(weight), rstd, C);
    DL_CUDA_LAUNCHED("rmsnorm_backward_16 dx");
    const dim3 grid(blocks_for(C), unsigned(std::min<int64_t>(chunks, 65535)));
    rmsnorm_backward_dw_partials_k<<<grid, kThreads, 0, stream(rt)>>>(partial.p, static_cast<const T*>(dout), static_cast<const T*>(inp),
                                                                      rstd, N, C);
    DL_CUDA_LAUNCHED("rmsnorm_backward_16 dw");
  });
  F32 dw(rt, dweight, t, C);
  add_column_sums(rt, dw.p, partial.p, chunks, C, "rmsnorm_backward dweight");
  convert_on(stream(rt), dw.p, DType::f32, dweight, t, C);
}

void swiglu_forward_16(Runtime& rt, void* out, const void* gate, const void* up, DType t, int64_t n) {
  require_16bit(t, "swiglu_forward_16");
  OpScope op(rt, "swiglu_forward", 6.0 * n, 12.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    swiglu_forward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(out), static_cast<const T*>(gate), static_cast<const T*>(up), n);
  });
  DL_CUDA_LAUNCHED("swiglu_forward_16");
}

void swiglu_backward_16(Runtime& rt, void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, int64_t n) {
  require_16bit(t, "swiglu_backward_16");
  OpScope op(rt, "swiglu_backward", 12.0 * n, 20.0 * n);
  if (n == 0) return;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    swiglu_backward_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dout),
                                                                  static_cast<const T*>(gate), static_cast<const T*>(up), n);
  });
  DL_CUDA_LAUNCHED("swiglu_backward_16");
}

// q (where rotate_q) and k turned in place, each value rounded once; then qkv a copy of q, k and v repeated.
// The f32 kernels' events, recorded for an empty batch too.
void rope_repeat_kv_forward_16(Runtime& rt, void* qkv, void* q, void* k, const void* v, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd, float theta, bool rotate_q) {
  require_16bit(t, "rope_repeat_kv_forward_16");
  rope_check(hd);
  const int64_t Cq = H * hd, Ckv = KV * hd;
  const bool any = B * T > 0;
  with_16bit_type(t, [&](auto z) {
    using E = decltype(z);
    E *qe = static_cast<E*>(q), *ke = static_cast<E*>(k);
    if (rotate_q) {
      OpScope op(rt, "rope_forward", 6.0 * B * T * H * hd / 2, 4.0 * 2 * B * T * H * hd);
      if (any) {
        rope_k<<<blocks_for(B * T * H * (hd / 2)), kThreads, 0, stream(rt)>>>(qe, B, T, H, hd, Cq, theta, 1.0f);
        DL_CUDA_LAUNCHED("rope_repeat_kv_forward_16 q");
      }
    }
    {
      OpScope op(rt, "rope_forward", 6.0 * B * T * KV * hd / 2, 4.0 * 2 * B * T * KV * hd);
      if (any) {
        rope_k<<<blocks_for(B * T * KV * (hd / 2)), kThreads, 0, stream(rt)>>>(ke, B, T, KV, hd, Ckv, theta, 1.0f);
        DL_CUDA_LAUNCHED("rope_repeat_kv_forward_16 k");
      }
    }
    OpScope op(rt, "repeat_kv_forward", 0.0, 4.0 * (B * T * (Cq + 2 * Ckv) + 3 * B * T * Cq));
    if (!any) return;
    repeat_kv_forward_k<<<blocks_for(B * T * 3 * Cq), kThreads, 0, stream(rt)>>>(static_cast<E*>(qkv), static_cast<const E*>(qe),
                                                                                 static_cast<const E*>(ke), static_cast<const E*>(v), B * T, H,
                                                                                 KV, hd);
    DL_CUDA_LAUNCHED("rope_repeat_kv_forward_16");
  });
}

namespace {

// The backward in one kernel, one thread per row and: pair of a query head (dq: dqkv's q part turned back), pair
// of a kv head (dk: the sums of its query heads' gradients, in order, turned back), or element of a kv head
// (dv: the same sums). Each sum and turn is the f32 kernels' arithmetic, each result rounded once; no f32 copy.
template <class E>
__global__ void rope_repeat_kv_backward_k(E* dq, E* dk, E* dv, const E* dqkv, int64_t BT, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                          float theta) {
  const int64_t half = hd / 2, C = H * hd, Ckv = KV * hd, group = H / KV;
  const int64_t per_row = H * half + KV * half + KV * hd;
  DL_GRID_LOOP(j, BT * per_row) {
    const int64_t bt = j / per_row, t = bt % T;
    int64_t c = j % per_row;
    const E* row = dqkv + bt * 3 * C;
    if (c >= H * half + KV * half) {  // dv
      c -= H * half + KV * half;
      const int64_t g = c / hd, d = c % hd;
      float s = 0.0f;
      for (int64_t r = 0; r < group; r++) s += wide(row[2 * C + (g * group + r) * hd + d]);
      dv[bt * Ckv + c] = narrow<E>(s);
      continue;
    }
    const bool is_q = c < H * half;
    if (!is_q) c -= H * half;
    const int64_t h = c / half, i = c % half;
    float u = 0.0f, v = 0.0f;
    if (is_q) {
      u = wide(row[h * hd + i]);
      v = wide(row[h * hd + i + half]);
    } else {
      for (int64_t r = 0; r < group; r++) {  // in order, as repeat_kv_backward
        u += wide(row[C + (h * group + r) * hd + i]);
        v += wide(row[C + (h * group + r) * hd + i + half]);
      }
    }
    rope_turn(u, v, t, i, hd, theta, -1.0f);  // turned back
    E* out = is_q ? dq + bt * C + h * hd : dk + bt * Ckv + h * hd;
    out[i] = narrow<E>(u);
    out[i + half] = narrow<E>(v);
  }
}

}  // namespace

// One kernel does the three steps; their three f32 events are recorded (the trace's FLOPs and bytes are the cpu's).
void rope_repeat_kv_backward_16(Runtime& rt, void* dq, void* dk, void* dv, const void* dqkv, DType t, int64_t B, int64_t T, int64_t H,
                                int64_t KV, int64_t hd, float theta) {
  require_16bit(t, "rope_repeat_kv_backward_16");
  rope_check(hd);
  const int64_t Cq = H * hd, Ckv = KV * hd, half = hd / 2;
  {
    OpScope op(rt, "repeat_kv_backward", double(2 * B * T * Cq), 4.0 * (3 * B * T * Cq + B * T * (Cq + 2 * Ckv)));
    if (B * T > 0) {
      with_16bit_type(t, [&](auto z) {
        using E = decltype(z);
        rope_repeat_kv_backward_k<<<blocks_for(B * T * (H * half + KV * half + Ckv)), kThreads, 0, stream(rt)>>>(
            static_cast<E*>(dq), static_cast<E*>(dk), static_cast<E*>(dv), static_cast<const E*>(dqkv), B * T, T, H, KV, hd, theta);
      });
      DL_CUDA_LAUNCHED("rope_repeat_kv_backward_16");
    }
  }
  { OpScope op(rt, "rope_backward", 6.0 * B * T * H * hd / 2, 4.0 * 2 * B * T * H * hd); }
  OpScope op(rt, "rope_backward", 6.0 * B * T * KV * hd / 2, 4.0 * 2 * B * T * KV * hd);
}

}  // namespace distlab::cuda
