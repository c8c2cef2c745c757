#include "core/parallel/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/loss.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/pointwise.h"
#include "core/ops/op_scope.h"
#include "core/parallel/comm_buffers.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

TpSlice tp_slice(ProcessGroup& tp, int dim, int parts) {
  return TpSlice{dim, parts, tp.rank(), tp.size(), [&tp](Runtime& rt, Tensor& t) { all_reduce_tensor(rt, tp, t); }};
}

void all_reduce_tensor(Runtime& rt, ProcessGroup& g, Tensor& t) {
  if (g.size() == 1) return;
  AsF32 f(rt, t, AsF32::inout);  // a cpu f32 tensor itself; 16-bit through f32, rounded once after the sum
  staged_all_reduce(rt, g, f.p, t.numel(), ReduceOp::sum, DType::f32);  // on the device where it lives; nullptr (meta): traced
  f.store();
}

// ---- sequence parallel: the all-reduce's two halves, and a norm's gradients ----

Tensor sp_gather(Runtime& rt, ProcessGroup& tp, const Tensor& rows, const SeqParallel& sp, const std::string& what) {
  const int64_t C = rows.size(-1), N = sp.B * sp.T, t = tp.size();
  if (N % t != 0 || rows.numel() != N / t * C)
    throw ShapeError(fmt::format("sequence parallel: {} has {} rows here, not 1/{} of the micro-batch's {} x {} tokens", what, rows.numel() / C, t,
                                 sp.B, sp.T),
                     "parallel.tp must divide train.micro_batch x data.seq_len");
  Tensor out = rt.empty({sp.B, sp.T, C}, Category::activations, what + " (gathered)", rows.dtype());
  AsF32 o(rt, out, AsF32::out), r(rt, rows);
  staged_all_gather(rt, tp, o.p, r.p, rows.numel(), DType::f32);  // rank r's rows land at r·N/t: the stream in order
  o.store();
  return out;
}

Tensor sp_reduce_scatter(Runtime& rt, ProcessGroup& tp, const Tensor& terms, const std::string& what) {
  const int64_t C = terms.size(-1), N = terms.numel() / C, t = tp.size();
  if (N % t != 0)
    throw ShapeError(fmt::format("sequence parallel: {} has {} rows, which do not split over {} tensor-parallel ranks", what, N, t),
                     "parallel.tp must divide train.micro_batch x data.seq_len");
  Tensor out = rt.empty({N / t, C}, Category::activations, what + " (this rank's rows)", terms.dtype());
  AsF32 o(rt, out, AsF32::out), in(rt, terms);
  staged_reduce_scatter(rt, tp, o.p, in.p, out.numel(), ReduceOp::sum, DType::f32);
  o.store();
  return out;
}

void StreamSplit::sum(Runtime& rt, Tensor& x, const std::string& what) const {
  if (on_) x = sp_reduce_scatter(rt, tp_, x, what);
  else all_reduce_tensor(rt, tp_, x);
}

Tensor StreamSplit::norm_backward(Runtime& rt, Layer& norm, const Tensor& dout) const {
  return on_ ? sp_norm_backward(rt, tp_, norm, dout, kernels_) : norm.backward(rt, dout);
}

Tensor sp_norm_backward(Runtime& rt, ProcessGroup& tp, Layer& norm, const Tensor& dout, TpKernels* k) {
  std::vector<Parameter*> ps = norm.parameters();
  std::vector<Tensor> before;
  for (Parameter* p : ps) {  // this micro-batch's gradients alone, then summed over the ranks' rows
    before.push_back(p->grad);
    p->grad = Tensor();
  }
  Tensor dx = norm.backward(rt, dout);
  for (size_t i = 0; i < ps.size(); i++) {
    Parameter& p = *ps[i];
    if (!p.grad.defined()) {
      p.grad = before[i];
      continue;
    }
    if (k) {  // host code's sum (the grader's lab 06)
      OnHost g(p.grad, OnHost::inout);
      if (g.p) k->sp_norm_grads(tp, g.p, p.grad.numel());
      g.store();
    } else {
      all_reduce_tensor(rt, tp, p.grad);
    }
    if (before[i].defined()) {  // what earlier micro-batches left, plus this one's
      AsF32 acc(rt, before[i], AsF32::inout), g(rt, p.grad);
      accumulate(rt, acc.p, g.p, p.grad.numel());
      acc.store();
      p.grad = before[i];
    }
  }
  return dx;
}

