#include "core/nn/layer.h"

#include <fmt/format.h>

#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

Parameter make_parameter(Runtime& rt, const std::string& name, const Shape& shape, bool decay) {
  Parameter p;
  p.name = name;
  p.data = rt.zeros(shape, Category::params, name, rt.dtype);
  p.decay = decay;
  return p;
}

// Draws in f32 (the same numbers whatever the dtype and device) and rounds once into a 16-bit tensor; a
// cuda tensor gets its values from the host in one copy.
template <class Draw>
static void init_with(Tensor& t, Draw draw) {
  if (!t.data()) return;  // meta: a billion draws would take seconds and there is nowhere to put them
  OnHost h(t, OnHost::out);
  for (int64_t i = 0; i < t.numel(); i++) h.p[i] = draw();
  h.store();
}

Tensor grad_or_scratch(Runtime& rt, Parameter& p) {
  if (p.requires_grad) return p.grad_for_accumulate();
  return rt.zeros(p.data.shape(), Category::activations, "the frozen " + p.name + "'s gradient (dropped)", p.data.dtype());
}

void init_uniform(Tensor& t, Rng& rng, float bound) { init_with(t, [&] { return rng.uniform(-bound, bound); }); }

void init_normal(Tensor& t, Rng& rng, float std) { init_with(t, [&] { return rng.normal() * std; }); }

void expect_shape(const std::string& layer, const Tensor& x, const Shape& trailing) {
  bool ok = x.dim() >= int64_t(trailing.size());
  for (size_t i = 0; ok && i < trailing.size(); i++)
    ok = trailing[i] < 0 || x.size(x.dim() - int64_t(trailing.size()) + int64_t(i)) == trailing[i];
  if (!ok) {
    std::string want = "[..., ";
    for (size_t i = 0; i < trailing.size(); i++)
      want += (i ? ", " : "") + (trailing[i] < 0 ? std::string("*") : std::to_string(trailing[i]));
    throw ShapeError(fmt::format("{}: input of shape {} where {} was expected", layer, shape_str(x.shape()), want + "]"),
                     "check the model's sizes against the data (model.* keys)");
  }
}

}  // namespace distlab

namespace distlab {

int64_t SavedState::bytes() const {
  int64_t b = 0;
  for (const Tensor& t : tensors)
    if (t.defined()) b += t.nbytes();
  return b;
}

void Layer::keep_input(Runtime& rt, const Tensor& x) {
  throw Error(describe() + ": op-level activation checkpointing cannot hand this layer its input back",
              "train.activation_checkpointing = \"selective_op\" keeps the outputs of Linear layers only");
}

}  // namespace distlab
