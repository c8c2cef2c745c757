// Every backward against central finite differences, on awkward shapes (batch 1, odd and prime sizes).
//
// How the check works: for a layer y = f(x; θ) take the scalar objective L = Σ y·R with a fixed random R,
// so dL/dy = R and backward(R) must return dL/dx (and accumulate dL/dθ). Each entry v of x or θ is nudged
// to v ± eps and L is re-evaluated (in double, from the float outputs); (L+ − L−) / (2·eps) is the
// numerical derivative. The kernels compute in float32, so the numbers agree to about 1e-3 relative, and a
// relative tolerance of 1e-2 (with a small absolute floor for entries whose gradient is near zero) catches
// any wrong formula — a missing term, a transposed index, a forgotten accumulation — by orders of magnitude.
//
// Non-smooth layers (ReLU, MaxPool) are checked on inputs that keep every value farther than eps from a
// kink (zero, or a tie between two window entries), so the finite difference never steps across one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/data/batch.h"
#include "core/models/zoo.h"
#include "core/nn/attention.h"
#include "core/nn/llama.h"
#include "core/nn/conv2d.h"
#include "core/nn/embedding.h"
#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/nn/norm.h"
#include "core/nn/simple.h"
#include "core/ops/cpu/tanh.h"
#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/llama.h"
#include "core/ops/cpu/conv.h"
#include "core/ops/cpu/pointwise.h"
#include "core/ops/cpu/matmul.h"
#include "core/tensor/runtime.h"
#include "core/util/error.h"
#include "core/util/rng.h"

using namespace distlab;

namespace {

// ---- helpers: random tensors, the objective, central differences, comparison ----

Tensor random_tensor(Runtime& rt, const Shape& shape, Rng& rng, float std = 1.0f) {
  Tensor t = rt.empty(shape, Category::activations, "test tensor");
  for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] = rng.normal() * std;
  return t;
}

void fill_normal(Tensor& t, Rng& rng, float mean, float std) {
  for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] = mean + rng.normal() * std;
}

// L = Σ out·R, accumulated in double
double weighted_sum(const Tensor& out, const Tensor& R) {
  REQUIRE(out.numel() == R.numel());
  double s = 0;
  for (int64_t i = 0; i < out.numel(); i++) s += double(out.f32()[i]) * R.f32()[i];
  return s;
}

// (L(v + eps) − L(v − eps)) / (the step actually taken in float), with *v restored afterwards.
double central_difference(float* v, float eps, const std::function<double()>& L) {
  const float v0 = *v;
  const float up = v0 + eps, down = v0 - eps;
  *v = up;
  const double l_up = L();
  *v = down;
  const double l_down = L();
  *v = v0;
  return (l_up - l_down) / (double(up) - double(down));
}

struct Tolerance {
  float eps = 1e-2f;    // finite-difference step
  double rtol = 1e-2;   // relative to the entry
  double floor = 1e-2;  // entries below floor * max|numeric| are compared at that scale instead
  double atol = 0;      // absolute: the float noise of a loss divided by 2·eps, where that matters
};

// The allowance for one entry: rtol · max(|numeric|, floor · max_j |numeric_j|) + atol.
double allowed_error(double numeric, double scale, const Tolerance& tol) {
  return tol.rtol * std::max(std::abs(numeric), tol.floor * scale) + tol.atol + 1e-12;
}

double largest_magnitude(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Entry by entry |analytic − numeric| within allowed_error; the worst entry is reported when one isn't.
void compare_gradients(const std::string& what, const float* analytic, const std::vector<double>& numeric,
                       const Tolerance& tol) {
  const double scale = largest_magnitude(numeric);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < numeric.size(); i++) {
    const double err = std::abs(double(analytic[i]) - numeric[i]) / allowed_error(numeric[i], scale, tol);
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  INFO(what << ": worst error " << worst << " x the allowance at entry " << worst_i << " of " << numeric.size()
            << " (analytic " << (numeric.empty() ? 0.0 : analytic[worst_i]) << ", numeric "
            << (numeric.empty() ? 0.0 : numeric[worst_i]) << ", largest |gradient| " << scale << ")");
  CHECK(worst <= 1.0);
}

// Numerical gradient of L with respect to the given entries of `values`.
std::vector<double> numerical_gradient(Tensor& values, const std::vector<int64_t>& entries,
                                       const std::function<double()>& L, float eps) {
  std::vector<double> g;
  for (int64_t i : entries) g.push_back(central_difference(values.f32() + i, eps, L));
  return g;
}

std::vector<int64_t> all_entries(const Tensor& t) {
  std::vector<int64_t> e(size_t(t.numel()));
  std::iota(e.begin(), e.end(), int64_t(0));
  return e;
}

// Checks every entry of `values` (an input or a parameter) against its analytic gradient.
void check_all_entries(const std::string& what, Tensor& values, const Tensor& analytic,
                       const std::function<double()>& L, const Tolerance& tol) {
  REQUIRE(analytic.defined());
  REQUIRE(analytic.shape() == values.shape());
  compare_gradients(what, analytic.f32(), numerical_gradient(values, all_entries(values), L, tol.eps), tol);
}

// The whole check for a Layer: backward(R) against finite differences of L = Σ forward(x)·R, for the input
// and for every parameter (gradients start from none, so one backward must produce exactly dL/dθ).
void gradcheck_layer(Runtime& rt, Layer& layer, Tensor x, Rng& rng, const Tolerance& tol = {}) {
  Tensor out = layer.forward(rt, x);
  const Tensor R = random_tensor(rt, out.shape(), rng);
  for (Parameter* p : layer.parameters()) p->grad = Tensor();
  const Tensor dx = layer.backward(rt, R);
  auto L = [&] { return weighted_sum(layer.forward(rt, x), R); };
  check_all_entries(layer.describe() + " input", x, dx, L, tol);
  for (Parameter* p : layer.parameters()) check_all_entries(p->name, p->data, p->grad, L, tol);
}

// x whose entries all lie at least `gap` away from zero (so a ReLU's kink is never stepped across)
Tensor away_from_zero(Runtime& rt, const Shape& shape, Rng& rng, float gap) {
  Tensor t = random_tensor(rt, shape, rng);
  for (int64_t i = 0; i < t.numel(); i++) {
    float& v = t.f32()[i];
    v = (v < 0 ? -1.0f : 1.0f) * (gap + std::abs(v));
  }
  return t;
}

// x holding a random permutation of 0, spacing, 2·spacing, ...: no two entries closer than `spacing`
Tensor distinct_values(Runtime& rt, const Shape& shape, Rng& rng, float spacing) {
  Tensor t = rt.empty(shape, Category::activations, "distinct values");
  std::vector<int64_t> order = all_entries(t);
  for (int64_t i = int64_t(order.size()) - 1; i > 0; i--) std::swap(order[size_t(i)], order[rng.below(uint64_t(i + 1))]);
  for (int64_t i = 0; i < t.numel(); i++) t.f32()[i] = float(order[size_t(i)]) * spacing - 1.0f;
  return t;
}

}  // namespace