static int64_t split(int64_t n, ProcessGroup& g, const std::string& what, const std::string& prefix) {
  if (n % g.size() != 0)
    throw ConfigError(fmt::format("{}: {} {} does not split over {} tensor-parallel ranks", prefix, what, n, g.size()),
                      "parallel.tp must divide the layer's width (and the number of heads)");
  return n / g.size();
}

static int64_t split_vocab(int64_t v, ProcessGroup& tp, const std::string& name) {
  if (v % tp.size() != 0) {
    const int64_t m = 128 * int64_t(tp.size()), padded = (v + m - 1) / m * m;
    throw ConfigError(fmt::format("{}: the vocabulary of {} does not split over {} tensor-parallel ranks", name, v, tp.size()),
                      fmt::format("pad model.vocab_size to a multiple of parallel.tp, as Megatron pads it to one of 128 x tp: {} "
                                  "(the extra tokens are never a target: training pushes their probability to 0)", padded));
  }
  return v / tp.size();
}

// ---- split parameters ----

std::vector<SliceRun> split_runs(const Shape& whole, int dim, int parts, int rank, int t) {
  std::vector<SliceRun> runs;
  if (dim < 0) return {SliceRun{0, 0, shape_numel(whole)}};
  DL_ASSERT(dim < int(whole.size()) && whole[size_t(dim)] % (int64_t(parts) * t) == 0, "split_runs: the dimension does not split");
  if (dim == 0) {
    const int64_t inner = shape_numel(whole) / whole[0], block = whole[0] / parts, rows = block / t;
    for (int p = 0; p < parts; p++) runs.push_back({(p * block + rank * rows) * inner, p * rows * inner, rows * inner});
  } else {
    DL_ASSERT(dim == 1 && whole.size() == 2 && parts == 1, "split_runs: columns of a matrix only");
    const int64_t cols = whole[1] / t;
    for (int64_t i = 0; i < whole[0]; i++) runs.push_back({i * whole[1] + rank * cols, i * cols, cols});
  }
  return runs;
}

Shape whole_shape(const Parameter& p, int t) {
  Shape s = p.data.shape();
  if (p.split_dim >= 0) s[size_t(p.split_dim)] *= t;
  return s;
}

// local = this rank's runs of whole, converting between their dtypes
// `whole` is a host tensor; `local` may be on a cuda rank's device (OnHost carries it up)
static void take_runs(const Tensor& whole, Tensor& local, int dim, int parts, int rank, int t) {
  if (!local.data() || !whole.data()) return;  // meta
  const size_t ws = size_t(dtype_size(whole.dtype()));
  OnHost l(local, OnHost::out);
  for (const SliceRun& r : split_runs(whole.shape(), dim, parts, rank, t))
    convert(static_cast<const char*>(whole.data()) + size_t(r.whole_offset) * ws, whole.dtype(), l.p + r.local_offset, DType::f32, r.numel);
  l.store();  // rounded to the local dtype
}

void load_split_params(const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole, int rank, int t) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* w : whole) by_name[w->name] = w;
  for (Parameter* l : local) {
    const std::string& name = l->tied.empty() ? l->name : l->tied;  // a pipeline's copy takes its original's values
    auto it = by_name.find(name);
    DL_ASSERT(it != by_name.end() && whole_shape(*l, t) == it->second->data.shape(),
              fmt::format("load_split_params: {} is not in the whole model, or not with this shape", name));
    take_runs(it->second->data, l->data, l->split_dim, l->split_parts, rank, t);
  }
}

