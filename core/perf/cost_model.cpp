#include "core/perf/cost_model.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

namespace {

void require_cost_model(const HardwareProfile& hw) {
  if (!hw.has_cost_model())
    throw ConfigError("hardware profile '" + hw.name + "' only carries device memory, not FLOP/s or link bandwidths",
                      "the cost model needs a link-aware profile: " + profile_names(true));
}

}  // namespace

double compute_time(const TraceEvent& e, const HardwareProfile& hw, bool low_precision, KernelSet kernels) {
  require_cost_model(hw);
  // Roofline: a kernel is limited either by arithmetic or by memory traffic, whichever takes longer; the
  // launch overhead is why many tiny kernels are slower than their FLOPs say.
  // CPU offload: a host<->device copy crosses the host link; the host's own compute has the host's rates
  if (e.link_bytes > 0) return e.link_bytes / hw.host_link_bytes_per_s + hw.launch_overhead_s;
  if (e.on_host) return std::max(e.flops / hw.host_flops_per_s, e.bytes / hw.host_mem_bw_bytes_per_s);
  // Neither roof is reached: a GEMM gets the profile's measured share of the peak times what its shape
  // leaves busy (gemm_quantization), or the rate measured for its very shape on the user's GPU (a
  // calibrated profile); a flash-attention kernel its own (lower) share or its measured rate; a streaming
  // kernel ~90 % of the data sheet's bandwidth (hardware.cpp's sources).
  const bool low = low_precision || e.low_precision;
  const double peak_flops_per_s = low ? hw.low_precision_flops_per_s : hw.fp32_flops_per_s;
  const bool flash = e.name.rfind("flash_attention", 0) == 0;
  double math_s = 0;
  if (e.shape.gemm[0].m > 0) {
    for (const GemmShape& g : e.shape.gemm) {
      if (g.m <= 0) continue;
      const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
      double rate = peak_flops_per_s * hw.gemm_efficiency * gemm_quantization(g, hw);
      for (const MeasuredGemm& m : hw.measured_gemms)
        if (m.shape == g && m.low_precision == low && m.flops_per_s > 0) rate = m.flops_per_s;
      math_s += flops / rate;
    }
  } else {
    double rate = peak_flops_per_s * (flash ? hw.attention_efficiency : hw.gemm_efficiency);
    if (flash)
      for (const MeasuredAttention& m : hw.measured_attention)
        if (m.seq == e.shape.seq && m.head_dim == e.shape.head_dim && m.backward == e.name.ends_with("_backward") && m.flops_per_s > 0)
          rate = m.flops_per_s;
    math_s = e.flops / rate;
  }
  // Eager PyTorch (log.kernels = "eager", or "compiled" outside the blocks): the same math as a chain of kernels, each writing its result to
  // memory for the next to read (core/perf/eager.cpp); they are memory-bound, so only bytes and launches change.
  const KernelChain chain = eager_chain(e.name, e.bytes, kernels.activation_bytes, kernels.eager_ops);
  const double memory_s = chain.bytes / (hw.mem_bw_bytes_per_s * hw.mem_bw_efficiency);
  return std::max(math_s, memory_s) + chain.launches * hw.launch_overhead_s;
}

/* α-β cost of ring collectives (Chapter 2), in nccl-tests' conventions.

   Ring all-reduce of S bytes over n ranks: cut the buffer into n chunks of S/n. In n−1 reduce-scatter
   steps every rank sends one chunk to its right neighbour and adds the chunk arriving from its left; after
   them each rank owns one fully reduced chunk. n−1 all-gather steps then pass the reduced chunks around.
   All ranks send at once, so a step costs α + (S/n)/B on a link of B bytes/s, and

       t_all_reduce = 2(n−1)·α + 2(n−1)/n · S/B.

   nccl-tests reports algbw = S/t and busbw = algbw · 2(n−1)/n. For a large S (α negligible) that is
   busbw = S·2(n−1)/n / (2(n−1)/n · S/B) = B: the bus bandwidth IS the per-link bandwidth of the ring, and
   it does not depend on n. That is why profiles store the busbw that nccl-tests measured and we use it as B.
   The same reasoning for the others (S is always the full size: the input of all-reduce and broadcast, the
   gathered output of all-gather, the input of reduce-scatter):

       reduce_scatter, all_gather   (n−1)·α + (n−1)/n · S/B     busbw = algbw·(n−1)/n
       broadcast (pipelined chain)  (n−1)·α + S/B               busbw = algbw
       send / recv (one hop)        α + S/B                      busbw = algbw
       barrier (0-byte all-reduce)  2(n−1)·α                     moves no data
       any op with n = 1            0                            nothing to talk to
*/
double busbw_factor(const std::string& op, int n) {
  if (n < 1) throw Error(fmt::format("busbw_factor: group of {} ranks", n), "a group has at least one rank");
  const double steps = double(n - 1) / double(n);
  if (op == "all_reduce") return 2 * steps;
  if (op == "reduce_scatter" || op == "all_gather") return steps;
  if (op == "broadcast" || op == "send" || op == "recv") return 1;
  if (op == "barrier") return 0;
  throw Error("cost model: unknown collective '" + op + "'",
              "one of all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier");
}

