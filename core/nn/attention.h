// GPT-2's CausalSelfAttention: c_attn (C -> 3C), causal softmax attention over NH heads, c_proj (C -> C).
#pragma once
#include "core/nn/linear.h"

namespace distlab {

class CausalSelfAttention : public Layer {
 public:
  CausalSelfAttention(Runtime& rt, const std::string& prefix, int64_t C, int64_t n_head);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  void init(Rng& rng) override {}  // the GPT model initializes its linears (GPT-2's scheme)
  void swap_saved(SavedState& s) override {
    c_attn.swap_saved(s);
    c_proj.swap_saved(s);
    s.swap(qkv_);
    s.swap(att_);
  }
  Linear c_attn, c_proj;
  int64_t C, n_head;

 private:
  Tensor qkv_, att_;  // (B, T, 3C), (B, NH, T, T)
};

}  // namespace distlab
