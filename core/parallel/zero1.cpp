#include "core/parallel/zero1.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel/ddp.h"
#include "core/parallel/staged.h"
#include "core/parallel/unit_shards.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

ZeRO1::ZeRO1(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& mode, double bucket_mb)
    : pg_(pg), rt_(rt), mode_(mode), bucket_(std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4) / pg.size())) {
  if (mode != "reduce_scatter" && mode != "all_reduce")
    throw ConfigError("unknown parallel.zero_reduce '" + mode + "'", "use reduce_scatter (the default) or all_reduce");
  broadcast_model(pg, model);  // every replica starts equal, as DDP's
  // one flat vector per weight-decay group: AdamW decays a whole slice or none of it
  for (bool decay : {true, false}) {
    FlatShard g;
    for (auto* p : model.parameters()) {
      if (p->decay != decay) continue;
      g.params.push_back(p);
      g.offset.push_back(g.numel);
      g.numel += p->data.numel();
    }
    if (g.params.empty()) continue;
    const int64_t n = pg.size();
    g.padded = (g.numel + n - 1) / n * n;
    g.shard = g.padded / n;
    g.local.name = fmt::format("zero1 slice {} of the {} parameters", pg.rank(), decay ? "decayed" : "undecayed");
    g.local.decay = decay;
    g.local.data = rt.zeros({g.shard}, Category::optim_state, g.local.name + " (f32)");
    groups_.push_back(std::move(g));
  }
}

nlohmann::json ZeRO1::report() const {
  nlohmann::json slices = nlohmann::json::array();
  for (const auto& g : groups_) slices.push_back({{"params", g.params.size()}, {"padded", g.padded}, {"slice", g.shard}});
  return {{"name", describe()}, {"groups", slices}, {"collectives_per_step", mode_ == "all_reduce" ? "all_reduce + all_gather per bucket"
                                                                                                      : "reduce_scatter + all_gather per bucket"}};
}

namespace {

// Elements [a, b) of a group's flat vector (positions past its parameters are padding: zeros) into `out`,
// as f32; and back, into the parameters' own dtype. A bucket's worth at a time, instead of the whole flat.
void pack_range(Runtime& rt, const FlatShard& g, int64_t a, int64_t b, float* out, bool grads) {
  if (!out) return;  // the meta device
  zero_values(rt, out, (b - a) * 4);
  for (size_t i = 0; i < g.params.size(); i++) {
    const Parameter& p = *g.params[i];
    const int64_t lo = std::max(a, g.offset[i]), hi = std::min(b, g.offset[i] + p.data.numel());
    if (lo >= hi) continue;
    const Tensor& t = grads ? p.grad : p.data;
    if (t.defined() && t.data())  // an unused parameter (no gradient) stays zero
      copy_values(rt, static_cast<const char*>(t.data()) + (lo - g.offset[i]) * dtype_size(t.dtype()), t.dtype(), out + (lo - a), DType::f32, hi - lo);
  }
}

void unpack_range(Runtime& rt, FlatShard& g, int64_t a, int64_t b, const float* in) {
  if (!in) return;
  for (size_t i = 0; i < g.params.size(); i++) {
    Tensor& d = g.params[i]->data;
    const int64_t lo = std::max(a, g.offset[i]), hi = std::min(b, g.offset[i] + d.numel());
    if (lo < hi) copy_values(rt, in + (lo - a), DType::f32, static_cast<char*>(d.data()) + (lo - g.offset[i]) * dtype_size(d.dtype()), d.dtype(), hi - lo);
  }
}

}  // namespace

