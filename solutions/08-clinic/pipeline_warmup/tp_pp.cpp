// Lab 06 — tensor and pipeline parallelism: Megatron's column- and row-parallel Linear (the arithmetic of
// this rank's slice, and the one all-reduce each pair needs), and the 1F1B schedule of a pipeline stage.
#include <algorithm>
#include <vector>

#include "labs/06-tp-pp/api.h"

namespace lab06 {

// y (rows, out) = x (rows, in) · wᵀ (w: (out, in)), + b when b is not nullptr
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  for (int64_t i = 0; i < rows; i++)
    for (int64_t o = 0; o < out; o++) {
      float s = b ? b[o] : 0.0f;
      for (int64_t k = 0; k < in; k++) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  /// END SOLUTION
}

// dx (rows, in) = dy · w, dw (out, in) = dyᵀ · x, db (out) = dy summed over the rows (when db is not nullptr)
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  std::fill(dx, dx + rows * in, 0.0f);
  std::fill(dw, dw + out * in, 0.0f);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t o = 0; o < out; o++) {
      const float d = dy[i * out + o];
      for (int64_t k = 0; k < in; k++) {
        dx[i * in + k] += d * w[o * in + k];
        dw[o * in + k] += d * x[i * in + k];
      }
    }
  if (db)
    for (int64_t o = 0; o < out; o++) {
      float s = 0;
      for (int64_t i = 0; i < rows; i++) s += dy[i * out + o];
      db[o] = s;
    }
  /// END SOLUTION
}

void column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  linear_forward(x, w, b, y, rows, in, out);  // f = identity: x is whole here, this rank's outputs need nothing else
  /// END SOLUTION
}

void column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                     int64_t out) {
  /// BEGIN SOLUTION
  linear_backward(x, w, dy, dx, dw, db, rows, in, out);  // dx: this rank's term of Σ_r dy_r · W_r
  g.all_reduce(dx, rows * in);                           // f's backward: the sum over every rank's outputs
  /// END SOLUTION
}

void row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  linear_forward(x, w, nullptr, y, rows, in, out);  // this rank's term of Σ_r x_r · W_rᵀ
  g.all_reduce(y, rows * out);                      // g: the sum
  if (b)                                            // the bias once, after the sum (before it: t times)
    for (int64_t i = 0; i < rows; i++)
      for (int64_t o = 0; o < out; o++) y[i * out + o] += b[o];
  /// END SOLUTION
}

void row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                  int64_t out) {
  /// BEGIN SOLUTION
  linear_backward(x, w, dy, dx, dw, db, rows, in, out);  // g's backward is the identity: dy is whole on every rank
  /// END SOLUTION
}

std::vector<Action> schedule_1f1b(int stages, int stage, int micro_batches) {
  /// BEGIN SOLUTION
  // warm-up: the forwards that fill the pipeline below this stage; the last stage starts backward at once
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Action> v;
  for (int j = 0; j < warmup; j++) v.push_back({true, j});
  for (int j = 0; j < micro_batches - warmup; j++) {  // steady state: one forward, one backward
    v.push_back({true, warmup + j});
    v.push_back({false, j});
  }
  for (int j = micro_batches - warmup; j < micro_batches; j++) v.push_back({false, j});  // cool-down
  return v;
  /// END SOLUTION
}

bool dp_sync(const std::vector<Action>& order, int k) {
  /// BEGIN SOLUTION
  // once per step: in the stage's last backward, when every micro-batch's gradient has been added up
  for (int i = k + 1; i < int(order.size()); i++)
    if (!order[size_t(i)].forward) return false;
  return true;
  /// END SOLUTION
}

}  // namespace lab06

extern "C" Lab06Plugin distlab_lab06 = {kLab06Abi,           lab06::column_forward, lab06::column_backward, lab06::row_forward,
                                        lab06::row_backward, lab06::schedule_1f1b,  lab06::dp_sync};
