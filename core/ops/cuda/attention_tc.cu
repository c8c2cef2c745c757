// FlashAttention-2 on tensor cores: the algorithm of attention.cu's readable flash kernels, with the four
// products of a tile (S = Q Kᵀ, O += P V, and in the backward dP = dO Vᵀ, dQ += dS K, dK += dSᵀ Q,
// dV += Pᵀ dO) on WMMA's 16x16x16 tiles: 16-bit inputs (bf16, or fp16), f32 sums. It runs where a run's
// GEMMs are 16-bit (gemm_math bf16/f16: autocast's matmuls, which attention is one of), on sm 80 and later
// (bf16 tensor cores; the shared memory below), for head sizes 32, 64, 96 and 128 (GPT-2's 64, LLaMA's 128);
// elsewhere attention.cu's f32 kernels run. Read attention.cu's kernels first: this file is them, tiled.
//
// A block is 4 warps and 64 rows (queries in the forward and dq, keys in dk/dv), warp w owning 16 of them;
// key (or query) tiles of 64 go through shared memory in 16 bits, rows padded by 8 elements (16 bytes) so
// that WMMA's loads spread over the banks. What WMMA's accumulators hide (which lane holds which element)
// the softmax needs, so each warp stores its 16 x 64 scores to shared memory as f32, and its lanes own
// fixed places: row r, columns lane + 32 c. The forward's O lives in registers in those places (it is
// rescaled by each row's running max), the backward's dQ, dK, dV in WMMA accumulators (nothing rescales
// them). P and dS are rounded to 16 bits before their products, as FlashAttention-2 does.
// As attention.cu, the backward is two kernels without atomics (dq per query block, dk/dv per key block),
// each recomputing P from lse: every sum in a fixed order, the same bits on every run.
// The kernels take f32 tensors (rounded to the 16-bit type as a tile is loaded, results stored in f32) or the
// 16-bit type's own (a 16-bit run's qkv, out, dout and dqkv: flash_attention_*_16), every sum the same.
// Causal blocks skipped: a query block walks the key tiles up to its own (64 = 64, so its last tile is the
// diagonal one), a key block the query tiles from its own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcRows = 64;  // a block's rows, and a tile's
constexpr int kTcWarps = kTcRows / 16;
constexpr int kTcThreads = kTcWarps * 32;

// The inputs and outputs (E: f32, or the 16-bit type itself) are read with wide() and written with
// narrow<E>() (dtype16.cuh); to16 rounds a tile's operand to the tensor cores' type.
template <class T16> __device__ inline T16 to16(float x) { return narrow<T16>(x); }

// The sizes of one kernel's shared memory, in elements (Ld16: a 16-bit tile's row; LdF: an f32 tile's row,
// wide enough for 16 x 64 scores or a 16 x HS result).
template <int HS>
struct TcShape {
  static constexpr int Ld16 = HS + 8;
  static constexpr int LdP = kTcRows + 8;
  static constexpr int LdF = (HS > kTcRows ? HS : kTcRows) + 4;
  static constexpr size_t tile16 = size_t(kTcRows) * Ld16 * 2;  // bytes of a 64-row 16-bit tile
  static constexpr size_t warpF = size_t(16) * LdF * 4;         // bytes of a warp's 16-row f32 tile
  static constexpr size_t warpP = size_t(16) * LdP * 2;         // bytes of a warp's 16 x 64 16-bit tile
};

// rows r0.. of one head's q, k or v (column offset `col` in qkv's rows of 3C) into a 64-row 16-bit tile;
// rows past T are zeros. E: the tensor's type (f32 is rounded here; a 16-bit value passes as it is)
template <class T16, int HS, class E>
__device__ inline void load_tile(T16* dst, const E* base, int64_t r0, int64_t T, int64_t ld) {
  for (int i = threadIdx.x; i < kTcRows * HS; i += kTcThreads) {
    const int row = i / HS, d = i % HS;
    dst[row * TcShape<HS>::Ld16 + d] = to16<T16>(r0 + row < T ? wide(base[(r0 + row) * ld + d]) : 0.0f);
  }
}

