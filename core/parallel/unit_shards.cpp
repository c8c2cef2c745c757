#include "core/parallel/unit_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel/staged.h"
#include "core/optim/grad_scaler.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

UnitShards::UnitShards(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, Category local_cat, DType local_dtype,
                       int64_t min_params)
    : rt_(rt), pg_(pg), who_(who) {
  const auto units = model.units();
  // the wrap policy: which model units share a flat vector
  std::vector<std::vector<Parameter*>> groups;
  int64_t in_group = 0;
  for (size_t u = 0; u < units.size(); u++) {
    int64_t numel = 0;
    for (Parameter* p : units[u]) numel += p->data.numel();
    const bool start = u <= 1 || min_params <= 0 || in_group >= min_params;
    if (start) {
      groups.emplace_back();
      first_unit_.push_back(int(u));
      in_group = 0;
    }
    groups.back().insert(groups.back().end(), units[u].begin(), units[u].end());
    in_group += numel;
    group_of_.push_back(int(groups.size()) - 1);
  }
  num_units_ = int(groups.size());
  shards_ = flat_layout(groups, pg.size());
  for (FlatShard& s : shards_) {
    s.local.name = fmt::format("{} part {} of unit {} ({})", who, pg.rank(), s.unit, s.local.decay ? "decayed" : "undecayed");
    s.local.data = Tensor::zeros({s.shard}, rt.memory, part_device(local_cat), local_cat, local_dtype, s.local.name);
  }
}

bool UnitShards::parts_on_host() const { return !shards_.empty() && shards_.front().local.data.device() != rt_.device; }

DeviceKind UnitShards::part_device(Category c) const {
  return c == Category::host ? rt_.host_device() : rt_.device;
}

std::vector<FlatShard> flat_layout(const std::vector<std::vector<Parameter*>>& units, int64_t n) {
  std::vector<FlatShard> flats;
  for (size_t u = 0; u < units.size(); u++)
    for (bool decay : {true, false}) {
      FlatShard s;
      s.unit = int(u);
      for (Parameter* p : units[u]) {
        if (p->decay != decay) continue;
        s.params.push_back(p);
        s.offset.push_back(s.numel);
        s.numel += p->data.numel();
      }
      if (s.params.empty()) continue;
      s.padded = (s.numel + n - 1) / n * n;
      s.shard = s.padded / n;
      s.local.decay = decay;
      flats.push_back(std::move(s));
    }
  return flats;
}

std::vector<FlatShard*> UnitShards::of_unit(int unit) {
  std::vector<FlatShard*> v;
  for (auto& s : shards_)
    if (s.unit == unit) v.push_back(&s);
  return v;
}

std::vector<Parameter*> UnitShards::locals() {
  std::vector<Parameter*> v;
  for (auto& s : shards_) v.push_back(&s.local);
  return v;
}

void UnitShards::pack(Runtime& rt, const FlatShard& s, float* flat, bool grads, DeviceKind where) {
  if (!flat) return;  // the meta device
  auto zero = [&](float* p, int64_t n) {
    if (where == rt.device) zero_values(rt, p, n * 4);
    else std::fill(p, p + n, 0.0f);
  };
  for (size_t i = 0; i < s.params.size(); i++) {
    const Parameter& p = *s.params[i];
    const Tensor& t = grads ? p.grad : p.data;
    if (t.defined() && t.data()) copy_across(rt, t.data(), t.dtype(), t.device(), flat + s.offset[i], DType::f32, where, t.numel());
    else zero(flat + s.offset[i], p.data.numel());  // no gradient: it adds zero
  }
  zero(flat + s.numel, s.padded - s.numel);  // the padding never carries a value
}

void UnitShards::unpack(Runtime& rt, FlatShard& s, const float* flat, DeviceKind where) {
  if (!flat) return;
  for (size_t i = 0; i < s.params.size(); i++) {
    Tensor& d = s.params[i]->data;
    copy_across(rt, flat + s.offset[i], DType::f32, where, d.data(), d.dtype(), d.device(), d.numel());
  }
}

