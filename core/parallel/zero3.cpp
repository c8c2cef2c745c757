#include "core/parallel/zero3.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/parallel/ddp.h"

namespace distlab {

ZeRO3::ZeRO3(ProcessGroup& pg, Model& model, Runtime& rt, ShardedOptions o, std::string name)
    : ShardedStrategy(rt, pg, model, name, o.offload ? Category::host : Category::params, rt.dtype, o.min_params),
      pg_(pg), rt_(rt), o_(o), name_(std::move(name)) {
  broadcast_model(pg, model);  // every rank starts from rank 0's weights, then keeps its part of them
  whole_.assign(size_t(shards_.num_units()), true);
  release_full_params(rt, true);  // each rank takes its part of the whole weights, then frees them
  rt.memory.empty_cache();        // the whole model it was built as goes back to the OS
}

std::string ZeRO3::describe() const {
  std::vector<std::string> how;
  if (!o_.reshard_after_forward) how.push_back("no reshard after forward");
  if (o_.prefetch) how.push_back("prefetch");
  if (o_.offload) how.push_back("cpu offload");
  if (o_.min_params > 0) how.push_back(fmt::format("units wrapped to >= {} parameters", o_.min_params));
  return how.empty() ? name_ : fmt::format("{} ({})", name_, fmt::join(how, ", "));
}

nlohmann::json ZeRO3::report() const {
  const auto& all = shards_.all();
  int64_t padded = 0, part = 0;
  for (const auto& s : all) padded += s.padded, part += s.shard;
  return {{"name", describe()}, {"reshard_after_forward", o_.reshard_after_forward}, {"offload", o_.offload}, {"min_params", o_.min_params}, {"flat_vectors", all.size()}, {"padded_elements", padded}, {"elements_per_rank", part},
          {"all_gathers", gathers_}, {"prefetched", prefetches_},
          {"collectives_per_step", "all_gather per unit before forward and before backward, reduce_scatter per unit after backward"}};
}

void ZeRO3::issue(int unit, const Optimizer* masters) {
  InFlight& f = in_flight_[unit];
  for (FlatShard* s : shards_.of_unit(unit)) {
    f.flat.emplace_back();
    f.part.emplace_back();
    if (o_.offload) rt_.trace.record_copy("offload: parameters to the device", double(s->local.data.nbytes()));
    const Tensor* master = masters ? masters->master(&s->local) : nullptr;  // a save's f32 weights travel in f32
    f.work.push_back(shards_.gather_async(*s, f.flat.back(), f.part.back(), master ? DType::f32 : rt_.dtype, master));
  }
  gathers_++;
}

void ZeRO3::gather(int unit) {
  if (whole_[size_t(unit)]) return;
  if (!in_flight_.count(unit)) issue(unit);
  InFlight f = std::move(in_flight_.at(unit));
  in_flight_.erase(unit);
  size_t i = 0;
  for (FlatShard* s : shards_.of_unit(unit)) {
    f.work[i]->wait();
    for (Parameter* p : s->params) p->data = rt_.empty(p->data.shape(), Category::params, p->name + " (gathered)", rt_.dtype);
    UnitShards::unpack(rt_, *s, f.flat[i].f32());
    i++;
  }
  whole_[size_t(unit)] = true;
}

void ZeRO3::prefetch(const std::vector<int>& order, int unit) {
  if (!o_.prefetch) return;
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end() || it + 1 == order.end()) return;
  const int next = *(it + 1);
  if (whole_[size_t(next)] || in_flight_.count(next)) return;
  issue(next);
  prefetches_++;
}

void ZeRO3::release(int unit) {
  if (auto it = in_flight_.find(unit); it != in_flight_.end()) {  // a prefetch nobody used: let it land, drop it
    for (auto& w : it->second.work) w->wait();
    in_flight_.erase(it);
  }
  if (!whole_[size_t(unit)]) return;
  for (FlatShard* s : shards_.of_unit(unit))
    for (Parameter* p : s->params) p->data.release();  // the shape stays: numel() still answers
  whole_[size_t(unit)] = false;
}

void ZeRO3::release_waiting(int keep_a, int keep_b) {
  std::vector<int> kept;
  for (int u : waiting_) {
    if (u == keep_a || u == keep_b) kept.push_back(u);
    else release(u);
  }
  waiting_ = kept;
}

void ZeRO3::before_forward(int model_unit) {
  const int unit = shards_.group_of(model_unit);  // the flat vector it is in (one per unit unless wrapped together)
  if (recording_fwd_ && (fwd_order_.empty() || fwd_order_.back() != unit)) fwd_order_.push_back(unit);
  release_waiting(unit, -1);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), unit), waiting_.end());  // in use again
  gather(unit);
  prefetch(fwd_order_, unit);
}

