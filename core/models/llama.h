// LLaMA (Touvron et al. 2023; the Llama 3 shapes of Grattafiori et al. 2024), as Hugging Face's
// LlamaForCausalLM names and lays out its weights, so that they move through safetensors:
//   model.embed_tokens.weight (V, C)                       no position table: RoPE turns q and k instead
//   model.layers.N.input_layernorm.weight (C)              RMSNorm, pre-norm
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight         q (C, C), k and v (KV·hd, C): grouped-query heads
//   model.layers.N.post_attention_layernorm.weight (C)
//   model.layers.N.mlp.{gate,up,down}_proj.weight          SwiGLU: (I, C), (I, C), (C, I)
//   model.norm.weight (C), lm_head.weight (V, C)           an untied output head
// No biases, no dropout. Built as pipeline stage s of p it holds layers [first, last) (the first stage also
// embed_tokens, the last model.norm and lm_head), like core/models/gpt.h's GPT, whose structure it follows:
// read that first; built from core/parallel/llama_parallel.h's layers, a rank holds its heads, MLP rows and
// vocabulary (Megatron's split, as GPT's).
#pragma once
#include <memory>

#include "core/models/model.h"
#include "core/models/zoo.h"
#include "core/nn/llama.h"

namespace distlab {

class ProcessGroup;

// What a Llama's layers are built from (GPT's GptLayers, for Llama): this default builds whole layers; a
// tensor-parallel run (core/parallel/llama_parallel.h) builds a rank's heads, rows and vocabulary.
class LlamaLayers {
 public:
  virtual ~LlamaLayers() = default;
  virtual std::unique_ptr<LlamaAttention> attention(Runtime& rt, const std::string& prefix, const ModelSpec& s, AttentionCore core);
  virtual std::unique_ptr<LlamaMLP> mlp(Runtime& rt, const std::string& prefix, const ModelSpec& s);
  // The group the vocabulary is split over (nullptr: whole): embed_tokens and lm_head then hold V/t rows
  virtual ProcessGroup* vocab_group() { return nullptr; }
  // Sums x over vocab_group() (an all-reduce): the embedding's output, the lm_head's input gradient
  // (sequence parallel: a reduce-scatter, x becomes this rank's rows of the sum)
  virtual void sum(Runtime& rt, Tensor& x) {}
  // Sequence parallel (core/parallel/tensor_parallel.h), as GptLayers': the stream between the split layers
  // is this rank's rows; the model says its micro-batch's B and T before each forward; the lm_head reads the
  // rows gathered whole; the RMSNorms' gradients are summed over the rows' ranks.
  virtual bool sequence_parallel() const { return false; }
  // lm_head's place in the vocabulary split: its rows (a LoRA adapter on it splits B with them)
  virtual TpSlice vocab_slice() { return TpSlice(); }
  virtual void set_tokens(int64_t B, int64_t T) {}
  virtual Tensor whole_rows(Runtime& rt, const Tensor& x) { return x; }
  virtual Tensor norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) { return norm.backward(rt, dout); }
  // This rank's part of every parameter, from a whole model's (by name); the default copies
  virtual void take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole);
};

// x -> h = x + self_attn(input_layernorm(x)) -> h + mlp(post_attention_layernorm(h)); activation
// checkpointing as GPT's Block (gpt.h): full keeps the input and reruns the forward in backward.
// selective_op is torchtitan's op-level policy (its default for Llama 3): the block keeps its input, the
// outputs of its 1st, 3rd, 5th and 7th matmuls (q_proj, v_proj, gate_proj, down_proj) and the attention's,
// and backward recomputes the rest from them — the norms, k_proj, RoPE, o_proj, up_proj, SwiGLU — before
// the ordinary backward. Per block, 8B's shapes: 15.5 sbh bytes kept, against ~37 sbh without checkpointing.
struct LlamaBlock {
  LlamaBlock(Runtime& rt, LlamaLayers& layers, const std::string& prefix, const ModelSpec& s);
  Tensor forward(Runtime& rt, const Tensor& x);  // (B, T, C) -> (B, T, C)
  Tensor backward(Runtime& rt, const Tensor& dout);
  std::vector<Parameter*> parameters();
  void swap_saved(SavedState& s);
  RMSNorm input_layernorm;
  std::unique_ptr<LlamaAttention> self_attn;
  RMSNorm post_attention_layernorm;
  std::unique_ptr<LlamaMLP> mlp;

