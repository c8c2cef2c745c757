#include "core/models/gpt_tp.h"

#include <fmt/format.h>

#include "core/ops/cpu/matmul.h"
#include "core/tensor/as_f32.h"

namespace distlab {

ParallelBlock::ParallelBlock(Runtime& rt, ProcessGroup& tp, const std::string& p, const ModelSpec& s, uint64_t seed)
    : ln_1(rt, p + ".ln_1", s.n_embd),
      attn(rt, tp, p + ".attn", s.n_embd, s.n_head),
      ln_2(rt, p + ".ln_2", s.n_embd),
      c_fc(rt, tp, p + ".mlp.c_fc", s.n_embd, 4 * s.n_embd),
      c_proj(rt, tp, p + ".mlp.c_proj", 4 * s.n_embd, s.n_embd),
      drop_attn(s.dropout, seed * 2 + 1),  // gpt.h's seeds: the residual stream is whole, every rank draws the same mask
      drop_mlp(s.dropout, seed * 2 + 2) {}

std::vector<Parameter*> ParallelBlock::parameters() {
  std::vector<Parameter*> p = ln_1.parameters();
  for (auto* q : attn.parameters()) p.push_back(q);
  for (auto* q : ln_2.parameters()) p.push_back(q);
  for (auto* q : c_fc.parameters()) p.push_back(q);
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

void ParallelBlock::set_training(bool on) {
  drop_attn.set_training(on);
  drop_mlp.set_training(on);
}

Tensor ParallelBlock::forward(Runtime& rt, const Tensor& x) {
  Tensor a = drop_attn.forward(rt, attn.forward(rt, ln_1.forward(rt, x)));
  Tensor h = Block::residual_add(rt, x, a);
  Tensor m = drop_mlp.forward(rt, c_proj.forward(rt, gelu.forward(rt, c_fc.forward(rt, ln_2.forward(rt, h)))));
  return Block::residual_add(rt, h, m);
}

Tensor ParallelBlock::backward(Runtime& rt, const Tensor& dout) {
  Tensor dh = ln_2.backward(rt, c_fc.backward(rt, gelu.backward(rt, c_proj.backward(rt, drop_mlp.backward(rt, dout)))));
  Block::residual_accumulate(rt, dh, dout);
  Tensor dx = ln_1.backward(rt, attn.backward(rt, drop_attn.backward(rt, dh)));
  Block::residual_accumulate(rt, dx, dh);
  return dx;
}

TensorParallelGPT::TensorParallelGPT(Runtime& rt, ProcessGroup& tp, const ModelSpec& s)
    : tp_(tp),
      spec_(s),
      device_(rt.device),
      emb_(rt, tp, "transformer.", s.vocab_size, s.block_size, s.n_embd),
      drop_(s.dropout, s.dropout_seed * 1000 + 7),
      ln_f_(rt, "transformer.ln_f", s.n_embd) {
  for (int64_t i = 0; i < s.n_layer; i++)
    h_.push_back(std::make_unique<ParallelBlock>(rt, tp, fmt::format("transformer.h.{}", i), s, s.dropout_seed * 1000 + 10 + uint64_t(i)));
}

std::string TensorParallelGPT::describe() const {
  const int t = tp_.size();
  return fmt::format(
      "  GPT(n_layer {}, n_head {}, n_embd {}, vocab {}, block {}; lm_head tied to wte), tensor parallel over {} ranks (tp rank {}):\n"
      "    wte rows {}..{} of {} (vocab-parallel embedding and loss); {} heads of {} per block; c_attn, mlp.c_fc by rows,\n"
      "    attn.c_proj, mlp.c_proj by columns; LayerNorms, wpe and the row-parallel biases whole\n",
      spec_.n_layer, spec_.n_head, spec_.n_embd, spec_.vocab_size, spec_.block_size, t, tp_.rank(), emb_.first,
      emb_.first + spec_.vocab_size / t, spec_.vocab_size, spec_.n_head / t, spec_.n_head);
}

std::vector<Parameter*> TensorParallelGPT::parameters() {
  std::vector<Parameter*> p = {&emb_.wte, &emb_.wpe};
  for (auto& b : h_)
    for (auto* q : b->parameters()) p.push_back(q);
  for (auto* q : ln_f_.parameters()) p.push_back(q);
  return p;
}

std::vector<std::vector<Parameter*>> TensorParallelGPT::units() {
  std::vector<std::vector<Parameter*>> u = {{&emb_.wte, &emb_.wpe}};
  for (auto& b : h_) u.push_back(b->parameters());
  u.push_back(ln_f_.parameters());
  return u;
}

std::vector<uint64_t*> TensorParallelGPT::rng_streams() {
  std::vector<uint64_t*> v{drop_.rng_calls()};
  for (auto& b : h_) {
    v.push_back(b->drop_attn.rng_calls());
    v.push_back(b->drop_mlp.rng_calls());
  }
  return v;
}

void TensorParallelGPT::set_training(bool on) {
  drop_.set_training(on);
  for (auto& b : h_) b->set_training(on);
}

void TensorParallelGPT::init(uint64_t seed) {
  Runtime side(device_);  // f32, its own accountant: the whole model lives only for this call
  GPT whole(side, spec_);
  whole.init(seed);
  load_split_params(parameters(), whole.parameters(), tp_.rank(), tp_.size());
}

Tensor TensorParallelGPT::forward(Runtime& rt, const Batch& batch, ForwardHook* hook) {
  const int64_t B = batch.B, T = batch.T, C = spec_.n_embd, Vt = spec_.vocab_size / tp_.size();
  if (hook) hook->before_forward(0);
  Tensor x = drop_.forward(rt, emb_.forward(rt, batch.tokens, B, T));  // (B, T, C), whole
  for (size_t i = 0; i < h_.size(); i++) {
    if (hook) hook->before_forward(int(i) + 1);
    x = h_[i]->forward(rt, x);
    if (hook) hook->after_forward(int(i) + 1);
  }
  const int ln_unit = int(h_.size()) + 1;
  if (hook) hook->before_forward(ln_unit);
  saved_xf_ = ln_f_.forward(rt, x);
  if (hook) hook->after_forward(ln_unit);
  // lm_head, column-parallel over the vocabulary: logits (B*T, V/t) = xf (B*T, C) @ wte_rᵀ (f: identity)
  Tensor logits = rt.empty({B * T, Vt}, Category::activations, "logits (this rank's vocabulary)", rt.dtype);
  AsF32 z(rt, logits, AsF32::out), xf(rt, saved_xf_), w(rt, emb_.wte.data);
  matmul_forward(rt, z.p, xf.p, w.p, nullptr, B * T, C, Vt);
  z.store();
  if (hook) hook->after_forward(0);
  return logits;
}

void TensorParallelGPT::backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) {
  const int64_t BT = dlogits.size(0), C = spec_.n_embd, Vt = dlogits.size(1);
  const int n_units = int(h_.size()) + 2;
  if (hook) hook->before_layer_backward(0);
  Tensor dxf = rt.empty(saved_xf_.shape(), Category::activations, "grad of ln_f output", rt.dtype);
  {
    AsF32 d(rt, dxf, AsF32::out), dw(rt, emb_.wte.grad_for_accumulate(), AsF32::inout);
    AsF32 dz(rt, dlogits, AsF32::in, rt.dtype), xf(rt, saved_xf_), w(rt, emb_.wte.data);
    matmul_backward(rt, d.p, dw.p, nullptr, dz.p, xf.p, w.p, BT, C, Vt);
    d.store();
    dw.store();
  }
  all_reduce_tensor(rt, tp_, dxf);  // f's backward: each rank's vocabulary contributes a term of dxf
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
