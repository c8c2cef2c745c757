// Token + position embedding of GPT-2 (wte, wpe). Inputs are token ids, not tensors.
#pragma once
#include "core/nn/layer.h"

namespace distlab {

class Embedding {
 public:
  // vocab x C token table "<prefix>wte.weight" and block x C position table "<prefix>wpe.weight"
  Embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C);
  // tokens (B*T) -> (B, T, C)
  Tensor forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T);
  void backward(Runtime& rt, const Tensor& dout);  // accumulates into wte.grad and wpe.grad
  void init(Rng& rng);                              // N(0, 0.02) for both, as GPT-2
  Parameter wte, wpe;
  int64_t vocab, block, C;

 private:
  std::vector<int32_t> saved_tokens_;
  int64_t B_ = 0, T_ = 0;
};

}  // namespace distlab
