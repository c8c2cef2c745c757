// Causal self-attention and the embedding lookup on the GPU, as core/ops/cpu/attention.cpp: per batch
// element, the heads' products are one strided-batched cuBLAS call (head h's q, k, v sit h*hs columns into
// qkv, whose rows are 3C long), and the causal softmax is one warp per row.
// Backward keeps a datt workspace for all heads of one batch element at a time (NH x T x T), where the cpu
// keeps one head's (T x T): the memory report of a cuda run counts that difference under `other`.
#include "core/ops/cpu/attention.h"  // flash_attention_flops: what every device's trace records
#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

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

// E: the tables' and the output's type (f32, or bf16/f16: the f32 sum of the exact values, rounded once)
template <class E>
__global__ void embedding_forward_k(E* out, const int32_t* tokens, const E* wte, const E* wpe, int64_t BT, int64_t T, int64_t C) {
  DL_GRID_LOOP(i, BT * C) {
    const int64_t bt = i / C, c = i % C;
    const int32_t tok = tokens[bt];  // -1: another tensor-parallel rank's row (zeros here)
    out[i] = narrow<E>(tok < 0 ? 0.0f : wide(wte[int64_t(tok) * C + c]) + (wpe ? wide(wpe[(bt % T) * C + c]) : 0.0f));
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

// ---- FlashAttention-2, the readable version: CUDA cores, one warp per row, tiles in shared memory ----
// A block holds kFlashRows rows (one warp each); a tile of 32 keys (or queries) sits in shared memory, one
// per lane, rows padded to hs + 1 floats so that 32 lanes reading 32 rows at the same column hit 32 banks.
// Each lane keeps its slice of a row's output (or gradient) in registers: columns lane, lane + 32, ...
// Every sum runs in a fixed order, so a run repeats bit for bit; the backward does without FA-2's atomic
// adds into dq by computing dq in one kernel (per query row, over its keys) and dk, dv in another (per
// key, over its queries), each recomputing the probabilities from lse: the tiles' q kᵀ and dO vᵀ twice.
// The trace records FA-2's FLOPs (flash_attention_flops), the same on every device.
constexpr int kFlashRows = 8;
constexpr int kFlashMaxHs = 256;
constexpr int kFlashPerLane = kFlashMaxHs / 32;

__global__ void flash_forward_k(float* out, float* lse, const float* qkv, int64_t T, int64_t C, int64_t NH, int hs, float scale) {
  extern __shared__ float sm[];
  float* sq = sm;                        // (kFlashRows, hs): this block's queries
  float* sk = sq + kFlashRows * hs;      // (32, hs + 1): a tile of keys
  float* sv = sk + 32 * (hs + 1);        // (32, hs): their values
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const float* base = qkv + b * T * C3 + h * hs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = int64_t(blockIdx.y) * kFlashRows, t = r0 + warp;
  const int64_t last = min(T, r0 + kFlashRows) - 1;  // the block's last row: tiles up to it (the causal mask)
  for (int i = threadIdx.x; i < kFlashRows * hs; i += blockDim.x) {
    const int64_t row = r0 + i / hs;
    sq[i] = row < T ? base[row * C3 + i % hs] : 0.0f;
  }
  float o[kFlashPerLane];
  for (int i = 0; i < kFlashPerLane; i++) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 <= last; j0 += 32) {
    __syncthreads();  // the previous tile is read by every warp
    for (int i = threadIdx.x; i < 32 * hs; i += blockDim.x) {
      const int64_t key = j0 + i / hs;
      const int d = i % hs;
      sk[(i / hs) * (hs + 1) + d] = key < T ? base[key * C3 + C + d] : 0.0f;
      sv[i] = key < T ? base[key * C3 + 2 * C + d] : 0.0f;
    }
    __syncthreads();
    if (t >= T) continue;  // the whole warp: a row past the end
    const int64_t key = j0 + lane;
    float s = -INFINITY;
    if (key <= t) {
      const float* qr = sq + warp * hs;
      const float* kr = sk + lane * (hs + 1);
      float dot = 0.0f;
      for (int d = 0; d < hs; d++) dot += qr[d] * kr[d];
      s = dot * scale;
    }
    const float mx = fmaxf(m, warp_max(s));  // finite: key j0 <= t in every tile this block walks
    const float alpha = expf(m - mx);        // 0 on the first tile (m = -inf)
    const float p = key <= t ? expf(s - mx) : 0.0f;
    l = l * alpha + warp_sum(p);
    for (int i = 0; i < kFlashPerLane; i++) o[i] *= alpha;
    for (int j = 0; j < 32; j++) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      for (int i = 0; i < kFlashPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hs) o[i] += pj * sv[j * hs + d];
      }
    }
    m = mx;
  }
  if (t >= T) return;
  float* orow = out + (b * T + t) * C + h * hs;
  for (int i = 0; i < kFlashPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hs) orow[d] = o[i] / l;
  }
  if (lane == 0) lse[bh * T + t] = m + logf(l);
}

