// GPT-2's CausalSelfAttention: c_attn (C -> 3C), causal softmax attention over NH heads, c_proj (C -> C).
// The middle, AttentionCore, is shared with the tensor-parallel attention (core/parallel/tensor_parallel.h),
// which runs it on its rank's heads.
#pragma once
#include "core/nn/linear.h"

namespace distlab {

// The attention core, between the qkv projection and c_proj: per head, y = softmax(q kᵀ / √hs, future
// masked) v. Backward needs the probabilities P (B, NH, T, T): 2·NH·T² bytes per sequence in bf16, the
// largest activation of a block at long T. What the core keeps is a choice:
//   naive, keep P       (train.activation_checkpointing none or full)
//   naive, recompute P  (selective; Korthikanti et al. 2022, §4): forward drops P, backward recomputes it
//                       from qkv first — one more attention forward, to free the biggest tensor
//   flash               (model.attention = "flash"; Dao 2023): the kernels never hold P at all. Forward
//                       keeps the output y and lse (B, NH, T) = log Σ exp(scores) per row, f32; backward
//                       recomputes P tile by tile from q, k and lse. Selective checkpointing has nothing
//                       left to drop.
//   ring                context parallel (parallel.cp; core/parallel/context_parallel.h): this rank holds a
//                       shard of the sequence, and its queries meet every rank's keys and values in turn,
//                       round a ring; it keeps what flash keeps, whatever model.attention says.
// Read next: core/ops/cpu/attention.h (the naive kernels and the flash ones, side by side).

// The sequence split over ranks (context parallelism): what the attention core and the positions need to
// know of it. RingAttention (core/parallel/context_parallel.h) is the one there is.
class ContextShards {
 public:
  virtual ~ContextShards() = default;
  virtual int size() const = 0;  // ranks the sequence is split over
  // where in the whole sequence this rank's T_local tokens sit (ascending)
  virtual std::vector<int32_t> positions(int64_t T_local) const = 0;
  // y (B, Tl, C') and lse (B, NH, Tl), f32, from this rank's qkv (B, Tl, 3C'): attention over every rank's keys.
  // `group` > 1: grouped-query attention, qkv's k and v heads repeated `group` times (Llama's repeat_kv):
  // only the distinct ones travel
  virtual void forward(Runtime& rt, const Tensor& qkv, int64_t NH, int64_t group, Tensor& y, Tensor& lse) = 0;
  // dqkv (B, Tl, 3C') from dy, qkv and what forward wrote (a kv head's gradient in the first of its repeats)
  virtual void backward(Runtime& rt, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t NH,
                        int64_t group, Tensor& dqkv) = 0;
};

class AttentionCore {
 public:
  explicit AttentionCore(bool recompute = false, bool flash = false, ContextShards* context = nullptr)
      : recompute_(recompute && !flash && !context), flash_(flash || context), context_(context) {}
  // qkv (B, T, 3C') -> y (B, T, C'), NH heads of C'/NH; `what` names the tensors for the memory table
  Tensor forward(Runtime& rt, const Tensor& qkv, int64_t NH, const std::string& what);
  // dy (B, T, C') -> dqkv (B, T, 3C'), from the qkv forward was given; releases what forward kept
  Tensor backward(Runtime& rt, const Tensor& dy, const Tensor& qkv, int64_t NH, const std::string& what);
  bool recomputes() const { return recompute_; }
  bool flash() const { return flash_; }
  ContextShards* context() const { return context_; }  // nullptr: the whole sequence is here
  // grouped-query attention: qkv's k and v heads are each repeated `g` times (what ring attention sends once)
  void set_kv_group(int64_t g) { kv_group_ = g; }
  void swap_saved(SavedState& s) {
    s.swap(att_);
    s.swap(y_);
    s.swap(lse_);
  }

 private:
  Tensor probabilities(Runtime& rt, const Tensor& qkv, int64_t NH, const std::string& what, Tensor* y);
  bool recompute_, flash_;
  ContextShards* context_;
  int64_t kv_group_ = 1;
  Tensor att_;      // naive: P (B, NH, T, T), or empty under recompute
  Tensor y_, lse_;  // flash: the output (B, T, C') and the log-sum-exps (B, NH, T), f32
};

class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head, AttentionCore core = AttentionCore());
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  void init(Rng& rng) override {}  // the GPT model initializes its linears (GPT-2's scheme)
  std::vector<Layer*> children() override { return {&c_attn, &c_proj}; }
  void swap_saved(SavedState& s) override {
    c_attn.swap_saved(s);
    c_proj.swap_saved(s);
    s.swap(qkv_);
    core_.swap_saved(s);
  }
  Linear c_attn, c_proj;
  int64_t C, n_head;

 private:
  AttentionCore core_;
  Tensor qkv_;  // (B, T, 3C)
};

}  // namespace distlab
