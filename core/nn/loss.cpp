#include "core/nn/loss.h"

#include <fmt/format.h>

#include "core/ops/cpu/loss.h"
#include "core/perf/eager.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

double CrossEntropyLoss::forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets,
                                 int64_t* correct, double* loss_out) {
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  if (int64_t(targets.size()) != N)
    throw ShapeError(fmt::format("cross-entropy: {} targets for {} rows of logits {}", targets.size(), N,
                                 shape_str(logits.shape())));
  for (const int32_t t : targets)  // the kernel's own check reads back; a slot (loss_out) does not
    if (t >= V)
      throw DataError("target " + std::to_string(t) + " is out of range for " + std::to_string(V) + " classes",
                      "the data set's labels don't match model's number of classes");
  probs_ = rt.empty({N, V}, Category::activations, "softmax probabilities");  // f32: autocast's fp32 list
  targets_ = targets;
  logits_dtype_ = logits.dtype();
  device_targets_ = std::make_unique<Indices>(rt, targets_);  // reads targets_: it outlives the copy
  if (device_16(rt, {&logits}))  // a device rank reads the 16 bits themselves: no f32 copy of the logits
    return softmax_crossentropy_forward_16(rt, probs_.f32(), logits.data(), logits.dtype(), device_targets_->p, N, V, correct, loss_out);
  AsF32 z(rt, logits);
  return softmax_crossentropy_forward(rt, probs_.f32(), z.p, device_targets_->p, N, V, correct, loss_out);
}

Tensor CrossEntropyLoss::backward(Runtime& rt, float scale) {
  // eager PyTorch's cross_entropy(pred.float(), ...) on 16-bit logits: nll_loss's f32 gradient and
  // log_softmax's are both alive beside log_softmax's output, where this kernel writes one 16-bit gradient
  Tensor eager_grad;
  if ((rt.eager_ops & eager_op::loss) && logits_dtype_ != DType::f32)
    eager_grad = rt.empty(probs_.shape(), Category::activations, "nll_loss's f32 gradient (eager PyTorch)");
  Tensor d = rt.empty(probs_.shape(), Category::activations, "grad of logits", logits_dtype_);
  if (!device_targets_) throw Error("cross-entropy backward without its forward", "call forward first");
  if (device_16(rt, {&d})) {
    softmax_crossentropy_backward_16(rt, d.data(), d.dtype(), probs_.f32(), device_targets_->p, probs_.size(0), probs_.size(1), scale);
  } else {
    AsF32 df(rt, d, AsF32::out);
    softmax_crossentropy_backward(rt, df.p, probs_.f32(), device_targets_->p, probs_.size(0), probs_.size(1), scale);
    df.store();  // fp16: a gradient under 2^-24 becomes 0 here unless the loss scale lifted it
  }
  probs_ = Tensor();
  device_targets_.reset();
  return d;
}

}  // namespace distlab