// ---- layers ----

TEST_CASE("Linear backward matches finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(1);
  SECTION("batch 1, 5 -> 3") {
    Linear fc(rt, "fc", 5, 3);
    fc.init(rng);
    gradcheck_layer(rt, fc, random_tensor(rt, {1, 5}, rng), rng);
  }
  SECTION("(3, 7, 5) input, 5 -> 7") {
    Linear fc(rt, "fc", 5, 7);
    fc.init(rng);
    gradcheck_layer(rt, fc, random_tensor(rt, {3, 7, 5}, rng), rng);
  }
  SECTION("no bias, 1 -> 1") {
    Linear fc(rt, "fc", 1, 1, /*bias=*/false);
    fc.init(rng);
    CHECK(fc.parameters().size() == 1);
    gradcheck_layer(rt, fc, random_tensor(rt, {3, 1}, rng), rng);
  }
}

TEST_CASE("Linear backward accumulates into the parameter gradients", "[gradcheck]") {
  Runtime rt;
  Rng rng(2);
  Linear fc(rt, "fc", 3, 5);
  fc.init(rng);
  Tensor x = random_tensor(rt, {7, 3}, rng);
  Tensor R = random_tensor(rt, {7, 5}, rng);
  fc.forward(rt, x);
  fc.backward(rt, R);
  std::vector<float> w1(fc.weight.grad.f32(), fc.weight.grad.f32() + 15), b1(fc.bias.grad.f32(), fc.bias.grad.f32() + 5);
  fc.forward(rt, x);
  fc.backward(rt, R);  // a second micro-batch with the same data: every gradient doubles
  for (int i = 0; i < 15; i++) CHECK(fc.weight.grad.f32()[i] == Approx(2.0 * w1[size_t(i)]).epsilon(1e-6));
  for (int i = 0; i < 5; i++) CHECK(fc.bias.grad.f32()[i] == Approx(2.0 * b1[size_t(i)]).epsilon(1e-6));
}

TEST_CASE("Conv2d backward matches finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(3);
  SECTION("stride 1, pad 1, batch 1, 7x5 image") {
    Conv2d conv(rt, "conv", 3, 5, 3, 1, 1);
    conv.init(rng);
    gradcheck_layer(rt, conv, random_tensor(rt, {1, 3, 7, 5}, rng), rng);
  }
  SECTION("stride 2, pad 0, 7x5 image (3x2 output)") {
    Conv2d conv(rt, "conv", 3, 2, 3, 2, 0);
    conv.init(rng);
    gradcheck_layer(rt, conv, random_tensor(rt, {2, 3, 7, 5}, rng), rng);
  }
  SECTION("stride 2, pad 2, 5x4 image: whole windows in the padding") {
    Conv2d conv(rt, "conv", 2, 3, 3, 2, 2);
    conv.init(rng);
    gradcheck_layer(rt, conv, random_tensor(rt, {1, 2, 5, 4}, rng), rng);
  }
  SECTION("kernel 2, stride 2 on 5x7: the last row of pixels is never read (gradient 0)") {
    Conv2d conv(rt, "conv", 1, 3, 2, 2, 0, /*bias=*/false);
    conv.init(rng);
    gradcheck_layer(rt, conv, random_tensor(rt, {1, 1, 5, 7}, rng), rng);
  }
}

TEST_CASE("ReLU and GELU backward match finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(4);
  SECTION("ReLU, inputs away from the kink") {
    ReLU relu;
    gradcheck_layer(rt, relu, away_from_zero(rt, {3, 7}, rng, 0.05f), rng);
  }
  SECTION("GELU (tanh), batch 1") {
    GELU gelu;
    gradcheck_layer(rt, gelu, random_tensor(rt, {1, 5, 3}, rng, 2.0f), rng);
  }
}

TEST_CASE("GELU is the tanh approximation", "[gradcheck]") {
  Runtime rt;
  Rng rng(5);
  GELU gelu;
  Tensor x = random_tensor(rt, {7}, rng, 3.0f);
  Tensor y = gelu.forward(rt, x);
  for (int i = 0; i < 7; i++) {
    const double v = x.f32()[i];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK(y.f32()[i] == Approx(ref).margin(1e-6).epsilon(1e-5));
  }
}

// The distance between two floats in units in the last place of the exact value
static double tanh_ulps(float got, double exact) {
  const float e = float(exact);
  const double ulp = std::nextafter(std::fabs(e), INFINITY) - std::fabs(e);
  return std::fabs(double(got) - exact) / ulp;
}

TEST_CASE("fast_tanhf is tanh to 1.5 ulp everywhere, and GELU's loops give what it gives one value at a time", "[gradcheck]") {
  double worst = 0;
  float at = 0;
  // every 7th float in [1e-6, 0.625) (the polynomial), a dense sweep of the exponential's range and past its cap
  std::vector<float> xs;
  for (float x = 1e-6f; x < 0.625f;) {
    xs.push_back(x);
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b += 7;
    std::memcpy(&x, &b, 4);
  }
  for (double x = 0.625; x < 12.0; x += 1.7e-6) xs.push_back(float(x));
  for (float x : xs)
    for (float y : {x, -x}) {
      const double u = tanh_ulps(fast_tanhf(y), std::tanh(double(y)));
      if (u > worst) worst = u, at = y;
    }
  INFO("worst " << worst << " ulp at " << at << " (" << xs.size() << " magnitudes)");
  CHECK(worst <= 1.5);
  CHECK(xs.size() > 10'000'000);
  for (float tiny : {1e-30f, -1e-20f, 3e-7f, 1e-38f}) CHECK(fast_tanhf(tiny) == tiny);  // tanh(y) = y below 2^-12
  CHECK(fast_tanhf(0.0f) == 0.0f);
  CHECK(std::signbit(fast_tanhf(-0.0f)));
  CHECK(fast_tanhf(INFINITY) == 1.0f);
  CHECK(fast_tanhf(-INFINITY) == -1.0f);
  CHECK(fast_tanhf(1e30f) == 1.0f);
  CHECK(std::isnan(fast_tanhf(NAN)));
  CHECK(fast_tanhf(9.5f) == 1.0f);  // the cap: tanh(9.5) rounds to 1 (tanh(9) does not: 1 - 2^-24)
  CHECK(std::tanh(9.5f) == 1.0f);
  CHECK(fast_tanhf(9.0f) == std::tanh(9.0f));

  // the vectorized loops of gelu_forward/backward against the formula on fast_tanhf, one value at a time: equal
  Runtime rt;
  const int64_t n = 100003;
  std::vector<float> x(n), dy(n), y(n), dx(n);
  Rng rng(21);
  for (int64_t i = 0; i < n; i++) x[size_t(i)] = (rng.uniform() - 0.5f) * 16.0f, dy[size_t(i)] = rng.uniform() - 0.5f;
  x[5] = NAN;
  x[6] = -0.0f;
  gelu_forward(rt, y.data(), x.data(), n);
  gelu_backward(rt, dx.data(), dy.data(), x.data(), n);
  const float k = 0.7978845608028654f;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) {
    const float v = x[size_t(i)], t = fast_tanhf(k * (v + 0.044715f * v * v * v));
    const float want = 0.5f * v * (1.0f + t);
    const float local = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * v * v);
    const float want_dx = local * dy[size_t(i)];
    const bool same = (std::isnan(want) && std::isnan(y[size_t(i)])) || std::memcmp(&want, &y[size_t(i)], 4) == 0;
    const bool same_dx = (std::isnan(want_dx) && std::isnan(dx[size_t(i)])) || std::memcmp(&want_dx, &dx[size_t(i)], 4) == 0;
    differ += !same || !same_dx;
  }
  CHECK(differ == 0);
}

