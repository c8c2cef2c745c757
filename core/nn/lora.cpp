#include "core/nn/lora.h"

#include <fmt/format.h>

#include <cmath>

#include "core/nn/linear.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/optim.h"
#include "core/ops/cpu/pointwise.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

float LoraSpec::scaling() const {
  return float(use_rslora ? alpha / std::sqrt(double(r)) : alpha / double(r));
}

LoraAdapter::LoraAdapter(Runtime& rt, const std::string& prefix, int64_t in, int64_t out, const LoraSpec& spec, uint64_t dropout_seed,
                         const TpSlice& tp)
    : scaling(spec.scaling()), dropout(float(spec.dropout)), seed_(dropout_seed), tp_(tp) {
  lora_A = make_parameter(rt, prefix + ".lora_A.weight", {spec.r, in});
  lora_B = make_parameter(rt, prefix + ".lora_B.weight", {out, spec.r});
  if (tp.dim == 0) lora_B.split_dim = 0, lora_B.split_parts = tp.parts;  // B's rows are W's: the same blocks, the same share
  if (tp.dim == 1) lora_A.split_dim = 1;                                  // A's columns are W's inputs
  if (tp.dim == 1 && tp.size > 1) seed_ += 0x9E3779B97F4A7C15ULL * uint64_t(tp.rank + 1);  // a split input: this rank's own masks
}

void LoraAdapter::init(Rng& rng) {
  lora_B.data.zero_();
  const int64_t r = lora_A.data.size(0), in = lora_A.data.size(1);
  if (!(tp_.dim == 1 && tp_.size > 1)) {
    init_uniform(lora_A.data, rng, 1.0f / std::sqrt(float(in)));  // kaiming_uniform_(a=√5)
    return;
  }
  if (!lora_A.data.data()) return;  // meta
  // a row-split base: the whole A (r, in·t) drawn as one rank draws it, this rank's columns kept
  const int64_t whole_in = in * tp_.size;
  const float bound = 1.0f / std::sqrt(float(whole_in));
  std::vector<float> whole(size_t(r * whole_in));
  for (float& v : whole) v = rng.uniform(-bound, bound);
  OnHost a(lora_A.data, OnHost::out);
  for (int64_t i = 0; i < r; i++)
    std::copy_n(whole.data() + i * whole_in + tp_.rank * in, in, a.p + i * in);
  a.store();
}

void LoraAdapter::project(Runtime& rt, const Tensor& x, bool training) {
  const int64_t N = x.size(0), in = lora_A.data.size(1), r = lora_A.data.size(0);
  mask_ = Tensor();
  xd_ = x;  // p = 0: dropout is the identity and keeps nothing (x is the base layer's saved input)
  if (training && dropout > 0.0f) {
    xd_ = rt.empty(x.shape(), Category::activations, "LoRA dropout of " + lora_A.name, rt.dtype);
    mask_ = rt.empty(x.shape(), Category::activations, "LoRA dropout mask of " + lora_A.name);  // f32 0 or 1/(1-p)
    AsF32 y(rt, xd_, AsF32::out), xf(rt, x);
    dropout_forward(rt, y.p, mask_.f32(), xf.p, x.numel(), dropout, seed_ * 1000003ULL + calls_++);
    y.store();
  }
  hs_ = rt.empty({N, r}, Category::activations, "LoRA's x·Aᵀ of " + lora_A.name, rt.dtype);
  AsF32 h(rt, hs_, AsF32::out), xf(rt, xd_), a(rt, lora_A.data);
  matmul_forward(rt, h.p, xf.p, a.p, nullptr, N, in, r);  // (N, in) @ (in, r)
  if (h.p) scale(rt, h.p, N * r, scaling);
  h.store();
  if (tp_.dim == 1 && tp_.size > 1) tp_.sum(rt, hs_);  // a row-split base: h = Σ_r s·x_r A_rᵀ
}

void LoraAdapter::forward(Runtime& rt, const Tensor& x, Tensor& y, bool training) {
  const int64_t N = x.size(0), r = lora_A.data.size(0), out = lora_B.data.size(0);
  project(rt, x, training);
  // a row-split base: y is this rank's term of a sum the layer all-reduces next, and h is already whole: one
  // rank adds B's term, so the sum holds it once
  if (tp_.dim == 1 && tp_.size > 1 && tp_.rank != 0) return;
  Tensor z = rt.empty({N, out}, Category::activations, "LoRA's output of " + lora_B.name, rt.dtype);
  {
    AsF32 zf(rt, z, AsF32::out), h(rt, hs_), b(rt, lora_B.data);
    matmul_forward(rt, zf.p, h.p, b.p, nullptr, N, r, out);  // (N, r) @ (r, out)
    zf.store();
  }
  AsF32 yf(rt, y, AsF32::inout), zf(rt, z);
  accumulate(rt, yf.p, zf.p, N * out);  // result + lora_out, as PEFT adds them
  yf.store();
}

