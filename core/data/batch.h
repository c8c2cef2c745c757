// One micro-batch as the model sees it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor/tensor.h"

namespace distlab {

struct Batch {
  Tensor x;                      // images (B, C, H, W); undefined for token data
  std::vector<int32_t> tokens;   // (B*T) input ids for token data
  std::vector<int32_t> targets;  // (B) labels, or (B*T) next-token ids
  int64_t B = 0, T = 1;
  int64_t samples() const { return B; }
};

}  // namespace distlab
