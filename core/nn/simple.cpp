#include "core/nn/simple.h"

#include <fmt/format.h>

#include "core/ops/cpu/pointwise.h"
#include "core/util/error.h"

namespace distlab {

Tensor ReLU::forward(Runtime& rt, const Tensor& x) {
  Tensor out = rt.empty(x.shape(), Category::activations, "output of ReLU");
  relu_forward(rt, out.f32(), x.f32(), x.numel());
  saved_out_ = out;
  return out;
}

Tensor ReLU::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of ReLU");
  relu_backward(rt, dx.f32(), dout.f32(), saved_out_.f32(), dout.numel());
  saved_out_ = Tensor();
  return dx;
}

Tensor GELU::forward(Runtime& rt, const Tensor& x) {
  Tensor out = rt.empty(x.shape(), Category::activations, "output of GELU");
  gelu_forward(rt, out.f32(), x.f32(), x.numel());
  saved_x_ = x;
  return out;
}

Tensor GELU::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of GELU");
  gelu_backward(rt, dx.f32(), dout.f32(), saved_x_.f32(), dout.numel());
  saved_x_ = Tensor();
  return dx;
}

std::string Dropout::describe() const { return fmt::format("Dropout(p={})", p_); }

Tensor Dropout::forward(Runtime& rt, const Tensor& x) {
  if (!training_ || p_ == 0.0f) {
    mask_ = Tensor();
    return x;
  }
  Tensor out = rt.empty(x.shape(), Category::activations, "output of Dropout");
  mask_ = rt.empty(x.shape(), Category::activations, "dropout mask");
  dropout_forward(rt, out.f32(), mask_.f32(), x.f32(), x.numel(), p_, seed_ * 1000003ULL + calls_++);
  return out;
}

Tensor Dropout::backward(Runtime& rt, const Tensor& dout) {
  if (!mask_.defined()) return dout;
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of Dropout");
  dropout_backward(rt, dx.f32(), dout.f32(), mask_.f32(), dout.numel());
  mask_ = Tensor();
  return dx;
}

Tensor Flatten::forward(Runtime& rt, const Tensor& x) {
  in_shape_ = x.shape();
  return x.view({x.size(0), x.numel() / (x.size(0) ? x.size(0) : 1)});
}

Tensor Flatten::backward(Runtime& rt, const Tensor& dout) { return dout.view(in_shape_); }

std::string MaxPool2d::describe() const { return fmt::format("MaxPool2d(kernel {}, stride {})", k_, s_); }

Tensor MaxPool2d::forward(Runtime& rt, const Tensor& x) {
  if (x.dim() != 4 || x.size(2) < k_ || x.size(3) < k_)
    throw ShapeError(fmt::format("{}: input of shape {} where [B, C, H>={}, W>={}] was expected", describe(),
                                 shape_str(x.shape()), k_, k_));
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = (H - k_) / s_ + 1, OW = (W - k_) / s_ + 1;
  Tensor out = rt.empty({B, C, OH, OW}, Category::activations, "output of MaxPool2d");
  argmax_ = rt.empty({B, C, OH, OW}, Category::activations, "MaxPool2d indices");
  maxpool2d_forward(rt, out.f32(), static_cast<int32_t*>(argmax_.data()), x.f32(), B, C, H, W, k_, s_);
  in_shape_ = x.shape();
  return out;
}

Tensor MaxPool2d::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(in_shape_, Category::activations, "grad of MaxPool2d");
  maxpool2d_backward(rt, dx.f32(), dout.f32(), static_cast<const int32_t*>(argmax_.data()), in_shape_[0],
                     in_shape_[1], in_shape_[2], in_shape_[3], dout.size(2), dout.size(3));
  argmax_ = Tensor();
  return dx;
}

}  // namespace distlab
