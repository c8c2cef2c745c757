#include "core/nn/llama.h"

#include <fmt/format.h>

#include "core/ops/cpu/llama.h"
#include "core/ops/cpu/pointwise.h"
#include "core/perf/eager.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

// ---- RMSNorm ----

RMSNorm::RMSNorm(Runtime& rt, const std::string& prefix, int64_t C, float eps) : C_(C), eps_(eps) {
  weight = make_parameter(rt, prefix + ".weight", {C}, false);
}

std::string RMSNorm::describe() const { return fmt::format("RMSNorm({}, eps {})", C_, eps_); }

Tensor RMSNorm::forward(Runtime& rt, const Tensor& x) {
  expect_shape(describe() + " " + weight.name, x, {C_});
  const int64_t N = x.numel() / C_;
  Tensor out = rt.empty(x.shape(), Category::activations, "output of " + weight.name, rt.dtype);
  rstd_ = rt.empty({N}, Category::activations, "RMSNorm rstd");  // f32, as Hugging Face computes it
  if (device_16(rt, {&x, &weight.data})) {  // a device rank reads and writes the 16 bits themselves
    rmsnorm_forward_16(rt, out.data(), rstd_.f32(), x.data(), weight.data.data(), rt.dtype, N, C_, eps_);
  } else {
    AsF32 y(rt, out, AsF32::out), xf(rt, x), w(rt, weight.data);
    rmsnorm_forward(rt, y.p, rstd_.f32(), xf.p, w.p, N, C_, eps_);
    y.store();
  }
  saved_x_ = x;
  // eager PyTorch keeps x.float() (bf16/fp16) or x·rstd (f32) for backward, beside what this kernel keeps
  if (rt.eager_ops & eager_op::rmsnorm) eager_f32_ = rt.empty(x.shape(), Category::activations, "RMSNorm's f32 copy (eager PyTorch keeps it)");
  return out;
}

Tensor RMSNorm::backward(Runtime& rt, const Tensor& dout) {
  const int64_t N = saved_x_.numel() / C_;
  Tensor dx = rt.empty(saved_x_.shape(), Category::activations, "grad of " + weight.name, rt.dtype);
  Tensor gw = grad_or_scratch(rt, weight);
  if (device_16(rt, {&dout, &saved_x_, &weight.data, &gw})) {
    rmsnorm_backward_16(rt, dx.data(), gw.data(), dout.data(), saved_x_.data(), weight.data.data(), rstd_.f32(), rt.dtype, N, C_);
  } else {
    AsF32 d(rt, dx, AsF32::out), dw(rt, gw, AsF32::inout), dy(rt, dout), xf(rt, saved_x_), w(rt, weight.data);
    rmsnorm_backward(rt, d.p, dw.p, dy.p, xf.p, w.p, rstd_.f32(), N, C_);
    d.store();
    dw.store();
  }
  saved_x_ = rstd_ = eager_f32_ = Tensor();
  return dx;
}

// ---- attention ----

namespace {

// t must divide what is split; a split Linear's weight holds rows (split_dim 0) of the whole
int64_t split_of(int64_t n, int tp, const std::string& what, const std::string& prefix) {
  if (n % tp != 0)
    throw ConfigError(fmt::format("{}: {} {} does not split over {} tensor-parallel ranks", prefix, what, n, tp),
                      "parallel.tp must divide model.n_head, model.n_kv_head and the MLP's intermediate size");
  return n / tp;
}

void rows_split(Linear& l, int tp) {
  if (tp > 1) l.weight.split_dim = 0;
}

}  // namespace

LlamaAttention::LlamaAttention(Runtime& rt, const std::string& p, int64_t c, int64_t nh, int64_t nkv, float theta, AttentionCore core, int tp,
                               std::unique_ptr<Layer> o, InputGradSum sum, InputGather gather)
    : q_proj(rt, p + ".q_proj", c, c / tp, false),
      k_proj(rt, p + ".k_proj", c, nkv * (c / std::max<int64_t>(nh, 1)) / tp, false),
      v_proj(rt, p + ".v_proj", c, nkv * (c / std::max<int64_t>(nh, 1)) / tp, false),
      o_proj(o ? std::move(o) : std::make_unique<Linear>(rt, p + ".o_proj", c, c, false)),
      C(c),
      n_head(split_of(nh, tp, "n_head", p)),
      n_kv_head(split_of(nkv, tp, "n_kv_head", p)),
      head_dim(c / std::max<int64_t>(nh, 1)),
      rope_theta(theta),
      core_(core),
      sum_(std::move(sum)),
      gather_(std::move(gather)) {
  if (nh <= 0 || c % nh != 0 || (c / nh) % 2 != 0)
    throw ShapeError(fmt::format("attention {}: n_embd {} over n_head {} is not a whole, even head size", p, c, nh),
                     "choose model.n_head so that n_embd / n_head is even (RoPE turns pairs of it)");
  if (nkv <= 0 || nh % nkv != 0)
    throw ShapeError(fmt::format("attention {}: n_head {} is not a multiple of n_kv_head {}", p, nh, nkv),
                     "each kv head serves a whole group of query heads: model.n_kv_head must divide model.n_head");
  for (Linear* l : {&q_proj, &k_proj, &v_proj}) rows_split(*l, tp);
  core_.set_kv_group(nh / nkv);  // ring attention (context parallel) sends each kv head once
}