int gather_split_params(ProcessGroup& tp, const std::vector<Parameter*>& local, const std::vector<Parameter*>& whole,
                        const Optimizer* masters) {
  std::map<std::string, Parameter*> by_name;
  for (Parameter* l : local)
    if (l->tied.empty()) by_name[l->name] = l;
  const int t = tp.size();
  int filled = 0;
  for (Parameter* wp : whole) {
    auto it = by_name.find(wp->name);
    if (it == by_name.end()) continue;  // another pipeline stage holds it
    Parameter& l = *it->second;
    Tensor& w = wp->data;
    DL_ASSERT(whole_shape(l, t) == w.shape(), fmt::format("gather_split_params: {} has another shape", l.name));
    filled++;
    if (!w.data() || !l.data.data()) continue;  // meta
    const Tensor* m = masters ? masters->master(&l) : nullptr;
    const Tensor& src = m ? *m : l.data;
    const int64_t n = src.numel();
    const OnHost mine(src);  // f32 on the host, from any device and dtype
    if (l.split_dim < 0 || t == 1) {  // whole on every rank
      convert(mine.p, DType::f32, w.data(), w.dtype(), n);
      continue;
    }
    std::vector<float> all(static_cast<size_t>(n * t)), out(static_cast<size_t>(w.numel()));
    tp.all_gather(all.data(), mine.p, n);
    for (int r = 0; r < t; r++)
      for (const SliceRun& run : split_runs(w.shape(), l.split_dim, l.split_parts, r, t))
        std::memcpy(out.data() + run.whole_offset, all.data() + r * n + run.local_offset, size_t(run.numel) * sizeof(float));
    convert(out.data(), DType::f32, w.data(), w.dtype(), w.numel());
  }
  return filled;
}

double model_parallel_grad_norm(Runtime& rt, const std::vector<Parameter*>& params, ProcessGroup* tp, ProcessGroup* pp) {
  std::vector<Parameter*> split, whole;
  for (Parameter* p : params) {
    if (!p->tied.empty()) continue;  // a pipeline's copy of a tied weight: its original counts (the same gradient)
    (p->split_dim >= 0 && tp && tp->size() > 1 ? split : whole).push_back(p);
  }
  const double a = grad_norm(rt, split), b = grad_norm(rt, whole);
  float ss = float(a * a + (!tp || tp->rank() == 0 ? b * b : 0.0));
  for (ProcessGroup* g : {tp, pp}) {
    if (!g || g->size() == 1) continue;
    if (rt.is_meta()) g->all_reduce(nullptr, 1);
    else g->all_reduce(&ss, 1);
  }
  return std::sqrt(double(ss));
}

// ---- either layer through TpKernels (replaced arithmetic): the same shapes, the arithmetic elsewhere ----
// The kernels are host code, perhaps in a process of their own: their arrays are host memory (OnHost), down
// from and back up to a cuda rank's device.

