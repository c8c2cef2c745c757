// Where a lab's student code plugs into the trainer. A lab plugin exports one LabHooks table; each entry
// it fills replaces the engine's own piece (nullptr keeps the engine's). The grader's references always
// run with no hooks at all: the engine's own implementation.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dist/process_group.h"
#include "core/models/model.h"
#include "core/parallel/ddp.h"

namespace distlab {

struct LabHooks {
  // DistributedSampler: this rank's indices of an epoch
  std::vector<int64_t> (*sampler_indices)(int64_t dataset_size, int num_replicas, int rank, uint64_t seed, int64_t epoch,
                                          bool shuffle, bool drop_last) = nullptr;
  // naive DDP: after backward, make every rank's gradients the average over ranks
  void (*average_gradients)(ProcessGroup& pg, const std::vector<Parameter*>& params) = nullptr;
  // bucketed DDP: a hook the model calls after each unit's backward (the engine broadcasts weights first)
  DataParallel* (*make_bucketed)(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) = nullptr;
};

}  // namespace distlab
