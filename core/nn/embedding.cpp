#include "core/nn/embedding.h"

#include <fmt/format.h>

#include "core/ops/cpu/attention.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

Embedding::Embedding(Runtime& rt, const std::string& prefix, int64_t v, int64_t b, int64_t c)
    : vocab(v), block(b), C(c) {
  wte = make_parameter(rt, prefix + "wte.weight", {v, c});
  wpe = make_parameter(rt, prefix + "wpe.weight", {b, c});
}

void Embedding::init(Rng& rng) {
  init_normal(wte.data, rng, 0.02f);
  init_normal(wpe.data, rng, 0.02f);
}

Tensor Embedding::forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  if (T > block)
    throw ShapeError(fmt::format("sequence length {} is longer than the model's block size {}", T, block),
                     "lower data.seq_len or raise model.block_size");
  if (int64_t(tokens.size()) != B * T)
    throw ShapeError(fmt::format("embedding got {} tokens for a batch of {} x {}", tokens.size(), B, T));
  if (!rt.is_meta())
    for (auto t : tokens)
      if (t < 0 || t >= vocab)
        throw DataError(fmt::format("token id {} is outside the vocabulary of {}", t, vocab),
                        "raise model.vocab_size to cover the data's tokens");
  Tensor out = rt.empty({B, T, C}, Category::activations, "output of embedding", rt.dtype);
  AsF32 o(rt, out, AsF32::out), e(rt, wte.data), p(rt, wpe.data);
  Indices ids(rt, tokens);
  embedding_forward(rt, o.p, ids.p, e.p, p.p, B, T, C);
  o.store();
  saved_tokens_ = tokens;
  B_ = B;
  T_ = T;
  return out;
}

void Embedding::backward(Runtime& rt, const Tensor& dout) {
  if (!wte.requires_grad && !wpe.requires_grad) {  // frozen (LoRA): the first layer has nothing else to compute
    saved_tokens_.clear();
    return;
  }
  AsF32 de(rt, wte.grad_for_accumulate(), AsF32::inout), dp(rt, wpe.grad_for_accumulate(), AsF32::inout), dy(rt, dout);
  Indices ids(rt, saved_tokens_);
  embedding_backward(rt, de.p, dp.p, dy.p, ids.p, B_, T_, C);
  de.store();
  dp.store();
  saved_tokens_.clear();
}

}  // namespace distlab
