#include "core/nn/linear.h"

#include <fmt/format.h>

#include <cmath>

#include "core/ops/cpu/matmul.h"

namespace distlab {

Linear::Linear(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, bool has_bias)
    : in_features(in), out_features(out) {
  weight = make_parameter(rt, prefix + ".weight", {out, in});
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, /*decay=*/false);
}

std::string Linear::describe() const { return fmt::format("Linear({} -> {})", in_features, out_features); }

std::vector<Parameter*> Linear::parameters() {
  if (bias.data.defined()) return {&weight, &bias};
  return {&weight};
}

void Linear::init(Rng& rng) {
  float bound = 1.0f / std::sqrt(float(in_features));
  init_uniform(weight.data, rng, bound);
  if (bias.data.defined()) init_uniform(bias.data, rng, bound);
}

Tensor Linear::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {in_features});
  const int64_t N = x.numel() / in_features;
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor out = rt.empty(out_shape, Category::activations, "output of " + weight.name);
  matmul_forward(rt, out.f32(), x.f32(), weight.data.f32(), bias.data.defined() ? bias.data.f32() : nullptr, N,
                 in_features, out_features);
  saved_x_ = x;
  return out;
}

Tensor Linear::backward(Runtime& rt, const Tensor& dout) {
  const int64_t N = saved_x_.numel() / in_features;
  Tensor dx = needs_input_grad_ ? rt.empty(saved_x_.shape(), Category::activations, "grad of input of " + weight.name)
                              : Tensor();
  float* db = bias.data.defined() ? bias.grad_for_accumulate().f32() : nullptr;
  matmul_backward(rt, dx.f32(), weight.grad_for_accumulate().f32(), db, dout.f32(), saved_x_.f32(),
                  weight.data.f32(), N, in_features, out_features, needs_input_grad_);
  saved_x_ = Tensor();
  return dx;
}

}  // namespace distlab
