// Megatron-LM's tensor parallelism (Shoeybi et al., 2019): the two layers every TP model is built from.
// A Linear y = x·Wᵀ + b, W (out, in) as PyTorch stores it, split over the t ranks of a TP group (mesh.h):
//
//   ColumnParallelLinear — W split by rows (the outputs): rank r holds W[r·out/t : (r+1)·out/t, :] and that
//     slice of b. x is whole on every rank; y_r is this rank's slice of the outputs.
//       forward   f = identity             y_r = x·W_rᵀ + b_r                          (no communication)
//       backward  f's backward = all-reduce: dx = Σ_r dy_r·W_r (each rank holds one term)   one all-reduce
//   RowParallelLinear — W split by columns (the inputs): rank r holds W[:, r·in/t : (r+1)·in/t]; b whole.
//     x_r is this rank's slice of the inputs (what a column-parallel layer produced).
//       forward   g = all-reduce           y = Σ_r x_r·W_rᵀ, then + b                  one all-reduce
//       backward  g's backward = identity  dx_r = dy·W_r, dW_r = dyᵀ·x_r, db = Σ dy (the same on every rank)
//
// Chained — column, an elementwise op (GELU acts on each slice alone), row — a transformer's MLP costs one
// all-reduce of the activations (B·T·C) in forward and one in backward, and each rank holds 1/t of both
// weights and of the hidden activations (B·T·4C). Attention is the same with the heads split: c_attn
// column-parallel (each rank computes n_head/t heads), c_proj row-parallel.
//
// The reference they are held to is the whole nn.Linear on one rank (tests/test_tensor_parallel.cpp).
// Read next: core/parallel/gpt_parallel.h (GPT split with these layers).
#pragma once
#include "core/comm/process_group.h"
#include "core/nn/attention.h"
#include "core/nn/embedding.h"
#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"

namespace distlab {

// ---- split parameters (Parameter::split_dim): where a rank's slice lies in the whole tensor ----

// A run of contiguous elements: whole (flattened) [whole_offset, +numel) is local [local_offset, +numel).
struct SliceRun {
  int64_t whole_offset, local_offset, numel;
};
// The runs of rank `rank` of `t` for a whole tensor of `whole` shape split along `dim` (0: rows, one run
// per block of `parts`; 1: columns, one run per row).
std::vector<SliceRun> split_runs(const Shape& whole, int dim, int parts, int rank, int t);
// The whole tensor's shape from a rank's slice.
Shape whole_shape(const Parameter& p, int t);
// This rank's slices taken from whole tensors, by name (a pipeline's copy of a tied weight by its
// original's): what a TP model does with a whole model's initial weights or an --init file. Whole
// parameters are copied.
void load_split_params(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole, int rank, int t);
// Every rank's slices put together into the whole tensors of the same names (a collective over `tp`: one
// all-gather per split parameter), from the f32 masters where `masters` has them — what a save writes.
// Whole tensors this rank's pipeline stage does not hold are left alone; returns how many it filled.
int gather_split_params(ProcessGroup& tp, const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole,
                        const Optimizer* masters);
// The L2 norm of the whole model's gradients: the squares of split gradients summed over the TP group,
// those of whole (replicated) ones counted once — Megatron's "not a tensor-parallel duplicate" rule — and
// the stages' sums added over the PP group (a tied copy counted once). Either group may be nullptr.
double model_parallel_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, ProcessGroup* tp, ProcessGroup* pp);

