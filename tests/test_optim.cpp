// Optimizers and learning-rate schedules against the update rules written out by hand (PyTorch's
// torch.optim.SGD, torch.optim.AdamW, clip_grad_norm_, StepLR, cosine with warmup). Expected values are
// formulas evaluated in double here, step by step, never numbers stored from a previous run.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/layer.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/tensor/runtime.h"

using namespace distlab;

namespace {

using Values = std::vector<double>;

Parameter make_param(Runtime& rt, const std::string& name, const Values& values, bool decay = true) {
  Parameter p = make_parameter(rt, name, {int64_t(values.size())}, decay);
  for (size_t i = 0; i < values.size(); i++) p.data.f32()[i] = float(values[i]);
  return p;
}

void set_grad(Parameter& p, const Values& g) {
  Tensor& t = p.grad_for_accumulate();
  for (size_t i = 0; i < g.size(); i++) t.f32()[i] = float(g[i]);
}

void check_values(const Parameter& p, const Values& expected) {
  REQUIRE(p.data.numel() == int64_t(expected.size()));
  for (size_t i = 0; i < expected.size(); i++) {
    INFO(p.name << "[" << i << "]");
    CHECK(p.data.f32()[i] == Approx(expected[i]).epsilon(1e-6).margin(1e-7));
  }
}

// Three steps of fixed gradients on a 3-element parameter, the same for every SGD case
const Values kStart = {1.0, -2.0, 0.5};
const std::vector<Values> kGrads = {{0.5, -1.0, 2.0}, {0.25, 2.0, -1.0}, {-1.0, 0.5, 0.125}};
constexpr float kLr = 0.1f;

// Runs SGD for kGrads.size() steps and checks the parameter after each against `expected[step]`.
void run_sgd(const SGDOptions& o, const std::vector<Values>& expected) {
  Runtime rt;
  Parameter p = make_param(rt, "w", kStart);
  SGD sgd({&p}, o);
  for (size_t step = 0; step < kGrads.size(); step++) {
    INFO("after step " << step + 1);
    set_grad(p, kGrads[step]);
    sgd.step(rt, kLr);
    check_values(p, expected[step]);
  }
  CHECK(sgd.steps() == int64_t(kGrads.size()));
}

}  // namespace

TEST_CASE("SGD without momentum: p -= lr * g", "[optim]") {
  std::vector<Values> expected(3, Values(3));
  for (size_t i = 0; i < 3; i++) {
    const double g1 = kGrads[0][i], g2 = kGrads[1][i], g3 = kGrads[2][i];
    expected[0][i] = kStart[i] - kLr * g1;
    expected[1][i] = kStart[i] - kLr * (g1 + g2);
    expected[2][i] = kStart[i] - kLr * (g1 + g2 + g3);
  }
  run_sgd({}, expected);
}

TEST_CASE("SGD with momentum: the buffer starts at the first gradient", "[optim]") {
  const double mu = 0.9;
  std::vector<Values> expected(3, Values(3));
  for (size_t i = 0; i < 3; i++) {
    const double g1 = kGrads[0][i], g2 = kGrads[1][i], g3 = kGrads[2][i];
    const double b1 = g1, b2 = mu * b1 + g2, b3 = mu * b2 + g3;
    expected[0][i] = kStart[i] - kLr * b1;
    expected[1][i] = expected[0][i] - kLr * b2;
    expected[2][i] = expected[1][i] - kLr * b3;
  }
  SGDOptions o;
  o.momentum = float(mu);
  run_sgd(o, expected);
}

TEST_CASE("SGD with momentum and dampening: the first step is not dampened", "[optim]") {
  const double mu = 0.9, damp = 0.5;
  std::vector<Values> expected(3, Values(3));
  for (size_t i = 0; i < 3; i++) {
    const double g1 = kGrads[0][i], g2 = kGrads[1][i], g3 = kGrads[2][i];
    const double b1 = g1, b2 = mu * b1 + (1 - damp) * g2, b3 = mu * b2 + (1 - damp) * g3;
    expected[0][i] = kStart[i] - kLr * b1;
    expected[1][i] = expected[0][i] - kLr * b2;
    expected[2][i] = expected[1][i] - kLr * b3;
  }
  SGDOptions o;
  o.momentum = float(mu);
  o.dampening = float(damp);
  run_sgd(o, expected);
}

