// The cost model: how long a training step would take on real hardware, from the trace events that the
// CPU (or meta) run recorded. Wall times in the events are ignored; only FLOPs, bytes, collective payloads
// and the order of events matter. Three pieces:
//   compute_time     one kernel: a roofline (compute-bound or memory-bound) at the rates real kernels reach
//                    (the profile's calibration), plus a launch overhead;
//   collective_time  one collective: the α-β cost of a ring, in nccl-tests' algbw/busbw conventions;
//   replay           all ranks' events on a compute stream and a comm stream per rank, which overlap.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/perf/eager.h"
#include "core/perf/hardware.h"
#include "core/perf/trace.h"

namespace distlab {

// Roofline time of one compute event: max(flops / peak, bytes / mem_bw) + launch overhead.
// low_precision (or the event's own flag, set for 16-bit ops) picks the bf16/fp16 tensor-core peak.
// kernels.eager_ops: the families whose bytes and launches are eager PyTorch's op chain for the same work
// (core/perf/eager.h); the rest run as distlab's fused kernels.
double compute_time(const TraceEvent& e, const HardwareProfile& hw, bool low_precision = false, KernelSet kernels = {});

enum class Link { intra_node, inter_node };

// Modeled time of one collective of `bytes` (S) over `n` ranks; 0 when n == 1. See cost_model.cpp for the
// formulas and why they are written in terms of the profile's bus bandwidth.
double collective_time(const std::string& op, int64_t bytes, int n, const HardwareProfile& hw,
                       Link link = Link::intra_node);
// nccl-tests' conventions, for benchmark tables: algbw = S / t; busbw = algbw * busbw_factor(op, n), with
// factor 2(n−1)/n for all_reduce, (n−1)/n for reduce_scatter/all_gather (S = the gathered size), 1 for
// broadcast/send/recv, 0 for barrier (it moves no data).
double algbw(int64_t bytes, double time_s);
double busbw_factor(const std::string& op, int n);

struct ReplayOptions {
  bool low_precision = false;  // compute at the bf16/fp16 peak
  int ranks_per_node = 0;      // 0: all ranks on one node; else a collective whose ranks span nodes uses the inter-node busbw
  // The fake world (dist.fake_world_size): the one traced rank stands for every rank of its groups, which
  // are all alike, so a collective starts when this rank and its comm stream are ready.
  bool symmetric = false;
  KernelSet kernels;  // distlab's fused kernels, or eager PyTorch's chains (log.kernels)
};

// One span of the modeled timeline, for the Chrome trace. Waits appear on the compute stream only when
// they actually block it (the collective is not yet done when the compute stream reaches the wait).
struct ModeledEvent {
  int rank = 0;
  Stream stream = Stream::compute;
  EventKind kind = EventKind::compute;
  std::string name;
  double start_s = 0, end_s = 0;
  double flops = 0, bytes = 0;  // compute: the event's; collective: bytes = payload S
  std::string group;            // collectives and waits
  int64_t seq = -1;
};

struct RankTimes {
  double step_s = 0;          // end of the later of the rank's two streams
  double compute_s = 0;       // busy time of the compute stream
  double comm_s = 0;          // busy time of the comm stream (collectives this rank takes part in)
  double exposed_comm_s = 0;  // step_s − compute_s: time the rank is not computing (waiting for comm or for peers)
  double contention_s = 0;    // part of compute_s: what its kernels lost to the SMs of the collectives beside them
};

struct ReplayResult {
  std::string profile;
  double step_s = 0;               // max over ranks of RankTimes::step_s
  double compute_s = 0;            // max over ranks
  double comm_s = 0;               // max over ranks
  double exposed_comm_s = 0;       // MAX over ranks (the rank that hides its communication worst)
  double exposed_comm_mean_s = 0;  // mean over ranks
  double contention_s = 0;         // max over ranks of RankTimes::contention_s
  std::vector<RankTimes> ranks;
  std::vector<ModeledEvent> events;
};

// Replays every rank's events (ranks[r] = rank r's events in program order). Throws distlab::Error on a
// trace that could not have run: a collective with fewer (or more) participants than its group_size,
// participants that disagree on op/payload/group_size, a wait with no matching collective on that rank
// before it, or collectives issued in an order that would deadlock.
ReplayResult replay(const std::vector<std::vector<TraceEvent>>& ranks, const HardwareProfile& hw,
                    ReplayOptions opts = {});

// Pipeline parallel: each rank's forward and backward spans on the modeled timeline (its "+F3"/"-F3"
// markers), and the bubble — the share of the pipeline's span (the first forward's start on any rank to
// the last backward's end on any) that a stage spends outside its own forwards and backwards.
struct PipelineTimeline {
  struct Span {
    std::string name;  // "F3", "B0"
    double start_s, end_s;
  };
  std::vector<std::vector<Span>> spans;  // per rank, in time order
  double start_s = 0, end_s = 0;
  std::vector<double> bubble;            // per rank (ranks without spans: 0)
  double bubble_mean = 0;                // over the ranks with spans
};
PipelineTimeline pipeline_timeline(const ReplayResult& r);

// Time of the same step on ONE rank with the same global batch: rank_events' compute only, events with
// scales_with_batch counted n_ranks times, the others (optimizer step, ...) once; no communication.
double single_rank_time_s(const std::vector<TraceEvent>& rank_events, int n_ranks, const HardwareProfile& hw,
                          bool low_precision = false, KernelSet kernels = {});
// t_1 / t_N: single_rank_time_s(ranks[0], N) over replay(ranks).step_s. See cost_model.cpp.
double modeled_speedup(const std::vector<std::vector<TraceEvent>>& ranks, const HardwareProfile& hw,
                       ReplayOptions opts = {});

}  // namespace distlab
