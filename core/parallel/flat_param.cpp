#include "core/parallel/flat_param.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/ops/cpu/optim.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/reduce.h"
#include "core/tensor/as_f32.h"
#include "core/parallel/comm_buffers.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

std::vector<FlatParam> flat_layout(const std::vector<std::vector<Parameter*>>& groups, int64_t n) {
  std::vector<FlatParam> flats;
  for (size_t g = 0; g < groups.size(); g++)
    for (bool decay : {true, false}) {
      FlatParam f;
      f.group = int(g);
      for (Parameter* p : groups[g]) {
        if (p->decay != decay) continue;
        f.params.push_back(p);
        f.offset.push_back(f.numel);
        f.numel += p->data.numel();
      }
      if (f.params.empty()) continue;
      f.padded = (f.numel + n - 1) / n * n;
      f.shard = f.padded / n;
      f.local.decay = decay;
      flats.push_back(std::move(f));
    }
  return flats;
}

// zero n floats at p, on `where`
static void zero_on(Runtime& rt, float* p, int64_t n, DeviceKind where) {
  if (!p || n <= 0) return;
  if (where == rt.device) zero_values(rt, p, n * 4);
  else std::fill(p, p + n, 0.0f);
}

void pack(Runtime& rt, const FlatParam& f, int64_t a, int64_t b, float* out, bool grads, DeviceKind where) {
  if (!out) return;  // the meta device
  for (size_t i = 0; i < f.params.size(); i++) {
    const Parameter& p = *f.params[i];
    const int64_t lo = std::max(a, f.offset[i]), hi = std::min(b, f.offset[i] + p.data.numel());
    if (lo >= hi) continue;
    const Tensor& t = grads ? p.grad : p.data;
    if (t.defined() && t.data())
      copy_across(rt, static_cast<const char*>(t.data()) + (lo - f.offset[i]) * dtype_size(t.dtype()), t.dtype(), t.device(), out + (lo - a),
                  DType::f32, where, hi - lo);
    else zero_on(rt, out + (lo - a), hi - lo, where);  // no gradient (an unused parameter): it adds zero
  }
  const int64_t pad = std::max(a, f.numel);
  zero_on(rt, out + (pad - a), b - pad, where);  // the padding never carries a value
}

void unpack(Runtime& rt, FlatParam& f, int64_t a, int64_t b, const float* in, DeviceKind where) {
  if (!in) return;
  for (size_t i = 0; i < f.params.size(); i++) {
    Tensor& d = f.params[i]->data;
    const int64_t lo = std::max(a, f.offset[i]), hi = std::min(b, f.offset[i] + d.numel());
    if (lo < hi)
      copy_across(rt, in + (lo - a), DType::f32, where, static_cast<char*>(d.data()) + (lo - f.offset[i]) * dtype_size(d.dtype()), d.dtype(),
                  d.device(), hi - lo);
  }
}