// out (16 x 64, f32, ld LdF) = A (16 x HS, 16-bit, row-major) @ B (64 x HS, row-major)ᵀ: Q Kᵀ, dO Vᵀ, K Qᵀ
template <class T16, int HS>
__device__ inline void product_abt(float* out, const T16* a, const T16* b) {
  constexpr int Ld = TcShape<HS>::Ld16;
#pragma unroll
  for (int n = 0; n < kTcRows / 16; n++) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < HS / 16; k++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T16, wmma::col_major> fb;  // Bᵀ: b's rows as columns
      wmma::load_matrix_sync(fa, a + k * 16, Ld);
      wmma::load_matrix_sync(fb, b + n * 16 * Ld + k * 16, Ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, TcShape<HS>::LdF, wmma::mem_row_major);
  }
}

// acc[n] += P (16 x 64, 16-bit, ld LdP) @ B (64 x HS, row-major): P V, dS K, Pᵀ dO, dSᵀ Q
template <class T16, int HS>
__device__ inline void product_pb(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16], const T16* p, const T16* b) {
  constexpr int Ld = TcShape<HS>::Ld16;
#pragma unroll
  for (int k = 0; k < kTcRows / 16; k++) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T16, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, p + k * 16, TcShape<HS>::LdP);
#pragma unroll
    for (int n = 0; n < HS / 16; n++) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T16, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + k * 16 * Ld + n * 16, Ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// a warp's 16 x HS accumulators, times `scale`, to rows row0.. of dst (ld elements apart; rows past T left)
template <int HS, class E>
__device__ inline void store_rows(E* dst, int64_t ld, wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16],
                                  float* stage, int64_t row0, int64_t T, float scale) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], TcShape<HS>::LdF, wmma::mem_row_major);
  __syncwarp();
  for (int r = 0; r < 16; r++) {
    if (row0 + r >= T) break;
    for (int d = lane; d < HS; d += 32) dst[(row0 + r) * ld + d] = narrow<E>(stage[r * TcShape<HS>::LdF + d] * scale);
  }
}

template <class T16, int HS, class E>
__global__ void __launch_bounds__(kTcThreads) flash_tc_forward_k(E* out, float* lse, const E* qkv, int64_t T, int64_t C,
                                                                 int64_t NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // the host never launches it below sm 80 (flash_tensor_cores)
#else
  using S = TcShape<HS>;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T16* sq = reinterpret_cast<T16*>(tc_smem);                              // (64, Ld16): this block's queries
  T16* sk = reinterpret_cast<T16*>(tc_smem + S::tile16);                  // (64, Ld16): a tile of keys
  T16* sv = reinterpret_cast<T16*>(tc_smem + 2 * S::tile16);              // (64, Ld16): their values
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sf = reinterpret_cast<float*>(tc_smem + 3 * S::tile16 + warp * S::warpF);          // (16, LdF): S, then P V
  T16* sp = reinterpret_cast<T16*>(tc_smem + 3 * S::tile16 + kTcWarps * S::warpF + warp * S::warpP);  // (16, LdP): P
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const E* base = qkv + b * T * C3 + h * HS;
  const int64_t r0 = int64_t(blockIdx.y) * kTcRows, row0 = r0 + warp * 16;
  const int64_t last = min(T, r0 + kTcRows) - 1;
  load_tile<T16, HS, E>(sq, base, r0, T, C3);
  constexpr int PerRow = HS / 32;  // the columns of a row a lane owns: lane + 32 c
  float o[16][PerRow], m[16], l[16];
#pragma unroll
  for (int r = 0; r < 16; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < PerRow; c++) o[r][c] = 0.0f;
  }
  for (int64_t j0 = 0; j0 <= last; j0 += kTcRows) {
    __syncthreads();  // every warp is done with the previous tile
    load_tile<T16, HS, E>(sk, base + C, j0, T, C3);
    load_tile<T16, HS, E>(sv, base + 2 * C, j0, T, C3);
    __syncthreads();
    product_abt<T16, HS>(sf, sq + warp * 16 * S::Ld16, sk);  // S (16 x 64) = Q_w Kᵀ
    __syncwarp();
    float alpha[16];
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int64_t t = row0 + r;
      float s[2];
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int64_t key = j0 + lane + 32 * c;
        s[c] = key <= t && key < T ? sf[r * S::LdF + lane + 32 * c] * scale : -INFINITY;
      }
      // finite: the first tile holds key 0, which every row sees (rows past T see every key < T)
      const float mx = fmaxf(m[r], warp_max(fmaxf(s[0], s[1])));
      alpha[r] = expf(m[r] - mx);  // 0 on the first tile
      const float p0 = expf(s[0] - mx), p1 = expf(s[1] - mx);  // exp(-inf) = 0: the masked keys
      l[r] = l[r] * alpha[r] + warp_sum(p0 + p1);
      m[r] = mx;
      sp[r * S::LdP + lane] = to16<T16>(p0);
      sp[r * S::LdP + lane + 32] = to16<T16>(p1);
    }
    __syncwarp();  // P written, S read: sf takes P V next
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> pv[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(pv[n], 0.0f);
    product_pb<T16, HS>(pv, sp, sv);  // P V (16 x HS)
#pragma unroll
    for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(sf + n * 16, pv[n], S::LdF, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++)
#pragma unroll
      for (int c = 0; c < PerRow; c++) o[r][c] = o[r][c] * alpha[r] + sf[r * S::LdF + lane + 32 * c];
    __syncwarp();  // sf is read: the next tile's scores may overwrite it
  }