TEST_CASE("Dropout scales kept values, zeroes about p of them, and backward applies the same mask", "[gradcheck]") {
  Runtime rt;
  Rng rng(6);
  const float p = 0.3f;
  const int64_t n = 10007;
  Tensor x = away_from_zero(rt, {n}, rng, 0.5f);
  Tensor dout = random_tensor(rt, {n}, rng);

  SECTION("training") {
    Dropout drop(p, 42);
    Tensor out = drop.forward(rt, x);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) {
      const float xi = x.f32()[i], yi = out.f32()[i];
      if (yi == 0.0f) {
        zeros++;
      } else {
        CHECK(yi == Approx(double(xi) / (1.0 - p)).epsilon(1e-6));
      }
    }
    CHECK(double(zeros) / double(n) == Approx(p).margin(0.02));  // ~4.4 standard deviations
    Tensor dx = drop.backward(rt, dout);
    for (int64_t i = 0; i < n; i++) {
      const double mask = double(out.f32()[i]) / x.f32()[i];
      REQUIRE(dx.f32()[i] == Approx(dout.f32()[i] * mask).epsilon(1e-6).margin(1e-12));
    }
  }
  SECTION("each forward draws a fresh mask, reproducibly from the seed") {
    Dropout a(p, 42), b(p, 42);
    Tensor a1 = a.forward(rt, x), a2 = a.forward(rt, x), b1 = b.forward(rt, x);
    int64_t differ = 0, same_as_twin = 0;
    for (int64_t i = 0; i < n; i++) {
      differ += (a1.f32()[i] == 0.0f) != (a2.f32()[i] == 0.0f);
      same_as_twin += a1.f32()[i] == b1.f32()[i];
    }
    CHECK(differ > n / 10);
    CHECK(same_as_twin == n);
  }
  SECTION("eval mode and p = 0 are the identity, forward and backward") {
    Dropout eval(p, 42), zero(0.0f, 42);
    eval.set_training(false);
    for (Dropout* d : {&eval, &zero}) {
      Tensor out = d->forward(rt, x);
      Tensor dx = d->backward(rt, dout);
      for (int64_t i = 0; i < n; i++) {
        REQUIRE(out.f32()[i] == x.f32()[i]);
        REQUIRE(dx.f32()[i] == dout.f32()[i]);
      }
    }
  }
}

TEST_CASE("Flatten is a view forward and backward", "[gradcheck]") {
  Runtime rt;
  Rng rng(7);
  Flatten flat;
  Tensor x = random_tensor(rt, {3, 1, 5, 7}, rng);
  Tensor y = flat.forward(rt, x);
  CHECK(y.shape() == Shape{3, 35});
  CHECK(y.data() == x.data());
  gradcheck_layer(rt, flat, x, rng);
  Tensor dx = flat.backward(rt, random_tensor(rt, {3, 35}, rng));
  CHECK(dx.shape() == x.shape());
}

TEST_CASE("MaxPool2d backward matches finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(8);
  Tolerance tol;
  tol.eps = 1e-2f;  // values are 0.05 apart: a step of 0.01 never changes which entry wins
  SECTION("kernel 2, stride 2 on 7x5: the last row and column are dropped") {
    MaxPool2d pool(2);
    gradcheck_layer(rt, pool, distinct_values(rt, {1, 3, 7, 5}, rng, 0.05f), rng, tol);
  }
  SECTION("kernel 3, stride 2: overlapping windows share a maximum, whose gradient adds up") {
    MaxPool2d pool(3, 2);
    gradcheck_layer(rt, pool, distinct_values(rt, {2, 1, 7, 7}, rng, 0.05f), rng, tol);
  }
}

TEST_CASE("MaxPool2d sends a tie's gradient to the first entry and propagates NaN", "[gradcheck]") {
  Runtime rt;
  for (int64_t k : {2, 3}) {  // 2x2 stride 2 has its own fast path
    INFO("kernel " << k);
    MaxPool2d pool(k, 1);
    Tensor x = rt.zeros({1, 1, k, k}, Category::activations);
    x.f32()[k * k - 1] = -1.0f;  // the rest tie at 0
    pool.forward(rt, x);
    Tensor dout = rt.zeros({1, 1, 1, 1}, Category::activations);
    dout.f32()[0] = 1.0f;
    Tensor dx = pool.backward(rt, dout);
    CHECK(dx.f32()[0] == 1.0f);
    for (int64_t i = 1; i < k * k; i++) CHECK(dx.f32()[i] == 0.0f);
    x.f32()[1] = std::nanf("");
    CHECK(std::isnan(pool.forward(rt, x).f32()[0]));
  }
}

TEST_CASE("LayerNorm backward matches finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(9);
  for (Shape shape : {Shape{1, 7}, Shape{3, 5, 5}, Shape{2, 3}}) {
    INFO("input " << shape_str(shape));
    LayerNorm ln(rt, "ln", shape.back());
    fill_normal(ln.weight.data, rng, 1.0f, 0.5f);  // not 1 and 0, so their gradients matter
    fill_normal(ln.bias.data, rng, 0.0f, 0.5f);
    gradcheck_layer(rt, ln, random_tensor(rt, shape, rng, 2.0f), rng);
  }
}