FlatParams::FlatParams(Runtime& rt, ProcessGroup& pg, Model& model, const std::string& who, Wrap wrap, Category local_cat, DType local_dtype,
                       int64_t min_params, bool shard_frozen)
    : rt_(rt), pg_(pg), who_(who) {
  std::vector<std::vector<Parameter*>> groups, frozen_groups;
  if (wrap == Wrap::whole_model) {
    groups.push_back(trainable(model.parameters()));  // in the model's order: ZeRO-1's one vector per decay group
    first_unit_.push_back(0);
    group_of_.assign(model.units().size(), 0);
  } else {
    const auto units = model.units();
    int64_t in_group = 0;
    for (size_t u = 0; u < units.size(); u++) {
      int64_t numel = 0;
      const std::vector<Parameter*> mine = trainable(units[u]);  // frozen ones stay whole on every rank, unless shard_frozen
      for (Parameter* p : mine) numel += p->data.numel();
      if (u <= 1 || min_params <= 0 || in_group >= min_params) {  // a new group starts
        groups.emplace_back();
        frozen_groups.emplace_back();
        first_unit_.push_back(int(u));
        in_group = 0;
      }
      groups.back().insert(groups.back().end(), mine.begin(), mine.end());
      for (Parameter* p : units[u])
        if (!p->requires_grad && shard_frozen) {
          DL_ASSERT(!p->quant, "a 4-bit weight in a sharded flat vector: " + p->name);
          frozen_groups.back().push_back(p);
        }
      in_group += numel;
      group_of_.push_back(int(groups.size()) - 1);
    }
  }
  flats_ = flat_layout(groups, pg.size());
  frozen_ = flat_layout(frozen_groups, pg.size());
  const DeviceKind where = local_cat == Category::host ? rt.host_device() : rt.device;
  for (FlatParam& f : flats_) {
    f.local.name = fmt::format("{} part {} of group {} ({})", who, pg.rank(), f.group, f.local.decay ? "decayed" : "undecayed");
    f.local.data = Tensor::zeros({f.shard}, rt.memory, where, local_cat, local_dtype, f.local.name);
  }
  for (FlatParam& f : frozen_) {  // the frozen base's part: kept as the weights are (ZeRO-3's params), never stepped
    f.local.name = fmt::format("{} part {} of group {} (frozen)", who, pg.rank(), f.group);
    f.local.requires_grad = false;
    f.local.data = Tensor::zeros({f.shard}, rt.memory, where, local_cat, local_dtype, f.local.name);
  }
}

bool FlatParams::parts_on_host() const { return !flats_.empty() && flats_.front().local.data.device() != rt_.device; }

std::vector<FlatParam*> FlatParams::of_group(int group) {
  std::vector<FlatParam*> v;
  for (auto& f : flats_)
    if (f.group == group) v.push_back(&f);
  return v;
}

std::vector<FlatParam*> FlatParams::of_group_all(int group) {
  std::vector<FlatParam*> v = of_group(group);
  for (auto& f : frozen_)
    if (f.group == group) v.push_back(&f);
  return v;
}

std::vector<Parameter*> FlatParams::locals() {
  std::vector<Parameter*> v;
  for (auto& f : flats_) v.push_back(&f.local);
  return v;
}

void FlatParams::load_local(FlatParam& f) {
  const int64_t a = pg_.rank() * f.shard;
  Tensor& l = f.local.data;
  if (l.dtype() == DType::f32) return pack(rt_, f, a, a + f.shard, l.f32(), false, l.device());
  Tensor part = rt_.empty({f.shard}, Category::comm_buffers, who_ + " part of the weights");  // 16 bits: through f32
  pack(rt_, f, a, a + f.shard, part.f32(), false, rt_.device);
  copy_across(rt_, part.data(), DType::f32, rt_.device, l.data(), l.dtype(), l.device(), f.shard);
}

void FlatParams::keep_grad_part(FlatParam& f, const Tensor& part, Category cat) {
  const DeviceKind where = cat == Category::host ? rt_.host_device() : rt_.device;
  f.local.grad = Tensor::empty({f.shard}, rt_.memory, where, cat, rt_.dtype, f.local.name + " gradient");
  copy_across(rt_, part.data(), DType::f32, rt_.device, f.local.grad.data(), rt_.dtype, where, f.shard);
}

// With a part in host memory on a cpu rank (CPU offload's category) the copy is made too: nothing crosses
// there, but the modeled memory then holds the buffer a GPU would need.
const float* FlatParams::part_to_send(const FlatParam& f, Tensor& up, const Tensor* master) {
  const bool from_master = master && master->defined();
  const Tensor& src = from_master ? *master : f.local.data;
  const bool count_host = !from_master && src.category() == Category::host;
  if (src.dtype() == DType::f32 && src.device() == rt_.device && !count_host) return src.f32();
  up = rt_.empty({f.shard}, Category::comm_buffers, who_ + " part to gather");
  copy_across(rt_, src.data(), src.dtype(), src.device(), up.data(), DType::f32, up.device(), f.shard);
  return up.f32();
}

