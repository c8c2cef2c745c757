// Context parallelism (parallel.cp = n): every layer but attention works token by token, so the sequence
// itself can be split over n ranks — each holds T/n of every sequence's tokens, its activations are 1/n of
// the whole, and only attention, where a token reads every earlier one, needs the others' keys and values.
//
// Ring attention (Liu et al. 2023; torchtitan's context_parallel, picotron's ring attention). The n ranks
// form a ring. Each starts with its own block of k and v; for n steps it computes its queries' attention
// against the block it holds — FlashAttention's kernel, one block of keys — and passes the block on to
// the next rank, receiving the previous rank's. Every block's softmax is over different keys, so they add
// up through their log-sum-exps (Dao's merge):
//
//   lse = log(e^lse_a + e^lse_b),   out = e^(lse_a − lse)·out_a + e^(lse_b − lse)·out_b
//
// exactly the softmax over all the keys, never holding more than one other block. The backward goes round
// the ring again: each block's dk and dv follow it, every rank adds its queries' terms, and one last pass
// brings them home; dq stays. Every exchange runs while a block's math does (send_recv_async). Per layer
// and micro-batch a rank sends (n − 1) blocks of (B, T/n, 2C_kv) forward, and backward (n − 1) of k, v and
// n of their gradients, (B, T/n, 2C_kv) each — C_kv the width of the keys (C for GPT; Llama's grouped-query
// attention sends its n_kv_head heads, not their repeats). The blocks travel in f32 whatever the compute
// dtype: distlab's point-to-point moves f32. Full recompute runs the forward ring again in the backward.
//
// Causal load balancing (torchtitan's, Megatron's): split in n contiguous pieces, rank n − 1 would compute
// 2n − 1 times rank 0's scores (its queries see every earlier piece whole and their own causally; rank
// 0's see only their own, causally). So the sequence is cut in
// 2n chunks and rank r holds chunks r and 2n − 1 − r — one early, one late — and every rank computes the
// same number of scores. Their positions (RingAttention::positions) are what the position embedding
// (GPT's wpe) and RoPE (Llama) read, and what the causal mask compares.
//
// The ranks of a CP group hold the same weights and different tokens, so their gradients are partial sums
// of one batch's: they join the data-parallel reduction (the mesh's dp × cp group, torchtitan's
// dp_shard_cp), and the loss, a mean over this rank's tokens, averages with theirs.
// Read next: core/parallel/mesh.h (where the cp axis sits among dp, tp and pp).
#pragma once
#include "core/comm/process_group.h"
#include "core/data/batch.h"
#include "core/nn/attention.h"

namespace distlab {

class RingAttention : public ContextShards {
 public:
  explicit RingAttention(ProcessGroup& cp) : cp_(cp) {}
  int size() const override { return cp_.size(); }
  // rank r's of T_local = 2c tokens: [r·c, (r+1)·c) and [(2n−1−r)·c, (2n−r)·c)
  std::vector<int32_t> positions(int64_t T_local) const override { return positions_of(cp_.rank(), T_local); }
  void forward(Runtime& rt, const Tensor& qkv, int64_t NH, int64_t group, Tensor& y, Tensor& lse) override;
  void backward(Runtime& rt, const Tensor& dy, const Tensor& qkv, const Tensor& y, const Tensor& lse, int64_t NH, int64_t group,
                Tensor& dqkv) override;

 private:
  std::vector<int32_t> positions_of(int rank, int64_t T_local) const;
  ProcessGroup& cp_;
};

// This rank's tokens of a micro-batch (B, T) -> (B, T/n): the positions above, tokens and targets alike.
// A sequence length that 2n does not divide is the caller's error (the trainer checks data.seq_len).
Batch context_shard(const Batch& whole, int n, int rank);

}  // namespace distlab