#pragma unroll
  for (int r = 0; r < 16; r++) {
    const int64_t t = row0 + r;
    if (t >= T) break;
    E* orow = out + (b * T + t) * C + h * HS;
#pragma unroll
    for (int c = 0; c < PerRow; c++) orow[lane + 32 * c] = narrow<E>(o[r][c] / l[r]);
    if (lane == 0) lse[bh * T + t] = m[r] + logf(l[r]);
  }
#endif
}

// dq per query block, and D = rowsum(dO ∘ O) (in f32, from dO and O as they are), which the dk/dv kernel reads
template <class T16, int HS, class E>
__global__ void __launch_bounds__(kTcThreads) flash_tc_backward_dq_k(E* dqkv, float* Dsum, const E* dout, const E* qkv,
                                                                     const E* out, const float* lse, int64_t T, int64_t C,
                                                                     int64_t NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using S = TcShape<HS>;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T16* sq = reinterpret_cast<T16*>(tc_smem);                  // (64, Ld16): this block's queries
  T16* sdo = reinterpret_cast<T16*>(tc_smem + S::tile16);     // (64, Ld16): their output gradients
  T16* sk = reinterpret_cast<T16*>(tc_smem + 2 * S::tile16);  // (64, Ld16): a tile of keys
  T16* sv = reinterpret_cast<T16*>(tc_smem + 3 * S::tile16);  // (64, Ld16): their values
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sl = reinterpret_cast<float*>(tc_smem + 4 * S::tile16);  // (64): the block's lse
  float* sd = sl + kTcRows;                                       // (64): its D
  unsigned char* mine = tc_smem + 4 * S::tile16 + 2 * kTcRows * sizeof(float) + warp * (2 * S::warpF + S::warpP);
  float* ss = reinterpret_cast<float*>(mine);                 // (16, LdF): S, at the end dQ's staging
  float* sdp = reinterpret_cast<float*>(mine + S::warpF);     // (16, LdF): dP
  T16* sds = reinterpret_cast<T16*>(mine + 2 * S::warpF);     // (16, LdP): dS
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const E* base = qkv + b * T * C3 + h * HS;
  const E* gbase = dout + b * T * C + h * HS;
  const int64_t r0 = int64_t(blockIdx.y) * kTcRows, row0 = r0 + warp * 16;
  const int64_t last = min(T, r0 + kTcRows) - 1;
  load_tile<T16, HS, E>(sq, base, r0, T, C3);
  load_tile<T16, HS, E>(sdo, gbase, r0, T, C);
  for (int r = 0; r < 16; r++) {  // each warp its rows' D and lse (the loop's first barrier publishes them)
    const int64_t t = row0 + r;
    float part = 0.0f;
    if (t < T)
      for (int d = lane; d < HS; d += 32) part += wide(gbase[t * C + d]) * wide(out[(b * T + t) * C + h * HS + d]);
    part = warp_sum(part);
    if (lane == 0) {
      sd[warp * 16 + r] = part;
      sl[warp * 16 + r] = t < T ? lse[bh * T + t] : 0.0f;
      if (t < T) Dsum[bh * T + t] = part;
    }
  }
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
  for (int64_t j0 = 0; j0 <= last; j0 += kTcRows) {
    __syncthreads();
    load_tile<T16, HS, E>(sk, base + C, j0, T, C3);
    load_tile<T16, HS, E>(sv, base + 2 * C, j0, T, C3);
    __syncthreads();
    product_abt<T16, HS>(ss, sq + warp * 16 * S::Ld16, sk);   // S = Q_w Kᵀ
    product_abt<T16, HS>(sdp, sdo + warp * 16 * S::Ld16, sv);  // dP = dO_w Vᵀ
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int64_t t = row0 + r;
      const float L = sl[warp * 16 + r], D = sd[warp * 16 + r];
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int col = lane + 32 * c;
        const int64_t key = j0 + col;
        const float p = key <= t && key < T && t < T ? expf(ss[r * S::LdF + col] * scale - L) : 0.0f;
        sds[r * S::LdP + col] = to16<T16>(p * (sdp[r * S::LdF + col] - D));
      }
    }
    __syncwarp();
    product_pb<T16, HS>(dq, sds, sk);  // dQ_w += dS K
  }
  store_rows<HS>(dqkv + b * T * C3 + h * HS, C3, dq, ss, row0, T, scale);