// ---- sequence parallelism (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer
// Models"; Megatron-LM's --sequence-parallel) ----
// Between the split layers a TP group computes the same thing t times: the LayerNorms, the dropouts and the
// residual adds run on the whole (B, T, C) stream on every rank. Sequence parallelism splits that stream too:
// rank r holds rows [r·N/t, (r+1)·N/t) of its N = B·T token rows, (N/t, C). Megatron lays activations out
// (T, B, C), so its split is a slice of the sequence; in distlab's (B, T, C) the same rows a rank are a
// contiguous block of B·T — the same count and bytes, and the ops there work a row at a time. Each
// all-reduce of the activations becomes its two halves, the same bytes:
//   g  before a column-parallel layer: all-gather of the rows     its backward: reduce-scatter
//   ḡ  after a row-parallel layer:     reduce-scatter of the sum  its backward: all-gather
// A LayerNorm's weight and bias see only this rank's rows: their gradients are summed over the group.
// The gathered input of a column-parallel layer is not kept: its backward gathers the rows again (as
// Megatron does), so what a rank keeps between the split layers is 1/t of it.
class TpKernels;
struct SeqParallel {
  int64_t B = 0, T = 0;  // this micro-batch's tokens: the shape a gather makes (the model sets it before each forward)
};
// (N/t, C) this rank's rows -> (B, T, C) every rank's, in order: an all-gather over tp
Tensor sp_gather(Runtime& rt, ProcessGroup& tp, const Tensor& rows, const SeqParallel& sp, const std::string& what);
// (..., C) one term of a sum on every rank -> (N/t, C) this rank's rows of the sum: a reduce-scatter over tp
Tensor sp_reduce_scatter(Runtime& rt, ProcessGroup& tp, const Tensor& terms, const std::string& what);
// A norm's backward on this rank's rows: its parameters' gradients from this micro-batch summed over tp (the
// whole batch's), then added to what they held. Returns dx (N/t, C).
// `k`: the sums through TpKernels::sp_norm_grads (the grader's lab 06) instead of the group's all-reduce.
Tensor sp_norm_backward(Runtime& rt, ProcessGroup& tp, Layer& norm, const Tensor& dout, TpKernels* k = nullptr);

// What a split model's layer factory (gpt_parallel.h's, llama_parallel.h's) does for the stream between the
// split layers: plain tensor parallelism keeps it whole on every rank; sequence parallelism (`on`) keeps this
// rank's rows. The split layers read `sp()`: the micro-batch's shape, set before each forward.
class StreamSplit {
 public:
  StreamSplit(ProcessGroup& tp, bool sequence_parallel) : tp_(tp), on_(sequence_parallel && tp.size() > 1) {}
  bool on() const { return on_; }
  const SeqParallel* sp() const { return on_ ? &sp_ : nullptr; }
  void set_tokens(int64_t B, int64_t T) { sp_ = SeqParallel{B, T}; }
  // x is one term of a sum over the group: all-reduced whole, or (on) this rank's rows of the sum
  void sum(Runtime& rt, Tensor& x, const std::string& what) const;
  // x as a whole-stream reader needs it: itself, or (on) every rank's rows gathered
  Tensor whole(Runtime& rt, const Tensor& x, const std::string& what) const { return on_ ? sp_gather(rt, tp_, x, sp_, what) : x; }
  // a norm's backward on the stream: its gradients summed over the rows' ranks when they are split
  Tensor norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) const;
  // the norms' gradient sums through `k` (TpKernels::sp_norm_grads) instead of the group's all-reduce
  void set_kernels(TpKernels* k) { kernels_ = k; }

 private:
  ProcessGroup& tp_;
  bool on_;
  SeqParallel sp_;
  TpKernels* kernels_ = nullptr;
};

// The two layers' arithmetic and their collectives, replaceable (gpt_parallel.h's set_tp_kernels): host code
// that may run elsewhere, even in a process of its own (the grader's bridge does). Every array is f32, row-major, in
// PyTorch's layout: x (rows, in), w (out, in) — this rank's slice, as the layer holds it — b (out) or
// nullptr, y (rows, out). Gradients are written, not added: the layer adds them to its parameters'.
class TpKernels {
 public:
  virtual ~TpKernels() = default;
  virtual void column_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                              int64_t out) = 0;
  virtual void column_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                               int64_t rows, int64_t in, int64_t out) = 0;
  virtual void row_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                           int64_t out) = 0;
  virtual void row_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int64_t rows, int64_t in, int64_t out) = 0;
  // Sequence parallel (SeqParallel above): `rows` counts the micro-batch's N token rows, every rank's; the
  // stream's side of each layer is this rank's N/t of them — a column-parallel layer's x and dx, a
  // row-parallel layer's y and dy — and the other side is every row (this rank's slice of the features).
  virtual void sp_column_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                                 int64_t out) = 0;
  virtual void sp_column_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                                  int64_t rows, int64_t in, int64_t out) = 0;
  virtual void sp_row_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                              int64_t out) = 0;
  virtual void sp_row_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                               int64_t rows, int64_t in, int64_t out) = 0;
  // A norm on the stream's rows: g (n) its weight's (or bias's) gradient from this rank's rows of one
  // micro-batch, made the whole micro-batch's (in place).
  virtual void sp_norm_grads(ProcessGroup& tp, float* g, int64_t n) = 0;
};