// FULL_SHARD / ZeRO-3: freed once the next unit starts. SHARD_GRAD_OP: kept whole until its backward ends.
void ZeRO3::after_forward(int model_unit) {
  if (o_.reshard_after_forward) waiting_.push_back(shards_.group_of(model_unit));
}

void ZeRO3::begin_backward(bool sync) {
  sync_ = sync;
  recording_fwd_ = false;
}

void ZeRO3::before_layer_backward(int model_unit) {
  const int unit = shards_.group_of(model_unit);
  if (recording_bwd_ && (bwd_order_.empty() || bwd_order_.back() != unit)) bwd_order_.push_back(unit);
  int next = -1;  // the unit backward needs after this one stays whole if it still is
  if (auto it = std::find(bwd_order_.begin(), bwd_order_.end(), unit); it != bwd_order_.end() && it + 1 != bwd_order_.end()) next = *(it + 1);
  release_waiting(unit, recording_bwd_ ? -1 : next);
  // from here the unit is freed by its after_layer_backward (GPT's root: at the very end of backward)
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), unit), waiting_.end());
  gather(unit);
  prefetch(bwd_order_, unit);
}

void ZeRO3::after_layer_backward(int model_unit, const std::vector<Parameter*>&) {
  const int unit = shards_.group_of(model_unit);
  if (model_unit != shards_.first_unit_of(unit)) return;  // wrapped together: the group's backward goes on
  // accumulation (no_sync): whole gradients add up locally until the last micro-step, as PyTorch FSDP's
  if (sync_) {
    finish_reduces();  // the unit before this one (in backward): its reduce overlapped this unit's backward
    for (FlatShard* s : shards_.of_unit(unit)) shards_.issue_reduce(*s, o_.offload ? Category::host : Category::grads);
    reducing_.push_back(unit);
  }
  release(unit);
}

void ZeRO3::finish_reduces() {
  shards_.finish_reduces();
  if (o_.offload)  // each reduced part goes to the host
    for (int u : reducing_)
      for (FlatShard* s : shards_.of_unit(u)) rt_.trace.record_copy("offload: gradient part to the host", double(s->local.grad.nbytes()));
  reducing_.clear();
}

void ZeRO3::finish_backward(Runtime&) {
  finish_reduces();
  recording_bwd_ = false;
  for (int u : waiting_) release(u);  // a unit the backward never reached (none in these models)
  waiting_.clear();
}

void ZeRO3::step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) {
  rt.trace.set_on_host(o_.offload);  // offloaded: the host's CPU steps the host's state
  {
    HostKernels host(rt, shards_.parts_on_host());  // a cuda rank's offloaded parts: with the host's kernels, for real
    opt.step(rt, lr, grad_factor);                   // each part; the next forward gathers the new values
  }
  rt.trace.set_on_host(false);
  for (auto& s : shards_.all()) s.local.grad = Tensor();
  release_full_params(rt, false);  // nothing whole may outlive the step: it would be stale
}

// Every unit whole at once (an evaluation's check, a save): the optimizer's f32 masters when it has them.
void ZeRO3::gather_full_params(Runtime&, const Optimizer* masters) {
  for (int u = 0; u < shards_.num_units(); u++) {
    if (whole_[size_t(u)]) continue;
    issue(u, masters);
    InFlight f = std::move(in_flight_.at(u));
    in_flight_.erase(u);
    size_t i = 0;
    for (FlatShard* s : shards_.of_unit(u)) {
      f.work[i]->wait();
      const bool f32 = masters && masters->master(&s->local);
      for (Parameter* p : s->params)
        p->data = rt_.empty(p->data.shape(), Category::params, p->name + " (gathered)", f32 ? DType::f32 : rt_.dtype);
      UnitShards::unpack(rt_, *s, f.flat[i].f32());
      i++;
    }
    whole_[size_t(u)] = true;
  }
}

void ZeRO3::visit_full_params(Runtime&, Model&, const std::function<void(const std::vector<Parameter*>&)>& fn) {
  for (int u = 0; u < shards_.num_units(); u++) {
    const bool was_whole = whole_[size_t(u)];
    gather(u);
    std::vector<Parameter*> params;
    for (FlatShard* s : shards_.of_unit(u)) params.insert(params.end(), s->params.begin(), s->params.end());
    fn(params);
    if (!was_whole) release(u);
  }
}

// keep_changes: the whole weights were changed (--init loaded them): each rank takes its part of them first.
void ZeRO3::release_full_params(Runtime&, bool keep_changes) {
  waiting_.clear();
  for (int u = 0; u < shards_.num_units(); u++) {
    if (keep_changes && whole_[size_t(u)])
      for (FlatShard* s : shards_.of_unit(u)) shards_.load_local(*s);
    release(u);
  }
}

}  // namespace distlab
