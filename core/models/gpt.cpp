#include "core/models/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/nn/linear.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/pointwise.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

// ---- the default layers: nn's, whole ----

std::unique_ptr<Layer> GptLayers::attention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, AttentionCore core) {
  return std::make_unique<CausalSelfAttention>(rt, prefix, C, n_head, core);
}
std::unique_ptr<Layer> GptLayers::mlp_up(Runtime& rt, const std::string& prefix, int64_t C, int64_t hidden) {
  return std::make_unique<Linear>(rt, prefix, C, hidden);
}
std::unique_ptr<Layer> GptLayers::mlp_down(Runtime& rt, const std::string& prefix, int64_t hidden, int64_t C) {
  return std::make_unique<Linear>(rt, prefix, hidden, C);
}
std::unique_ptr<TokenEmbedding> GptLayers::embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C) {
  return std::make_unique<Embedding>(rt, prefix, vocab, block, C);
}
void GptLayers::take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* w : whole) by_name[w->name] = w;
  for (Parameter* l : local) {
    const std::string& name = l->tied.empty() ? l->name : l->tied;  // a pipeline's copy takes its original's values
    auto it = by_name.find(name);
    DL_ASSERT(it != by_name.end() && it->second->data.shape() == l->data.shape(), "GptLayers::take_part: " + name + " is not in the whole model");
    l->data.copy_from(it->second->data);
  }
}

std::pair<int64_t, int64_t> stage_blocks(int64_t n_layer, int stage, int stages, const std::vector<int64_t>& layers) {
  if (!layers.empty()) {
    const int64_t sum = std::accumulate(layers.begin(), layers.end(), int64_t(0));
    if (int64_t(layers.size()) != stages || sum != n_layer ||
        std::any_of(layers.begin(), layers.end(), [](int64_t n) { return n < 1; }))
      throw ConfigError(fmt::format("parallel.pp_layers has {} entries summing to {}: {} stages of model.n_layer {} blocks", layers.size(), sum,
                                    stages, n_layer),
                        "give every stage at least one block, and all the blocks to some stage");
    const int64_t first = std::accumulate(layers.begin(), layers.begin() + stage, int64_t(0));
    return {first, first + layers[size_t(stage)]};
  }
  if (n_layer % stages != 0)
    throw ConfigError(fmt::format("parallel.pp {} does not divide model.n_layer {}: the stages would be uneven", stages, n_layer),
                      "choose a pp that divides the blocks, or say how many each stage holds: parallel.pp_layers = [..]");
  const int64_t per = n_layer / stages;
  return {stage * per, (stage + 1) * per};
}

// ---- a block ----

Block::Block(Runtime& rt, GptLayers& layers, const std::string& p, const ModelSpec& s, uint64_t seed)
    : ln_1(rt, p + ".ln_1", s.n_embd),
      attn(layers.attention(rt, p + ".attn", s.n_embd, s.n_head, AttentionCore(s.checkpointing == Checkpointing::selective, s.attention == AttentionKernel::flash, s.context))),
      ln_2(rt, p + ".ln_2", s.n_embd),
      c_fc(layers.mlp_up(rt, p + ".mlp.c_fc", s.n_embd, 4 * s.n_embd)),
      c_proj(layers.mlp_down(rt, p + ".mlp.c_proj", 4 * s.n_embd, s.n_embd)),
      // the residual stream is whole on every rank: every rank draws the same mask (sequence parallel: its rows, its own)
      drop_attn(s.dropout, layers.stream_seed(seed * 2 + 1)),
      drop_mlp(s.dropout, layers.stream_seed(seed * 2 + 2)),
      full_(s.checkpointing == Checkpointing::full),
      layers_(layers) {}

std::vector<Parameter*> Block::parameters() {
  std::vector<Parameter*> p = ln_1.parameters();
  for (auto* q : attn->parameters()) p.push_back(q);
  for (auto* q : ln_2.parameters()) p.push_back(q);
  for (auto* q : c_fc->parameters()) p.push_back(q);
  for (auto* q : c_proj->parameters()) p.push_back(q);
  return p;
}

// GPT-2's scheme: weights N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L)), biases 0.
void Block::init(Rng& rng, int64_t n_layer) {
  auto* a = dynamic_cast<CausalSelfAttention*>(attn.get());
  auto* fc = dynamic_cast<Linear*>(c_fc.get());
  auto* proj = dynamic_cast<Linear*>(c_proj.get());
  DL_ASSERT(a && fc && proj, "Block::init: a split block takes its part of a whole one's weights (GPT::init)");
  ln_1.init(rng);
  ln_2.init(rng);
  const float proj_std = 0.02f / std::sqrt(2.0f * float(n_layer));
  init_normal(a->c_attn.weight.data, rng, 0.02f);
  init_normal(a->c_proj.weight.data, rng, proj_std);
  init_normal(fc->weight.data, rng, 0.02f);
  init_normal(proj->weight.data, rng, proj_std);
  for (Linear* l : {&a->c_attn, &a->c_proj, fc, proj}) l->bias.data.zero_();
}