void LoraAdapter::keep(Runtime& rt, const Tensor& x) {
  DL_ASSERT(dropout == 0.0f, "LoRA's op-level recompute with dropout (refused at config)");
  project(rt, x, false);
}

void LoraAdapter::backward(Runtime& rt, const Tensor& dy, Tensor& dx) {
  const int64_t N = dy.size(0), in = lora_A.data.size(1), r = lora_A.data.size(0), out = lora_B.data.size(0);
  Tensor dh = rt.empty({N, r}, Category::activations, "grad of LoRA's x·Aᵀ of " + lora_A.name, rt.dtype);
  {  // dB += dyᵀ (s·x Aᵀ); d(x Aᵀ) = s · dy B
    AsF32 dhf(rt, dh, AsF32::out), db(rt, lora_B.grad_for_accumulate(), AsF32::inout);
    AsF32 dyf(rt, dy, AsF32::in, rt.dtype), h(rt, hs_), b(rt, lora_B.data);
    matmul_backward(rt, dhf.p, db.p, nullptr, dyf.p, h.p, b.p, N, r, out);
    if (dhf.p) scale(rt, dhf.p, N * r, scaling);
    dhf.store();
    db.store();
  }
  const bool need_dx = dx.defined();
  Tensor dxd = need_dx ? rt.empty({N, in}, Category::activations, "grad of LoRA's input of " + lora_A.name, rt.dtype) : Tensor();
  if (tp_.dim == 0 && tp_.size > 1) {
    // a column-split base: dh is this rank's term of Σ_r s·dy_r B_r. Its dx_d = dh_r A goes to the layer,
    // whose all-reduce of dx sums it with the others'; A's gradient needs the whole dh.
    if (need_dx) {
      AsF32 dxf(rt, dxd, AsF32::out), dhf(rt, dh), xf(rt, xd_), a(rt, lora_A.data);
      matmul_backward(rt, dxf.p, nullptr, nullptr, dhf.p, xf.p, a.p, N, in, r, true, false);
      dxf.store();
    }
    tp_.sum(rt, dh);
    AsF32 da(rt, lora_A.grad_for_accumulate(), AsF32::inout), dhf(rt, dh), xf(rt, xd_), a(rt, lora_A.data);
    matmul_backward(rt, nullptr, da.p, nullptr, dhf.p, xf.p, a.p, N, in, r, false, true);
    da.store();
  } else {  // dA += d(x Aᵀ)ᵀ x_d; dx_d = d(x Aᵀ) A
    AsF32 dxf(rt, dxd, AsF32::out), da(rt, lora_A.grad_for_accumulate(), AsF32::inout);
    AsF32 dhf(rt, dh), xf(rt, xd_), a(rt, lora_A.data);
    matmul_backward(rt, dxf.p, da.p, nullptr, dhf.p, xf.p, a.p, N, in, r, need_dx);
    dxf.store();
    da.store();
  }
  if (need_dx) {
    AsF32 d(rt, dx, AsF32::inout), g(rt, dxd);
    if (mask_.defined()) dropout_backward(rt, g.p, g.p, mask_.f32(), N * in);
    accumulate(rt, d.p, g.p, N * in);  // the base layer's share of x's gradient plus the adapter's
    d.store();
  }
  xd_ = mask_ = hs_ = Tensor();
}

void LoraAdapter::swap_saved(SavedState& s) {
  s.swap(xd_);
  s.swap(mask_);
  s.swap(hs_);
}

void lora_fold(float* w, const float* A, const float* B, int64_t out, int64_t in, int64_t r, float scale) {
  blas_sgemm(false, false, out, in, r, scale, B, r, A, in, 1.0f, w, in);
}

// ---- the Linears under a layer ----

static std::string linear_module(const Linear& l) {
  const std::string& w = l.weight.name;  // "<module>.weight"
  return w.size() > 7 && w.compare(w.size() - 7, 7, ".weight") == 0 ? w.substr(0, w.size() - 7) : w;
}

void collect_linears(Layer* l, std::vector<std::pair<std::string, Linear*>>& out) {
  if (!l) return;
  if (auto* lin = dynamic_cast<Linear*>(l)) {
    out.push_back({linear_module(*lin), lin});
    return;
  }
  for (Layer* c : l->children()) collect_linears(c, out);
}

std::vector<uint64_t*> lora_streams(const std::vector<Layer*>& layers) {
  std::vector<std::pair<std::string, Linear*>> found;
  for (Layer* l : layers) collect_linears(l, found);
  std::vector<uint64_t*> v;
  for (auto& [name, lin] : found)
    if (lin->lora) v.push_back(lin->lora->rng_calls());
  return v;
}

}  // namespace distlab
