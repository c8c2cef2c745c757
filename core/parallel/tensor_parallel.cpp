#include "core/parallel/tensor_parallel.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

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

void ColumnParallelLinear::load_slice(const Linear& whole) {
  const int64_t rows = local_.out_features, in = local_.in_features, first = tp_.rank() * rows;
  DL_ASSERT(whole.in_features == in && whole.out_features == out_, "load_slice: another layer's shape");
  if (!local_.weight.data.data()) return;
  convert(static_cast<const char*>(whole.weight.data.data()) + first * in * dtype_size(whole.weight.data.dtype()), whole.weight.data.dtype(),
          local_.weight.data.data(), local_.weight.data.dtype(), rows * in);
  if (local_.has_bias_)
    convert(static_cast<const char*>(whole.bias.data.data()) + first * dtype_size(whole.bias.data.dtype()), whole.bias.data.dtype(),
            local_.bias.data.data(), local_.bias.data.dtype(), rows);
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

}  // namespace distlab