void Block::set_training(bool on) {
  drop_attn.set_training(on);
  drop_mlp.set_training(on);
  for (Layer* l : {attn.get(), c_fc.get(), c_proj.get()}) set_training_tree(*l, on);  // LoRA's dropout inside the linears
}

void Block::swap_saved(SavedState& s) {
  for (Layer* l : std::initializer_list<Layer*>{&ln_1, attn.get(), &ln_2, c_fc.get(), &gelu, c_proj.get(), &drop_attn, &drop_mlp})
    l->swap_saved(s);
  s.swap(x_);
  s.swap(drop_at_);
}

std::vector<uint64_t*> Block::streams() {
  std::vector<uint64_t*> v = {drop_attn.rng_calls(), drop_mlp.rng_calls()};
  for (uint64_t* c : lora_streams({attn.get(), c_fc.get(), c_proj.get()})) v.push_back(c);
  return v;
}

void Block::drop_saved() {
  SavedState gone;
  gone.begin();
  for (Layer* l : std::initializer_list<Layer*>{&ln_1, attn.get(), &ln_2, c_fc.get(), &gelu, c_proj.get(), &drop_attn, &drop_mlp})
    l->swap_saved(gone);
}  // `gone` and the tensors it took are freed here

Tensor Block::forward(Runtime& rt, const Tensor& x) {
  if (!full_) return run_forward(rt, x);
  drop_at_.clear();
  for (uint64_t* c : streams()) drop_at_.push_back(int64_t(*c));
  Tensor y = run_forward(rt, x);
  drop_saved();
  x_ = x;
  return y;
}

Tensor Block::run_forward(Runtime& rt, const Tensor& x) {
  Tensor a = drop_attn.forward(rt, attn->forward(rt, ln_1.forward(rt, x)));
  Tensor h = residual_add(rt, x, a);
  Tensor m = drop_mlp.forward(rt, c_proj->forward(rt, fc_gelu(rt, ln_2.forward(rt, h))));
  return residual_add(rt, h, m);
}

// gelu(c_fc(x)): in one GEMM with the GELU in its epilogue where the device has it (a plain Linear's
// forward_gelu), else the two layers' forwards. The same numbers on cuda-sim; within a rounding on a GPU.
Tensor Block::fc_gelu(Runtime& rt, const Tensor& x) {
  if (auto* fc = dynamic_cast<Linear*>(c_fc.get())) {
    Tensor pre;
    Tensor out = fc->forward_gelu(rt, x, pre);
    if (out.defined()) return gelu.adopt(pre, out);
  }
  return gelu.forward(rt, c_fc->forward(rt, x));
}

Tensor Block::backward(Runtime& rt, const Tensor& dout) {
  if (full_) {
    DL_ASSERT(x_.defined(), "Block::backward under full checkpointing without a forward");
    // the recompute: the same input and the same dropout draws as the first forward; the streams then go
    // back to where they are now (other micro-batches may have drawn since: a pipeline keeps several in flight)
    const std::vector<uint64_t*> s = streams();
    DL_ASSERT(s.size() == drop_at_.size(), "Block::backward: the dropout streams changed since the forward");
    std::vector<uint64_t> now;
    for (size_t i = 0; i < s.size(); i++) {
      now.push_back(*s[i]);
      *s[i] = uint64_t(drop_at_[i]);
    }
    {
      RecomputeScope recompute(rt.trace);  // hardware FLOPs (HFU), not model FLOPs
      run_forward(rt, x_);  // its output is dropped: what matters is what the layers saved
    }
    for (size_t i = 0; i < s.size(); i++) *s[i] = now[i];
    x_ = Tensor();
  }
  // the residual passes dout through unchanged; the branch's gradient is added to it
  Tensor dh = layers_.norm_backward(rt, ln_2, c_fc->backward(rt, gelu.backward(rt, c_proj->backward(rt, drop_mlp.backward(rt, dout)))));
  residual_accumulate(rt, dh, dout);
  Tensor dx = layers_.norm_backward(rt, ln_1, attn->backward(rt, drop_attn.backward(rt, dh)));
  residual_accumulate(rt, dx, dh);
  return dx;
}

