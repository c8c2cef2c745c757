// Lab 05, alternative solution "flat_ledger": FSDP bookkept per FLAT rather than per unit.
//  - Layout: the pad is the remainder's complement, padded = numel + (world - numel % world) % world, and
//    shard = padded / world; offsets from std::exclusive_scan.
//  - A ledger maps each flat that is (being) whole to its gathered buffer and the all-gather still writing
//    it; a unit is whole when all its flats are in the ledger. The layers view the buffer as soon as its
//    gather starts: the contract only asks that no gather still writes it when the unit's compute starts,
//    so the wait happens at the last moment, in before_forward / before_backward.
//  - Prefetch: successor tables learned as the first step runs (each hook's unit is the successor of the
//    one before it, until that pass ends), then looked up; the next unit's gathers start before this
//    unit's wait. The root: the unit the first hook ever named. Under a budget the ledger is the count:
//    successors are gathered while the ledger's elements plus theirs stay within it.
//  - Gradients: the weights are released first, then the flat gradient is built, only its padding tail
//    zeroed. A reduce-scatter is issued first and the OLDER ones waited for after it (a short queue).
#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <vector>

#include <stdexcept>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

FlatLayout flat_layout(const std::vector<int64_t>& numel, int world) {
  FlatLayout l;
  l.offset.resize(numel.size());
  std::exclusive_scan(numel.begin(), numel.end(), l.offset.begin(), int64_t{0});
  l.numel = std::accumulate(numel.begin(), numel.end(), int64_t{0});
  l.padded = l.numel + (world - l.numel % world) % world;  // add just enough zeros to divide by world
  l.shard = l.padded / world;
  return l;
}

namespace {

struct Whole {            // one flat in the ledger
  Buffer full = -1;       // its padded weights, viewed by its parameters
  Work gather = -1;       // the all-gather writing `full`; -1 once waited for
  Buffer staging = -1;    // offload: the device copy of the host part being sent; -1 when none
};
std::map<int, Whole> g_ledger;  // flat -> its gathered copy

struct Pending {  // a reduce-scatter in flight
  int flat;
  Buffer in, out;
  Work work;
};
std::deque<Pending> g_pending;

// successor tables, learned while the first forward (backward) runs: a unit's successor is the unit the
// next call names; then frozen
struct Successors {
  std::map<int, int> next;
  int last = -1;
  bool frozen = false;
  void saw(int unit) {
    if (frozen || unit == last) return;
    if (last >= 0) next[last] = unit;
    last = unit;
  }
  int of(int unit) const {
    const auto it = next.find(unit);
    return it == next.end() ? -1 : it->second;
  }
};
Successors g_fwd, g_bwd;
int g_root = -1;

void gather(Fsdp& f, const Options& o, int unit) {
  for (int flat : f.flats(unit)) {
    if (g_ledger.count(flat)) continue;  // whole, or on its way
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    Whole w;
    w.full = f.alloc(l.padded, Kind::weights);
    Buffer src = f.part(flat);
    if (o.offload) {
      w.staging = f.alloc(l.shard, Kind::weights);
      f.copy(w.staging, 0, src, 0, l.shard);  // host -> device over the bus
      src = w.staging;
    }
    w.gather = f.all_gather(src, w.full, l.shard);
    for (size_t k = 0; k < l.offset.size(); k++) f.view(flat, static_cast<int>(k), w.full, l.offset[k]);
    g_ledger[flat] = w;
  }
}

void arrive(Fsdp& f, int unit) {  // the unit's gathers are done: it may compute
  for (int flat : f.flats(unit)) {
    Whole& w = g_ledger.at(flat);
    if (w.gather >= 0) f.wait(w.gather);
    w.gather = -1;
    if (w.staging >= 0) f.release(w.staging);
    w.staging = -1;
  }
}

void free_unit(Fsdp& f, int unit) {
  for (int flat : f.flats(unit)) {
    const auto it = g_ledger.find(flat);
    if (it == g_ledger.end()) continue;
    if (it->second.gather >= 0) f.wait(it->second.gather);
    if (it->second.staging >= 0) f.release(it->second.staging);
    f.release(it->second.full);
    g_ledger.erase(it);
  }
}

// the Kind::weights elements the ledger holds (the staged parts under offload too)
int64_t ledger_elements(Fsdp& f) {
  int64_t n = 0;
  for (const auto& [flat, w] : g_ledger) {
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    n += l.padded + (w.staging >= 0 ? l.shard : 0);
  }
  return n;
}

// what gathering `unit` would add: its flats not in the ledger
int64_t missing_elements(Fsdp& f, const Options& o, int unit) {
  int64_t n = 0;
  for (int flat : f.flats(unit)) {
    if (g_ledger.count(flat)) continue;
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    n += l.padded + (o.offload ? l.shard : 0);
  }
  return n;
}

void need(Fsdp& f, const Options& o, int unit, const Successors& order) {
  gather(f, o, unit);
  if (o.prefetch && o.gather_budget <= 0) {
    if (const int next = order.of(unit); next >= 0) gather(f, o, next);  // queued behind this unit's own gather
  } else if (o.prefetch) {  // a budget: successors while the room lasts, stopping at the first that does not fit
    int64_t room = o.gather_budget - ledger_elements(f);
    int hops = 0;
    for (int next = order.of(unit); next >= 0 && next != unit && hops < f.num_units(); next = order.of(next), hops++) {
      const int64_t cost = missing_elements(f, o, next);
      if (cost > room) break;
      gather(f, o, next);
      room -= cost;
    }
  }
  arrive(f, unit);
}

void settle(Fsdp& f, const Options& o, const Pending& p) {
  f.wait(p.work);
  if (o.offload) {
    const int64_t shard = flat_layout(f.numels(p.flat), f.world()).shard;
    const Buffer host = f.alloc(shard, Kind::host);
    f.copy(host, 0, p.out, 0, shard);  // device -> host: the optimizer steps there
    f.keep_grad(p.flat, host);
    f.release(host);
  } else {
    f.keep_grad(p.flat, p.out);
  }
  f.release(p.in);
  f.release(p.out);
}

}  // namespace

