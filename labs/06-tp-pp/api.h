// Lab 06: everything your tp_pp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your tp_pp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside each rank's trainer. The trainer owns the model (GPT-2,
// split over a tensor-parallel group of t ranks and p pipeline stages), the data and the process groups.
//  - Tasks 1-2: every column- and row-parallel Linear of the model (attn.c_attn, attn.c_proj, mlp.c_fc,
//    mlp.c_proj in every block) calls your four functions for its forward and its backward, with this
//    rank's slice of the weights, and runs the collectives you ask for on its tensor-parallel group:
//      g.all_reduce(data, n)    blocking: data becomes the sum over the group's ranks
//    Every rank of the group must ask for the same collectives, in the same order, with the same sizes.
//  - Task 3: the same layers under sequence parallelism (parallel.sequence_parallel = true), with two more
//    collectives (n floats per rank; the group's ranks in rank order):
//      g.all_gather(mine, all, n)      all (t·n) = every rank's mine (n), rank 0's first
//      g.reduce_scatter(all, mine, n)  mine (n) = this rank's n of the sum over the ranks of all (t·n)
//    and the LayerNorms' gradients, which each rank now computes from its own rows.
//  - Tasks 4-5: each pipeline stage runs your executor for every optimizer step: the order of its forwards
//    and backwards, the sends and receives between neighbouring stages, and which backward synchronises
//    the data-parallel replicas. The trainer holds the tensors, computes, and moves them as you ask.
// Every array is f32, row-major, with PyTorch's layout: x (rows, in), w (out, in), b (out), y (rows, out).
#pragma once
#include <cstdint>
#include <vector>

namespace lab06 {

class Group {
 public:
  // (how the host wires a Group up; your code only calls the functions below)
  struct Ops {
    void (*all_reduce)(void* ctx, float* data, int64_t n);
    void (*all_gather)(void* ctx, const float* mine, float* all, int64_t n);
    void (*reduce_scatter)(void* ctx, const float* all, float* mine, int64_t n);
  };
  Group(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}
  int rank() const { return rank_; }
  int size() const { return size_; }  // t, the tensor-parallel ranks
  void all_reduce(float* data, int64_t n) { ops_->all_reduce(ctx_, data, n); }
  void all_gather(const float* mine, float* all, int64_t n) { ops_->all_gather(ctx_, mine, all, n); }      // blocking
  void reduce_scatter(const float* all, float* mine, int64_t n) { ops_->reduce_scatter(ctx_, all, mine, n); }  // blocking

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

// Given: the arithmetic of one Linear on whatever slice of it a rank holds. What you write is the split —
// which slice each rank computes — and the collectives that make the pieces whole, not matrix multiplies.
// (Plain loops: your plugin links nothing of the engine. Write your own if you like; only the results
// cross the API.)
// Two loops under both: a dot product and y += a·x, each in blocks of 8 kept in 8 running values. A loop
// of one running sum cannot use the CPU's vector registers (its adds must happen in order); 8 of them
// can, which makes these loops 5-10x faster at -O2. (The sum's order changes, not what it means.)
namespace loops {
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  const int64_t blocks = n - n % 8;
  for (int64_t k = 0; k < blocks; k += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (int64_t k = blocks; k < n; k++) s += a[k] * b[k];
  return s;
}
// y (n) += a · x (n)
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const int64_t blocks = n - n % 8;
  for (int64_t k = 0; k < blocks; k += 8) {
    float t[8];  // the block's 8 results first, then stored: independent, so they go in one vector
    for (int j = 0; j < 8; j++) t[j] = y[k + j] + a * x[k + j];
    for (int j = 0; j < 8; j++) y[k + j] = t[j];
  }
  for (int64_t k = blocks; k < n; k++) y[k] += a * x[k];
}
}  // namespace loops

// y (rows, out) = x (rows, in) · wᵀ (w: (out, in)), + b when b is not nullptr
inline void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t o = 0; o < out; o++) y[i * out + o] = (b ? b[o] : 0.0f) + loops::dot(x + i * in, w + o * in, in);
}
// dx (rows, in) = dy · w, dw (out, in) = dyᵀ · x, db (out) = dy summed over the rows (when db is not
// nullptr); dx, dw and db overwritten
inline void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                            int64_t out) {
  for (int64_t k = 0; k < rows * in; k++) dx[k] = 0.0f;
  for (int64_t k = 0; k < out * in; k++) dw[k] = 0.0f;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t o = 0; o < out; o++) {
      const float d = dy[i * out + o];
      loops::axpy(d, w + o * in, dx + i * in, in);  // dx[i, :] += dy[i, o] · w[o, :]
      loops::axpy(d, x + i * in, dw + o * in, in);  // dw[o, :] += dy[i, o] · x[i, :]
    }
  if (db)
    for (int64_t o = 0; o < out; o++) {
      float s = 0;
      for (int64_t i = 0; i < rows; i++) s += dy[i * out + o];
      db[o] = s;
    }
}

// Task 1 — column-parallel Linear: the whole layer is y = x·Wᵀ + b with W (OUT, in); this rank holds `out`
// = OUT/t of W's rows (its outputs) and those entries of b.
//   forward:  x (rows, in) is whole, the same on every rank. Write y (rows, out): this rank's outputs.
//   backward: dy (rows, out) is the gradient of this rank's outputs. Write dw (out, in), db (out) (nullptr
//             when the layer has no bias) and dx (rows, in): the gradient of the WHOLE input x — every
//             rank's outputs depend on all of x.
void column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out);
void column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                     int64_t out);

