// LLaMA's layers, under Hugging Face's LlamaForCausalLM names (model.layers.N.self_attn.q_proj.weight ...),
// so that weights move through safetensors: RMSNorm, the attention with rotary positions and grouped-query
// heads, and the SwiGLU MLP. No biases anywhere. The kernels are core/ops/cpu/llama.h's; the attention core
// is GPT's (core/nn/attention.h), fed by repeat_kv.
#pragma once
#include <functional>
#include <memory>

#include "core/nn/attention.h"
#include "core/nn/linear.h"

namespace distlab {

// LlamaRMSNorm: y = x / sqrt(mean(x²) + eps) · weight, the statistics in f32
class RMSNorm : public Layer {
 public:
  RMSNorm(Runtime& rt, const std::string& prefix, int64_t C, float eps);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (..., C) -> (..., C)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override { return {&weight}; }
  void init(Rng& rng) override { weight.data.fill_(1.0f); }
  void swap_saved(SavedState& s) override {
    s.swap(saved_x_);
    s.swap(rstd_);
    s.swap(eager_f32_);
  }
  Parameter weight;  // (C)

 private:
  int64_t C_;
  float eps_;
  Tensor saved_x_, rstd_;
  Tensor eager_f32_;  // rt.eager_ops has rmsnorm: what eager PyTorch keeps beyond this kernel's (counted, never used)
};

// The sum of a split layer's input gradient over the tensor-parallel group (an all-reduce: Megatron's f),
// given by core/parallel/llama_parallel.h; empty for a whole layer.
using InputGradSum = std::function<void(Runtime&, Tensor&)>;
// Sequence parallel (core/parallel/tensor_parallel.h): the input comes as this rank's rows and is gathered
// whole (B, T, C) before q, k, v (gate, up); `sum` then scatters x's gradient back to the rows. The layer
// keeps the rows only and gathers them again in backward. Empty: x comes whole.
using InputGather = std::function<Tensor(Runtime&, const Tensor&)>;

// LlamaAttention: q_proj (C -> H·hd), k_proj, v_proj (C -> KV·hd), RoPE on q and k, the kv heads repeated
// for their H/KV query heads, the attention core, o_proj (H·hd -> C).
// Split over t tensor-parallel ranks (core/parallel/llama_parallel.h) a rank holds H/t query heads and KV/t
// kv heads — the rows of q, k and v that compute them, the columns of o_proj (`o_proj`, row-parallel) that
// read them — and `sum` adds up x's gradient from q, k and v over the ranks: one all-reduce forward (in
// o_proj), one backward, as Megatron's.
class LlamaAttention : public Layer {
 public:
  LlamaAttention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, int64_t n_kv_head, float rope_theta,
                 AttentionCore core = AttentionCore(), int tp = 1, std::unique_ptr<Layer> o_proj = nullptr, InputGradSum sum = nullptr,
                 InputGather gather = nullptr);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, T, C) -> (B, T, C); sequence parallel: (N/t, C) rows in and out
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Layer*> children() override { return {&q_proj, &k_proj, &v_proj, o_proj.get()}; }
  void swap_saved(SavedState& s) override {
    for (Layer* l : std::initializer_list<Layer*>{&q_proj, &k_proj, &v_proj, o_proj.get()}) l->swap_saved(s);
    s.swap(qkv_);
    core_.swap_saved(s);
    s.swap(q_);
    s.swap(v_);
    s.swap(y_);
    s.swap(rows_);
  }
  // Op-level selective checkpointing (torchtitan's policy, driven by core/models/llama.h's LlamaBlock):
  // after forward, keep_ops() drops everything but the outputs the policy keeps — q_proj's (1st matmul) and
  // v_proj's (3rd), and the attention core's (y, and flash's log-sum-exps) — then recompute(x), from the
  // recomputed input x, reruns k_proj (2nd matmul), RoPE on k and o_proj (4th) and returns o_proj's output,
  // leaving every layer holding what its backward reads.
  void set_op_checkpointing(bool on) { op_ = on; }  // forward then holds q_, v_ and y_ for keep_ops()
  void keep_ops();
  Tensor recompute(Runtime& rt, const Tensor& x);
  Linear q_proj, k_proj, v_proj;   // this rank's rows: (H/t·hd, C), (KV/t·hd, C) x2
  std::unique_ptr<Layer> o_proj;   // a Linear (C, C), or the row-parallel one
  int64_t C, n_head, n_kv_head, head_dim;  // n_head, n_kv_head: this rank's
  float rope_theta;

 private:
  AttentionCore core_;
  InputGradSum sum_;
  InputGather gather_;
  Tensor rows_;  // sequence parallel: this rank's rows of the input, gathered again in backward
  Tensor qkv_;  // (B, T, 3·H/t·hd): q and k rotated, k and v repeated
  // kept for op-level checkpointing: q_proj's output (rotated in place by forward: the same bits RoPE would
  // give again), v_proj's, and the core's output y (o_proj's input)
  Tensor q_, v_, y_;
  bool op_ = false;
};

// LlamaMLP: down_proj(silu(gate_proj(x)) · up_proj(x)), hidden size I. Split over t ranks: I/t rows of
// gate and up, down_proj row-parallel, `sum` for x's gradient (as the attention above).
class LlamaMLP : public Layer {
 public:
  LlamaMLP(Runtime& rt, const std::string& prefix, int64_t C, int64_t hidden, int tp = 1, std::unique_ptr<Layer> down_proj = nullptr,
           InputGradSum sum = nullptr, InputGather gather = nullptr);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, T, C) -> (B, T, C); sequence parallel: (N/t, C) rows in and out
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Layer*> children() override { return {&gate_proj, &up_proj, down_proj.get()}; }
  void swap_saved(SavedState& s) override {
    for (Layer* l : std::initializer_list<Layer*>{&gate_proj, &up_proj, down_proj.get()}) l->swap_saved(s);
    s.swap(gate_);
    s.swap(up_);
    s.swap(out_);
    s.swap(eager_silu_);
    s.swap(rows_);
  }
  // Op-level selective checkpointing (see LlamaAttention's): keep_ops() keeps gate_proj's output (the 5th
  // matmul of the block) and down_proj's (the 7th) and drops the rest; recompute(x) reruns up_proj (6th)
  // and SwiGLU. down_proj's output is kept only because the policy keeps every second matmul's output,
  // blind to whether backward reads it (it does not): torchtitan holds it too.
  void set_op_checkpointing(bool on) { op_ = on; }  // forward then holds down_proj's output
  void keep_ops();
  void recompute(Runtime& rt, const Tensor& x);
  Linear gate_proj, up_proj;         // this rank's rows: (I/t, C)
  std::unique_ptr<Layer> down_proj;  // a Linear (C, I), or the row-parallel one

 private:
  InputGradSum sum_;
  InputGather gather_;
  Tensor rows_;       // sequence parallel: this rank's rows of the input, gathered again in backward
  Tensor gate_, up_;  // (B, T, I/t) each
  Tensor out_;        // op-level checkpointing: down_proj's output, (B, T, C)
  Tensor eager_silu_;  // rt.eager_ops has swiglu: silu(gate), which eager PyTorch keeps (counted, never used)
  bool op_ = false;
};

}  // namespace distlab