double algbw(int64_t bytes, double time_s) { return time_s > 0 ? double(bytes) / time_s : 0; }

double collective_time(const std::string& op, int64_t bytes, int n, const HardwareProfile& hw, Link link) {
  require_cost_model(hw);
  if (bytes < 0) throw Error(fmt::format("cost model: {} of {} bytes", op, bytes), "payload sizes are never negative");
  const double factor = busbw_factor(op, n);  // also validates op and n
  if (n == 1) return 0;
  const double busbw_bytes_per_s =
      link == Link::inter_node ? hw.inter_node_busbw_bytes_per_s : hw.intra_node_busbw_bytes_per_s;
  const double alpha_s = hw.collective_latency_s;
  const double bandwidth_s = double(bytes) / busbw_bytes_per_s * factor;  // S/B · busbw_factor
  double latency_steps = 0;
  if (op == "all_reduce" || op == "barrier") latency_steps = 2.0 * (n - 1);
  else if (op == "send" || op == "recv") latency_steps = 1;
  else latency_steps = n - 1;  // reduce_scatter, all_gather, broadcast
  return latency_steps * alpha_s + bandwidth_s;
}

/* Replay: each rank has two in-order streams, like a CUDA compute stream and an NCCL stream.
     - compute events run back to back on the compute stream;
     - a collective is ISSUED at the rank's current compute-stream time (its inputs are ready then) and
       costs the compute stream nothing; it STARTS when the last rank of its group has issued it and the
       comm streams of all its ranks are free (each comm stream runs its collectives in issue order), and
       takes collective_time;
     - a wait moves the compute stream to the end of its collective if that is later.
     - while a collective runs, the kernels beside it have fewer SMs (the profile's comm_sms: NCCL's thread
       blocks hold theirs), so the part of a kernel that overlaps a collective runs at the rate
       beside_collective() gives (hardware.h); the time it loses is the rank's contention_s.
   The timeline is fixed by these rules; we find it by advancing every rank as far as it can go, starting
   every collective as soon as all its ranks have issued it (at the head of all their comm queues), until
   nothing moves. Ranks left with events then are deadlocked (an error, never a hang). A kernel is placed
   against the collectives started by then: all that can overlap it in the fake world (one traced rank, whose
   collectives start when issued). With several traced ranks a peer may issue one later, so there the
   contention is not modeled at all (see `shared` below). */
