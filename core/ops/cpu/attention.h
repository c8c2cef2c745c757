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
// The 16-bit forms (bf16, f16: qkv, out, dout and dqkv in t; lse f32), which a device rank's 16-bit run
// calls: the f32 kernels above between an exact widening and one rounding of each result. A GPU's tensor-core
// kernels compute them on the 16-bit tensors themselves (core/ops/cuda/attention_tc.cu).
void flash_attention_forward_16(Runtime& rt, void* out, float* lse, const void* qkv, DType t, int64_t B, int64_t T, int64_t C,
                                int64_t NH);
void flash_attention_backward_16(Runtime& rt, void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                 DType t, int64_t B, int64_t T, int64_t C, int64_t NH);
// The FLOPs the flash kernels compute (what their trace records): per tile of r queries by c keys at or
// below the diagonal, forward 4·r·c·hs (q kᵀ, P v) + 6·r·c (mask, exp, sums), backward 8·r·c·hs + ... plus
// the recomputed q kᵀ (2·r·c·hs)
double flash_attention_flops(int64_t B, int64_t T, int64_t C, int64_t NH, bool backward);

// Ring attention's two kernels (context parallelism, core/parallel/context_parallel.h): the flash kernels
// above, for this rank's Tq queries against one rank's block of Tk keys and values, causal by position in
// the whole sequence — a key at kpos[s] is seen by a query at qpos[t] when kpos[s] <= qpos[t]. Both position
// lists ascend. q is (B, Tq, ·) with NH heads of hs = C / NH at columns h·hs, row stride ldq; k and v
// (B, Tk, ·) hold NH / group heads (grouped-query attention: query head h reads kv head h / group), row
// stride ldkv; out (B, Tq, C), lse (B, NH, Tq). A query that sees no key of the block gets out 0 and lse −inf.
// out and lse written: this block's softmax alone (ring attention merges the blocks' by their lse)
void attention_block_forward(Runtime& rt, float* out, float* lse, const float* q, int64_t ldq, const float* k, const float* v,
                             int64_t ldkv, const int32_t* qpos, const int32_t* kpos, int64_t B, int64_t Tq, int64_t Tk, int64_t C,
                             int64_t NH, int64_t group = 1);
// FlashAttention's merge of two softmaxes over disjoint keys, by their log-sum-exps: with
// lse = log(e^lse_a + e^lse_b), out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b. out, lse (the running
// a) updated in place from out_b (B, T, C) and lse_b (B, NH, T); an lse of −inf weighs 0.
void attention_merge(Runtime& rt, float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t T, int64_t C,
                     int64_t NH);
// D (B, NH, T) = rowsum(dout ∘ out) per head: softmax's backward term Σ_s P dP, without P
void attention_out_dot(Runtime& rt, float* D, const float* dout, const float* out, int64_t B, int64_t T, int64_t C, int64_t NH);
// Given the merged out's lse (the whole row's) and D = rowsum(dout ∘ out) (B, NH, Tq): the probabilities of
// this block recomputed, and its terms added: dq (row stride lddq) += its part, dk and dv (row stride
// lddkv, NH / group heads: a kv head's gradient sums its query heads') += theirs
void attention_block_backward(Runtime& rt, float* dq, int64_t lddq, float* dk, float* dv, int64_t lddkv, const float* dout,
                              const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv, const float* lse,
                              const float* D, const int32_t* qpos, const int32_t* kpos, int64_t B, int64_t Tq, int64_t Tk, int64_t C,
                              int64_t NH, int64_t group = 1);

// out (B, T, C) = wte[tokens] + wpe[0..T). A token of -1 is one another tensor-parallel rank holds (the
// vocabulary-parallel embedding, core/parallel/tensor_parallel.h): its row here is zeros, and the rank that
// holds it writes its vector and position, so the all-reduce of the ranks' outputs is the whole lookup.
void embedding_forward(Runtime& rt, float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C);
// The same on 16-bit out, wte and wpe (t: bf16, f16), as a device rank's 16-bit run calls it: each sum in f32
// from the exact values, rounded once (the cpu form for cuda-sim: the kernel's loop on widened rows, so no
// copy of the whole table is made, which the f32 way through AsF32 makes of wte).
void embedding_forward_16(Runtime& rt, void* out, const int32_t* tokens, const void* wte, const void* wpe, DType t, int64_t B, int64_t T,
                          int64_t C);
// dwte, dwpe accumulated (dwpe may be nullptr for a plain Embedding); a -1 token adds to dwpe only
void embedding_backward(Runtime& rt, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

}  // namespace distlab
