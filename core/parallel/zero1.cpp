#include "core/parallel/zero1.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/parallel/ddp.h"
#include "core/parallel/unit_shards.h"
#include "core/tensor/as_f32.h"
#include "core/util/error.h"

namespace distlab {

ZeRO1::ZeRO1(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& mode) : pg_(pg), rt_(rt), mode_(mode) {
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
  return {{"name", describe()}, {"groups", slices}, {"collectives_per_step", mode_ == "all_reduce" ? "all_reduce + all_gather per group"
                                                                                                      : "reduce_scatter + all_gather per group"}};
}

void ZeRO1::finish_backward(Runtime& rt) {
  if (!sync_) return;  // accumulation: gradients stay local until the last micro-step (no_sync)
  for (auto& g : groups_) {
    Tensor flat = rt.empty({g.padded}, Category::comm_buffers, "zero1 flat gradient");
    UnitShards::pack(g, flat.f32(), true);
    for (Parameter* p : g.params) p->grad = Tensor();  // in the flat vector now; the step reads only the slice
    Tensor part = rt.empty({g.shard}, Category::comm_buffers, "zero1 reduced slice");
    if (mode_ == "all_reduce") {  // the naive form: every rank gets the whole average and keeps its slice
      pg_.all_reduce(flat.f32(), g.padded, ReduceOp::avg, rt.reduce_dtype);
      if (flat.data()) std::memcpy(part.data(), flat.f32() + pg_.rank() * g.shard, size_t(g.shard) * 4);
    } else {
      pg_.reduce_scatter(part.f32(), flat.f32(), g.shard, ReduceOp::avg, rt.reduce_dtype);
    }
    flat = Tensor();
    // the slice of the gradient in the parameters' dtype: the paper's 2 bytes per parameter with bf16
    g.local.grad = rt.empty({g.shard}, Category::grads, g.local.name + " gradient", rt.dtype);
    if (part.data()) convert(part.f32(), DType::f32, g.local.grad.data(), rt.dtype, g.shard);
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
      AsF32 x(rt, g.local.grad);
      for (int64_t i = 0; i < g.shard; i++) ss += double(x.p[i]) * x.p[i];
    }
  return norm_over_ranks(pg_, ss);
}

bool ZeRO1::found_inf(Runtime& rt, Model&, ProcessGroup*) {
  std::vector<Parameter*> slices;
  for (auto& g : groups_) slices.push_back(&g.local);
  return GradScaler::found_inf(rt, slices, &pg_);  // every rank's slice is a different part: MAX over ranks
}

void ZeRO1::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  if (!loaded_) {  // the slices start from the parameters (after --init), at the first step
    for (auto& g : groups_) {
      Tensor flat = rt.empty({g.padded}, Category::comm_buffers, "zero1 flat weights");
      UnitShards::pack(g, flat.f32(), false);
      if (flat.data()) std::memcpy(g.local.data.data(), flat.f32() + pg_.rank() * g.shard, size_t(g.shard) * 4);
    }
    loaded_ = true;
  }
  opt.step(rt, lr, grad_factor);  // this rank's slices only: the optimizer was built on them
  for (auto& g : groups_) {
    g.local.grad = Tensor();
    Tensor flat = rt.empty({g.padded}, Category::comm_buffers, "zero1 gathered weights");
    pg_.all_gather(flat.f32(), g.local.data.f32(), g.shard, rt.dtype);  // 16 bits on the wire: what the parameters hold
    UnitShards::unpack(g, flat.f32());
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