#endif
}

// dk and dv per key block, over the query tiles from the block's own
template <class T16, int HS, class E>
__global__ void __launch_bounds__(kTcThreads) flash_tc_backward_dkv_k(E* dqkv, const float* Dsum, const E* dout, const E* qkv,
                                                                      const float* lse, int64_t T, int64_t C, int64_t NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using S = TcShape<HS>;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T16* sk = reinterpret_cast<T16*>(tc_smem);                  // (64, Ld16): this block's keys
  T16* sv = reinterpret_cast<T16*>(tc_smem + S::tile16);      // (64, Ld16): their values
  T16* sq = reinterpret_cast<T16*>(tc_smem + 2 * S::tile16);  // (64, Ld16): a tile of queries
  T16* sdo = reinterpret_cast<T16*>(tc_smem + 3 * S::tile16); // (64, Ld16): their output gradients
  float* sl = reinterpret_cast<float*>(tc_smem + 4 * S::tile16);  // (64): their lse
  float* sd = sl + kTcRows;                                       // (64): their D
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = tc_smem + 4 * S::tile16 + 2 * kTcRows * sizeof(float) + warp * (2 * S::warpF + 2 * S::warpP);
  float* sst = reinterpret_cast<float*>(mine);                    // (16, LdF): Sᵀ, at the end the staging
  float* sdpt = reinterpret_cast<float*>(mine + S::warpF);        // (16, LdF): dPᵀ
  T16* spt = reinterpret_cast<T16*>(mine + 2 * S::warpF);         // (16, LdP): Pᵀ
  T16* sdst = reinterpret_cast<T16*>(mine + 2 * S::warpF + S::warpP);  // (16, LdP): dSᵀ
  const int64_t bh = blockIdx.x, b = bh / NH, h = bh % NH, C3 = 3 * C;
  const E* base = qkv + b * T * C3 + h * HS;
  const E* gbase = dout + b * T * C + h * HS;
  const int64_t k0 = int64_t(blockIdx.y) * kTcRows, key0 = k0 + warp * 16;
  load_tile<T16, HS, E>(sk, base + C, k0, T, C3);
  load_tile<T16, HS, E>(sv, base + 2 * C, k0, T, C3);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int64_t i0 = k0; i0 < T; i0 += kTcRows) {  // the query tiles from the one holding the block's first key
    __syncthreads();
    load_tile<T16, HS, E>(sq, base, i0, T, C3);
    load_tile<T16, HS, E>(sdo, gbase, i0, T, C);
    for (int i = threadIdx.x; i < kTcRows; i += kTcThreads) {
      sl[i] = i0 + i < T ? lse[bh * T + i0 + i] : 0.0f;
      sd[i] = i0 + i < T ? Dsum[bh * T + i0 + i] : 0.0f;
    }
    __syncthreads();
    product_abt<T16, HS>(sst, sk + warp * 16 * S::Ld16, sq);    // Sᵀ (16 keys x 64 queries) = K_w Qᵀ
    product_abt<T16, HS>(sdpt, sv + warp * 16 * S::Ld16, sdo);  // dPᵀ = V_w dOᵀ
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int64_t key = key0 + r;
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int col = lane + 32 * c;
        const int64_t t = i0 + col;
        const float p = t >= key && t < T && key < T ? expf(sst[r * S::LdF + col] * scale - sl[col]) : 0.0f;
        spt[r * S::LdP + col] = to16<T16>(p);
        sdst[r * S::LdP + col] = to16<T16>(p * (sdpt[r * S::LdF + col] - sd[col]));
      }
    }
    __syncwarp();
    product_pb<T16, HS>(dv, spt, sdo);  // dV_w += Pᵀ dO
    product_pb<T16, HS>(dk, sdst, sq);  // dK_w += dSᵀ Q
  }
  __syncwarp();
  E* drow = dqkv + b * T * C3 + h * HS;
  store_rows<HS>(drow + C, C3, dk, sst, key0, T, scale);
  __syncwarp();
  store_rows<HS>(drow + 2 * C, C3, dv, sst, key0, T, 1.0f);
