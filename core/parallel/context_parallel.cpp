#include "core/parallel/context_parallel.h"

#include <cstring>

#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/pointwise.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

std::vector<int32_t> RingAttention::positions_of(int rank, int64_t T_local) const {
  const int n = cp_.size();
  DL_ASSERT(T_local % 2 == 0, "ring attention: a rank's tokens are two chunks of the same length");
  const int64_t c = T_local / 2;
  std::vector<int32_t> pos;
  pos.reserve(size_t(T_local));
  for (int64_t chunk : {int64_t(rank), int64_t(2 * n - 1 - rank)})
    for (int64_t t = chunk * c; t < (chunk + 1) * c; t++) pos.push_back(int32_t(t));
  return pos;
}

Batch context_shard(const Batch& whole, int n, int rank) {
  DL_ASSERT(whole.T % (2 * n) == 0, "context_shard: the sequence does not cut into 2·cp chunks");
  Batch b;
  b.B = whole.B;
  b.T = whole.T / n;
  const int64_t c = whole.T / (2 * n);
  for (const auto* from : {&whole.tokens, &whole.targets}) {
    auto& to = from == &whole.tokens ? b.tokens : b.targets;
    to.reserve(size_t(b.B * b.T));
    for (int64_t s = 0; s < whole.B; s++)
      for (int64_t chunk : {int64_t(rank), int64_t(2 * n - 1 - rank)})
        to.insert(to.end(), from->begin() + s * whole.T + chunk * c, from->begin() + s * whole.T + (chunk + 1) * c);
  }
  return b;
}

// A posted exchange: waited for before its buffers go, also when a block's math throws (the group's thread
// would otherwise still be writing into freed memory)
struct Posted {
  std::shared_ptr<Work> w;
  void wait() {
    auto x = std::move(w);
    if (x) x->wait();
  }
  ~Posted() {
    if (w) try {
        w->wait();
      } catch (...) {  // the error that is unwinding is the one to report
      }
  }
};

// The distinct kv heads of qkv's (B, Tl, 3C) row, side by side: kv head j is repeated head j·group
static void pack_kv(float* kv, const float* qkv, int64_t rows, int64_t C, int64_t hs, int64_t group, int64_t ld) {
  const int64_t KV = C / hs / group;
  for (int64_t row = 0; row < rows; row++)
    for (int64_t j = 0; j < KV; j++) {
      std::memcpy(kv + row * ld + j * hs, qkv + row * 3 * C + C + j * group * hs, sizeof(float) * size_t(hs));
      std::memcpy(kv + row * ld + KV * hs + j * hs, qkv + row * 3 * C + 2 * C + j * group * hs, sizeof(float) * size_t(hs));
    }
}

// qkv (B, Tl, 3C): the block that travels starts as this rank's k and v, (B, Tl, 2C_kv)
void RingAttention::forward(Runtime& rt, const Tensor& qkv, int64_t NH, int64_t group, Tensor& y, Tensor& lse) {
  const int n = cp_.size(), r = cp_.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3, hs = C / NH, Ckv = C / group;
  const std::vector<int32_t> qpos = positions_of(r, Tl);
  AsF32 q(rt, qkv), yf(rt, y, AsF32::out);
  Tensor kv = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: the k, v block held", DType::f32);
  Tensor arriving = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: the k, v block arriving", DType::f32);
  Tensor out_b = rt.empty({B, Tl, C}, Category::activations, "ring attention: one block's output", DType::f32);
  Tensor lse_b = rt.empty({B, NH, Tl}, Category::activations, "ring attention: one block's log-sum-exp", DType::f32);
  if (!rt.is_meta()) pack_kv(kv.f32(), q.p, B * Tl, C, hs, group, 2 * Ckv);
  for (int s = 0; s < n; s++) {
    // pass the block on and take the previous rank's while this one's math runs (both only read it)
    Posted exchange;
    if (s < n - 1) exchange.w = cp_.send_recv_async(kv.f32(), kv.numel(), next, 0, arriving.f32(), arriving.numel(), prev, 0);
    const std::vector<int32_t> kpos = positions_of((r + n - s) % n, Tl);  // the block of rank r − s
    const float* k = kv.f32();
    if (s == 0)
      attention_block_forward(rt, yf.p, lse.f32(), q.p, 3 * C, k, k + Ckv, 2 * Ckv, qpos.data(), kpos.data(), B, Tl, Tl, C, NH, group);
    else {
      attention_block_forward(rt, out_b.f32(), lse_b.f32(), q.p, 3 * C, k, k + Ckv, 2 * Ckv, qpos.data(), kpos.data(), B, Tl, Tl, C, NH, group);
      attention_merge(rt, yf.p, lse.f32(), out_b.f32(), lse_b.f32(), B, Tl, C, NH);
    }
    if (s < n - 1) {
      exchange.wait();
      std::swap(kv, arriving);
    }
  }
  yf.store();
}

