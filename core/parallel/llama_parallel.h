// LLaMA split for tensor parallelism (Megatron-LM's scheme, as core/parallel/gpt_parallel.h does for GPT),
// over a TP group of t ranks, under Hugging Face's names:
//   self_attn.q_proj (C, C)        rows split: this rank's H/t query heads
//   self_attn.k_proj, v_proj       rows split: this rank's KV/t kv heads (t must divide n_kv_head)
//   self_attn.o_proj (C, C)        columns split: the inputs its heads produced            row-parallel
//   mlp.gate_proj, up_proj (I, C)  rows split                                                column-parallel
//   mlp.down_proj (C, I)           columns split                                             row-parallel
//   embed_tokens, lm_head (V, C)   rows split: this rank's vocabulary (the loss: vocab-parallel)
//   the RMSNorms                   whole on every rank
// Per layer: one all-reduce of (B, T, C) forward in o_proj and one in down_proj; one backward for x's
// gradient from q, k and v together, one from gate and up — the same four as GPT's block. Read first:
// core/models/llama.h (the model), core/parallel/tensor_parallel.h (the row-parallel layer, the loss).
#pragma once
#include "core/models/llama.h"
#include "core/parallel/tensor_parallel.h"

namespace distlab {

class TensorParallelLlamaLayers : public LlamaLayers {
 public:
  explicit TensorParallelLlamaLayers(ProcessGroup& tp) : tp_(tp) {}
  std::unique_ptr<LlamaAttention> attention(Runtime& rt, const std::string& prefix, const ModelSpec& s, AttentionCore core) override;
  std::unique_ptr<LlamaMLP> mlp(Runtime& rt, const std::string& prefix, const ModelSpec& s) override;
  ProcessGroup* vocab_group() override { return &tp_; }
  void sum(Runtime& rt, Tensor& x) override { all_reduce_tensor(rt, tp_, x); }
  void take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole) override {
    load_split_params(local, whole, tp_.rank(), tp_.size());
  }

 private:
  ProcessGroup& tp_;
};

}  // namespace distlab
