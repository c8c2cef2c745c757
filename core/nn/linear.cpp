#include "core/nn/linear.h"

#include <fmt/format.h>

#include <cmath>

#include "core/nn/qlora.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/kernels.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

Linear::Linear(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, bool has_bias)
    : in_features(in), out_features(out) {
  weight = make_parameter(rt, prefix + ".weight", {out, in});
  has_bias_ = has_bias;
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, /*decay=*/false);
}

std::string Linear::describe() const { return fmt::format("Linear({} -> {})", in_features, out_features); }

std::vector<Buffer*> Linear::buffers() { return weight.quant ? weight.quant->buffers() : std::vector<Buffer*>{}; }

std::vector<Parameter*> Linear::parameters() {  // PEFT's order: base_layer's, then lora_A's, lora_B's
  std::vector<Parameter*> p = {&weight};
  if (has_bias_) p.push_back(&bias);
  if (lora) p.insert(p.end(), {&lora->lora_A, &lora->lora_B});
  return p;
}

void Linear::add_lora(Runtime& rt, const std::string& name, const LoraSpec& spec, uint64_t dropout_seed) {
  DL_ASSERT(!lora, "Linear::add_lora twice on " + name);
  lora = std::make_unique<LoraAdapter>(rt, name, in_features, out_features, spec, dropout_seed, tp);
  weight.requires_grad = false;  // bias "none": the bias stays frozen too
  bias.requires_grad = false;
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
  save_input(rt, x);
  const Tensor wt = weight.quant ? dequantize_parameter(rt, weight) : weight.data;  // QLoRA: the 4-bit base, dequantized for this GEMM
  const DType t = rt.dtype;
  if (rt.kernels && (t == DType::bf16 || t == DType::f16) && saved_x_.dtype() == t && wt.dtype() == t && (!has_bias_ || bias.data.dtype() == t)) {
    // a device rank's 16-bit GEMM on the tensors as they are (no f32 copies): the same numbers
    linear_forward_16(rt, out.data(), saved_x_.data(), wt.data(), has_bias_ ? bias.data.data() : nullptr, t, N, in_features, out_features);
  } else {
    AsF32 xf(rt, saved_x_), w(rt, wt), b(rt, bias.data), y(rt, out, AsF32::out);
    matmul_forward(rt, y.p, xf.p, w.p, has_bias_ ? b.p : nullptr, N, in_features, out_features);
    y.store();
  }
  if (lora && !merged) lora->forward(rt, saved_x_.view({N, in_features}), out, training_);
  return out;
}

Tensor Linear::forward_gelu(Runtime& rt, const Tensor& x, Tensor& pre) {
  if ((lora && !merged) || weight.quant || !rt.kernels || !rt.kernels->linear_gelu_forward_16) return Tensor();
  if (!device_16(rt, {&x, &weight.data}) || (has_bias_ && bias.data.dtype() != rt.dtype)) return Tensor();
  expect_shape(describe() + " " + weight.name, x, {in_features});
  const int64_t N = x.numel() / in_features;
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  pre = rt.empty(out_shape, Category::activations, "output of " + weight.name, rt.dtype);  // forward's output, then GELU's:
  Tensor out = rt.empty(out_shape, Category::activations, "output of GELU", rt.dtype);   // the same two buffers, in order
  save_input(rt, x);
  linear_gelu_forward_16(rt, out.data(), pre.data(), saved_x_.data(), weight.data.data(), has_bias_ ? bias.data.data() : nullptr, rt.dtype,
                         N, in_features, out_features);
  return out;
}

void Linear::save_input(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {in_features});
  saved_x_ = x.dtype() == rt.dtype ? x : x.clone(Category::activations, rt.dtype);
}

void Linear::keep_input(Runtime& rt, const Tensor& x) {
  save_input(rt, x);
  if (lora && !merged) lora->keep(rt, saved_x_.view({x.numel() / in_features, in_features}));  // its x·Aᵀ again
}

Tensor Linear::backward(Runtime& rt, const Tensor& dout) {
  const int64_t N = saved_x_.numel() / in_features;
  Tensor dx = needs_input_grad_ ? rt.empty(saved_x_.shape(), Category::activations, "grad of input of " + weight.name, rt.dtype)
                              : Tensor();
  {  // a frozen weight (under LoRA) gets no gradient: dW's GEMM is skipped, as autograd skips it
    // QLoRA dequantizes the base again for dX (bitsandbytes' MatMul4Bit.backward): nothing 16-bit was kept
    const Tensor wt = weight.quant && needs_input_grad_ ? dequantize_parameter(rt, weight) : weight.data;
    const DType t = rt.dtype;
    const Tensor dw16 = weight.requires_grad ? weight.grad_for_accumulate() : Tensor();
    const Tensor db16 = has_bias_ && bias.requires_grad ? bias.grad_for_accumulate() : Tensor();
    if (rt.kernels && (t == DType::bf16 || t == DType::f16) && dout.dtype() == t && saved_x_.dtype() == t && (!needs_input_grad_ || wt.dtype() == t) &&
        (!dw16.defined() || dw16.dtype() == t) && (!db16.defined() || db16.dtype() == t)) {
      // a device rank's 16-bit GEMMs on the tensors as they are (linear_backward_16): the same numbers
      linear_backward_16(rt, dx.data(), dw16.data(), db16.data(), dout.data(), saved_x_.data(), needs_input_grad_ ? wt.data() : nullptr,
                         t, N, in_features, out_features, needs_input_grad_, weight.requires_grad);
    } else {
      AsF32 dxf(rt, dx, AsF32::out), dw(rt, dw16, AsF32::inout), db(rt, db16, AsF32::inout);
      AsF32 dy(rt, dout, AsF32::in, rt.dtype), x(rt, saved_x_), w(rt, weight.quant && !needs_input_grad_ ? Tensor() : wt);
      matmul_backward(rt, dxf.p, dw.p, db.p, dy.p, x.p, w.p, N, in_features, out_features, needs_input_grad_, weight.requires_grad);
      dxf.store();
      dw.store();
      db.store();
    }
  }
  if (lora && !merged) lora->backward(rt, dout.view({N, out_features}), dx);
  saved_x_ = Tensor();
  return dx;
}

}  // namespace distlab
