// nn.CrossEntropyLoss (mean over rows; negative targets ignored).
#pragma once
#include "core/nn/layer.h"

namespace distlab {

class CrossEntropyLoss {
 public:
  // logits (N, V) -> mean loss; counts correct argmax predictions into *correct when given
  double forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets, int64_t* correct = nullptr);
  // dlogits (N, V) = scale * d(mean loss)/dlogits; scale = 1/accum_steps under accumulation
  Tensor backward(Runtime& rt, float scale = 1.0f);

 private:
  Tensor probs_;
  std::vector<int32_t> targets_;
};

}  // namespace distlab
