#include "core/parallel/zero2.h"

#include "core/parallel/comm_buffers.h"
#include "core/parallel/ddp.h"
#include "core/parallel/flat_masters.h"

namespace distlab {

ZeRO2::ZeRO2(ProcessGroup& pg, Model& model, Runtime& rt, bool offload)
    : ShardedStrategy(rt, pg, model, "zero2", FlatParams::Wrap::per_unit, Offload{offload}.optimizer_state(), DType::f32), pg_(pg),
      rt_(rt), offload_{offload} {
  broadcast_model(pg, model);  // every replica starts equal, as DDP's; the parts are taken at the first step
}

nlohmann::json ZeRO2::report() const {
  const auto& all = flats_.all();
  int64_t padded = 0, part = 0;
  for (const auto& f : all) padded += f.padded, part += f.shard;
  return {{"name", describe()}, {"offload", offload_.on}, {"flat_vectors", all.size()}, {"padded_elements", padded}, {"elements_per_rank", part},
          {"collectives_per_step", "reduce_scatter per unit during backward + all_gather per unit after the step"}};
}

// A unit's gradients are complete: reduce-scatter them (async, overlapping the next unit's backward) and
// release the whole gradients at once.
void ZeRO2::after_layer_backward(int unit, const std::vector<Parameter*>&) {
  if (!sync_) return;  // accumulation: whole gradients stay local until the last micro-step (no_sync)
  finish_reduces();    // the unit before this one (in backward), whose reduce overlapped this unit's backward
  for (FlatParam* f : flats_.of_group(unit)) {
    Reduce r{f, rt_.empty({f->padded}, Category::comm_buffers, "zero2 flat gradient of unit " + std::to_string(unit)),
             rt_.empty({f->shard}, Category::comm_buffers, "zero2 reduced part"), nullptr};
    pack(rt_, *f, r.flat.f32(), true);
    for (Parameter* p : f->params) p->grad = Tensor();  // whole gradients freed: only this rank's part stays
    r.work = staged_reduce_scatter_async(rt_, pg_, r.part.f32(), r.flat.f32(), f->shard, ReduceOp::avg, rt_.reduce_dtype);
    reducing_.push_back(std::move(r));
  }
}

void ZeRO2::finish_reduces() {
  for (Reduce& r : reducing_) {
    r.work->wait();
    r.flat = Tensor();
    flats_.keep_grad_part(*r.f, r.part, offload_.grads());
  }
  for (Reduce& r : reducing_) offload_.gradient_to_host(rt_, *r.f);  // offload: each part to the host, where the step runs
  reducing_.clear();
}

void ZeRO2::finish_backward(Runtime&) { finish_reduces(); }

// The optimizer steps this rank's f32 parts; every rank's updated parts are all-gathered into the
// parameters, unit by unit.
void ZeRO2::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  if (!loaded_) {  // the f32 parts start from the parameters (after --init), at the first step
    for (FlatParam& f : flats_.all()) flats_.load_local(f);
    loaded_ = true;
  }
  offload_.step(rt, opt, flats_, lr, grad_factor);
  for (FlatParam& f : flats_.all()) {
    f.local.grad = Tensor();
    offload_.updated_part_to_device(rt, f);  // in the parameters' dtype, back to the device for the all-gather
    Tensor flat = rt.empty({f.padded}, Category::comm_buffers, "zero2 gathered unit " + std::to_string(f.group)), up;
    staged_all_gather(rt, pg_, flat.f32(), flats_.part_to_send(f, up), f.shard, rt.dtype);  // 16 bits on the wire in 16-bit runs
    unpack(rt, f, flat.f32());
  }
}

// The f32 parts are the master weights: lend them, whole, to the parameters (for a save), and put the
// parameters' own (16-bit) data back afterwards.
void ZeRO2::gather_full_params(Runtime& rt, const Optimizer*) {
  if (loaded_) lend_masters(rt, flats_, set_aside_);  // before the first step the parameters are the truth
}

void ZeRO2::release_full_params(Runtime&, bool keep_changes) {
  restore_params(flats_, set_aside_);
  if (keep_changes) loaded_ = false;  // the parts are taken from the parameters again at the next step
}

}  // namespace distlab