 private:
  Tensor run_forward(Runtime& rt, const Tensor& x);
  bool full_, op_;
  LlamaLayers& layers_;  // the norms' backward (sequence parallel sums their gradients)
  Tensor x_;  // full and op-level checkpointing: the input
  std::vector<uint64_t> drop_at_;  // full: the LoRA adapters' dropout draws before the forward
};

class Llama : public Model {
 public:
  // The whole model, or stage `stage` of `stages` built from `layers` (nullptr: whole layers)
  Llama(Runtime& rt, const ModelSpec& spec, int stage = 0, int stages = 1, const std::vector<int64_t>& layers_per_stage = {},
        std::unique_ptr<LlamaLayers> layers = nullptr);
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;
  // this stage's: embed_tokens, each layer, then model.norm with lm_head
  std::vector<std::vector<Parameter*>> units() override;
  std::vector<Layer*> layers() override;  // each block's self_attn and mlp, the lm_head
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;  // tokens (B*T) -> logits (B*T, V)
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  Tensor forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) override;
  Tensor backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) override;
  void swap_saved(SavedState& s) override;
  Shape stage_input_shape(const Batch& b) override { return stream_shape(b); }
  Shape stage_output_shape(const Batch& b) override { return stream_shape(b); }
  void set_training(bool on) override;  // LoRA's dropout only: Llama has none of its own
  std::vector<uint64_t*> rng_streams() override { return lora_streams(layers()); }
  // Hugging Face's _init_weights: every Linear and the embedding N(0, 0.02), the RMSNorms 1. A stage takes
  // its part of the whole model's (built whole on the side), so every split starts from the same weights.
  void init(uint64_t seed) override;
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  ProcessGroup* tp_group() override { return layers_->vocab_group(); }
  int64_t vocab_first() const override;

 private:
  int vocab_parts() const;
  Shape stream_shape(const Batch& b) const;  // (B, T, C), or this rank's rows of it under sequence parallel
  ModelSpec spec_;
  DeviceKind device_;
  int stage_, stages_;
  int64_t first_layer_, last_layer_;
  bool split_;
  std::unique_ptr<LlamaLayers> layers_;
  Parameter embed_tokens_;                       // the first stage's (V/t rows when the vocabulary is split)
  std::vector<int32_t> tokens_;                  // its last batch's tokens as rows of embed_tokens (-1: another rank's)
  int64_t B_ = 0, T_ = 0;
  std::vector<std::unique_ptr<LlamaBlock>> blocks_;
  std::unique_ptr<RMSNorm> norm_;                // the last stage's
  std::unique_ptr<Linear> lm_head_;              // the last stage's (V/t rows when the vocabulary is split)
  Tensor xf_rows_;                               // sequence parallel: model.norm's output rows, gathered again for lm_head's backward
};

// Hugging Face's LlamaConfig defaults where a spec leaves them 0: n_kv_head = n_head; intermediate size
// the original's 2·4C/3 rounded up to a multiple of 256
int64_t llama_kv_heads(const ModelSpec& s);
int64_t llama_intermediate(const ModelSpec& s);
// Every parameter: V·C (embed_tokens) + L·(2C + C·C + 2·C·KV·hd + C·C + 3·C·I) + C + V·C (lm_head)
int64_t llama_params_exact(const ModelSpec& s);

}  // namespace distlab