// `sp` (sequence parallel): the stream's side — a column layer's x, a row layer's y — is this rank's N/t rows
// (N/t, C), the other side every row (B, T, features/t); `rows` passed on is N, every rank's.
static Tensor kernels_forward(Runtime& rt, TpKernels& k, bool column, ProcessGroup& tp, Linear& local, Parameter* bias, const Tensor& x,
                              Tensor& saved_x, const SeqParallel* sp) {
  if (local.lora)
    throw ConfigError(fmt::format("{}: a LoRA adapter on a layer whose arithmetic is replaced (TpKernels): the kernels compute the base alone",
                                  local.weight.name),
                      "train LoRA with the engine's own tensor-parallel layers (lora.r = 0 with the replaced kernels)");
  const int64_t in = local.in_features, out = local.out_features, t = tp.size();
  expect_shape(local.describe() + " " + local.weight.name, x, {in});
  const int64_t rows = sp ? sp->B * sp->T : x.numel() / in;
  if (sp && (rows % t != 0 || x.numel() != (column ? rows / t : rows) * in))
    throw ShapeError(fmt::format("sequence parallel: {}'s input has {} rows, the micro-batch {} x {} tokens over {} ranks", local.weight.name,
                                 x.numel() / in, sp->B, sp->T, t),
                     "parallel.tp must divide train.micro_batch x data.seq_len");
  Shape shape = x.shape();
  if (sp) shape = column ? Shape{sp->B, sp->T, out} : Shape{rows / t, out};
  else shape.back() = out;
  Tensor y = rt.empty(shape, Category::activations, "output of " + local.weight.name, rt.dtype);
  saved_x = x;  // sequence parallel: a column layer keeps its rows alone (its backward gathers them again)
  OnHost xf(x), w(local.weight.data), b(bias ? bias->data : Tensor()), yf(y, OnHost::out);
  if (!yf.p) return y;  // meta: shapes only (replaced kernels compute nothing on meta)
  const float* bp = bias ? b.p : nullptr;
  if (column) sp ? k.sp_column_forward(tp, xf.p, w.p, bp, yf.p, rows, in, out) : k.column_forward(tp, xf.p, w.p, bp, yf.p, rows, in, out);
  else sp ? k.sp_row_forward(tp, xf.p, w.p, bp, yf.p, rows, in, out) : k.row_forward(tp, xf.p, w.p, bp, yf.p, rows, in, out);
  yf.store();
  return y;
}

// the kernels write dw and db; they are added to the parameters' gradients here
static Tensor kernels_backward(Runtime& rt, TpKernels& k, bool column, ProcessGroup& tp, Linear& local, Parameter* bias, const Tensor& dout,
                               Tensor& saved_x, const SeqParallel* sp) {
  DL_ASSERT(saved_x.defined(), "a tensor-parallel layer's backward (replaced kernels) without its forward");
  const int64_t in = local.in_features, out = local.out_features;
  // the rows the forward saw: what it kept (a column layer under sequence parallel kept its rows, 1/t of them)
  const int64_t rows = saved_x.numel() / in * (sp && column ? tp.size() : 1);
  if (sp && dout.numel() != (column ? rows : rows / tp.size()) * out)
    throw ShapeError(fmt::format("sequence parallel: the gradient of {}'s output has {} rows, not {}", local.weight.name, dout.numel() / out,
                                 column ? rows : rows / tp.size()));
  Tensor dx = rt.empty(saved_x.shape(), Category::activations, "grad of input of " + local.weight.name, rt.dtype);
  // the kernels write f32 gradients in host memory, counted as the rank's gradients
  Tensor dw = rt.host_empty({out, in}, Category::grads, "the kernels' gradient of " + local.weight.name);
  Tensor db = bias ? rt.host_empty({out}, Category::grads, "the kernels' gradient of " + bias->name) : Tensor();
  {
    OnHost dxf(dx, OnHost::out), x(saved_x), w(local.weight.data), dy(dout);
    if (dxf.p) {
      float* dbp = bias ? db.f32() : nullptr;
      if (column && sp) k.sp_column_backward(tp, x.p, w.p, dy.p, dxf.p, dw.f32(), dbp, rows, in, out);
      else if (column) k.column_backward(tp, x.p, w.p, dy.p, dxf.p, dw.f32(), dbp, rows, in, out);
      else if (sp) k.sp_row_backward(tp, x.p, w.p, dy.p, dxf.p, dw.f32(), dbp, rows, in, out);
      else k.row_backward(tp, x.p, w.p, dy.p, dxf.p, dw.f32(), dbp, rows, in, out);
    }
    dxf.store();
  }
  std::vector<std::pair<Parameter*, Tensor*>> grads = {{&local.weight, &dw}};
  if (bias) grads.push_back({bias, &db});
  for (auto [p, g] : grads) {
    OnHost acc(p->grad_for_accumulate(), OnHost::inout);
    if (acc.p && g->data())
      for (int64_t i = 0; i < g->numel(); i++) acc.p[i] += g->f32()[i];
    acc.store();
  }
  saved_x = Tensor();
  return dx;
}