#endif
}

size_t forward_smem(int hs) {
  auto f = [](auto s) { return 3 * s.tile16 + kTcWarps * (s.warpF + s.warpP); };
  return hs == 32 ? f(TcShape<32>{}) : hs == 64 ? f(TcShape<64>{}) : hs == 96 ? f(TcShape<96>{}) : f(TcShape<128>{});
}
size_t dq_smem(int hs) {
  auto f = [](auto s) { return 4 * s.tile16 + 2 * kTcRows * sizeof(float) + kTcWarps * (2 * s.warpF + s.warpP); };
  return hs == 32 ? f(TcShape<32>{}) : hs == 64 ? f(TcShape<64>{}) : hs == 96 ? f(TcShape<96>{}) : f(TcShape<128>{});
}
size_t dkv_smem(int hs) {
  auto f = [](auto s) { return 4 * s.tile16 + 2 * kTcRows * sizeof(float) + kTcWarps * (2 * s.warpF + 2 * s.warpP); };
  return hs == 32 ? f(TcShape<32>{}) : hs == 64 ? f(TcShape<64>{}) : hs == 96 ? f(TcShape<96>{}) : f(TcShape<128>{});
}

// Opts a kernel in to `bytes` of shared memory (past the default 48 KiB); false where the GPU has less.
template <class K>
bool opt_in(K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess) return true;
  cudaGetLastError();  // clear it: not a failure of the run, only of this path
  return false;
}

template <class T16, int HS, class E>
void launch_forward(Runtime& rt, E* out, float* lse, const E* qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const size_t smem = forward_smem(HS);
  const dim3 grid(unsigned(B * NH), unsigned((T + kTcRows - 1) / kTcRows));
  flash_tc_forward_k<T16, HS, E><<<grid, kTcThreads, smem, stream(rt)>>>(out, lse, qkv, T, C, NH, 1.0f / sqrtf(float(HS)));
  DL_CUDA_LAUNCHED("flash_attention_forward (tensor cores)");
}

template <class T16, int HS, class E>
void launch_backward(Runtime& rt, E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse, int64_t B, int64_t T,
                     int64_t C, int64_t NH) {
  Scratch D(rt, B * NH * T, "flash attention backward's rowsum(dO * O)");
  const float scale = 1.0f / sqrtf(float(HS));
  const dim3 grid(unsigned(B * NH), unsigned((T + kTcRows - 1) / kTcRows));
  flash_tc_backward_dq_k<T16, HS, E><<<grid, kTcThreads, dq_smem(HS), stream(rt)>>>(dqkv, D.p, dout, qkv, out, lse, T, C, NH, scale);
  DL_CUDA_LAUNCHED("flash_attention_backward (tensor cores, dq)");
  flash_tc_backward_dkv_k<T16, HS, E><<<grid, kTcThreads, dkv_smem(HS), stream(rt)>>>(dqkv, D.p, dout, qkv, lse, T, C, NH, scale);
  DL_CUDA_LAUNCHED("flash_attention_backward (tensor cores, dk dv)");
}