TEST_CASE("SGD with Nesterov momentum: the step is g + momentum * buf", "[optim]") {
  const double mu = 0.9;
  std::vector<Values> expected(3, Values(3));
  for (size_t i = 0; i < 3; i++) {
    const double g1 = kGrads[0][i], g2 = kGrads[1][i], g3 = kGrads[2][i];
    const double b1 = g1, b2 = mu * b1 + g2, b3 = mu * b2 + g3;
    expected[0][i] = kStart[i] - kLr * (g1 + mu * b1);
    expected[1][i] = expected[0][i] - kLr * (g2 + mu * b2);
    expected[2][i] = expected[1][i] - kLr * (g3 + mu * b3);
  }
  SGDOptions o;
  o.momentum = float(mu);
  o.nesterov = true;
  run_sgd(o, expected);
}

TEST_CASE("SGD weight decay adds wd * p to the gradient, before momentum", "[optim]") {
  const double wd = 0.1, mu = 0.9;
  SECTION("without momentum") {
    std::vector<Values> expected(3, Values(3));
    for (size_t i = 0; i < 3; i++) {
      const double p0 = kStart[i];
      const double p1 = p0 - kLr * (kGrads[0][i] + wd * p0);
      const double p2 = p1 - kLr * (kGrads[1][i] + wd * p1);
      const double p3 = p2 - kLr * (kGrads[2][i] + wd * p2);
      expected[0][i] = p1;
      expected[1][i] = p2;
      expected[2][i] = p3;
    }
    SGDOptions o;
    o.weight_decay = float(wd);
    run_sgd(o, expected);
  }
  SECTION("with Nesterov momentum") {
    std::vector<Values> expected(3, Values(3));
    for (size_t i = 0; i < 3; i++) {
      const double p0 = kStart[i];
      const double d1 = kGrads[0][i] + wd * p0, b1 = d1;
      const double p1 = p0 - kLr * (d1 + mu * b1);
      const double d2 = kGrads[1][i] + wd * p1, b2 = mu * b1 + d2;
      const double p2 = p1 - kLr * (d2 + mu * b2);
      const double d3 = kGrads[2][i] + wd * p2, b3 = mu * b2 + d3;
      const double p3 = p2 - kLr * (d3 + mu * b3);
      expected[0][i] = p1;
      expected[1][i] = p2;
      expected[2][i] = p3;
    }
    SGDOptions o;
    o.momentum = float(mu);
    o.weight_decay = float(wd);
    o.nesterov = true;
    run_sgd(o, expected);
  }
}

TEST_CASE("SGD skips parameters without a gradient and counts its momentum as optimizer state", "[optim]") {
  Runtime rt;
  Parameter a = make_param(rt, "a", {1.0, 2.0, 3.0});
  Parameter b = make_param(rt, "b", {1.0, 1.0, 1.0, 1.0, 1.0});
  SECTION("momentum: 4 bytes per element of each parameter that has been stepped") {
    auto sgd = std::make_unique<SGD>(std::vector<Parameter*>{&a, &b}, SGDOptions{0.9f, 0.0f, 0.0f, false});
    CHECK(rt.memory.current(Category::optim_state) == 0);  // created on the first step, as PyTorch
    set_grad(a, {1.0, 1.0, 1.0});
    sgd->step(rt, 0.5f);
    check_values(b, {1.0, 1.0, 1.0, 1.0, 1.0});  // no gradient: untouched
    check_values(a, {0.5, 1.5, 2.5});
    CHECK(rt.memory.current(Category::optim_state) == 4 * 3);
    set_grad(b, {2.0, 2.0, 2.0, 2.0, 2.0});
    sgd->step(rt, 0.5f);
    // b's buffer starts now, at its own first gradient
    check_values(b, {0.0, 0.0, 0.0, 0.0, 0.0});
    check_values(a, {0.5 - 0.5 * 1.9, 1.5 - 0.5 * 1.9, 2.5 - 0.5 * 1.9});
    CHECK(rt.memory.current(Category::optim_state) == 4 * (3 + 5));
    sgd.reset();
    CHECK(rt.memory.current(Category::optim_state) == 0);
  }
  SECTION("no momentum: no state at all") {
    SGD sgd({&a, &b}, SGDOptions{});
    set_grad(a, {1.0, 1.0, 1.0});
    set_grad(b, {1.0, 1.0, 1.0, 1.0, 1.0});
    sgd.step(rt, 0.5f);
    CHECK(rt.memory.current(Category::optim_state) == 0);
  }
}

