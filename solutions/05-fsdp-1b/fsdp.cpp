// Lab 05 — FSDP (full shard): each rank keeps 1/N of every unit's flat vector and makes a unit whole only
// around its forward and its backward — all-gathered into a buffer of its own, the layers' weights viewing
// that buffer — gathering the next unit while this one computes (or, under a memory budget, as many units
// ahead as fit), and reduce-scattering each unit's flat gradient as its backward ends.
#include <algorithm>
#include <map>
#include <vector>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

FlatLayout flat_layout(const std::vector<int64_t>& numel, int world) {
  /// BEGIN SOLUTION
  FlatLayout l;
  for (int64_t n : numel) {
    l.offset.push_back(l.numel);  // one after the other, in the model's order
    l.numel += n;
  }
  l.padded = (l.numel + world - 1) / world * world;  // zeros at the end: equal parts for the collectives
  l.shard = l.padded / world;
  return l;
  /// END SOLUTION
}

/// BEGIN SOLUTION ONLY
// What this rank's process remembers between the hooks: each unit's gathered buffers, and the reductions
// in flight.
struct Gathered {
  int flat = -1;
  FlatLayout layout;
  Buffer whole = 0, staged = 0;  // the gathered flat vector; under offload, this rank's part brought to the device
  Work work = 0;
};
enum class State { sharded, gathering, whole };
struct Unit {
  State state = State::sharded;
  std::vector<Gathered> flats;
};
static std::map<int, Unit> units;

struct Reduction {
  int flat = -1;
  int64_t shard = 0;
  Buffer grad = 0, part = 0;  // the flat gradient (padded), this rank's averaged part
  Work work = 0;
};
static std::vector<Reduction> reducing;

// The execution order, learned as PyTorch FSDP learns it (its _ExecOrderData): the units in the order the
// first forward (the first backward) reached them, a repeated call adding nothing, then fixed for the run.
// The unit numbers say nothing of it: the trainer draws them.
struct Order {
  std::vector<int> units;
  bool fixed = false;
  void record(int unit) {
    if (!fixed && (units.empty() || units.back() != unit)) units.push_back(unit);
  }
  // the unit after `unit`, or -1: the last one, or the first pass still running (its last unit is the
  // one running now, and the next is not known yet)
  int next(int unit) const {
    auto it = std::find(units.begin(), units.end(), unit);
    return it == units.end() || it + 1 == units.end() ? -1 : *(it + 1);
  }
};
static Order forward_order, backward_order;
static int root = -1;  // the first unit a forward reaches: its forward encloses every other's

// Starts the unit's all-gathers (every flat's): each rank sends its part, everyone receives the padded
// flat vector. Nothing when the unit is whole or on its way.
static void start_gather(Fsdp& f, const Options& o, int unit) {
  Unit& u = units[unit];
  if (u.state != State::sharded) return;
  u.flats.clear();
  for (int flat : f.flats(unit)) {
    Gathered g;
    g.flat = flat;
    g.layout = flat_layout(f.numels(flat), f.world());
    Buffer mine = f.part(flat);
    if (o.offload) {  // the part lives on the host: only a device buffer takes part in a collective
      g.staged = f.alloc(g.layout.shard, Kind::weights);
      f.copy(g.staged, 0, mine, 0, g.layout.shard);
      mine = g.staged;
    }
    g.whole = f.alloc(g.layout.padded, Kind::weights);
    g.work = f.all_gather(mine, g.whole, g.layout.shard);
    u.flats.push_back(g);
  }
  u.state = State::gathering;
}

// The elements a unit's gathers allocate as Kind::weights: every flat's padded vector (and, under offload,
// its part staged on the device until the gather is waited for).
static int64_t unit_elements(Fsdp& f, const Options& o, int unit) {
  int64_t n = 0;
  for (int flat : f.flats(unit)) {
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    n += l.padded + (o.offload ? l.shard : 0);
  }
  return n;
}

