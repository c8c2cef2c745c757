// nn.Linear: y = x @ W^T + b with W (out, in), as PyTorch stores it.
#pragma once
#include "core/nn/layer.h"

namespace distlab {

class Linear : public Layer {
 public:
  // prefix names the parameters: "fc1" -> "fc1.weight", "fc1.bias"
  Linear(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, bool bias = true);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;   // x (..., in) -> (..., out)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  void init(Rng& rng) override;  // kaiming_uniform(a=sqrt(5)): U(±1/sqrt(in)), bias the same
  void swap_saved(SavedState& s) override { s.swap(saved_x_); }
  void keep_input(Runtime& rt, const Tensor& x) override;  // saves x as forward would, computes nothing
  Parameter weight, bias;        // (out, in), (out)
  // whether there is a bias (not bias.data.defined(): ZeRO-3 frees a parameter's data between uses)
  bool has_bias_ = false;
  int64_t in_features, out_features;

 private:
  Tensor saved_x_;
};

}  // namespace distlab