namespace {

struct Collective {
  std::string op;
  int64_t payload_bytes = 0;
  int group_size = 1;
  std::string group;
  int64_t seq = -1;
  std::vector<int> ranks;            // participants, in rank order
  std::map<int, double> issue_s;     // rank -> issue time
  bool done = false;
  double start_s = 0, end_s = 0;
};

using Key = std::pair<std::string, int64_t>;  // (group, seq)

std::string describe(const Collective& c) { return fmt::format("{} of group '{}' seq {}", c.op, c.group, c.seq); }

bool is_p2p(const std::string& op) { return op == "send" || op == "recv"; }

// Pass 1: find every collective's participants and check that the trace could have run at all.
std::map<Key, Collective> match_collectives(const std::vector<std::vector<TraceEvent>>& ranks, bool symmetric) {
  std::map<Key, Collective> all;
  for (int r = 0; r < int(ranks.size()); r++) {
    for (const TraceEvent& e : ranks[r]) {
      const Key key{e.group, e.seq};
      if (e.kind == EventKind::collective) {
        auto [it, fresh] = all.try_emplace(key);
        Collective& c = it->second;
        if (fresh) c = Collective{e.op, e.payload_bytes, e.group_size, e.group, e.seq, {}, {}, false, 0, 0};
        if (!c.ranks.empty() && c.ranks.back() == r)
          throw Error(fmt::format("trace: rank {} issues {} twice", r, describe(c)),
                      "every collective of a group needs its own sequence number");
        const bool same_op = c.op == e.op || (is_p2p(c.op) && is_p2p(e.op));
        if (!same_op || c.payload_bytes != e.payload_bytes || c.group_size != e.group_size)
          throw Error(fmt::format("trace: ranks disagree on {}: rank {} has {} of {} bytes over {} ranks, rank {} has "
                                  "{} of {} bytes over {} ranks", describe(c), c.ranks.front(), c.op, c.payload_bytes,
                                  c.group_size, r, e.op, e.payload_bytes, e.group_size),
                      "all ranks of a group must issue the same collectives in the same order");
        c.ranks.push_back(r);
      } else if (e.kind == EventKind::wait) {
        auto it = all.find(key);
        if (it == all.end() || std::find(it->second.ranks.begin(), it->second.ranks.end(), r) == it->second.ranks.end())
          throw Error(fmt::format("trace: rank {} waits for collective seq {} of group '{}', which it did not issue "
                                  "before the wait", r, e.seq, e.group),
                      "a wait must follow its collective on the same rank; in a real run this wait would hang");
      }
    }
  }
  for (const auto& [key, c] : all) {
    if (int(c.ranks.size()) == c.group_size || (symmetric && c.ranks.size() == 1)) continue;
    std::string who;
    for (int r : c.ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
    throw Error(fmt::format("trace: {} has {} participant(s) (rank {}) but group_size {}", describe(c), c.ranks.size(),
                            who, c.group_size),
                int(c.ranks.size()) < c.group_size
                    ? "a rank's trace is missing or stopped early; in a real run this collective would hang"
                    : "two communicators share the group name: give each group a unique id (\"dp0\", \"dp1\")");
  }
  return all;
}

struct RankState {
  size_t pc = 0;                  // next event in program order
  double compute_clock_s = 0;     // when the compute stream is next free
  double comm_free_s = 0;         // when the comm stream is next free
  std::deque<Collective*> queue;  // issued, not yet started collectives, in issue order
  std::vector<std::pair<double, double>> comm_busy;  // the comm stream's collectives (start, end), in time order
  size_t busy_from = 0;           // the first of them that may still overlap the compute stream
  RankTimes times;
};

// End of a kernel that starts at start_s and takes alone_s by itself and shared_s beside a collective: it
// runs at 1/alone_s of its work per second while the comm stream is idle and 1/shared_s while it is busy.
// shared_s == alone_s (a profile without comm_sms, a kernel on the host) is the kernel placed as before.
double place_kernel(RankState& s, double start_s, double alone_s, double shared_s) {
  while (s.busy_from < s.comm_busy.size() && s.comm_busy[s.busy_from].second <= start_s) s.busy_from++;
  if (shared_s <= alone_s) return start_s + alone_s;
  double t = start_s, left = 1;  // the share of the kernel's work still to do
  for (size_t i = s.busy_from; i < s.comm_busy.size(); i++) {
    const auto [a, b] = s.comm_busy[i];
    if (a > t) {  // alone until the collective starts
      if (left * alone_s <= a - t) return t + left * alone_s;
      left -= (a - t) / alone_s;
      t = a;
    }
    if (left * shared_s <= b - t) return t + left * shared_s;
    left -= (b - t) / shared_s;
    t = b;
  }
  return t + left * alone_s;
}

std::string deadlock_message(const std::vector<std::vector<TraceEvent>>& ranks, const std::vector<RankState>& st) {
  std::string msg = "trace: the replay cannot make progress (collectives issued in an order that deadlocks):";
  for (int r = 0; r < int(st.size()); r++) {
    if (st[r].pc < ranks[r].size()) {
      const TraceEvent& e = ranks[r][st[r].pc];
      msg += fmt::format("\n  rank {}: compute stream blocked at wait for seq {} of group '{}'", r, e.seq, e.group);
    }
    if (!st[r].queue.empty()) {
      const Collective& head = *st[r].queue.front();
      std::string missing;
      for (int p : head.ranks)
        if (st[p].queue.empty() || st[p].queue.front() != &head) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      msg += fmt::format("; comm stream stuck at {} which rank(s) {} have not reached", describe(head), missing);
    }
  }
  return msg;
}

}  // namespace

ReplayResult replay(const std::vector<std::vector<TraceEvent>>& ranks, const HardwareProfile& hw, ReplayOptions opts) {
  require_cost_model(hw);
  if (opts.symmetric && ranks.size() != 1)
    throw Error(fmt::format("replay: a symmetric replay takes one rank's trace, not {}", ranks.size()), "pass the fake world's one rank");
  std::map<Key, Collective> collectives = match_collectives(ranks, opts.symmetric);
  ReplayResult out;
  out.profile = hw.name;
  std::vector<RankState> st(ranks.size());
  // The profile a kernel beside a running collective sees. Only in the fake world: there every collective
  // that can overlap a kernel has started by the time the kernel is placed. With several traced ranks a
  // peer may issue it later, and the kernels placed before would be charged on some ranks and not on
  // others, by rank order, so a multi-rank replay models no contention.
  const HardwareProfile shared = opts.symmetric ? beside_collective(hw) : hw;

  auto link_of = [&](const Collective& c) {
    if (opts.ranks_per_node <= 0) return Link::intra_node;
    if (opts.symmetric) return c.group_size > opts.ranks_per_node ? Link::inter_node : Link::intra_node;  // its ranks are not traced
    for (int r : c.ranks)
      if (r / opts.ranks_per_node != c.ranks.front() / opts.ranks_per_node) return Link::inter_node;
    return Link::intra_node;
  };

  // Starts every collective that heads the comm queues of all its ranks; false when none could start.
  auto start_collectives = [&]() {
    bool moved = false;
    for (int r = 0; r < int(st.size()); r++) {
      while (!st[r].queue.empty()) {
        Collective& c = *st[r].queue.front();
        const bool ready = std::all_of(c.ranks.begin(), c.ranks.end(), [&](int p) {
          return !st[p].queue.empty() && st[p].queue.front() == &c;
        });
        if (!ready) break;
        double start_s = 0;
        for (int p : c.ranks) start_s = std::max({start_s, c.issue_s.at(p), st[p].comm_free_s});
        const double t = collective_time(c.op, c.payload_bytes, c.group_size, hw, link_of(c));
        c.start_s = start_s;
        c.end_s = start_s + t;
        c.done = true;
        for (int p : c.ranks) {
          st[p].queue.pop_front();
          st[p].comm_free_s = c.end_s;
          st[p].times.comm_s += t;
          // point-to-point sends run on a pair's few p2p channels, not a collective's rings: not counted
          if (t > 0 && !is_p2p(c.op)) st[p].comm_busy.emplace_back(c.start_s, c.end_s);
          out.events.push_back({p, Stream::comm, EventKind::collective, c.op, c.start_s, c.end_s, 0,
                                double(c.payload_bytes), c.group, c.seq});
        }
        moved = true;
      }
    }
    return moved;
  };

  // Moves rank r's compute stream as far as it goes; false when it did nothing.
  auto advance_rank = [&](int r) {
    RankState& s = st[r];
    bool moved = false;
    while (s.pc < ranks[r].size()) {
      const TraceEvent& e = ranks[r][s.pc];
      if (e.kind == EventKind::compute) {
        const double alone_s = compute_time(e, hw, opts.low_precision, opts.kernels);
        const double shared_s = shared.sm_count != hw.sm_count ? compute_time(e, shared, opts.low_precision, opts.kernels) : alone_s;
        const double end_s = place_kernel(s, s.compute_clock_s, alone_s, shared_s);
        out.events.push_back({r, Stream::compute, EventKind::compute, e.name, s.compute_clock_s, end_s, e.flops, e.bytes, "", -1});
        const double lost_s = std::max(0.0, end_s - (s.compute_clock_s + alone_s));  // beside collectives (0 exactly when alone)
        s.times.compute_s += alone_s + lost_s;
        s.times.contention_s += lost_s;
        s.compute_clock_s = end_s;
      } else if (e.kind == EventKind::marker) {
        out.events.push_back({r, Stream::compute, EventKind::marker, e.name, s.compute_clock_s, s.compute_clock_s, 0, 0, "", -1});
      } else if (e.kind == EventKind::collective) {
        Collective& c = collectives.at({e.group, e.seq});
        c.issue_s[r] = s.compute_clock_s;
        s.queue.push_back(&c);
        start_collectives();  // it starts now if its peers have issued it: the kernels after it overlap it
      } else {  // wait
        const Collective& c = collectives.at({e.group, e.seq});
        if (!c.done) return moved;
        if (c.end_s > s.compute_clock_s) {
          out.events.push_back({r, Stream::compute, EventKind::wait, "wait " + c.op, s.compute_clock_s, c.end_s, 0,
                                double(c.payload_bytes), c.group, c.seq});
          s.compute_clock_s = c.end_s;
        }
      }
      s.pc++;
      moved = true;
    }
    return moved;
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < int(st.size()); r++) moved |= advance_rank(r);
    moved |= start_collectives();
  }
  for (int r = 0; r < int(st.size()); r++)
    if (st[r].pc < ranks[r].size() || !st[r].queue.empty())
      throw Error(deadlock_message(ranks, st), "every rank must issue the collectives of a group in the same order");

