#include "core/parallel/zero1.h"

#include <algorithm>

#include "core/parallel/comm_buffers.h"
#include "core/parallel/ddp.h"
#include "core/parallel/flat_masters.h"
#include "core/util/error.h"

namespace distlab {

// one flat vector per weight-decay group over the whole model: AdamW decays a whole slice or none of it
ZeRO1::ZeRO1(ProcessGroup& pg, Model& model, Runtime& rt, ZeroReduce mode, double bucket_mb)
    : ShardedStrategy(rt, pg, model, "zero1", FlatParams::Wrap::whole_model, Category::optim_state, DType::f32), pg_(pg),
      mode_(mode), bucket_(std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4) / pg.size())) {
  broadcast_model(pg, model);  // every replica starts equal, as DDP's
}

nlohmann::json ZeRO1::report() const {
  nlohmann::json slices = nlohmann::json::array();
  for (const auto& g : flats_.all()) slices.push_back({{"params", g.params.size()}, {"padded", g.padded}, {"slice", g.shard}});
  return {{"name", describe()}, {"groups", slices}, {"collectives_per_step", mode_ == ZeroReduce::all_reduce ? "all_reduce + all_gather per bucket"
                                                                                                      : "reduce_scatter + all_gather per bucket"}};
}

// Bucket by bucket (DeepSpeed's reduce_bucket_size): bucket c holds elements [c·B, (c+1)·B) of every
// rank's slice, so one reduce_scatter of it hands each rank that stretch of its own slice — the layout of
// one big reduce-scatter, without a whole-model f32 copy of the gradient.
void ZeRO1::finish_backward(Runtime& rt) {
  if (!sync_) return;  // accumulation: gradients stay local until the last micro-step (no_sync)
  const int64_t n = pg_.size();
  for (FlatParam& g : flats_.all()) {
    Tensor part = rt.empty({g.shard}, Category::comm_buffers, "zero1 reduced slice");
    for (int64_t c = 0; c < g.shard; c += bucket_) {
      const int64_t len = std::min(bucket_, g.shard - c);
      Tensor bucket = rt.empty({n * len}, Category::comm_buffers, "zero1 gradient bucket");
      for (int64_t r = 0; r < n; r++) pack(rt, g, r * g.shard + c, r * g.shard + c + len, bucket.f32_at(r * len), true, rt.device);
      if (mode_ == ZeroReduce::all_reduce) {  // the naive form: every rank gets the whole average and keeps its stretch
        staged_all_reduce(rt, pg_, bucket.f32(), n * len, ReduceOp::avg, rt.reduce_dtype);
        copy_values(rt, bucket.f32_at(pg_.rank() * len), DType::f32, part.f32_at(c), DType::f32, len);
      } else {
        staged_reduce_scatter(rt, pg_, part.f32_at(c), bucket.f32(), len, ReduceOp::avg, rt.reduce_dtype);
      }
    }
    for (Parameter* p : g.params) p->grad = Tensor();  // reduced: the step reads only the slice
    // the slice of the gradient in the parameters' dtype: the paper's 2 bytes per parameter with bf16
    flats_.keep_grad_part(g, part, Category::grads);
  }
}

void ZeRO1::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  const int64_t n = pg_.size();
  if (!loaded_) {  // the slices start from the parameters (after --init), at the first step
    for (FlatParam& g : flats_.all()) flats_.load_local(g);
    loaded_ = true;
  }
  opt.step(rt, lr, grad_factor);  // this rank's slices only: the optimizer was built on them
  for (FlatParam& g : flats_.all()) {
    g.local.grad = Tensor();
    for (int64_t c = 0; c < g.shard; c += bucket_) {  // the same buckets, gathered
      const int64_t len = std::min(bucket_, g.shard - c);
      Tensor bucket = rt.empty({n * len}, Category::comm_buffers, "zero1 gathered bucket");
      staged_all_gather(rt, pg_, bucket.f32(), g.local.data.f32_at(c), len, rt.dtype);  // 16 bits on the wire: what the parameters hold
      for (int64_t r = 0; r < n; r++) unpack(rt, g, r * g.shard + c, r * g.shard + c + len, bucket.f32_at(r * len), rt.device);
    }
  }
}

// The f32 slices are the master weights: gathered and lent to the parameters for a save, then put back.
void ZeRO1::gather_full_params(Runtime& rt, const Optimizer*) {
  if (loaded_) lend_masters(rt, flats_, set_aside_);  // before the first step the parameters are the truth
}

void ZeRO1::release_full_params(Runtime&, bool keep_changes) {
  restore_params(flats_, set_aside_);
  if (keep_changes) loaded_ = false;
}

}  // namespace distlab