// ---- column-parallel: this rank's rows of W (its outputs) ----

ColumnParallelLinear::ColumnParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool bias,
                                           int parts, const SeqParallel* sp)
    : tp_(tp), local_(rt, prefix, in, split(out, tp, "out_features", prefix), bias), out_(out), sp_(sp) {
  if (out % (int64_t(parts) * tp.size()) != 0)
    throw ConfigError(fmt::format("{}: {} blocks of {} rows do not split over {} tensor-parallel ranks", prefix, parts, out / parts, tp.size()),
                      "parallel.tp must divide model.n_embd (and the number of heads)");
  for (Parameter* p : local_.parameters()) p->split_dim = 0, p->split_parts = parts;
  local_.tp = tp_slice(tp, 0, parts);
}

std::string ColumnParallelLinear::describe() const {
  return fmt::format("ColumnParallelLinear({} -> {}, rows {}..{} of {})", local_.in_features, out_, tp_.rank() * local_.out_features,
                     (tp_.rank() + 1) * local_.out_features, out_);
}

Tensor ColumnParallelLinear::forward(Runtime& rt, const Tensor& x) {
  if (kernels_) return kernels_forward(rt, *kernels_, true, tp_, local_, local_.has_bias_ ? &local_.bias : nullptr, x, saved_x_, sp_);
  if (!sp_) return local_.forward(rt, x);  // f: identity
  rows_ = x;                                                                            // (N/t, in): kept
  Tensor y = local_.forward(rt, sp_gather(rt, tp_, x, *sp_, local_.weight.name + "'s input"));  // g: (B, T, in) -> (B, T, out/t)
  local_.release_input();  // the gathered x is not kept: backward gathers it again
  return y;
}

Tensor ColumnParallelLinear::backward(Runtime& rt, const Tensor& dout) {
  if (kernels_) return kernels_backward(rt, *kernels_, true, tp_, local_, local_.has_bias_ ? &local_.bias : nullptr, dout, saved_x_, sp_);
  if (sp_) {
    DL_ASSERT(rows_.defined(), "ColumnParallelLinear::backward (sequence parallel) without a forward");
    local_.keep_input(rt, sp_gather(rt, tp_, rows_, *sp_, local_.weight.name + "'s input, again"));
    rows_ = Tensor();
    Tensor dx = local_.backward(rt, dout);  // this rank's term of dx, every row
    return dx.defined() ? sp_reduce_scatter(rt, tp_, dx, "grad of " + local_.weight.name + "'s input") : dx;  // g's backward
  }
  Tensor dx = local_.backward(rt, dout);        // this rank's term of dx = Σ_r dy_r·W_r
  if (dx.defined()) all_reduce_tensor(rt, tp_, dx);  // f's backward
  return dx;
}

void ColumnParallelLinear::load_slice(const Linear& whole) {
  DL_ASSERT(whole.in_features == local_.in_features && whole.out_features == out_, "load_slice: another layer's shape");
  take_runs(whole.weight.data, local_.weight.data, 0, local_.weight.split_parts, tp_.rank(), tp_.size());
  if (local_.has_bias_) take_runs(whole.bias.data, local_.bias.data, 0, local_.bias.split_parts, tp_.rank(), tp_.size());
}

// ---- row-parallel: this rank's columns of W (its inputs) ----

RowParallelLinear::RowParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool has_bias,
                                     const SeqParallel* sp)
    : tp_(tp), local_(rt, prefix, split(in, tp, "in_features", prefix), out, false), in_(in), has_bias_(has_bias), sp_(sp) {
  local_.weight.split_dim = 1;
  local_.tp = tp_slice(tp, 1, 1);
  if (has_bias) bias = make_parameter(rt, prefix + ".bias", {out}, /*decay=*/false);
}

std::string RowParallelLinear::describe() const {
  return fmt::format("RowParallelLinear({} -> {}, columns {}..{} of {})", in_, local_.out_features, tp_.rank() * local_.in_features,
                     (tp_.rank() + 1) * local_.in_features, in_);
}

