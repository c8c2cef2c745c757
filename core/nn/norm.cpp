#include "core/nn/norm.h"

#include <fmt/format.h>

#include <cmath>

#include "core/comm/process_group.h"
#include "core/ops/cpu/norm.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

LayerNorm::LayerNorm(Runtime& rt, const std::string& prefix, int64_t C, float eps) : C_(C), eps_(eps) {
  weight = make_parameter(rt, prefix + ".weight", {C}, false);
  bias = make_parameter(rt, prefix + ".bias", {C}, false);
}

std::string LayerNorm::describe() const { return fmt::format("LayerNorm({})", C_); }

void LayerNorm::init(Rng&) {
  weight.data.fill_(1.0f);
  bias.data.zero_();
}

Tensor LayerNorm::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {C_});
  const int64_t N = x.numel() / C_;
  Tensor out = rt.empty(x.shape(), Category::activations, "output of " + weight.name, rt.dtype);
  mean_ = rt.empty({N}, Category::activations, "LayerNorm mean");  // f32 statistics (autocast's fp32 list)
  rstd_ = rt.empty({N}, Category::activations, "LayerNorm rstd");
  if (device_16(rt, {&x, &weight.data, &bias.data})) {  // a device rank reads and writes the 16 bits themselves (the statistics stay f32)
    layernorm_forward_16(rt, out.data(), mean_.f32(), rstd_.f32(), x.data(), weight.data.data(), bias.data.data(), rt.dtype, N, C_, eps_);
  } else {
    AsF32 y(rt, out, AsF32::out), xf(rt, x), w(rt, weight.data), b(rt, bias.data);
    layernorm_forward(rt, y.p, mean_.f32(), rstd_.f32(), xf.p, w.p, b.p, N, C_, eps_);
    y.store();
  }
  saved_x_ = x;
  return out;
}

Tensor LayerNorm::backward(Runtime& rt, const Tensor& dout) {
  const int64_t N = saved_x_.numel() / C_;
  Tensor dx = rt.empty(saved_x_.shape(), Category::activations, "grad of " + weight.name, rt.dtype);
  Tensor gw = grad_or_scratch(rt, weight), gb = grad_or_scratch(rt, bias);
  if (device_16(rt, {&dout, &saved_x_, &weight.data, &gw, &gb})) {
    // a device rank reads and writes the 16 bits themselves
    layernorm_backward_16(rt, dx.data(), gw.data(), gb.data(), dout.data(), saved_x_.data(), weight.data.data(), mean_.f32(), rstd_.f32(),
                          rt.dtype, N, C_);
  } else {
    AsF32 d(rt, dx, AsF32::out), dw(rt, gw, AsF32::inout), db(rt, gb, AsF32::inout);
    AsF32 dy(rt, dout), xf(rt, saved_x_), w(rt, weight.data);
    layernorm_backward(rt, d.p, dw.p, db.p, dy.p, xf.p, w.p, mean_.f32(), rstd_.f32(), N, C_);
    d.store();
    dw.store();
    db.store();
  }
  saved_x_ = mean_ = rstd_ = Tensor();
  return dx;
}

BatchNorm2d::BatchNorm2d(Runtime& rt, const std::string& prefix, int64_t C, float eps, float momentum)
    : C_(C), eps_(eps), momentum_(momentum) {
  weight = make_parameter(rt, prefix + ".weight", {C}, false);
  bias = make_parameter(rt, prefix + ".bias", {C}, false);
  running_mean = Buffer{prefix + ".running_mean", rt.zeros({C}, Category::params, prefix + ".running_mean")};
  running_var = Buffer{prefix + ".running_var", rt.zeros({C}, Category::params, prefix + ".running_var")};
  running_var.data.fill_(1.0f);  // PyTorch starts the running variance at 1
  num_batches_tracked = Buffer{prefix + ".num_batches_tracked", rt.zeros({}, Category::params, prefix + ".num_batches_tracked")};
}

std::string BatchNorm2d::describe() const { return fmt::format("BatchNorm2d({})", C_); }

void BatchNorm2d::init(Rng&) {
  weight.data.fill_(1.0f);
  bias.data.zero_();
  running_mean.data.zero_();
  running_var.data.fill_(1.0f);
  num_batches_tracked.data.zero_();
}

