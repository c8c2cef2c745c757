// GPT-2: token + position embedding, L pre-norm transformer blocks, a final LayerNorm, and an lm_head
// tied to the token embedding. Backward is the forward read in reverse, block by block.
//
// The same class is every rank's model in a split run: built as pipeline stage s of p it holds blocks
// [first, last) (the first stage also the embeddings, the last ln_f and the lm_head), and built with a
// GptLayers other than the default its attention, MLP and embedding are what that puts in their place —
// core/parallel/gpt_parallel.h puts Megatron's tensor-parallel layers there (picotron's
// apply_tensor_parallel, at construction, so a rank never holds the whole layers).
#pragma once
#include <memory>

#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/models/zoo.h"
#include "core/nn/attention.h"
#include "core/nn/embedding.h"
#include "core/nn/norm.h"
#include "core/nn/simple.h"

namespace distlab {

// What a GPT's replaceable layers are built from. This default builds nn's whole layers; a split run
// (gpt_parallel.h) overrides every call.
class GptLayers {
 public:
  virtual ~GptLayers() = default;
  // causal self-attention over C with n_head heads: "<prefix>.c_attn", "<prefix>.c_proj"; `core` says what
  // its attention core keeps for backward (core/nn/attention.h)
  virtual std::unique_ptr<Layer> attention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, AttentionCore core);
  virtual std::unique_ptr<Layer> mlp_up(Runtime& rt, const std::string& prefix, int64_t C, int64_t hidden);    // c_fc: C -> hidden
  virtual std::unique_ptr<Layer> mlp_down(Runtime& rt, const std::string& prefix, int64_t hidden, int64_t C);  // c_proj: hidden -> C
  virtual std::unique_ptr<TokenEmbedding> embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C);
  // The group the vocabulary is split over (nullptr: whole); the lm_head then holds V/t rows of wte.
  virtual ProcessGroup* vocab_group() { return nullptr; }
  // The gradient of the lm_head's input, one term per rank of vocab_group(): summed here (sequence
  // parallel: dx becomes this rank's rows of the sum).
  virtual void sum_over_vocab(Runtime& rt, Tensor& dx) {}
  // Sequence parallel (core/parallel/tensor_parallel.h): the residual stream between the split layers is
  // this rank's rows of it; the model tells the layers its micro-batch's B and T before each forward.
  virtual bool sequence_parallel() const { return false; }
  virtual void set_tokens(int64_t B, int64_t T) {}
  // x as the lm_head reads it: whole (sequence parallel: every rank's rows gathered)
  virtual Tensor whole_rows(Runtime& rt, const Tensor& x) { return x; }
  // A LayerNorm's backward (sequence parallel: its weight's and bias's gradients summed over the rows' ranks)
  virtual Tensor norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) { return norm.backward(rt, dout); }
  // The dropout stream a layer on the residual stream draws from (sequence parallel: each rank's own rows,
  // each rank its own stream, as Megatron's tensor-parallel RNG)
  virtual uint64_t stream_seed(uint64_t seed) { return seed; }
  // This rank's part of every parameter, taken from a whole model's (by name): how a split model starts
  // from the whole one's initial weights. The default copies whole parameters.
  virtual void take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole);
};

// Which blocks stage `stage` of `stages` holds: [first, last). ConfigError when the stages do not divide
// the blocks (`layers`: blocks per stage, explicit; empty: L/p each).
std::pair<int64_t, int64_t> stage_blocks(int64_t n_layer, int stage, int stages, const std::vector<int64_t>& layers = {});

// x -> x + attn(ln_1(x)) -> h + mlp(ln_2(h)), with mlp = c_proj(gelu(c_fc(.)))
//
// Activation checkpointing (spec.checkpointing, Chen et al. 2016 "Training Deep Nets with Sublinear Memory
// Cost"; PyTorch's torch.utils.checkpoint around each block):
//   full       forward runs the block, keeps only its input x (B, T, C) and its dropout streams' positions,
//              and frees everything its layers saved; backward first reruns the forward from x with the
//              same dropout draws (PyTorch's preserve_rng_state), then runs the ordinary backward. The
//              recomputed activations equal the first ones bit for bit, so the gradients do too — the
//              price is one more forward per block (~1/3 more compute for a transformer).
//   selective  the block runs as usual; its attention core drops the probabilities (AttentionCore).
struct Block {
  Block(Runtime& rt, GptLayers& layers, const std::string& prefix, const ModelSpec& s, uint64_t dropout_seed);
  Tensor forward(Runtime& rt, const Tensor& x);    // (B, T, C) -> (B, T, C)
  Tensor backward(Runtime& rt, const Tensor& dout);  // (recomputes the forward first under full checkpointing)
  std::vector<Parameter*> parameters();
  void init(Rng& rng, int64_t n_layer);  // a whole block's (nn's layers)
  void set_training(bool on);
  void swap_saved(SavedState& s);
  LayerNorm ln_1;
  std::unique_ptr<Layer> attn;  // CausalSelfAttention, or what GptLayers put there
  LayerNorm ln_2;
  std::unique_ptr<Layer> c_fc, c_proj;  // "mlp.c_fc", "mlp.c_proj"
  GELU gelu;
  Dropout drop_attn, drop_mlp;
  static Tensor residual_add(Runtime& rt, const Tensor& x, const Tensor& branch);  // x + branch
  static void residual_accumulate(Runtime& rt, Tensor& d, const Tensor& g);         // d += g

