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
  // `sequence_parallel`: Megatron's SP on top (tensor_parallel.h), as GPT's TensorParallelLayers
  explicit TensorParallelLlamaLayers(ProcessGroup& tp, bool sequence_parallel = false) : tp_(tp), stream_(tp, sequence_parallel) {}
  std::unique_ptr<LlamaAttention> attention(Runtime& rt, const std::string& prefix, const ModelSpec& s, AttentionCore core) override;
  std::unique_ptr<LlamaMLP> mlp(Runtime& rt, const std::string& prefix, const ModelSpec& s) override;
  ProcessGroup* vocab_group() override { return &tp_; }
  void sum(Runtime& rt, Tensor& x) override { stream_.sum(rt, x, "the stream"); }
  bool sequence_parallel() const override { return stream_.on(); }
  TpSlice vocab_slice() override { return tp_slice(tp_, 0, 1); }
  void set_tokens(int64_t B, int64_t T) override { stream_.set_tokens(B, T); }
  Tensor whole_rows(Runtime& rt, const Tensor& x) override { return stream_.whole(rt, x, "the stream"); }
  Tensor norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) override { return stream_.norm_backward(rt, norm, dout); }
  void take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole) override {
    load_split_params(local, whole, tp_.rank(), tp_.size());
  }

 private:
  // x's way in and its gradient's way out of the split attention and MLP: whole and all-reduced, or (SP)
  // this rank's rows gathered and the gradient reduce-scattered back to them
  InputGather gather(const std::string& what);
  InputGradSum input_grad_sum(const std::string& what);
  ProcessGroup& tp_;
  StreamSplit stream_;  // whole, or this rank's rows (sequence parallel)
};

}  // namespace distlab