void UnitShards::load_local(FlatShard& s) {
  Tensor flat = rt_.empty({s.padded}, Category::comm_buffers, who_ + " flat weights");
  pack(rt_, s, flat.f32(), false);
  if (flat.data())
    copy_across(rt_, flat.f32() + pg_.rank() * s.shard, DType::f32, rt_.device, s.local.data.data(), s.local.data.dtype(), s.local.data.device(),
                s.shard);
}

void UnitShards::reduce_gradients(FlatShard& s, Category part_category) {
  issue_reduce(s, part_category);
  finish_reduces();
}

void UnitShards::issue_reduce(FlatShard& s, Category part_category) {
  Reduce r{&s, part_category, rt_.empty({s.padded}, Category::comm_buffers, who_ + " flat gradient of unit " + std::to_string(s.unit)),
           rt_.empty({s.shard}, Category::comm_buffers, who_ + " reduced part"), nullptr};
  pack(rt_, s, r.flat.f32(), true);
  for (Parameter* p : s.params) p->grad = Tensor();  // whole gradients released: only this rank's part stays
  r.work = staged_reduce_scatter_async(rt_, pg_, r.part.f32(), r.flat.f32(), s.shard, ReduceOp::avg, rt_.reduce_dtype);
  in_flight_.push_back(std::move(r));
}

void UnitShards::finish_reduces() {
  for (Reduce& r : in_flight_) {
    r.work->wait();
    r.flat = Tensor();
    FlatShard& s = *r.s;
    s.local.grad = Tensor::empty({s.shard}, rt_.memory, part_device(r.part_category), r.part_category, rt_.dtype, s.local.name + " gradient");
    if (r.part.data()) copy_across(rt_, r.part.f32(), DType::f32, rt_.device, s.local.grad.data(), rt_.dtype, s.local.grad.device(), s.shard);
  }
  in_flight_.clear();
}

// A part as an all-gather takes it: n f32 values on the rank's device. `src` itself when it is that, else
// a copy in `up` (made here): a 16-bit part widened, a part kept in host memory (CPU offload) brought up.
// With `count_host`, a cpu rank copies its host-category part too: nothing crosses there, but the modeled
// memory then holds the buffer a GPU would need.
static const float* f32_on_device(Runtime& rt, const Tensor& src, int64_t n, Tensor& up, bool count_host, const std::string& what) {
  if (src.dtype() == DType::f32 && src.device() == rt.device && !(count_host && src.category() == Category::host)) return src.f32();
  up = rt.empty({n}, Category::comm_buffers, what);
  if (up.data()) copy_across(rt, src.data(), src.dtype(), src.device(), up.f32(), DType::f32, up.device(), n);
  return up.f32();
}

std::shared_ptr<Work> UnitShards::gather_async(const FlatShard& s, Tensor& flat, Tensor& part, DType wire, const Tensor* master) {
  flat = rt_.empty({s.padded}, Category::comm_buffers, who_ + " gathered unit " + std::to_string(s.unit));
  const bool from_master = master && master->defined();
  const Tensor& src = from_master ? *master : s.local.data;
  const float* mine = f32_on_device(rt_, src, s.shard, part, !from_master, who_ + " part to gather");
  return staged_all_gather_async(rt_, pg_, flat.f32(), mine, s.shard, wire);
}

std::vector<std::vector<Strategy::Slice>> flat_slices(const std::vector<FlatShard>& flats, int rank) {
  std::vector<std::vector<Strategy::Slice>> out;
  for (const FlatShard& s : flats) {
    std::vector<Strategy::Slice> v;
    const int64_t lo = int64_t(rank) * s.shard, hi = lo + s.shard;  // this rank's elements of the flat vector
    for (size_t i = 0; i < s.params.size(); i++) {
      const int64_t a = std::max(lo, s.offset[i]), b = std::min(hi, s.offset[i] + s.params[i]->data.numel());
      if (a < b) v.push_back({s.params[i], a - s.offset[i], a - lo, b - a});
    }
    out.push_back(std::move(v));  // padding only: an empty list
  }
  return out;
}