// Gather ahead of `unit` along `order`: the next unit (no budget), or — o.gather_budget — as many of the
// units that follow as fit beside what is held now, in the order they will run: one that does not fit stops
// the walk (a later, smaller one gathered first would arrive before the one needed sooner).
static void prefetch(Fsdp& f, const Options& o, const Order& order, int unit) {
  if (!o.prefetch) return;
  if (o.gather_budget <= 0) {
    if (const int next = order.next(unit); next >= 0) start_gather(f, o, next);  // overlaps this unit's compute
    return;
  }
  int64_t held = 0;  // the units whole now or on their way: the root, this one, the prefetched
  for (auto& [u, state] : units)
    if (state.state != State::sharded) held += unit_elements(f, o, u);
  for (int next = order.next(unit); next >= 0; next = order.next(next)) {
    if (units[next].state != State::sharded) continue;  // counted already
    const int64_t need = unit_elements(f, o, next);
    if (held + need > o.gather_budget) break;
    start_gather(f, o, next);
    held += need;
  }
}

// Whole: the all-gathers waited for, the layers' weights pointing into the gathered buffer.
static void make_whole(Fsdp& f, const Options& o, int unit) {
  start_gather(f, o, unit);
  Unit& u = units[unit];
  if (u.state == State::whole) return;
  for (Gathered& g : u.flats) {
    f.wait(g.work);
    if (g.staged) f.release(g.staged), g.staged = 0;
    for (size_t k = 0; k < g.layout.offset.size(); k++) f.view(g.flat, int(k), g.whole, g.layout.offset[k]);
  }
  u.state = State::whole;
}

// Back to this rank's part: the gathered buffers freed (a prefetch nobody used is waited for first).
static void reshard(Fsdp& f, int unit) {
  Unit& u = units[unit];
  for (Gathered& g : u.flats) {
    if (u.state == State::gathering) {
      f.wait(g.work);
      if (g.staged) f.release(g.staged);
    }
    f.release(g.whole);
  }
  u.flats.clear();
  u.state = State::sharded;
}

// The reductions started so far, done: each rank's averaged part handed to the optimizer (on the host
// under offload), the flat gradients freed.
static void finish_reductions(Fsdp& f, const Options& o) {
  for (Reduction& r : reducing) {
    f.wait(r.work);
    f.release(r.grad);
    if (o.offload) {  // the optimizer steps on the host: the part crosses the bus
      const Buffer host = f.alloc(r.shard, Kind::host);
      f.copy(host, 0, r.part, 0, r.shard);
      f.keep_grad(r.flat, host);
      f.release(host);
    } else {
      f.keep_grad(r.flat, r.part);
    }
    f.release(r.part);
  }
  reducing.clear();
}
/// END SOLUTION ONLY

void before_forward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  if (root < 0) root = unit;
  forward_order.record(unit);
  make_whole(f, o, unit);  // already on its way when the previous unit prefetched it
  prefetch(f, o, forward_order, unit);
  /// END SOLUTION
}

void after_forward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  // FULL_SHARD: back to 1/N until backward needs it. Not the root: backward starts with it.
  if (o.reshard_after_forward && unit != root) reshard(f, unit);
  /// END SOLUTION
}

void before_backward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  forward_order.fixed = true;  // the first forward is over
  backward_order.record(unit);
  make_whole(f, o, unit);  // freed after forward: gathered a second time
  prefetch(f, o, backward_order, unit);
  /// END SOLUTION
}

void after_backward(Fsdp& f, const Options& o, int unit) {
  /// BEGIN SOLUTION
  if (o.sync) {  // no_sync micro-steps leave the layers' gradients to add up
    finish_reductions(f, o);  // the unit before this one: its reduction overlapped this unit's backward
    for (int flat : f.flats(unit)) {
      Reduction r;
      r.flat = flat;
      const FlatLayout l = flat_layout(f.numels(flat), f.world());
      r.shard = l.shard;
      r.grad = f.alloc(l.padded, Kind::grads);
      f.fill(r.grad, l.numel, l.padded - l.numel, 0.0f);  // the padding: zero adds nothing to a sum or a norm
      for (size_t k = 0; k < l.offset.size(); k++) f.take_grad(flat, int(k), r.grad, l.offset[k]);
      r.part = f.alloc(l.shard, Kind::grads);
      r.work = f.reduce_scatter(r.grad, r.part, l.shard);
      reducing.push_back(r);
    }
  }
  reshard(f, unit);
  /// END SOLUTION
}

void finish_backward(Fsdp& f, const Options& o) {
  /// BEGIN SOLUTION
  backward_order.fixed = true;  // the first backward is over
  if (o.sync) finish_reductions(f, o);
  /// END SOLUTION
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi,           lab05::flat_layout,    lab05::before_forward, lab05::after_forward,
                                        lab05::before_backward, lab05::after_backward, lab05::finish_backward};
