// nn.Conv2d with square kernels: weight (OC, C, K, K), bias (OC).
#pragma once
#include "core/nn/layer.h"
#include "core/ops/cpu/conv.h"

namespace distlab {

class Conv2d : public Layer {
 public:
  Conv2d(Runtime& rt, const std::string& prefix, int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t stride = 1,
         int64_t pad = 0, bool bias = true);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, C, H, W) -> (B, OC, OH, OW)
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  void init(Rng& rng) override;  // U(±1/sqrt(C*K*K)), as PyTorch
  void swap_saved(SavedState& s) override {
    s.swap(saved_col_);
    for (int64_t* v : {&saved_shape_.B, &saved_shape_.C, &saved_shape_.H, &saved_shape_.W, &saved_shape_.OC, &saved_shape_.K,
                       &saved_shape_.stride, &saved_shape_.pad})
      s.swap(*v);
  }
  Parameter weight, bias;
  // whether there is a bias (not bias.data.defined(): ZeRO-3 frees a parameter's data between uses)
  bool has_bias_ = false;
  int64_t in_ch, out_ch, kernel, stride, pad;

 private:
  Tensor saved_col_;     // (C*K*K, B*OH*OW) im2col columns of the input
  ConvShape saved_shape_{};
  ConvShape shape_of(const Tensor& x) const;
};

}  // namespace distlab