// out = x + branch, in the stream's dtype (computed in f32, rounded once: pointwise, autocast's input rule)
Tensor Block::residual_add(Runtime& rt, const Tensor& x, const Tensor& branch) {
  Tensor out = rt.empty(x.shape(), Category::activations, "residual stream", x.dtype());
  const bool half = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
  if (rt.kernels && half && branch.dtype() == x.dtype()) {  // a device rank's 16 bits as they are
    add_16(rt, out.data(), x.data(), branch.data(), x.dtype(), x.numel());
    return out;
  }
  AsF32 o(rt, out, AsF32::out), a(rt, x), b(rt, branch);
  add_forward(rt, o.p, a.p, b.p, x.numel());
  o.store();
  return out;
}

// d += g: the residual passes its gradient through to the branch's input gradient
void Block::residual_accumulate(Runtime& rt, Tensor& d, const Tensor& g) {
  if (rt.kernels && (d.dtype() == DType::bf16 || d.dtype() == DType::f16) && g.dtype() == d.dtype())
    return accumulate_16(rt, d.data(), g.data(), d.dtype(), g.numel());
  AsF32 df(rt, d, AsF32::inout), gf(rt, g);
  accumulate(rt, df.p, gf.p, g.numel());
  df.store();
}

// ---- the model ----

GPT::GPT(Runtime& rt, const ModelSpec& s, int stage, int stages, const std::vector<int64_t>& blocks_per_stage,
         std::unique_ptr<GptLayers> layers)
    : spec_(s),
      device_(rt.device),
      stage_(stage),
      stages_(stages),
      split_(layers != nullptr),
      layers_(layers ? std::move(layers) : std::make_unique<GptLayers>()),
      drop_(s.dropout, layers_->stream_seed(s.dropout_seed * 1000 + 7)) {
  if (s.checkpointing == Checkpointing::selective_op)
    throw ConfigError("train.activation_checkpointing = \"selective_op\" with model.name \"gpt\": the op-level policy is written for "
                      "Llama's block (torchtitan's)",
                      "use \"selective\" (the attention probabilities) or \"full\" for a GPT");
  std::tie(first_block_, last_block_) = stage_blocks(s.n_layer, stage, stages, blocks_per_stage);
  if (first_stage()) emb_ = layers_->embedding(rt, "transformer.", s.vocab_size, s.block_size, s.n_embd);
  for (int64_t i = first_block_; i < last_block_; i++)
    h_.push_back(std::make_unique<Block>(rt, *layers_, fmt::format("transformer.h.{}", i), s, s.dropout_seed * 1000 + 10 + uint64_t(i)));
  if (last_stage()) ln_f_ = std::make_unique<LayerNorm>(rt, "transformer.ln_f", s.n_embd);
  if (last_stage() && !first_stage()) {
    const int t = vocab_parts();
    if (s.vocab_size % t != 0)
      throw ConfigError(fmt::format("lm_head: the vocabulary of {} does not split over {} tensor-parallel ranks", s.vocab_size, t),
                        "pad model.vocab_size to a multiple of parallel.tp");
    lm_head_ = make_parameter(rt, "lm_head.weight", {s.vocab_size / t, s.n_embd});
    lm_head_.split_dim = 0;
    lm_head_.tied = "transformer.wte.weight";
  }
}

Shape GPT::stream_shape(const Batch& b) {
  if (layers_->sequence_parallel()) return {b.B * b.T / vocab_parts(), spec_.n_embd};  // this rank's rows
  return {b.B, b.T, spec_.n_embd};
}

int64_t GPT::vocab_first() const {
  ProcessGroup* g = layers_->vocab_group();
  return g ? int64_t(g->rank()) * (spec_.vocab_size / g->size()) : 0;
}

