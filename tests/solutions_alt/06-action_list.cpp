// Lab 06, alternative solution "action_list": f64 accumulation, the row-parallel bias folded into rank 0's
// partial sum, and a 1F1B executor that first PLANS the step as a list of actions, then runs it.
//  - Every matmul accumulates in double (one output element, or one output row, at a time) and rounds to
//    f32 once: legal, since only the f32 results cross the API.
//  - Row-parallel forward: the bias is added once by the group's rank 0 BEFORE the all-reduce (the sum then
//    contains it exactly once) instead of by every rank after it.
//  - 1F1B: the compute order is generated first (warm-up forwards, then alternate F/B, then the remaining
//    backwards). Each compute is wrapped in its naive blocking transfers (recv before, send after); a
//    peephole pass then fuses "send to a neighbour, then receive from the same neighbour" into the paired
//    exchange call — without it two neighbours would both block in a send. The dp sync goes on whichever
//    action is the plan's last backward.
//  - Sequence parallel: the bias again in rank 0's partial sum (before the reduce-scatter), and the
//    LayerNorms' gradients summed as a reduce-scatter and an all-gather of a padded copy.
#include <algorithm>
#include <vector>

#include <stdexcept>

#include "labs/06-tp-pp/api.h"

namespace lab06 {

// y (rows, out) = x (rows, in) · wᵀ (w: (out, in)), + b when b is not nullptr
void linear_f64_forward(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t o = 0; o < out; o++) {
      double acc = b ? double(b[o]) : 0.0;
      for (int64_t k = 0; k < in; k++) acc += double(x[r * in + k]) * double(w[o * in + k]);
      y[r * out + o] = float(acc);
    }
}

// dx (rows, in) = dy · w, dw (out, in) = dyᵀ · x, db (out) = dy summed over the rows (when db is not nullptr)
void linear_f64_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> acc(static_cast<size_t>(in));
  for (int64_t r = 0; r < rows; r++) {  // dx[r] = Σ_o dy[r,o] · w[o]
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t o = 0; o < out; o++)
      for (int64_t k = 0; k < in; k++) acc[size_t(k)] += double(dy[r * out + o]) * double(w[o * in + k]);
    for (int64_t k = 0; k < in; k++) dx[r * in + k] = float(acc[size_t(k)]);
  }
  for (int64_t o = 0; o < out; o++) {  // dw[o] = Σ_r dy[r,o] · x[r],  db[o] = Σ_r dy[r,o]
    std::fill(acc.begin(), acc.end(), 0.0);
    double bias = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const double g = dy[r * out + o];
      bias += g;
      for (int64_t k = 0; k < in; k++) acc[size_t(k)] += g * double(x[r * in + k]);
    }
    for (int64_t k = 0; k < in; k++) dw[o * in + k] = float(acc[size_t(k)]);
    if (db) db[o] = float(bias);
  }
}

void column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  (void)g;  // x is whole on every rank: the forward needs nobody
  linear_f64_forward(x, w, b, y, rows, in, out);
}

void column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                     int64_t out) {
  linear_f64_backward(x, w, dy, dx, dw, db, rows, in, out);  // dx: this rank's term of Σ_r dy_r · W_r
  g.all_reduce(dx, rows * in);
}

void row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // rank 0's partial sum carries the bias, the others' do not: after the all-reduce it is counted once
  linear_f64_forward(x, w, g.rank() == 0 ? b : nullptr, y, rows, in, out);
  g.all_reduce(y, rows * out);
}

void row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                  int64_t out) {
  (void)g;  // dy is whole: every rank's input slice and weights slice get their gradient locally
  linear_f64_backward(x, w, dy, dx, dw, db, rows, in, out);
}

// ---- sequence parallel: the stream's side of each layer holds this rank's rows/t token rows ----

void sp_column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  std::vector<float> whole(static_cast<size_t>(rows * in));
  g.all_gather(x, whole.data(), rows / g.size() * in);
  linear_f64_forward(whole.data(), w, b, y, rows, in, out);
}

void sp_column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                        int64_t in, int64_t out) {
  std::vector<float> whole(static_cast<size_t>(rows * in)), terms(static_cast<size_t>(rows * in));
  g.all_gather(x, whole.data(), rows / g.size() * in);  // gathered afresh: nothing survives between calls
  linear_f64_backward(whole.data(), w, dy, terms.data(), dw, db, rows, in, out);
  g.reduce_scatter(terms.data(), dx, rows / g.size() * in);
}

