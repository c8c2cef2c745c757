// For a checkpoint of a sharded optimizer: what rank `rank` owns of each flat vector (flat_param.h), as
// slices of the parameters in it — element [param_offset, param_offset + numel) of a parameter, flattened,
// at local_offset of the rank's part. The checkpoint stores state by parameter name and element range, so
// N ranks' parts load on M ranks, or under another strategy (core/train/trainer_ckpt.cpp).
// Read next: exec_order.h (the order ZeRO-3 prefetches in), then zero3.h.
#pragma once
#include <vector>

#include "core/parallel/flat_param.h"
#include "core/parallel/strategy.h"

namespace distlab {

std::vector<std::vector<Strategy::Slice>> flat_slices(const std::vector<FlatParam>& flats, int rank);

}  // namespace distlab
