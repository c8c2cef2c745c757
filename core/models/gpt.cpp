#include "core/models/gpt.h"

#include <fmt/format.h>

#include <cmath>

#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/pointwise.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

Block::Block(Runtime& rt, const std::string& p, const ModelSpec& s, uint64_t seed)
    : ln_1(rt, p + ".ln_1", s.n_embd),
      attn(rt, p + ".attn", s.n_embd, s.n_head),
      ln_2(rt, p + ".ln_2", s.n_embd),
      c_fc(rt, p + ".mlp.c_fc", s.n_embd, 4 * s.n_embd),
      c_proj(rt, p + ".mlp.c_proj", 4 * s.n_embd, s.n_embd),
      drop_attn(s.dropout, seed * 2 + 1),
      drop_mlp(s.dropout, seed * 2 + 2) {}

std::vector<Parameter*> Block::parameters() {
  std::vector<Parameter*> p = ln_1.parameters();
  for (auto* q : attn.parameters()) p.push_back(q);
  for (auto* q : ln_2.parameters()) p.push_back(q);
  for (auto* q : c_fc.parameters()) p.push_back(q);
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

// GPT-2's scheme: weights N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)), biases 0.
void Block::init(Rng& rng, int64_t n_layer) {
  ln_1.init(rng);
  ln_2.init(rng);
  const float proj_std = 0.02f / std::sqrt(2.0f * float(n_layer));
  init_normal(attn.c_attn.weight.data, rng, 0.02f);
  init_normal(attn.c_proj.weight.data, rng, proj_std);
  init_normal(c_fc.weight.data, rng, 0.02f);
  init_normal(c_proj.weight.data, rng, proj_std);
  for (Linear* l : {&attn.c_attn, &attn.c_proj, &c_fc, &c_proj}) l->bias.data.zero_();
}

void Block::set_training(bool on) {
  drop_attn.set_training(on);
  drop_mlp.set_training(on);
}

Tensor Block::forward(Runtime& rt, const Tensor& x) {
  Tensor a = drop_attn.forward(rt, attn.forward(rt, ln_1.forward(rt, x)));
  Tensor h = residual_add(rt, x, a);
  Tensor m = drop_mlp.forward(rt, c_proj.forward(rt, gelu.forward(rt, c_fc.forward(rt, ln_2.forward(rt, h)))));
  return residual_add(rt, h, m);
}

Tensor Block::backward(Runtime& rt, const Tensor& dout) {
  // the residual passes dout through unchanged; the branch's gradient is added to it
  Tensor dh = ln_2.backward(rt, c_fc.backward(rt, gelu.backward(rt, c_proj.backward(rt, drop_mlp.backward(rt, dout)))));
  residual_accumulate(rt, dh, dout);
  Tensor dx = ln_1.backward(rt, attn.backward(rt, drop_attn.backward(rt, dh)));
  residual_accumulate(rt, dx, dh);
  return dx;
}

// out = x + branch, in the stream's dtype (computed in f32, rounded once: pointwise, autocast's input rule)
Tensor Block::residual_add(Runtime& rt, const Tensor& x, const Tensor& branch) {
  Tensor out = rt.empty(x.shape(), Category::activations, "residual stream", x.dtype());
  AsF32 o(rt, out, AsF32::out), a(rt, x), b(rt, branch);
  add_forward(rt, o.p, a.p, b.p, x.numel());
  o.store();
  return out;
}

// d += g: the residual passes its gradient through to the branch's input gradient
void Block::residual_accumulate(Runtime& rt, Tensor& d, const Tensor& g) {
  AsF32 df(rt, d, AsF32::inout), gf(rt, g);
  accumulate(rt, df.p, gf.p, g.numel());
  df.store();
}

GPT::GPT(Runtime& rt, const ModelSpec& s)
    : spec_(s),
      emb_(rt, "transformer.", s.vocab_size, s.block_size, s.n_embd),
      drop_(s.dropout, s.dropout_seed * 1000 + 7),
      ln_f_(rt, "transformer.ln_f", s.n_embd) {
  for (int64_t i = 0; i < s.n_layer; i++)
    h_.push_back(std::make_unique<Block>(rt, fmt::format("transformer.h.{}", i), s, s.dropout_seed * 1000 + 10 + uint64_t(i)));
}

std::string GPT::describe() const {
  return fmt::format("  GPT(n_layer {}, n_head {}, n_embd {}, vocab {}, block {}; lm_head tied to wte)\n", spec_.n_layer,
                     spec_.n_head, spec_.n_embd, spec_.vocab_size, spec_.block_size);
}

std::vector<Parameter*> GPT::parameters() {
  std::vector<Parameter*> p = {&emb_.wte, &emb_.wpe};
  for (auto& b : h_)
    for (auto* q : b->parameters()) p.push_back(q);
  for (auto* q : ln_f_.parameters()) p.push_back(q);
  return p;
}

std::vector<std::vector<Parameter*>> GPT::units() {
  std::vector<std::vector<Parameter*>> u = {{&emb_.wte, &emb_.wpe}};
  for (auto& b : h_) u.push_back(b->parameters());
  u.push_back(ln_f_.parameters());
  return u;
}

void GPT::set_training(bool on) {
  drop_.set_training(on);
  for (auto& b : h_) b->set_training(on);
}

void GPT::init(uint64_t seed) {
  Rng rng(seed);
  emb_.init(rng);
  for (auto& b : h_) b->init(rng, spec_.n_layer);
  ln_f_.init(rng);
}

Tensor GPT::forward(Runtime& rt, const Batch& batch, ForwardHook* hook) {
  const int64_t B = batch.B, T = batch.T, C = spec_.n_embd, V = spec_.vocab_size;
  // unit 0 is wte and wpe; wte is the lm_head too, so unit 0's forward ends after the logits (below)
  if (hook) hook->before_forward(0);
  Tensor x = drop_.forward(rt, emb_.forward(rt, batch.tokens, B, T));  // (B, T, C)
  for (size_t i = 0; i < h_.size(); i++) {
    if (hook) hook->before_forward(int(i) + 1);
    x = h_[i]->forward(rt, x);
    if (hook) hook->after_forward(int(i) + 1);
  }
  const int ln_unit = int(h_.size()) + 1;
  if (hook) hook->before_forward(ln_unit);
  saved_xf_ = ln_f_.forward(rt, x);
  if (hook) hook->after_forward(ln_unit);
  Tensor logits = rt.empty({B * T, V}, Category::activations, "logits", rt.dtype);
  // lm_head: logits (B*T, V) = xf (B*T, C) @ wte^T, no bias (a 16-bit GEMM under mixed precision)
  AsF32 z(rt, logits, AsF32::out), xf(rt, saved_xf_), w(rt, emb_.wte.data);
  matmul_forward(rt, z.p, xf.p, w.p, nullptr, B * T, C, V);
  z.store();
  if (hook) hook->after_forward(0);
  return logits;
}

void GPT::backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) {
  const int64_t BT = dlogits.size(0), C = spec_.n_embd, V = spec_.vocab_size;
  const int n_units = int(h_.size()) + 2;
  if (hook) hook->before_layer_backward(0);  // the lm_head's weight is wte: unit 0's backward starts here
  Tensor dxf = rt.empty(saved_xf_.shape(), Category::activations, "grad of ln_f output", rt.dtype);
  {
    AsF32 d(rt, dxf, AsF32::out), dw(rt, emb_.wte.grad_for_accumulate(), AsF32::inout);
    AsF32 dz(rt, dlogits, AsF32::in, rt.dtype), xf(rt, saved_xf_), w(rt, emb_.wte.data);
    matmul_backward(rt, d.p, dw.p, nullptr, dz.p, xf.p, w.p, BT, C, V);
    d.store();
    dw.store();
  }
  saved_xf_ = Tensor();
  if (hook) hook->before_layer_backward(n_units - 1);
  Tensor d = ln_f_.backward(rt, dxf);
  if (hook) hook->after_layer_backward(n_units - 1, ln_f_.parameters());
  for (size_t i = h_.size(); i-- > 0;) {
    if (hook) hook->before_layer_backward(int(i) + 1);
    d = h_[i]->backward(rt, d);
    if (hook) hook->after_layer_backward(int(i) + 1, h_[i]->parameters());
  }
  emb_.backward(rt, drop_.backward(rt, d));
  if (hook) hook->after_layer_backward(0, {&emb_.wte, &emb_.wpe});
}

}  // namespace distlab
