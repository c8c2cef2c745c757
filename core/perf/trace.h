// Trace events: every kernel and every collective records what it did — FLOPs, bytes moved, the stream it
// ran on, wall time, and for collectives the operation, payload, group and sequence number. Totals per
// step feed the metrics; the event list (kept when asked for) feeds the cost model's replay and the
// Chrome trace.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace distlab {

enum class Stream { compute, comm };
enum class EventKind {
  compute,     // a kernel on the compute stream
  collective,  // a collective (or send/recv) issued on the comm stream
  wait,        // the compute stream waits for collective `seq` of `group` to finish
  marker,      // the start (name "+F3") or end ("-F3") of a span of compute: a pipeline's forward or backward
};

// The shape of a kernel's work, where the cost model needs more than its FLOPs and bytes: a GEMM loses to
// tile and wave quantization by its (M, N, K), and a calibrated profile holds measured rates per shape
// (core/perf/hardware.h); attention's rate depends on its sequence and head size.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // C (m×n) = A (m×k) · B (k×n); m = 0: no GEMM
  bool operator==(const GemmShape&) const = default;
};
struct KernelShape {
  GemmShape gemm[2];  // up to two GEMMs in one kernel (matmul_backward: dX, then dW)
  int64_t heads = 0, seq = 0, head_dim = 0;  // attention: batch × heads, T, head size (heads = 0: none)
};

struct TraceEvent {
  std::string name;  // "matmul_forward", "conv2d_backward", "all_reduce", ...
  EventKind kind = EventKind::compute;
  Stream stream = Stream::compute;
  double flops = 0;
  double bytes = 0;        // bytes read + written (a memory-traffic estimate for the cost model)
  double t_begin_us = 0;   // wall clock, microseconds since the trace's epoch
  double t_end_us = 0;
  bool scales_with_batch = true;  // compute whose work is proportional to the micro-batch (not optimizer steps)
  bool low_precision = false;     // a 16-bit op (autocast's low list): timed at the profile's bf16/fp16 rate
  bool on_host = false;           // ran on the host's CPU (CPU offload's optimizer step): the profile's host rates
  double link_bytes = 0;          // a copy between host and device memory (CPU offload): over the host link (PCIe)
  bool recompute = false;         // activation checkpointing's second forward: hardware FLOPs, not model FLOPs (HFU, not MFU)
  KernelShape shape;              // GEMMs and attention: their shapes (OpScope::gemm, OpScope::attention)
  // collectives and waits
  std::string op;             // all_reduce | reduce_scatter | all_gather | broadcast | send | recv | barrier
  int64_t payload_bytes = 0;  // S in the α-β formulas: the full tensor's bytes (all_reduce), the gathered output (all_gather)
  int group_size = 1;
  int64_t seq = -1;           // sequence number within the group: a wait names the collective it waits for
  std::string group = "world";
};

class Trace {
 public:
  Trace() : epoch_(std::chrono::steady_clock::now()) {}
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
  }
  void record(const char* name, Stream s, double flops, double bytes, double t_begin_us, double t_end_us,
              bool scales_with_batch = true, bool low_precision = false, const KernelShape* shape = nullptr);
  void record(TraceEvent e);  // collectives and waits
  void mark(const std::string& name, bool begin);  // a marker event, when events are kept
  // CPU offload: a copy of `bytes` between host and device memory, on the compute stream (FSDP's CPUOffload
  // copies synchronously), and compute recorded while on_host is set runs on the host's CPU.
  void record_copy(const char* name, double bytes);
  void set_on_host(bool on) { on_host_ = on; }
  // Activation checkpointing: compute recorded while set is a recompute (RecomputeScope sets it).
  void set_recompute(bool on) { recompute_ = on; }
  bool recomputing() const { return recompute_; }
  void keep_events(bool on) { keep_events_ = on; }
  bool keeping_events() const { return keep_events_; }
  const std::vector<TraceEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  // running totals since the last reset_totals()
  double flops() const { return flops_; }
  double recompute_flops() const { return recompute_flops_; }  // the part of flops() that recomputed a forward
  double bytes() const { return bytes_; }
  int64_t count() const { return count_; }
  void reset_totals() { flops_ = bytes_ = recompute_flops_ = 0; count_ = 0; }

 private:
  std::chrono::steady_clock::time_point epoch_;
  bool keep_events_ = false;
  bool on_host_ = false;
  bool recompute_ = false;
  std::vector<TraceEvent> events_;
  double flops_ = 0, bytes_ = 0, recompute_flops_ = 0;
  int64_t count_ = 0;
};

// Marks the kernels run in its lifetime as a recompute (nested scopes keep the outer one's mark).
class RecomputeScope {
 public:
  explicit RecomputeScope(Trace& t) : t_(t), was_(t.recomputing()) { t_.set_recompute(true); }
  ~RecomputeScope() { t_.set_recompute(was_); }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  Trace& t_;
  bool was_;
};

}  // namespace distlab
