#include "core/models/llama.h"

#include <fmt/format.h>

#include <map>

#include "core/comm/process_group.h"
#include "core/models/gpt.h"  // stage_blocks, Block::residual_add
#include "core/ops/cpu/attention.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

int64_t llama_kv_heads(const ModelSpec& s) { return s.n_kv_head > 0 ? s.n_kv_head : s.n_head; }

int64_t llama_intermediate(const ModelSpec& s) {
  if (s.intermediate_size > 0) return s.intermediate_size;
  const int64_t hidden = (8 * s.n_embd + 2) / 3;  // 2 · 4C / 3, rounded up
  return (hidden + 255) / 256 * 256;
}

int64_t llama_params_exact(const ModelSpec& s) {
  const int64_t C = s.n_embd, hd = C / s.n_head, kv = llama_kv_heads(s) * hd, I = llama_intermediate(s);
  return 2 * s.vocab_size * C + s.n_layer * (2 * C + 2 * C * C + 2 * C * kv + 3 * C * I) + C;
}

// ---- the default layers: whole ----

std::unique_ptr<LlamaAttention> LlamaLayers::attention(Runtime& rt, const std::string& prefix, const ModelSpec& s, AttentionCore core) {
  return std::make_unique<LlamaAttention>(rt, prefix, s.n_embd, s.n_head, llama_kv_heads(s), s.rope_theta, core);
}
std::unique_ptr<LlamaMLP> LlamaLayers::mlp(Runtime& rt, const std::string& prefix, const ModelSpec& s) {
  return std::make_unique<LlamaMLP>(rt, prefix, s.n_embd, llama_intermediate(s));
}
void LlamaLayers::take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* w : whole) by_name[w->name] = w;
  for (Parameter* l : local) {
    auto it = by_name.find(l->name);
    DL_ASSERT(it != by_name.end() && it->second->data.shape() == l->data.shape(), "LlamaLayers::take_part: " + l->name);
    l->data.copy_from(it->second->data);
  }
}

// ---- a block ----

LlamaBlock::LlamaBlock(Runtime& rt, LlamaLayers& layers, const std::string& p, const ModelSpec& s)
    : input_layernorm(rt, p + ".input_layernorm", s.n_embd, s.rms_norm_eps),
      self_attn(layers.attention(rt, p + ".self_attn", s,
                                 AttentionCore(s.checkpointing == Checkpointing::selective, s.attention == AttentionKernel::flash, s.context))),
      post_attention_layernorm(rt, p + ".post_attention_layernorm", s.n_embd, s.rms_norm_eps),
      mlp(layers.mlp(rt, p + ".mlp", s)),
      full_(s.checkpointing == Checkpointing::full),
      op_(s.checkpointing == Checkpointing::selective_op),
      layers_(layers) {
  self_attn->set_op_checkpointing(op_);
  mlp->set_op_checkpointing(op_);
}

std::vector<Parameter*> LlamaBlock::parameters() {
  std::vector<Parameter*> p = input_layernorm.parameters();
  for (Layer* l : std::initializer_list<Layer*>{self_attn.get(), &post_attention_layernorm, mlp.get()})
    for (Parameter* q : l->parameters()) p.push_back(q);
  return p;
}

void LlamaBlock::swap_saved(SavedState& s) {
  for (Layer* l : std::initializer_list<Layer*>{&input_layernorm, self_attn.get(), &post_attention_layernorm, mlp.get()}) l->swap_saved(s);
  s.swap(x_);
}

Tensor LlamaBlock::run_forward(Runtime& rt, const Tensor& x) {
  Tensor h = Block::residual_add(rt, x, self_attn->forward(rt, input_layernorm.forward(rt, x)));
  return Block::residual_add(rt, h, mlp->forward(rt, post_attention_layernorm.forward(rt, h)));
}

Tensor LlamaBlock::forward(Runtime& rt, const Tensor& x) {
  drop_at_.clear();  // LoRA's dropout (Llama itself has none): where its streams were, for the replay
  for (uint64_t* c : lora_streams({self_attn.get(), mlp.get()})) drop_at_.push_back(*c);
  Tensor y = run_forward(rt, x);
  if (full_) {  // keep the input only
    SavedState gone;
    gone.begin();
    for (Layer* l : std::initializer_list<Layer*>{&input_layernorm, self_attn.get(), &post_attention_layernorm, mlp.get()}) l->swap_saved(gone);
    x_ = x;
  }
  if (op_) {  // the kept outputs stay with their layers; the norms' saved inputs and the rest go
    SavedState gone;
    gone.begin();
    input_layernorm.swap_saved(gone);
    post_attention_layernorm.swap_saved(gone);
    self_attn->keep_ops();
    mlp->keep_ops();
    x_ = x;
  }
  return y;
}