std::vector<Parameter*> LlamaAttention::parameters() {
  std::vector<Parameter*> p;
  for (Layer* l : children())
    for (Parameter* q : l->parameters()) p.push_back(q);
  return p;
}

std::string LlamaAttention::describe() const {
  return fmt::format("LlamaAttention({}, heads {}, kv heads {} (this rank's), RoPE θ {}{})", C, n_head, n_kv_head, rope_theta,
                     core_.context() ? fmt::format(", ring attention over {} ranks", core_.context()->size()) : core_.flash() ? ", flash" : "");
}

Tensor LlamaAttention::forward(Runtime& rt, const Tensor& x_in) {
  const Tensor x = gather_ ? gather_(rt, x_in) : x_in;  // sequence parallel: every rank's rows, (B, T, C)
  expect_shape(describe(), x, {-1, C});
  const int64_t B = x.size(0), T = x.size(1), Cq = n_head * head_dim, Ckv = n_kv_head * head_dim;
  Tensor q = q_proj.forward(rt, x), k = k_proj.forward(rt, x), v = v_proj.forward(rt, x);  // (B, T, Cq), (B, T, Ckv) x2
  if (gather_) {  // the rows are kept, not the gathered x: backward gathers it again
    rows_ = x_in;
    for (Linear* l : {&q_proj, &k_proj, &v_proj}) l->release_input();
  }
  // context parallel: the positions of this rank's tokens in the whole sequence, which RoPE turns by
  const std::vector<int32_t> cp_pos = core_.context() ? core_.context()->positions(T) : std::vector<int32_t>();
  const int32_t* pos = cp_pos.empty() ? nullptr : cp_pos.data();
  qkv_ = rt.empty({B, T, 3 * Cq}, Category::activations, "q, k, v (rotated, kv repeated)", rt.dtype);
  if (!pos && device_16(rt, {&q, &k, &v})) {  // q and k turned in place: q is what op-level checkpointing keeps
    rope_repeat_kv_forward_16(rt, qkv_.data(), q.data(), k.data(), v.data(), rt.dtype, B, T, n_head, n_kv_head, head_dim, rope_theta, true);
  } else {
    AsF32 qf(rt, q, AsF32::inout), kf(rt, k, AsF32::inout), vf(rt, v), out(rt, qkv_, AsF32::out);
    rope_apply(rt, qf.p, B, T, n_head, head_dim, Cq, rope_theta, false, pos);
    rope_apply(rt, kf.p, B, T, n_kv_head, head_dim, Ckv, rope_theta, false, pos);
    repeat_kv_forward(rt, out.p, qf.p, kf.p, vf.p, B, T, n_head, n_kv_head, head_dim);
    out.store();
    if (op_) qf.store();  // op-level checkpointing keeps q rotated (in 16 bits, the values qkv_ holds)
  }
  Tensor y = core_.forward(rt, qkv_, n_head, "");  // (B, T, Cq)
  if (op_) {  // what op-level checkpointing keeps (keep_ops)
    q_ = q;
    v_ = v;
    y_ = y;
  }
  return o_proj->forward(rt, y);                  // (B, T, C): the heads' terms summed over the ranks when split
}

void LlamaAttention::keep_ops() {
  SavedState gone;
  gone.begin();
  for (Layer* l : std::initializer_list<Layer*>{&q_proj, &k_proj, &v_proj, o_proj.get()}) l->swap_saved(gone);
  qkv_ = Tensor();
}

