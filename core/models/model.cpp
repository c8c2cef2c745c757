#include "core/models/model.h"

namespace distlab {

int64_t Model::num_parameters() {
  int64_t n = 0;
  for (auto* p : parameters()) n += p->data.numel();
  return n;
}

void Model::zero_grad() {
  for (auto* p : parameters()) p->grad = Tensor();
}

}  // namespace distlab
