#include "core/parallel/zero3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/parallel/comm_buffers.h"
#include "core/parallel/ddp.h"

namespace distlab {

ZeRO3::ZeRO3(ProcessGroup& pg, Model& model, Runtime& rt, ShardedOptions o, std::string name)
    : ShardedStrategy(rt, pg, model, name, FlatParams::Wrap::per_unit, Offload{o.offload}.parts(Category::params), rt.dtype, o.min_params,
                      /*shard_frozen=*/true),
      pg_(pg), rt_(rt), o_(o), offload_{o.offload}, name_(std::move(name)) {
  broadcast_model(pg, model);  // every rank starts from rank 0's weights, then keeps its part of them
  whole_.assign(size_t(flats_.num_groups()), true);
  release_full_params(rt, true);  // each rank takes its part of the whole weights, then frees them
  rt.memory.empty_cache();        // the whole model it was built as goes back to the OS
}

std::string ZeRO3::describe() const {
  std::vector<std::string> how;
  if (!o_.reshard_after_forward) how.push_back("no reshard after forward");
  if (o_.prefetch) how.push_back(fmt::format("{}{}", o_.forward_prefetch ? "prefetch" : "backward prefetch",
                                             o_.prefetch_depth > 1 ? fmt::format(" {} units ahead", o_.prefetch_depth) : ""));
  if (o_.offload) how.push_back("cpu offload");
  if (o_.min_params > 0) how.push_back(fmt::format("units wrapped to >= {} parameters", o_.min_params));
  return how.empty() ? name_ : fmt::format("{} ({})", name_, fmt::join(how, ", "));
}

nlohmann::json ZeRO3::report() const {
  const auto& all = flats_.all();
  int64_t padded = 0, part = 0;
  for (const auto& f : all) padded += f.padded, part += f.shard;
  return {{"name", describe()}, {"reshard_after_forward", o_.reshard_after_forward}, {"offload", o_.offload}, {"min_params", o_.min_params}, {"flat_vectors", all.size()}, {"padded_elements", padded}, {"elements_per_rank", part},
          {"all_gathers", gathers_}, {"prefetched", prefetches_},
          {"collectives_per_step", "all_gather per unit before forward and before backward, reduce_scatter per unit after backward"}};
}

// ---- gather and free: a group's parameters whole for its forward or backward, and back to parts after ----

// Every rank's part of each of the group's flat vectors, all-gathered (async): in the parameters' dtype
// (half the bytes in 16 bits), or from the optimizer's f32 masters in f32 for a save.
void ZeRO3::issue(int group, const Optimizer* masters) {
  InFlight& g = in_flight_[group];
  for (FlatParam* f : flats_.of_group_all(group)) {  // LoRA's frozen base too: the unit's forward reads it
    const Tensor* master = masters ? masters->master(&f->local) : nullptr;
    offload_.part_to_device(rt_, *f);
    g.flat.push_back(rt_.empty({f->padded}, Category::comm_buffers, name_ + " gathered group " + std::to_string(group)));
    g.part.emplace_back();
    const float* mine = flats_.part_to_send(*f, g.part.back(), master);
    g.work.push_back(staged_all_gather_async(rt_, pg_, g.flat.back().f32(), mine, f->shard, master ? DType::f32 : rt_.dtype));
    g.f32.push_back(master != nullptr);
  }
  gathers_++;
}

void ZeRO3::gather(int group) {
  if (whole_[size_t(group)]) return;
  if (!in_flight_.count(group)) issue(group);
  InFlight g = std::move(in_flight_.at(group));
  in_flight_.erase(group);
  size_t i = 0;
  for (FlatParam* f : flats_.of_group_all(group)) {
    g.work[i]->wait();
    for (Parameter* p : f->params)
      p->data = rt_.empty(p->data.shape(), Category::params, p->name + " (gathered)", g.f32[i] ? DType::f32 : rt_.dtype);
    unpack(rt_, *f, g.flat[i].f32());
    i++;
  }
  whole_[size_t(group)] = true;
}

void ZeRO3::prefetch(const ExecOrder& order, int group) {
  if (!o_.prefetch) return;
  int next = group;
  for (int k = 0; k < o_.prefetch_depth; k++) {  // the next prefetch_depth groups in the order, oldest first
    next = order.after(next);
    if (next < 0) return;
    if (whole_[size_t(next)] || in_flight_.count(next)) continue;
    issue(next);
    prefetches_++;
  }
}

void ZeRO3::release(int group) {
  if (auto it = in_flight_.find(group); it != in_flight_.end()) {  // a prefetch nobody used: let it land, drop it
    for (auto& w : it->second.work) w->wait();
    in_flight_.erase(it);
  }
  if (!whole_[size_t(group)]) return;
  for (FlatParam* f : flats_.of_group_all(group))
    for (Parameter* p : f->params) p->data.release();  // freed; the shape stays: numel() still answers
  whole_[size_t(group)] = false;
}

void ZeRO3::release_waiting(int keep_a, int keep_b) {
  std::vector<int> kept;
  for (int g : waiting_) {
    if (g == keep_a || g == keep_b) kept.push_back(g);
    else release(g);
  }
  waiting_ = kept;
}

// ---- the model's hooks ----

void ZeRO3::before_forward(int unit) {
  const int group = flats_.group_of(unit);
  fwd_order_.record(group);
  release_waiting(group, -1);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), group), waiting_.end());  // in use again
  gather(group);
  if (o_.forward_prefetch) prefetch(fwd_order_, group);
}

