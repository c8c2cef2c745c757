#include "core/parallel/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

// ---- the vocabulary split: embedding and cross-entropy ----

VocabParallelEmbedding::VocabParallelEmbedding(Runtime& rt, ProcessGroup& tp, const std::string& prefix, int64_t v, int64_t b, int64_t c)
    : vocab(v), block(b), C(c), first(tp.rank() * split(v, tp, "the vocabulary", prefix + "wte")), tp_(tp) {
  wte = make_parameter(rt, prefix + "wte.weight", {v / tp.size(), c});
  wpe = make_parameter(rt, prefix + "wpe.weight", {b, c});
}

void VocabParallelEmbedding::load_slice(const Embedding& whole) {
  if (!wte.data.data()) return;
  const size_t ws = size_t(dtype_size(whole.wte.data.dtype()));
  convert(static_cast<const char*>(whole.wte.data.data()) + size_t(first * C) * ws, whole.wte.data.dtype(), wte.data.data(), wte.data.dtype(),
          wte.data.numel());
  convert(whole.wpe.data.data(), whole.wpe.data.dtype(), wpe.data.data(), wpe.data.dtype(), wpe.data.numel());
}

Tensor VocabParallelEmbedding::forward(Runtime& rt, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  if (T > block || int64_t(tokens.size()) != B * T)
    throw ShapeError(fmt::format("vocab-parallel embedding: {} tokens for a batch of {} x {} (block size {})", tokens.size(), B, T, block));
  const int64_t rows = wte.data.size(0);
  Tensor out = rt.empty({B, T, C}, Category::activations, "output of embedding (vocab-parallel)", rt.dtype);
  Tensor sum = rt.empty({B, T, C}, Category::comm_buffers, "embedding rows to all-reduce", DType::f32);
  if (out.data()) {
    AsF32 e(rt, wte.data), p(rt, wpe.data), o(rt, out, AsF32::out);
    float* s = sum.f32();
    for (int64_t i = 0; i < B * T; i++) {
      const int64_t t = tokens[size_t(i)];
      if (t < 0 || t >= vocab) throw DataError(fmt::format("token id {} is outside the vocabulary of {}", t, vocab));
      const bool mine = t >= first && t < first + rows;
      for (int64_t c = 0; c < C; c++) s[i * C + c] = mine ? e.p[(t - first) * C + c] : 0.0f;
    }
    tp_.all_reduce(s, B * T * C);  // exactly one rank's row, plus zeros: the row itself
    for (int64_t i = 0; i < B * T; i++)
      for (int64_t c = 0; c < C; c++) o.p[i * C + c] = s[i * C + c] + p.p[(i % T) * C + c];
    o.store();
  } else {
    tp_.all_reduce(nullptr, B * T * C);
  }
  saved_tokens_ = tokens;
  B_ = B;
  T_ = T;
  return out;
}

void VocabParallelEmbedding::backward(Runtime& rt, const Tensor& dout) {
  const int64_t rows = wte.data.size(0);
  AsF32 de(rt, wte.grad_for_accumulate(), AsF32::inout), dp(rt, wpe.grad_for_accumulate(), AsF32::inout), dy(rt, dout);
  if (de.p && dp.p && dy.p)
    for (int64_t i = 0; i < B_ * T_; i++) {  // in the whole embedding's order: the same sums, row by row
      const int64_t t = saved_tokens_[size_t(i)];
      for (int64_t c = 0; c < C; c++) {
        if (t >= first && t < first + rows) de.p[(t - first) * C + c] += dy.p[i * C + c];
        dp.p[(i % T_) * C + c] += dy.p[i * C + c];
      }
    }
  de.store();
  dp.store();
  saved_tokens_.clear();
}

double VocabParallelCrossEntropy::forward(Runtime& rt, const Tensor& logits, const std::vector<int32_t>& targets, int64_t first) {
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  if (int64_t(targets.size()) != N)
    throw ShapeError(fmt::format("vocab-parallel cross-entropy: {} targets for {} rows of logits {}", targets.size(), N, shape_str(logits.shape())));
  probs_ = rt.empty({N, V}, Category::activations, "softmax probabilities (this rank's columns)");
  targets_ = targets;
  first_ = first;
  logits_dtype_ = logits.dtype();
  std::vector<float> mx(static_cast<size_t>(N)), sum(static_cast<size_t>(N)), zt(static_cast<size_t>(N), 0.0f);
  if (!logits.data()) {  // meta: the three all-reduces, traced
    for (int k = 0; k < 3; k++) tp_.all_reduce(nullptr, N, k == 0 ? ReduceOp::max : ReduceOp::sum);
    return 0.0;
  }
  AsF32 z(rt, logits);
  float* p = probs_.f32();
  for (int64_t n = 0; n < N; n++) {
    float m = z.p[n * V];
    for (int64_t v = 1; v < V; v++) m = std::max(m, z.p[n * V + v]);
    mx[size_t(n)] = m;
  }
  tp_.all_reduce(mx.data(), N, ReduceOp::max);
  for (int64_t n = 0; n < N; n++) {
    double s = 0;
    for (int64_t v = 0; v < V; v++) {
      p[n * V + v] = std::exp(z.p[n * V + v] - mx[size_t(n)]);
      s += p[n * V + v];
    }
    sum[size_t(n)] = float(s);
    const int32_t t = targets[size_t(n)];
    if (t >= first && t < first + V) zt[size_t(n)] = z.p[n * V + (t - first)];
  }
  tp_.all_reduce(sum.data(), N);
  tp_.all_reduce(zt.data(), N);
  double total = 0;
  counted_ = 0;
  for (int64_t n = 0; n < N; n++) {
    const float inv = 1.0f / sum[size_t(n)];
    for (int64_t v = 0; v < V; v++) p[n * V + v] *= inv;
    if (targets[size_t(n)] < 0) continue;
    total += -(double(zt[size_t(n)]) - mx[size_t(n)] - std::log(double(sum[size_t(n)])));
    counted_++;
  }
  return counted_ ? total / double(counted_) : 0.0;
}

Tensor VocabParallelCrossEntropy::backward(Runtime& rt, float scale) {
  const int64_t N = probs_.size(0), V = probs_.size(1);
  Tensor d = rt.empty({N, V}, Category::activations, "grad of logits (this rank's columns)", logits_dtype_);
  AsF32 df(rt, d, AsF32::out);
  if (df.p) {
    const float f = scale / float(std::max<int64_t>(counted_, 1));
    const float* p = probs_.f32();
    for (int64_t n = 0; n < N; n++) {
      const int32_t t = targets_[size_t(n)];
      for (int64_t v = 0; v < V; v++) df.p[n * V + v] = t < 0 ? 0.0f : (p[n * V + v] - (t - first_ == v ? 1.0f : 0.0f)) * f;
    }
  }
  df.store();
  probs_ = Tensor();
  return d;
}

}  // namespace distlab