Tensor LlamaAttention::recompute(Runtime& rt, const Tensor& x) {
  DL_ASSERT(q_.defined() && v_.defined() && y_.defined(), "LlamaAttention::recompute without an op-level forward");
  const int64_t B = x.size(0), T = x.size(1), Cq = n_head * head_dim, Ckv = n_kv_head * head_dim;
  q_proj.keep_input(rt, x);  // its output was kept: only the input its weight gradient reads
  v_proj.keep_input(rt, x);
  Tensor k = k_proj.forward(rt, x);  // the 2nd matmul, recomputed
  // context parallel: the positions of this rank's tokens in the whole sequence, which RoPE turns by
  const std::vector<int32_t> cp_pos = core_.context() ? core_.context()->positions(T) : std::vector<int32_t>();
  const int32_t* pos = cp_pos.empty() ? nullptr : cp_pos.data();
  qkv_ = rt.empty({B, T, 3 * Cq}, Category::activations, "q, k, v (rotated, kv repeated)", rt.dtype);
  if (!pos && device_16(rt, {&q_, &k, &v_})) {
    rope_repeat_kv_forward_16(rt, qkv_.data(), q_.data(), k.data(), v_.data(), rt.dtype, B, T, n_head, n_kv_head, head_dim, rope_theta, false);
  } else {
    AsF32 qf(rt, q_), kf(rt, k, AsF32::inout), vf(rt, v_), out(rt, qkv_, AsF32::out);
    rope_apply(rt, kf.p, B, T, n_kv_head, head_dim, Ckv, rope_theta, false, pos);  // q_ was rotated in forward
    repeat_kv_forward(rt, out.p, qf.p, kf.p, vf.p, B, T, n_head, n_kv_head, head_dim);
    out.store();
  }
  q_ = v_ = Tensor();
  Tensor a = o_proj->forward(rt, y_);  // the 4th matmul, recomputed: the residual stream needs its output
  y_ = Tensor();
  return a;
}

Tensor LlamaAttention::backward(Runtime& rt, const Tensor& dout) {
  const int64_t B = qkv_.size(0), T = qkv_.size(1), Cq = n_head * head_dim, Ckv = n_kv_head * head_dim;
  Tensor dy = o_proj->backward(rt, dout);
  Tensor dqkv = core_.backward(rt, dy, qkv_, n_head, "");
  qkv_ = q_ = v_ = y_ = Tensor();
  // context parallel: the positions of this rank's tokens in the whole sequence, which RoPE turns by
  const std::vector<int32_t> cp_pos = core_.context() ? core_.context()->positions(T) : std::vector<int32_t>();
  const int32_t* pos = cp_pos.empty() ? nullptr : cp_pos.data();
  Tensor dq = rt.empty({B, T, Cq}, Category::activations, "grad of q", rt.dtype);
  Tensor dk = rt.empty({B, T, Ckv}, Category::activations, "grad of k", rt.dtype);
  Tensor dv = rt.empty({B, T, Ckv}, Category::activations, "grad of v", rt.dtype);
  if (!pos && device_16(rt, {&dqkv})) {
    rope_repeat_kv_backward_16(rt, dq.data(), dk.data(), dv.data(), dqkv.data(), rt.dtype, B, T, n_head, n_kv_head, head_dim, rope_theta);
  } else {
    AsF32 dqf(rt, dq, AsF32::out), dkf(rt, dk, AsF32::out), dvf(rt, dv, AsF32::out), g(rt, dqkv);
    repeat_kv_backward(rt, dqf.p, dkf.p, dvf.p, g.p, B, T, n_head, n_kv_head, head_dim);
    rope_apply(rt, dqf.p, B, T, n_head, head_dim, Cq, rope_theta, true, pos);  // a rotation's backward turns back
    rope_apply(rt, dkf.p, B, T, n_kv_head, head_dim, Ckv, rope_theta, true, pos);
    dqf.store();
    dkf.store();
    dvf.store();
  }
  if (gather_) {
    const Tensor x = gather_(rt, rows_);
    for (Linear* l : {&q_proj, &k_proj, &v_proj}) l->keep_input(rt, x);
    rows_ = Tensor();
  }
  Tensor dx = q_proj.backward(rt, dq);
  Tensor dxk = k_proj.backward(rt, dk), dxv = v_proj.backward(rt, dv);
  {
    AsF32 d(rt, dx, AsF32::inout), a(rt, dxk), b(rt, dxv);  // x fed all three: its gradient is their sum
    accumulate(rt, d.p, a.p, dx.numel());
    accumulate(rt, d.p, b.p, dx.numel());
    d.store();
  }
  if (sum_) sum_(rt, dx);  // and, split, the other ranks' heads' terms too
  return dx;
}

// ---- MLP ----

// h = silu(gate) · up: on a device rank's 16-bit tensors as they are, else through f32 copies
static void swiglu(Runtime& rt, Tensor& h, const Tensor& gate, const Tensor& up) {
  if (device_16(rt, {&gate, &up})) return swiglu_forward_16(rt, h.data(), gate.data(), up.data(), rt.dtype, h.numel());
  AsF32 hf(rt, h, AsF32::out), g(rt, gate), u(rt, up);
  swiglu_forward(rt, hf.p, g.p, u.p, h.numel());
  hf.store();
}

