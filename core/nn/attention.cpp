#include "core/nn/attention.h"

#include <fmt/format.h>

#include "core/ops/cpu/attention.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

CausalSelfAttention::CausalSelfAttention(Runtime& rt, const std::string& prefix, int64_t c, int64_t nh)
    : c_attn(rt, prefix + ".c_attn", c, 3 * c), c_proj(rt, prefix + ".c_proj", c, c), C(c), n_head(nh) {
  if (nh <= 0 || c % nh != 0)
    throw ShapeError(fmt::format("attention {}: n_embd {} is not divisible by n_head {}", prefix, c, nh),
                     "choose model.n_head so that n_embd / n_head is a whole head size");
}

std::string CausalSelfAttention::describe() const { return fmt::format("CausalSelfAttention({}, heads {})", C, n_head); }

std::vector<Parameter*> CausalSelfAttention::parameters() {
  auto p = c_attn.parameters();
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

Tensor CausalSelfAttention::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe(), x, {-1, C});
  const int64_t B = x.size(0), T = x.size(1);
  qkv_ = c_attn.forward(rt, x);  // (B, T, 3C)
  att_ = rt.empty({B, n_head, T, T}, Category::activations, "attention probabilities", rt.dtype);
  Tensor y = rt.empty({B, T, C}, Category::activations, "attention output", rt.dtype);
  {
    AsF32 yf(rt, y, AsF32::out), att(rt, att_, AsF32::out), qkv(rt, qkv_);
    attention_forward(rt, yf.p, att.p, qkv.p, B, T, C, n_head);
    yf.store();
    att.store();  // the probabilities are kept for backward in rt.dtype
  }
  return c_proj.forward(rt, y);
}

Tensor CausalSelfAttention::backward(Runtime& rt, const Tensor& dout) {
  const int64_t B = qkv_.size(0), T = qkv_.size(1);
  Tensor dy = c_proj.backward(rt, dout);
  Tensor dqkv = rt.empty({B, T, 3 * C}, Category::activations, "grad of qkv", rt.dtype);
  {
    AsF32 dq(rt, dqkv, AsF32::out), dyf(rt, dy), qkv(rt, qkv_), att(rt, att_);
    attention_backward(rt, dq.p, dyf.p, qkv.p, att.p, B, T, C, n_head);
    dq.store();
  }
  qkv_ = att_ = Tensor();
  return c_attn.backward(rt, dqkv);
}

}  // namespace distlab
