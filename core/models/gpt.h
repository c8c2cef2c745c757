// GPT-2: token + position embedding, L pre-norm transformer blocks, a final LayerNorm, and an lm_head
// tied to the token embedding. Backward is the forward read in reverse, block by block.
#pragma once
#include "core/models/model.h"
#include "core/models/zoo.h"
#include "core/nn/attention.h"
#include "core/nn/embedding.h"
#include "core/nn/norm.h"
#include "core/nn/simple.h"

namespace distlab {

// x -> x + attn(ln_1(x)) -> h + mlp(ln_2(h)), with mlp = c_proj(gelu(c_fc(.)))
struct Block {
  Block(Runtime& rt, const std::string& prefix, const ModelSpec& s, uint64_t dropout_seed);
  Tensor forward(Runtime& rt, const Tensor& x);    // (B, T, C) -> (B, T, C)
  Tensor backward(Runtime& rt, const Tensor& dout);
  std::vector<Parameter*> parameters();
  void init(Rng& rng, int64_t n_layer);
  void set_training(bool on);
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  Linear c_fc, c_proj;
  GELU gelu;
  Dropout drop_attn, drop_mlp;
  static Tensor residual_add(Runtime& rt, const Tensor& x, const Tensor& branch);  // x + branch
  static void residual_accumulate(Runtime& rt, Tensor& d, const Tensor& g);         // d += g
};

class GPT : public Model {
 public:
  GPT(Runtime& rt, const ModelSpec& spec);
  std::string describe() const override;
  std::vector<Parameter*> parameters() override;
  std::vector<std::vector<Parameter*>> units() override;  // embeddings, block 0..L-1, ln_f
  Tensor forward(Runtime& rt, const Batch& batch, ForwardHook* hook = nullptr) override;  // tokens (B*T) -> logits (B*T, V)
  void backward(Runtime& rt, const Tensor& dlogits, BackwardHook* hook) override;
  void set_training(bool on) override;
  void init(uint64_t seed) override;
  std::vector<uint64_t*> rng_streams() override {
    std::vector<uint64_t*> v{drop_.rng_calls()};
    for (auto& b : h_) {
      v.push_back(b->drop_attn.rng_calls());
      v.push_back(b->drop_mlp.rng_calls());
    }
    return v;
  }

 private:
  ModelSpec spec_;
  Embedding emb_;
  Dropout drop_;
  std::vector<std::unique_ptr<Block>> h_;
  LayerNorm ln_f_;
  Tensor saved_xf_;  // ln_f output, the lm_head's input (B, T, C)
};

}  // namespace distlab