Tensor LlamaBlock::backward(Runtime& rt, const Tensor& dout) {
  if (full_) {
    DL_ASSERT(x_.defined(), "LlamaBlock::backward under full checkpointing without a forward");
    const std::vector<uint64_t*> s = lora_streams({self_attn.get(), mlp.get()});
    std::vector<uint64_t> now;
    for (size_t i = 0; i < s.size(); i++) {
      now.push_back(*s[i]);
      *s[i] = drop_at_[i];
    }
    {
      RecomputeScope recompute(rt.trace);  // hardware FLOPs (HFU), not model FLOPs
      run_forward(rt, x_);  // the recompute: the layers save what their backward needs again
    }
    for (size_t i = 0; i < s.size(); i++) *s[i] = now[i];
    x_ = Tensor();
  }
  if (op_) {  // the recompute around the kept outputs: the norms, the residual stream and what was dropped
    DL_ASSERT(x_.defined(), "LlamaBlock::backward under op-level checkpointing without a forward");
    RecomputeScope recompute(rt.trace);
    Tensor h = Block::residual_add(rt, x_, self_attn->recompute(rt, input_layernorm.forward(rt, x_)));
    mlp->recompute(rt, post_attention_layernorm.forward(rt, h));
    x_ = Tensor();
  }
  Tensor dh = layers_.norm_backward(rt, post_attention_layernorm, mlp->backward(rt, dout));
  Block::residual_accumulate(rt, dh, dout);
  Tensor dx = layers_.norm_backward(rt, input_layernorm, self_attn->backward(rt, dh));
  Block::residual_accumulate(rt, dx, dh);
  return dx;
}

// ---- the model ----

Shape Llama::stream_shape(const Batch& b) const {
  if (layers_->sequence_parallel()) return {b.B * b.T / vocab_parts(), spec_.n_embd};  // this rank's rows
  return {b.B, b.T, spec_.n_embd};
}

Llama::Llama(Runtime& rt, const ModelSpec& s, int stage, int stages, const std::vector<int64_t>& layers_per_stage,
             std::unique_ptr<LlamaLayers> layers)
    : spec_(s),
      device_(rt.device),
      stage_(stage),
      stages_(stages),
      split_(layers != nullptr),
      layers_(layers ? std::move(layers) : std::make_unique<LlamaLayers>()) {
  if (s.dropout != 0)
    throw ConfigError(fmt::format("model.dropout {} with model.name \"llama\": LLaMA has no dropout", s.dropout), "set model.dropout = 0");
  const int t = vocab_parts();
  if (s.vocab_size % t != 0)
    throw ConfigError(fmt::format("model.vocab_size {} does not split over {} tensor-parallel ranks", s.vocab_size, t),
                      "pad model.vocab_size to a multiple of parallel.tp");
  std::tie(first_layer_, last_layer_) = stage_blocks(s.n_layer, stage, stages, layers_per_stage);
  if (first_stage()) {
    embed_tokens_ = make_parameter(rt, "model.embed_tokens.weight", {s.vocab_size / t, s.n_embd});
    if (t > 1) embed_tokens_.split_dim = 0;
  }
  for (int64_t i = first_layer_; i < last_layer_; i++)
    blocks_.push_back(std::make_unique<LlamaBlock>(rt, *layers_, fmt::format("model.layers.{}", i), s));
  if (last_stage()) {
    norm_ = std::make_unique<RMSNorm>(rt, "model.norm", s.n_embd, s.rms_norm_eps);
    lm_head_ = std::make_unique<Linear>(rt, "lm_head", s.n_embd, s.vocab_size / t, false);  // this rank's columns of the logits
    lm_head_->tp = layers_->vocab_slice();
    if (t > 1) lm_head_->weight.split_dim = 0;
  }
}

int Llama::vocab_parts() const { return layers_->vocab_group() ? layers_->vocab_group()->size() : 1; }

int64_t Llama::vocab_first() const {
  ProcessGroup* g = layers_->vocab_group();
  return g ? int64_t(g->rank()) * (spec_.vocab_size / g->size()) : 0;
}

