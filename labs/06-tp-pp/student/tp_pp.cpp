// Lab 06 — tensor and pipeline parallelism: Megatron's column- and row-parallel Linear (which slice each
// rank computes, with api.h's linear_forward/backward, and the one all-reduce each pair needs), the same
// layers under sequence parallelism (the all-reduce's two halves, the input gathered again in backward),
// and the 1F1B schedule of a pipeline stage.
#include <algorithm>
#include <vector>

#include <stdexcept>

#include "labs/06-tp-pp/api.h"

namespace lab06 {

void column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement column_forward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: column_forward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                     int64_t out) {
  // TODO(06-tp-pp): implement column_backward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: column_backward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement row_forward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: row_forward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                  int64_t out) {
  // TODO(06-tp-pp): implement row_backward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: row_backward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void sp_column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement sp_column_forward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: sp_column_forward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void sp_column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                        int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement sp_column_backward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: sp_column_backward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void sp_row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement sp_row_forward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: sp_row_forward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void sp_row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                     int64_t in, int64_t out) {
  // TODO(06-tp-pp): implement sp_row_backward. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: sp_row_backward is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void sp_norm_grads(Group& g, float* grads, int64_t n) {
  // TODO(06-tp-pp): implement sp_norm_grads. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: sp_norm_grads is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

void train_step_1f1b(Stage& s) {
  // TODO(06-tp-pp): implement train_step_1f1b. Read labs/06-tp-pp/README.md.
  throw std::logic_error("06-tp-pp: train_step_1f1b is not implemented yet: "
                         "fill in the TODO in labs/06-tp-pp/student/tp_pp.cpp");
}

}  // namespace lab06

extern "C" Lab06Plugin distlab_lab06 = {kLab06Abi,
                                        lab06::column_forward,
                                        lab06::column_backward,
                                        lab06::row_forward,
                                        lab06::row_backward,
                                        lab06::train_step_1f1b,
                                        lab06::sp_column_forward,
                                        lab06::sp_column_backward,
                                        lab06::sp_row_forward,
                                        lab06::sp_row_backward,
                                        lab06::sp_norm_grads};
