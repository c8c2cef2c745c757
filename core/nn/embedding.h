// Token + position embedding of GPT-2 (wte, wpe). Inputs are token ids, not tensors.
#pragma once
#include <memory>

#include "core/nn/layer.h"
#include "core/tensor/as_f32.h"

namespace distlab {

// What GPT's embeddings are to the model: wte and wpe, tokens in, (B, T, C) out. Embedding below is the
// whole one; a tensor-parallel run puts VocabParallelEmbedding (core/parallel/tensor_parallel.h) in its place.
class TokenEmbedding {
 public:
  virtual ~TokenEmbedding() = default;
  // tokens (B*T) -> (B, T, C)
  virtual Tensor forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) = 0;
  virtual void backward(Runtime& rt, const Tensor& dout) = 0;  // accumulates into wte.grad and wpe.grad
  virtual void swap_saved(SavedState& s) = 0;
  Parameter wte, wpe;
  // Context parallel (core/parallel/context_parallel.h): where in the whole sequence the T tokens sit, set
  // by the model before each forward; empty: 0..T-1
  std::vector<int32_t> positions;
};

// wpe's rows at `positions`, gathered (T, C) f32, for the kernels that read wpe[t] for token t — and their
// gradient added back: dwpe[positions[t]] += drows[t]
Tensor gather_position_rows(Runtime& rt, const float* wpe, const std::vector<int32_t>& positions, int64_t block, int64_t C);
void scatter_position_grad(Runtime& rt, float* dwpe, const float* drows, const std::vector<int32_t>& positions, int64_t C);

class Embedding : public TokenEmbedding {
 public:
  // vocab x C token table "<prefix>wte.weight" and block x C position table "<prefix>wpe.weight"
  Embedding(Runtime& rt, const std::string& prefix, int64_t vocab, int64_t block, int64_t C);
  Tensor forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) override;
  void backward(Runtime& rt, const Tensor& dout) override;
  void swap_saved(SavedState& s) override {
    s.swap(saved_tokens_);
    s.swap(saved_ids_);
    s.swap(B_);
    s.swap(T_);
  }
  void init(Rng& rng);                              // N(0, 0.02) for both, as GPT-2
  int64_t vocab, block, C;

 private:
  std::vector<int32_t> saved_tokens_;
  std::shared_ptr<Indices> saved_ids_;  // a cuda rank's device copy of them from forward: backward's, not uploaded again
  int64_t B_ = 0, T_ = 0;
};

}  // namespace distlab