class ColumnParallelLinear : public Layer {
 public:
  // `tp` the TP group (its size t must divide out). Parameters keep PyTorch's names and hold this rank's
  // rows: "mlp.c_fc.weight" is (out/t, in) here. `parts`: the rows are that many fused layers (c_attn's
  // q, k and v: 3), and a rank holds its 1/t of each.
  // `sp`: sequence parallel (above) — x comes in as this rank's rows and is gathered here; dx goes back as
  // this rank's rows of the sum (nullptr: x whole, dx all-reduced).
  ColumnParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool bias = true,
                       int parts = 1, const SeqParallel* sp = nullptr);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;      // x (..., in), whole (sp: (N/t, in)) -> (..., out/t), this rank's slice
  Tensor backward(Runtime& rt, const Tensor& dout) override;  // dout (..., out/t) -> dx (..., in), summed over the group (sp: its rows)
  std::vector<Parameter*> parameters() override { return local_.parameters(); }
  std::vector<Layer*> children() override { return {&local_}; }  // what LoRA adapts (core/nn/lora.h)
  // This rank's rows of a whole layer's weights (for the equivalence with t = 1, and for loading): its
  // 1/t of the rows, or — fused layers — its 1/t of each of the `parts` blocks (c_attn: its heads of each).
  void load_slice(const Linear& whole);
  Linear& local() { return local_; }
  void swap_saved(SavedState& s) override {
    local_.swap_saved(s);
    s.swap(saved_x_);
    s.swap(rows_);
  }
  // Forward and backward through `k` instead of the layer's own arithmetic (nullptr: its own).
  void set_kernels(TpKernels* k) { kernels_ = k; }

 private:
  ProcessGroup& tp_;
  Linear local_;  // in -> out/t
  int64_t out_;
  const SeqParallel* sp_;
  TpKernels* kernels_ = nullptr;
  Tensor saved_x_;  // the input, under kernels_ (local_ keeps its own otherwise)
  Tensor rows_;     // sp: this rank's rows of the input, gathered again in backward
};

class RowParallelLinear : public Layer {
 public:
  // t must divide in. "attn.c_proj.weight" is (out, in/t) here; the bias is whole. `sp`: sequence parallel —
  // the sum is reduce-scattered (y comes out as this rank's rows, (N/t, out)) and dy comes in as them.
  RowParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool bias = true,
                    const SeqParallel* sp = nullptr);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;      // x (..., in/t), this rank's slice -> (..., out), whole
  Tensor backward(Runtime& rt, const Tensor& dout) override;  // dout (..., out), whole -> dx (..., in/t)
  std::vector<Parameter*> parameters() override;
  std::vector<Layer*> children() override { return {&local_}; }
  void load_slice(const Linear& whole);
  void swap_saved(SavedState& s) override {
    local_.swap_saved(s);
    s.swap(saved_x_);
  }
  void set_kernels(TpKernels* k) { kernels_ = k; }
  void keep_input(Runtime& rt, const Tensor& x) override;
  Parameter bias;  // (out), the same on every rank (its gradient too: every rank sums the same dy)

 private:
  ProcessGroup& tp_;
  Linear local_;  // in/t -> out, no bias: the bias is added once, after the sum
  int64_t in_;
  bool has_bias_;
  const SeqParallel* sp_;
  TpKernels* kernels_ = nullptr;
  Tensor saved_x_;
};

