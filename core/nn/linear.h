// nn.Linear: y = x @ W^T + b with W (out, in), as PyTorch stores it. With a LoRA adapter (add_lora,
// core/nn/lora.h) the weight and bias are frozen and y gains the adapter's low-rank term; under QLoRA the
// frozen weight is held in 4 bits (weight.quant, core/nn/qlora.h) and dequantized for each GEMM.
#pragma once
#include <memory>

#include "core/nn/layer.h"
#include "core/nn/lora.h"

namespace distlab {

class Linear : public Layer {
 public:
  // prefix names the parameters: "fc1" -> "fc1.weight", "fc1.bias"
  Linear(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, bool bias = true);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;   // x (..., in) -> (..., out)
  // gelu(x Wᵀ + b) in one GEMM, where a device rank's 16-bit run has it (linear_gelu_forward_16: the GELU in
  // the epilogue); `pre` gets x Wᵀ + b, the output forward would return (for GELU's backward). Undefined
  // where it can't (a cpu rank, f32, an adapter, a 4-bit weight): then forward, and GELU's own.
  Tensor forward_gelu(Runtime& rt, const Tensor& x, Tensor& pre);
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;  // a 4-bit weight's constants (core/nn/qlora.h); none otherwise
  void init(Rng& rng) override;  // kaiming_uniform(a=sqrt(5)): U(±1/sqrt(in)), bias the same
  void swap_saved(SavedState& s) override {
    s.swap(saved_x_);
    if (lora) lora->swap_saved(s);
  }
  void keep_input(Runtime& rt, const Tensor& x) override;  // saves x as forward would, computes nothing
  void release_input() { saved_x_ = Tensor(); }  // forgets the saved x (sequence parallel gathers it again: keep_input)
  uint64_t* rng_calls() override { return lora ? lora->rng_calls() : nullptr; }  // the adapter's dropout
  // PEFT's LoraLayer: an adapter on this layer, the weight and bias frozen; `name` is the module's
  void add_lora(Runtime& rt, const std::string& name, const LoraSpec& spec, uint64_t dropout_seed);
  Parameter weight, bias;        // (out, in), (out)
  std::unique_ptr<LoraAdapter> lora;  // nullptr: a plain Linear
  TpSlice tp;                    // tensor parallel: which slice of a whole layer this is (its adapter splits alike)
  bool merged = false;           // the adapter is folded into weight (merge_lora): forward skips it
  // whether there is a bias (not bias.data.defined(): ZeRO-3 frees a parameter's data between uses)
  bool has_bias_ = false;
  int64_t in_features, out_features;

 private:
  void save_input(Runtime& rt, const Tensor& x);  // x in rt.dtype, as the 16-bit GEMM reads it
  Tensor saved_x_;
};

}  // namespace distlab