std::string Llama::describe() const {
  const int64_t hd = spec_.n_embd / spec_.n_head;
  std::string d = fmt::format("  Llama(n_layer {}, n_head {}, n_kv_head {} (head size {}), n_embd {}, intermediate {}, vocab {}, RoPE θ {}, "
                              "RMSNorm eps {}; lm_head untied)\n",
                              spec_.n_layer, spec_.n_head, llama_kv_heads(spec_), hd, spec_.n_embd, llama_intermediate(spec_),
                              spec_.vocab_size, spec_.rope_theta, spec_.rms_norm_eps);
  if (spec_.attention == AttentionKernel::flash) d += "    attention: flash (FlashAttention-2's tiles)\n";
  if (spec_.checkpointing != Checkpointing::none) d += fmt::format("    activation checkpointing: {}\n", spec_.checkpointing);
  if (vocab_parts() > 1)
    d += fmt::format("    tensor parallel over {} ranks: {} query and {} kv heads per layer here, embed_tokens and lm_head rows {}..{}\n",
                     vocab_parts(), spec_.n_head / vocab_parts(), llama_kv_heads(spec_) / vocab_parts(), vocab_first(),
                     vocab_first() + spec_.vocab_size / vocab_parts());
  if (vocab_parts() > 1 && layers_->sequence_parallel())
    d += fmt::format("    sequence parallel: the residual stream and RMSNorms on this rank's 1/{} of the token rows; an all-gather before\n"
                     "    q, k, v and gate, up, a reduce-scatter after o_proj and down_proj, in place of the all-reduces\n",
                     vocab_parts());
  if (stages_ > 1)
    d += fmt::format("    pipeline stage {} of {}: {}layers {}..{}{}\n", stage_, stages_, first_stage() ? "embed_tokens, " : "", first_layer_,
                     last_layer_ - 1, last_stage() ? ", model.norm, lm_head" : "");
  return d;
}

std::vector<std::vector<Parameter*>> Llama::units() {
  std::vector<std::vector<Parameter*>> u;
  if (first_stage()) u.push_back({&embed_tokens_});
  for (auto& l : blocks_) u.push_back(l->parameters());
  if (last_stage()) {
    u.push_back({&norm_->weight});
    for (Parameter* p : lm_head_->parameters()) u.back().push_back(p);
  }
  return u;
}

void Llama::set_training(bool on) {
  for (Layer* l : layers()) set_training_tree(*l, on);
}

std::vector<Layer*> Llama::layers() {
  std::vector<Layer*> v;
  for (auto& b : blocks_) v.insert(v.end(), {b->self_attn.get(), b->mlp.get()});
  if (last_stage()) v.push_back(lm_head_.get());
  return v;
}

std::vector<Parameter*> Llama::parameters() {
  std::vector<Parameter*> p;
  for (auto& u : units())
    for (Parameter* q : u) p.push_back(q);
  return p;
}

void Llama::init(uint64_t seed) {
  if (split_ || stages_ > 1) {  // the whole model on the side (f32, its own accountant); this rank takes its part by name
    Runtime side(device_ == DeviceKind::meta ? DeviceKind::meta : DeviceKind::cpu);
    Llama whole(side, spec_);
    whole.init(seed);
    layers_->take_part(parameters(), whole.parameters());
    return;
  }
  Rng rng(seed);
  init_normal(embed_tokens_.data, rng, 0.02f);
  for (auto& l : blocks_) {
    l->input_layernorm.init(rng);
    l->post_attention_layernorm.init(rng);
    for (Parameter* p : l->self_attn->parameters()) init_normal(p->data, rng, 0.02f);
    for (Parameter* p : l->mlp->parameters()) init_normal(p->data, rng, 0.02f);
  }
  norm_->init(rng);
  init_normal(lm_head_->weight.data, rng, 0.02f);
}

void Llama::swap_saved(SavedState& s) {
  s.begin();
  s.swap(tokens_);
  s.swap(B_);
  s.swap(T_);
  for (auto& l : blocks_) l->swap_saved(s);
  if (norm_) {
    norm_->swap_saved(s);
    lm_head_->swap_saved(s);
    s.swap(xf_rows_);
  }
}

Tensor Llama::forward(Runtime& rt, const Batch& batch, ForwardHook* hook) {
  DL_ASSERT(stages_ == 1, "Llama::forward: a pipeline stage runs forward_stage");
  return forward_stage(rt, batch, Tensor(), hook);
}

void Llama::backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) {
  DL_ASSERT(stages_ == 1, "Llama::backward: a pipeline stage runs backward_stage");
  backward_stage(rt, dlogits, hook);
}