std::string GPT::describe() const {
  std::string d = fmt::format("  GPT(n_layer {}, n_head {}, n_embd {}, vocab {}, block {}; lm_head tied to wte)\n", spec_.n_layer, spec_.n_head,
                              spec_.n_embd, spec_.vocab_size, spec_.block_size);
  if (spec_.attention == AttentionKernel::flash)
    d += "    attention: flash (FlashAttention-2's tiles; log-sum-exps kept, not the probabilities)\n";
  if (spec_.checkpointing == Checkpointing::full)
    d += "    activation checkpointing: full (a block keeps its input; backward reruns its forward)\n";
  else if (spec_.checkpointing == Checkpointing::selective)
    d += "    activation checkpointing: selective (the attention probabilities are recomputed in backward)\n";
  if (stages_ > 1)
    d += fmt::format("    pipeline stage {} of {}: {}blocks {}..{}{}\n", stage_, stages_, first_stage() ? "embeddings, " : "", first_block_,
                     last_block_ - 1, last_stage() ? ", ln_f, lm_head (a copy of wte, its gradient summed with stage 0's)" : "");
  const int t = vocab_parts();
  if (t > 1)
    d += fmt::format("    tensor parallel over {} ranks (tp rank {}): wte rows {}..{} of {} (vocab-parallel embedding and loss); {} heads of {}\n"
                     "    per block; c_attn, mlp.c_fc by rows, attn.c_proj, mlp.c_proj by columns; LayerNorms, wpe and the row-parallel biases whole\n",
                     t, layers_->vocab_group()->rank(), vocab_first(), vocab_first() + spec_.vocab_size / t, spec_.vocab_size, spec_.n_head / t,
                     spec_.n_head);
  if (t > 1 && layers_->sequence_parallel())
    d += fmt::format("    sequence parallel: the residual stream, LayerNorms and dropouts on this rank's 1/{} of the token rows; an all-gather\n"
                     "    before each column-parallel layer and a reduce-scatter after each row-parallel one, in place of the all-reduces\n",
                     t);
  return d;
}

std::vector<Parameter*> GPT::parameters() {
  std::vector<Parameter*> p;
  for (auto& u : units())
    for (Parameter* q : u) p.push_back(q);
  return p;
}

std::vector<std::vector<Parameter*>> GPT::units() {
  std::vector<std::vector<Parameter*>> u;
  if (emb_) u.push_back({&emb_->wte, &emb_->wpe});
  for (auto& b : h_) u.push_back(b->parameters());
  if (ln_f_) {
    u.push_back(ln_f_->parameters());
    if (!first_stage()) u.back().push_back(&lm_head_);
  }
  return u;
}

std::vector<Layer*> GPT::layers() {
  std::vector<Layer*> v;
  for (auto& b : h_) v.insert(v.end(), {b->attn.get(), b->c_fc.get(), b->c_proj.get()});
  return v;
}

Parameter* GPT::tied_embedding() {
  if (stages_ == 1) return nullptr;
  if (first_stage()) return &emb_->wte;
  return last_stage() ? &lm_head_ : nullptr;
}

std::vector<uint64_t*> GPT::rng_streams() {
  std::vector<uint64_t*> v;
  if (first_stage()) v.push_back(drop_.rng_calls());
  for (auto& b : h_) {
    v.push_back(b->drop_attn.rng_calls());
    v.push_back(b->drop_mlp.rng_calls());
    for (uint64_t* c : lora_streams({b->attn.get(), b->c_fc.get(), b->c_proj.get()})) v.push_back(c);
  }
  return v;
}

void GPT::set_training(bool on) {
  drop_.set_training(on);
  for (auto& b : h_) b->set_training(on);
}

void GPT::swap_saved(SavedState& s) {
  s.begin();
  if (emb_) emb_->swap_saved(s);
  drop_.swap_saved(s);
  for (auto& b : h_) b->swap_saved(s);
  if (ln_f_) ln_f_->swap_saved(s);
  s.swap(saved_xf_);
}

void GPT::init(uint64_t seed) {
  if (split_ || stages_ > 1) {
    // the whole model on the host (f32, its own accountant: it lives only for this call); a meta rank's on
    // meta. This rank takes its part: the same initial weights as one device's, whatever the split.
    Runtime side(device_ == DeviceKind::meta ? DeviceKind::meta : DeviceKind::cpu);
    GPT whole(side, spec_);
    whole.init(seed);
    layers_->take_part(parameters(), whole.parameters());
    return;
  }
  Rng rng(seed);
  auto* emb = dynamic_cast<Embedding*>(emb_.get());
  DL_ASSERT(emb, "GPT::init: a whole model's embedding is nn's Embedding");
  emb->init(rng);
  for (auto& b : h_) b->init(rng, spec_.n_layer);
  ln_f_->init(rng);
}

Tensor GPT::forward(Runtime& rt, const Batch& batch, ForwardHook* hook) {
  DL_ASSERT(stages_ == 1, "GPT::forward: a pipeline stage runs forward_stage");
  return forward_stage(rt, batch, Tensor(), hook);
}

void GPT::backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) {
  DL_ASSERT(stages_ == 1, "GPT::backward: a pipeline stage runs backward_stage");
  backward_stage(rt, dlogits, hook);
}