// FULL_SHARD / ZeRO-3: freed once the next unit starts. SHARD_GRAD_OP: kept whole until its backward ends.
void ZeRO3::after_forward(int unit) {
  if (o_.reshard_after_forward) waiting_.push_back(flats_.group_of(unit));
}

void ZeRO3::begin_backward(bool sync) {
  sync_ = sync;
  fwd_order_.freeze();
}

void ZeRO3::before_layer_backward(int unit) {
  const int group = flats_.group_of(unit);
  bwd_order_.record(group);
  // the group backward needs after this one stays whole if it still is (once the order is known)
  release_waiting(group, bwd_order_.recording() ? -1 : bwd_order_.after(group));
  // from here the group is freed by its after_layer_backward (GPT's root: at the very end of backward)
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), group), waiting_.end());
  gather(group);
  prefetch(bwd_order_, group);
}

void ZeRO3::after_layer_backward(int unit, const std::vector<Parameter*>&) {
  const int group = flats_.group_of(unit);
  if (unit != flats_.first_unit_of(group)) return;  // wrapped together: the group's backward goes on
  // accumulation (no_sync): whole gradients add up locally until the last micro-step, as PyTorch FSDP's
  if (sync_) {
    finish_reduces();  // the group before this one (in backward): its reduce overlapped this one's backward
    reduce(group);
  }
  release(group);
}

// ---- reduce: a group's gradients averaged, each rank keeping its part ----

void ZeRO3::reduce(int group) {
  for (FlatParam* f : flats_.of_group(group)) {
    Reduce r{f, rt_.empty({f->padded}, Category::comm_buffers, name_ + " flat gradient of group " + std::to_string(group)),
             rt_.empty({f->shard}, Category::comm_buffers, name_ + " reduced part"), nullptr};
    pack(rt_, *f, r.flat.f32(), true);
    for (Parameter* p : f->params) p->grad = Tensor();  // whole gradients freed: only this rank's part stays
    r.work = staged_reduce_scatter_async(rt_, pg_, r.part.f32(), r.flat.f32(), f->shard, ReduceOp::avg, rt_.reduce_dtype);
    reducing_.push_back(std::move(r));
  }
}

void ZeRO3::finish_reduces() {
  for (Reduce& r : reducing_) {
    r.work->wait();
    r.flat = Tensor();
    flats_.keep_grad_part(*r.f, r.part, offload_.grads());
  }
  for (Reduce& r : reducing_) offload_.gradient_to_host(rt_, *r.f);  // offload: each part to the host
  reducing_.clear();
}

void ZeRO3::finish_backward(Runtime&) {
  finish_reduces();
  bwd_order_.freeze();
  for (int g : waiting_) release(g);  // a group the backward never reached (none in these models)
  waiting_.clear();
}

void ZeRO3::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  offload_.step(rt, opt, flats_, lr, grad_factor);  // each part; the next forward gathers the new values
  for (auto& f : flats_.all()) f.local.grad = Tensor();
  release_full_params(rt, false);  // nothing whole may outlive the step: it would be stale
}

// ---- the whole model at once: a save, --init, the check that replicas agree ----

// Every group whole at once: from the optimizer's f32 masters when it has them (a save).
void ZeRO3::gather_full_params(Runtime&, const Optimizer* masters) {
  for (int g = 0; g < flats_.num_groups(); g++) {
    if (whole_[size_t(g)]) continue;
    issue(g, masters);
    gather(g);
  }
}

void ZeRO3::visit_full_params(Runtime&, Model&, const std::function<void(const std::vector<Parameter*>&)>& fn) {
  for (int g = 0; g < flats_.num_groups(); g++) {
    const bool was_whole = whole_[size_t(g)];
    gather(g);
    std::vector<Parameter*> params;
    for (FlatParam* f : flats_.of_group_all(g)) params.insert(params.end(), f->params.begin(), f->params.end());
    fn(params);
    if (!was_whole) release(g);
  }
}

// keep_changes: the whole weights were changed (--init loaded them): each rank takes its part of them first.
void ZeRO3::release_full_params(Runtime&, bool keep_changes) {
  waiting_.clear();
  for (int g = 0; g < flats_.num_groups(); g++) {
    if (keep_changes && whole_[size_t(g)])
      for (FlatParam* f : flats_.of_group_all(g)) flats_.load_local(*f);
    release(g);
  }
}

}  // namespace distlab