TEST_CASE("BatchNorm2d backward (training, batch statistics) matches finite differences", "[gradcheck]") {
  Runtime rt;
  Rng rng(10);
  for (Shape shape : {Shape{2, 3, 3, 5}, Shape{1, 3, 1, 3}, Shape{5, 1, 1, 1}}) {
    INFO("input " << shape_str(shape));
    BatchNorm2d bn(rt, "bn", shape[1]);
    bn.init(rng);
    fill_normal(bn.weight.data, rng, 1.0f, 0.5f);
    fill_normal(bn.bias.data, rng, 0.0f, 0.5f);
    gradcheck_layer(rt, bn, random_tensor(rt, shape, rng, 2.0f), rng);
  }
}

TEST_CASE("BatchNorm2d running statistics follow PyTorch, and eval mode uses them", "[gradcheck]") {
  Runtime rt;
  Rng rng(11);
  const int64_t B = 3, C = 2, HW = 5;
  const double eps = 1e-5, momentum = 0.1;
  BatchNorm2d bn(rt, "bn", C);
  bn.init(rng);
  fill_normal(bn.weight.data, rng, 1.0f, 0.5f);
  fill_normal(bn.bias.data, rng, 0.0f, 0.5f);
  std::vector<double> rm(C, 0.0), rv(C, 1.0);  // PyTorch's initial running mean and variance
  for (int step = 0; step < 2; step++) {
    Tensor x = random_tensor(rt, {B, C, 1, HW}, rng, 3.0f);
    for (int64_t c = 0; c < C; c++) {
      double s = 0, ss = 0;
      for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < HW; i++) s += x.f32()[(b * C + c) * HW + i];
      const double mean = s / double(B * HW);
      for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < HW; i++) ss += std::pow(x.f32()[(b * C + c) * HW + i] - mean, 2);
      rm[size_t(c)] = (1 - momentum) * rm[size_t(c)] + momentum * mean;
      rv[size_t(c)] = (1 - momentum) * rv[size_t(c)] + momentum * ss / double(B * HW - 1);  // unbiased
    }
    bn.forward(rt, x);
  }
  for (int64_t c = 0; c < C; c++) {
    CHECK(bn.running_mean.data.f32()[c] == Approx(rm[size_t(c)]).epsilon(1e-5));
    CHECK(bn.running_var.data.f32()[c] == Approx(rv[size_t(c)]).epsilon(1e-5));
  }
  CHECK(bn.num_batches_tracked.data.f32()[0] == 2.0f);

  bn.set_training(false);
  Tensor x = random_tensor(rt, {1, C, 1, HW}, rng, 3.0f);  // batch 1 is fine in eval mode
  Tensor y = bn.forward(rt, x);
  for (int64_t c = 0; c < C; c++)
    for (int64_t i = 0; i < HW; i++) {
      const double ref = (x.f32()[c * HW + i] - rm[size_t(c)]) / std::sqrt(rv[size_t(c)] + eps) *
                             bn.weight.data.f32()[c] + bn.bias.data.f32()[c];
      CHECK(y.f32()[c * HW + i] == Approx(ref).epsilon(1e-5).margin(1e-6));
    }
  // eval forward leaves the statistics alone
  CHECK(bn.running_mean.data.f32()[0] == Approx(rm[0]).epsilon(1e-5));
  CHECK(bn.num_batches_tracked.data.f32()[0] == 2.0f);
}

TEST_CASE("BatchNorm2d refuses batch statistics of a single value", "[gradcheck]") {
  Runtime rt;
  BatchNorm2d bn(rt, "bn", 3);
  CHECK_THROWS_AS(bn.forward(rt, rt.zeros({1, 3, 1, 1}, Category::activations)), ShapeError);
}

TEST_CASE("Embedding backward matches finite differences, with repeated tokens", "[gradcheck]") {
  Runtime rt;
  Rng rng(12);
  const int64_t vocab = 7, block = 5, C = 3;
  Embedding emb(rt, "transformer.", vocab, block, C);
  fill_normal(emb.wte.data, rng, 0.0f, 1.0f);
  fill_normal(emb.wpe.data, rng, 0.0f, 1.0f);
  SECTION("B 2, T = block; token 3 appears four times, 0 and 6 never") {
    const std::vector<int32_t> tokens = {3, 1, 3, 3, 2, 5, 3, 1, 4, 2};
    Tensor out = emb.forward(rt, tokens, 2, 5);
    CHECK(out.shape() == Shape{2, 5, C});
    const Tensor R = random_tensor(rt, out.shape(), rng);
    emb.backward(rt, R);
    auto L = [&] { return weighted_sum(emb.forward(rt, tokens, 2, 5), R); };
    check_all_entries("wte", emb.wte.data, emb.wte.grad, L, {});
    check_all_entries("wpe", emb.wpe.data, emb.wpe.grad, L, {});
    for (int64_t row : {0, 6})
      for (int64_t i = 0; i < C; i++) CHECK(emb.wte.grad.f32()[row * C + i] == 0.0f);
  }
  SECTION("B 1, T 3 < block: positions 3 and 4 get no gradient") {
    const std::vector<int32_t> tokens = {6, 6, 0};
    Tensor out = emb.forward(rt, tokens, 1, 3);
    const Tensor R = random_tensor(rt, out.shape(), rng);
    emb.backward(rt, R);
    auto L = [&] { return weighted_sum(emb.forward(rt, tokens, 1, 3), R); };
    check_all_entries("wte", emb.wte.data, emb.wte.grad, L, {});
    check_all_entries("wpe", emb.wpe.data, emb.wpe.grad, L, {});
    for (int64_t i = 3 * C; i < block * C; i++) CHECK(emb.wpe.grad.f32()[i] == 0.0f);
  }
  SECTION("bad inputs are refused") {
    CHECK_THROWS_AS(emb.forward(rt, std::vector<int32_t>(6, 0), 1, 6), ShapeError);  // T > block
    CHECK_THROWS_AS(emb.forward(rt, {0, 7}, 1, 2), DataError);                      // id >= vocab
    CHECK_THROWS_AS(emb.forward(rt, {0, 1, 2}, 1, 2), ShapeError);                  // count != B*T
  }
}