// dq per query row (and D = rowsum(dO ∘ O), which the dk/dv kernel reads), over the keys up to the row
__global__ void flash_backward_dq_k(float* dqkv, float* Dsum, const float* dout, const float* qkv, const float* out, const float* lse,
                                    int64_t T, int64_t C, int64_t NH, int hs, float scale) {
  extern __shared__ float sm[];
  float* sq = sm;                        // (kFlashRows, hs)
  float* sdo = sq + kFlashRows * hs;     // (kFlashRows, hs)
  float* sk = sdo + kFlashRows * hs;     // (32, hs + 1)
  float* sv = sk + 32 * (hs + 1);        // (32, hs + 1)
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const float* base = qkv + b * T * C3 + h * hs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = int64_t(blockIdx.y) * kFlashRows, t = r0 + warp;
  const int64_t last = min(T, r0 + kFlashRows) - 1;
  for (int i = threadIdx.x; i < kFlashRows * hs; i += blockDim.x) {
    const int64_t row = r0 + i / hs;
    sq[i] = row < T ? base[row * C3 + i % hs] : 0.0f;
    sdo[i] = row < T ? dout[(b * T + row) * C + h * hs + i % hs] : 0.0f;
  }
  __syncthreads();
  float D = 0.0f, L = 0.0f;
  if (t < T) {
    const float* orow = out + (b * T + t) * C + h * hs;
    float part = 0.0f;
    for (int d = lane; d < hs; d += 32) part += sdo[warp * hs + d] * orow[d];
    D = warp_sum(part);
    if (lane == 0) Dsum[bh * T + t] = D;
    L = lse[bh * T + t];
  }
  float dq[kFlashPerLane];
  for (int i = 0; i < kFlashPerLane; i++) dq[i] = 0.0f;
  for (int64_t j0 = 0; j0 <= last; j0 += 32) {
    __syncthreads();
    for (int i = threadIdx.x; i < 32 * hs; i += blockDim.x) {
      const int64_t key = j0 + i / hs;
      const int at = (i / hs) * (hs + 1) + i % hs;
      sk[at] = key < T ? base[key * C3 + C + i % hs] : 0.0f;
      sv[at] = key < T ? base[key * C3 + 2 * C + i % hs] : 0.0f;
    }
    __syncthreads();
    if (t >= T) continue;
    const int64_t key = j0 + lane;
    float ds = 0.0f;
    if (key <= t) {
      const float* kr = sk + lane * (hs + 1);
      const float* vr = sv + lane * (hs + 1);
      float qk = 0.0f, dv = 0.0f;
      for (int d = 0; d < hs; d++) {
        qk += sq[warp * hs + d] * kr[d];
        dv += sdo[warp * hs + d] * vr[d];
      }
      const float p = expf(qk * scale - L);
      ds = p * (dv - D);
    }
    for (int j = 0; j < 32; j++) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      for (int i = 0; i < kFlashPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hs) dq[i] += dsj * sk[j * (hs + 1) + d];
      }
    }
  }
  if (t >= T) return;
  float* dqrow = dqkv + (b * T + t) * C3 + h * hs;
  for (int i = 0; i < kFlashPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hs) dqrow[d] = dq[i] * scale;
  }
}

