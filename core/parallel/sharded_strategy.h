// What ZeRO-1, ZeRO-2 and ZeRO-3 (and FSDP) share once the optimizer state is split: the optimizer steps
// this rank's parts of the flat vectors (flat_param.h), so the gradient norm, the overflow check, zero_grad
// and the checkpoint's slices read those parts, not the model's parameters. Every rank holds different
// state, and writes its own (replicates_optimizer false).
// Read next: zero1.h.
#pragma once
#include <string>

#include "core/parallel/flat_param.h"
#include "core/parallel/flat_slices.h"
#include "core/parallel/strategy.h"

namespace distlab {

class ShardedStrategy : public Strategy {
 public:
  std::vector<Parameter*> optimizer_parameters(Model&) override { return flats_.locals(); }
  double grad_norm(Runtime&, Model&) override { return flats_.grad_norm(); }  // over every rank's parts
  double split_grad_norm(Runtime& rt, Model&, ProcessGroup* tp, ProcessGroup* pp) override {
    return split_flats_norm(rt, flats_.group(), flats_.all(), tp, pp);
  }
  // MAX over every rank's parts: over the whole world (pg) where the model is split too, so that the
  // stages and the TP ranks skip the same steps
  bool found_inf(Runtime&, Model&, ProcessGroup* pg) override { return flats_.found_inf(pg); }
  void zero_grad(Model& model) override {
    model.zero_grad();
    for (auto& f : flats_.all()) f.local.grad = Tensor();  // a skipped step leaves no part behind
  }
  std::vector<std::vector<Slice>> optimizer_slices(Model&) override { return flat_slices(flats_.all(), rank_); }
  bool replicates_optimizer() const override { return false; }

 protected:
  ShardedStrategy(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, FlatParams::Wrap wrap, Category local_cat,
                  DType local_dtype, int64_t min_params = 0, bool shard_frozen = false)
      : flats_(rt, pg, model, who, wrap, local_cat, local_dtype, min_params, shard_frozen), rank_(pg.rank()) {}
  FlatParams flats_;
  int rank_;
};

}  // namespace distlab
