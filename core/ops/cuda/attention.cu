// Causal self-attention and the embedding lookup on the GPU, as core/ops/cpu/attention.cpp: per batch
// element, the heads' products are one strided-batched cuBLAS call (head h's q, k, v sit h*hs columns into
// qkv, whose rows are 3C long), and the causal softmax is one warp per row.
// Backward keeps a datt workspace for all heads of one batch element at a time (NH x T x T), where the cpu
// keeps one head's (T x T): the memory report of a cuda run counts that difference under `other`.
#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

// rows (R, T), row r = (bh, t): position t sees 0..t; the rest becomes 0
__global__ void causal_softmax_k(float* a, int64_t R, int64_t T) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;
  const int64_t t = r % T;
  float* row = a + r * T;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) mx = fmaxf(mx, row[s]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) {
    row[s] = expf(row[s] - mx);
    sum += row[s];
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t s = lane; s < T; s += 32) row[s] = s <= t ? row[s] * inv : 0.0f;
}

// in place: d[t,s] = a[t,s] * (d[t,s] - Σ_{s'<=t} a[t,s'] d[t,s']) for s <= t, 0 after
__global__ void causal_softmax_backward_k(float* d, const float* a, int64_t R, int64_t T) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;
  const int64_t t = r % T;
  float* dr = d + r * T;
  const float* ar = a + r * T;
  float dot = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) dot += ar[s] * dr[s];
  dot = warp_sum(dot);
  for (int64_t s = lane; s < T; s += 32) dr[s] = s <= t ? ar[s] * (dr[s] - dot) : 0.0f;
}

__global__ void embedding_forward_k(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t BT, int64_t T,
                                    int64_t C) {
  DL_GRID_LOOP(i, BT * C) {
    const int64_t bt = i / C, c = i % C;
    const int32_t tok = tokens[bt];  // -1: another tensor-parallel rank's row (zeros here)
    out[i] = tok < 0 ? 0.0f : wte[int64_t(tok) * C + c] + (wpe ? wpe[(bt % T) * C + c] : 0.0f);
  }
}

// dwte: thread (c, g) walks every position in order and adds the rows of the tokens t with t % kTokenGroups
// == g. Each token's rows are added in position order (the cpu's order, so the same bits) by one thread,
// so no atomics are needed where positions repeat a token; the kTokenGroups groups put C * 64 threads to
// work instead of C (GPT-2: 49k, not 768 threads that would each make 8192 dependent read-modify-writes).
constexpr int kTokenGroups = 64;
__global__ void embedding_backward_wte_k(float* dwte, const float* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  const unsigned g = blockIdx.y;
  DL_GRID_LOOP(c, C)
  for (int64_t bt = 0; bt < BT; bt++) {
    const int32_t tok = tokens[bt];
    if (tok >= 0 && unsigned(tok) % kTokenGroups == g) dwte[int64_t(tok) * C + c] += dout[bt * C + c];
  }
}
// dwpe: one thread per (t, channel), the batch in order
__global__ void embedding_backward_wpe_k(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  DL_GRID_LOOP(i, T * C) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; b++) acc += dout[b * T * C + i];
    dwpe[i] = acc;
  }
}

unsigned row_blocks(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void attention_forward(Runtime& rt, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "attention_forward", 4.0 * B * NH * T * T * hs + 5.0 * B * NH * T * T, 4.0 * (B * T * C3 + B * NH * T * T + B * T * C));
  const float scale = 1.0f / sqrtf(float(hs));
  for (int64_t b = 0; b < B; b++) {
    const float* q = qkv + b * T * C3;
    float* a = att + b * NH * T * T;
    // a (NH, T, T) = scale * q @ k^T, head by head in one call
    blas_f32_batched(rt, false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, 0.0f, a, T, T * T, NH);
    causal_softmax_k<<<row_blocks(NH * T), kThreads, 0, stream(rt)>>>(a, NH * T, T);
    DL_CUDA_LAUNCHED("attention_forward softmax");
    // out (T, hs) slice of each head = a @ v
    blas_f32_batched(rt, false, false, T, hs, T, 1.0f, a, T, T * T, q + 2 * C, C3, hs, 0.0f, out + b * T * C, C, hs, NH);
  }
}

void attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                        int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "attention_backward", 8.0 * B * NH * T * T * hs + 4.0 * B * NH * T * T,
             4.0 * (2 * B * T * C3 + 2 * B * NH * T * T + B * T * C));
  Scratch datt(rt, NH * T * T, "attention backward workspace");
  const float scale = 1.0f / sqrtf(float(hs));
  for (int64_t b = 0; b < B; b++) {
    const float* q = qkv + b * T * C3;
    const float* a = att + b * NH * T * T;
    const float* dy = dout + b * T * C;
    float* dq = dqkv + b * T * C3;
    // datt (T, T) = dy @ v^T ; dv (T, hs) = a^T @ dy
    blas_f32_batched(rt, false, true, T, T, hs, 1.0f, dy, C, hs, q + 2 * C, C3, hs, 0.0f, datt.p, T, T * T, NH);
    blas_f32_batched(rt, true, false, T, hs, T, 1.0f, a, T, T * T, dy, C, hs, 0.0f, dq + 2 * C, C3, hs, NH);
    causal_softmax_backward_k<<<row_blocks(NH * T), kThreads, 0, stream(rt)>>>(datt.p, a, NH * T, T);
    DL_CUDA_LAUNCHED("attention_backward softmax");
    // dq = scale * dpre @ k ; dk = scale * dpre^T @ q
    blas_f32_batched(rt, false, false, T, hs, T, scale, datt.p, T, T * T, q + C, C3, hs, 0.0f, dq, C3, hs, NH);
    blas_f32_batched(rt, true, false, T, hs, T, scale, datt.p, T, T * T, q, C3, hs, 0.0f, dq + C, C3, hs, NH);
  }
}

void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C) {
  OpScope op(rt, "embedding_forward", double(B * T * C), 4.0 * 3 * B * T * C);
  embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, stream(rt)>>>(out, tokens, wte, wpe, B * T, T, C);
  DL_CUDA_LAUNCHED("embedding_forward");
}

void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C) {
  OpScope op(rt, "embedding_backward", 2.0 * B * T * C, 4.0 * 3 * B * T * C);
  embedding_backward_wte_k<<<dim3(blocks_for(C, 64), kTokenGroups), 64, 0, stream(rt)>>>(dwte, dout, tokens, B * T, C);
  DL_CUDA_LAUNCHED("embedding_backward wte");
  if (dwpe) {
    embedding_backward_wpe_k<<<blocks_for(T * C), kThreads, 0, stream(rt)>>>(dwpe, dout, B, T, C);
    DL_CUDA_LAUNCHED("embedding_backward wpe");
  }
}

}  // namespace distlab::cuda
