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

// FlashAttention-2 (Dao 2023): the same causal attention, computed in tiles of kFlashTile queries by
// kFlashTile keys with an online softmax (a running max and sum per row), never holding (T, T): what it
// keeps for backward is lse (B, NH, T) = log Σ_s exp(score[t, s]) per row instead of the probabilities.
// Tiles above the diagonal (all in the future) are skipped: about half the naive kernels' score FLOPs.
constexpr int64_t kFlashTile = 64;
// out (B, T, C), lse (B, NH, T) written
void flash_attention_forward(Runtime& rt, float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH);
// dqkv (B, T, 3C) overwritten; the probabilities are recomputed tile by tile from q, k and lse
void flash_attention_backward(Runtime& rt, float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
// The FLOPs the flash kernels compute (what their trace records): per tile of r queries by c keys at or
// below the diagonal, forward 4·r·c·hs (q kᵀ, P v) + 6·r·c (mask, exp, sums), backward 8·r·c·hs + ... plus
// the recomputed q kᵀ (2·r·c·hs)
double flash_attention_flops(int64_t B, int64_t T, int64_t C, int64_t NH, bool backward);

// out (B, T, C) = wte[tokens] + wpe[0..T). A token of -1 is one another tensor-parallel rank holds (the
// vocabulary-parallel embedding, core/parallel/tensor_parallel.h): its row here is zeros, and the rank that
// holds it writes its vector and position, so the all-reduce of the ranks' outputs is the whole lookup.
void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C);
// dwte, dwpe accumulated (dwpe may be nullptr for a plain Embedding); a -1 token adds to dwpe only
void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

}  // namespace distlab