// One switch from the run's (16-bit type, head size) to the template: `body` is called with a T16 and an
// HS value (std::integral_constant), as [&](auto t16, auto hs) { ... }.
template <class F>
void dispatch(bool bf16, int64_t hs, F&& body) {
  auto with = [&](auto t16) {
    switch (hs) {
      case 32: body(t16, std::integral_constant<int, 32>{}); break;
      case 64: body(t16, std::integral_constant<int, 64>{}); break;
      case 96: body(t16, std::integral_constant<int, 96>{}); break;
      default: body(t16, std::integral_constant<int, 128>{}); break;
    }
  };
  if (bf16) with(__nv_bfloat16{});
  else with(__half{});
}

}  // namespace

bool flash_tensor_cores(Runtime& rt, int64_t hs) {
  const GemmMath math = gemm_math(rt);
  if (math != GemmMath::bf16 && math != GemmMath::f16) return false;
  if (hs != 32 && hs != 64 && hs != 96 && hs != 128) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx(rt).device()) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major < 8) return false;
  bool fits = true;
  dispatch(math == GemmMath::bf16, hs, [&](auto t16, auto h) {
    using T16 = decltype(t16);
    constexpr int HS = decltype(h)::value;
    // the code this GPU would run must be sm 80's or later: a build for sm 75 alone JIT-compiles its PTX, whose
    // bodies are __trap()
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, flash_tc_forward_k<T16, HS, float>) != cudaSuccess || a.binaryVersion < 80) {
      cudaGetLastError();
      fits = false;
      return;
    }
    // both forms: f32 tensors (an f32 caller's), and the 16-bit type's own (flash_attention_*_16)
    fits = opt_in(flash_tc_forward_k<T16, HS, float>, forward_smem(HS)) && opt_in(flash_tc_backward_dq_k<T16, HS, float>, dq_smem(HS)) &&
           opt_in(flash_tc_backward_dkv_k<T16, HS, float>, dkv_smem(HS)) && opt_in(flash_tc_forward_k<T16, HS, T16>, forward_smem(HS)) &&
           opt_in(flash_tc_backward_dq_k<T16, HS, T16>, dq_smem(HS)) && opt_in(flash_tc_backward_dkv_k<T16, HS, T16>, dkv_smem(HS));
  });
  return fits;
}

void flash_tc_forward(Runtime& rt, void* out, float* lse, const void* qkv, bool io16, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (B * NH * T == 0) return;  // an empty grid is a launch error
  dispatch(gemm_math(rt) == GemmMath::bf16, C / NH, [&](auto t16, auto h) {
    using T16 = decltype(t16);
    constexpr int HS = decltype(h)::value;
    if (io16) launch_forward<T16, HS>(rt, static_cast<T16*>(out), lse, static_cast<const T16*>(qkv), B, T, C, NH);
    else launch_forward<T16, HS>(rt, static_cast<float*>(out), lse, static_cast<const float*>(qkv), B, T, C, NH);
  });
}

void flash_tc_backward(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, bool io16,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (B * NH * T == 0) return;
  dispatch(gemm_math(rt) == GemmMath::bf16, C / NH, [&](auto t16, auto h) {
    using T16 = decltype(t16);
    constexpr int HS = decltype(h)::value;
    if (io16)
      launch_backward<T16, HS>(rt, static_cast<T16*>(dqkv), static_cast<const T16*>(dout), static_cast<const T16*>(qkv),
                               static_cast<const T16*>(out), lse, B, T, C, NH);
    else
      launch_backward<T16, HS>(rt, static_cast<float*>(dqkv), static_cast<const float*>(dout), static_cast<const float*>(qkv),
                               static_cast<const float*>(out), lse, B, T, C, NH);
  });
}

}  // namespace distlab::cuda
