// clinic alt (alpha): the warm-up counted from the END of the pipeline, stages after this one
// (p - 1 - s, at least 0, at most m), clamped explicitly.
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

void train_step_1f1b(Stage& s) {
  /// BEGIN SOLUTION
  const int p = s.stages(), m = s.micro_batches();
  // warm-up: the forwards that fill the pipeline below this stage; the last stage starts backward at once
  const int stages_after = p - 1 - s.stage();  // the forwards in flight below this stage before its first backward
  const int warmup = std::clamp(stages_after, 0, m), steady = m - warmup;
  for (int j = 0; j < warmup; j++) {
    s.recv_forward(j);
    s.forward(j);
    s.send_forward(j);
  }
  if (steady > 0) s.recv_forward(warmup);
  for (int i = 0; i < steady; i++) {  // steady state: one forward, then the oldest micro-batch's backward
    const int j = warmup + i;
    s.forward(j);
    // the stage after is sending i's gradient back while this one sends j's activations on: one exchange,
    // or both would wait for the other to receive
    s.send_forward_recv_backward(j, i);
    s.backward(i, i == m - 1);  // the replicas average once, in the step's last backward
    if (i + 1 < steady) s.send_backward_recv_forward(i, j + 1);
    else s.send_backward(i);
  }
  for (int i = steady; i < m; i++) {  // cool-down: the backwards left
    s.recv_backward(i);
    s.backward(i, i == m - 1);
    s.send_backward(i);
  }
  /// END SOLUTION
}

}  // namespace lab06

extern "C" Lab06Plugin distlab_lab06 = {kLab06Abi,           lab06::column_forward, lab06::column_backward, lab06::row_forward,
                                        lab06::row_backward, lab06::train_step_1f1b};