Tensor GPT::forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) {
  const int64_t B = batch.B, T = batch.T, C = spec_.n_embd, Vt = spec_.vocab_size / vocab_parts();
  layers_->set_tokens(B, T);  // sequence parallel: the shape its gathers make
  int unit = 0;
  Tensor x;
  if (first_stage()) {  // unit 0 is wte and wpe; on one stage wte is the lm_head too: its forward ends after the logits
    if (hook) hook->before_forward(unit);
    if (spec_.context) emb_->positions = spec_.context->positions(T);  // context parallel: wpe's rows at this rank's tokens
    x = drop_.forward(rt, emb_->forward(rt, batch.tokens, B, T));  // (B, T, C), whole (sequence parallel: (B·T/t, C), its rows)
    if (hook && !last_stage()) hook->after_forward(unit);
    unit++;
  } else {
    x = input;  // (B, T, C) from the stage before
  }
  for (auto& b : h_) {
    if (hook) hook->before_forward(unit);
    x = b->forward(rt, x);
    if (hook) hook->after_forward(unit);
    unit++;
  }
  if (!last_stage()) return x;
  if (hook) hook->before_forward(unit);
  saved_xf_ = ln_f_->forward(rt, x);
  if (hook) hook->after_forward(unit);  // (ln_f's parameters are done with: ZeRO-3 frees them before the logits)
  // lm_head: logits (B*T, V/t) = xf (B*T, C) @ headᵀ, no bias (a 16-bit GEMM under mixed precision); split
  // over the vocabulary, this rank's columns (Megatron's f: identity; sequence parallel: g, the rows gathered)
  Tensor logits = rt.empty({B * T, Vt}, Category::activations, vocab_parts() > 1 ? "logits (this rank's vocabulary)" : "logits", rt.dtype);
  const Tensor xf_all = layers_->whole_rows(rt, saved_xf_);
  if (device_16(rt, {&xf_all, &head().data})) {  // a device rank's 16-bit GEMM on the tensors as they are
    linear_forward_16(rt, logits.data(), xf_all.data(), head().data.data(), nullptr, rt.dtype, B * T, C, Vt);
  } else {
    AsF32 z(rt, logits, AsF32::out), xf(rt, xf_all), w(rt, head().data);
    matmul_forward(rt, z.p, xf.p, w.p, nullptr, B * T, C, Vt);
    z.store();
  }
  if (hook && first_stage()) hook->after_forward(0);
  return logits;
}

Tensor GPT::backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) {
  int unit = int(units().size()) - 1;
  Tensor d = dout;
  if (last_stage()) {
    const int64_t BT = dout.size(0), C = spec_.n_embd, Vt = dout.size(1);
    if (hook) hook->before_layer_backward(first_stage() ? 0 : unit);  // one stage: the lm_head's weight is wte (unit 0)
    const Tensor xf_all = layers_->whole_rows(rt, saved_xf_);  // sequence parallel: gathered again
    Tensor dxf = rt.empty(xf_all.shape(), Category::activations, "grad of ln_f output", rt.dtype);
    const bool trains = head().requires_grad;  // frozen under LoRA: dW's GEMM skipped
    const Tensor gw = trains ? head().grad_for_accumulate() : Tensor();
    if (device_16(rt, {&dout, &xf_all, &head().data}) && (!trains || gw.dtype() == rt.dtype)) {
      linear_backward_16(rt, dxf.data(), trains ? gw.data() : nullptr, nullptr, dout.data(), xf_all.data(), head().data.data(), rt.dtype, BT, C,
                         Vt, true, trains);
    } else {
      AsF32 dx(rt, dxf, AsF32::out), dw(rt, gw, AsF32::inout);
      AsF32 dz(rt, dout, AsF32::in, rt.dtype), xf(rt, xf_all), w(rt, head().data);
      matmul_backward(rt, dx.p, dw.p, nullptr, dz.p, xf.p, w.p, BT, C, Vt, true, trains);
      dx.store();
      dw.store();
    }
    layers_->sum_over_vocab(rt, dxf);  // f's backward: each rank's vocabulary contributes a term of dxf
    saved_xf_ = Tensor();
    if (hook && first_stage()) hook->before_layer_backward(unit);
    d = layers_->norm_backward(rt, *ln_f_, dxf);
    if (hook) hook->after_layer_backward(unit, units().back());
    unit--;
  }
  for (size_t i = h_.size(); i-- > 0;) {
    if (hook) hook->before_layer_backward(unit);
    d = h_[i]->backward(rt, d);
    if (hook) hook->after_layer_backward(unit, h_[i]->parameters());
    unit--;
  }
  if (!first_stage()) return d;  // (B, T, C): the gradient of what the stage before sent
  emb_->backward(rt, drop_.backward(rt, d));
  if (hook) hook->after_layer_backward(0, {&emb_->wte, &emb_->wpe});
  return Tensor();
}

}  // namespace distlab
