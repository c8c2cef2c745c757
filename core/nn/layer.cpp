#include "core/nn/layer.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

Parameter make_parameter(Runtime& rt, const std::string& name, const Shape& shape, bool decay) {
  Parameter p;
  p.name = name;
  p.data = rt.zeros(shape, Category::params, name);
  p.decay = decay;
  return p;
}

void init_uniform(Tensor& t, Rng& rng, float bound) {
  float* p = t.f32();
  if (!p) return;  // meta: nothing to fill
  for (int64_t i = 0; i < t.numel(); i++) p[i] = rng.uniform(-bound, bound);
}

void init_normal(Tensor& t, Rng& rng, float std) {
  float* p = t.f32();
  if (!p) return;  // meta: a billion normals would take seconds and there is nowhere to put them
  for (int64_t i = 0; i < t.numel(); i++) p[i] = rng.normal() * std;
}

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
