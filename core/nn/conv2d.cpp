#include "core/nn/conv2d.h"

#include <fmt/format.h>

#include <cmath>

#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

Conv2d::Conv2d(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, int64_t k, int64_t s, int64_t p,
               bool has_bias)
    : in_ch(in), out_ch(out), kernel(k), stride(s), pad(p) {
  weight = make_parameter(rt, prefix + ".weight", {out, in, k, k});
  has_bias_ = has_bias;
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, false);
}

std::string Conv2d::describe() const {
  return fmt::format("Conv2d({} -> {}, kernel {}, stride {}, padding {})", in_ch, out_ch, kernel, stride, pad);
}

std::vector<Parameter*> Conv2d::parameters() {
  if (has_bias_) return {&weight, &bias};
  return {&weight};
}

void Conv2d::init(Rng& rng) {
  float bound = 1.0f / std::sqrt(float(in_ch * kernel * kernel));
  init_uniform(weight.data, rng, bound);
  if (has_bias_) init_uniform(bias.data, rng, bound);
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
  Tensor out = rt.empty({s.B, out_ch, s.OH(), s.OW()}, Category::activations, "output of " + weight.name, rt.dtype);
  saved_col_ = rt.empty({s.CKK(), s.B * s.OH() * s.OW()}, Category::activations, "im2col columns of " + weight.name, rt.dtype);
  // a 16-bit GEMM (autocast's low list): an f32 input (the images) is rounded to rt.dtype first
  AsF32 y(rt, out, AsF32::out), col(rt, saved_col_, AsF32::out), xf(rt, x, AsF32::in, rt.dtype);
  AsF32 w(rt, weight.data), b(rt, bias.data);
  conv2d_forward(rt, y.p, col.p, xf.p, w.p, has_bias_ ? b.p : nullptr, s);
  y.store();
  col.store();
  saved_shape_ = s;
  return out;
}

Tensor Conv2d::backward(Runtime& rt, const Tensor& dout) {
  const ConvShape& s = saved_shape_;
  Tensor dx = needs_input_grad_ ? rt.empty({s.B, s.C, s.H, s.W}, Category::activations, "grad of input of " + weight.name, rt.dtype)
                              : Tensor();
  AsF32 dxf(rt, dx, AsF32::out), dw(rt, weight.grad_for_accumulate(), AsF32::inout);
  AsF32 db(rt, has_bias_ ? bias.grad_for_accumulate() : Tensor(), AsF32::inout);
  AsF32 dy(rt, dout, AsF32::in, rt.dtype), col(rt, saved_col_), w(rt, weight.data);
  conv2d_backward(rt, dxf.p, dw.p, db.p, dy.p, col.p, w.p, s, needs_input_grad_);
  dxf.store();
  dw.store();
  db.store();
  saved_col_ = Tensor();
  return dx;
}

}  // namespace distlab