TEST_CASE("CausalSelfAttention backward matches finite differences", "[gradcheck]") {
  struct Case { int64_t B, T, C, NH; };
  for (Case k : {Case{2, 5, 6, 2}, Case{1, 1, 3, 1}, Case{1, 7, 6, 3}}) {
    INFO("B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.NH);
    Runtime rt;
    Rng rng(13);
    CausalSelfAttention attn(rt, "attn", k.C, k.NH);
    attn.c_attn.init(rng);
    attn.c_proj.init(rng);
    fill_normal(attn.c_attn.weight.data, rng, 0.0f, 0.7f);  // sharp enough that softmax isn't uniform
    gradcheck_layer(rt, attn, random_tensor(rt, {k.B, k.T, k.C}, rng), rng);
  }
}

TEST_CASE("CausalSelfAttention is causal: a later position never changes an earlier output", "[gradcheck]") {
  Runtime rt;
  Rng rng(14);
  const int64_t B = 2, T = 7, C = 6, changed = 4;
  CausalSelfAttention attn(rt, "attn", C, 2);
  attn.c_attn.init(rng);
  attn.c_proj.init(rng);
  Tensor x = random_tensor(rt, {B, T, C}, rng);
  Tensor y0 = attn.forward(rt, x);
  Tensor x2 = x.clone(Category::activations, DType::f32);
  for (int64_t i = 0; i < C; i++) x2.f32()[(0 * T + changed) * C + i] += 1.0f;  // batch 0, position 4
  Tensor y1 = attn.forward(rt, x2);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      double diff = 0;
      for (int64_t i = 0; i < C; i++) diff = std::max(diff, double(std::abs(y1.f32()[(b * T + t) * C + i] - y0.f32()[(b * T + t) * C + i])));
      INFO("batch " << b << " position " << t);
      if (b == 0 && t >= changed) CHECK(diff > 1e-3);  // the change does reach later positions
      else CHECK(diff <= 1e-6);                         // and nothing before it, nor the other sequence
    }
}

TEST_CASE("CrossEntropyLoss backward matches finite differences of the loss", "[gradcheck]") {
  Runtime rt;
  Rng rng(15);
  struct Case { int64_t N, V; std::vector<int32_t> targets; };
  for (const Case& k : {Case{5, 7, {3, -1, 0, 6, 3}}, Case{1, 3, {2}}, Case{3, 1, {0, -1, 0}}}) {
    INFO("N " << k.N << " V " << k.V);
    Tensor logits = random_tensor(rt, {k.N, k.V}, rng, 2.0f);
    CrossEntropyLoss ce;
    int64_t correct = -1;
    const double loss = ce.forward(rt, logits, k.targets, &correct);
    Tensor d = ce.backward(rt, 1.0f);

    // the loss itself, from the definition: mean over non-ignored rows of logsumexp − logit[target]
    double ref = 0;
    int64_t count = 0, hits = 0;
    for (int64_t n = 0; n < k.N; n++) {
      const int32_t t = k.targets[size_t(n)];
      if (t < 0) continue;
      const float* x = logits.f32() + n * k.V;
      double lse = 0;
      for (int64_t v = 0; v < k.V; v++) lse += std::exp(double(x[v]));
      ref += std::log(lse) - x[t];
      count++;
      hits += std::max_element(x, x + k.V) - x == t;
    }
    CHECK(loss == Approx(ref / double(count)).epsilon(1e-6));
    CHECK(correct == hits);

    auto L = [&] {
      CrossEntropyLoss fresh;
      return fresh.forward(rt, logits, k.targets);
    };
    Tolerance tol;
    tol.eps = 1e-3f;
    check_all_entries("logits", logits, d, L, tol);
    for (int64_t n = 0; n < k.N; n++)
      if (k.targets[size_t(n)] < 0)
        for (int64_t v = 0; v < k.V; v++) CHECK(d.f32()[n * k.V + v] == 0.0f);

    // backward(scale) is scale times the gradient of the mean (gradient accumulation's 1/steps)
    ce.forward(rt, logits, k.targets);
    Tensor half = ce.backward(rt, 0.5f);
    for (int64_t i = 0; i < d.numel(); i++) CHECK(half.f32()[i] == Approx(0.5 * d.f32()[i]).margin(1e-9));
  }
}

TEST_CASE("CrossEntropyLoss with every target ignored is 0 with zero gradient", "[gradcheck]") {
  Runtime rt;
  Rng rng(16);
  CrossEntropyLoss ce;
  Tensor logits = random_tensor(rt, {2, 3}, rng);
  CHECK(ce.forward(rt, logits, {-1, -1}) == 0.0);
  Tensor d = ce.backward(rt, 1.0f);
  for (int64_t i = 0; i < d.numel(); i++) CHECK(d.f32()[i] == 0.0f);
}

// ---- whole models: a few parameter entries each, through the cross-entropy loss ----

namespace {

// Runs forward + loss + backward once (gradients from none), then checks `per_param` random entries of
// every parameter against central differences of the loss. A model with ReLUs and max pools is only
// piecewise smooth: a step of eps can cross a kink somewhere in the network and spoil that one difference.
// So an entry that disagrees at eps is measured again at eps/8, and a correct gradient must match that.
void gradcheck_model(Runtime& rt, Model& model, const Batch& batch, Rng& rng, int per_param, const Tolerance& tol) {
  model.zero_grad();
  CrossEntropyLoss ce;
  ce.forward(rt, model.forward(rt, batch), batch.targets);
  model.backward(rt, ce.backward(rt, 1.0f), nullptr);
  auto L = [&] {
    CrossEntropyLoss fresh;
    return fresh.forward(rt, model.forward(rt, batch), batch.targets);
  };
  for (Parameter* p : model.parameters()) {
    REQUIRE(p->grad.defined());
    std::vector<double> numeric;
    std::vector<float> analytic;
    for (int i = 0; i < per_param; i++) {
      float* v = p->data.f32() + rng.below(uint64_t(p->data.numel()));
      const float a = p->grad.f32()[v - p->data.f32()];
      double n = central_difference(v, tol.eps, L);
      if (std::abs(a - n) > allowed_error(n, 0.0, tol)) n = central_difference(v, tol.eps / 8, L);
      analytic.push_back(a);
      numeric.push_back(n);
    }
    compare_gradients(p->name, analytic.data(), numeric, tol);
  }
}

Batch image_batch(Runtime& rt, Rng& rng, int64_t B, int64_t C, int64_t H, int64_t W, int64_t classes) {
  Batch b;
  b.B = B;
  b.x = random_tensor(rt, {B, C, H, W}, rng);
  for (int64_t i = 0; i < B; i++) b.targets.push_back(int32_t(rng.below(uint64_t(classes))));
  return b;
}

}  // namespace

