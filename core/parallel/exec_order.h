// The order a step runs the units in, recorded on the first step (PyTorch FSDP's execution order, which its
// prefetch follows as well): ZeRO-3 gathers the unit that comes after the one starting now, ahead of time.
// A unit that runs twice in a row is recorded once.
// Read next: zero3.h.
#pragma once
#include <algorithm>
#include <vector>

namespace distlab {

class ExecOrder {
 public:
  void record(int unit) {
    if (recording_ && (order_.empty() || order_.back() != unit)) order_.push_back(unit);
  }
  void freeze() { recording_ = false; }  // the first step is over: the order is known
  bool recording() const { return recording_; }
  // the unit after `unit` in the order, or -1 (the last one, or one not seen yet)
  int after(int unit) const {
    auto it = std::find(order_.begin(), order_.end(), unit);
    return it == order_.end() || it + 1 == order_.end() ? -1 : *(it + 1);
  }
  const std::vector<int>& units() const { return order_; }

 private:
  std::vector<int> order_;
  bool recording_ = true;
};

}  // namespace distlab
