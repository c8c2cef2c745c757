// nn.CrossEntropyLoss (mean over rows; negative targets ignored).
#pragma once
#include <memory>

#include "core/nn/layer.h"
#include "core/tensor/as_f32.h"

namespace distlab {

class CrossEntropyLoss {
 public:
  // logits (N, V) -> mean loss; counts correct argmax predictions into *correct when given. loss_out: a
  // DeviceScalars slot (core/optim/reduce.h) the mean goes into; a device rank then returns 0 without
  // waiting for the GPU, and the trainer reads the step's slots once the step is done (a cpu rank returns
  // the mean as well). Targets out of range are refused here, on the host, before any kernel runs.
  double forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets, int64_t* correct = nullptr,
                 double* loss_out = nullptr);
  // dlogits (N, V) = scale * d(mean loss)/dlogits, in the logits' dtype; scale = loss_scale / accum_steps
  // (1/accum_steps without a loss scaler). Scaling the loss is scaling this gradient: the rest of backward
  // is linear in it.
  Tensor backward(Runtime& rt, float scale = 1.0f);

 private:
  Tensor probs_;  // f32 (the fp32 list of core/ops/autocast.h)
  DType logits_dtype_ = DType::f32;
  std::vector<int32_t> targets_;
  std::unique_ptr<Indices> device_targets_;  // forward's copy on a cuda rank, kept for backward: one upload, not two
};

}  // namespace distlab
