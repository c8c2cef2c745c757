// Lab 05, alternative solution "comm_stream": FSDP around ONE in-order queue of collectives, as a CUDA
// communication stream with events would be used.
//  - Layout: offsets by std::partial_sum; the shard first (quotient, plus one when there is a remainder),
//    then padded = shard · world.
//  - Every collective started (all-gathers and reduce-scatters alike) goes into one FIFO together with what
//    to do once it is done (a callback: point the layers into the gathered buffer, or hand the reduced part
//    to the optimizer and free the gradient buffers). Waiting is "drain the queue up to this entry", in the
//    order things were started; no per-unit state machine: a unit is whole-or-arriving when it has an
//    entry in `resident`, sharded otherwise.
//  - Prefetch: once this unit is drained, the next unit of the recorded order is enqueued, and arrives
//    while this one computes (under a budget: the next units while the resident ones and theirs fit). The order is a log of the first step's hook calls (every before_forward and
//    before_backward, in call order), from which the two orders are read; the root is the log's first unit.
//  - Gradients: the whole flat gradient buffer is zeroed before the layers write their stretches (the
//    padding is then 0, not NaN). after_backward drains the queue through the previous unit's
//    reduce-scatter (which overlapped this backward) before it enqueues its own: one reduction in flight.
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <vector>

#include <stdexcept>

#include "labs/05-fsdp-1b/api.h"