LlamaMLP::LlamaMLP(Runtime& rt, const std::string& p, int64_t C, int64_t I, int tp, std::unique_ptr<Layer> down, InputGradSum sum,
                   InputGather gather)
    : gate_proj(rt, p + ".gate_proj", C, split_of(I, tp, "intermediate_size", p), false),
      up_proj(rt, p + ".up_proj", C, I / tp, false),
      down_proj(down ? std::move(down) : std::make_unique<Linear>(rt, p + ".down_proj", I, C, false)),
      sum_(std::move(sum)),
      gather_(std::move(gather)) {
  rows_split(gate_proj, tp);
  rows_split(up_proj, tp);
}

std::vector<Parameter*> LlamaMLP::parameters() {
  std::vector<Parameter*> p;
  for (Layer* l : children())
    for (Parameter* q : l->parameters()) p.push_back(q);
  return p;
}

std::string LlamaMLP::describe() const {
  return fmt::format("LlamaMLP({} -> {} (this rank's) -> {}, SwiGLU)", gate_proj.in_features, gate_proj.out_features, gate_proj.in_features);
}

Tensor LlamaMLP::forward(Runtime& rt, const Tensor& x_in) {
  const Tensor x = gather_ ? gather_(rt, x_in) : x_in;  // sequence parallel: every rank's rows
  gate_ = gate_proj.forward(rt, x);
  up_ = up_proj.forward(rt, x);
  if (gather_) {
    rows_ = x_in;
    for (Linear* l : {&gate_proj, &up_proj}) l->release_input();
  }
  Tensor h = rt.empty(gate_.shape(), Category::activations, "SwiGLU output", rt.dtype);
  swiglu(rt, h, gate_, up_);
  // eager PyTorch keeps silu(gate) for the product's backward, beside gate and up
  if (rt.eager_ops & eager_op::swiglu) eager_silu_ = rt.empty(gate_.shape(), Category::activations, "silu(gate) (eager PyTorch keeps it)", rt.dtype);
  Tensor out = down_proj->forward(rt, h);
  if (op_) out_ = out;
  return out;
}

void LlamaMLP::keep_ops() {
  SavedState gone;
  gone.begin();
  for (Layer* l : std::initializer_list<Layer*>{&gate_proj, &up_proj, down_proj.get()}) l->swap_saved(gone);
  up_ = eager_silu_ = Tensor();
}

void LlamaMLP::recompute(Runtime& rt, const Tensor& x) {
  DL_ASSERT(gate_.defined() && out_.defined(), "LlamaMLP::recompute without an op-level forward");
  gate_proj.keep_input(rt, x);  // its output, gate_, was kept
  up_ = up_proj.forward(rt, x);  // the 6th matmul, recomputed
  Tensor h = rt.empty(gate_.shape(), Category::activations, "SwiGLU output", rt.dtype);
  swiglu(rt, h, gate_, up_);
  if (rt.eager_ops & eager_op::swiglu) eager_silu_ = rt.empty(gate_.shape(), Category::activations, "silu(gate) (eager PyTorch keeps it)", rt.dtype);
  down_proj->keep_input(rt, h);  // its output was kept (and is not needed): only its input
  out_ = Tensor();
}

Tensor LlamaMLP::backward(Runtime& rt, const Tensor& dout) {
  Tensor dh = down_proj->backward(rt, dout);
  Tensor dg = rt.empty(gate_.shape(), Category::activations, "grad of gate", rt.dtype);
  Tensor du = rt.empty(up_.shape(), Category::activations, "grad of up", rt.dtype);
  if (device_16(rt, {&dh, &gate_, &up_})) {
    swiglu_backward_16(rt, dg.data(), du.data(), dh.data(), gate_.data(), up_.data(), rt.dtype, dg.numel());
  } else {
    AsF32 dgf(rt, dg, AsF32::out), duf(rt, du, AsF32::out), d(rt, dh), g(rt, gate_), u(rt, up_);
    swiglu_backward(rt, dgf.p, duf.p, d.p, g.p, u.p, dg.numel());
    dgf.store();
    duf.store();
  }
  gate_ = up_ = out_ = eager_silu_ = Tensor();
  if (gather_) {
    const Tensor x = gather_(rt, rows_);
    for (Linear* l : {&gate_proj, &up_proj}) l->keep_input(rt, x);
    rows_ = Tensor();
  }
  Tensor dx = gate_proj.backward(rt, dg);
  Tensor dxu = up_proj.backward(rt, du);
  {
    AsF32 d(rt, dx, AsF32::inout), a(rt, dxu);
    accumulate(rt, d.p, a.p, dx.numel());
    d.store();
  }
  if (sum_) sum_(rt, dx);
  return dx;
}

}  // namespace distlab