// Task 2 — row-parallel Linear: the whole layer is y = x·Wᵀ + b with W (out, IN); this rank holds `in` =
// IN/t of W's columns (its inputs), and b whole.
//   forward:  x (rows, in) is this rank's slice of the input (the column-parallel layer before produced
//             it). Write y (rows, out): the WHOLE output, the same on every rank, b added once.
//   backward: dy (rows, out) is whole. Write dx (rows, in) for this rank's slice of the input, dw (out, in)
//             and db (out).
void row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out);
void row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows, int64_t in,
                  int64_t out);

// Task 3 — sequence parallel (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
// Transformer Models"; Megatron-LM's --sequence-parallel). Between the split layers plain tensor parallelism
// keeps the residual stream (rows, C) whole on every rank, so its LayerNorms, dropouts and residual adds run t
// times on the same numbers and every rank stores them. Under sequence parallelism the trainer keeps rank r's
// rows [r·rows/t, (r+1)·rows/t) of the stream alone (the token rows of the micro-batch, B·T of them, in order),
// and runs the LayerNorms, dropouts and adds on them. Your layers meet the stream on one side:
//   sp_column_forward:  x (rows/t, in) this rank's rows of the input. Write y (rows, out): this rank's
//                       outputs for EVERY row.
//   sp_column_backward: x as in forward (this rank's rows: the trainer kept nothing bigger), dy (rows, out).
//                       Write dw (out, in), db (out) and dx (rows/t, in): this rank's rows of the whole input's
//                       gradient.
//   sp_row_forward:     x (rows, in) every row, this rank's inputs. Write y (rows/t, out): this rank's rows of
//                       the whole output, b added once.
//   sp_row_backward:    x as in forward, dy (rows/t, out) this rank's rows of the output's gradient. Write
//                       dx (rows, in), dw (out, in) and db (out): every rank's db the whole batch's.
// `rows` is always the micro-batch's whole count (a multiple of t). The activation memory the stream costs
// falls to 1/t, and a column layer's gathered input is a temporary: keep nothing between calls. The
// communication volume is checked against the paper's: the trainer counts every byte.
void sp_column_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out);
void sp_column_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                        int64_t in, int64_t out);
void sp_row_forward(Group& g, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out);
void sp_row_backward(Group& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                     int64_t in, int64_t out);
// A LayerNorm on the stream now sees this rank's rows alone: grads (n) is its weight's (or its bias's)
// gradient of one micro-batch from those rows. Make it the gradient of the whole micro-batch, in place.
void sp_norm_grads(Group& g, float* grads, int64_t n);

// A pipeline stage during one optimizer step: its m micro-batches' forwards and backwards, and the tensors
// that cross to its neighbours — micro-batch j's activations go from stage s to s + 1 after its forward
// there, its gradient from s + 1 back to s after its backward. The trainer holds the tensors; every call
// blocks until it is done, as Gloo's and NCCL's point-to-point calls (Megatron's p2p_communication names).
// A send completes only when the neighbour receives it (and a receive when the neighbour sends): two
// stages that both wait for each other to receive hang until the timeout names the stage and micro-batch.
// At the first stage the halves towards a previous stage do nothing, and at the last those towards a next.
class Stage {
 public:
  virtual ~Stage() = default;
  virtual int stage() const = 0;          // s, 0..p-1
  virtual int stages() const = 0;         // p
  virtual int micro_batches() const = 0;  // m (>= p)
  // Micro-batch j's forward on this stage: its activations from stage s - 1 must have arrived (not on the
  // first stage). Its output waits until it is sent; what the forward saved waits for its backward.
  virtual void forward(int micro) = 0;
  // Micro-batch j's backward: after its forward, its gradient from stage s + 1 arrived (not on the last
  // stage). dp_sync: the data-parallel replicas of this stage average their gradients during this backward
  // (what they hold so far: PyTorch's no_sync until then).
  virtual void backward(int micro, bool dp_sync) = 0;
  virtual void recv_forward(int micro) = 0;   // micro-batch j's activations, from stage s - 1
  virtual void send_forward(int micro) = 0;   // j's forward output, to stage s + 1
  virtual void recv_backward(int micro) = 0;  // j's gradient, from stage s + 1
  virtual void send_backward(int micro) = 0;  // j's backward output, to stage s - 1
  // Both at once, towards the same neighbour: sends `micro`'s output and receives `micro_back`'s gradient
  // (`micro_fwd`'s activations) in one exchange.
  virtual void send_forward_recv_backward(int micro, int micro_back) = 0;
  virtual void send_backward_recv_forward(int micro, int micro_fwd) = 0;
};

// Task 4 — 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's default): run this stage's step,
// every micro-batch forward once and backward once, so that a stage holds at most p - s micro-batches'
// activations and the pipeline idles no more than its fill and drain, with every send paired with the
// neighbour's receive. The grader first runs your executor for every stage of pipelines of 1 to 8 stages
// and matches their sends and receives (a deadlock is named), then trains with it.
// Task 5 — data parallel × pipeline: several replicas of the pipeline train on different data, and each
// stage's gradients must be averaged over its replicas once per step: say which backward (dp_sync).
void train_step_1f1b(Stage& s);

}  // namespace lab06

// The table the grader looks up in your plugin (defined at the bottom of tp_pp.cpp).
constexpr int kLab06Abi = 4;
struct Lab06Plugin {
  int abi;  // kLab06Abi
  void (*column_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*column_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  void (*row_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*row_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  void (*train_step_1f1b)(lab06::Stage&);
  void (*sp_column_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*sp_column_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  void (*sp_row_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*sp_row_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  void (*sp_norm_grads)(lab06::Group&, float*, int64_t);
};
extern "C" Lab06Plugin distlab_lab06;