  for (RankState& s : st) {
    RankTimes& t = s.times;
    t.step_s = std::max(s.compute_clock_s, s.comm_free_s);
    t.exposed_comm_s = t.step_s - t.compute_s;
    out.step_s = std::max(out.step_s, t.step_s);
    out.compute_s = std::max(out.compute_s, t.compute_s);
    out.comm_s = std::max(out.comm_s, t.comm_s);
    out.exposed_comm_s = std::max(out.exposed_comm_s, t.exposed_comm_s);
    out.contention_s = std::max(out.contention_s, t.contention_s);
    out.exposed_comm_mean_s += t.exposed_comm_s / double(st.size());
    out.ranks.push_back(t);
  }
  return out;
}

/* Modeled speed-up of N-rank data parallelism, same global batch.
   t_N = the replayed step of the N ranks (compute + communication, with whatever overlap the trace has).
   t_1 = one rank doing all N ranks' micro-batches, one after another (gradient accumulation): every compute
         event whose work scales with the batch runs N times, the rest (optimizer step, zeroing) once, and
         there is nothing to communicate. Counting the launch overhead N times is what accumulation costs; a
         single N-times-bigger batch would pay it once, so for launch-bound steps this flatters N ranks a bit.
   speed-up = t_1 / t_N; N at perfect scaling, less by the exposed communication and the per-rank work
   (optimizer) that data parallelism repeats on every rank. */