std::vector<Parameter*> RowParallelLinear::parameters() {
  std::vector<Parameter*> p = local_.parameters();
  if (has_bias_) p.push_back(&bias);
  return p;
}

Tensor RowParallelLinear::forward(Runtime& rt, const Tensor& x) {
  if (kernels_) return kernels_forward(rt, *kernels_, false, tp_, local_, has_bias_ ? &bias : nullptr, x, saved_x_, sp_);
  Tensor y = local_.forward(rt, x);  // this rank's term of Σ_r x_r·W_rᵀ
  if (sp_) y = sp_reduce_scatter(rt, tp_, y, "output of " + local_.weight.name);  // ḡ: this rank's rows of the sum
  else all_reduce_tensor(rt, tp_, y);  // g
  if (has_bias_) {                   // the bias once, after the sum
    const int64_t out = local_.out_features;
    AsF32 yf(rt, y, AsF32::inout), b(rt, bias.data);
    bias_forward(rt, yf.p, b.p, y.numel() / out, out);
    yf.store();
  }
  return y;
}

void RowParallelLinear::keep_input(Runtime& rt, const Tensor& x) {
  if (kernels_) throw Error(describe() + ": op-level activation checkpointing with replaced kernels", "use selective or full checkpointing");
  local_.keep_input(rt, x);
}

Tensor RowParallelLinear::backward(Runtime& rt, const Tensor& dout) {
  if (kernels_) return kernels_backward(rt, *kernels_, false, tp_, local_, has_bias_ ? &bias : nullptr, dout, saved_x_, sp_);
  // ḡ's backward: every rank's rows of dy, gathered (sequence parallel); g's is the identity
  const Tensor dy_all = sp_ ? sp_gather(rt, tp_, dout, *sp_, "grad of " + local_.weight.name + "'s output") : dout;
  if (has_bias_ && bias.requires_grad) {  // db = Σ_rows dy: dy is whole, so every rank computes the same bias gradient
    const int64_t out = local_.out_features;
    AsF32 db(rt, bias.grad_for_accumulate(), AsF32::inout), dy(rt, dy_all);
    bias_backward(rt, db.p, dy.p, dy_all.numel() / out, out);
    db.store();
  }
  return local_.backward(rt, dy_all);  // dx_r = dy·W_r, dW_r = dyᵀ·x_r
}

void RowParallelLinear::load_slice(const Linear& whole) {
  DL_ASSERT(whole.in_features == in_ && whole.out_features == local_.out_features, "load_slice: another layer's shape");
  take_runs(whole.weight.data, local_.weight.data, 1, 1, tp_.rank(), tp_.size());
  if (has_bias_) take_runs(whole.bias.data, bias.data, -1, 1, 0, 1);
}

// ---- attention, heads split ----

ParallelSelfAttention::ParallelSelfAttention(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t C, int64_t n_head,
                                             AttentionCore core, const SeqParallel* sp)
    : c_attn(rt, tp, prefix + ".c_attn", C, 3 * C, true, 3, sp),
      c_proj(rt, tp, prefix + ".c_proj", C, C, true, sp),
      C_(C),
      local_heads_(n_head / tp.size()),
      core_(core) {
  if (n_head % tp.size() != 0)
    throw ConfigError(fmt::format("{}: {} heads do not split over {} tensor-parallel ranks", prefix, n_head, tp.size()),
                      "parallel.tp must divide model.n_head: each rank computes whole heads");
}

std::string ParallelSelfAttention::describe() const {
  return fmt::format("ParallelSelfAttention({}, {} of the heads on this rank{})", C_, local_heads_,
                     core_.flash() ? ", flash" : core_.recomputes() ? ", probabilities recomputed" : "");
}