Tensor Llama::forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) {
  const int64_t B = batch.B, T = batch.T, C = spec_.n_embd, V = spec_.vocab_size;
  layers_->set_tokens(B, T);  // sequence parallel: the shape its gathers make
  int unit = 0;
  Tensor x;
  if (first_stage()) {
    if (hook) hook->before_forward(unit);
    if (int64_t(batch.tokens.size()) != B * T)
      throw ShapeError(fmt::format("embed_tokens got {} tokens for a batch of {} x {}", batch.tokens.size(), B, T));
    // this rank's tokens as rows of its slice, the others' as -1 (rows of zeros): the sum over the ranks
    // is the whole lookup (the vocabulary-parallel embedding, as GPT's)
    const int64_t first = vocab_first(), rows = V / vocab_parts();
    tokens_.resize(batch.tokens.size());
    for (size_t i = 0; i < batch.tokens.size(); i++) {
      const int32_t t = batch.tokens[i];
      if (!rt.is_meta() && (t < 0 || t >= V))
        throw DataError(fmt::format("token id {} is outside the vocabulary of {}", t, V), "raise model.vocab_size to cover the data's tokens");
      tokens_[i] = t >= first && t < first + rows ? int32_t(t - first) : -1;
    }
    x = rt.empty({B, T, C}, Category::activations, "output of embed_tokens", rt.dtype);
    if (device_16(rt, {&embed_tokens_.data})) {  // a device rank reads the 16-bit table as it is
      Indices ids(rt, tokens_);
      embedding_forward_16(rt, x.data(), ids.p, embed_tokens_.data.data(), nullptr, rt.dtype, B, T, C);
    } else {
      AsF32 o(rt, x, AsF32::out), e(rt, embed_tokens_.data);
      Indices ids(rt, tokens_);
      embedding_forward(rt, o.p, ids.p, e.p, nullptr, B, T, C);
      o.store();
    }
    layers_->sum(rt, x);  // (sequence parallel: this rank's rows of it)
    B_ = B;
    T_ = T;
    if (hook) hook->after_forward(unit);
    unit++;
  } else {
    x = input;
  }
  for (auto& l : blocks_) {
    if (hook) hook->before_forward(unit);
    x = l->forward(rt, x);
    if (hook) hook->after_forward(unit);
    unit++;
  }
  if (!last_stage()) return x;
  if (hook) hook->before_forward(unit);
  Tensor xf = norm_->forward(rt, x);                             // (B, T, C) (sequence parallel: its rows)
  const Tensor xf_all = layers_->whole_rows(rt, xf);             // sequence parallel: gathered
  Tensor logits = lm_head_->forward(rt, xf_all.view({B * T, C}));  // (B*T, V/t), in rt.dtype: this rank's vocabulary
  if (layers_->sequence_parallel()) {  // the rows are kept, not the gathered input: backward gathers it again
    xf_rows_ = xf;
    lm_head_->release_input();
  }
  if (hook) hook->after_forward(unit);
  return logits;
}

Tensor Llama::backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) {
  int unit = int(units().size()) - 1;
  Tensor d = dout;
  if (last_stage()) {
    if (hook) hook->before_layer_backward(unit);
    if (layers_->sequence_parallel()) {
      lm_head_->keep_input(rt, layers_->whole_rows(rt, xf_rows_).view({dout.size(0), spec_.n_embd}));
      xf_rows_ = Tensor();
    }
    Tensor dxf = lm_head_->backward(rt, dout);  // (B*T, C): this rank's vocabulary's term
    layers_->sum(rt, dxf);                      // every rank's (Megatron's f before the head; sequence parallel: its rows)
    d = layers_->norm_backward(rt, *norm_, dxf);  // (B, T, C)
    if (hook) hook->after_layer_backward(unit, units().back());
    unit--;
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (hook) hook->before_layer_backward(unit);
    d = blocks_[i]->backward(rt, d);
    if (hook) hook->after_layer_backward(unit, blocks_[i]->parameters());
    unit--;
  }
  if (!first_stage()) return d;
  if (hook) hook->before_layer_backward(0);
  d = layers_->whole_rows(rt, d);     // sequence parallel: every rank's rows, as each rank's lookup read them all
  if (embed_tokens_.requires_grad) {  // frozen under LoRA: nothing to compute
    AsF32 de(rt, embed_tokens_.grad_for_accumulate(), AsF32::inout), dy(rt, d);
    Indices ids(rt, tokens_);
    embedding_backward(rt, de.p, nullptr, dy.p, ids.p, B_, T_, spec_.n_embd);
    de.store();
  }
  tokens_.clear();
  if (hook) hook->after_layer_backward(0, {&embed_tokens_});
  return Tensor();
}

}  // namespace distlab
