// The trainer's step around its micro-batches: each micro-batch's loss and the gradient of its logits, and
// after the backward the gradient norm, the clip and the optimizer step. On a device rank none of these
// waits for the GPU: the losses go to slots of step_losses_, and under none and DDP (the strategies whose
// norm and step are StepHooks' defaults) the norm and the clip factor are computed on the device, where
// the optimizer reads the factor (PyTorch's clip_grad_norm_ + fused AdamW). The host reads them all once
// the step's work is done (read_step_values). A cpu rank computes the same numbers in the same order.
// Read first: trainer.cpp (engine_step, train_step); next: core/optim/reduce.h.
#include "core/nn/loss.h"
#include "core/parallel/tensor_parallel.h"
#include "core/train/trainer.h"

namespace distlab {

double Trainer::loss_and_grad(const Tensor& logits, const Batch& b, float factor, Tensor& dlogits) {
  double* slot = step_losses_ ? step_losses_->sum(next_loss_slot_++) : nullptr;  // a device rank's: no wait
  if (ProcessGroup* tp = model_->tp_group()) {  // logits split by vocabulary: the loss without gathering them
    VocabParallelCrossEntropy ce(*tp);
    const double loss = ce.forward(rt_, logits, b.targets, model_->vocab_first(), nullptr, slot);
    dlogits = ce.backward(rt_, factor);
    return loss;
  }
  CrossEntropyLoss ce;
  const double loss = ce.forward(rt_, logits, b.targets, nullptr, slot);
  dlogits = ce.backward(rt_, factor);
  return loss;
}

void Trainer::clip_and_step(StepOutcome& o) {
  step_norm_.reset();
  if (!mesh_ && strategy_->plain_optimizer_step() && opt_->reads_device_factor(rt_)) {
    // a device rank with the whole model: the norm and the clip computed where the gradients are, and the
    // step queued behind them; the norm is read once the step is done
    step_norm_ = std::make_unique<DeviceScalars>(rt_, 2, "the gradient norm and the step's factor");
    grad_norm_on_device(rt_, model_->parameters(), o.loss_scale, cfg_.optim.clip_grad_norm, step_norm_->sum(0), step_norm_->flag(1));
    opt_->step_device_factor(rt_, float(o.lr), step_norm_->flag(1));
    return;
  }
  // split layers and stages: the squares summed over the TP and PP groups, and over the dp axis where the
  // strategy holds the gradients in parts (ZeRO, FSDP)
  o.grad_norm = (mesh_ ? strategy_->split_grad_norm(rt_, *model_, tp_group(), pp_group()) : strategy_->grad_norm(rt_, *model_)) /
                o.loss_scale;
  strategy_->step(rt_, *opt_, float(o.lr), clip_coefficient(o.grad_norm, cfg_.optim.clip_grad_norm) / o.loss_scale);
}

void Trainer::read_step_values(StepOutcome& o) {
  if (step_losses_) {  // the micro-batches' losses, added in order as the cpu adds them
    o.loss = step_losses_->total() / double(accum_);
    step_losses_.reset();
  }
  if (step_norm_) {
    o.grad_norm = step_norm_->read_sums()[0];
    step_norm_.reset();
  }
}

}  // namespace distlab
