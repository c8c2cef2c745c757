#include "core/nn/simple.h"

#include <fmt/format.h>

#include "core/ops/cpu/pointwise.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

Tensor ReLU::forward(Runtime& rt, const Tensor& x) {
  Tensor out = rt.empty(x.shape(), Category::activations, "output of ReLU", x.dtype());
  AsF32 y(rt, out, AsF32::out), xf(rt, x);
  relu_forward(rt, y.p, xf.p, x.numel());
  y.store();
  saved_out_ = out;
  return out;
}

Tensor ReLU::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of ReLU", dout.dtype());
  AsF32 d(rt, dx, AsF32::out), dy(rt, dout), y(rt, saved_out_);
  relu_backward(rt, d.p, dy.p, y.p, dout.numel());
  d.store();
  saved_out_ = Tensor();
  return dx;
}

Tensor GELU::forward(Runtime& rt, const Tensor& x) {
  Tensor out = rt.empty(x.shape(), Category::activations, "output of GELU", x.dtype());
  if (rt.kernels && (x.dtype() == DType::bf16 || x.dtype() == DType::f16)) {  // a device rank reads and writes the 16 bits themselves
    gelu_forward_16(rt, out.data(), x.data(), x.dtype(), x.numel());
  } else {
    AsF32 y(rt, out, AsF32::out), xf(rt, x);
    gelu_forward(rt, y.p, xf.p, x.numel());
    y.store();
  }
  saved_x_ = x;
  return out;
}

Tensor GELU::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of GELU", dout.dtype());
  if (rt.kernels && (dout.dtype() == DType::bf16 || dout.dtype() == DType::f16) && saved_x_.dtype() == dout.dtype()) {
    gelu_backward_16(rt, dx.data(), dout.data(), saved_x_.data(), dout.dtype(), dout.numel());
  } else {
    AsF32 d(rt, dx, AsF32::out), dy(rt, dout), xf(rt, saved_x_);
    gelu_backward(rt, d.p, dy.p, xf.p, dout.numel());
    d.store();
  }
  saved_x_ = Tensor();
  return dx;
}

std::string Dropout::describe() const { return fmt::format("Dropout(p={})", p_); }

Tensor Dropout::forward(Runtime& rt, const Tensor& x) {
  if (!training_ || p_ == 0.0f) {
    mask_ = Tensor();
    return x;
  }
  Tensor out = rt.empty(x.shape(), Category::activations, "output of Dropout", x.dtype());
  mask_ = rt.empty(x.shape(), Category::activations, "dropout mask");  // f32 0 or 1/(1-p)
  AsF32 y(rt, out, AsF32::out), xf(rt, x);
  dropout_forward(rt, y.p, mask_.f32(), xf.p, x.numel(), p_, seed_ * 1000003ULL + calls_++);
  y.store();
  return out;
}

Tensor Dropout::backward(Runtime& rt, const Tensor& dout) {
  if (!mask_.defined()) return dout;
  Tensor dx = rt.empty(dout.shape(), Category::activations, "grad of Dropout", dout.dtype());
  AsF32 d(rt, dx, AsF32::out), dy(rt, dout);
  dropout_backward(rt, d.p, dy.p, mask_.f32(), dout.numel());
  d.store();
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
  Tensor out = rt.empty({B, C, OH, OW}, Category::activations, "output of MaxPool2d", x.dtype());
  argmax_ = rt.empty({B, C, OH, OW}, Category::activations, "MaxPool2d indices");
  AsF32 y(rt, out, AsF32::out), xf(rt, x);
  maxpool2d_forward(rt, y.p, static_cast<int32_t*>(argmax_.data()), xf.p, B, C, H, W, k_, s_);
  y.store();
  in_shape_ = x.shape();
  return out;
}

Tensor MaxPool2d::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = rt.empty(in_shape_, Category::activations, "grad of MaxPool2d", dout.dtype());
  AsF32 d(rt, dx, AsF32::out), dy(rt, dout);
  maxpool2d_backward(rt, d.p, dy.p, static_cast<const int32_t*>(argmax_.data()), in_shape_[0],
                     in_shape_[1], in_shape_[2], in_shape_[3], dout.size(2), dout.size(3));
  d.store();
  argmax_ = Tensor();
  return dx;
}

}  // namespace distlab
