// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), as Hugging Face PEFT's
// LoraLayer computes it on an nn.Linear:
//
//   y = base(x) + lora_B(lora_A(dropout(x))) · scaling        scaling = alpha / r  (rsLoRA: alpha / √r)
//
// lora_A (r, in) starts Kaiming-uniform with a = √5 — U(±1/√in), what PEFT's reset_lora_parameters draws —
// and lora_B (out, r) at zero, so a fresh adapter changes nothing and the first step moves B alone. The base
// weight (and bias) is frozen: no gradient, no optimizer state, no master copy. What trains is r·(in + out)
// numbers a layer instead of in·out: 8B's q_proj at r = 16 is 131,072 against 16.8 M.
//
// The names are PEFT's without its adapter name ("default"): model.layers.0.self_attn.q_proj.lora_A.weight,
// so a model's parameters are the base's names plus the adapters'. merge() folds B·A·scaling into the base
// weight (PEFT's merge_and_unload: one Linear again, nothing to compute at inference); unmerge() takes it
// out again.
//
// The adapter lives inside core/nn/linear.h's Linear (Linear::add_lora); apply_lora (core/models/peft.h)
// walks a model's Linears (Model::layers(), Layer::children()) as PEFT's target_modules matching does. The parallel
// strategies see a parameter's requires_grad: DDP's buckets, ZeRO's flat buffers and the optimizer hold the
// trainable ones only (core/parallel/strategy.h).
//
// Under tensor parallelism (core/parallel/tensor_parallel.h) the adapter is split with its base, as PEFT's
// LoraParallelLinear does it for Megatron's layers, and each split adds one all-reduce of (N, r) numbers:
//   a column-split base (W's rows: q, k, v, gate, up, c_attn, c_fc)
//     A (r, in) whole on every rank, B (out/t, r) this rank's rows (split with W's blocks)
//     forward   h = s·x Aᵀ (x whole: the same h everywhere), y_r += h B_rᵀ                no communication
//     backward  dh_r = s·dy_r B_r is one term of dh: dx += dh_r A (summed with the base's dx by the layer's
//               all-reduce), then dh = Σ_r dh_r (all-reduce), dA += dhᵀ x — the same on every rank
//   a row-split base (W's columns: o_proj, down_proj, c_proj)
//     A (r, in/t) this rank's columns, B (out, r) whole
//     forward   h = Σ_r s·x_r A_rᵀ (all-reduce), and B's term h Bᵀ added by one rank to its part of y (the
//               layer's all-reduce of y then counts it once)
//     backward  dy is whole: dB += dyᵀ h and dh = s·dy B the same everywhere; dA_r += dhᵀ x_r, dx_r += dh A_r
// so every gradient is whole after the backward, and DDP, ZeRO and FSDP reduce them as they do any other.
// The adapters draw the whole A (a row-split rank keeps its columns): with the same seed a split run starts
// from one rank's adapters. Dropout on a whole input draws one rank's masks (the same on every rank); on a
// row-split input each rank draws its own (Megatron's tensor-parallel RNG: the same distribution, other draws).
// Read next: core/nn/linear.cpp (forward and backward with an adapter), then tests/test_lora.cpp.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/nn/layer.h"

namespace distlab {

class Linear;

// The [lora] section: PEFT's LoraConfig (r, lora_alpha, lora_dropout, target_modules, use_rslora; bias
// "none": every bias frozen too). r = 0: no adapters, everything trains.
struct LoraSpec {
  int64_t r = 0;
  double alpha = 8.0;                       // PEFT's default lora_alpha
  double dropout = 0.0;
  std::vector<std::string> target_modules;  // module names or their last part ("q_proj"); "all-linear": every Linear but the output head
  bool use_rslora = false;
  bool on() const { return r > 0; }
  float scaling() const;
};

// A Linear that is one rank's slice of a whole layer under tensor parallelism (core/parallel/tensor_parallel.h):
// which way its weight is split, and the TP group's all-reduce for its adapter. dim -1: a whole Linear.
struct TpSlice {
  int dim = -1;    // 0: W's rows (column-parallel), 1: W's columns (row-parallel)
  int parts = 1;   // dim 0: the fused blocks W's rows fall into (c_attn's q, k, v: 3)
  int rank = 0, size = 1;
  std::function<void(Runtime&, Tensor&)> sum;  // the all-reduce (sum) over the TP group, in place
  bool split() const { return dim >= 0 && size > 1; }
};

// One Linear's adapter: lora_A (r, in), lora_B (out, r), and what its backward reads.
class LoraAdapter {
 public:
  // `prefix` is the Linear's module name ("model.layers.0.self_attn.q_proj"); in and out are the Linear's
  // own (this rank's slice under tensor parallelism: `tp` says which way)
  LoraAdapter(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, const LoraSpec& spec, uint64_t dropout_seed,
              const TpSlice& tp = TpSlice());
  void init(Rng& rng);  // A ~ U(±1/√in) (kaiming_uniform_, a = √5) of the whole A, B = 0
  // y (N, out) += scaling · (dropout(x) Aᵀ) Bᵀ, x (N, in) as the base GEMM read it; saves what backward reads
  void forward(Runtime& rt, const Tensor& x, Tensor& y, bool training);
  // Op-level recompute (core/models/llama.h): the base output was kept, so only what backward reads is rebuilt
  void keep(Runtime& rt, const Tensor& x);
  // Gradients of A and B (accumulated), dx (N, in) += the adapter's share (dx undefined: not needed)
  void backward(Runtime& rt, const Tensor& dy, Tensor& dx);
  void swap_saved(SavedState& s);
  uint64_t* rng_calls() { return &calls_; }
  Parameter lora_A, lora_B;
  float scaling;
  float dropout;

 private:
  // scaling · x_d Aᵀ, (N, r): PyTorch scales lora_B's output (N, out); scaling the narrow side instead is
  // the same product, one rounding apart
  void project(Runtime& rt, const Tensor& x, bool training);
  uint64_t seed_, calls_ = 0;
  TpSlice tp_;
  Tensor xd_, mask_, hs_;  // dropout(x) (x itself when p = 0), its mask, scaling · x_d Aᵀ
};

// W (out, in) += scale · B (out, r) @ A (r, in), host f32 memory: merge (scale = scaling) and unmerge (−scaling)
// of a model's adapters (core/models/peft.h) and of a checkpoint's (core/ckpt/peft_adapter.h)
void lora_fold(float* w, const float* A, const float* B, int64_t out, int64_t in, int64_t r, float scale);
// Every Linear under `layer` (itself included) with its module name, in order (nn.Module.named_modules())
void collect_linears(Layer* layer, std::vector<std::pair<std::string, Linear*>>& out);
// The adapters' dropout streams under these layers, in order: what a full recompute replays and a
// checkpoint saves (nothing without adapters)
std::vector<uint64_t*> lora_streams(const std::vector<Layer*>& layers);

}  // namespace distlab