double norm_over_ranks(ProcessGroup& pg, double ss) {
  std::vector<float> parts(static_cast<size_t>(2 * pg.size()));
  const float mine[2] = {float(ss), float(ss - double(float(ss)))};
  pg.all_gather(parts.data(), mine, 2);
  double total = 0;
  for (int r = 0; r < pg.size(); r++) total += double(parts[size_t(2 * r)]) + double(parts[size_t(2 * r + 1)]);
  return std::sqrt(total);
}

double FlatParams::grad_norm() {
  double ss = 0;
  if (!rt_.is_meta()) {
    HostKernels host(rt_, parts_on_host());  // an offloaded part's gradient is summed where it is
    // each part's squares where the part is, into a slot of its own, read back at once (core/optim/reduce.h):
    // one wait, and no copy of the gradients to the host
    DeviceScalars sums(rt_, int64_t(flats_.size()), "the gradient norm's sums");
    for (size_t i = 0; i < flats_.size(); i++) {
      if (!flats_[i].local.grad.defined()) continue;
      AsF32 g(rt_, flats_[i].local.grad);
      sum_squares_into(rt_, g.p, flats_[i].shard, sums.sum(int64_t(i)));
    }
    ss = sums.total();  // the parts in order
  }
  return norm_over_ranks(pg_, ss);
}

bool FlatParams::found_inf(ProcessGroup* over) {
  HostKernels host(rt_, parts_on_host());  // an offloaded part's gradient is checked where it is
  return GradScaler::found_inf(rt_, locals(), over ? over : &pg_);  // every rank's parts differ: MAX over ranks
}

double split_flats_norm(Runtime& rt, ProcessGroup& dp, const std::vector<FlatParam>& flats, ProcessGroup* tp, ProcessGroup* pp) {
  const bool split_tp = tp && tp->size() > 1, tp_lead = !tp || tp->rank() == 0;
  double ss = 0;
  if (!rt.is_meta()) {
    // The stretch of each counted parameter inside this rank's part of each flat gradient: its squares
    // summed where the part is, a slot each, read back at once (core/optim/reduce.h)
    struct Stretch {
      size_t flat;
      int64_t from, n;  // in the part
    };
    std::vector<Stretch> counted;
    bool on_host = false;  // CPU offload on a cuda rank: the parts' gradients are host memory
    for (size_t f = 0; f < flats.size(); f++) {
      const FlatParam& g = flats[f];
      if (!g.local.grad.defined()) continue;
      on_host = on_host || g.local.grad.device() != rt.device;
      const int64_t base = dp.rank() * g.shard;
      for (size_t i = 0; i < g.params.size(); i++) {
        const Parameter& p = *g.params[i];
        if (!p.tied.empty() || !((p.split_dim >= 0 && split_tp) || tp_lead)) continue;
        const int64_t end = i + 1 < g.params.size() ? g.offset[i + 1] : g.numel;  // (ZeRO-3 frees p.data between uses)
        const int64_t lo = std::max(base, g.offset[i]), hi = std::min(base + g.shard, end);
        if (hi > lo) counted.push_back({f, lo - base, hi - lo});
      }
    }
    HostKernels host(rt, on_host);
    DeviceScalars sums(rt, int64_t(counted.size()), "the gradient norm's sums");
    for (size_t k = 0; k < counted.size();) {
      AsF32 x(rt, flats[counted[k].flat].local.grad);
      for (const size_t f = counted[k].flat; k < counted.size() && counted[k].flat == f; k++)
        sum_squares_into(rt, x.p + counted[k].from, counted[k].n, sums.sum(int64_t(k)));
    }
    ss = sums.total();  // the stretches in order
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