namespace {

// PyTorch's AdamW for one element, in double: decoupled decay, then the bias-corrected Adam step.
struct AdamWReference {
  double beta1, beta2, eps, wd;
  double p, m = 0, v = 0;
  int t = 0;
  void step(double g, double lr, bool decay) {
    t++;
    if (decay) p *= 1 - lr * wd;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

}  // namespace

TEST_CASE("AdamW's first step moves each element by about lr against its gradient's sign", "[optim]") {
  Runtime rt;
  const Values start = {1.0, -2.0, 0.5, 0.0};
  const Values grad = {0.5, -3.0, 1e-3, 40.0};
  Parameter p = make_param(rt, "w", start);
  AdamWOptions o;
  o.weight_decay = 0.0f;
  AdamW adam({&p}, o);
  set_grad(p, grad);
  adam.step(rt, 0.01f);
  // m̂ = g and v̂ = g², so the step is lr·g/(|g| + eps): lr·sign(g) up to eps/|g| <= 1e-5
  for (size_t i = 0; i < start.size(); i++)
    CHECK(p.data.f32()[i] == Approx(start[i] - 0.01 * (grad[i] > 0 ? 1 : -1)).margin(1e-6));
}

TEST_CASE("AdamW matches PyTorch's update over three steps, with decoupled weight decay", "[optim]") {
  Runtime rt;
  const double lrs[3] = {0.1, 0.05, 0.02};  // a schedule changes lr between steps
  AdamWOptions o{0.9f, 0.99f, 1e-8f, 0.1f};
  Parameter w = make_param(rt, "w", kStart);                       // decayed
  Parameter bias = make_param(rt, "bias", kStart, /*decay=*/false);  // as GPT's biases and norms
  AdamW adam({&w, &bias}, o);
  std::vector<AdamWReference> rw, rb;
  for (size_t i = 0; i < 3; i++) {
    rw.push_back({o.beta1, o.beta2, o.eps, o.weight_decay, kStart[i]});
    rb.push_back({o.beta1, o.beta2, o.eps, o.weight_decay, kStart[i]});
  }
  for (int step = 0; step < 3; step++) {
    INFO("after step " << step + 1);
    set_grad(w, kGrads[size_t(step)]);
    set_grad(bias, kGrads[size_t(step)]);
    adam.step(rt, float(lrs[step]));
    Values ew, eb;
    for (size_t i = 0; i < 3; i++) {
      rw[i].step(kGrads[size_t(step)][i], float(lrs[step]), true);
      rb[i].step(kGrads[size_t(step)][i], float(lrs[step]), false);
      ew.push_back(rw[i].p);
      eb.push_back(rb[i].p);
    }
    check_values(w, ew);
    check_values(bias, eb);
  }
  CHECK(adam.steps() == 3);
  // the state itself: exp_avg and exp_avg_sq of w after three steps
  for (size_t i = 0; i < 3; i++) {
    CHECK(adam.exp_avg()[0].f32()[i] == Approx(rw[i].m).epsilon(1e-6));
    CHECK(adam.exp_avg_sq()[0].f32()[i] == Approx(rw[i].v).epsilon(1e-6));
  }
}

TEST_CASE("AdamW decay only shrinks parameters marked decay", "[optim]") {
  Runtime rt;
  Parameter w = make_param(rt, "w", {2.0, -4.0});
  Parameter nd = make_param(rt, "norm.weight", {2.0, -4.0}, /*decay=*/false);
  AdamW adam({&w, &nd}, AdamWOptions{0.9f, 0.999f, 1e-8f, 0.5f});
  set_grad(w, {0.0, 0.0});  // a zero gradient: the Adam step is 0 / (0 + eps) = 0
  set_grad(nd, {0.0, 0.0});
  adam.step(rt, 0.1f);
  check_values(w, {2.0 * (1 - 0.1 * 0.5), -4.0 * (1 - 0.1 * 0.5)});
  check_values(nd, {2.0, -4.0});
}

TEST_CASE("AdamW skips parameters without a gradient, its state is 8 bytes per element", "[optim]") {
  Runtime rt;
  Parameter a = make_param(rt, "a", {1.0, 2.0, 3.0});
  Parameter b = make_param(rt, "b", {1.0, 1.0, 1.0, 1.0, 1.0});
  auto adam = std::make_unique<AdamW>(std::vector<Parameter*>{&a, &b}, AdamWOptions{});
  CHECK(rt.memory.current(Category::optim_state) == 0);
  set_grad(a, {1.0, -1.0, 1.0});
  adam->step(rt, 0.1f);
  check_values(b, {1.0, 1.0, 1.0, 1.0, 1.0});  // untouched: not even decayed
  CHECK(rt.memory.current(Category::optim_state) == 8 * 3);
  set_grad(b, {1.0, 1.0, 1.0, 1.0, 1.0});
  adam->step(rt, 0.1f);
  CHECK(rt.memory.current(Category::optim_state) == 8 * (3 + 5));
  adam.reset();
  CHECK(rt.memory.current(Category::optim_state) == 0);
}

// PyTorch keeps a step count per parameter (state["step"]), advanced only when the parameter is updated:
// a parameter whose first gradient arrives at step 2 starts at t = 1 (a step of ~lr·sign(g)).
TEST_CASE("AdamW keeps a step count per parameter, as PyTorch", "[optim]") {
  Runtime rt;
  Parameter a = make_param(rt, "a", {1.0});
  Parameter late = make_param(rt, "late", {1.0});
  AdamWOptions o;
  o.weight_decay = 0.0f;
  AdamW adam({&a, &late}, o);
  set_grad(a, {1.0});
  adam.step(rt, 0.1f);  // `late` has no gradient yet
  set_grad(late, {1.0});
  adam.step(rt, 0.1f);
  AdamWReference ref{o.beta1, o.beta2, o.eps, 0.0, 1.0};
  ref.step(1.0, 0.1f, false);  // late's first update: t = 1
  check_values(late, {ref.p});
}

TEST_CASE("clip_grad_norm returns the global norm and clips only above max_norm", "[optim]") {
  Runtime rt;
  Parameter a = make_param(rt, "a", {0.0, 0.0});
  Parameter b = make_param(rt, "b", {0.0});
  Parameter none = make_param(rt, "none", {0.0, 0.0, 0.0});  // no gradient: not part of the norm
  const std::vector<Parameter*> params = {&a, &b, &none};
  const double norm = std::sqrt(3.0 * 3.0 + 4.0 * 4.0 + 12.0 * 12.0);  // 13
  auto grads = [&] { return Values{a.grad.f32()[0], a.grad.f32()[1], b.grad.f32()[0]}; };
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});

