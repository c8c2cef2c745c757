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
// Read next: core/nn/linear.cpp (forward and backward with an adapter), then tests/test_lora.cpp.
#pragma once
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

// One Linear's adapter: lora_A (r, in), lora_B (out, r), and what its backward reads.
class LoraAdapter {
 public:
  // `prefix` is the Linear's module name ("model.layers.0.self_attn.q_proj")
  LoraAdapter(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, const LoraSpec& spec, uint64_t dropout_seed);
  void init(Rng& rng);  // A ~ U(±1/√in) (kaiming_uniform_, a = √5), B = 0
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