 private:
  Tensor run_forward(Runtime& rt, const Tensor& x);  // the layers, each saving what its backward needs
  Tensor fc_gelu(Runtime& rt, const Tensor& x);     // mlp.c_fc and GELU (one GEMM where the device fuses them)
  void drop_saved();                                 // frees what the layers saved
  bool full_;                  // full checkpointing
  Tensor x_;                   // full: the block's input, all it keeps for backward
  std::vector<uint64_t*> streams();  // drop_attn's, drop_mlp's and the LoRA adapters' dropout draws
  std::vector<int64_t> drop_at_;     // full: each stream's draws before the forward
  GptLayers& layers_;                // the norms' backward (sequence parallel sums their gradients)
};

class GPT : public Model {
 public:
  // The whole model (one stage, nn's layers), or stage `stage` of `stages` built from `layers`.
  GPT(Runtime& rt, const ModelSpec& spec, int stage = 0, int stages = 1, const std::vector<int64_t>& blocks_per_stage = {},
      std::unique_ptr<GptLayers> layers = nullptr);
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;
  // this stage's: the embeddings, its blocks, ln_f (+ the lm_head's copy of wte on a last stage that is not the first)
  std::vector<std::vector<Parameter*>> units() override;
  std::vector<Layer*> layers() override;  // each block's attn (c_attn, c_proj), mlp.c_fc, mlp.c_proj
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;  // tokens (B*T) -> logits (B*T, V/t)
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  // One stage: (B, T, C) from the stage before (the tokens of `batch` on the first) -> (B, T, C), or the
  // logits (B*T, V/t) on the last
  Tensor forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) override;
  Tensor backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) override;
  void swap_saved(SavedState& s) override;
  Shape stage_input_shape(const Batch& b) override { return stream_shape(b); }
  Shape stage_output_shape(const Batch& b) override { return stream_shape(b); }
  void set_training(bool on) override;
  // GPT-2's initialisation; a split model takes its part of the whole model's (built whole on the side)
  void init(uint64_t seed) override;
  std::vector<uint64_t*> rng_streams() override;
  ProcessGroup* tp_group() override { return layers_->vocab_group(); }
  int64_t vocab_first() const override;
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  // the tied pair across stages: wte on the first stage, its copy on the last (nullptr elsewhere, and
  // when one stage holds both)
  Parameter* tied_embedding();
  std::vector<std::unique_ptr<Block>>& blocks() { return h_; }
  GptLayers& split_layers() { return *layers_; }  // what built the blocks (gpt_parallel.h's, when split)

 private:
  Parameter& head() { return first_stage() ? emb_->wte : lm_head_; }
  // the residual stream a rank holds: (B, T, C), or its rows under sequence parallel
  Shape stream_shape(const Batch& b);
  int vocab_parts() const { return layers_->vocab_group() ? layers_->vocab_group()->size() : 1; }
  ModelSpec spec_;
  DeviceKind device_;
  int stage_, stages_;
  int64_t first_block_, last_block_;
  bool split_;                         // built from GptLayers other than the default
  std::unique_ptr<GptLayers> layers_;
  std::unique_ptr<TokenEmbedding> emb_;  // the first stage's
  Dropout drop_;
  std::vector<std::unique_ptr<Block>> h_;
  std::unique_ptr<LayerNorm> ln_f_;  // the last stage's
  Parameter lm_head_;                // the last stage's copy of wte (when it is not also the first)
  Tensor saved_xf_;                  // ln_f output (B, T, C), the lm_head's input (sequence parallel: this rank's rows)
};

}  // namespace distlab
