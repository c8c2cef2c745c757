// Lab 06: everything your tp_pp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your tp_pp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside each rank's trainer. The trainer owns the model (GPT-2,
// split over a tensor-parallel group of t ranks and p pipeline stages), the data and the process groups.
//  - Tasks 1-2: every column- and row-parallel Linear of the model (attn.c_attn, attn.c_proj, mlp.c_fc,
//    mlp.c_proj in every block) calls your four functions for its forward and its backward, with this
//    rank's slice of the weights, and runs the collectives you ask for on its tensor-parallel group:
//      g.all_reduce(data, n)    blocking: data becomes the sum over the group's ranks
//    Every rank of the group must ask for the same all-reduces, in the same order, with the same sizes.
//  - Tasks 3-4: each pipeline stage asks your schedule once for its order of forwards and backwards, and
//    which of its backwards synchronise the data-parallel replicas' gradients. The trainer runs them, and
//    sends and receives the activations and gradients between neighbouring stages.
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
  };
  Group(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}
  int rank() const { return rank_; }
  int size() const { return size_; }  // t, the tensor-parallel ranks
  void all_reduce(float* data, int64_t n) { ops_->all_reduce(ctx_, data, n); }

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

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

// One step of a stage: the forward or the backward of micro-batch `micro` (0..m-1).
struct Action {
  bool forward;
  int micro;
};

// Task 3 — 1F1B: stage `stage` (0..stages-1) of a pipeline, m micro-batches per step. Return the order in
// which this stage runs every micro-batch's forward and backward (see the README). The trainer sends each
// action's output to the neighbour and receives each action's input from it: neighbouring stages' orders
// must fit together, or both wait for each other until the timeout names the stage.
std::vector<Action> schedule_1f1b(int stages, int stage, int micro_batches);

// Task 4 — data parallel × pipeline: several replicas of the pipeline train on different data, and each
// stage's gradients must be averaged over its replicas once per step. `order` is your schedule for this
// stage and order[k] one of its backwards: return whether the replicas average their gradients during
// that backward (what they hold so far: PyTorch's no_sync until then).
bool dp_sync(const std::vector<Action>& order, int k);

}  // namespace lab06

// The table the grader looks up in your plugin (defined at the bottom of tp_pp.cpp).
constexpr int kLab06Abi = 1;
struct Lab06Plugin {
  int abi;  // kLab06Abi
  void (*column_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*column_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  void (*row_forward)(lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
  void (*row_backward)(lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t);
  std::vector<lab06::Action> (*schedule_1f1b)(int, int, int);
  bool (*dp_sync)(const std::vector<lab06::Action>&, int);
};
extern "C" Lab06Plugin distlab_lab06;