void sp_row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  // rank 0's partial sum carries the bias on every row: the reduce-scatter's sum counts it once
  std::vector<float> partial(static_cast<size_t>(rows * out));
  linear_f64_forward(x, w, g.rank() == 0 ? b : nullptr, partial.data(), rows, in, out);
  g.reduce_scatter(partial.data(), y, rows / g.size() * out);
}

void sp_row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                     int64_t in, int64_t out) {
  std::vector<float> whole(static_cast<size_t>(rows * out));
  g.all_gather(dy, whole.data(), rows / g.size() * out);
  linear_f64_backward(x, w, whole.data(), dx, dw, db, rows, in, out);
}

// the all-reduce as its two halves: reduce-scatter the (padded) gradient, all-gather the sums
void sp_norm_grads(Group& g, float* grads, int64_t n) {
  const int64_t t = g.size(), part = (n + t - 1) / t;
  std::vector<float> padded(static_cast<size_t>(part * t), 0.0f), mine(static_cast<size_t>(part)), sums(static_cast<size_t>(part * t));
  std::copy(grads, grads + n, padded.begin());
  g.reduce_scatter(padded.data(), mine.data(), part);
  g.all_gather(mine.data(), sums.data(), part);
  std::copy(sums.begin(), sums.begin() + n, grads);
}

namespace {

enum class Op { F, B, RecvF, SendF, RecvB, SendB, SendF_RecvB, SendB_RecvF };
struct Action {
  Op op;
  int micro;
  int other = -1;     // the second micro-batch of a fused exchange
  bool sync = false;  // for B: the data-parallel sync
};

std::vector<Action> plan(int p, int m, int s) {
  // 1. the compute order
  std::vector<Action> compute;
  const int warm = std::min(p - s - 1, m);
  int next_f = 0, next_b = 0;
  for (; next_f < warm; next_f++) compute.push_back({Op::F, next_f});
  while (next_b < m) {
    if (next_f < m) compute.push_back({Op::F, next_f++});
    compute.push_back({Op::B, next_b++});
  }
  // 2. each compute inside its own transfers
  std::vector<Action> naive;
  for (const Action& a : compute) {
    if (a.op == Op::F) {
      naive.push_back({Op::RecvF, a.micro});
      naive.push_back(a);
      naive.push_back({Op::SendF, a.micro});
    } else {
      naive.push_back({Op::RecvB, a.micro});
      naive.push_back(a);
      naive.push_back({Op::SendB, a.micro});
    }
  }
  // 3. fuse send-then-receive towards the same neighbour into one exchange
  std::vector<Action> out;
  for (size_t i = 0; i < naive.size(); i++) {
    const Action& a = naive[i];
    if (i + 1 < naive.size()) {
      const Action& b = naive[i + 1];
      if (a.op == Op::SendF && b.op == Op::RecvB) {  // both towards s + 1
        out.push_back({Op::SendF_RecvB, a.micro, b.micro});
        i++;
        continue;
      }
      if (a.op == Op::SendB && b.op == Op::RecvF) {  // both towards s - 1
        out.push_back({Op::SendB_RecvF, a.micro, b.micro});
        i++;
        continue;
      }
    }
    out.push_back(a);
  }
  // 4. the last backward of the step synchronises the replicas
  for (auto it = out.rbegin(); it != out.rend(); ++it)
    if (it->op == Op::B) {
      it->sync = true;
      break;
    }
  return out;
}

}  // namespace

void train_step_1f1b(Stage& s) {
  for (const Action& a : plan(s.stages(), s.micro_batches(), s.stage())) {
    switch (a.op) {
      case Op::F: s.forward(a.micro); break;
      case Op::B: s.backward(a.micro, a.sync); break;
      case Op::RecvF: s.recv_forward(a.micro); break;
      case Op::SendF: s.send_forward(a.micro); break;
      case Op::RecvB: s.recv_backward(a.micro); break;
      case Op::SendB: s.send_backward(a.micro); break;
      case Op::SendF_RecvB: s.send_forward_recv_backward(a.micro, a.other); break;
      case Op::SendB_RecvF: s.send_backward_recv_forward(a.micro, a.other); break;
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