void before_forward(Fsdp& f, const Options& o, int unit) {
  if (g_root < 0) g_root = unit;
  g_fwd.saw(unit);
  need(f, o, unit, g_fwd);
}

void after_forward(Fsdp& f, const Options& o, int unit) {
  if (o.reshard_after_forward && unit != g_root) free_unit(f, unit);
}

void before_backward(Fsdp& f, const Options& o, int unit) {
  g_fwd.frozen = true;
  g_bwd.saw(unit);
  need(f, o, unit, g_bwd);
}

void after_backward(Fsdp& f, const Options& o, int unit) {
  free_unit(f, unit);  // the gradients live in the layers, not in the weights: free those first
  if (!o.sync) return;  // no_sync: the gradients keep adding up in the layers
  const size_t older = g_pending.size();
  for (int flat : f.flats(unit)) {
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    const Buffer in = f.alloc(l.padded, Kind::grads);
    for (size_t k = 0; k < l.offset.size(); k++) f.take_grad(flat, static_cast<int>(k), in, l.offset[k]);
    if (l.padded > l.numel) f.fill(in, l.numel, l.padded - l.numel, 0.0f);  // only the padding is unwritten
    const Buffer out = f.alloc(l.shard, Kind::grads);
    g_pending.push_back({flat, in, out, f.reduce_scatter(in, out, l.shard)});
  }
  for (size_t i = 0; i < older; i++) {  // the previous unit's reductions ran during this backward
    settle(f, o, g_pending.front());
    g_pending.pop_front();
  }
}

void finish_backward(Fsdp& f, const Options& o) {
  g_bwd.frozen = true;
  while (!g_pending.empty()) {
    settle(f, o, g_pending.front());
    g_pending.pop_front();
  }
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi,           lab05::flat_layout,    lab05::before_forward, lab05::after_forward,
                                        lab05::before_backward, lab05::after_backward, lab05::finish_backward};
