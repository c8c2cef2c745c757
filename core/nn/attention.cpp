#include "core/nn/attention.h"

#include <fmt/format.h>

#include "core/ops/cpu/attention.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

// ---- the core ----

// P (B, NH, T, T) from qkv, and y = P v into *y when asked
Tensor AttentionCore::probabilities(Runtime& rt, const Tensor& qkv, int64_t NH, const std::string& what, Tensor* y) {
  const int64_t B = qkv.size(0), T = qkv.size(1), Cl = qkv.size(2) / 3;
  Tensor att = rt.empty({B, NH, T, T}, Category::activations, "attention probabilities" + what, rt.dtype);
  // a recompute still computes y (the kernel writes both): a scratch y, dropped at once
  Tensor out = rt.empty({B, T, Cl}, Category::activations, "attention output" + what, rt.dtype);
  {
    AsF32 yf(rt, out, AsF32::out), af(rt, att, AsF32::out), q(rt, qkv);
    attention_forward(rt, yf.p, af.p, q.p, B, T, Cl, NH);
    yf.store();
    af.store();  // kept in rt.dtype, as autograd keeps softmax's output
  }
  if (y) *y = out;
  return att;
}

Tensor AttentionCore::forward(Runtime& rt, const Tensor& qkv, int64_t NH, const std::string& what) {
  if (flash_) {
    const int64_t B = qkv.size(0), T = qkv.size(1), Cl = qkv.size(2) / 3;
    y_ = rt.empty({B, T, Cl}, Category::activations, "attention output" + what, rt.dtype);
    lse_ = rt.empty({B, NH, T}, Category::activations, "attention log-sum-exp" + what, DType::f32);
    if (context_) {  // ring attention over the sequence's shards
      context_->forward(rt, qkv, NH, kv_group_, y_, lse_);
      return y_;
    }
    if (device_16(rt, {&qkv, &y_})) {  // the 16-bit tensors as they are (a GPU's tensor-core kernels)
      flash_attention_forward_16(rt, y_.data(), lse_.f32(), qkv.data(), qkv.dtype(), B, T, Cl, NH);
      return y_;
    }
    AsF32 yf(rt, y_, AsF32::out), q(rt, qkv);
    flash_attention_forward(rt, yf.p, lse_.f32(), q.p, B, T, Cl, NH);
    yf.store();
    return y_;
  }
  Tensor y;
  Tensor att = probabilities(rt, qkv, NH, what, &y);
  att_ = recompute_ ? Tensor() : att;  // selective checkpointing frees P here, before the next layer runs
  return y;
}

Tensor AttentionCore::backward(Runtime& rt, const Tensor& dy, const Tensor& qkv, int64_t NH, const std::string& what) {
  const int64_t B = qkv.size(0), T = qkv.size(1), Cl = qkv.size(2) / 3;
  if (flash_) {
    DL_ASSERT(y_.defined() && lse_.defined(), "AttentionCore::backward without a forward");
    Tensor dqkv = rt.empty({B, T, 3 * Cl}, Category::activations, "grad of qkv" + what, rt.dtype);
    if (context_) context_->backward(rt, dy, qkv, y_, lse_, NH, kv_group_, dqkv);
    else if (device_16(rt, {&qkv, &dy, &y_, &dqkv})) {
      flash_attention_backward_16(rt, dqkv.data(), dy.data(), qkv.data(), y_.data(), lse_.f32(), qkv.dtype(), B, T, Cl, NH);
    } else {
      AsF32 dq(rt, dqkv, AsF32::out), dyf(rt, dy), q(rt, qkv), yf(rt, y_);
      flash_attention_backward(rt, dq.p, dyf.p, q.p, yf.p, lse_.f32(), B, T, Cl, NH);
      dq.store();
    }
    y_ = lse_ = Tensor();
    return dqkv;
  }
  if (recompute_) {
    RecomputeScope recompute(rt.trace);
    att_ = probabilities(rt, qkv, NH, what + ", recomputed", nullptr);
  }
  DL_ASSERT(att_.defined(), "AttentionCore::backward without a forward");
  Tensor dqkv = rt.empty({B, T, 3 * Cl}, Category::activations, "grad of qkv" + what, rt.dtype);
  {
    AsF32 dq(rt, dqkv, AsF32::out), dyf(rt, dy), q(rt, qkv), att(rt, att_);
    attention_backward(rt, dq.p, dyf.p, q.p, att.p, B, T, Cl, NH);
    dq.store();
  }
  att_ = Tensor();
  return dqkv;
}

// ---- the layer ----

CausalSelfAttention::CausalSelfAttention(Runtime& rt, const std::string& prefix, int64_t c, int64_t nh, AttentionCore core)
    : c_attn(rt, prefix + ".c_attn", c, 3 * c), c_proj(rt, prefix + ".c_proj", c, c), C(c), n_head(nh), core_(core) {
  if (nh <= 0 || c % nh != 0)
    throw ShapeError(fmt::format("attention {}: n_embd {} is not divisible by n_head {}", prefix, c, nh),
                     "choose model.n_head so that n_embd / n_head is a whole head size");
}

std::string CausalSelfAttention::describe() const {
  return fmt::format("CausalSelfAttention({}, heads {}{})", C, n_head,
                     core_.context()   ? fmt::format(", ring attention over {} ranks", core_.context()->size())
                     : core_.flash()   ? ", flash"
                     : core_.recomputes() ? ", probabilities recomputed"
                                          : "");
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  auto p = c_attn.parameters();
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

Tensor CausalSelfAttention::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe(), x, {-1, C});
  qkv_ = c_attn.forward(rt, x);                        // (B, T, 3C)
  Tensor y = core_.forward(rt, qkv_, n_head, "");      // (B, T, C)
  return c_proj.forward(rt, y);
}

Tensor CausalSelfAttention::backward(Runtime& rt, const Tensor& dout) {
  Tensor dy = c_proj.backward(rt, dout);
  Tensor dqkv = core_.backward(rt, dy, qkv_, n_head, "");
  qkv_ = Tensor();
  return c_attn.backward(rt, dqkv);
}

}  // namespace distlab
