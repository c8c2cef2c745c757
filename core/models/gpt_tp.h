// GPT-2 with Megatron-LM's tensor parallelism over a TP group of t ranks: the same model as gpt.h, layer
// for layer and name for name, with every large matrix split —
//
//   wte (V, C)           rows split: rank r holds the vocabulary [r·V/t, (r+1)·V/t)     VocabParallelEmbedding
//   attn.c_attn (3C, C)  rows split, its heads of q, k and v                          column-parallel
//   attn.c_proj (C, C)   columns split (the inputs its heads produced)                row-parallel
//   mlp.c_fc (4C, C)     rows split                                                   column-parallel
//   mlp.c_proj (C, 4C)   columns split                                                row-parallel
//   lm_head = wte        this rank's V/t columns of the logits                        VocabParallelCrossEntropy
//   LayerNorms, wpe, the row-parallel biases: whole on every rank (the same values, the same gradients)
//
// Per block: one all-reduce of (B, T, C) in the forward of attention and one of the MLP, one each in the
// backward — 4 per block per micro-batch, plus the embedding's and the lm_head's. The weights, qkv, the
// attention probabilities and the MLP's hidden activations (B, T, 4C) are 1/t per rank; the residual
// stream and the LayerNorms' activations are whole (sequence parallel would split those too).
//
// It starts from the whole model's initial weights (built and initialised whole, then sliced), so with the
// same seed it trains like gpt.h on one rank: the losses agree to fp32 rounding (tests/test_tp_train.cpp).
// Read next: core/parallel/tensor_parallel.h (the layers), core/train/trainer.cpp (the vocab-parallel loss).
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
  LayerNorm ln_1;
  ParallelSelfAttention attn;
  LayerNorm ln_2;
  ColumnParallelLinear c_fc;  // C -> 4C/t
  GELU gelu;
  RowParallelLinear c_proj;   // 4C/t -> C, all-reduced
  Dropout drop_attn, drop_mlp;
};

class TensorParallelGPT : public Model {
 public:
  TensorParallelGPT(Runtime& rt, ProcessGroup& tp, const ModelSpec& spec);
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;          // gpt.h's names and order; this rank's slices
  std::vector<std::vector<Parameter*>> units() override;  // embeddings, block 0..L-1, ln_f
  // tokens (B*T) -> logits (B*T, V/t): this rank's columns of the vocabulary, from vocab_first()
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  void set_training(bool on) override;
  // The whole GPT's initial weights for `seed` (built whole on the side, then this rank's slices taken).
  void init(uint64_t seed) override;
  std::vector<uint64_t*> rng_streams() override;
  ProcessGroup* tp_group() override { return &tp_; }
  int64_t vocab_first() const override { return emb_.first; }

 private:
  ProcessGroup& tp_;
  ModelSpec spec_;
  DeviceKind device_;
  VocabParallelEmbedding emb_;
  Dropout drop_;
  std::vector<std::unique_ptr<ParallelBlock>> h_;
  LayerNorm ln_f_;
  Tensor saved_xf_;  // ln_f output (B, T, C), the lm_head's input
};

}  // namespace distlab
