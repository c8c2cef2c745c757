#include "core/parallel/tensor_parallel.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "core/ops/cpu/attention.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

void all_reduce_tensor(Runtime& rt, ProcessGroup& g, Tensor& t) {
  if (g.size() == 1) return;
  if (!t.data()) return g.all_reduce(nullptr, t.numel());  // meta: traced and counted, no data
  if (t.dtype() == DType::f32) return g.all_reduce(t.f32(), t.numel());
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), f.data(), DType::f32, t.numel());
  g.all_reduce(f.data(), t.numel());
  convert(f.data(), DType::f32, t.data(), t.dtype(), t.numel());
}

static int64_t split(int64_t n, ProcessGroup& g, const std::string& what, const std::string& prefix) {
  if (n % g.size() != 0)
    throw ConfigError(fmt::format("{}: {} {} does not split over {} tensor-parallel ranks", prefix, what, n, g.size()),
                      "parallel.tp must divide the layer's width (and the number of heads)");
  return n / g.size();
}

// ---- column-parallel: this rank's rows of W (its outputs) ----

ColumnParallelLinear::ColumnParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool bias)
    : tp_(tp), local_(rt, prefix, in, split(out, tp, "out_features", prefix), bias), out_(out) {}

std::string ColumnParallelLinear::describe() const {
  return fmt::format("ColumnParallelLinear({} -> {}, rows {}..{} of {})", local_.in_features, out_, tp_.rank() * local_.out_features,
                     (tp_.rank() + 1) * local_.out_features, out_);
}

Tensor ColumnParallelLinear::forward(Runtime& rt, const Tensor& x) { return local_.forward(rt, x); }  // f: identity

Tensor ColumnParallelLinear::backward(Runtime& rt, const Tensor& dout) {
  Tensor dx = local_.backward(rt, dout);        // this rank's term of dx = Σ_r dy_r·W_r
  if (dx.defined()) all_reduce_tensor(rt, tp_, dx);  // f's backward
  return dx;
}

void ColumnParallelLinear::load_slice(const Linear& whole, int parts) {
  const int64_t in = local_.in_features;
  DL_ASSERT(whole.in_features == in && whole.out_features == out_ && out_ % (parts * tp_.size()) == 0, "load_slice: another layer's shape");
  if (!local_.weight.data.data()) return;
  const int64_t block = out_ / parts, rows = block / tp_.size();  // each part's rows, this rank's of them
  const size_t ws = size_t(dtype_size(whole.weight.data.dtype())), ls = size_t(dtype_size(local_.weight.data.dtype()));
  for (int p = 0; p < parts; p++) {
    const int64_t first = p * block + tp_.rank() * rows;  // in the whole layer
    convert(static_cast<const char*>(whole.weight.data.data()) + size_t(first * in) * ws, whole.weight.data.dtype(),
            static_cast<char*>(local_.weight.data.data()) + size_t(p * rows * in) * ls, local_.weight.data.dtype(), rows * in);
    if (local_.has_bias_)
      convert(static_cast<const char*>(whole.bias.data.data()) + size_t(first) * size_t(dtype_size(whole.bias.data.dtype())),
              whole.bias.data.dtype(), static_cast<char*>(local_.bias.data.data()) + size_t(p * rows) * size_t(dtype_size(local_.bias.data.dtype())),
              local_.bias.data.dtype(), rows);
  }
}

// ---- row-parallel: this rank's columns of W (its inputs) ----

RowParallelLinear::RowParallelLinear(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t in, int64_t out, bool has_bias)
    : tp_(tp), local_(rt, prefix, split(in, tp, "in_features", prefix), out, false), in_(in), has_bias_(has_bias) {
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
  Tensor y = local_.forward(rt, x);  // this rank's term of Σ_r x_r·W_rᵀ
  all_reduce_tensor(rt, tp_, y);     // g
  if (has_bias_ && y.data()) {       // the bias once, after the sum
    const int64_t out = local_.out_features, rows = y.numel() / out;
    AsF32 yf(rt, y, AsF32::inout), b(rt, bias.data);
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < out; j++) yf.p[i * out + j] += b.p[j];
    yf.store();
  }
  return y;
}