// dk and dv per key (one warp each), over the queries from the key on
__global__ void flash_backward_dkv_k(float* dqkv, const float* Dsum, const float* dout, const float* qkv, const float* lse, int64_t T,
                                     int64_t C, int64_t NH, int hs, float scale) {
  extern __shared__ float sm[];
  float* sk = sm;                        // (kFlashRows, hs): this block's keys
  float* sv = sk + kFlashRows * hs;      // (kFlashRows, hs)
  float* sq = sv + kFlashRows * hs;      // (32, hs + 1): a tile of queries
  float* sdo = sq + 32 * (hs + 1);       // (32, hs + 1): their output gradients
  float* sl = sdo + 32 * (hs + 1);       // (32): their lse
  float* sd = sl + 32;                   // (32): their D
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const float* base = qkv + b * T * C3 + h * hs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k0 = int64_t(blockIdx.y) * kFlashRows, key = k0 + warp;
  for (int i = threadIdx.x; i < kFlashRows * hs; i += blockDim.x) {
    const int64_t row = k0 + i / hs;
    sk[i] = row < T ? base[row * C3 + C + i % hs] : 0.0f;
    sv[i] = row < T ? base[row * C3 + 2 * C + i % hs] : 0.0f;
  }
  float dk[kFlashPerLane], dv[kFlashPerLane];
  for (int i = 0; i < kFlashPerLane; i++) dk[i] = dv[i] = 0.0f;
  for (int64_t i0 = k0 - k0 % 32; i0 < T; i0 += 32) {  // query tiles from the one holding the block's first key
    __syncthreads();
    for (int i = threadIdx.x; i < 32 * hs; i += blockDim.x) {
      const int64_t row = i0 + i / hs;
      const int at = (i / hs) * (hs + 1) + i % hs;
      sq[at] = row < T ? base[row * C3 + i % hs] : 0.0f;
      sdo[at] = row < T ? dout[(b * T + row) * C + h * hs + i % hs] : 0.0f;
    }
    if (threadIdx.x < 32) {
      const int64_t row = i0 + threadIdx.x;
      sl[threadIdx.x] = row < T ? lse[bh * T + row] : 0.0f;
      sd[threadIdx.x] = row < T ? Dsum[bh * T + row] : 0.0f;
    }
    __syncthreads();
    if (key >= T) continue;
    const int64_t t = i0 + lane;
    float p = 0.0f, ds = 0.0f;
    if (t < T && t >= key) {
      const float* qr = sq + lane * (hs + 1);
      const float* gr = sdo + lane * (hs + 1);
      float qk = 0.0f, dpv = 0.0f;
      for (int d = 0; d < hs; d++) {
        qk += qr[d] * sk[warp * hs + d];
        dpv += gr[d] * sv[warp * hs + d];
      }
      p = expf(qk * scale - sl[lane]);
      ds = p * (dpv - sd[lane]);
    }
    for (int j = 0; j < 32; j++) {
      const float pj = __shfl_sync(0xffffffffu, p, j), dsj = __shfl_sync(0xffffffffu, ds, j);
      for (int i = 0; i < kFlashPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hs) {
          dv[i] += pj * sdo[j * (hs + 1) + d];
          dk[i] += dsj * sq[j * (hs + 1) + d];
        }
      }
    }
  }
  if (key >= T) return;
  float* row = dqkv + (b * T + key) * C3 + h * hs;
  for (int i = 0; i < kFlashPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hs) {
      row[C + d] = dk[i] * scale;
      row[2 * C + d] = dv[i];
    }
  }
}

// Shared memory past the 48 KiB a launch gets by default must be asked for (A100: up to 163 KiB, H100: 227)
template <class K>
void allow_shared(K kernel, size_t bytes, const char* name) {
  if (bytes <= 48 * 1024) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw ShapeError(std::string(name) + ": the head size needs " + std::to_string(bytes / 1024) + " KiB of shared memory a block, more than this GPU gives",
                     "use model.attention = \"naive\" on this GPU, or a smaller head size (n_embd / n_head)");
  }
}

void require_head(int64_t hs, const char* name) {
  if (hs > kFlashMaxHs)
    throw ShapeError(std::string(name) + ": head size " + std::to_string(hs) + " is over the CUDA kernel's " + std::to_string(kFlashMaxHs),
                     "use model.attention = \"naive\", or more heads (n_embd / n_head <= 256)");
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

void flash_attention_forward(Runtime& rt, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "flash_attention_forward", distlab::flash_attention_flops(B, T, C, NH, false), 4.0 * (B * T * C3 + B * T * C + B * NH * T));
  op.attention(B * NH, T, hs);
  if (flash_tensor_cores(rt, hs)) return flash_tc_forward(rt, out, lse, qkv, false, B, T, C, NH);  // attention_tc.cu
  require_head(hs, "flash_attention_forward");
  const size_t smem = sizeof(float) * size_t(kFlashRows * hs + 32 * (hs + 1) + 32 * hs);
  allow_shared(flash_forward_k, smem, "flash_attention_forward");
  const dim3 grid(unsigned(B * NH), unsigned((T + kFlashRows - 1) / kFlashRows));
  flash_forward_k<<<grid, kFlashRows * 32, smem, stream(rt)>>>(out, lse, qkv, T, C, NH, int(hs), 1.0f / sqrtf(float(hs)));
  DL_CUDA_LAUNCHED("flash_attention_forward");
}

