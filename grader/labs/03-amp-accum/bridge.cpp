// The trainer's side of lab 03: the student's train_step (labs/03-amp-accum/api.h) drives one optimizer
// step, and every request it makes runs here, on the engine's model, optimizer and schedule. The order is
// checked as it happens: micro-batches 0..k-1 once each, then exactly one optimizer_step or skip_step.
// It is LabExtension::drive_step (grader/bridge/lab_extension.h): the trainer's micro-batches and optimizer
// through TrainerCalls. Compare Trainer::engine_step (core/train/trainer.cpp), the engine's own version of
// the same step.
// Read next: host.cpp beside it (the plugin's side of each request).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/tensor/on_host.h"
#include "grader/bridge/lab_extension.h"
#include "core/util/error.h"

namespace distlab {

namespace {

class Ops : public LabStepOps {
 public:
  Ops(StepOutcome& o, int64_t k, std::function<double(float, bool)> micro, std::vector<Parameter*> params,
      std::function<void(const std::vector<float>&)> step, std::function<void()> skip, std::function<void()> sched)
      : o_(o), k_(k), micro_(std::move(micro)), params_(std::move(params)), step_(std::move(step)), skip_(std::move(skip)),
        sched_(std::move(sched)) {}

  double forward_backward(int64_t micro, float factor) override {
    if (done_) throw lab_error(fmt::format("forward_backward({}) after this step's {}", micro, done_));
    if (micro != done_micro_ || micro >= k_)
      throw lab_error(fmt::format("forward_backward({}) where micro-batch {} of 0..{} was next", micro, done_micro_, k_ - 1),
                      "run each micro-batch 0, 1, ..., k-1 once per step");
    if (!std::isfinite(factor)) throw lab_error(fmt::format("forward_backward({}, {}): the loss factor is not finite", micro, factor));
    done_micro_++;
    if (micro == 0) o_.loss_scale = factor * float(k_);  // what backward was multiplied by, measured here
    const double loss = micro_(factor, micro == k_ - 1);
    loss_sum_ += loss;
    return loss;
  }
  std::vector<Parameter*> parameters() override { return params_; }
  void optimizer_step(const std::vector<float>& grads) override {
    finish("optimizer_step");
    double ss = 0;
    for (float g : grads) ss += double(g) * g;
    o_.grad_norm = std::sqrt(ss);  // what the student hands the optimizer: unscaled and clipped
    step_(grads);
  }
  void skip_step() override {
    finish("skip_step");
    o_.skipped = true;
    skip_();
  }
  void scheduler_step() override { sched_(); }

  // after the student's train_step returned
  void check_complete() const {
    if (done_micro_ < k_) throw lab_error(fmt::format("train_step ran {} of the step's {} micro-batches", done_micro_, k_));
    if (!done_) throw lab_error("train_step returned without optimizer_step() or skip_step(): the gradients would leak into the next step");
    o_.loss = loss_sum_ / double(k_);
  }

 private:
  static Error lab_error(const std::string& what, const std::string& hint = "see labs/03-amp-accum/README.md") {
    return Error("the lab's train_step: " + what, hint);
  }
  void finish(const char* what) {
    if (done_) throw lab_error(fmt::format("{}() after {}() in the same step", what, done_), "take the step once: optimizer_step or skip_step");
    if (done_micro_ < k_) throw lab_error(fmt::format("{}() after {} of {} micro-batches", what, done_micro_, k_), "run all k micro-batches first");
    done_ = what;
  }
  StepOutcome& o_;
  int64_t k_, done_micro_ = 0;
  double loss_sum_ = 0;
  const char* done_ = nullptr;
  std::function<double(float, bool)> micro_;
  std::vector<Parameter*> params_;
  std::function<void(const std::vector<float>&)> step_;
  std::function<void()> skip_, sched_;
};

}  // namespace

StepOutcome LabExtension::drive_step(RunParts& run, TrainerCalls& calls, int64_t) {  // the step number: the student's scheduler_step counts
  StepOutcome o;
  Runtime& rt = run.rt;
  const auto params = run.model.parameters();
  // the optimizer reads the student's f32 gradients: they replace the model's (16-bit) ones for the step
  const auto take_step = [&](const std::vector<float>& g) {
    size_t at = 0;
    for (auto* p : params) {
      p->grad = rt.empty(p->data.shape(), Category::grads, "the lab's gradient of " + p->name);
      OnHost h(p->grad, OnHost::out);  // up to a cuda rank's device
      if (h.p) std::memcpy(h.p, g.data() + at, size_t(p->data.numel()) * 4);
      h.store();
      at += size_t(p->data.numel());
    }
    o.lr = calls.scheduler_lr();
    calls.optimizer_step(float(o.lr), 1.0f);
    calls.zero_grad();
  };
  const RunConfig& cfg = run.cfg;
  Ops ops(o, cfg.train.accum_steps, [&](float factor, bool sync) { return calls.forward_backward(factor, sync, o.samples); }, params,
          take_step, [&] { calls.zero_grad(); }, [&] { calls.scheduler_step(); });
  const PrecisionOptions& pc = cfg.precision;
  const float scaler[3] = {float(pc.init_scale), float(pc.growth_factor), float(pc.backoff_factor)};
  const LabStepResult r = plugin_->train_step(ops, int(cfg.train.accum_steps), cfg.optim.clip_grad_norm, scaler,
                                              int32_t(std::min<int64_t>(pc.growth_interval, INT32_MAX)), run.pg, rt);
  ops.check_complete();
  o.next_loss_scale = r.scale_after;  // the student's own state, for the progress line only
  if (o.skipped) o.lr = calls.scheduler_lr();
  return o;
}

}  // namespace distlab
