// GPT-2 split for 3D parallelism: Megatron-LM's tensor parallelism inside each layer, over a TP group of t
// ranks, and pipeline stages of consecutive blocks, over p ranks. It is gpt.h's GPT, name for name, built as
// a stage (GPT's own constructor) from the layers below in place of nn's (picotron's apply_tensor_parallel):
// the blocks, their order and the hooks are GPT's; only what each layer computes and sends differs.
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
// It starts from the whole model's initial weights (built and initialised whole, then sliced: take_part), so with the
// same seed it trains like gpt.h on one rank: the losses agree to fp32 rounding (tests/test_tp_train.cpp,
// tests/test_pipeline.cpp). Read next: core/parallel/pipeline.h (the schedules that drive the stages).
#pragma once
#include "core/models/gpt.h"
#include "core/parallel/tensor_parallel.h"

namespace distlab {

// GPT's replaceable layers split over `tp` (a group of one rank when the run has pipeline stages alone:
// the same layers, so a stage computes exactly as it does beside tensor parallelism).
class TensorParallelLayers : public GptLayers {
 public:
  // `sequence_parallel`: Megatron's SP on top (tensor_parallel.h): the residual stream, the LayerNorms and
  // the dropouts on this rank's rows, all-gather and reduce-scatter in place of the all-reduces
  explicit TensorParallelLayers(ProcessGroup& tp, bool sequence_parallel = false) : tp_(tp), stream_(tp, sequence_parallel) {}
  std::unique_ptr<Layer> attention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, AttentionCore core) override;  // heads split
  std::unique_ptr<Layer> mlp_up(Runtime& rt, const std::string& prefix, int64_t C, int64_t hidden) override;    // column-parallel
  std::unique_ptr<Layer> mlp_down(Runtime& rt, const std::string& prefix, int64_t hidden, int64_t C) override;  // row-parallel
  std::unique_ptr<TokenEmbedding> embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C) override;
  ProcessGroup* vocab_group() override { return &tp_; }
  void sum_over_vocab(Runtime& rt, Tensor& dx) override { stream_.sum(rt, dx, "grad of ln_f output"); }
  bool sequence_parallel() const override { return stream_.on(); }
  void set_tokens(int64_t B, int64_t T) override { stream_.set_tokens(B, T); }
  Tensor whole_rows(Runtime& rt, const Tensor& x) override { return stream_.whole(rt, x, "ln_f output"); }
  Tensor norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) override { return stream_.norm_backward(rt, norm, dout); }
  uint64_t stream_seed(uint64_t seed) override { return stream_.on() ? seed ^ (0x9E3779B97F4A7C15ULL * uint64_t(tp_.rank() + 1)) : seed; }
  void take_part(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole) override {
    load_split_params(local, whole, tp_.rank(), tp_.size());
  }
  // the norms' gradient sums under sequence parallel through `k` (set_tp_kernels below)
  void set_kernels(TpKernels* k) { stream_.set_kernels(k); }

 private:
  const SeqParallel* sp() const { return stream_.sp(); }
  ProcessGroup& tp_;
  StreamSplit stream_;  // whole, or this rank's rows (sequence parallel)
};

// The model this rank holds in a run split `tp` ways (tensor parallel) and into `stages` (pipeline):
// stage `stage`'s layers of an mlp or cifar_cnn (zoo.h's build_sequential_stage), a GPT built from
// TensorParallelLayers for gpt, the whole model (zoo.h's build_model) when nothing is split. Other models
// refuse tensor parallelism.
std::unique_ptr<Model> build_split_model(Runtime& rt, const ModelSpec& spec, ProcessGroup* tp, int stage, int stages,
                                         const std::vector<int64_t>& layers = {});

// Every block's column- and row-parallel layers of a split GPT through `k` (replaced arithmetic:
// tensor_parallel.h's TpKernels), and under sequence parallel the LayerNorms' gradient sums; nullptr: their own.
void set_tp_kernels(GPT& gpt, TpKernels* k);

}  // namespace distlab
