// Lab 06, alternative solution "inflight_window": 1F1B as an online state machine on two counters, and
// Linear arithmetic organised around a transposed copy of the weights.
//  - 1F1B: no warm-up/steady/cool-down loops. Stage s may hold p - s micro-batches (its memory bound);
//    it runs a forward while fewer are in flight and there are forwards left, a backward otherwise — this
//    rule alone produces the warm-up, the one-forward-one-backward steady state and the cool-down. How an
//    output leaves is decided by looking at what runs next: a forward followed by a backward sends its
//    activations and receives that backward's gradient in one exchange (and a backward followed by a
//    forward the other way round); otherwise a plain send, and the next input is received on its own.
//    The data-parallel sync goes with the backward that empties the stage's last micro-batch.
//  - Forward: y[r,:] = Σ_k x[r,k] · wᵀ[k,:] over a transposed copy wᵀ (in, out), a contiguous axpy per k.
//    Backward: dx and dw in two separate passes (dx row by row, dw and db output by output), f32.
//  - Row-parallel bias: every rank adds b / t to its partial sum before the all-reduce (sequence parallel:
//    the reduce-scatter); the sum of the t shares is b, counted once (exact for t a power of two; one
//    rounding otherwise). Sequence parallel's row backward sums db from the gathered dy on its own.
#include <algorithm>
#include <vector>

#include <stdexcept>

#include "labs/06-tp-pp/api.h"

namespace lab06 {

// y (rows, out) = x (rows, in) · wᵀ (w: (out, in)), + b when b is not nullptr
void gemm_forward(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  std::vector<float> wt(static_cast<size_t>(in * out));  // wᵀ: (in, out)
  for (int64_t o = 0; o < out; o++)
    for (int64_t k = 0; k < in; k++) wt[size_t(k * out + o)] = w[o * in + k];
  for (int64_t r = 0; r < rows; r++) {
    float* yr = y + r * out;
    for (int64_t o = 0; o < out; o++) yr[o] = b ? b[o] : 0.0f;
    for (int64_t k = 0; k < in; k++) {
      const float xv = x[r * in + k];
      const float* wk = wt.data() + k * out;
      for (int64_t o = 0; o < out; o++) yr[o] += xv * wk[o];
    }
  }
}

// dx (rows, in) = dy · w, dw (out, in) = dyᵀ · x, db (out) = dy summed over the rows (when db is not nullptr)
void gemm_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; r++) {  // dx[r,:] = Σ_o dy[r,o] · w[o,:]
    float* dxr = dx + r * in;
    std::fill(dxr, dxr + in, 0.0f);
    for (int64_t o = 0; o < out; o++) {
      const float g = dy[r * out + o];
      for (int64_t k = 0; k < in; k++) dxr[k] += g * w[o * in + k];
    }
  }
  for (int64_t o = 0; o < out; o++) {  // dw[o,:] = Σ_r dy[r,o] · x[r,:],  db[o] = Σ_r dy[r,o]
    float* dwo = dw + o * in;
    std::fill(dwo, dwo + in, 0.0f);
    float bias = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
      const float g = dy[r * out + o];
      bias += g;
      for (int64_t k = 0; k < in; k++) dwo[k] += g * x[r * in + k];
    }
    if (db) db[o] = bias;
  }
}

void column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  (void)g;  // Megatron's f: identity in forward
  gemm_forward(x, w, b, y, rows, in, out);
}

void column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                     int64_t out) {
  gemm_backward(x, w, dy, dx, dw, db, rows, in, out);
  g.all_reduce(dx, rows * in);  // f's backward: x fed every rank's outputs, its gradient is the sum
}

void row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  std::vector<float> share;
  if (b) {  // each rank's share of the bias: t shares sum to b
    share.resize(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; o++) share[size_t(o)] = b[o] / static_cast<float>(g.size());
  }
  gemm_forward(x, w, b ? share.data() : nullptr, y, rows, in, out);
  g.all_reduce(y, rows * out);  // Megatron's g
}

void row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                  int64_t out) {
  (void)g;  // g's backward: identity, dy is already whole everywhere
  gemm_backward(x, w, dy, dx, dw, db, rows, in, out);
}

// ---- sequence parallel ----

void sp_column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  const int64_t share = rows / g.size() * in;
  std::vector<float> gathered(static_cast<size_t>(share * g.size()));
  g.all_gather(x, gathered.data(), share);  // rank r's rows land at r·share: the stream in order
  gemm_forward(gathered.data(), w, b, y, rows, in, out);
}

void sp_column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                        int64_t in, int64_t out) {
  const int64_t share = rows / g.size() * in;
  std::vector<float> gathered(static_cast<size_t>(share * g.size()));
  g.all_gather(x, gathered.data(), share);
  std::vector<float> mine_of_all(static_cast<size_t>(rows * in));
  gemm_backward(gathered.data(), w, dy, mine_of_all.data(), dw, db, rows, in, out);
  g.reduce_scatter(mine_of_all.data(), dx, share);
}

void sp_row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // b / t on every rank's partial sum, as in row_forward: the reduce-scatter adds the t shares
  std::vector<float> share_b;
  if (b)
    for (int64_t o = 0; o < out; o++) share_b.push_back(b[o] / float(g.size()));
  std::vector<float> partial(static_cast<size_t>(rows * out));
  gemm_forward(x, w, b ? share_b.data() : nullptr, partial.data(), rows, in, out);
  g.reduce_scatter(partial.data(), y, rows / g.size() * out);
}

void sp_row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                     int64_t in, int64_t out) {
  std::vector<float> every_row(static_cast<size_t>(rows * out));
  g.all_gather(dy, every_row.data(), rows / g.size() * out);
  gemm_backward(x, w, every_row.data(), dx, dw, nullptr, rows, in, out);
  if (db) {  // the whole batch's, row by row
    std::fill(db, db + out, 0.0f);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t o = 0; o < out; o++) db[o] += every_row[size_t(r * out + o)];
  }
}

void sp_norm_grads(Group& g, float* grads, int64_t n) { g.all_reduce(grads, n); }

void train_step_1f1b(Stage& s) {
  const int m = s.micro_batches();
  const int window = s.stages() - s.stage();  // micro-batches this stage may hold at once
  int f = 0, b = 0;                           // the next forward, the next backward
  const auto forward_next = [&] { return f < m && f - b < window; };
  bool received = false;  // the input of what runs next already arrived (in an exchange)
  while (b < m) {
    if (forward_next()) {
      const int j = f++;
      if (!received) s.recv_forward(j);
      s.forward(j);
      if (!forward_next()) {  // a backward follows: its gradient comes from the same neighbour
        s.send_forward_recv_backward(j, b);
        received = true;
      } else {
        s.send_forward(j);
        received = false;
      }
    } else {
      const int i = b++;
      if (!received) s.recv_backward(i);
      s.backward(i, b == m);  // the step's last backward averages over the replicas
      if (b < m && forward_next()) {  // a forward follows: its activations come from the same neighbour
        s.send_backward_recv_forward(i, f);
        received = true;
      } else {
        s.send_backward(i);
        received = false;
      }
    }
  }
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
