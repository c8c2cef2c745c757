#include "core/nn/embedding.h"

#include <cstring>

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

Tensor gather_position_rows(Runtime& rt, const float* wpe, const std::vector<int32_t>& positions, int64_t block, int64_t C) {
  const int64_t T = int64_t(positions.size());
  Tensor rows = rt.empty({T, C}, Category::activations, "wpe rows of this rank's positions", DType::f32);
  if (rt.is_meta()) return rows;
  for (int64_t t = 0; t < T; t++) {
    if (positions[size_t(t)] < 0 || positions[size_t(t)] >= block)
      throw ShapeError(fmt::format("position {} is past the model's block size {}", positions[size_t(t)], block),
                       "lower data.seq_len or raise model.block_size");
    std::memcpy(rows.f32() + t * C, wpe + int64_t(positions[size_t(t)]) * C, sizeof(float) * size_t(C));
  }
  return rows;
}

void scatter_position_grad(Runtime& rt, float* dwpe, const float* drows, const std::vector<int32_t>& positions, int64_t C) {
  if (rt.is_meta()) return;
  for (size_t t = 0; t < positions.size(); t++)
    for (int64_t i = 0; i < C; i++) dwpe[int64_t(positions[t]) * C + i] += drows[int64_t(t) * C + i];
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
  saved_tokens_ = tokens;
  auto ids = std::make_shared<Indices>(rt, saved_tokens_);  // on a cuda rank a device copy, kept for backward
  if (positions.empty() && device_16(rt, {&wte.data, &wpe.data})) {  // a device rank reads the 16-bit tables as they are
    embedding_forward_16(rt, out.data(), ids->p, wte.data.data(), wpe.data.data(), rt.dtype, B, T, C);
  } else {
    AsF32 o(rt, out, AsF32::out), e(rt, wte.data), p(rt, wpe.data);
    const Tensor rows = positions.empty() ? Tensor() : gather_position_rows(rt, p.p, positions, block, C);  // context parallel
    embedding_forward(rt, o.p, ids->p, e.p, positions.empty() ? p.p : rows.f32(), B, T, C);
    o.store();
  }
  saved_ids_ = rt.device == DeviceKind::cuda ? std::move(ids) : nullptr;  // a cpu rank's points into saved_tokens_: made again
  B_ = B;
  T_ = T;
  return out;
}

void Embedding::backward(Runtime& rt, const Tensor& dout) {
  if (!wte.requires_grad && !wpe.requires_grad) {  // frozen (LoRA): the first layer has nothing else to compute
    saved_tokens_.clear();
    saved_ids_.reset();
    return;
  }
  AsF32 de(rt, wte.grad_for_accumulate(), AsF32::inout), dp(rt, wpe.grad_for_accumulate(), AsF32::inout), dy(rt, dout);
  std::shared_ptr<Indices> ids = saved_ids_ ? saved_ids_ : std::make_shared<Indices>(rt, saved_tokens_);
  if (positions.empty()) embedding_backward(rt, de.p, dp.p, dy.p, ids->p, B_, T_, C);
  else {  // context parallel: wpe's gradient at this rank's positions
    Tensor drows = rt.zeros({T_, C}, Category::activations, "grad of wpe rows", DType::f32);
    embedding_backward(rt, de.p, drows.f32(), dy.p, ids->p, B_, T_, C);
    scatter_position_grad(rt, dp.p, drows.f32(), positions, C);
  }
  de.store();
  dp.store();
  saved_tokens_.clear();
  saved_ids_.reset();
}

}  // namespace distlab
