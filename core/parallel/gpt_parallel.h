// GPT-2 split for 3D parallelism: Megatron-LM's tensor parallelism inside each layer, over a TP group of t
// ranks, and pipeline stages of consecutive blocks, over p ranks. The same model as gpt.h, name for name.
//
// Tensor parallel (core/parallel/tensor_parallel.h):
//   wte (V, C)           rows split: rank r holds the vocabulary [r·V/t, (r+1)·V/t)     VocabParallelEmbedding
//   attn.c_attn (3C, C)  rows split, its heads of q, k and v                          column-parallel
//   attn.c_proj (C, C)   columns split (the inputs its heads produced)                row-parallel
//   mlp.c_fc (4C, C)     rows split                                                   column-parallel
//   mlp.c_proj (C, 4C)   columns split                                                row-parallel
//   lm_head = wte        this rank's V/t columns of the logits                        VocabParallelCrossEntropy
//   LayerNorms, wpe, the row-parallel biases: whole on every rank (the same values, the same gradients)
// Per block: one all-reduce of (B, T, C) in the forward of attention and one of the MLP, one each in the
// backward — 4 per block per micro-batch, plus the embedding's and the lm_head's. The weights, qkv, the
// attention probabilities and the MLP's hidden activations (B, T, 4C) are 1/t per rank; the residual
// stream and the LayerNorms' activations are whole (sequence parallel would split those too).
//
// Pipeline stages (core/parallel/pipeline.h): stage s of p holds blocks [s·L/p, (s+1)·L/p); the first also
// the embeddings, the last ln_f and the lm_head. The lm_head is tied to wte, which lives on the first stage:
// the last keeps a copy ("lm_head.weight", Parameter::tied), initialised equal, whose gradient is summed
// with wte's after each step's backward (Megatron's embedding group) — so both take the same step.
//
// It starts from the whole model's initial weights (built and initialised whole, then sliced), so with the
// same seed it trains like gpt.h on one rank: the losses agree to fp32 rounding (tests/test_tp_train.cpp,
// tests/test_pipeline.cpp). Read next: core/parallel/pipeline.h (the schedules that drive the stages).
#pragma once
#include "core/models/gpt.h"
#include "core/parallel/tensor_parallel.h"

namespace distlab {

// x -> x + attn(ln_1(x)) -> h + mlp(ln_2(h)), the heads and the MLP's hidden units split over the group
struct ParallelBlock {
  ParallelBlock(Runtime& rt, ProcessGroup& tp, const std::string& prefix, const ModelSpec& s, uint64_t dropout_seed);
  Tensor forward(Runtime& rt, const Tensor& x);  // (B, T, C) -> (B, T, C), whole on every rank
  Tensor backward(Runtime& rt, const Tensor& dout);
  std::vector<Parameter*> parameters();
  void set_training(bool on);
  void swap_saved(SavedState& s);
  LayerNorm ln_1;
  ParallelSelfAttention attn;
  LayerNorm ln_2;
  ColumnParallelLinear c_fc;  // C -> 4C/t
  GELU gelu;
  RowParallelLinear c_proj;   // 4C/t -> C, all-reduced
  Dropout drop_attn, drop_mlp;
};

// Which blocks stage `stage` of `stages` holds: [first, last). ConfigError when the stages do not divide
// the blocks (`layers`: blocks per stage, explicit; empty: L/p each).
std::pair<int64_t, int64_t> stage_blocks(int64_t n_layer, int stage, int stages, const std::vector<int64_t>& layers = {});

// The model this rank holds in a run split `tp` ways (tensor parallel) and into `stages` (pipeline):
// stage `stage`'s layers of an mlp or cifar_cnn (zoo.h's build_sequential_stage), ParallelGPT for gpt,
// the whole model (zoo.h's build_model) when nothing is split. Other models refuse tensor parallelism.
std::unique_ptr<Model> build_split_model(Runtime& rt, const ModelSpec& spec, ProcessGroup* tp, int stage, int stages,
                                         const std::vector<int64_t>& layers = {});

class ParallelGPT : public Model {
 public:
  // `tp` may have one rank (no tensor parallelism); stage `stage` of `stages` (1: the whole model)
  ParallelGPT(Runtime& rt, ProcessGroup& tp, const ModelSpec& spec, int stage = 0, int stages = 1,
              const std::vector<int64_t>& layers = {});
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;          // gpt.h's names and order; this rank's slices of this stage's
  std::vector<std::vector<Parameter*>> units() override;  // this stage's: embeddings, its blocks, ln_f (+ the lm_head copy)
  // The whole model (one stage): tokens (B*T) -> logits (B*T, V/t), this rank's columns of the vocabulary
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  // One stage: (B, T, C) from the stage before (the tokens of `batch` on the first) -> (B, T, C), or the
  // logits (B*T, V/t) on the last
  Tensor forward_stage(Runtime& rt, const Batch& batch, const Tensor& input, ForwardHook* hook) override;
  Tensor backward_stage(Runtime& rt, const Tensor& dout, BackwardHook* hook) override;
  void swap_saved(SavedState& s) override;
  Shape stage_input_shape(const Batch& b) override { return {b.B, b.T, spec_.n_embd}; }
  Shape stage_output_shape(const Batch& b) override { return {b.B, b.T, spec_.n_embd}; }
  void set_training(bool on) override;
  // The whole GPT's initial weights for `seed` (built whole on the side, then this rank's part taken).
  void init(uint64_t seed) override;
  std::vector<uint64_t*> rng_streams() override;
  ProcessGroup* tp_group() override { return &tp_; }
  int64_t vocab_first() const override { return int64_t(tp_.rank()) * (spec_.vocab_size / tp_.size()); }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  // the tied pair across stages: wte on the first stage, its copy on the last (nullptr elsewhere, and
  // when one stage holds both)
  Parameter* tied_embedding();
  // Every block's column- and row-parallel layers through `k` (replaced arithmetic: tensor_parallel.h); nullptr: their own.
  void set_tp_kernels(TpKernels* k);

 private:
  Parameter& head() { return first_stage() ? emb_->wte : lm_head_; }
  ProcessGroup& tp_;
  ModelSpec spec_;
  DeviceKind device_;
  int stage_, stages_;
  int64_t first_block_, last_block_;
  std::unique_ptr<VocabParallelEmbedding> emb_;  // the first stage's
  Dropout drop_;
  std::vector<std::unique_ptr<ParallelBlock>> h_;
  std::unique_ptr<LayerNorm> ln_f_;  // the last stage's
  Parameter lm_head_;                // the last stage's copy of wte (when it is not also the first)
  Tensor saved_xf_;                  // ln_f output (B, T, C), the lm_head's input
};

}  // namespace distlab
