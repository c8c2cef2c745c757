// What the LoRA and QLoRA tests share (tests/test_lora.cpp, tests/test_qlora.cpp): the tiny Llama of
// torch_peer.py's lora mode, its batches, and a tensor's values as f32.
#pragma once
#include <vector>

#include "core/data/batch.h"
#include "core/models/zoo.h"
#include "core/tensor/tensor.h"

namespace distlab::testing {

inline ModelSpec tiny_llama() {
  ModelSpec s;
  s.name = "llama";
  s.vocab_size = 64, s.block_size = 16, s.n_layer = 2, s.n_head = 4, s.n_kv_head = 2, s.n_embd = 32;
  s.intermediate_size = 48, s.rope_theta = 10000.0f;
  return s;
}

// the batches of torch_peer.py's lora_batch()
inline Batch lora_batch(int step, int64_t B, int64_t T, int64_t V) {
  Batch b;
  b.B = B, b.T = T;
  for (int64_t i = 0; i < B; i++) {
    std::vector<int32_t> row;
    for (int64_t t = 0; t <= T; t++) row.push_back(int32_t((step * 7 + i * 13 + t * 5 + (t * t) % 11) % V));
    for (int64_t t = 0; t < T; t++) b.tokens.push_back(row[size_t(t)]), b.targets.push_back(row[size_t(t + 1)]);
  }
  return b;
}

// a host tensor's values as f32 (its bytes as 0..255 for u8)
inline std::vector<float> values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), v.data(), DType::f32, t.numel());
  return v;
}

}  // namespace distlab::testing