std::vector<Parameter*> ParallelSelfAttention::parameters() {
  auto p = c_attn.parameters();
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

void ParallelSelfAttention::load_slice(const CausalSelfAttention& whole) {
  c_attn.load_slice(whole.c_attn);     // this rank's heads of q, of k and of v
  c_proj.load_slice(whole.c_proj);     // the columns those heads' outputs meet
}

Tensor ParallelSelfAttention::forward(Runtime& rt, const Tensor& x) {
  qkv_ = c_attn.forward(rt, x);                                                  // (B, T, 3C/t)
  Tensor y = core_.forward(rt, qkv_, local_heads_, " (this rank's heads)");     // (B, T, C/t)
  return c_proj.forward(rt, y);  // g: the heads' contributions summed over the group
}

Tensor ParallelSelfAttention::backward(Runtime& rt, const Tensor& dout) {
  Tensor dy = c_proj.backward(rt, dout);
  Tensor dqkv = core_.backward(rt, dy, qkv_, local_heads_, " (this rank's heads)");
  qkv_ = Tensor();
  return c_attn.backward(rt, dqkv);  // f's backward: dx summed over the group
}

// ---- the vocabulary split: embedding and cross-entropy ----

VocabParallelEmbedding::VocabParallelEmbedding(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t v, int64_t b, int64_t c,
                                               const SeqParallel* sp)
    : vocab(v), block(b), C(c), first(tp.rank() * split_vocab(v, tp, prefix + "wte")), tp_(tp), sp_(sp) {
  wte = make_parameter(rt, prefix + "wte.weight", {v / tp.size(), c});
  wte.split_dim = 0;
  wpe = make_parameter(rt, prefix + "wpe.weight", {b, c});
}

void VocabParallelEmbedding::load_slice(const Embedding& whole) {
  take_runs(whole.wte.data, wte.data, 0, 1, tp_.rank(), tp_.size());
  take_runs(whole.wpe.data, wpe.data, -1, 1, 0, 1);
}

Tensor VocabParallelEmbedding::forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  if (T > block || int64_t(tokens.size()) != B * T)
    throw ShapeError(fmt::format("vocab-parallel embedding: {} tokens for a batch of {} x {} (block size {})", tokens.size(), B, T, block));
  // this rank's tokens as rows of its slice; the others' as -1, whose rows the kernel leaves zero here
  const int64_t rows = wte.data.size(0);
  saved_local_.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    const int32_t t = tokens[i];
    if (!rt.is_meta() && (t < 0 || t >= vocab)) throw DataError(fmt::format("token id {} is outside the vocabulary of {}", t, vocab));
    saved_local_[i] = t >= first && t < first + rows ? int32_t(t - first) : -1;
  }
  Tensor out = rt.empty({B, T, C}, Category::activations, "output of embedding (vocab-parallel)", rt.dtype);
  {
    AsF32 o(rt, out, AsF32::out), e(rt, wte.data), p(rt, wpe.data);
    Indices ids(rt, saved_local_);
    const Tensor rows = positions.empty() ? Tensor() : gather_position_rows(rt, p.p, positions, block, C);  // context parallel
    embedding_forward(rt, o.p, ids.p, e.p, positions.empty() ? p.p : rows.f32(), B, T, C);  // wte row + wpe for this rank's tokens, zeros for the others
    o.store();
  }
  B_ = B;
  T_ = T;
  if (sp_) return sp_reduce_scatter(rt, tp_, out, "output of embedding");  // this rank's rows of the stream
  all_reduce_tensor(rt, tp_, out);  // each token: exactly one rank's row, plus zeros — the row itself
  return out;
}