// Backward: k, v travel as in forward, and behind them the gradients the ranks so far added to each block
// (zhuzilin's ring-flash-attention order): a block's math writes its own (B, Tl, 2C_kv) terms, adds the
// ones that arrived with the block, and sends the sum on while the next block's math runs
void RingAttention::backward(Runtime& rt, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t NH,
                             int64_t group, Tensor& dqkv) {
  const int n = cp_.size(), r = cp_.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t B = qkv.size(0), Tl = qkv.size(1), C = qkv.size(2) / 3, hs = C / NH, Ckv = C / group, KV = NH / group;
  const std::vector<int32_t> qpos = positions_of(r, Tl);
  AsF32 q(rt, qkv), dyf(rt, dy), yf(rt, y), dq(rt, dqkv, AsF32::out);
  Tensor D = rt.empty({B, NH, Tl}, Category::activations, "ring attention: rowsum(dy * y)", DType::f32);
  attention_out_dot(rt, D.f32(), dyf.p, yf.p, B, Tl, C, NH);
  Tensor kv = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: the k, v block held", DType::f32);
  Tensor kv_in = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: the k, v block arriving", DType::f32);
  Tensor dkv = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: this block's dk, dv", DType::f32);
  Tensor dkv_out = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: dk, dv sent on", DType::f32);
  Tensor dkv_in = rt.empty({B, Tl, 2 * Ckv}, Category::activations, "ring attention: dk, dv arriving", DType::f32);
  if (!rt.is_meta()) {
    std::memset(dq.p, 0, sizeof(float) * size_t(B * Tl * 3 * C));
    pack_kv(kv.f32(), q.p, B * Tl, C, hs, group, 2 * Ckv);
  }
  Posted grads;  // the previous block's dk, dv on their way
  for (int s = 0; s < n; s++) {
    Posted exchange;
    if (s < n - 1) exchange.w = cp_.send_recv_async(kv.f32(), kv.numel(), next, 0, kv_in.f32(), kv_in.numel(), prev, 0);
    const std::vector<int32_t> kpos = positions_of((r + n - s) % n, Tl);
    const float* k = kv.f32();
    if (!rt.is_meta()) std::memset(dkv.f32(), 0, sizeof(float) * size_t(dkv.numel()));
    attention_block_backward(rt, dq.p, 3 * C, dkv.f32(), dkv.f32() + Ckv, 2 * Ckv, dyf.p, q.p, 3 * C, k, k + Ckv, 2 * Ckv, lse.f32(), D.f32(),
                             qpos.data(), kpos.data(), B, Tl, Tl, C, NH, group);
    if (s > 0) {  // what the ranks before added to this block, which arrived while the math ran
      grads.wait();
      accumulate(rt, dkv.f32(), dkv_in.f32(), dkv.numel());
    }
    if (s < n - 1) {
      exchange.wait();
      std::swap(kv, kv_in);
    }
    // on to the next rank; after the last block (rank r + 1's) that is home
    std::swap(dkv, dkv_out);
    grads.w = cp_.send_recv_async(dkv_out.f32(), dkv_out.numel(), next, 1, dkv_in.f32(), dkv_in.numel(), prev, 1);
  }
  grads.wait();  // this rank's own block's dk, dv, from every rank
  // a kv head's gradient into the first of its repeats, zeros in the rest: repeat_kv's backward sums them
  if (!rt.is_meta())
    for (int64_t row = 0; row < B * Tl; row++)
      for (int64_t j = 0; j < KV; j++) {
        std::memcpy(dq.p + row * 3 * C + C + j * group * hs, dkv_in.f32() + row * 2 * Ckv + j * hs, sizeof(float) * size_t(hs));
        std::memcpy(dq.p + row * 3 * C + 2 * C + j * group * hs, dkv_in.f32() + row * 2 * Ckv + Ckv + j * hs, sizeof(float) * size_t(hs));
      }
  dq.store();
}

}  // namespace distlab