// Bucket by bucket (DeepSpeed's reduce_bucket_size): bucket c holds elements [c·B, (c+1)·B) of every
// rank's slice, so one reduce_scatter of it hands each rank that stretch of its own slice — the layout of
// one big reduce-scatter, without a whole-model f32 copy of the gradient.
void ZeRO1::finish_backward(Runtime& rt) {
  if (!sync_) return;  // accumulation: gradients stay local until the last micro-step (no_sync)
  const int64_t n = pg_.size();
  for (auto& g : groups_) {
    Tensor part = rt.empty({g.shard}, Category::comm_buffers, "zero1 reduced slice");
    for (int64_t c = 0; c < g.shard; c += bucket_) {
      const int64_t len = std::min(bucket_, g.shard - c);
      Tensor bucket = rt.empty({n * len}, Category::comm_buffers, "zero1 gradient bucket");
      for (int64_t r = 0; r < n; r++)
        pack_range(rt, g, r * g.shard + c, r * g.shard + c + len, bucket.data() ? bucket.f32() + r * len : nullptr, true);
      if (mode_ == "all_reduce") {  // the naive form: every rank gets the whole average and keeps its stretch
        staged_all_reduce(rt, pg_, bucket.f32(), n * len, ReduceOp::avg, rt.reduce_dtype);
        if (bucket.data()) copy_values(rt, bucket.f32() + pg_.rank() * len, DType::f32, part.f32() + c, DType::f32, len);
      } else {
        staged_reduce_scatter(rt, pg_, part.data() ? part.f32() + c : nullptr, bucket.f32(), len, ReduceOp::avg, rt.reduce_dtype);
      }
    }
    for (Parameter* p : g.params) p->grad = Tensor();  // reduced: the step reads only the slice
    // the slice of the gradient in the parameters' dtype: the paper's 2 bytes per parameter with bf16
    g.local.grad = rt.empty({g.shard}, Category::grads, g.local.name + " gradient", rt.dtype);
    if (part.data()) copy_values(rt, part.f32(), DType::f32, g.local.grad.data(), rt.dtype, g.shard);
  }
}

std::vector<Parameter*> ZeRO1::optimizer_parameters(Model&) {
  std::vector<Parameter*> v;
  for (auto& g : groups_) v.push_back(&g.local);
  return v;
}

// The sum of squares of this rank's slices, summed over ranks (norm_over_ranks: double precision kept).
double ZeRO1::grad_norm(Runtime& rt, Model&) {
  double ss = 0;
  if (!rt.is_meta())
    for (auto& g : groups_) {
      if (!g.local.grad.defined()) continue;
      OnHost x(g.local.grad);  // a GPU's slice comes down: the sum runs in the cpu's order
      for (int64_t i = 0; i < g.shard; i++) ss += double(x.p[i]) * x.p[i];
    }
  return norm_over_ranks(pg_, ss);
}

// A split model's norm: the squares of this rank's slice, each element counted as its parameter counts in
// model_parallel_grad_norm (a whole tensor on TP rank 0 alone, a tied copy never), summed over the
// data-parallel ranks (the slices), then over the TP and PP groups.
double ZeRO1::split_grad_norm(Runtime& rt, Model&, ProcessGroup* tp, ProcessGroup* pp) {
  return split_flats_norm(rt, pg_, groups_, tp, pp);
}

bool ZeRO1::found_inf(Runtime& rt, Model&, ProcessGroup* pg) {
  std::vector<Parameter*> slices;
  for (auto& g : groups_) slices.push_back(&g.local);
  // every rank's slice is a different part: MAX over ranks — over the whole world when the model is split
  // too (pg: every rank of the run), so that the stages and the TP ranks skip the same steps
  return GradScaler::found_inf(rt, slices, pg ? pg : &pg_);
}

void ZeRO1::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  const int64_t n = pg_.size();
  if (!loaded_) {  // the slices start from the parameters (after --init), at the first step
    for (auto& g : groups_) pack_range(rt, g, pg_.rank() * g.shard, (pg_.rank() + 1) * g.shard, g.local.data.data() ? g.local.data.f32() : nullptr, false);
    loaded_ = true;
  }
  opt.step(rt, lr, grad_factor);  // this rank's slices only: the optimizer was built on them
  for (auto& g : groups_) {
    g.local.grad = Tensor();
    for (int64_t c = 0; c < g.shard; c += bucket_) {  // the same buckets, gathered
      const int64_t len = std::min(bucket_, g.shard - c);
      Tensor bucket = rt.empty({n * len}, Category::comm_buffers, "zero1 gathered bucket");
      staged_all_gather(rt, pg_, bucket.f32(), g.local.data.data() ? g.local.data.f32() + c : nullptr, len, rt.dtype);  // 16 bits on the wire: what the parameters hold
      for (int64_t r = 0; r < n; r++)
        unpack_range(rt, g, r * g.shard + c, r * g.shard + c + len, bucket.data() ? bucket.f32() + r * len : nullptr);
    }
  }
}

// The f32 slices are the master weights: gathered and lent to the parameters for a save, then put back.
void ZeRO1::gather_full_params(Runtime& rt, const Optimizer*) {
  if (loaded_) lend_masters(rt, pg_, groups_, set_aside_);  // before the first step the parameters are the truth
}

void ZeRO1::release_full_params(Runtime&, bool keep_changes) {
  restore_params(groups_, set_aside_);
  if (keep_changes) loaded_ = false;
}

}  // namespace distlab