Tensor BatchNorm2d::forward(Runtime& rt, const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != C_)
    throw ShapeError(fmt::format("{} {}: input of shape {} where [B, {}, H, W] was expected", describe(), weight.name,
                                 shape_str(x.shape()), C_));
  const int64_t B = x.size(0), HW = x.size(2) * x.size(3);
  Tensor out = rt.empty(x.shape(), Category::activations, "output of " + weight.name, rt.dtype);
  AsF32 xf(rt, x);  // statistics and normalisation in f32 (autocast's fp32 list); running stats stay f32
  mean_ = rt.empty({C_}, Category::activations, "BatchNorm mean");
  rstd_ = rt.empty({C_}, Category::activations, "BatchNorm rstd");
  if (training_) {
    if (B * HW < 2)
      throw ShapeError(fmt::format("{}: batch statistics need more than 1 value per channel, got input {}",
                                   weight.name, shape_str(x.shape())),
                       "use a larger train.micro_batch, or SyncBatchNorm across ranks");
    Tensor var = rt.empty({C_}, Category::activations, "BatchNorm var");
    batchnorm_stats(rt, mean_.f32(), var.f32(), xf.p, B, C_, HW);
    count_ = double(B * HW);
    if (!rt.is_meta()) {  // C values: on the host (a GPU rank copies them down and back up)
      OnHost m(mean_, OnHost::inout), v(var, OnHost::inout), r(rstd_, OnHost::out);
      OnHost rm(running_mean.data, OnHost::inout), rv(running_var.data, OnHost::inout), nb(num_batches_tracked.data, OnHost::inout);
      if (sync_) count_ = sync_statistics(rt, m.p, v.p, B * HW);
      const double n = count_;
      for (int64_t c = 0; c < C_; c++) {
        rm.p[c] = (1 - momentum_) * rm.p[c] + momentum_ * m.p[c];
        rv.p[c] = (1 - momentum_) * rv.p[c] + momentum_ * float(v.p[c] * n / (n - 1));
        r.p[c] = 1.0f / std::sqrt(v.p[c] + eps_);
      }
      nb.p[0] += 1.0f;
      m.store();
      r.store();
      rm.store();
      rv.store();
      nb.store();
    }
    saved_x_ = x;
  } else if (!rt.is_meta()) {
    OnHost m(mean_, OnHost::out), r(rstd_, OnHost::out), rm(running_mean.data), rv(running_var.data);
    for (int64_t c = 0; c < C_; c++) {
      m.p[c] = rm.p[c];
      r.p[c] = 1.0f / std::sqrt(rv.p[c] + eps_);
    }
    m.store();
    r.store();
  }
  {
    AsF32 y(rt, out, AsF32::out), w(rt, weight.data), b(rt, bias.data);
    batchnorm_apply(rt, y.p, xf.p, mean_.f32(), rstd_.f32(), w.p, b.p, B, C_, HW);
    y.store();
  }
  return out;
}

Tensor BatchNorm2d::backward(Runtime& rt, const Tensor& dout) {
  DL_ASSERT(saved_x_.defined(), "BatchNorm2d backward without a training forward");
  const int64_t B = saved_x_.size(0), HW = saved_x_.size(2) * saved_x_.size(3);
  Tensor dx = rt.empty(saved_x_.shape(), Category::activations, "grad of " + weight.name, rt.dtype);
  Tensor sums = rt.empty({2, C_}, Category::activations, "BatchNorm grad sums");
  float* sum_dy = sums.f32();
  float* sum_dy_xhat = sum_dy ? sum_dy + C_ : nullptr;
  AsF32 dy(rt, dout), xf(rt, saved_x_);
  batchnorm_backward_reduce(rt, sum_dy, sum_dy_xhat, dy.p, xf.p, mean_.f32(), rstd_.f32(), B, C_, HW);
  if (!rt.is_meta()) {  // C values each: on the host
    OnHost s(sums, OnHost::inout), dw(weight.grad_for_accumulate(), OnHost::inout), db(bias.grad_for_accumulate(), OnHost::inout);
    for (int64_t c = 0; c < C_; c++) {
      dw.p[c] += s.p[C_ + c];  // sum_dy_xhat
      db.p[c] += s.p[c];       // sum_dy
    }
    dw.store();
    db.store();
    // SyncBatchNorm: the parameter gradients above stay local (DDP averages them); the input gradient
    // needs both sums over every rank
    if (sync_) {
      sync_->all_reduce(s.p, 2 * C_, ReduceOp::sum);
      s.store();
    }
  } else {
    weight.grad_for_accumulate();
    bias.grad_for_accumulate();
  }
  AsF32 d(rt, dx, AsF32::out), w(rt, weight.data);
  batchnorm_backward_apply(rt, d.p, dy.p, xf.p, mean_.f32(), rstd_.f32(), w.p, sum_dy, sum_dy_xhat, count_, B, C_, HW);
  d.store();
  saved_x_ = mean_ = rstd_ = Tensor();
  return dx;
}

}  // namespace distlab

namespace distlab {

double BatchNorm2d::sync_statistics(Runtime& rt, float* mean, float* var, int64_t local_count) {
  const int n = sync_->size();
  std::vector<float> mine(static_cast<size_t>(2 * C_ + 1)), all(static_cast<size_t>((2 * C_ + 1) * n));
  std::copy(mean, mean + C_, mine.begin());
  std::copy(var, var + C_, mine.begin() + C_);
  mine[size_t(2 * C_)] = float(local_count);
  sync_->all_gather(all.data(), mine.data(), 2 * C_ + 1);
  double total = 0;
  for (int r = 0; r < n; r++) total += all[size_t(r * (2 * C_ + 1) + 2 * C_)];
  for (int64_t c = 0; c < C_; c++) {
    double m = 0;
    for (int r = 0; r < n; r++) {
      const float* row = &all[size_t(r * (2 * C_ + 1))];
      m += double(row[2 * C_]) * row[c];
    }
    m /= total;
    double v = 0;
    for (int r = 0; r < n; r++) {
      const float* row = &all[size_t(r * (2 * C_ + 1))];
      const double d = row[c] - m;
      v += double(row[2 * C_]) * (row[C_ + c] + d * d);
    }
    mean[c] = float(m);
    var[c] = float(v / total);
  }
  return total;
}

}  // namespace distlab