TEST_CASE("mlp and cifar_cnn parameter gradients match finite differences of the loss", "[gradcheck]") {
  Runtime rt;
  Rng rng(17);
  ModelSpec spec;
  spec.in_channels = 3;
  spec.height = 8;
  spec.width = 8;
  spec.num_classes = 5;
  // The loss is float32 arithmetic: its noise (~1e-7) over 2·eps makes ~1e-4 the absolute floor of what a
  // difference can resolve, against gradients of 1e-2 to 1e-1.
  Tolerance tol;
  tol.eps = 1e-3f;
  tol.floor = 0;
  tol.atol = 1e-4;
  SECTION("mlp") {
    spec.name = "mlp";
    spec.hidden = {7, 5};
    auto model = build_model(rt, spec);
    model->init(1);
    gradcheck_model(rt, *model, image_batch(rt, rng, 3, 3, 8, 8, 5), rng, 4, tol);
  }
  SECTION("cifar_cnn") {
    spec.name = "cifar_cnn";
    auto model = build_model(rt, spec);
    model->init(2);
    gradcheck_model(rt, *model, image_batch(rt, rng, 2, 3, 8, 8, 5), rng, 4, tol);
  }
  SECTION("cifar_cnn with batchnorm (training mode)") {
    spec.name = "cifar_cnn";
    spec.batchnorm = true;
    auto model = build_model(rt, spec);
    model->init(3);
    gradcheck_model(rt, *model, image_batch(rt, rng, 2, 3, 8, 8, 5), rng, 4, tol);
    // BatchNorm subtracts each channel's mean, so the bias of the conv before it has no effect at all
    for (Parameter* p : model->parameters())
      if (p->name == "conv1.bias" || p->name == "conv2.bias")
        for (int64_t i = 0; i < p->grad.numel(); i++) CHECK(std::abs(p->grad.f32()[i]) < 1e-6);
  }
}

TEST_CASE("gpt parameter gradients match finite differences of the loss (tied lm_head)", "[gradcheck]") {
  Runtime rt;
  Rng rng(18);
  ModelSpec spec;
  spec.name = "gpt";
  spec.vocab_size = 11;
  spec.block_size = 8;
  spec.n_layer = 2;
  spec.n_head = 2;
  spec.n_embd = 8;
  auto model = build_model(rt, spec);
  model->init(4);
  // GPT-2's N(0, 0.02) makes the logits nearly uniform and the gradients tiny; spread every parameter
  // (biases and LayerNorm affines too) so that each term of the backward carries weight.
  for (Parameter* p : model->parameters())
    for (int64_t i = 0; i < p->data.numel(); i++) p->data.f32()[i] += rng.normal() * 0.3f;
  Batch b;
  b.B = 2;
  b.T = 5;
  for (int i = 0; i < 10; i++) {
    b.tokens.push_back(int32_t(rng.below(11)));
    b.targets.push_back(int32_t(rng.below(11)));
  }
  b.tokens[3] = b.tokens[1];  // a repeated token, whose wte row gathers two gradients
  b.targets[7] = -1;          // an ignored position
  // GPT is smooth, so the larger step of the layer checks works; the absolute floor covers gradients that
  // are zero (see below) or nearly so, where the float noise of the loss over 2·eps (~1e-5) is all there is.
  Tolerance tol;
  tol.floor = 0;
  tol.atol = 5e-5;
  gradcheck_model(rt, *model, b, rng, 4, tol);
  // Adding a bias to every key adds q·b_k to a whole row of scores, which softmax ignores: that part of
  // c_attn's bias (entries C..2C) gets exactly no gradient.
  for (Parameter* p : model->parameters())
    if (p->name.find("c_attn.bias") != std::string::npos)
      for (int64_t i = spec.n_embd; i < 2 * spec.n_embd; i++) CHECK(std::abs(p->grad.f32()[i]) < 1e-6);
}

// ---- naive vs optimized kernels ----

TEST_CASE("matmul_forward matches matmul_forward_naive on awkward sizes", "[gradcheck]") {
  struct Case { int64_t N, C, OC; };
  for (Case k : {Case{1, 1, 1}, Case{1, 7, 3}, Case{5, 3, 7}, Case{13, 17, 11}, Case{3, 0, 5}, Case{0, 4, 2}}) {
    for (bool with_bias : {true, false}) {
      INFO("N " << k.N << " C " << k.C << " OC " << k.OC << (with_bias ? " with bias" : " no bias"));
      Runtime rt;
      Rng rng(19);
      Tensor x = random_tensor(rt, {k.N, k.C}, rng), w = random_tensor(rt, {k.OC, k.C}, rng);
      Tensor bias = random_tensor(rt, {k.OC}, rng);
      Tensor fast = rt.empty({k.N, k.OC}, Category::activations), slow = rt.empty({k.N, k.OC}, Category::activations);
      const float* bp = with_bias ? bias.f32() : nullptr;
      matmul_forward(rt, fast.f32(), x.f32(), w.f32(), bp, k.N, k.C, k.OC);
      matmul_forward_naive(slow.f32(), x.f32(), w.f32(), bp, k.N, k.C, k.OC);
      for (int64_t n = 0; n < k.N; n++)
        for (int64_t o = 0; o < k.OC; o++) {
          double magnitude = bp ? std::abs(bp[o]) : 0.0;  // Σ|terms|: the scale of float rounding
          for (int64_t c = 0; c < k.C; c++) magnitude += std::abs(x.f32()[n * k.C + c] * w.f32()[o * k.C + c]);
          CHECK(std::abs(fast.f32()[n * k.OC + o] - slow.f32()[n * k.OC + o]) <= 1e-6 * magnitude + 1e-30);
        }
    }
  }
}

namespace {

// conv2d_forward against the seven-loop conv2d_forward_naive, with and without a bias
void compare_conv_with_naive(const ConvShape& s) {
  for (bool with_bias : {true, false}) {
    INFO("B " << s.B << " C " << s.C << " H " << s.H << " W " << s.W << " OC " << s.OC << " K " << s.K
              << " stride " << s.stride << " pad " << s.pad << (with_bias ? " with bias" : " no bias"));
    Runtime rt;
    Rng rng(20);
    Tensor x = random_tensor(rt, {s.B, s.C, s.H, s.W}, rng), w = random_tensor(rt, {s.OC, s.C, s.K, s.K}, rng);
    Tensor bias = random_tensor(rt, {s.OC}, rng);
    const Shape out_shape = {s.B, s.OC, s.OH(), s.OW()};
    Tensor fast = rt.empty(out_shape, Category::activations), slow = rt.empty(out_shape, Category::activations);
    Tensor col = rt.empty({s.CKK(), s.B * s.OH() * s.OW()}, Category::activations, "im2col columns");
    const float* bp = with_bias ? bias.f32() : nullptr;
    conv2d_forward(rt, fast.f32(), col.f32(), x.f32(), w.f32(), bp, s);
    conv2d_forward_naive(slow.f32(), x.f32(), w.f32(), bp, s);
    // each output sums at most C·K·K products of N(0,1) values: 1e-5 absolute is a few hundred ulps
    for (int64_t i = 0; i < fast.numel(); i++) CHECK(fast.f32()[i] == Approx(slow.f32()[i]).margin(1e-5));
  }
}

}  // namespace

