// Lab 04 — ZeRO-1 and ZeRO-2: every rank keeps 1/N of the optimizer state, then 1/N of the gradients too,
// and the job communicates exactly what DDP does.
#include <algorithm>
#include <cmath>
#include <vector>

#include <stdexcept>

#include "labs/04-zero/api.h"

namespace lab04 {

Shard shard_of(int64_t numel, int rank, int world) {
  // TODO(04-zero): implement shard_of. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: shard_of is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

void adamw_step(const AdamW& h, bool decay, float grad_scale, float* w, float* m, float* v, const float* g, int64_t n) {
  // TODO(04-zero): implement adamw_step. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: adamw_step is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

void zero1_reduce(Step& step) {
  // TODO(04-zero): implement zero1_reduce. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: zero1_reduce is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

void zero_step(Step& step) {
  // TODO(04-zero): implement zero_step. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: zero_step is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

void zero2_reduce(Step& step, int flat) {
  // TODO(04-zero): implement zero2_reduce. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: zero2_reduce is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

void zero2_finish(Step& step) {
  // TODO(04-zero): implement zero2_finish. Read labs/04-zero/README.md.
  throw std::logic_error("04-zero: zero2_finish is not implemented yet: "
                         "fill in the TODO in labs/04-zero/student/zero.cpp");
}

}  // namespace lab04

extern "C" Lab04Plugin distlab_lab04 = {kLab04Abi,          lab04::shard_of,     lab04::adamw_step, lab04::zero1_reduce,
                                        lab04::zero_step,   lab04::zero2_reduce, lab04::zero2_finish};