  SECTION("below or at max_norm, or max_norm <= 0: unchanged") {
    for (double max_norm : {26.0, 13.0, 0.0, -1.0}) {
      INFO("max_norm " << max_norm);
      CHECK(clip_grad_norm(rt, params, max_norm) == Approx(norm).epsilon(1e-12));
      CHECK(grads() == Values{3.0, 4.0, 12.0});
    }
  }
  SECTION("above: scaled by max_norm / (norm + 1e-6)") {
    CHECK(clip_grad_norm(rt, params, 6.5) == Approx(norm).epsilon(1e-12));
    const double coef = 6.5 / (norm + 1e-6);
    const Values g = grads();
    CHECK(g[0] == Approx(3.0 * coef).epsilon(1e-6));
    CHECK(g[1] == Approx(4.0 * coef).epsilon(1e-6));
    CHECK(g[2] == Approx(12.0 * coef).epsilon(1e-6));
    CHECK(clip_grad_norm(rt, params, 0.0) == Approx(6.5).epsilon(1e-6));  // the norm is now max_norm
    CHECK(!none.grad.defined());
  }
  SECTION("no gradients at all: norm 0") {
    CHECK(clip_grad_norm(rt, {&none}, 1.0) == 0.0);
  }
  SECTION("a NaN norm: every gradient NaN, as PyTorch's clip_grad_norm_ (never a silent step without clipping)") {
    CHECK(std::isnan(clip_coefficient(std::nan(""), 1.0)));
    CHECK(clip_coefficient(std::nan(""), 0.0) == 1.0f);  // no clipping asked: nothing to poison
    CHECK(clip_coefficient(INFINITY, 1.0) == 0.0f);      // inf: max_norm / inf, as PyTorch
  }
}