double norm_over_ranks(ProcessGroup& pg, double ss) {
  std::vector<float> parts(static_cast<size_t>(2 * pg.size()));
  const float mine[2] = {float(ss), float(ss - double(float(ss)))};
  pg.all_gather(parts.data(), mine, 2);
  double total = 0;
  for (int r = 0; r < pg.size(); r++) total += double(parts[size_t(2 * r)]) + double(parts[size_t(2 * r + 1)]);
  return std::sqrt(total);
}

double UnitShards::grad_norm() {
  double ss = 0;
  if (!rt_.is_meta())
    for (auto& s : shards_) {
      if (!s.local.grad.defined()) continue;
      OnHost g(s.local.grad);  // a GPU's part comes down: the sum runs in the cpu's order
      for (int64_t i = 0; i < s.shard; i++) ss += double(g.p[i]) * g.p[i];
    }
  return norm_over_ranks(pg_, ss);
}

void lend_masters(Runtime& rt, ProcessGroup& pg, std::vector<FlatShard>& flats, std::vector<Tensor>& set_aside) {
  set_aside.clear();
  for (auto& s : flats) {
    Tensor flat = rt.empty({s.padded}, Category::comm_buffers, "gathered f32 masters"), up;
    const float* mine = f32_on_device(rt, s.local.data, s.shard, up, false, "f32 master part to gather");
    staged_all_gather(rt, pg, flat.f32(), mine, s.shard, DType::f32);  // in f32: the masters, unrounded
    for (size_t i = 0; i < s.params.size(); i++) {
      Parameter& p = *s.params[i];
      set_aside.push_back(p.data);
      p.data = rt.empty(p.data.shape(), Category::params, p.name + " (gathered f32 master)");
      if (flat.data()) copy_values(rt, flat.f32() + s.offset[i], DType::f32, p.data.data(), DType::f32, p.data.numel());
    }
  }
}

void restore_params(std::vector<FlatShard>& flats, std::vector<Tensor>& set_aside) {
  size_t k = 0;
  for (auto& s : flats)
    for (Parameter* p : s.params)
      if (k < set_aside.size()) p->data = set_aside[k++];
  set_aside.clear();
}

bool UnitShards::found_inf(ProcessGroup* over) {
  HostKernels host(rt_, parts_on_host());  // an offloaded part's gradient is checked where it is
  return GradScaler::found_inf(rt_, locals(), over ? over : &pg_);  // every rank's parts differ: MAX over ranks
}

double split_flats_norm(Runtime& rt, ProcessGroup& dp, const std::vector<FlatShard>& flats, ProcessGroup* tp, ProcessGroup* pp) {
  const bool split_tp = tp && tp->size() > 1, tp_lead = !tp || tp->rank() == 0;
  double ss = 0;
  if (!rt.is_meta())
    for (const FlatShard& g : flats) {
      if (!g.local.grad.defined()) continue;
      OnHost x(g.local.grad);
      const int64_t base = dp.rank() * g.shard;
      for (size_t i = 0; i < g.params.size(); i++) {
        const Parameter& p = *g.params[i];
        if (!p.tied.empty() || !((p.split_dim >= 0 && split_tp) || tp_lead)) continue;
        const int64_t end = i + 1 < g.params.size() ? g.offset[i + 1] : g.numel;  // (ZeRO-3 frees p.data between uses)
        const int64_t lo = std::max(base, g.offset[i]), hi = std::min(base + g.shard, end);
        for (int64_t e = lo; e < hi; e++) ss += double(x.p[e - base]) * x.p[e - base];
      }
    }
  const double n = norm_over_ranks(dp, ss);
  float total = float(n * n);
  for (ProcessGroup* g : {tp, pp}) {
    if (!g || g->size() == 1) continue;
    g->all_reduce(rt.is_meta() ? nullptr : &total, 1);
  }
  return std::sqrt(double(total));
}

}  // namespace distlab