void VocabParallelEmbedding::backward(Runtime& rt, const Tensor& dout) {
  // dout is whole on every rank (sequence parallel: gathered from the rows): each adds it into its own
  // tokens' rows, and every rank into all of dwpe (the same sums in the same order as the whole embedding's)
  const Tensor d = sp_ ? sp_gather(rt, tp_, dout, *sp_, "grad of embedding output") : dout;
  if (!wte.requires_grad && !wpe.requires_grad) {  // frozen (LoRA): no gradient at all, as nn's Embedding
    saved_local_.clear();
    return;
  }
  AsF32 de(rt, wte.grad_for_accumulate(), AsF32::inout), dp(rt, wpe.grad_for_accumulate(), AsF32::inout), dy(rt, d);
  {
    Indices ids(rt, saved_local_);
    if (positions.empty()) embedding_backward(rt, de.p, dp.p, dy.p, ids.p, B_, T_, C);
    else {  // context parallel: wpe's gradient at this rank's positions
      Tensor drows = rt.zeros({T_, C}, Category::activations, "grad of wpe rows", DType::f32);
      embedding_backward(rt, de.p, drows.f32(), dy.p, ids.p, B_, T_, C);
      scatter_position_grad(rt, dp.p, drows.f32(), positions, C);
    }
  }
  de.store();
  dp.store();
  saved_local_.clear();
}

double VocabParallelCrossEntropy::forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets, int64_t first,
                                          int64_t* correct, double* loss_out) {
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  if (int64_t(targets.size()) != N)
    throw ShapeError(fmt::format("vocab-parallel cross-entropy: {} targets for {} rows of logits {}", targets.size(), N, shape_str(logits.shape())));
  if (tp_.size() == 1) return whole_.forward(rt, logits, targets, correct, loss_out);
  for (const int32_t t : targets)
    if (t >= V * tp_.size())
      throw DataError(fmt::format("target {} is out of range for a vocabulary of {}", t, V * tp_.size()),
                      "the data set's tokens don't match model.vocab_size");
  probs_ = rt.empty({N, V}, Category::activations, "softmax probabilities (this rank's columns)");
  targets_ = targets;
  first_ = first;
  logits_dtype_ = logits.dtype();
  // per row: the max, the sum of exp(z - max) and the target's logit, each all-reduced over the group
  Tensor mx = rt.empty({N}, Category::activations, "row maxima of the logits"), sum = rt.empty({N}, Category::activations, "row sums of exp"),
         zt = rt.empty({N}, Category::activations, "the target's logit");
  AsF32 z(rt, logits);
  Indices t(rt, targets);
  vocab_ce_max(rt, mx.f32(), z.p, N, V);
  staged_all_reduce(rt, tp_, mx.f32(), N, ReduceOp::max, DType::f32);
  vocab_ce_exp(rt, probs_.f32(), sum.f32(), zt.f32(), z.p, mx.f32(), t.p, first, N, V);
  staged_all_reduce(rt, tp_, sum.f32(), N, ReduceOp::sum, DType::f32);
  staged_all_reduce(rt, tp_, zt.f32(), N, ReduceOp::sum, DType::f32);  // one rank's logit, plus zeros
  return vocab_ce_finish(rt, probs_.f32(), sum.f32(), zt.f32(), mx.f32(), t.p, N, V, correct, loss_out);  // loss = log(sum) + max - z_target
}

Tensor VocabParallelCrossEntropy::backward(Runtime& rt, float scale) {
  if (tp_.size() == 1) return whole_.backward(rt, scale);
  // (softmax - onehot) · scale / rows is the plain loss's gradient, with the targets as this rank's columns:
  // a target another rank holds as V (never a column here), an ignored one as -1 (a zero row)
  const int64_t N = probs_.size(0), V = probs_.size(1);
  std::vector<int32_t> local(targets_.size());
  for (size_t i = 0; i < local.size(); i++) {
    const int32_t t = targets_[i];
    local[i] = t < 0 ? -1 : t >= first_ && t < first_ + V ? int32_t(t - first_) : int32_t(V);
  }
  Tensor d = rt.empty({N, V}, Category::activations, "grad of logits (this rank's columns)", logits_dtype_);
  {
    AsF32 df(rt, d, AsF32::out);
    Indices ti(rt, local);
    softmax_crossentropy_backward(rt, df.p, probs_.f32(), ti.p, N, V, scale);
    df.store();
  }
  probs_ = Tensor();
  return d;
}

}  // namespace distlab
