// The single-device strategy: one rank holds everything, so no hook has anything to do. It is what a run
// with parallel.strategy = "none" gets, and what every other strategy reduces to on one rank.
// Read next: ddp.h (the first strategy that communicates).
#pragma once
#include "core/parallel/strategy.h"

namespace distlab {

class NoParallel : public Strategy {
 public:
  NoParallel() { plain_optimizer_step_ = true; }
  std::string describe() const override { return "none (one rank)"; }
};

}  // namespace distlab
