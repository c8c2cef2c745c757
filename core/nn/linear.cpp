#include "core/nn/linear.h"

#include <fmt/format.h>

#include <cmath>

#include "core/ops/cpu/matmul.h"
#include "core/tensor/as_f32.h"

namespace distlab {

Linear::Linear(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, bool has_bias)
    : in_features(in), out_features(out) {
  weight = make_parameter(rt, prefix + ".weight", {out, in});
  has_bias_ = has_bias;
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, /*decay=*/false);
}

std::string Linear::describe() const { return fmt::format("Linear({} -> {})", in_features, out_features); }

std::vector<Parameter*> Linear::parameters() {
  if (has_bias_) return {&weight, &bias};
  return {&weight};
}

void Linear::init(Rng& rng) {
  float bound = 1.0f / std::sqrt(float(in_features));
  init_uniform(weight.data, rng, bound);
  if (has_bias_) init_uniform(bias.data, rng, bound);
}

Tensor Linear::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {in_features});
  const int64_t N = x.numel() / in_features;
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = rt.empty(out_shape, Category::activations, "output of " + weight.name, rt.dtype);
  // a 16-bit GEMM (autocast's low list): x rounded to rt.dtype if it came in wider; saved as it was read
  keep_input(rt, x);
  AsF32 xf(rt, saved_x_), w(rt, weight.data), b(rt, bias.data), y(rt, out, AsF32::out);
  matmul_forward(rt, y.p, xf.p, w.p, has_bias_ ? b.p : nullptr, N, in_features, out_features);
  y.store();
  return out;
}

void Linear::keep_input(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {in_features});
  saved_x_ = x.dtype() == rt.dtype ? x : x.clone(Category::activations, rt.dtype);
}

Tensor Linear::backward(Runtime& rt, const Tensor& dout) {
  const int64_t N = saved_x_.numel() / in_features;
  Tensor dx = needs_input_grad_ ? rt.empty(saved_x_.shape(), Category::activations, "grad of input of " + weight.name, rt.dtype)
                              : Tensor();
  AsF32 dxf(rt, dx, AsF32::out), dw(rt, weight.grad_for_accumulate(), AsF32::inout);
  AsF32 db(rt, has_bias_ ? bias.grad_for_accumulate() : Tensor(), AsF32::inout);
  AsF32 dy(rt, dout, AsF32::in, rt.dtype), x(rt, saved_x_), w(rt, weight.data);
  matmul_backward(rt, dxf.p, dw.p, db.p, dy.p, x.p, w.p, N, in_features, out_features, needs_input_grad_);
  dxf.store();
  dw.store();
  db.store();
  saved_x_ = Tensor();
  return dx;
}

}  // namespace distlab