double single_rank_time_s(const std::vector<TraceEvent>& rank_events, int n_ranks, const HardwareProfile& hw,
                          bool low_precision, KernelSet kernels) {
  double t_s = 0;
  for (const TraceEvent& e : rank_events)
    if (e.kind == EventKind::compute) t_s += compute_time(e, hw, low_precision, kernels) * (e.scales_with_batch ? n_ranks : 1);
  return t_s;
}

double modeled_speedup(const std::vector<std::vector<TraceEvent>>& ranks, const HardwareProfile& hw, ReplayOptions opts) {
  if (ranks.empty()) throw Error("modeled_speedup: no ranks in the trace", "pass one event list per rank");
  const double t_n_s = replay(ranks, hw, opts).step_s;
  if (t_n_s <= 0) throw Error("modeled_speedup: the replayed step takes no time", "the trace has no compute events");
  return single_rank_time_s(ranks[0], int(ranks.size()), hw, opts.low_precision, opts.kernels) / t_n_s;
}

PipelineTimeline pipeline_timeline(const ReplayResult& r) {
  PipelineTimeline t;
  t.spans.resize(r.ranks.size());
  t.bubble.assign(r.ranks.size(), 0.0);
  std::map<std::pair<int, std::string>, double> open;
  bool any = false;
  for (const ModeledEvent& e : r.events) {
    if (e.kind != EventKind::marker || e.name.size() < 2) continue;
    const std::string what = e.name.substr(1);
    if (e.name[0] == '+') {
      open[{e.rank, what}] = e.start_s;
      continue;
    }
    auto it = open.find({e.rank, what});
    if (it == open.end()) continue;
    t.spans[size_t(e.rank)].push_back({what, it->second, e.start_s});
    t.start_s = any ? std::min(t.start_s, it->second) : it->second;
    t.end_s = any ? std::max(t.end_s, e.start_s) : e.start_s;
    any = true;
    open.erase(it);
  }
  const double window = t.end_s - t.start_s;
  int counted = 0;
  for (size_t k = 0; k < t.spans.size(); k++) {
    if (t.spans[k].empty() || window <= 0) continue;
    double busy = 0;
    for (const auto& s : t.spans[k]) busy += s.end_s - s.start_s;
    t.bubble[k] = 1.0 - busy / window;
    t.bubble_mean += t.bubble[k];
    counted++;
  }
  if (counted) t.bubble_mean /= counted;
  return t;
}

}  // namespace distlab
