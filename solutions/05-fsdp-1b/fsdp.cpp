// Lab 05 — FSDP (full shard): each rank keeps 1/N of every unit and makes a unit whole only around its
// forward and its backward, gathering the next one while this one computes.
#include <algorithm>
#include <vector>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

// The unit after `unit` in `order`, or -1 (the last one, or no order recorded yet).
int next_in(const std::vector<int>& order, int unit) {
  /// BEGIN SOLUTION
  auto it = std::find(order.begin(), order.end(), unit);
  return it == order.end() || it + 1 == order.end() ? -1 : *(it + 1);
  /// END SOLUTION
}

void before_forward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  f.wait(unit);  // whole now (already on its way when the previous unit prefetched it)
  if (o.prefetch)
    if (const int next = next_in(f.forward_order(), unit); next >= 0) f.gather(next);  // overlaps this unit's forward
  /// END SOLUTION
}

void after_forward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  // FULL_SHARD: back to 1/N until backward needs it. Not the root: backward starts with it.
  if (o.reshard_after_forward && unit != f.root()) f.free(unit);
  /// END SOLUTION
}

void before_backward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  f.wait(unit);  // freed after forward: gathered a second time
  if (o.prefetch)
    if (const int next = next_in(f.backward_order(), unit); next >= 0) f.gather(next);
  /// END SOLUTION
}

void after_backward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  if (o.sync) f.reduce_scatter(unit);  // no_sync micro-steps keep the whole gradient
  f.free(unit);
  /// END SOLUTION
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi, lab05::before_forward, lab05::after_forward, lab05::before_backward,
                                        lab05::after_backward};
