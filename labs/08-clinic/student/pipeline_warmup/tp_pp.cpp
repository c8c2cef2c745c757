// Lab 06 — tensor and pipeline parallelism: Megatron's column- and row-parallel Linear (which slice each
// rank computes, with api.h's linear_forward/backward, and the one all-reduce each pair needs), the same
// layers under sequence parallelism (the all-reduce's two halves, the input gathered again in backward),
// and the 1F1B schedule of a pipeline stage.
#include <algorithm>
#include <vector>

#include "labs/06-tp-pp/api.h"

namespace lab06 {

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

void sp_column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  std::vector<float> all(size_t(rows * in));
  g.all_gather(x, all.data(), rows / g.size() * in);  // g: every rank's rows, in order — the input whole for this forward
  linear_forward(all.data(), w, b, y, rows, in, out);
  /// END SOLUTION
}

void sp_column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                        int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  std::vector<float> all(size_t(rows * in)), dx_all(size_t(rows * in));
  g.all_gather(x, all.data(), rows / g.size() * in);  // the input again: forward's gathered copy was not kept
  linear_backward(all.data(), w, dy, dx_all.data(), dw, db, rows, in, out);
  g.reduce_scatter(dx_all.data(), dx, rows / g.size() * in);  // g's backward: this rank's rows of Σ_r dy_r · W_r
  /// END SOLUTION
}

void sp_row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  std::vector<float> term(size_t(rows * out));
  linear_forward(x, w, nullptr, term.data(), rows, in, out);  // this rank's term of the sum, every row
  const int64_t mine = rows / g.size();
  g.reduce_scatter(term.data(), y, mine * out);  // ḡ: this rank's rows of the sum
  if (b)
    for (int64_t i = 0; i < mine; i++)
      for (int64_t o = 0; o < out; o++) y[i * out + o] += b[o];
  /// END SOLUTION
}

void sp_row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                     int64_t in, int64_t out) {
  /// BEGIN SOLUTION
  std::vector<float> dy_all(size_t(rows * out));
  g.all_gather(dy, dy_all.data(), rows / g.size() * out);  // ḡ's backward: every row's gradient
  linear_backward(x, w, dy_all.data(), dx, dw, db, rows, in, out);
  /// END SOLUTION
}

void sp_norm_grads(Group& g, float* grads, int64_t n) {
  /// BEGIN SOLUTION
  g.all_reduce(grads, n);  // each rank's rows add their terms: the whole micro-batch's gradient is the sum
  /// END SOLUTION
}

void train_step_1f1b(Stage& s) {
  /// BEGIN SOLUTION
  const int p = s.stages(), m = s.micro_batches();
  // warm-up: the forwards that fill the pipeline below this stage; the last stage starts backward at once
  const int warmup = std::min(s.stage(), m), steady = m - warmup;
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