Tensor RowParallelLinear::backward(Runtime& rt, const Tensor& dout) {
  if (has_bias_) {  // db = Σ_rows dy: dy is whole, so every rank computes the same bias gradient
    const int64_t out = local_.out_features, rows = dout.numel() / out;
    AsF32 db(rt, bias.grad_for_accumulate(), AsF32::inout), dy(rt, dout);
    if (db.p && dy.p)
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < out; j++) db.p[j] += dy.p[i * out + j];
    db.store();
  }
  return local_.backward(rt, dout);  // g's backward is the identity: dx_r = dy·W_r, dW_r = dyᵀ·x_r
}

void RowParallelLinear::load_slice(const Linear& whole) {
  const int64_t out = local_.out_features, cols = local_.in_features, first = tp_.rank() * cols;
  DL_ASSERT(whole.in_features == in_ && whole.out_features == out, "load_slice: another layer's shape");
  if (!local_.weight.data.data()) return;
  const size_t es = size_t(dtype_size(whole.weight.data.dtype())), ls = size_t(dtype_size(local_.weight.data.dtype()));
  for (int64_t i = 0; i < out; i++)  // row i's columns [first, first + cols)
    convert(static_cast<const char*>(whole.weight.data.data()) + size_t(i * in_ + first) * es, whole.weight.data.dtype(),
            static_cast<char*>(local_.weight.data.data()) + size_t(i * cols) * ls, local_.weight.data.dtype(), cols);
  if (has_bias_) convert(whole.bias.data.data(), whole.bias.data.dtype(), bias.data.data(), bias.data.dtype(), out);
}

// ---- attention, heads split ----

ParallelSelfAttention::ParallelSelfAttention(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t C, int64_t n_head)
    : c_attn(rt, tp, prefix + ".c_attn", C, 3 * C), c_proj(rt, tp, prefix + ".c_proj", C, C), C_(C), local_heads_(n_head / tp.size()) {
  if (n_head % tp.size() != 0)
    throw ConfigError(fmt::format("{}: {} heads do not split over {} tensor-parallel ranks", prefix, n_head, tp.size()),
                      "parallel.tp must divide model.n_head: each rank computes whole heads");
}

std::string ParallelSelfAttention::describe() const {
  return fmt::format("ParallelSelfAttention({}, {} of the heads on this rank)", C_, local_heads_);
}

std::vector<Parameter*> ParallelSelfAttention::parameters() {
  auto p = c_attn.parameters();
  for (auto* q : c_proj.parameters()) p.push_back(q);
  return p;
}

void ParallelSelfAttention::load_slice(const CausalSelfAttention& whole) {
  c_attn.load_slice(whole.c_attn, 3);  // this rank's heads of q, of k and of v
  c_proj.load_slice(whole.c_proj);     // the columns those heads' outputs meet
}

Tensor ParallelSelfAttention::forward(Runtime& rt, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t local_C = c_attn.local().out_features / 3;  // C/t: this rank's heads, side by side
  qkv_ = c_attn.forward(rt, x);                               // (B, T, 3C/t)
  att_ = rt.empty({B, local_heads_, T, T}, Category::activations, "attention probabilities (this rank's heads)", rt.dtype);
  Tensor y = rt.empty({B, T, local_C}, Category::activations, "attention output (this rank's heads)", rt.dtype);
  {
    AsF32 yf(rt, y, AsF32::out), att(rt, att_, AsF32::out), qkv(rt, qkv_);
    attention_forward(rt, yf.p, att.p, qkv.p, B, T, local_C, local_heads_);
    yf.store();
    att.store();
  }
  return c_proj.forward(rt, y);  // g: the heads' contributions summed over the group
}

Tensor ParallelSelfAttention::backward(Runtime& rt, const Tensor& dout) {
  const int64_t B = qkv_.size(0), T = qkv_.size(1), local_C = c_attn.local().out_features / 3;
  Tensor dy = c_proj.backward(rt, dout);
  Tensor dqkv = rt.empty({B, T, 3 * local_C}, Category::activations, "grad of qkv (this rank's heads)", rt.dtype);
  {
    AsF32 dq(rt, dqkv, AsF32::out), dyf(rt, dy), qkv(rt, qkv_), att(rt, att_);
    attention_backward(rt, dq.p, dyf.p, qkv.p, att.p, B, T, local_C, local_heads_);
    dq.store();
  }
  qkv_ = att_ = Tensor();
  return c_attn.backward(rt, dqkv);  // f's backward: dx summed over the group
}

}  // namespace distlab
