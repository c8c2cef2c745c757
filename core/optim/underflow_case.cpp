#include "core/optim/underflow_case.h"

#include "core/nn/linear.h"
#include "core/nn/loss.h"

namespace distlab {

std::vector<float> underflow_case_gradient(DType dt, float loss_scale) {
  Runtime rt;
  rt.dtype = dt;
  const int64_t N = 64, C = 8, V = 4;
  Linear fc(rt, "fc", C, V);
  Rng rng(3);
  fc.init(rng);
  Tensor x = rt.empty({N, C}, Category::activations, "inputs");
  for (int64_t i = 0; i < N * C; i++) x.f32()[i] = 1e-4f * float((i * 37) % 11 - 5);  // -5e-4 .. 5e-4
  std::vector<int32_t> y(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; i++) y[size_t(i)] = int32_t(i % V);
  CrossEntropyLoss ce;
  ce.forward(rt, fc.forward(rt, x), y);
  fc.backward(rt, ce.backward(rt, 1e-3f * loss_scale));
  std::vector<float> g(static_cast<size_t>(V * C));
  convert(fc.weight.grad.data(), dt, g.data(), DType::f32, V * C);
  return g;
}

}  // namespace distlab
