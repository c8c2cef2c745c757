#include "core/nn/conv2d.h"

#include <fmt/format.h>

#include <cmath>

#include "core/util/error.h"

namespace distlab {

Conv2d::Conv2d(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, int64_t k, int64_t s, int64_t p,
               bool has_bias)
    : in_ch(in), out_ch(out), kernel(k), stride(s), pad(p) {
  weight = make_parameter(rt, prefix + ".weight", {out, in, k, k});
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, false);
}

std::string Conv2d::describe() const {
  return fmt::format("Conv2d({} -> {}, kernel {}, stride {}, padding {})", in_ch, out_ch, kernel, stride, pad);
}

std::vector<Parameter*> Conv2d::parameters() {
  if (bias.data.defined()) return {&weight, &bias};
  return {&weight};
}

void Conv2d::init(Rng& rng) {
  float bound = 1.0f / std::sqrt(float(in_ch * kernel * kernel));
  init_uniform(weight.data, rng, bound);
  if (bias.data.defined()) init_uniform(bias.data, rng, bound);
}

ConvShape Conv2d::shape_of(const Tensor& x) const {
  return ConvShape{x.size(0), x.size(1), x.size(2), x.size(3), out_ch, kernel, stride, pad};
}

Tensor Conv2d::forward(Runtime& rt, const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != in_ch)
    throw ShapeError(fmt::format("{}: input of shape {} where [B, {}, H, W] was expected", describe(),
                                 shape_str(x.shape()), in_ch),
                     "check model.* sizes against the data's channels");
  ConvShape s = shape_of(x);
  if (s.OH() < 1 || s.OW() < 1)
    throw ShapeError(fmt::format("{}: input {} is smaller than the kernel", describe(), shape_str(x.shape())));
  Tensor out = rt.empty({s.B, out_ch, s.OH(), s.OW()}, Category::activations, "output of " + weight.name);
  saved_col_ = rt.empty({s.CKK(), s.B * s.OH() * s.OW()}, Category::activations, "im2col columns of " + weight.name);
  conv2d_forward(rt, out.f32(), saved_col_.f32(), x.f32(), weight.data.f32(),
                 bias.data.defined() ? bias.data.f32() : nullptr, s);
  saved_shape_ = s;
  return out;
}

Tensor Conv2d::backward(Runtime& rt, const Tensor& dout) {
  const ConvShape& s = saved_shape_;
  Tensor dx = needs_input_grad_ ? rt.empty({s.B, s.C, s.H, s.W}, Category::activations, "grad of input of " + weight.name)
                              : Tensor();
  float* db = bias.data.defined() ? bias.grad_for_accumulate().f32() : nullptr;
  conv2d_backward(rt, dx.f32(), weight.grad_for_accumulate().f32(), db, dout.f32(), saved_col_.f32(),
                  weight.data.f32(), s, needs_input_grad_);
  saved_col_ = Tensor();
  return dx;
}

}  // namespace distlab
