// Lab 02: what you implement in student/ddp.cpp. (Don't edit this file.)
#pragma once
#include <cstdint>
#include <vector>

#include "core/data/sampler.h"  // seeded_permutation(n, seed): the shared shuffle every rank must use
#include "core/train/lab_hooks.h"

namespace lab02 {

// Task 1 — DistributedSampler (PyTorch's semantics): this rank's indices for `epoch`.
//  shuffle: seeded_permutation(n, seed + epoch), the same on every rank; else 0..n-1.
//  drop_last = false: pad by wrapping around to ceil(n / replicas) · replicas; true: cut to floor(...).
//  rank r takes the indices at positions r, r + replicas, r + 2·replicas, ...
std::vector<int64_t> sampler_indices(int64_t n, int replicas, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                     bool drop_last);

// Task 2 — naive DDP: after backward, every rank's gradients become the average over ranks.
void average_gradients(distlab::ProcessGroup& pg, const std::vector<distlab::Parameter*>& params);

// Task 3 — bucketed DDP, overlapped with backward: see the README.
distlab::DataParallel* make_bucketed(distlab::ProcessGroup& pg, distlab::Model& model, distlab::Runtime& rt, double bucket_mb);

}  // namespace lab02