TEST_CASE("conv2d_forward (im2col + GEMM) matches conv2d_forward_naive on awkward shapes", "[gradcheck]") {
  // {B, C, H, W, OC, K, stride, pad}
  for (ConvShape s : {ConvShape{1, 1, 1, 1, 1, 1, 1, 0}, ConvShape{1, 3, 7, 5, 5, 3, 1, 1},
                      ConvShape{2, 3, 7, 5, 4, 3, 2, 0}, ConvShape{2, 2, 5, 7, 3, 2, 2, 1},
                      ConvShape{1, 3, 4, 4, 2, 4, 1, 0}, ConvShape{3, 1, 6, 6, 1, 1, 3, 0},
                      ConvShape{1, 2, 3, 3, 2, 3, 1, 2}, ConvShape{1, 1, 2, 3, 1, 3, 2, 2},
                      ConvShape{1, 2, 9, 8, 3, 3, 3, 1},
                      // past one block of kConvImageBlock (8) images: a full block and a remainder, two and a remainder
                      ConvShape{11, 2, 5, 4, 3, 3, 1, 1}, ConvShape{17, 3, 6, 6, 4, 3, 2, 1}})
    compare_conv_with_naive(s);
}

// conv2d_backward works a block of images at a time: over 2 blocks and a remainder it must give each image's
// input gradient, and the sum over images of the weight and bias gradients, that one image at a time gives.
TEST_CASE("conv2d_backward in blocks of images equals the per-image gradients, summed", "[gradcheck]") {
  for (ConvShape s : {ConvShape{19, 3, 6, 5, 4, 3, 1, 1}, ConvShape{9, 2, 7, 7, 3, 3, 2, 1}}) {
    INFO("B " << s.B << " stride " << s.stride);
    Runtime rt;
    Rng rng(21);
    const int64_t OHW = s.OH() * s.OW(), img = s.C * s.H * s.W;
    Tensor x = random_tensor(rt, {s.B, s.C, s.H, s.W}, rng), w = random_tensor(rt, {s.OC, s.C, s.K, s.K}, rng);
    Tensor dy = random_tensor(rt, {s.B, s.OC, s.OH(), s.OW()}, rng);
    std::vector<float> out(size_t(s.B * s.OC * OHW)), col(size_t(s.CKK() * s.B * OHW)), dx(size_t(s.B * img));
    std::vector<float> dw(size_t(s.OC * s.CKK())), db(size_t(s.OC));
    conv2d_forward(rt, out.data(), col.data(), x.f32(), w.f32(), nullptr, s);
    conv2d_backward(rt, dx.data(), dw.data(), db.data(), dy.f32(), col.data(), w.f32(), s);
    ConvShape one = s;
    one.B = 1;
    std::vector<float> dx1(static_cast<size_t>(img)), dw1(dw.size()), db1(db.size()), out1(static_cast<size_t>(s.OC * OHW)),
        col1(static_cast<size_t>(s.CKK() * OHW));
    for (int64_t b = 0; b < s.B; b++) {
      conv2d_forward(rt, out1.data(), col1.data(), x.f32() + b * img, w.f32(), nullptr, one);
      conv2d_backward(rt, dx1.data(), dw1.data(), db1.data(), dy.f32() + b * s.OC * OHW, col1.data(), w.f32(), one);  // dw1, db1 accumulate
      for (int64_t i = 0; i < img; i++) CHECK(dx[size_t(b * img + i)] == Approx(dx1[size_t(i)]).margin(1e-5));
    }
    for (size_t i = 0; i < dw.size(); i++) CHECK(dw[i] == Approx(dw1[i]).margin(1e-4));
    for (size_t i = 0; i < db.size(); i++) CHECK(db[i] == Approx(db1[i]).margin(1e-4));
  }
}

// A kernel column can lie wholly right of the image (K > W + pad): the fast im2col/col2im must then
// read and write nothing there. A finite-difference check can't see such a bug (col2im is the adjoint of
// im2col); the naive convolution does.
TEST_CASE("conv2d with a kernel wider than image + padding, stride 2 (3x3/s2/p1 on a 1x1 image)",
          "[gradcheck]") {
  for (ConvShape s : {ConvShape{1, 2, 1, 1, 1, 3, 2, 1}, ConvShape{1, 2, 2, 1, 2, 3, 2, 1},
                      ConvShape{2, 1, 1, 1, 2, 5, 2, 2}})
    compare_conv_with_naive(s);
}

TEST_CASE("ReLU passes NaN through, as PyTorch's does (a NaN input must not become a silent 0)", "[gradcheck]") {
  Runtime rt;
  const float in[4] = {-1.0f, 2.0f, std::nanf(""), -0.0f};
  float out[4];
  relu_forward(rt, out, in, 4);
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == 2.0f);
  CHECK(std::isnan(out[2]));
  CHECK(out[3] == 0.0f);
}

