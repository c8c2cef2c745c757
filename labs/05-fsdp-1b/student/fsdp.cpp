// Lab 05 — FSDP (full shard): each rank keeps 1/N of every unit and makes a unit whole only around its
// forward and its backward, gathering the next one while this one computes.
#include <algorithm>
#include <vector>

#include <stdexcept>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

// The unit after `unit` in `order`, or -1 (the last one, or no order recorded yet).
int next_in(const std::vector<int>& order, int unit) {
  // TODO(05-fsdp-1b): implement next_in. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: next_in is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

void before_forward(Fsdp& f, const Options& o, int unit) {
  // TODO(05-fsdp-1b): implement before_forward. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: before_forward is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

void after_forward(Fsdp& f, const Options& o, int unit) {
  // TODO(05-fsdp-1b): implement after_forward. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: after_forward is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

void before_backward(Fsdp& f, const Options& o, int unit) {
  // TODO(05-fsdp-1b): implement before_backward. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: before_backward is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

void after_backward(Fsdp& f, const Options& o, int unit) {
  // TODO(05-fsdp-1b): implement after_backward. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: after_backward is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi, lab05::before_forward, lab05::after_forward, lab05::before_backward,
                                        lab05::after_backward};
