// Lab 05 — FSDP (full shard): each rank keeps 1/N of every unit's flat vector and makes a unit whole only
// around its forward and its backward — all-gathered into a buffer of its own, the layers' weights viewing
// that buffer — gathering the next unit while this one computes (or, under a memory budget, as many units
// ahead as fit), and reduce-scattering each unit's flat gradient as its backward ends.
#include <algorithm>
#include <map>
#include <vector>

#include <stdexcept>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

FlatLayout flat_layout(const std::vector<int64_t>& numel, int world) {
  // TODO(05-fsdp-1b): implement flat_layout. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: flat_layout is not implemented yet: "
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

void finish_backward(Fsdp& f, const Options& o) {
  // TODO(05-fsdp-1b): implement finish_backward. Read labs/05-fsdp-1b/README.md.
  throw std::logic_error("05-fsdp-1b: finish_backward is not implemented yet: "
                         "fill in the TODO in labs/05-fsdp-1b/student/fsdp.cpp");
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi,           lab05::flat_layout,    lab05::before_forward, lab05::after_forward,
                                        lab05::before_backward, lab05::after_backward, lab05::finish_backward};