void flash_attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int64_t B,
                              int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  OpScope op(rt, "flash_attention_backward", distlab::flash_attention_flops(B, T, C, NH, true),
             4.0 * (2 * B * T * C3 + 2 * B * T * C + B * NH * T));
  op.attention(B * NH, T, hs);
  if (flash_tensor_cores(rt, hs)) return flash_tc_backward(rt, dqkv, dout, qkv, out, lse, false, B, T, C, NH);
  require_head(hs, "flash_attention_backward");
  Scratch D(rt, B * NH * T, "flash attention backward's rowsum(dO * O)");
  const float scale = 1.0f / sqrtf(float(hs));
  const dim3 grid(unsigned(B * NH), unsigned((T + kFlashRows - 1) / kFlashRows));
  const size_t smem_q = sizeof(float) * size_t(2 * kFlashRows * hs + 2 * 32 * (hs + 1));
  allow_shared(flash_backward_dq_k, smem_q, "flash_attention_backward");
  flash_backward_dq_k<<<grid, kFlashRows * 32, smem_q, stream(rt)>>>(dqkv, D.p, dout, qkv, out, lse, T, C, NH, int(hs), scale);
  DL_CUDA_LAUNCHED("flash_attention_backward (dq)");
  const size_t smem_kv = sizeof(float) * size_t(2 * kFlashRows * hs + 2 * 32 * (hs + 1) + 64);
  allow_shared(flash_backward_dkv_k, smem_kv, "flash_attention_backward");
  flash_backward_dkv_k<<<grid, kFlashRows * 32, smem_kv, stream(rt)>>>(dqkv, D.p, dout, qkv, lse, T, C, NH, int(hs), scale);
  DL_CUDA_LAUNCHED("flash_attention_backward (dk, dv)");
}

// The 16-bit forms. Where t is the rank's 16-bit GEMM math (a 16-bit run's rt.dtype) and the head size one the
// tensor cores take, the
// tensor-core kernels read qkv, out and dout and write out and dqkv in 16 bits: the same sums as on f32
// copies (a tile's operands are rounded to 16 bits either way, D is summed in f32 from the same values), each
// result rounded once, where the f32 way widened qkv (3 bytes in 2 more written and 4 read) and rounded an
// f32 out (4 written, 4 read, 2 written again). Elsewhere: that f32 way, the f32 kernels between copies.
namespace {
bool tensor_core_tensors(Runtime& rt, DType t, int64_t hs, const char* name) {
  require_16bit(t, name);
  return gemm_math(rt) == (t == DType::bf16 ? GemmMath::bf16 : GemmMath::f16) && flash_tensor_cores(rt, hs);
}
}  // namespace

void flash_attention_forward_16(Runtime& rt, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  if (tensor_core_tensors(rt, t, hs, "flash_attention_forward_16")) {
    OpScope op(rt, "flash_attention_forward", distlab::flash_attention_flops(B, T, C, NH, false),
               4.0 * (B * T * C3 + B * T * C + B * NH * T));  // flash_attention_forward's event
    op.attention(B * NH, T, hs);
    return flash_tc_forward(rt, out, lse, qkv, true, B, T, C, NH);
  }
  F32 q32(rt, qkv, t, B * T * C3), y32(rt, nullptr, t, B * T * C);
  cuda::flash_attention_forward(rt, y32.p, lse, q32.p, B, T, C, NH);
  if (B * T * C > 0) convert_on(stream(rt), y32.p, DType::f32, out, t, B * T * C);
}

void flash_attention_backward_16(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                 DType t, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  if (tensor_core_tensors(rt, t, hs, "flash_attention_backward_16")) {
    OpScope op(rt, "flash_attention_backward", distlab::flash_attention_flops(B, T, C, NH, true),
               4.0 * (2 * B * T * C3 + 2 * B * T * C + B * NH * T));  // flash_attention_backward's event
    op.attention(B * NH, T, hs);
    return flash_tc_backward(rt, dqkv, dout, qkv, out, lse, true, B, T, C, NH);
  }
  F32 dq32(rt, nullptr, t, B * T * C3), dy32(rt, dout, t, B * T * C), q32(rt, qkv, t, B * T * C3), y32(rt, out, t, B * T * C);
  cuda::flash_attention_backward(rt, dq32.p, dy32.p, q32.p, y32.p, lse, B, T, C, NH);
  if (B * T * C3 > 0) convert_on(stream(rt), dq32.p, DType::f32, dqkv, t, B * T * C3);
}

void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                       int64_t C) {
  OpScope op(rt, "embedding_forward", double(B * T * C), 4.0 * 3 * B * T * C);
  embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, stream(rt)>>>(out, tokens, wte, wpe, B * T, T, C);
  DL_CUDA_LAUNCHED("embedding_forward");
}

void embedding_forward_16(Runtime& rt, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                          int64_t C) {
  require_16bit(t, "embedding_forward_16");
  OpScope op(rt, "embedding_forward", double(B * T * C), 4.0 * 3 * B * T * C);  // embedding_forward's event
  with_16bit_type(t, [&](auto z) {
    using E = decltype(z);
    embedding_forward_k<<<blocks_for(B * T * C), kThreads, 0, stream(rt)>>>(static_cast<E*>(out), tokens, static_cast<const E*>(wte),
                                                                            static_cast<const E*>(wpe), B * T, T, C);
  });
  DL_CUDA_LAUNCHED("embedding_forward_16");
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
