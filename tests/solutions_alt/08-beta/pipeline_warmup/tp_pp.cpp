// clinic alt (beta): the 1F1B executor rewritten with two running counters (next forward f, next backward b)
// and the warm-up p - 1 - s clamped with max/min, instead of warm-up/steady/cool-down index arithmetic.
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
  const int p = s.stages(), m = s.micro_batches(), me = s.stage();
  // Megatron: a stage runs as many forwards ahead as there are stages after it (the last: none)
  const int ahead = std::max(0, std::min(p - me - 1, m));
  int f = 0, b = 0;  // the next micro-batch to run forward, and backward
  for (; f < ahead; f++) {  // warm-up
    s.recv_forward(f);
    s.forward(f);
    s.send_forward(f);
  }
  if (f < m) s.recv_forward(f);
  while (f < m) {  // steady 1F1B: forward f, then the oldest backward b, the sends paired with the neighbours'
    s.forward(f);
    s.send_forward_recv_backward(f, b);
    s.backward(b, b == m - 1);
    f++;
    if (f < m) s.send_backward_recv_forward(b, f);
    else s.send_backward(b);
    b++;
  }
  for (; b < m; b++) {  // cool-down
    s.recv_backward(b);
    s.backward(b, b == m - 1);
    s.send_backward(b);
  }
  /// END SOLUTION
}

}  // namespace lab06

extern "C" Lab06Plugin distlab_lab06 = {kLab06Abi,           lab06::column_forward, lab06::column_backward, lab06::row_forward,
                                        lab06::row_backward, lab06::train_step_1f1b};