namespace lab05 {

FlatLayout flat_layout(const std::vector<int64_t>& numel, int world) {
  FlatLayout l;
  std::vector<int64_t> ends(numel.size());
  std::partial_sum(numel.begin(), numel.end(), ends.begin());  // where each parameter ends
  for (size_t k = 0; k < numel.size(); k++) l.offset.push_back(ends[k] - numel[k]);
  l.numel = ends.empty() ? 0 : ends.back();
  l.shard = l.numel / world + (l.numel % world != 0 ? 1 : 0);
  l.padded = l.shard * world;
  return l;
}

namespace {

struct Entry {
  std::vector<Work> works;      // the collectives of this entry (one per flat)
  std::function<void(Fsdp&)> done;  // what to do once they are all finished
  int gather_of = -1;           // the unit this entry gathers, or -1 for a reduction
};
std::deque<Entry> g_stream;                    // started, not yet waited for, in start order
std::map<int, std::vector<Buffer>> g_resident; // unit -> its gathered buffers (arrived or arriving)

void complete_front(Fsdp& f) {
  Entry e = std::move(g_stream.front());
  g_stream.pop_front();
  for (Work w : e.works) f.wait(w);
  e.done(f);
}

bool queued(int unit) {
  return std::any_of(g_stream.begin(), g_stream.end(), [unit](const Entry& e) { return e.gather_of == unit; });
}

// Wait, in order, up to and including the gather of `unit` (nothing if it has arrived already).
void drain_through(Fsdp& f, int unit) {
  if (!queued(unit)) return;
  while (true) {
    const bool last = g_stream.front().gather_of == unit;
    complete_front(f);
    if (last) return;
  }
}

// Up to and including the last reduction queued (the previous unit's, whose time was this unit's
// backward): the queue is in order, so what was started before it is done too; the gathers started after
// it (prefetches further ahead) go on.
void drain_reductions(Fsdp& f) {
  while (std::any_of(g_stream.begin(), g_stream.end(), [](const Entry& e) { return e.gather_of < 0; })) complete_front(f);
}

void drain_all(Fsdp& f) {
  while (!g_stream.empty()) complete_front(f);
}

// Enqueue the unit's all-gathers, unless it is whole or arriving.
void enqueue_gather(Fsdp& f, const Options& o, int unit) {
  if (g_resident.count(unit)) return;
  Entry e;
  e.gather_of = unit;
  std::vector<Buffer>& full = g_resident[unit];
  std::vector<Buffer> staged;
  for (int flat : f.flats(unit)) {
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    full.push_back(f.alloc(l.padded, Kind::weights));
    Buffer src = f.part(flat);
    if (o.offload) {  // host part: a collective takes device buffers only
      staged.push_back(f.alloc(l.shard, Kind::weights));
      f.copy(staged.back(), 0, src, 0, l.shard);
      src = staged.back();
    }
    e.works.push_back(f.all_gather(src, full.back(), l.shard));
  }
  e.done = [unit, bufs = full, staged](Fsdp& fp) {
    for (Buffer b : staged) fp.release(b);
    const std::vector<int> flats = fp.flats(unit);
    for (size_t i = 0; i < flats.size(); i++) {
      const FlatLayout l = flat_layout(fp.numels(flats[i]), fp.world());
      for (size_t k = 0; k < l.offset.size(); k++) fp.view(flats[i], static_cast<int>(k), bufs[i], l.offset[k]);
    }
  };
  g_stream.push_back(std::move(e));
}

void release_unit(Fsdp& f, int unit) {
  const auto it = g_resident.find(unit);
  if (it == g_resident.end()) return;
  drain_through(f, unit);  // never free a buffer a gather still writes
  for (Buffer b : it->second) f.release(b);
  g_resident.erase(it);
}

int next_after(const std::vector<int>& order, int unit) {
  const auto it = std::find(order.begin(), order.end(), unit);
  return (it == order.end() || std::next(it) == order.end()) ? -1 : *std::next(it);
}

// A unit's gathered elements: its padded flats, plus (offload) the parts staged on the device while queued.
int64_t gathered_elements(Fsdp& f, const Options& o, int unit, bool arriving) {
  int64_t n = 0;
  for (int flat : f.flats(unit)) {
    const FlatLayout l = flat_layout(f.numels(flat), f.world());
    n += l.padded + (o.offload && arriving ? l.shard : 0);
  }
  return n;
}

void acquire(Fsdp& f, const Options& o, int unit, const std::vector<int>& order) {
  enqueue_gather(f, o, unit);
  drain_through(f, unit);
  if (!o.prefetch) return;
  if (o.gather_budget <= 0) {
    if (const int next = next_after(order, unit); next >= 0) enqueue_gather(f, o, next);
    return;
  }
  // a budget: the resident units (whole or arriving) counted, then the order's next units enqueued while
  // the sum stays within it
  int64_t used = 0;
  for (const auto& [u, bufs] : g_resident) used += gathered_elements(f, o, u, queued(u));
  for (int next = next_after(order, unit); next >= 0; next = next_after(order, next)) {
    if (g_resident.count(next)) continue;
    const int64_t add = gathered_elements(f, o, next, true);
    if (used + add > o.gather_budget) break;
    enqueue_gather(f, o, next);
    used += add;
  }
}

// The first step's log: (true, unit) for a before_forward, (false, unit) for a before_backward, in call
// order, until the first finish_backward; the orders are read from it
std::vector<std::pair<bool, int>> g_log;
bool g_logging = true;
std::vector<int> g_fwd, g_bwd;

void log_call(bool forward, int unit) {
  if (!g_logging) return;
  g_log.emplace_back(forward, unit);
  g_fwd.clear();
  g_bwd.clear();
  for (const auto& [fw, u] : g_log) {
    std::vector<int>& order = fw ? g_fwd : g_bwd;
    if (fw && !g_bwd.empty()) continue;  // a later micro-step's forward: the first one's order stands
    if (order.empty() || order.back() != u) order.push_back(u);
  }
}

}  // namespace

void before_forward(Fsdp& f, const Options& o, int unit) {
  log_call(true, unit);
  acquire(f, o, unit, g_fwd);
}

void after_forward(Fsdp& f, const Options& o, int unit) {
  if (o.reshard_after_forward && unit != g_log.front().second) release_unit(f, unit);  // the root: backward starts with it
}

void before_backward(Fsdp& f, const Options& o, int unit) {
  log_call(false, unit);
  acquire(f, o, unit, g_bwd);
}

void after_backward(Fsdp& f, const Options& o, int unit) {
  if (o.sync) {
    drain_reductions(f);  // the previous reduction and everything started before it: its time was this unit's backward
    Entry e;
    struct Red { int flat; int64_t shard; Buffer grad, part; };
    std::vector<Red> reds;
    for (int flat : f.flats(unit)) {
      const FlatLayout l = flat_layout(f.numels(flat), f.world());
      Red r{flat, l.shard, f.alloc(l.padded, Kind::grads), -1};
      f.fill(r.grad, 0, l.padded, 0.0f);
      for (size_t k = 0; k < l.offset.size(); k++) f.take_grad(flat, static_cast<int>(k), r.grad, l.offset[k]);
      r.part = f.alloc(l.shard, Kind::grads);
      e.works.push_back(f.reduce_scatter(r.grad, r.part, l.shard));
      reds.push_back(r);
    }
    e.done = [reds, offload = o.offload](Fsdp& fp) {
      for (const Red& r : reds) {
        if (offload) {  // the optimizer steps on the host: the part crosses the bus
          const Buffer host = fp.alloc(r.shard, Kind::host);
          fp.copy(host, 0, r.part, 0, r.shard);
          fp.keep_grad(r.flat, host);
          fp.release(host);
        } else {
          fp.keep_grad(r.flat, r.part);
        }
        fp.release(r.part);
        fp.release(r.grad);
      }
    };
    g_stream.push_back(std::move(e));
  }
  release_unit(f, unit);  // no_sync or not: the weights go; the gradients stay in the layers or are taken
}

void finish_backward(Fsdp& f, const Options& o) {
  (void)o;
  g_logging = false;  // the first step's backward is over: the orders are known
  drain_all(f);  // every reduction kept
}

}  // namespace lab05

extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi,           lab05::flat_layout,    lab05::before_forward, lab05::after_forward,
                                        lab05::before_backward, lab05::after_backward, lab05::finish_backward};