// GPT-2's attention with the heads split over the TP group: c_attn column-parallel (this rank's n_head/t
// heads of q, k and v), the attention of those heads alone (they never look at each other's), c_proj
// row-parallel. One all-reduce forward (in c_proj), one backward (in c_attn). Per rank: 1/t of the weights,
// of qkv (B, T, 3C/t) and of the attention probabilities (B, NH/t, T, T).
class ParallelSelfAttention : public Layer {
 public:
  ParallelSelfAttention(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t C, int64_t n_head,
                        AttentionCore core = AttentionCore(), const SeqParallel* sp = nullptr);
  std::string describe() const override;
  Tensor forward(Runtime& rt, const Tensor& x) override;  // (B, T, C) -> (B, T, C), whole on every rank
  Tensor backward(Runtime& rt, const Tensor& dout) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Layer*> children() override { return {&c_attn, &c_proj}; }
  void load_slice(const CausalSelfAttention& whole);
  void swap_saved(SavedState& s) override {
    c_attn.swap_saved(s);
    c_proj.swap_saved(s);
    s.swap(qkv_);
    core_.swap_saved(s);
  }
  ColumnParallelLinear c_attn;
  RowParallelLinear c_proj;

 private:
  int64_t C_, local_heads_;
  AttentionCore core_;  // core/nn/attention.h, on this rank's heads
  Tensor qkv_;
};

// GPT-2's embeddings with the vocabulary split: rank r holds rows [r·V/t, (r+1)·V/t) of wte (whose tied
// lm_head then gives this rank's V/t columns of the logits); wpe is whole on every rank.
//   forward   each rank writes its rows' vectors + wpe (zeros for tokens it does not hold), all-reduce
//   backward  each rank adds dout into the rows of its own tokens (no communication); dwpe everywhere alike
class VocabParallelEmbedding : public TokenEmbedding {
 public:
  // `sp`: sequence parallel — the rows are reduce-scattered instead of all-reduced (out: this rank's (N/t, C)),
  // and the gradient comes in as them
  VocabParallelEmbedding(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t vocab, int64_t block, int64_t C,
                         const SeqParallel* sp = nullptr);
  Tensor forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) override;  // (B*T) -> (B, T, C), whole
  void backward(Runtime& rt, const Tensor& dout) override;
  void load_slice(const Embedding& whole);
  void swap_saved(SavedState& s) override {
    s.swap(saved_local_);
    s.swap(B_);
    s.swap(T_);
  }
  // wte (V/t, C): this rank's rows; wpe (block, C)
  int64_t vocab, block, C, first;  // first: the vocabulary id of this rank's row 0

 private:
  ProcessGroup& tp_;
  const SeqParallel* sp_;
  std::vector<int32_t> saved_local_;  // the tokens as rows of this rank's slice, -1 for the others' (core/ops/cpu/attention.h)
  int64_t B_ = 0, T_ = 0;
};

// Cross-entropy over logits split by vocabulary columns (Megatron's vocab-parallel loss): the full logits
// are never gathered. Per row, three all-reduces of N numbers: the max (for a stable softmax), the sum of
// exp(z - max), and the target's logit (from the rank that holds it). loss = log(sum) + max - z_target.
class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(ProcessGroup& tp) : tp_(tp) {}
  // logits (N, V/t): columns [first, first + V/t) of the vocabulary; the mean loss over rows whose target
  // is not negative, the same on every rank. `correct` counts the rows whose target's logit is the
  // largest of the whole vocabulary (argmax, from the all-reduced max: no extra communication).
  // With one TP rank (pipeline stages alone) it is the plain CrossEntropyLoss: its kernels, on any device.
  // loss_out: as CrossEntropyLoss::forward's (the mean left in a device slot, no wait)
  double forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets, int64_t first, int64_t* correct = nullptr,
                 double* loss_out = nullptr);
  Tensor backward(Runtime& rt, float scale = 1.0f);  // (N, V/t): (softmax - onehot) · scale / rows

 private:
  ProcessGroup& tp_;
  CrossEntropyLoss whole_;  // tp = 1
  Tensor probs_;
  DType logits_dtype_ = DType::f32;
  std::vector<int32_t> targets_;
  int64_t first_ = 0;
};

// A Linear's place in a layer split over `tp` (core/nn/lora.h): dim 0 its rows, 1 its columns; its adapter's
// all-reduce is all_reduce_tensor over `tp`
TpSlice tp_slice(ProcessGroup& tp, int dim, int parts);

// The all-reduce (sum) of a tensor in its dtype, over `g`: f32 in place; 16-bit through an f32 buffer,
// rounded once after the sum.
void all_reduce_tensor(Runtime& rt, ProcessGroup& g, Tensor& t);

}  // namespace distlab