TEST_CASE("flash attention (FlashAttention-2's tiles) equals the naive kernels within fp32 rounding, on awkward T and head sizes", "[gradcheck][flash]") {
  struct Case { int64_t B, T, C, NH; };
  // T around the 64-wide tile (1, 63, 64, 65, 130), head sizes 1, 3, 8, 24
  for (Case k : {Case{1, 1, 8, 1}, Case{2, 5, 3, 1}, Case{1, 63, 12, 4}, Case{2, 64, 48, 2}, Case{1, 65, 24, 8}, Case{2, 130, 40, 5},
                 Case{1, 200, 24, 1}}) {
    INFO("B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.NH);
    Runtime rt;
    Rng rng(21);
    Tensor qkv = random_tensor(rt, {k.B, k.T, 3 * k.C}, rng), dout = random_tensor(rt, {k.B, k.T, k.C}, rng);
    // naive: the probabilities in memory
    Tensor y = rt.empty({k.B, k.T, k.C}, Category::activations), att = rt.empty({k.B, k.NH, k.T, k.T}, Category::activations);
    Tensor dqkv = rt.empty({k.B, k.T, 3 * k.C}, Category::activations);
    attention_forward(rt, y.f32(), att.f32(), qkv.f32(), k.B, k.T, k.C, k.NH);
    attention_backward(rt, dqkv.f32(), dout.f32(), qkv.f32(), att.f32(), k.B, k.T, k.C, k.NH);
    // flash: tiles, an online softmax, the log-sum-exps
    Tensor fy = rt.empty({k.B, k.T, k.C}, Category::activations), lse = rt.empty({k.B, k.NH, k.T}, Category::activations);
    Tensor fdqkv = rt.empty({k.B, k.T, 3 * k.C}, Category::activations);
    flash_attention_forward(rt, fy.f32(), lse.f32(), qkv.f32(), k.B, k.T, k.C, k.NH);
    flash_attention_backward(rt, fdqkv.f32(), dout.f32(), qkv.f32(), fy.f32(), lse.f32(), k.B, k.T, k.C, k.NH);
    auto max_diff = [](const Tensor& a, const Tensor& b) {
      double m = 0, scale = 0;
      for (int64_t i = 0; i < a.numel(); i++) {
        m = std::max(m, double(std::abs(a.f32()[i] - b.f32()[i])));
        scale = std::max(scale, double(std::abs(b.f32()[i])));
      }
      return m / std::max(scale, 1.0);
    };
    CHECK(max_diff(fy, y) < 2e-6);        // measured up to 2.6e-7
    CHECK(max_diff(fdqkv, dqkv) < 5e-6);  // measured up to 5.4e-7
    // lse is log Σ_s≤t exp(q·k_s / √hs), in double here
    const int64_t hs = k.C / k.NH;
    double worst = 0;
    for (int64_t b = 0; b < k.B; b++)
      for (int64_t h = 0; h < k.NH; h++)
        for (int64_t t = 0; t < k.T; t++) {
          std::vector<double> s;
          for (int64_t u = 0; u <= t; u++) {
            double dot = 0;
            for (int64_t d = 0; d < hs; d++)
              dot += double(qkv.f32()[(b * k.T + t) * 3 * k.C + h * hs + d]) * qkv.f32()[(b * k.T + u) * 3 * k.C + k.C + h * hs + d];
            s.push_back(dot / std::sqrt(double(hs)));
          }
          const double mx = *std::max_element(s.begin(), s.end());
          double sum = 0;
          for (double x : s) sum += std::exp(x - mx);
          worst = std::max(worst, std::abs(lse.f32()[(b * k.NH + h) * k.T + t] - (mx + std::log(sum))));
        }
    CHECK(worst < 5e-6);  // measured up to 6.5e-7
  }
  // the FLOPs it records skip the tiles above the diagonal: at T = 1024 a little over half the naive score work
  const double naive = 4.0 * 1024 * 1024 * 64, flash = flash_attention_flops(1, 1024, 64, 1, false) - 6.0 * 136 * 64 * 64;
  CHECK(flash / naive == Approx(0.5 + 0.5 / 16));
}

// ---- LLaMA's layers (core/nn/llama.h) ----

TEST_CASE("RMSNorm, LlamaAttention (RoPE, grouped-query heads) and LlamaMLP (SwiGLU) backward match finite differences", "[gradcheck][llama]") {
  Runtime rt;
  Rng rng(22);
  {
    RMSNorm norm(rt, "norm", 6, 1e-5f);
    fill_normal(norm.weight.data, rng, 1.0f, 0.5f);
    gradcheck_layer(rt, norm, random_tensor(rt, {2, 3, 6}, rng), rng);
  }
  struct Case { int64_t B, T, C, H, KV; };
  for (Case k : {Case{2, 5, 8, 2, 2}, Case{1, 6, 16, 4, 2}, Case{1, 4, 12, 3, 1}, Case{1, 1, 4, 1, 1}}) {
    INFO("B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.H << " kv heads " << k.KV);
    LlamaAttention attn(rt, "attn", k.C, k.H, k.KV, 10000.0f);
    for (Parameter* w : attn.parameters()) fill_normal(w->data, rng, 0.0f, 0.6f);
    gradcheck_layer(rt, attn, random_tensor(rt, {k.B, k.T, k.C}, rng), rng);
  }
  {
    LlamaMLP mlp(rt, "mlp", 6, 10);
    for (Parameter* w : mlp.parameters()) fill_normal(w->data, rng, 0.0f, 0.5f);
    gradcheck_layer(rt, mlp, random_tensor(rt, {2, 3, 6}, rng), rng);
  }
}

TEST_CASE("RoPE turns each pair by its position: norms kept, q·k depends on t - s only, and the inverse undoes it", "[gradcheck][llama]") {
  Runtime rt;
  Rng rng(23);
  const int64_t T = 9, H = 2, hd = 8, ld = H * hd;
  Tensor q = random_tensor(rt, {1, T, ld}, rng), k = random_tensor(rt, {1, T, ld}, rng);
  // the same vector at every position, so that a dot product can only depend on the positions
  for (int64_t t = 1; t < T; t++)
    for (int64_t i = 0; i < ld; i++) q.f32()[t * ld + i] = q.f32()[i], k.f32()[t * ld + i] = k.f32()[i];
  const std::vector<float> q0(q.f32(), q.f32() + T * ld);
  rope_apply(rt, q.f32(), 1, T, H, hd, ld, 10000.0f, false);
  rope_apply(rt, k.f32(), 1, T, H, hd, ld, 10000.0f, false);
  auto dot = [&](int64_t t, int64_t s) {
    double d = 0;
    for (int64_t i = 0; i < hd; i++) d += double(q.f32()[t * ld + i]) * k.f32()[s * ld + i];
    return d;
  };
  auto norm = [&](const float* v) {
    double n = 0;
    for (int64_t i = 0; i < hd; i++) n += double(v[i]) * v[i];
    return std::sqrt(n);
  };
  for (int64_t t = 0; t < T; t++) CHECK(norm(q.f32() + t * ld) == Approx(norm(q0.data())).epsilon(1e-6));
  CHECK(dot(5, 2) == Approx(dot(7, 4)).epsilon(1e-5));
  CHECK(dot(3, 3) == Approx(dot(8, 8)).epsilon(1e-5));
  CHECK(std::abs(dot(5, 2) - dot(5, 3)) > 1e-3);  // and it does depend on the distance
  rope_apply(rt, q.f32(), 1, T, H, hd, ld, 10000.0f, true);
  for (int64_t i = 0; i < T * ld; i++) CHECK(q.f32()[i] == Approx(q0[size_t(i)]).margin(1e-6));
}

TEST_CASE("llama parameter gradients match finite differences of the loss (untied lm_head, grouped-query heads)", "[gradcheck][llama]") {
  Runtime rt;
  Rng rng(24);
  ModelSpec spec;
  spec.name = "llama";
  spec.vocab_size = 11;
  spec.block_size = 8;
  spec.n_layer = 2;
  spec.n_head = 4;
  spec.n_kv_head = 2;
  spec.n_embd = 8;
  spec.intermediate_size = 12;
  auto model = build_model(rt, spec);
  model->init(4);
  for (Parameter* p : model->parameters())
    for (int64_t i = 0; i < p->data.numel(); i++) p->data.f32()[i] += rng.normal() * 0.3f;
  Batch b;
  b.B = 2;
  b.T = 5;
  for (int i = 0; i < 10; i++) {
    b.tokens.push_back(int32_t(rng.below(11)));
    b.targets.push_back(int32_t(rng.below(11)));
  }
  b.tokens[3] = b.tokens[1];
  b.targets[7] = -1;
  Tolerance tol;
  tol.floor = 0;
  tol.atol = 5e-5;
  gradcheck_model(rt, *model, b, rng, 4, tol);
}
