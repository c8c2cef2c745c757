// Lab 04 — ZeRO-1 and ZeRO-2: every rank keeps 1/N of the optimizer state, then 1/N of the gradients too,
// and the job communicates exactly what DDP does.
#include <vector>

#include "labs/04-zero/api.h"

namespace lab04 {

Shard shard_of(int64_t numel, int rank, int world) {
  /// BEGIN SOLUTION
  Shard s;
  s.padded = (numel + world - 1) / world * world;  // zeros: they add nothing to a sum and are never weights
  const int64_t part = s.padded / world;
  s.begin = int64_t(rank) * part;
  s.end = s.begin + part;
  return s;
  /// END SOLUTION
}

// One flat: this rank's part of the average over ranks of the gradient — a reduce-scatter, half an
// all-reduce's bytes — handed to the trainer, which then frees the whole gradient.
void reduce_flat(Step& step, int flat) {
  /// BEGIN SOLUTION
  Comm& comm = step.comm();
  const Shard s = shard_of(step.numel(flat), comm.rank(), comm.size());
  std::vector<float> g = step.grad(flat);
  g.resize(size_t(s.padded), 0.0f);  // reduce_scatter splits size()·n: the padded length
  std::vector<float> part(size_t(s.end - s.begin));
  comm.reduce_scatter(g.data(), part.data(), s.end - s.begin, ReduceOp::avg);
  step.keep_grad(flat, s.begin, part.data(), s.end - s.begin);
  /// END SOLUTION
}

void zero1_reduce(Step& step) {
  /// BEGIN SOLUTION
  for (int f = 0; f < step.num_flats(); f++) reduce_flat(step, f);
  /// END SOLUTION
}

void zero_step(Step& step) {
  /// BEGIN SOLUTION
  step.optimizer_step();  // this rank's parts only: 12 bytes of AdamW state per element it owns
  Comm& comm = step.comm();
  for (int f = 0; f < step.num_flats(); f++) {
    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());
    const std::vector<float> mine = step.part_weights(f);
    std::vector<float> whole(size_t(s.padded));
    comm.all_gather(mine.data(), whole.data(), s.end - s.begin);  // the other half of DDP's all-reduce
    step.set_weights(f, 0, whole.data(), s.padded);
  }
  /// END SOLUTION
}

void zero2_reduce(Step& step, int flat) {
  /// BEGIN SOLUTION
  reduce_flat(step, flat);  // now, while backward goes on: a whole gradient lives one unit long
  /// END SOLUTION
}

}  // namespace lab04

extern "C" Lab04Plugin distlab_lab04 = {kLab04Abi, lab04::shard_of, lab04::zero1_reduce, lab04::zero_step, lab04::zero2_reduce};