TEST_CASE("constant schedule, with and without warmup", "[optim]") {
  Schedule s;
  s.kind = LrSchedule::constant;
  s.base_lr = 0.3;
  for (int64_t step : {0, 1, 7, 100000}) CHECK(s.lr_at(step) == Approx(0.3));
  s.warmup_steps = 4;  // lr = base·(step+1)/warmup while step < warmup
  for (int64_t step = 0; step < 4; step++) CHECK(s.lr_at(step) == Approx(0.3 * double(step + 1) / 4.0));
  CHECK(s.lr_at(3) == Approx(0.3));  // warmup ends at base, continuously
  CHECK(s.lr_at(4) == Approx(0.3));
  CHECK(s.lr_at(1000) == Approx(0.3));
}

TEST_CASE("step schedule multiplies by gamma every step_size steps", "[optim]") {
  Schedule s;
  s.kind = LrSchedule::step;
  s.base_lr = 0.1;
  s.step_size = 3;
  s.gamma = 0.5;
  CHECK(s.lr_at(0) == Approx(0.1));
  CHECK(s.lr_at(2) == Approx(0.1));           // step_size - 1: not yet
  CHECK(s.lr_at(3) == Approx(0.1 * 0.5));     // step_size
  CHECK(s.lr_at(5) == Approx(0.1 * 0.5));
  CHECK(s.lr_at(6) == Approx(0.1 * 0.25));    // 2·step_size
  CHECK(s.lr_at(31) == Approx(0.1 * std::pow(0.5, 10)));
  s.step_size = 1;  // every step
  CHECK(s.lr_at(4) == Approx(0.1 * std::pow(0.5, 4)));
}

TEST_CASE("cosine schedule: linear warmup, then half a cosine from base to min_lr", "[optim]") {
  Schedule s;
  s.kind = LrSchedule::cosine;
  s.base_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 110;
  auto cosine = [&](double progress) { return s.min_lr + 0.5 * (s.base_lr - s.min_lr) * (1 + std::cos(M_PI * progress)); };
  CHECK(s.lr_at(0) == Approx(1.0 / 10));                   // warmup: base·1/10
  CHECK(s.lr_at(4) == Approx(5.0 / 10));
  CHECK(s.lr_at(9) == Approx(1.0));                        // end of warmup
  CHECK(s.lr_at(10) == Approx(1.0));                       // progress 0: base
  CHECK(s.lr_at(35) == Approx(cosine(0.25)));
  CHECK(s.lr_at(60) == Approx((1.0 + 0.1) / 2));           // the middle: (base + min) / 2
  CHECK(s.lr_at(110) == Approx(0.1));                      // total: min_lr
  CHECK(s.lr_at(500) == Approx(0.1));                      // clamped after the end
  for (int64_t step = 10; step < 110; step++) CHECK(s.lr_at(step + 1) <= s.lr_at(step));

  SECTION("without warmup it starts at base") {
    s.warmup_steps = 0;
    s.total_steps = 7;
    CHECK(s.lr_at(0) == Approx(1.0));
    CHECK(s.lr_at(3) == Approx(cosine(3.0 / 7)));
    CHECK(s.lr_at(7) == Approx(0.1));
  }
}
