// Causal multi-head self-attention on a fused qkv projection, as in GPT-2 (and llm.c's attention_forward).
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

// qkv (B, T, 3C) holds q, k, v side by side; heads split C into NH pieces of hs = C / NH.
// att (B, NH, T, T) = softmax(q k^T / sqrt(hs)) with the future masked (saved for backward);
// out (B, T, C) = att @ v, heads concatenated.
void attention_forward(Runtime& rt, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
// dqkv (B, T, 3C) overwritten
void attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH);

// out (B, T, C) = wte[tokens] + wpe[0..T). A token of -1 is one another tensor-parallel rank holds (the
// vocabulary-parallel embedding, core/parallel/tensor_parallel.h): its row here is zeros, and the rank that
// holds it writes its vector and position, so the all-reduce of the ranks' outputs is the whole lookup.
void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C);
// dwte, dwpe accumulated (dwpe may be nullptr for a plain Embedding); a -1 token adds to dwpe only
void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

}  // namespace distlab
